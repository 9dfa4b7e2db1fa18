"""The planned run: how long the real training run is (``trial.planned_steps``,
``planned_samples`` or ``planned_tokens``), what an hour of the machine costs
(``trial.cost_per_hour``) and a kWh (``trial.energy_price_per_kwh``), and what the run
takes, in time and energy, with the baseline and with the recommendation.

The planned length is also what the objective amortises compile time over
(:func:`autotune.study.scoring.rate_objective`), through :meth:`Plan.steps`: one rule for
the study and for the projection. A value module: neither torch nor optuna.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .measurement import TOKENS

if TYPE_CHECKING:
    from .measurement import Measurement
    from .space import TrialSettings

PLANNED_KEYS = ("planned_steps", "planned_samples", "planned_tokens")
J_PER_KWH = 3.6e6


@dataclass(frozen=True)
class Plan:
    """The planned run.

    Attributes:
        key: the space-file key that gave its length (one of :data:`PLANNED_KEYS`).
        length: optimizer steps, samples or real (non-padding) tokens.
        cost_per_hour: what an hour of the machine costs, any currency; ``None``: no cost.
        energy_price_per_kwh: what a kWh costs, any currency; ``None``: no energy cost.
    """

    key: str
    length: int
    cost_per_hour: float | None = None
    energy_price_per_kwh: float | None = None

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
                return cls(key, length, trial.cost_per_hour, trial.energy_price_per_kwh)
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
    figure the summary prints), so the two times stand in the ratio of the speedup. A
    study whose objective is energy prints an energy ratio, not a speedup: its
    ``recommended_s`` is the recommendation's own cold compile plus the same work at its
    own steady rate (``own_rate``).

    ``baseline_kwh`` and ``recommended_kwh``: the training device's energy over the same
    work (the baseline's planned units) at each config's joules per unit (their
    aggregated figures: the medians over their runs); steady-state steps only, as the
    compile's energy is not measured. ``None`` where a side's energy was not measured,
    and ``energy_missing`` says why: no figure is invented.
    """

    plan: Plan
    baseline_s: float
    recommended_s: float
    same: bool = False  # the recommendation is the baseline
    baseline_kwh: float | None = None
    recommended_kwh: float | None = None
    energy_missing: str = ""
    own_rate: bool = False  # recommended_s from its own figures (the energy objective)

    @property
    def saved_s(self) -> float:
        return self.baseline_s - self.recommended_s

    @property
    def saved_kwh(self) -> float | None:
        if self.baseline_kwh is None or self.recommended_kwh is None:
            return None
        return self.baseline_kwh - self.recommended_kwh

    def energy_cost(self, kwh: float) -> float | None:
        """What ``kwh`` cost; ``None`` without ``energy_price_per_kwh``."""
        price = self.plan.energy_price_per_kwh
        return None if price is None else kwh * price

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
        out.update(self._energy_dict())
        if self.same:
            out["recommended_is_baseline"] = True
        out["how"] = HOW_OWN_RATE if self.own_rate else HOW
        return out

    def _energy_dict(self) -> dict[str, Any]:
        price = self.plan.energy_price_per_kwh
        out: dict[str, Any] = {} if price is None else {"energy_price_per_kwh": price}
        if self.baseline_kwh is None or self.recommended_kwh is None:
            if self.energy_missing:
                out["energy_missing"] = self.energy_missing
            return out
        for name, kwh in (
            ("baseline", self.baseline_kwh),
            ("recommended", self.recommended_kwh),
            ("saved", self.saved_kwh),
        ):
            out[f"{name}_kwh"] = round(kwh, 3)
            if price is not None:
                out[f"{name}_energy_cost"] = round(self.energy_cost(kwh), 2)
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Projection:
        """The inverse of :meth:`to_dict` (an exported config's header reads it)."""
        plan = Plan(
            f"planned_{d['unit']}",
            d["length"],
            d.get("cost_per_hour"),
            d.get("energy_price_per_kwh"),
        )
        same = bool(d.get("recommended_is_baseline"))
        return cls(
            plan,
            d["baseline_s"],
            d["recommended_s"],
            same,
            d.get("baseline_kwh"),
            d.get("recommended_kwh"),
            d.get("energy_missing", ""),
            d.get("how") == HOW_OWN_RATE,
        )

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

    @property
    def energy_label(self) -> str:
        """``planned run's energy (training device, steady-state steps) at 0.30 a kWh``."""
        price = self.plan.energy_price_per_kwh
        return "planned run's energy (training device, steady-state steps)" + (
            "" if price is None else f" at {price:,.2f} a kWh"
        )

    def energy_text(self) -> str:
        """``baseline 12.3 kWh (3.69), recommended 5.1 kWh (1.53): saves 7.2 kWh, 2.16``,
        or why it is not projected: ``not projected: ...``."""
        base, rec = self.baseline_kwh, self.recommended_kwh
        if base is None or rec is None:
            return f"not projected: {self.energy_missing or 'no energy measured'}"
        sides = f"{self._kwh('baseline', base)}, {self._kwh('recommended', rec)}"
        if self.same:
            return f"{self._kwh('baseline', base)}; the recommendation is the baseline"
        saved = base - rec
        tail = f"{'saves' if saved >= 0 else 'takes more by'} {kwh_text(abs(saved))}"
        cost = self.energy_cost(abs(saved))
        return f"{sides}: {tail}" + ("" if cost is None else f", {cost:,.2f}")

    def _kwh(self, label: str, kwh: float) -> str:
        cost = self.energy_cost(kwh)
        return f"{label} {kwh_text(kwh)}" + ("" if cost is None else f" ({cost:,.2f})")


