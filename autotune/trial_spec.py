"""What crosses into a trial process: the spec it runs, and the process protocol.

The driver (:mod:`autotune.study.runner`, :mod:`autotune.study.verify`) builds one
:class:`TrialSpec` with :func:`trial_spec`, writes it to the run's folder as
``spec.json`` (:meth:`TrialSpec.write`), and starts ``python -m autotune.trial`` (or
``autotune.trial.verify``) on it by module name; the trial process reads it back once
(:meth:`TrialSpec.read`) and passes the typed value on. Each setting has one field here.
A value module: neither torch nor optuna.
"""

from __future__ import annotations

import json
import math
import signal
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from .config import Config
from .space import Space

# Where a trial process writes its Python stacks (faulthandler: on a fatal signal, and on
# STACKS_SIGNAL, which the supervisor sends before killing a hung trial), one file per
# process in the trial's folder: written by autotune.trial, read by autotune.study.stacks.
STACKS_SIGNAL = signal.SIGUSR1
STACKS_FILE = "stacks-{pid}.log"
STACKS_GLOB = "stacks-*.log"
# The environment variable holding the wall-clock time (time.time()) a trial was spawned.
SPAWNED_AT = "AUTOTUNE_SPAWNED_AT"

# An interleaved run's pipes (autotune.trial.baton): the trial says READY on
# ``<baton>.release`` once it waits for its first turn (its imports done); the driver
# grants a turn on ``<baton>.grant``; the trial answers on ``<baton>.release``: TURN (it
# wants another) or DONE (its result is written).
GRANT, RELEASE = ".grant", ".release"
READY, TURN, DONE = b"o", b"r", b"d"

# What a run does: measure a config (``trial``), find out what the machine and workload
# can do (``probe``), check a workload for ``autotune validate`` (``check``), profile a
# config (``profile``), or one long run of ``autotune verify`` (``verify``).
MODES = ("trial", "probe", "check", "profile", "verify")
# A window (or warm-up) extended to cover its minimum time stops at this many times its
# step count: a step of well under a millisecond would otherwise take thousands.
MAX_STEPS_FACTOR = 100


@dataclass(frozen=True)
class TrialSpec:
    """One run of a trial process.

    Attributes:
        mode: one of :data:`MODES`.
        workload: the workload reference (``path.py:factory`` or ``module:factory``).
        workload_args: keyword arguments of the workload's factory.
        base_dir: the space file's folder (a relative workload path starts there).
        device: ``auto``, ``cpu``, ``cuda``...
        seed: torch's seed before the workload is built, and the data order's.
        lengths_path: every sample's length, written by the study's probe.
        config: the config to run (``trial``, ``profile``, ``verify``).
        warmup_steps: optimizer steps run untimed before the window.
        measured_steps: optimizer steps timed (a verify run's whole window).
        min_warmup_s: the warm-up goes on past ``warmup_steps`` until it has taken this
            long (0: off).
        min_window_s: the window goes on past ``measured_steps`` until it has taken this
            long (0: off); both stop at :data:`MAX_STEPS_FACTOR` times their steps.
        longest_batch: token workloads: one untimed step of the longest samples first.
        progress_path: where the window's progress goes, for pruning (``None``: nowhere).
        baseline: the probe: the baseline whose step is FLOP-counted for MFU.
        peak_keys: the probe: the dtypes whose matmul peak is measured.
        vec_isa: the probe: run inductor's vector-ISA probe.
        batch_size: the check: the batch size of its one step.
        profile_steps: the profile: steps profiled.
        trace_path: the profile: where the Chrome trace goes.
        endless: a verify run streams seeded permutations instead of epochs.
        baton: an interleaved run: its pipes' path without ``.grant``/``.release``
            (:mod:`autotune.trial.baton`); ``None`` runs alone.
        turn_s: an interleaved run: how long one turn holds the machine in the window.
    """

    mode: str
    workload: str
    workload_args: dict[str, Any] | None = None
    base_dir: str | None = None
    device: str = "auto"
    seed: int = 0
    lengths_path: str | None = None
    config: Config | None = None
    warmup_steps: int = 0
    measured_steps: int = 0
    min_warmup_s: float = 0.0
    min_window_s: float = 0.0
    longest_batch: bool = True
    progress_path: str | None = None
    baseline: Config | None = None
    peak_keys: tuple[str, ...] = ("fp32",)
    vec_isa: bool = False
    batch_size: int = 1
    profile_steps: int = 5
    trace_path: str | None = None
    endless: bool = False
    baton: str | None = None
    turn_s: float = 0.25

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)} but got {self.mode!r}")

    @property
    def world_size(self) -> int:
        """The processes the run's config takes (DDP or FSDP ranks)."""
        return self.config.world_size if self.config is not None else 1

    def to_dict(self) -> dict[str, Any]:
        """Plain data (``spec.json``)."""
        data = asdict(self)
        for key in ("config", "baseline"):
            value = getattr(self, key)
            data[key] = value.to_dict() if value is not None else None
        data["peak_keys"] = list(self.peak_keys)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrialSpec:
        """The spec of :meth:`to_dict`'s data."""
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        for key in ("config", "baseline"):
            if values.get(key) is not None:
                values[key] = Config.from_dict(values[key])
        if "peak_keys" in values:
            values["peak_keys"] = tuple(values["peak_keys"])
        return cls(**values)

    def write(self, path: Path) -> None:
        """Write the spec as JSON (the one serialisation)."""
        path.write_text(json.dumps(self.to_dict(), indent=1, default=str))

    @classmethod
    def read(cls, path: Path) -> TrialSpec:
        """The spec :meth:`write` wrote."""
        return cls.from_dict(json.loads(Path(path).read_text()))


