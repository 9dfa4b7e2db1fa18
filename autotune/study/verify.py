"""Verify a study's prediction: run baseline and recommendation for longer, side by side.

:func:`verify` (``autotune verify SPACE``) loads the stored study, then runs its baseline
and its recommended config in paired rounds, each run a fresh process
(``python -m autotune.trial.verify``, started by module name: the driver never imports
it) that builds the workload through the public ``autotune.apply_workload`` as a user's
script does, warms up untimed and times ``steps_factor`` times the trial's measured
steps. The two runs of a round swap order from one round to the next, so drift of the
machine hits both alike. The observed speedup is the median over rounds of the
recommendation's throughput over the baseline's in the study's unit (real tokens/s for
token workloads, else samples/s; with a planned length, ``trial.planned_steps``,
``planned_samples`` or ``planned_tokens``, the same planned-run objective the study
ranked by), and the error is ``observed / predicted - 1``.

Each run's folder (``<runs>/<study>/verify/r<round>-<role>/``) holds ``spec.json``,
``result.json`` and the logs; ``verify.json`` next to them holds the whole verification.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ..decisions import interval
from ..errors import ArgumentError, SpaceError, StorageError, make_folder
from ..measurement import FAILED, OK, TOKENS, compile_estimate_s
from ..planned import Plan
from ..results import BASELINE, TrialRecord, TuneResult
from ..space import ENERGY, Space
from ..trial_spec import TrialSpec, trial_spec
from . import runner
from .scoring import rate_objective
from .storage import load_result

# The two roles of a verify run: the baseline (results.BASELINE, a trial role too) and this.
RECOMMENDED = "recommended"
DEFAULT_ROUNDS = 3
# Rounds are added past the least while the error's interval straddles the goal's edge.
DEFAULT_MAX_ROUNDS = 8
# The verdicts: the error's interval inside the goal, outside it, or across its edge.
WITHIN, BEYOND, UNRESOLVED = "within", "beyond", "unresolved"
DEFAULT_STEPS_FACTOR = 10
# The goal for the prediction: the observed speedup within 5% of the predicted one.
TOLERANCE = 0.05
MODULE = "autotune.trial.verify"

# What runs one process: (spec, folder, timeout_s, memory_cap_bytes) -> result payload.
RunChild = Callable[[TrialSpec, Path, float, int | None], dict[str, Any]]


@dataclass(frozen=True)
class VerifyRun:
    """One long run of one config in a fresh process.

    Attributes:
        round: the paired round it belongs to (from 1).
        role: ``baseline`` or ``recommended``.
        trial: the study's trial number of the config.
        status: ``ok``, or why not (``failed``, ``oom``, ``nan``, ``timeout``).
        unit: the study's unit: ``tokens`` (real tokens) or ``samples``.
        rate: steady-state throughput in the study's unit per second (real tokens/s or
            samples/s), data loading included, warm-up excluded.
        value: what the ratio compares: ``rate``, or with a planned length the planned
            run's mean throughput (compile time amortised), as the study's objective.
        result: the run's ``result.json`` (samples/s, tokens/s, seconds, epochs...).
    """

    round: int
    role: str
    trial: int
    status: str
    reason: str = ""
    unit: str = "samples"
    rate: float | None = None
    value: float | None = None
    steps: int = 0
    window_s: float | None = None
    warmup_s: float | None = None
    wall_s: float | None = None
    folder: Path | None = None
    result: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == OK


@dataclass(frozen=True)
class Verification:
    """Predicted against observed speedup of a study's recommended config.

    ``runs`` are in the order they ran; ``rounds`` is how many ran: at least
    ``min_rounds``, more while the verdict was unresolved, at most ``max_rounds``.
    ``same_config`` means the recommendation is the baseline itself: nothing was run.
    """

    study_name: str
    unit: str
    baseline: TrialRecord
    best: TrialRecord
    predicted: float | None
    rounds: int
    steps_factor: int
    measured_steps: int
    steps: int
    warmup_steps: int
    endless: bool = False
    planned: Plan | None = None  # the planned run the values amortise compile time over
    runs: list[VerifyRun] = field(default_factory=list)
    folder: Path | None = None
    same_config: bool = False
    min_rounds: int = DEFAULT_ROUNDS
    max_rounds: int = DEFAULT_MAX_ROUNDS

    def ratios(self) -> list[tuple[int, float]]:
        """(round, recommended value / baseline value) of every round whose two runs
        both succeeded."""
        out = []
        for r in range(1, self.rounds + 1):
            pair = {run.role: run for run in self.runs if run.round == r}
            base, rec = pair.get(BASELINE), pair.get(RECOMMENDED)
            if base and rec and base.ok and rec.ok and base.value and rec.value is not None:
                out.append((r, rec.value / base.value))
        return out

    @property
    def observed(self) -> float | None:
        """The median ratio over the complete rounds; ``None`` when none completed."""
        ratios = [ratio for _, ratio in self.ratios()]
        return statistics.median(ratios) if ratios else None

    @property
    def error(self) -> float | None:
        """``observed / predicted - 1`` (0.03: the recommendation did 3% better than
        predicted); ``None`` when either is missing."""
        if self.observed is None or not self.predicted:
            return None
        return self.observed / self.predicted - 1

    @property
    def error_interval(self) -> tuple[float, float] | None:
        """The sign test's interval on the median ratio (:func:`autotune.decisions.interval`)
        as an error against the prediction; ``None`` with too few rounds to bound it."""
        bounds = interval([ratio for _, ratio in self.ratios()])
        if bounds is None or not self.predicted:
            return None
        return bounds[0] / self.predicted - 1, bounds[1] / self.predicted - 1

    @property
    def verdict(self) -> str | None:
        """:data:`WITHIN` when the error's interval lies inside ±:data:`TOLERANCE`,
        :data:`BEYOND` when it lies wholly outside, :data:`UNRESOLVED` while it straddles
        an edge (or too few rounds completed); ``None`` without a prediction."""
        if self.error is None:
            return None
        bounds = self.error_interval
        if bounds is None:
            return UNRESOLVED
        low, high = bounds
        if -TOLERANCE <= low and high <= TOLERANCE:
            return WITHIN
        if high < -TOLERANCE or low > TOLERANCE:
            return BEYOND
        return UNRESOLVED

    @property
    def within_tolerance(self) -> bool | None:
        """True within the goal, False beyond it, ``None`` unresolved (:attr:`verdict`)."""
        return {WITHIN: True, BEYOND: False}.get(self.verdict or "")

    @property
    def spread(self) -> float | None:
        """Half the range of the rounds' ratios over their median (0.07: the rounds lay
        within ±7% of it); ``None`` with fewer than two complete rounds. Wider than the
        goal, the machine's run-to-run noise alone can move the verdict."""
        ratios = [ratio for _, ratio in self.ratios()]
        if len(ratios) < 2:
            return None
        return (max(ratios) - min(ratios)) / (2 * statistics.median(ratios))

    def first_in(self, number: int) -> str | None:
        """Which role ran first in round ``number``."""
        return next((run.role for run in self.runs if run.round == number), None)

    def to_dict(self) -> dict[str, Any]:
        """Plain data (``verify.json``, ``autotune verify --json``)."""
        ratios = self.ratios()
        return {
            "study": self.study_name,
            "unit": self.unit,
            "baseline": {"trial": self.baseline.number, "config": self.baseline.config.to_dict()},
            "recommended": {"trial": self.best.number, "config": self.best.config.to_dict()},
            "same_config": self.same_config,
            "predicted_speedup": self.predicted,
            "observed_speedup": self.observed,
            "observed_min": min((r for _, r in ratios), default=None),
            "observed_max": max((r for _, r in ratios), default=None),
            "error": self.error,
            "tolerance": TOLERANCE,
            "within_tolerance": self.within_tolerance,
            "verdict": self.verdict,
            "error_interval": list(self.error_interval) if self.error_interval else None,
            "min_rounds": self.min_rounds,
            "max_rounds": self.max_rounds,
            "spread": self.spread,
            "ratios": [{"round": n, "ratio": ratio} for n, ratio in ratios],
            "rounds": self.rounds,
            "steps": self.steps,
            "steps_factor": self.steps_factor,
            "measured_steps": self.measured_steps,
            "warmup_steps": self.warmup_steps,
            "endless": self.endless,
            "planned": {self.planned.key: self.planned.length} if self.planned else None,
            "order": [[run.round, run.role] for run in self.runs],
            "runs": [
                {**asdict(run), "folder": str(run.folder) if run.folder else None}
                for run in self.runs
            ],
            "folder": str(self.folder) if self.folder else None,
        }


