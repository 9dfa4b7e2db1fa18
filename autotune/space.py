"""A validated search space: which workload, which knobs with which values, how trials run.

A :class:`Space` is made by :func:`autotune.space_file.load_space` (which parses and
checks a space file); this module holds the values and what can be asked of them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .config import Config, resolve_inactive
from .credentials import resolve_storage
from .errors import SpaceError
from .host import system_memory_bytes
from .knobs import KNOBS, Capabilities, show

DEVICES = ("auto", "cpu", "cuda")
# The knobs and trial settings of the first release: always in the space's fingerprint.
_FIRST_KNOBS = (
    "batch_size",
    "accumulation_steps",
    "amp_dtype",
    "num_workers",
    "pin_memory",
    "persistent_workers",
    "prefetch_factor",
    "non_blocking",
    "cudnn_benchmark",
    "matmul_precision",
    "channels_last",
    "sdpa_backend",
    "compile_mode",
    "compile_dynamic",
    "compile_fullgraph",
    "gradient_checkpointing",
    "world_size",
    "ddp_bucket_cap_mb",
    "ddp_gradient_as_bucket_view",
    "ddp_static_graph",
    "checkpoint_every",
    "jit",
    "optimizer_impl",
    "zero_grad_set_to_none",
    "num_threads",
    "interop_threads",
)
_FIRST_TRIAL_SETTINGS = (
    "warmup_steps",
    "measured_steps",
    "timeout_s",
    "planned_steps",
    "seed",
    "memory_cap",
)
# Trial settings that change no measurement nor the objective: never in the fingerprint.
_UNMEASURED_TRIAL_SETTINGS = ("cost_per_hour", "energy_price_per_kwh", "launcher")
# How a run's process starts: forked by a warm launcher that has imported torch, or a
# fresh interpreter (autotune.study.forks).
LAUNCHERS = ("fork", "spawn")
# What a study maximises (TrialSettings.objective): units (samples, or real tokens) per
# second, or per joule of the training device (autotune.study.scoring.objective).
THROUGHPUT, ENERGY = "throughput", "energy"
OBJECTIVES = (THROUGHPUT, ENERGY)
SAMPLERS = ("tpe", "tpe-independent", "gp", "random", "grid")


@dataclass(frozen=True)
class TrialSettings:
    """How long each trial runs. Steps are optimizer steps."""

    warmup_steps: int = 3
    measured_steps: int = 10
    # The window (and the warm-up after its first step) go on past their steps until they
    # have taken this long, so that a fast step is timed over a window long enough to
    # measure; at most trial_spec.MAX_STEPS_FACTOR times their steps. 0: off.
    min_window_s: float = 1.5
    min_warmup_s: float = 0.5
    timeout_s: float = 300.0
    planned_steps: int | None = None  # length of the real run; amortises compile time
    seed: int = 0
    # The real run's length in samples or real tokens instead of steps (at most one of the
    # three); amortises compile time as planned_steps does (autotune.planned.Plan).
    planned_samples: int | None = None
    planned_tokens: int | None = None
    # What an hour of the machine costs (any currency): the planned run's projected cost.
    # Changes no measurement, so it is never part of the space's fingerprint.
    cost_per_hour: float | None = None
    # What a kWh costs (any currency): the planned run's projected energy cost. Changes
    # no measurement either.
    energy_price_per_kwh: float | None = None
    # "throughput" (units per second) or "energy" (units per joule of the training
    # device, docs/energy.md). Changes every trial's value: part of the fingerprint.
    objective: str = THROUGHPUT
    # Token workloads: one untimed forward/backward on the dataset's longest samples
    # before the timed window, so the memory verdict holds for the longest batch.
    longest_batch: bool = True
    # Host memory (RSS of the trial and its workers, PSS) at which a trial is killed as
    # oom: a fraction of system RAM, bytes, or None for no cap. Protects the machine.
    memory_cap: int | float | None = 0.9
    # "fork": each run is forked by a warm launcher process that has imported torch and
    # the trial code (never the workload, never CUDA), saving the imports; "spawn": a
    # fresh interpreter per run. Where the OS cannot fork, runs are spawned.
    launcher: str = "fork"

    def memory_cap_bytes(self) -> int | None:
        if self.memory_cap is None:
            return None
        if isinstance(self.memory_cap, float) and self.memory_cap <= 1.0:
            total = system_memory_bytes()
            return int(self.memory_cap * total) if total else None
        return int(self.memory_cap)


@dataclass(frozen=True)
class Budget:
    n_trials: int | None = 20
    timeout_s: float | None = None


@dataclass(frozen=True)
class StudySettings:
    """Attributes:
    name: the study's name.
    storage: the Optuna storage URL written in the space file.
    storage_env: the environment variable holding the storage URL instead, when the
        file says ``storage: {env: NAME}`` (read when the storage is used, see
        :meth:`Space.storage_url`).
    heartbeat_s: a running trial not heard of for 3x this (study.heartbeat.grace_s) is
        failed and re-queued.
    """

    name: str = "autotune"
    storage: str = "sqlite:///autotune.db"
    storage_env: str | None = None
    heartbeat_s: float = 10.0


@dataclass(frozen=True)
class SearchSettings:
    """How the space is searched. Not part of the space's fingerprint: changing the
    strategy of a stored study is allowed, its measurements stay comparable.

    Attributes:
        sampler: ``tpe`` (multivariate, grouped), ``tpe-independent``, ``gp``, ``random`` or
            ``grid`` (every config of the space once, as restricted to the machine,
            inactive knobs folded; in an order shuffled by ``seed``).
        n_startup_trials: random trials before a model-based sampler takes over.
        seed: the sampler's seed.
        prune: stop a trial once its first measured steps show it cannot beat the best
            feasible trial so far by ``prune_margin`` (after ``prune_after`` of its
            measured steps; warm-up and compile are never judged).
        confirm_top: after the budget, measure the baseline and the best ``confirm_top``
            configs in paired rounds (each once per round, in an order that rotates) and
            rank by the median of their per-round ratios to the baseline. A config that
            is one of the first's ablations runs in the rounds anyway: it takes no
            finalist's place, which goes to the next config.
        confirm_rounds: the least paired rounds of each plan of the confirmation. Rounds
            are added while a decision is unresolved (:mod:`autotune.decisions`), up to
            ``confirm_max_rounds`` and for at most ``confirm_max_s`` seconds past each
            plan's least rounds (0: none past the least). A decision still unresolved
            then stands if its interval lies wholly above ``1 + min_gain`` (a knob kept,
            the full winner over its reduced config, a lead); otherwise it goes to the
            simpler config (a knob dropped, the reduced config taken, a tie).
        noise_runs: right after the baseline, run it this many more times back to back:
            their spread (the first, cold run left out) is the search's noise floor
            (its margin, its pruning margin); the confirmation then runs the baseline's
            twin in each round, and the median distance of the twin from it is the
            floor every decision must prove a gain above (never below ``min_gain``,
            never above :data:`autotune.decisions.FLOOR_CAP`, 10%); 0: no floor, no
            twin, the margin is ``min_gain``. The margin decides how soon a gain is
            proven; a gain is dropped as within noise only below ``min_gain``, and one
            between the two runs more rounds. The screening's order reads the median of the
            baseline's shares over these runs and its first.
        best_runs: the most runs a search trial that becomes the best so far gets before
            its figure is the bar (for pruning, the screening's next move, the
            finalists): a second run at once, and more, up to this, while its runs
            differ by more than the study's margin; its figure is their median. One
            lucky run otherwise sets a bar the config itself cannot reach, and every
            config measured after it is pruned or passed over against it. 1: the first
            run is the figure. Spends no budget; never on a machine-free replay. The
            same count bounds a screening move that landed behind the best but not
            clearly: a layout or a compile at half of it or more, any other move in
            full within the pruning margin (``screening.second_look``); each such look
            runs the best once more beside the move (side by side where
            ``interleave`` lets it, else first) and ranks the move by their ratio.
            A runner-up within the study's margin of the best, never in a look, gets
            one too (``screening.runner_up_look``): a best displaced on runs minutes
            later is measured beside its successor.
        ablate: in the same rounds, measure the winner with each knob that differs from
            the baseline set back to the baseline's value: each knob's contribution. Knobs
            whose contribution is within noise are dropped from the recommendation.
        min_gain: a knob stays only if its per-round gains prove more than this (0.03: 3%)
            or than the study's noise floor (counted up to 10%), whichever is larger; or,
            unresolved against the floor when the rounds run out, more than this. It is
            dropped before the cap only when they prove it below this.
        predict_memory: skip a sampled config that the study's memory model (fitted from
            its trials, :mod:`autotune.study.memory`) predicts over the memory budget;
            it is recorded as ``predicted-over-memory`` instead of run.
        interleave: a confirmation round runs its configs side by side (and the
            screening's paired look its two runs), one trial process each, taking turns
            on the machine a quarter second at a time
            (:func:`autotune.study.runner.run_interleaved`), so that the machine's drift
            over seconds falls on all of them alike; when their memory peaks together
            fit the memory limit, else one at a time (a note says so). One at a time
            too for configs of several ranks, a framework's own loop (a Trainer, a
            Lightning pair), an energy objective (an interleaved window reads no energy)
            and a replay. False: always one at a time.
        screening: after the baseline, move one knob per trial, in an order the
            baseline's median over its runs sets, before the sampler takes over
            (:mod:`autotune.study.screening`); never with the ``grid`` sampler.
    """

    sampler: str = "tpe"
    n_startup_trials: int = 5
    seed: int = 0
    prune: bool = True
    prune_margin: float = 0.2
    prune_after: float = 0.3
    confirm_top: int = 2
    confirm_rounds: int = 3
    confirm_max_rounds: int = 20
    confirm_max_s: float = 300.0
    noise_runs: int = 2
    best_runs: int = 3

    @property
    def max_rounds(self) -> int:
        """The most paired rounds of one plan (never fewer than the least)."""
        return max(self.confirm_rounds, self.confirm_max_rounds)

    ablate: bool = True
    min_gain: float = 0.03
    predict_memory: bool = True
    screening: bool = True
    interleave: bool = True


@dataclass(frozen=True)
class AccuracyGuard:
    """How far a trial's loss trajectory may stray from the fp32 reference run.

    A trial fails when the mean of its last ``last_k`` losses deviates from the
    reference's by more than ``tolerance`` (relative), or when any loss exceeds
    ``divergence`` times the reference's largest loss. NaN/Inf always fails.
    """

    enabled: bool = True
    tolerance: float = 0.05
    last_k: int = 5
    divergence: float = 10.0


@dataclass(frozen=True)
class Limits:
    """What makes a fast config safe to adopt.

    ``memory``: ``None`` (no limit), bytes (an int > 1 or a size like ``"6GiB"``) or a
    fraction (0 < x <= 1) of the trial device's memory. ``max_alloc_retries``: on CUDA, a
    trial whose caching allocator had to free and retry more often than this is judged
    over memory: it thrashes now and will OOM later in training.
    """

    memory: int | float | None = 0.9
    max_alloc_retries: int = 0
    accuracy: AccuracyGuard = AccuracyGuard()

    def memory_bytes(self, device_memory_bytes: int | None) -> int | None:
        """The memory budget in bytes on a device with ``device_memory_bytes``."""
        if self.memory is None:
            return None
        if isinstance(self.memory, float) and self.memory <= 1.0:
            return int(self.memory * device_memory_bytes) if device_memory_bytes else None
        return int(self.memory)


@dataclass(frozen=True)
class Space:
    """A validated search space.

    Attributes:
        knobs: knob name -> the values to search, in order (one value means fixed).
        baseline: the config run first (trial 0); every result is a speedup over it.
    """

    workload: str
    knobs: dict[str, tuple[Any, ...]]
    baseline: Config
    workload_args: dict[str, Any] = field(default_factory=dict)
    device: str = "auto"
    trial: TrialSettings = TrialSettings()
    budget: Budget = Budget()
    study: StudySettings = StudySettings()
    search: SearchSettings = SearchSettings()
    output_dir: str = "autotune-runs"
    base_dir: Path = Path(".")
    source: str = "<space>"
    limits: Limits = Limits()
    global_batch: int | None = None  # fixed samples per optimizer step; None = free
    notes: tuple[str, ...] = ()  # what parsing changed, shown before the search
    # Every sample's length (token workloads), found once by the study's probe and read by
    # its trials: a JSON file in the study's run folder. Not part of the fingerprint.
    lengths_path: str | None = None
    # The file's content as parsed (plain data), for a baseline the workload supplies
    # (:func:`autotune.space_file.with_workload_baseline`). Not part of the fingerprint.
    data: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)

    @property
    def fixed_batch(self) -> bool:
        return self.global_batch is not None

    @property
    def searched(self) -> dict[str, tuple[Any, ...]]:
        """The knobs with more than one value."""
        return {k: v for k, v in self.knobs.items() if len(v) > 1}

    def config_from(self, values: Mapping[str, Any]) -> Config:
        """A full config: ``values`` over the fixed knobs over the baseline.

        A fixed or baseline knob that is inactive given ``values`` (prefetch_factor when
        ``values`` turns the workers off) goes back to its default; ``values`` themselves
        must be a valid combination.
        """
        fixed = {k: v[0] for k, v in self.knobs.items() if len(v) == 1}
        merged = {**self.baseline.to_dict(), **fixed, **values}
        if self.global_batch is not None:
            per_step = merged["batch_size"] * merged["world_size"]
            merged["accumulation_steps"] = self.global_batch // per_step
        return Config(**resolve_inactive(merged, keep=values))

    def options(self) -> dict[str, tuple[Any, ...]]:
        """Every knob's candidate values: the listed ones, else the baseline's."""
        return {
            name: self.knobs.get(name, (value,)) for name, value in self.baseline.to_dict().items()
        }

    def storage_url(self, explicit: str | None = None) -> str:
        """The storage URL in effect: ``explicit`` (``--storage``), else
        ``$AUTOTUNE_STORAGE``, else the space file's ``study.storage`` (see
        :func:`autotune.credentials.resolve_storage`).

        Raises:
            StorageError: ``study.storage`` names an environment variable that is not set.
        """
        study = self.study
        return resolve_storage(explicit, study.storage, study.storage_env, self.source)

    def fingerprint(self) -> str:
        """A hash of what makes measurements comparable (not the budget or storage).

        A knob or trial setting added after the first release counts only when it is off
        its default, so a stored study keeps its fingerprint when autotune grows one.
        """
        defaults = {**{k: knob.default for k, knob in KNOBS.items()}, **TrialSettings().__dict__}

        def stable(values: dict[str, Any], first: tuple[str, ...]) -> dict[str, Any]:
            return {k: v for k, v in values.items() if k in first or v != defaults[k]}

        trial = {
            k: v for k, v in self.trial.__dict__.items() if k not in _UNMEASURED_TRIAL_SETTINGS
        }

        data = {
            "workload": self.workload,
            "workload_args": self.workload_args,
            "knobs": {k: list(v) for k, v in sorted(self.knobs.items())},
            "baseline": stable(self.baseline.to_dict(), _FIRST_KNOBS),
            "trial": stable(trial, _FIRST_TRIAL_SETTINGS),
            "global_batch": self.global_batch,
            "accuracy": self.limits.accuracy.__dict__,
        }
        blob = json.dumps(data, sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def framework_refusals(self, caps: Capabilities) -> list[str]:
        """One line per searched or baseline value the workload's framework loop
        (a Trainer's, a Lightning pair's) cannot set, naming the knob and why."""
        lines = [
            f"{self.source}: knobs.{name}: {show(value)} cannot apply: {why}"
            for name, values in self.knobs.items()
            for value in values
            if (why := _refused_by(caps, name, value))
        ]
        lines += [
            f"{self.source}: baseline.{name}: {show(value)} cannot apply: {why}"
            for name, value in self.baseline.to_dict().items()
            if name not in self.knobs and (why := _refused_by(caps, name, value))
        ]
        return lines

    def restrict(self, caps: Capabilities) -> tuple[Space, list[str]]:
        """Drop the values that cannot run with ``caps``; return the new space and notes.

        Raises:
            SpaceError: a listed value is a mistake for this workload (``packing`` for a
                workload that did not declare a causal-LM loss), named with the reason;
                ``trial.objective: energy`` where energy cannot be read.
        """
        mistakes = [
            f"{self.source}: knobs.{name}: {show(value)} cannot apply: {reason}"
            for name, values in {**self.options(), **self.knobs}.items()
            for value in values
            if (reason := KNOBS[name].mistake(caps, value))
        ]
        mistakes += self.framework_refusals(caps)
        mistakes += _energy_mistakes(self, caps)
        if mistakes:
            raise SpaceError(mistakes)
        notes: list[str] = []
        knobs = {name: _supported(name, values, caps, notes) for name, values in self.knobs.items()}
        baseline = _supported_baseline(self.baseline, knobs, caps, notes)
        space = replace(self, knobs=knobs, baseline=baseline)
        # A knob whose condition no remaining value of another knob meets cannot be searched.
        while never := never_apply(space):  # fixing one may strand a later one
            for name, reason in never.items():
                notes.append(f"{name} fixed to {KNOBS[name].default!r}: {reason}")
            fixed = {name: (KNOBS[name].default,) for name in never}
            space = replace(space, knobs={**space.knobs, **fixed})
        return space, notes


def _energy_mistakes(space: Space, caps: Capabilities) -> list[str]:
    """Why ``trial.objective: energy`` cannot rank this study's configs here: no energy
    can be read on this machine, or a config runs several ranks (whose per-sample energy
    is not given: docs/energy.md)."""
    if space.trial.objective != ENERGY:
        return []
    where = f"{space.source}: trial.objective: energy"
    if caps.energy_unavailable:
        return [
            f"{where}: energy cannot be read on this machine ({caps.energy_unavailable}); "
            "use objective: throughput"
        ]
    ranks = [v for v in space.options()["world_size"] if v > 1]
    if ranks:
        return [
            f"{where}: world_size {', '.join(map(str, ranks))} runs several processes, whose "
            "energy per sample is not measured; search world_size: 1 only"
        ]
    return []


def _refused_by(caps: Capabilities, name: str, value: Any) -> str | None:
    """Why the workload's framework loop cannot set knob ``name`` to ``value``."""
    refused = caps.framework_refused
    why = refused.get(f"{name}={show(value)}")
    if why is None and value != KNOBS[name].default:
        why = refused.get(name)
    return why


