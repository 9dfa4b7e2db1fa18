"""From a measurement to a verdict: the objective value, the status and Optuna constraints."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from ..measurement import (
    ACCURACY,
    NAN,
    OK,
    OOM,
    OVER_MEMORY,
    PREDICTED_OVER_MEMORY,
    Measurement,
)
from ..planned import Plan
from ..space import ENERGY, AccuracyGuard, Space, TrialSettings


@dataclass(frozen=True)
class Verdict:
    """What the driver concludes about a trial.

    ``status`` is ``ok`` (feasible) or why not: ``over-memory``, ``accuracy``, ``nan``,
    ``oom``, ``timeout``, ``failed``. ``constraints`` go to ``Trial.set_constraint``.
    """

    status: str
    reason: str
    constraints: dict[str, float]
    memory_budget_bytes: int | None = None
    loss_deviation: float | None = None  # vs the reference, when trajectories compare

    @property
    def feasible(self) -> bool:
        return self.status == OK


def rate_objective(
    rate: float,
    compile_s: float,
    per_step: float | None,
    trial: TrialSettings,
    *,
    samples_per_step: float | None = None,
    tokens_per_step: float | None = None,
) -> float:
    """The value to maximise for a rate (samples or tokens per second, ``per_step`` of
    them per optimizer step): the rate, or with a planned length the planned run's mean.

    With a planned run of ``P`` optimizer steps (``planned_steps``; ``planned_samples``
    or ``planned_tokens`` divided by this config's ``samples_per_step`` or
    ``tokens_per_step``: :meth:`autotune.planned.Plan.steps`), a run costs
    ``compile_s + P * step_s``, so a long compile that saves little per step loses on a
    short run.
    """
    plan = Plan.of(trial)
    steps = plan.steps(samples_per_step, tokens_per_step) if plan is not None else None
    if steps is None or per_step is None:
        return rate
    step_s = per_step / rate
    run_s = compile_s + steps * step_s
    return steps * per_step / run_s


def objective(m: Measurement, trial: TrialSettings, cold_compile_s: float | None = None) -> float:
    """The objective of a measurement (0 without a throughput): samples/s, or real
    tokens/s for a token workload; see :func:`rate_objective`. With ``trial.objective:
    energy``, samples (real tokens) per joule of the training device over the timed
    window (:attr:`Measurement.unit_per_joule`; 0 where no energy was read): the compile's
    energy is not measured, so a planned length does not amortise it (docs/energy.md).

    ``cold_compile_s``: the config's compile time on a cold cache, for a run whose own
    compile hit a warm one (a repeat): the planned run is charged the cold figure, so the
    objective does not depend on which run of a config came first.
    """
    if not m.rate:
        return 0.0
    if trial.objective == ENERGY:
        return m.unit_per_joule or 0.0
    compile_s = m.compile_s or 0.0
    if m.compile_cache == "warm" and cold_compile_s is not None:
        compile_s = cold_compile_s
    return rate_objective(
        m.rate,
        compile_s,
        m.per_step,
        trial,
        samples_per_step=m.samples_per_step,
        tokens_per_step=m.tokens_per_step,
    )


def _memory(m: Measurement, budget: int | None, max_retries: int) -> tuple[float, str]:
    """Constraint value (> 0 infeasible) and the reason."""
    if m.status == OOM:
        return 1.0, m.reason
    used = m.judged_mem_bytes  # NVML's figure of the process where larger than the peak
    if budget is not None and used is not None and used > budget:
        return (
            used - budget
        ) / budget, f"{_memory_text(m)} exceeds the budget {budget / 2**20:.0f} MiB"
    if m.alloc_retries is not None and m.alloc_retries > max_retries:
        return float(m.alloc_retries - max_retries), (
            f"the CUDA allocator retried {m.alloc_retries} times (memory pressure; "
            f"limit {max_retries}): likely to OOM later in training"
        )
    if budget is not None and used is not None:
        return (used - budget) / budget, ""
    return 0.0, ""


def _memory_text(m: Measurement) -> str:
    """The memory judged, in words: NVML's figure of the process with the allocator's
    peak beside it, or the peak alone."""
    if m.judged_mem_bytes != m.peak_mem_bytes:
        text = f"device memory {m.judged_mem_bytes / 2**20:.0f} MiB (NVML, this process"
        if m.peak_mem_bytes is None:
            return text + ")"
        return text + f"; allocator peak {m.peak_mem_bytes / 2**20:.0f} MiB)"
    return f"peak memory {m.peak_mem_bytes / 2**20:.0f} MiB"


def _mean_tail(losses: list[float], k: int) -> float:
    return statistics.fmean(losses[-k:])


def accuracy_deviation(losses: list[float], reference: list[float], k: int) -> float:
    """Relative deviation of the mean of the last ``k`` losses from the reference's.

    Both trajectories are cut to their common length first.
    """
    n = min(len(losses), len(reference))
    ours, ref = _mean_tail(losses[:n], k), _mean_tail(reference[:n], k)
    return abs(ours - ref) / max(abs(ref), 1e-8)


def _accuracy(
    m: Measurement, reference: list[float] | None, guard: AccuracyGuard, comparable: bool
) -> tuple[float, str]:
    if m.status == NAN or any(not math.isfinite(x) for x in m.losses):
        return 1.0, m.reason or "loss is not finite"
    if not (guard.enabled and reference and m.losses):
        return 0.0, ""
    peak = max(m.losses)
    if peak > guard.divergence * max(reference):
        return 1.0, f"diverged: loss reached {peak:.4g} (reference peak {max(reference):.4g})"
    if not comparable:
        return 0.0, ""
    dev = accuracy_deviation(m.losses, reference, guard.last_k)
    if dev > guard.tolerance:
        return dev - guard.tolerance, (
            f"loss deviates {dev:.1%} from the fp32 reference over the last {guard.last_k} "
            f"steps (tolerance {guard.tolerance:.1%})"
        )
    return dev - guard.tolerance, ""


def judge(
    m: Measurement,
    space: Space,
    *,
    reference: list[float] | None = None,
    memory_budget_bytes: int | None = None,
) -> Verdict:
    """Decide a trial's status and constraints.

    Failed trials are *infeasible*, not Optuna FAIL: samplers ignore FAIL trials and keep
    proposing the same region, while infeasible ones steer them away.
    """
    limits = space.limits
    memory, memory_reason = _memory(m, memory_budget_bytes, limits.max_alloc_retries)
    accuracy, accuracy_reason = _accuracy(m, reference, limits.accuracy, space.fixed_batch)
    crashed = m.status not in (OK, NAN)
    constraints = {"failed": 1.0 if crashed else 0.0, "memory": memory, "accuracy": accuracy}
    if crashed:
        status, reason = m.status, m.reason
    elif m.status == NAN:
        status, reason = NAN, accuracy_reason
    elif memory > 0:
        status, reason = OVER_MEMORY, memory_reason
    elif accuracy > 0:
        status, reason = ACCURACY, accuracy_reason
    else:
        status, reason = OK, ""
    deviation = None
    if reference and m.losses and space.fixed_batch and status in (OK, ACCURACY, OVER_MEMORY):
        deviation = accuracy_deviation(m.losses, reference, limits.accuracy.last_k)
    return Verdict(status, reason, constraints, memory_budget_bytes, deviation)


def predicted_over(peak_bytes: float | None, reason: str, memory_budget_bytes: int) -> Verdict:
    """The verdict of a config skipped as predicted over the budget: the memory
    constraint is the predicted excess (1 when only an out-of-memory run is known), so
    the sampler steers away from it as from a measured one."""
    over = 1.0
    if peak_bytes is not None:
        over = max((peak_bytes - memory_budget_bytes) / memory_budget_bytes, 1e-3)
    constraints = {"failed": 0.0, "memory": over, "accuracy": 0.0}
    return Verdict(PREDICTED_OVER_MEMORY, reason, constraints, memory_budget_bytes)