def run_child(
    spec: TrialSpec, folder: Path, timeout_s: float, memory_cap_bytes: int | None = None
) -> dict[str, Any]:
    """Run ``python -m autotune.trial.verify`` on ``spec`` in ``folder``; its payload.

    Supervised like a trial (:func:`autotune.study.runner.run_child`): its own process
    group, killed with its DataLoader workers past ``timeout_s`` or ``memory_cap_bytes``,
    dying with the driver. Never raises for a failing run (the payload has its status and
    reason), only on KeyboardInterrupt, after killing the process group.
    """
    return runner.run_child(
        spec, folder, timeout_s, memory_cap_bytes=memory_cap_bytes, module=MODULE
    )


def check_arguments(
    rounds: int, steps_factor: int, timeout_s: float | None = None, max_rounds: int | None = None
) -> None:
    """Reject out-of-range arguments at once, naming the argument."""
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ArgumentError(f"rounds must be an integer >= 1 but got {rounds!r}")
    if max_rounds is not None and (
        isinstance(max_rounds, bool) or not isinstance(max_rounds, int) or max_rounds < rounds
    ):
        raise ArgumentError(
            f"max_rounds must be an integer >= rounds ({rounds}) but got {max_rounds!r}"
        )
    if isinstance(steps_factor, bool) or not isinstance(steps_factor, int) or steps_factor < 1:
        raise ArgumentError(f"steps_factor must be an integer >= 1 but got {steps_factor!r}")
    if timeout_s is not None and not timeout_s > 0:  # NaN fails too
        raise ArgumentError(f"timeout_s must be a number > 0 but got {timeout_s}")


