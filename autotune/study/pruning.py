"""Stop a trial early once its first measured steps show it cannot win.

The trial process reports progress (steps done, time taken) during its measured window;
warm-up and compile are never judged, so compiled configs are not pruned for compiling.
A run that compiled is stopped only below :data:`~autotune.study.screening.FAR_BELOW` of
the best (:meth:`Pruner.margin_for`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from ..measurement import PRUNED, TOKENS, Measurement, compile_estimate_s
from ..space import SearchSettings, TrialSettings
from ..trial_spec import window_steps
from .scoring import rate_objective
from .screening import FAR_BELOW


class Pruner:
    """``stop_early`` callback for :func:`autotune.study.runner.run_child`.

    Args:
        progress_path: where the trial process writes its progress.
        best_value: the objective of the best feasible trial so far.
        trial: the trial settings (measured steps, planned steps).
        search: margin and how much of the window to see before judging.
    """

    def __init__(
        self, progress_path: Path, best_value: float, trial: TrialSettings, search: SearchSettings
    ) -> None:
        self.path = progress_path
        self.best_value = best_value
        self.trial = trial
        self.margin = search.prune_margin
        self.prune_after = search.prune_after
        self.min_steps = max(2, math.ceil(search.prune_after * trial.measured_steps))
        self.last: dict[str, Any] | None = None

    @staticmethod
    def _per_step(p: dict[str, Any]) -> float:
        """Units (samples, or real tokens) per step so far; older trial code wrote samples."""
        return p.get("per_step") or p["samples_per_step"]

    def _estimate(self, p: dict[str, Any]) -> tuple[float, float]:
        rate = p["steps"] * self._per_step(p) / p["elapsed_s"]
        step_s = self._per_step(p) / rate
        if p.get("compile_s") is not None:  # torch's counters (0 for an eager config)
            return rate, p["compile_s"]
        warmup_steps = p.get("warmup_steps", self.trial.warmup_steps)  # the steps it ran
        return rate, compile_estimate_s(p["warmup_s"], warmup_steps, step_s)

    def _window_steps(self, p: dict[str, Any], step_s: float) -> int:
        """The steps the trial's window will take at its pace so far: ``measured_steps``,
        or more to cover its ``min_window_s`` (the trial's rule, :func:`window_steps`)."""
        min_s = p.get("min_window_s", 0.0)
        return max(p["steps"], window_steps(self.trial.measured_steps, min_s, step_s))

    def margin_for(self, compile_s: float | None) -> float:
        """How far behind the best a run may be before it is stopped: the search's
        margin; for a run whose warm-up compiled (``compile_s`` > 0), the gap of a run
        under :data:`FAR_BELOW` of the best (compile rarely doubles a step's throughput).

        Stopping a compiled run saves the rest of its window, a second or two, after a
        compile of 10-45 s already paid; and a slow spell in those first steps loses the
        largest lever after precision. On cpu.yaml (2026-12-06 17:37 UTC, study 4) both of
        the screening's compiled runs were stopped at ~1,714 samples/s, 24% behind the
        best (a 20% margin); the study recommended an eager config that the head-to-head
        then put 15% behind the compiled one."""
        if compile_s:
            return max(self.margin, 1 / FAR_BELOW - 1)
        return self.margin

    def __call__(self) -> str | None:
        try:
            p = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None
        if p.get("steps", 0) < self.min_steps or p.get("elapsed_s", 0) <= 0:
            return None
        if p["elapsed_s"] < self.prune_after * p.get("min_window_s", 0.0):
            return None  # judged after the same share of a window long in time as in steps
        rate, compile_s = self._estimate(p)
        value = rate_objective(
            rate,
            compile_s,
            self._per_step(p),
            self.trial,
            samples_per_step=p["samples_per_step"],
            tokens_per_step=self._per_step(p) if p.get("unit") == TOKENS else None,
        )
        margin = self.margin_for(p.get("compile_s"))
        if value * (1 + margin) >= self.best_value:
            return None
        self.last = p
        unit = p.get("unit", "samples")
        planned = self._window_steps(p, self._per_step(p) / rate)
        return (
            f"pruned after {p['steps']}/{planned} measured steps: "
            f"~{value:,.1f} {unit}/s cannot beat the best {self.best_value:,.1f} "
            f"by {margin:.0%}"
        )

    def measurement(self, reason: str, wall_s: float | None) -> Measurement:
        """The partial measurement of a pruned trial, and the time pruning saved."""
        p = self.last
        assert p is not None
        rate, compile_s = self._estimate(p)
        step_s = self._per_step(p) / rate
        tokens = p.get("unit") == TOKENS
        return Measurement(
            status=PRUNED,
            reason=reason,
            samples_per_s=p["steps"] * p["samples_per_step"] / p["elapsed_s"],
            tokens_per_s=rate if tokens else None,
            samples_per_step=p["samples_per_step"],
            tokens_per_step=self._per_step(p) if tokens else None,
            unit=p.get("unit", "samples"),
            measured_steps=p["steps"],
            window_s=p["elapsed_s"],
            warmup_s=p["warmup_s"],
            compile_s=compile_s or None,  # eager: none
            wall_s=wall_s,
            pruned_saved_s=(self._window_steps(p, step_s) - p["steps"]) * step_s,
        )
