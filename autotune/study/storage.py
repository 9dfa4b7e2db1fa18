"""Where studies live: open an Optuna storage from a URL, open or load a study, and read
its finished trials back as :class:`~autotune.results.TrialRecord` values.

Storages: one machine (SQLite), many (PostgreSQL/MySQL), or a shared filesystem (Optuna's
journal file).

- ``sqlite:///autotune.db`` (default), ``postgresql://user@host/db``, ``mysql+pymysql://…``
- ``journal:///shared/fs/study.log`` (or any path ending in ``.log``): JournalStorage,
  safe for several processes on a filesystem with working file locks.
- ``memory``: in this process only (tests, benchmarks).
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import optuna

from ..config import Config
from ..credentials import redact_url, scrub
from ..errors import StorageError, first_line
from ..measurement import OK, Measurement
from ..planned import Plan
from ..results import MOVE, SEARCH, TrialRecord, TuneResult
from ..space import Space
from .sampling import ENCODING, INDEXES, VALUES
from .screening import kept as kept_schedule


def open_storage(url: str) -> Any:
    """An Optuna storage object (or ``None`` for in-memory) for ``url``.

    Raises:
        StorageError: the URL names no storage this machine can open (the message shows
            the URL with its password redacted).
    """
    if url == "memory":
        return None
    if url.startswith("journal://") or url.endswith(".log"):
        path = url.removeprefix("journal://") or url
        from optuna.storages.journal import JournalFileBackend

        try:
            return optuna.storages.JournalStorage(JournalFileBackend(path))
        except OSError as e:
            raise StorageError(f"cannot open journal storage {path!r}: {e}") from None
    engine_kwargs: dict[str, Any] = {}
    if url.startswith("sqlite"):
        # Several workers on one SQLite file wait for the lock instead of failing.
        engine_kwargs = {"connect_args": {"timeout": 60}}
    else:
        engine_kwargs = {"pool_pre_ping": True}
    try:
        return _retry(lambda: optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs))
    except Exception as e:  # SQLAlchemy/Optuna raise many types for a bad URL or file
        raise StorageError(_failed(f"cannot open storage {redact_url(url)!r}", url, e)) from None


def _failed(what: str, url: str, e: BaseException) -> str:
    """An error message quoting ``url`` and the exception, its secrets redacted."""
    return scrub(f"{what}: {type(e).__name__}: {first_line(e)}", url)


def _retry(make: Any, attempts: int = 5) -> Any:
    """Call ``make`` again when workers starting together race to create the schema."""
    for attempt in range(attempts):
        try:
            return make()
        except Exception as e:  # SQLAlchemy raises many types; the last one is reported
            text = str(e)
            racing = "already exists" in text or "locked" in text or "UniqueViolation" in text
            if not racing or attempt == attempts - 1:
                raise
            time.sleep(0.2 + random.random())
    raise AssertionError("unreachable")


def create_or_load(storage: Any, study_name: str, sampler: Any) -> optuna.Study:
    """``create_study(load_if_exists=True)`` that survives workers starting at once."""
    return _retry(
        lambda: optuna.create_study(
            storage=storage,
            study_name=study_name,
            direction="maximize",
            sampler=sampler,
            load_if_exists=True,
        )
    )


def open_study(space: Space, storage: str, study_name: str, sampler: Any) -> optuna.Study:
    """Create or load the study; refuse one that was made from a different space.

    Raises:
        StorageError: the storage cannot be opened, or the study's space differs.
    """
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    backend = open_storage(storage)
    try:
        study = create_or_load(backend, study_name, sampler)
    except Exception as e:  # SQLAlchemy/Optuna raise many types for a bad URL or file
        raise StorageError(
            _failed(f"cannot open storage {redact_url(storage)!r}", storage, e)
        ) from None
    fingerprint = space.fingerprint()
    attrs = study.user_attrs
    stored = attrs.get("space_fingerprint")
    if stored is None:
        # The encoding first: a worker that finds the fingerprint finds the encoding.
        study.set_user_attr(ENCODING, VALUES)
        study.set_user_attr("space_fingerprint", fingerprint)
        study.set_user_attr("space_source", space.source)
    elif stored != fingerprint:
        raise StorageError(
            f"study {study_name!r} in {redact_url(storage)} was made from a different space "
            f"({attrs.get('space_source')}); pass another --study-name to start anew"
        )
    elif attrs.get(ENCODING, INDEXES) == INDEXES:
        # Made by an autotune that stored ordinal knobs as indexes under their own names:
        # they stay indexes (sampling.param), so no param is an index in some trials and a
        # value in others.
        if ENCODING not in attrs:
            study.set_user_attr(ENCODING, INDEXES)
    return study


def records(study: optuna.Study) -> list[TrialRecord]:
    """Every finished trial of a study, in order, repeats and duplicates included."""
    out = []
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        attrs = t.user_attrs
        if "config" not in attrs:
            continue
        out.append(
            TrialRecord(
                number=t.number,
                config=Config.from_dict(attrs["config"]),
                measurement=Measurement.from_dict(attrs["measurement"]),
                value=float(t.value) if t.value is not None else 0.0,
                role=attrs.get("role", SEARCH),
                status=attrs.get("status", attrs["measurement"].get("status", OK)),
                reason=attrs.get("reason", ""),
                duplicate_of=attrs.get("duplicate_of"),
                loss_deviation=attrs.get("loss_deviation"),
                repeat_of=attrs.get("repeat_of"),
                round=attrs.get("round"),
                move=attrs.get(MOVE),
                look_for=attrs.get("look_for"),
                paired_with=attrs.get("paired_with"),
                twin=bool(attrs.get("twin", False)),
            )
        )
    return out


def load_result(
    space: Space, storage: str | None = None, study_name: str | None = None
) -> tuple[optuna.Study, TuneResult]:
    """Load the stored study of ``space`` without running anything.

    ``storage`` defaults to ``$AUTOTUNE_STORAGE``, else the space's (:meth:`Space.storage_url`).
    The memory budget is recomputed from the stored environment, so the headroom of the
    recommended config is reported as ``autotune run`` did.

    Raises:
        StorageError: the storage cannot be opened or holds no such study.
    """
    storage = space.storage_url(storage)
    name = study_name or space.study.name
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if storage.startswith("sqlite:///") and not Path(storage.removeprefix("sqlite:///")).exists():
        # load_study would create an empty database file instead.
        raise StorageError(
            f"storage {redact_url(storage)!r} does not exist (relative paths are from the "
            "current folder); run `autotune run` first, or pass --storage"
        )
    backend = open_storage(storage)
    try:
        study = optuna.load_study(study_name=name, storage=backend)
    except Exception as e:  # KeyError for a missing study, SQLAlchemy errors for a bad URL
        what = f"cannot load study {name!r} from {redact_url(storage)!r}"
        raise StorageError(
            _failed(what, storage, e) + "; run `autotune run` first, or pass --storage/--study-name"
        ) from None
    environment = study.user_attrs.get("environment", {})
    result = TuneResult.from_trials(
        name,
        storage,
        records(study),
        confirmation=study.user_attrs.get("confirmation"),
        min_gain=space.search.min_gain,
        environment=environment,
        memory_budget_bytes=space.limits.memory_bytes(environment.get("device_memory_bytes")),
        global_batch=space.global_batch,
        plan=Plan.of(space.trial),
        screening=kept_schedule(study.user_attrs),
        objective=space.trial.objective,
    )
    return study, result