def _supported(name: str, values: tuple[Any, ...], caps: Capabilities, notes: list[str]):
    """The values of knob ``name`` that can run with ``caps``; notes what was dropped."""
    knob = KNOBS[name]
    kept = []
    for value in values:
        reason = knob.unsupported(caps, value)
        same = knob.means(caps, value)
        if same != value and same in values:
            notes.append(f"{name}={value} dropped: it is {same}, also listed")
        elif reason is None:
            kept.append(value)
        elif len(values) > 1:
            notes.append(f"{name}={value} dropped: {reason}")
    if not kept:
        kept = [knob.default]
        notes.append(f"{name} fixed to {knob.default!r}: {reason}")
    return tuple(kept)


def _supported_baseline(
    baseline: Config, knobs: dict[str, tuple[Any, ...]], caps: Capabilities, notes: list[str]
) -> Config:
    """The baseline with values that cannot run here replaced by the first candidate left
    (the default for an unlisted knob), and values that no longer apply at the defaults."""
    values = baseline.to_dict()
    for name, value in baseline.to_dict().items():
        reason = KNOBS[name].unsupported(caps, value)
        if reason is not None:
            values[name] = knobs[name][0] if name in knobs else KNOBS[name].default
            notes.append(f"baseline {name}={value} replaced by {values[name]!r}: {reason}")
    resolved = resolve_inactive(values)
    for name, value in values.items():
        if resolved[name] != value:
            reason = KNOBS[name].requires(resolved)
            notes.append(f"baseline {name}={value} replaced by {resolved[name]!r}: {reason}")
    return Config(**resolved)


def never_apply(space: Space) -> dict[str, str]:
    """Listed knobs none of whose non-default values any choice of the other knobs allows,
    with the reason (which names the other knob)."""
    options = space.options()
    out = {}
    for name, values in space.knobs.items():
        if any(v != KNOBS[name].default for v in values):
            reason = KNOBS[name].blocker(options)
            if reason is not None:
                out[name] = reason
    return out
