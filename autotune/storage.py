"""Open an Optuna storage from a URL: one machine (SQLite), many (PostgreSQL/MySQL), or a
shared filesystem (Optuna's journal file).

- ``sqlite:///autotune.db`` (default), ``postgresql://user@host/db``, ``mysql+pymysql://…``
- ``journal:///shared/fs/study.log`` (or any path ending in ``.log``): JournalStorage,
  safe for several processes on a filesystem with working file locks.
- ``memory``: in this process only (tests, benchmarks).
"""

from __future__ import annotations

import random
import time
from typing import Any

import optuna

from .errors import StorageError


def open_storage(url: str) -> Any:
    """An Optuna storage object (or ``None`` for in-memory) for ``url``.

    Raises:
        StorageError: the URL names no storage this machine can open.
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
    return _retry(lambda: optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs))


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