def steps_to_run(done: int, elapsed_s: float, min_steps: int, min_s: float) -> int:
    """The steps a phase of at least ``min_steps`` steps and ``min_s`` seconds runs, having
    run ``done`` steps in ``elapsed_s`` seconds: ``done`` once both are covered, else an
    estimate from the pace so far (the phase asks again when it gets there); never more
    than :data:`MAX_STEPS_FACTOR` times ``min_steps`` (at least one step's worth).

    The trial's loop extends its warm-up and window with it (``trial/loop.py``
    ``run_phase``); the pruner predicts a window's length with :func:`window_steps`."""
    cap = max(min_steps, 1) * MAX_STEPS_FACTOR
    if done < min_steps:
        return min_steps
    if elapsed_s >= min_s or done >= cap:
        return done
    if done == 0 or elapsed_s <= 0:
        return done + 1
    return min(cap, max(done + 1, math.ceil(done * min_s / elapsed_s)))


def window_steps(measured_steps: int, min_window_s: float, step_s: float) -> int:
    """The steps a window of ``measured_steps`` steps and ``min_window_s`` seconds takes
    at ``step_s`` seconds a step (as :func:`steps_to_run` extends it)."""
    if min_window_s <= 0 or step_s <= 0:
        return measured_steps
    cap = max(measured_steps, 1) * MAX_STEPS_FACTOR
    return max(measured_steps, min(cap, math.ceil(min_window_s / step_s)))


def trial_spec(space: Space, mode: str, config: Config | None = None, **settings: Any) -> TrialSpec:
    """The spec of a run of ``space``'s workload: its device, seed, steps and window
    times from the space's trial settings, ``settings`` overriding or adding fields (a
    verify run's steps, the probe's peak keys...). The one builder the study and
    ``autotune verify`` use."""
    trial = space.trial
    spec = TrialSpec(
        mode=mode,
        workload=space.workload,
        workload_args=space.workload_args,
        base_dir=str(space.base_dir),
        device=space.device,
        seed=trial.seed,
        lengths_path=space.lengths_path,
        config=config,
        warmup_steps=trial.warmup_steps,
        measured_steps=trial.measured_steps,
        min_warmup_s=float(trial.min_warmup_s),
        min_window_s=float(trial.min_window_s),
        longest_batch=trial.longest_batch,
    )
    return replace(spec, **settings)
