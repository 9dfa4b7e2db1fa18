"""The space file: parsed and checked into a :class:`~autotune.space.Space`.

:func:`load_space` gathers every problem in the file and raises one
:class:`~autotune.errors.SpaceError` naming file, key and what is allowed.
"""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from .config import Config, resolve_inactive
from .errors import AutotuneError, SpaceError, yaml_problem
from .knobs import KNOBS, show
from .planned import PLANNED_KEYS
from .space import (
    DEVICES,
    LAUNCHERS,
    OBJECTIVES,
    SAMPLERS,
    AccuracyGuard,
    Budget,
    Limits,
    SearchSettings,
    Space,
    StudySettings,
    TrialSettings,
    never_apply,
)

_UNITS = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def parse_memory(value: Any) -> int | float | None:
    """``None``, a fraction in (0, 1], bytes, or a size string like ``"512MiB"``.

    Raises:
        ValueError: saying what is allowed.
    """
    allowed = "a fraction in (0, 1] of device memory, bytes, or a size like '6GiB'"
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(f"must be {allowed} but got {value!r}")
    if isinstance(value, float):
        if 0 < value <= 1:  # NaN fails both comparisons
            return value
        raise ValueError(f"must be {allowed} but got {value!r}")
    if isinstance(value, int):
        if value > 1:
            return value
        raise ValueError(f"must be {allowed} but got {value!r}")
    if isinstance(value, str):
        text = value.strip().lower().replace(" ", "")
        number = text.rstrip("abcdefghijklmnopqrstuvwxyz")
        unit = text[len(number) :] or "b"
        try:
            amount = float(number)
        except ValueError:
            amount = -1.0
        if unit in _UNITS and amount > 0:
            return int(amount * _UNITS[unit])
    raise ValueError(f"must be {allowed} but got {value!r}")


_TOP_KEYS = {
    "workload",
    "workload_args",
    "device",
    "knobs",
    "baseline",
    "trial",
    "budget",
    "study",
    "output_dir",
    "limits",
    "global_batch",
    "search",
}