def verify(
    space: Space,
    *,
    storage: str | None = None,
    study_name: str | None = None,
    out_dir: str | Path | None = None,
    rounds: int = DEFAULT_ROUNDS,
    max_rounds: int | None = None,
    steps_factor: int = DEFAULT_STEPS_FACTOR,
    endless: bool = False,
    timeout_s: float | None = None,
    on_run: Callable[[VerifyRun, int, int], None] | None = None,
    on_start: Callable[[TuneResult], None] | None = None,
    run: RunChild | None = None,
) -> Verification:
    """Run the stored study's baseline and recommendation longer, in paired rounds.

    Args:
        space: the space the study was run from (workload, device, trial settings).
        storage, study_name: where the study is (default: the space's).
        out_dir: the run folder given to ``autotune run`` (default: the space's
            ``output_dir``); runs go to ``<out_dir>/<study>/verify/``.
        rounds: the least paired rounds; each runs both configs once, the first one
            alternating. More run while the verdict is unresolved (:attr:`Verification.verdict`).
        max_rounds: the most rounds (default: :data:`DEFAULT_MAX_ROUNDS`, at least
            ``rounds``); ``max_rounds=rounds`` runs exactly ``rounds``.
        steps_factor: each run times this many times the trial's ``measured_steps``.
        endless: stream the trials' seeded permutations instead of epochs.
        timeout_s: per run (default: the trial's ``timeout_s`` times ``steps_factor``).
        on_run: called with each finished run, its position and the number of runs.
        on_start: called with the stored study's result once it is loaded, before any run.
        run: what runs one process (default: :func:`run_child`); tests substitute it.

    Returns:
        A :class:`Verification`: predicted and observed speedup, the error, every run.

    Raises:
        ArgumentError: an argument is out of range.
        StorageError: no such study, or it holds no feasible baseline or recommendation.
    """
    check_arguments(rounds, steps_factor, timeout_s, max_rounds)
    _, result = load_result(space, storage, study_name)
    if on_start is not None:
        on_start(result)
    runs_dir = Path(out_dir or space.output_dir) / result.study_name
    return verify_result(
        space,
        result,
        runs_dir / "verify",
        rounds=rounds,
        max_rounds=max_rounds,
        steps_factor=steps_factor,
        endless=endless,
        timeout_s=timeout_s,
        on_run=on_run,
        run=run,
        lengths_path=runs_dir / "probe" / "lengths.json",
    )


