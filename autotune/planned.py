"""The planned run: how long the real training run is (``trial.planned_steps``,
``planned_samples`` or ``planned_tokens``), what an hour of the machine costs
(``trial.cost_per_hour``), and what the run takes with the baseline and with the
recommendation.

The planned length is also what the objective amortises compile time over
(:func:`autotune.study.scoring.rate_objective`), through :meth:`Plan.steps`: one rule for
the study and for the projection. A value module: neither torch nor optuna.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .measurement import Measurement
    from .space import TrialSettings

PLANNED_KEYS = ("planned_steps", "planned_samples", "planned_tokens")


@dataclass(frozen=True)
class Plan:
    """The planned run.

    Attributes:
        key: the space-file key that gave its length (one of :data:`PLANNED_KEYS`).
        length: optimizer steps, samples or real (non-padding) tokens.
        cost_per_hour: what an hour of the machine costs, any currency; ``None``: no cost.
    """

    key: str
    length: int
    cost_per_hour: float | None = None

    @property
    def unit(self) -> str:
        """``steps``, ``samples`` or ``tokens``."""
        return self.key.removeprefix("planned_")

    @classmethod
    def of(cls, trial: TrialSettings) -> Plan | None:
        """The plan of a space's trial settings; ``None`` without a planned length (a cost
        alone projects nothing)."""
        for key in PLANNED_KEYS:
            length = getattr(trial, key)
            if length is not None:
                return cls(key, length, trial.cost_per_hour)
        return None

    def steps(
        self, samples_per_step: float | None, tokens_per_step: float | None = None
    ) -> float | None:
        """The planned run in optimizer steps of a config that takes ``samples_per_step``
        samples and ``tokens_per_step`` real tokens a step; ``None`` when the count the
        length is given in is unknown."""
        if self.unit == "steps":
            return float(self.length)
        count = samples_per_step if self.unit == "samples" else tokens_per_step
        return self.length / count if count else None

    def text(self) -> str:
        """``100,000 steps``."""
        return f"{self.length:,} {self.unit}"


@dataclass(frozen=True)
class Projection:
    """The planned run with the baseline and with the recommendation.

    ``baseline_s`` is the baseline's cold-cache compile time plus the planned length at
    its steady rate; ``recommended_s`` is ``baseline_s`` divided by the speedup (the
    figure the summary prints), so the two times stand in the ratio of the speedup.
    """

    plan: Plan
    baseline_s: float
    recommended_s: float
    same: bool = False  # the recommendation is the baseline

    @property
    def saved_s(self) -> float:
        return self.baseline_s - self.recommended_s

    def cost(self, seconds: float) -> float | None:
        """What ``seconds`` of the machine cost; ``None`` without ``cost_per_hour``."""
        if self.plan.cost_per_hour is None:
            return None
        return seconds / 3600 * self.plan.cost_per_hour

    def to_dict(self) -> dict[str, Any]:
        """Plain data (``best_config.yaml``'s ``planned_run``, ``report.json``)."""
        out: dict[str, Any] = {
            "length": self.plan.length,
            "unit": self.plan.unit,
            "baseline_s": round(self.baseline_s, 1),
            "recommended_s": round(self.recommended_s, 1),
            "saved_s": round(self.saved_s, 1),
        }
        if self.plan.cost_per_hour is not None:
            out["cost_per_hour"] = self.plan.cost_per_hour
            for name, seconds in (
                ("baseline", self.baseline_s),
                ("recommended", self.recommended_s),
                ("saved", self.saved_s),
            ):
                out[f"{name}_cost"] = round(self.cost(seconds), 2)
        if self.same:
            out["recommended_is_baseline"] = True
        out["how"] = HOW
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Projection:
        """The inverse of :meth:`to_dict` (an exported config's header reads it)."""
        plan = Plan(f"planned_{d['unit']}", d["length"], d.get("cost_per_hour"))
        same = bool(d.get("recommended_is_baseline"))
        return cls(plan, d["baseline_s"], d["recommended_s"], same)

    @property
    def label(self) -> str:
        """``planned run of 100,000 steps at 11.84 an hour``."""
        cost = self.plan.cost_per_hour
        return f"planned run of {self.plan.text()}" + (
            "" if cost is None else f" at {cost:,.2f} an hour"
        )

    def text(self) -> str:
        """``baseline 12 h 30 min (148.00), recommended 6 h 20 min (75.00): saves 6 h 10
        min, 73.00``."""
        if self.same:
            return (
                f"{self._side('baseline', self.baseline_s)}; the recommendation is the "
                "baseline: saves nothing (0 s)"
            )
        saved = self.saved_s
        verb = "saves" if saved >= 0 else "takes longer by"
        tail = f"{verb} {duration_text(abs(saved))}"
        if self.plan.cost_per_hour is not None:
            tail += f", {abs(self.cost(saved)):,.2f}"
        return (
            f"{self._side('baseline', self.baseline_s)}, "
            f"{self._side('recommended', self.recommended_s)}: {tail}"
        )

    def _side(self, label: str, seconds: float) -> str:
        cost = self.cost(seconds)
        return f"{label} {duration_text(seconds)}" + ("" if cost is None else f" ({cost:,.2f})")


HOW = (
    "baseline: cold-cache compile + planned length / steady rate (its aggregated figures); "
    "recommended: baseline / speedup; cost: hours x cost_per_hour"
)


def project(
    plan: Plan | None, baseline: Measurement | None, speedup: float | None, same: bool = False
) -> Projection | None:
    """The planned run with the baseline and the recommendation, or ``None`` without a
    plan, a baseline rate or a speedup.

    Args:
        plan: the planned run.
        baseline: the baseline's measurement as the speedup aggregates it (after
            confirmation, the medians over the paired rounds; ``compile_s`` stays the
            cold-cache figure of its first compile, charged even when repeats hit a warm
            cache, as the objective does).
        speedup: the recommendation over the baseline (:attr:`TuneResult.speedup`).
        same: the recommendation is the baseline.
    """
    if plan is None or baseline is None or not speedup:
        return None
    rate, per_step = baseline.rate, baseline.per_step
    steps = plan.steps(baseline.samples_per_step, baseline.tokens_per_step)
    if not (rate and per_step and steps):
        return None
    baseline_s = (baseline.compile_s or 0.0) + steps * per_step / rate
    recommended_s = baseline_s if same else baseline_s / speedup
    return Projection(plan, baseline_s, recommended_s, same)


def duration_text(seconds: float) -> str:
    """A duration for a person: ``4.2 s``, ``42 s``, ``3 min 5 s``, ``6 h 10 min``,
    ``2 d 3 h`` (each rounded to its smaller unit)."""
    if seconds < 0:
        return "-" + duration_text(-seconds)
    if seconds < 9.95:
        return f"{seconds:.1f} s"
    if round(seconds) < 60:
        return f"{round(seconds)} s"
    if round(seconds) < 3600:
        minutes, secs = divmod(round(seconds), 60)
        return f"{minutes} min {secs} s"
    if round(seconds / 60) < 24 * 60:
        hours, minutes = divmod(round(seconds / 60), 60)
        return f"{hours} h {minutes} min"
    days, hours = divmod(round(seconds / 3600), 24)
    return f"{days} d {hours} h"