def _unknown(where: str, key: str, known: set[str] | dict[str, Any]) -> str:
    close = difflib.get_close_matches(key, list(known), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"{where}{key}: unknown key{hint}; allowed: {', '.join(sorted(known))}"


def _section(raw: Mapping[str, Any], cls: type, where: str, problems: list[str], **checks: Any):
    """Build a settings dataclass from a mapping, collecting problems."""
    if raw is None:
        return cls()
    if not isinstance(raw, Mapping):
        problems.append(f"{where}: must be a mapping but got {type(raw).__name__}")
        return cls()
    fields = cls.__dataclass_fields__
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in fields:
            problems.append(_unknown(f"{where}.", str(key), set(fields)))
            continue
        check = checks.get(key)
        message = check(value) if check else None
        if message:
            problems.append(f"{where}.{key}: {message}")
        else:
            values[key] = value
    return cls(**values)


def _int_at_least(low: int, optional: bool = False):
    def check(value: Any) -> str | None:
        if value is None and optional:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            return f"must be an integer >= {low} but got {value!r}"
        return None

    return check


def _positive_number(optional: bool = False):
    def check(value: Any) -> str | None:
        if value is None and optional:
            return None
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not number or not math.isfinite(value) or value <= 0:
            return f"must be a number > 0 but got {value!r}"
        return None

    return check


def _number_at_least(low: float, optional: bool = False):
    def check(value: Any) -> str | None:
        if value is None and optional:
            return None
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        # abs(): an int beyond float's range raises OverflowError in isfinite
        if not number or value < low or abs(value) >= 1e300 or not math.isfinite(value):
            return f"must be a number >= {low} but got {value!r}"
        return None

    return check


def _one_of(choices: tuple[str, ...]):
    def check(value: Any) -> str | None:
        if value not in choices:
            return f"must be one of {', '.join(choices)} but got {value!r}"
        return None

    return check


def _boolean(value: Any) -> str | None:
    return None if isinstance(value, bool) else f"must be true or false but got {value!r}"


def _fraction(value: Any) -> str | None:
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if number and 0 < value <= 1:
        return None
    return f"must be a number in (0, 1] but got {value!r}"


def _below_one(value: Any) -> str | None:
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if number and 0 <= value < 1:
        return None
    return f"must be a number in [0, 1) but got {value!r}"


def _string(value: Any) -> str | None:
    return (
        None
        if isinstance(value, str) and value
        else f"must be a non-empty string but got {value!r}"
    )


def _storage_env(raw: Mapping[str, Any], problems: list[str]) -> str | None:
    """``study.storage: {env: NAME}``: the environment variable holding the storage URL."""
    if set(raw) != {"env"}:
        keys = ", ".join(map(str, raw)) or "none"
        problems.append(
            "study.storage: must be a storage URL or {env: VARIABLE} (the environment "
            f"variable holding the URL) but got a mapping with keys {keys}"
        )
        return None
    name = raw["env"]
    if not isinstance(name, str) or not name.strip():
        problems.append(
            f"study.storage.env: must be the name of an environment variable but got {name!r}"
        )
        return None
    return name.strip()


def _parse_knobs(raw: Any, problems: list[str]) -> dict[str, tuple[Any, ...]]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        problems.append(
            f"knobs: must be a mapping of knob name to values but got {type(raw).__name__}"
        )
        return {}
    knobs: dict[str, tuple[Any, ...]] = {}
    for name, values in raw.items():
        name = str(name)
        if name not in KNOBS:
            problems.append(_unknown("knobs.", name, KNOBS))
            continue
        values = list(values) if isinstance(values, (list, tuple)) else [values]
        if not values:
            problems.append(f"knobs.{name}: must list at least one value but got []")
            continue
        knob = KNOBS[name]
        normalized = []
        for value in values:
            try:
                value = knob.normalize(value)
            except ValueError as e:
                problems.append(f"knobs.{name}: {e}")
                continue
            if value in normalized:
                problems.append(f"knobs.{name}: value {value!r} is listed twice")
                continue
            normalized.append(value)
        if knob.ordinal:
            normalized.sort()
        knobs[name] = tuple(normalized)
    return knobs


def _parse_baseline(raw: Any, problems: list[str]) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        problems.append(
            f"baseline: must be a mapping of knob name to value but got {type(raw).__name__}"
        )
        return {}
    values: dict[str, Any] = {}
    for name, value in raw.items():
        name = str(name)
        if name not in KNOBS:
            problems.append(_unknown("baseline.", name, KNOBS))
            continue
        try:
            values[name] = KNOBS[name].normalize(value)
        except ValueError as e:
            problems.append(f"baseline.{name}: {e}")
    return values


def _parse_limits(raw: Any, problems: list[str]) -> Limits:
    if raw is None:
        return Limits()
    if not isinstance(raw, Mapping):
        problems.append(f"limits: must be a mapping but got {type(raw).__name__}")
        return Limits()
    raw = dict(raw)
    accuracy_raw = raw.pop("accuracy", None)
    memory = Limits.memory
    if "memory" in raw:
        try:
            memory = parse_memory(raw.pop("memory"))
        except ValueError as e:
            problems.append(f"limits.memory: {e}")
    limits = _section(raw, Limits, "limits", problems, max_alloc_retries=_int_at_least(0))
    if accuracy_raw is False:  # `accuracy: off`
        accuracy = AccuracyGuard(enabled=False)
    else:
        accuracy = _section(
            accuracy_raw,
            AccuracyGuard,
            "limits.accuracy",
            problems,
            enabled=_boolean,
            tolerance=_positive_number(),
            last_k=_int_at_least(1),
            divergence=_positive_number(),
        )
    return replace(limits, memory=memory, accuracy=accuracy)


def _fix_global_batch(
    data: Mapping[str, Any],
    knobs: dict[str, tuple[Any, ...]],
    baseline: Config,
    problems: list[str],
    notes: list[str],
) -> int | None:
    """Resolve ``global_batch`` (default: the baseline's) and keep the batch sizes dividing it.

    With a fixed global batch, ``accumulation_steps`` is derived from ``batch_size``, so
    every trial does the same work per optimizer step and loss trajectories compare.
    """
    raw = data.get("global_batch", baseline.global_batch)
    if raw == "free":
        return None
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
        problems.append(f"global_batch: must be an integer >= 1 or 'free' but got {raw!r}")
        return None
    if "accumulation_steps" in knobs:
        problems.append(
            "knobs.accumulation_steps: is derived as global_batch / batch_size while the global "
            "batch is fixed; set global_batch (or baseline), or use global_batch: free"
        )
        return None
    worlds = knobs.get("world_size", (baseline.world_size,))
    if raw % (baseline.batch_size * baseline.world_size):
        problems.append(
            f"baseline.batch_size: {baseline.batch_size}"
            + (f" x world_size {baseline.world_size}" if baseline.world_size > 1 else "")
            + f" does not divide global_batch {raw}"
        )
        return None
    # The baseline's micro-batch is always a candidate: it must split the global batch for
    # every world size searched too, or a sampled config would have no accumulation.
    odd = [w for w in worlds if raw % (baseline.batch_size * w)]
    if odd:
        given = "batch_size" in (data.get("baseline") or {})
        problems.append(
            f"baseline.batch_size: {baseline.batch_size}{'' if given else ' (the default)'} x "
            f"world_size {odd[0]} (searched) does not divide global_batch {raw}; set "
            "baseline.batch_size to one that divides it for every world_size"
        )
        return None
    if "accumulation_steps" in (data.get("baseline") or {}) and baseline.global_batch != raw:
        problems.append(
            f"baseline: batch_size x accumulation_steps = {baseline.global_batch} "
            f"but global_batch is {raw}"
        )
        return None
    if "batch_size" in knobs:
        # Every micro-batch must split the global batch for every world size searched.
        kept = tuple(b for b in knobs["batch_size"] if all(raw % (b * w) == 0 for w in worlds))
        dropped = [b for b in knobs["batch_size"] if b not in kept]
        if dropped:
            notes.append(
                f"batch_size {', '.join(map(str, dropped))} dropped: "
                f"does not divide global_batch {raw}"
                + (f" for world_size {', '.join(map(str, worlds))}" if len(worlds) > 1 else "")
            )
        knobs["batch_size"] = kept
    return raw


def parse_space(data: Any, *, source: str = "<space>", base_dir: Path = Path(".")) -> Space:
    """Validate an already-loaded mapping as a space. See :func:`load_space`."""
    if not isinstance(data, Mapping):
        raise SpaceError(
            f"{source}: must be a mapping at the top level but got {type(data).__name__}"
        )
    problems: list[str] = []
    for key in data:
        if key not in _TOP_KEYS:
            problems.append(_unknown("", str(key), _TOP_KEYS))
    workload, workload_args = _parse_workload(data, problems)
    device = data.get("device", "auto")
    if device not in DEVICES:
        problems.append(f"device: must be one of {', '.join(DEVICES)} but got {device!r}")
    knobs = _parse_knobs(data.get("knobs"), problems)
    baseline_values = _parse_baseline(data.get("baseline"), problems)
    trial, late_notes = _parse_trial(data.get("trial"), problems)
    budget = _section(
        data.get("budget"),
        Budget,
        "budget",
        problems,
        n_trials=_int_at_least(1, optional=True),
        timeout_s=_positive_number(optional=True),
    )
    study = _parse_study(data.get("study"), problems)
    search, renamed = _parse_search(data.get("search"), problems)
    output_dir = data.get("output_dir", "autotune-runs")
    if not isinstance(output_dir, str) or not output_dir:
        problems.append(f"output_dir: must be a non-empty string but got {output_dir!r}")
    if budget.n_trials is None and budget.timeout_s is None:
        problems.append("budget: set n_trials, timeout_s or both (otherwise the study never ends)")
    limits = _parse_limits(data.get("limits"), problems)
    if problems:
        raise SpaceError([f"{source}: {p}" for p in problems])

    baseline = _baseline_config(knobs, baseline_values, source)
    notes: list[str] = [*renamed, *late_notes]
    global_batch = _fix_global_batch(data, knobs, baseline, problems, notes)
    if problems:
        raise SpaceError([f"{source}: {p}" for p in problems])
    if global_batch is not None:
        baseline = baseline.replace(
            accumulation_steps=global_batch // (baseline.batch_size * baseline.world_size)
        )
    _add_baseline_candidates(knobs, baseline)
    space = Space(
        workload=workload,
        knobs=knobs,
        baseline=baseline,
        workload_args=dict(workload_args),
        device=device,
        trial=trial,
        budget=budget,
        study=study,
        search=search,
        output_dir=output_dir,
        base_dir=base_dir,
        source=source,
        limits=limits,
        global_batch=global_batch,
        notes=tuple(notes),
        data=dict(data),
    )
    _refuse_values_that_never_apply(space, source)
    return space


def _parse_workload(data: Mapping[str, Any], problems: list[str]) -> tuple[Any, Mapping]:
    """``workload`` and ``workload_args`` (``{}`` when they are not plain data)."""
    workload = data.get("workload")
    if workload is None:
        problems.append("workload: is required ('module:function' or 'path/file.py:function')")
    elif not isinstance(workload, str) or ":" not in workload:
        problems.append(
            f"workload: must be 'module:function' or 'path/file.py:function' but got {workload!r}"
        )
    workload_args = data.get("workload_args") or {}
    if not isinstance(workload_args, Mapping):
        problems.append(f"workload_args: must be a mapping but got {type(workload_args).__name__}")
        workload_args = {}
    try:  # they travel to the trial process as JSON
        json.dumps(workload_args, allow_nan=False)
    except (TypeError, ValueError) as e:
        problems.append(f"workload_args: must be plain data (strings, numbers, lists) but {e}")
        workload_args = {}
    return workload, workload_args


def _parse_trial(trial_raw: Any, problems: list[str]) -> tuple[TrialSettings, list[str]]:
    """The ``trial:`` section, and the notes it leaves for after the checks."""
    memory_cap = TrialSettings.memory_cap
    if isinstance(trial_raw, Mapping) and "memory_cap" in trial_raw:
        trial_raw = dict(trial_raw)
        try:
            memory_cap = parse_memory(trial_raw.pop("memory_cap"))
        except ValueError as e:
            problems.append(f"trial.memory_cap: {e}")
    trial = _section(
        trial_raw,
        TrialSettings,
        "trial",
        problems,
        warmup_steps=_int_at_least(0),
        measured_steps=_int_at_least(2),
        min_window_s=_number_at_least(0),
        min_warmup_s=_number_at_least(0),
        timeout_s=_positive_number(),
        planned_steps=_int_at_least(1, optional=True),
        planned_samples=_int_at_least(1, optional=True),
        planned_tokens=_int_at_least(1, optional=True),
        cost_per_hour=_number_at_least(0, optional=True),
        energy_price_per_kwh=_number_at_least(0, optional=True),
        objective=_one_of(OBJECTIVES),
        seed=_int_at_least(0),
        longest_batch=_boolean,
        launcher=_one_of(LAUNCHERS),
    )
    trial = replace(trial, memory_cap=memory_cap)
    planned = [key for key in PLANNED_KEYS if getattr(trial, key) is not None]
    if len(planned) > 1:
        problems.append(
            f"trial.{' and trial.'.join(planned)}: at most one of {', '.join(PLANNED_KEYS)} "
            "may be set (the planned run's length)"
        )
    late_notes = []
    if trial.cost_per_hour is not None and not planned:
        late_notes.append(
            "trial.cost_per_hour is set without a planned length (trial.planned_steps, "
            "planned_samples or planned_tokens): no run's cost is projected"
        )
    if trial.energy_price_per_kwh is not None and not planned:
        late_notes.append(
            "trial.energy_price_per_kwh is set without a planned length (trial.planned_steps, "
            "planned_samples or planned_tokens): no run's energy cost is projected"
        )
    return trial, late_notes


def _parse_study(study_raw: Any, problems: list[str]) -> StudySettings:
    """The ``study:`` section; its storage may name an environment variable."""
    storage_env = None
    if isinstance(study_raw, Mapping) and isinstance(study_raw.get("storage"), Mapping):
        study_raw = dict(study_raw)
        storage_env = _storage_env(study_raw.pop("storage"), problems)
    study = _section(
        study_raw,
        StudySettings,
        "study",
        problems,
        name=_string,
        storage=_string,
        storage_env=lambda value: "unknown key; write storage: {env: VARIABLE}",
        heartbeat_s=_positive_number(),
    )
    if storage_env is not None:
        study = replace(study, storage_env=storage_env)
    return study


def _parse_search(raw_search: Any, problems: list[str]) -> tuple[SearchSettings, list[str]]:
    """The ``search:`` section, and a note for each key under its first release's name."""
    renamed = []
    if isinstance(raw_search, Mapping) and "confirm_repeats" in raw_search:
        # The first release's name: repeats after the first run, now paired rounds.
        repeats = raw_search["confirm_repeats"]
        raw_search = {k: v for k, v in raw_search.items() if k != "confirm_repeats"}
        if "confirm_rounds" not in raw_search:
            raw_search["confirm_rounds"] = repeats
        renamed.append("search.confirm_repeats is now search.confirm_rounds (paired rounds)")
    search = _section(
        raw_search,
        SearchSettings,
        "search",
        problems,
        sampler=_one_of(SAMPLERS),
        n_startup_trials=_int_at_least(0),
        seed=_int_at_least(0),
        prune=_boolean,
        prune_margin=_positive_number(),
        prune_after=_fraction,
        confirm_top=_int_at_least(0),
        confirm_rounds=_int_at_least(0),
        confirm_max_rounds=_int_at_least(0),
        confirm_max_s=_number_at_least(0),
        noise_runs=_int_at_least(0),
        best_runs=_int_at_least(1),
        ablate=_boolean,
        min_gain=_below_one,
        predict_memory=_boolean,
        screening=_boolean,
        interleave=_boolean,
    )
    given = raw_search if isinstance(raw_search, Mapping) else {}
    if "confirm_max_rounds" in given and search.confirm_max_rounds < search.confirm_rounds:
        problems.append(
            f"search.confirm_max_rounds: must be at least search.confirm_rounds "
            f"({search.confirm_rounds}) but got {search.confirm_max_rounds}"
        )
    return search, renamed


def _baseline_config(
    knobs: Mapping[str, tuple], baseline_values: Mapping[str, Any], source: str
) -> Config:
    """The baseline: PyTorch's defaults, the fixed knobs, then the file's ``baseline:``."""
    fixed = {k: v[0] for k, v in knobs.items() if len(v) == 1}
    try:
        # A fixed knob that is inactive in the baseline (prefetch_factor while num_workers
        # is searched from 0) waits for the trials that activate it; explicit baseline
        # values must be a valid combination.
        values = resolve_inactive(
            {**Config().to_dict(), **fixed, **baseline_values}, keep=baseline_values
        )
        return Config(**values)
    except AutotuneError as e:  # an invalid combination of fixed/baseline knobs
        raise SpaceError(f"{source}: baseline: {str(e).removeprefix('config: ')}") from None


def _add_baseline_candidates(knobs: dict[str, tuple], baseline: Config) -> None:
    """The user's current setting is always a candidate, so the baseline lies in the space
    (unless the knob is inactive there: then its value is no setting of the user's)."""
    current = baseline.to_dict()
    for name, value in current.items():
        if name in knobs and value not in knobs[name] and KNOBS[name].requires(current) is None:
            merged = [*knobs[name], value]
            knobs[name] = tuple(sorted(merged)) if KNOBS[name].ordinal else tuple(merged)


def _refuse_values_that_never_apply(space: Space, source: str) -> None:
    """An invalid combination: listed values that would never run are an error."""
    never = never_apply(space)
    if never:
        raise SpaceError(
            [
                f"{source}: knobs.{name}: {_values(space.knobs[name], name)} can never apply: "
                f"{reason}"
                for name, reason in never.items()
            ]
        )


def with_workload_baseline(space: Space, values: Mapping[str, Any], workload: str) -> Space:
    """``space`` with a workload's own settings (``Workload.baseline``: a Trainer's
    arguments) as its baseline: the file's ``baseline:`` and fixed knobs still win, and
    the global batch, the batch sizes that divide it and the candidates follow as for a
    baseline written in the file.

    Raises:
        SpaceError: the settings do not fit the file (a batch size that does not divide
            its ``global_batch``, a value no knob allows), each problem naming them.
    """
    data = dict(space.data) if space.data is not None else _data_of(space)
    given = dict(data.get("baseline") or {})
    merged = {**values, **given}
    shown = ", ".join(f"{k}={show(v)}" for k, v in values.items())
    try:
        new = parse_space(
            {**data, "baseline": merged}, source=space.source, base_dir=space.base_dir
        )
    except SpaceError as e:
        raise SpaceError(
            [f"{p} (the baseline comes from the workload {workload}: {shown})" for p in e.problems]
        ) from None
    notes = [f"baseline from the workload {workload}: {shown}"]
    notes += [
        f"baseline.{k}={show(v)} (the space file) replaces the workload's {show(values[k])}"
        for k, v in given.items()
        if k in values and values[k] != v
    ]
    # the file's own notes (batch sizes dropped for its global batch...) are made again
    return replace(
        space,
        knobs=new.knobs,
        baseline=new.baseline,
        global_batch=new.global_batch,
        notes=(*new.notes, *notes),
    )


def _data_of(space: Space) -> dict[str, Any]:
    """What a space made in code (not parsed from a file) says about knobs and batch."""
    return {
        "workload": space.workload,
        "knobs": {k: list(v) for k, v in space.knobs.items()},
        **({} if space.global_batch is None else {"global_batch": space.global_batch}),
    }


def _values(values: tuple[Any, ...], name: str) -> str:
    return ", ".join(show(v) for v in values if v != KNOBS[name].default)


def load_space(path: str | Path) -> Space:
    """Load and validate a space file.

    Raises:
        SpaceError: the file is missing, is not YAML, or has invalid content; the message
            names every problem with its key.
    """
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise SpaceError(f"{path}: cannot read space file: {e.strerror or e}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise SpaceError(f"{path}: {yaml_problem(e)}") from None
    except (ValueError, RecursionError, OverflowError) as e:  # bad dates, absurd nesting
        raise SpaceError(f"{path}: not valid YAML: {type(e).__name__}: {e}") from None
    space = parse_space(data, source=str(path), base_dir=path.resolve().parent)
    if "name" not in (data.get("study") or {}):
        space = replace(space, study=replace(space.study, name=path.stem))
    return space
