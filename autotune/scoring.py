"""From a measurement to the objective value and the constraints Optuna sees."""

from __future__ import annotations

from .measurement import Measurement
from .space import TrialSettings


def objective(m: Measurement, trial: TrialSettings) -> float:
    """The value to maximise: samples/s, or with ``planned_steps`` the run's mean rate.

    With ``planned_steps = P``, a run costs ``compile_s + P * step_s``, so a long compile
    that saves little per step loses on a short run.
    """
    if not m.samples_per_s:
        return 0.0
    if trial.planned_steps is None or m.samples_per_step is None:
        return m.samples_per_s
    step_s = m.samples_per_step / m.samples_per_s
    run_s = (m.compile_s or 0.0) + trial.planned_steps * step_s
    return trial.planned_steps * m.samples_per_step / run_s


def constraints(m: Measurement) -> dict[str, float]:
    """Constraint values; a trial is feasible when all are <= 0.

    Failed trials are *infeasible*, not Optuna FAIL: samplers ignore FAIL trials and keep
    proposing the same region, while infeasible trials steer them away.
    """
    return {"status": 0.0 if m.ok else 1.0}