def verify_result(
    space: Space,
    result: TuneResult,
    folder: Path,
    *,
    rounds: int = DEFAULT_ROUNDS,
    max_rounds: int | None = None,
    steps_factor: int = DEFAULT_STEPS_FACTOR,
    endless: bool = False,
    timeout_s: float | None = None,
    on_run: Callable[[VerifyRun, int, int], None] | None = None,
    run: RunChild | None = None,
    lengths_path: Path | None = None,
) -> Verification:
    """:func:`verify` for a loaded result; runs go to ``folder``, the data to
    ``folder/verify.json``. The folder is made only when there is something to run.

    Raises:
        ArgumentError: an argument is out of range.
        StorageError: the result has no feasible baseline or recommendation.
        SpaceError: the study's objective is energy (verify compares throughput).
    """
    check_arguments(rounds, steps_factor, timeout_s, max_rounds)
    if space.trial.objective == ENERGY:
        raise SpaceError(
            f"{space.source}: trial.objective: energy: autotune verify compares speedups in "
            "throughput, and this study ranked its configs by units per joule"
        )
    base, best = _pair(result)
    trial = space.trial
    verification = Verification(
        study_name=result.study_name,
        unit=result.unit,
        baseline=base,
        best=best,
        predicted=result.speedup,
        rounds=rounds,
        steps_factor=steps_factor,
        measured_steps=trial.measured_steps,
        steps=steps_factor * trial.measured_steps,
        warmup_steps=trial.warmup_steps,
        endless=endless,
        planned=Plan.of(trial),
        folder=folder,
        same_config=best.number == base.number or best.config == base.config,
        min_rounds=rounds,
        max_rounds=max_rounds if max_rounds is not None else max(rounds, DEFAULT_MAX_ROUNDS),
    )
    if verification.same_config:
        return verification
    if any(r.config.world_size > 1 for r in (base, best)):
        raise ArgumentError(
            "verify runs one process per config; configs of several processes "
            "(world_size > 1: DDP or FSDP) are not supported"
        )
    make_folder(folder, "out")
    run = run or run_child
    timeout = timeout_s if timeout_s is not None else trial.timeout_s * steps_factor
    spec = _run_spec(space, verification, lengths_path)
    runs: list[VerifyRun] = []
    number = 0
    while _more(verification, number):
        number += 1
        for role in _roles(number):
            record = base if role == BASELINE else best
            run_folder = folder / f"r{number}-{role}"
            payload = run(
                replace(spec, config=record.config),
                run_folder,
                timeout,
                trial.memory_cap_bytes(),
            )
            done = _verify_run(number, role, record, payload, run_folder, result.unit, space)
            runs.append(done)
            verification = replace(verification, runs=list(runs), rounds=number)
            if on_run is not None:
                on_run(done, len(runs), 2 * max(rounds, number))
    (folder / "verify.json").write_text(json.dumps(verification.to_dict(), indent=1))
    return verification


def _run_spec(space: Space, v: Verification, lengths_path: Path | None) -> TrialSpec:
    """The spec of a verify run (its config set per run): ``steps_factor`` times the
    trial's steps and its window's minimum time, after the trial's warm-up."""
    known = lengths_path is not None and lengths_path.is_file()
    return trial_spec(
        space,
        "verify",
        measured_steps=v.steps,
        min_window_s=v.steps_factor * space.trial.min_window_s,
        endless=v.endless,
        lengths_path=str(lengths_path.resolve()) if known else None,
    )


def _more(v: Verification, done: int) -> bool:
    """Whether another round runs after ``done``: up to the least, then while the verdict
    is unresolved, up to the most."""
    if done < v.min_rounds:
        return True
    return done < v.max_rounds and v.verdict == UNRESOLVED


def _roles(number: int) -> tuple[str, str]:
    """The order of round ``number``'s two runs: the baseline first in odd rounds."""
    return (BASELINE, RECOMMENDED) if number % 2 else (RECOMMENDED, BASELINE)


def _pair(result: TuneResult) -> tuple[TrialRecord, TrialRecord]:
    """The baseline and the recommendation, both feasible, or a one-line error."""
    name = result.study_name
    if result.baseline is None:
        raise StorageError(f"study {name!r} has no measured baseline; run `autotune run` first")
    if result.best is None:
        raise StorageError(f"study {name!r} has no feasible config to verify")
    if not result.baseline.feasible:
        raise StorageError(
            f"the baseline of study {name!r} was not feasible ({result.baseline.status}: "
            f"{result.baseline.reason}): there is no speedup to verify"
        )
    return result.baseline, result.best


def _verify_run(
    number: int,
    role: str,
    record: TrialRecord,
    payload: dict[str, Any],
    folder: Path,
    unit: str,
    space: Space,
) -> VerifyRun:
    """A run's payload as a :class:`VerifyRun`, its rate in the study's unit."""
    status, reason = payload.get("status", FAILED), payload.get("reason", "")
    rate = payload.get("tokens_per_s") if unit == TOKENS else payload.get("samples_per_s")
    if status == OK and not rate:
        status, reason = FAILED, f"the run measured no {unit}/s"
    value = None
    if status == OK:
        steps, window_s = payload["steps"], payload["window_s"]
        per_step = rate * window_s / steps
        compile_s = compile_estimate_s(
            payload.get("warmup_s") or 0.0, payload.get("warmup_steps") or 0, window_s / steps
        )
        samples = payload.get("samples_per_s")
        value = rate_objective(
            rate,
            compile_s,
            per_step,
            space.trial,
            samples_per_step=samples * window_s / steps if samples else None,
            tokens_per_step=per_step if unit == TOKENS else None,
        )
    return VerifyRun(
        round=number,
        role=role,
        trial=record.number,
        status=status,
        reason=reason,
        unit=unit,
        rate=rate if status == OK else None,
        value=value,
        steps=int(payload.get("steps") or 0),
        window_s=payload.get("window_s"),
        warmup_s=payload.get("warmup_s"),
        wall_s=payload.get("wall_s"),
        folder=folder,
        result=payload,
    )