HOW = (
    "baseline: cold-cache compile + planned length / steady rate (its aggregated figures); "
    "recommended: baseline / speedup; cost: hours x cost_per_hour; energy: the baseline's "
    "planned units x each config's joules per unit (steady state: compile not measured); "
    "energy cost: kWh x energy_price_per_kwh"
)
# The energy objective: its ratio is not a time's, so the recommended time is its own.
HOW_OWN_RATE = HOW.replace(
    "recommended: baseline / speedup",
    "recommended: its cold-cache compile + the baseline's planned units / its steady rate",
)


def kwh_text(kwh: float) -> str:
    """``12.3 kWh``, ``0.042 kWh``, ``1,234 kWh`` (three significant digits, at least)."""
    return f"{kwh:,.0f} kWh" if kwh >= 1000 else f"{kwh:.3g} kWh"


def planned_units(plan: Plan, m: Measurement) -> float | None:
    """The planned run in units of the objective (samples, or real tokens) with ``m``'s
    step size; ``None`` when the count the length is given in is unknown."""
    steps = plan.steps(m.samples_per_step, m.tokens_per_step)
    return steps * m.per_step if steps and m.per_step else None


def joules_per_unit(m: Measurement) -> float | None:
    """``m``'s energy per unit of the objective: per real token (token workloads) or
    per sample; ``None`` where not measured."""
    return m.joules_per_token if m.unit == TOKENS else m.joules_per_sample


def project(
    plan: Plan | None,
    baseline: Measurement | None,
    speedup: float | None,
    same: bool = False,
    recommended: Measurement | None = None,
) -> Projection | None:
    """The planned run with the baseline and the recommendation, or ``None`` without a
    plan, a baseline rate or a time for the recommendation.

    Args:
        plan: the planned run.
        baseline: the baseline's measurement as the speedup aggregates it (after
            confirmation, the medians over the paired rounds; ``compile_s`` stays the
            cold-cache figure of its first compile, charged even when repeats hit a warm
            cache, as the objective does).
        speedup: the recommendation over the baseline in time (:attr:`TuneResult.speedup`
            of a throughput study); ``None``: the recommended time from ``recommended``'s
            own figures (a study whose objective is energy prints an energy ratio).
        same: the recommendation is the baseline.
        recommended: the recommendation's aggregated measurement: its energy per unit,
            and its rate where ``speedup`` is ``None``.
    """
    if plan is None or baseline is None or not (speedup or recommended):
        return None
    rate, units = baseline.rate, planned_units(plan, baseline)
    if not (rate and units):
        return None
    baseline_s = (baseline.compile_s or 0.0) + units / rate
    rec = baseline if same else recommended
    if same:
        recommended_s = baseline_s
    elif speedup:
        recommended_s = baseline_s / speedup
    elif rec is not None and rec.rate:
        recommended_s = (rec.compile_s or 0.0) + units / rec.rate
    else:
        return None
    kwh, missing = {}, ""
    for side, m in (("baseline", baseline), ("recommendation", rec)):
        joules = joules_per_unit(m) if m is not None else None
        if joules is None:
            missing = missing or f"the {side}'s energy was not measured"
        kwh[side] = None if joules is None else units * joules / J_PER_KWH
    return Projection(
        plan,
        baseline_s,
        recommended_s,
        same,
        kwh["baseline"],
        kwh["recommendation"],
        missing,
        own_rate=not same and not speedup,
    )


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
