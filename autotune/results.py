"""Finished trials as values: what each measured, how it was judged, what won and by how much.

:func:`recommendation` and :func:`write_best_config` serialise a result as
``best_config.yaml``, so the study writes it without knowing the output layer.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from .config import Config
from .credentials import redact_url
from .decisions import UNRESOLVED, Decision, margin, noise_floor, paired_floor
from .measurement import OK, PRUNED, Measurement, fixed_cost
from .mfu import Mfu, mfu_of, shown, unavailable
from .planned import Plan, Projection, project
from .space import ENERGY, THROUGHPUT

# Roles of a trial: the baseline (trial 0), a config the search measured, a proposal of a
# config measured before (not run again), a run of a measured config in a confirmation
# round, and a config first measured in a confirmation round (an ablation of the winner,
# or the winner reduced to the knobs that matter).
BASELINE, SEARCH, DUPLICATE, REPEAT = "baseline", "search", "duplicate", "repeat"
# The trial user attr of a screening trial: its move, "knob=value" (study/screening.py).
MOVE = "screen"
CONFIRM = "confirm"
FREE_BATCH_WARNING = "global batch was free: convergence may differ from the baseline"
# The default of search.min_gain: a knob of the winner is kept only if its paired
# per-round gains prove more than this, or than the study's noise floor if that is larger
# (see proven_gain); the reduced config is taken unless the winner proves such a gain
# over it.
MIN_GAIN = 0.03


@dataclass(frozen=True)
class TrialRecord:
    """One measured config: what it measured, the verdict and the objective value.

    After confirmation, a config measured in paired rounds (``round`` is set on each of
    its runs) has ``value`` and the rates of ``measurement`` as medians over those rounds
    (``runs`` of them; its search run, measured at another time, is not in them),
    ``spread`` their relative range and ``ratios`` its per-round ratios to the baseline
    run of the same round. ``compile_s`` stays the cold figure of the config's first
    compile; ``compile_warm_s`` is the median over its warm-cache runs. A config is
    feasible only if every run was.
    """

    number: int
    config: Config
    measurement: Measurement
    value: float
    role: str = SEARCH
    status: str = OK
    reason: str = ""
    duplicate_of: int | None = None
    loss_deviation: float | None = None
    repeat_of: int | None = None
    runs: int = 1
    spread: float | None = None
    round: int | None = None  # the paired confirmation round of this run
    ratios: tuple[float, ...] = ()  # per round: this config's value / the baseline's
    compile_warm_s: float | None = None
    move: str | None = None  # a screening trial's move ("knob=value")
    # The runs of a config measured several times whose window throttled (trial
    # numbers), of the runs its figures are the medians of; None: a single run.
    throttled_runs: tuple[int, ...] | None = None
    # A screening move's paired second look (autotune.study.screening.second_look): the
    # best so far runs once more (``look_for``: the move's first trial), then the move
    # (``paired_with``: that run of the best). A summary's ``standing`` is the move's
    # level read from those pairs (:func:`summarize`); None: no paired look.
    look_for: int | None = None
    paired_with: int | None = None
    standing: float | None = None
    # A confirmation round's second run of the baseline, the baseline against itself
    # (:func:`twin_ratios`): read for the study's paired noise floor only, never for a
    # figure of the baseline (its run of the round is the other one).
    twin: bool = False

    @property
    def feasible(self) -> bool:
        return self.status == OK

    @property
    def throttled_numbers(self) -> tuple[int, ...]:
        """The runs behind this record's figures whose window throttled (this run's own
        number for a single throttled run)."""
        if self.throttled_runs is not None:
            return self.throttled_runs
        return (self.number,) if self.measurement.throttled else ()

    @property
    def rank(self) -> float:
        """What the search ranks this config by (:func:`ranked`): its :attr:`standing`
        when a paired look measured it against the best, else its value."""
        return self.standing if self.standing is not None else self.value

    @property
    def ratio(self) -> float | None:
        """The median of the per-round paired ratios to the baseline, if measured."""
        return statistics.median(self.ratios) if self.ratios else None

    @property
    def ratio_range(self) -> tuple[float, float] | None:
        return (min(self.ratios), max(self.ratios)) if self.ratios else None


def _half_range(ratios: tuple[float, ...]) -> float:
    return (max(ratios) - min(ratios)) / 2 if ratios else 0.0


@dataclass(frozen=True)
class Contribution:
    """What one knob of the winner is worth: the winner against the winner with that knob
    back at the baseline's value, run in the same paired rounds.

    ``ratios`` holds, per round, the winner's value over the ablated config's (above 1:
    the knob helps). ``failed`` is the reason the ablated config was infeasible (the knob
    is then needed). The knob is ``kept`` when the ratios keep its gain
    (:attr:`autotune.decisions.Decision.stands`: the sign test's interval on their median
    lies above ``1 + min_gain``, the study's margin, its noise floor at least
    ``search.min_gain``; or it is unresolved there when the rounds ran out, with the
    interval wholly above ``1 + least_gain``, ``search.min_gain``), when it is needed, or
    when it was not measured; otherwise it is dropped: within noise, or unresolved with an
    interval that reaches ``1 + least_gain`` (the simpler config then wins).

    An interval, not the median alone: a median over 3 rounds kept a knob whose rounds
    spanned 0.95-1.21x, and dropped it in the next study. The sign test's, so that one
    disturbed round cannot decide either way (requiring every round above the bar at any
    count dropped a real 8x knob for one round a busy machine turned to 0.77x): from 6
    rounds on, one may fall below. Rounds are added while a decision is unresolved
    (:mod:`autotune.study.confirm`).
    """

    knob: str
    winner_value: Any
    baseline_value: Any
    ratios: tuple[float, ...]
    trial: int | None = None  # the ablated config's trial
    failed: str = ""
    min_gain: float = MIN_GAIN  # the study's margin: its noise floor, at least search.min_gain
    least_gain: float = MIN_GAIN  # search.min_gain

    @property
    def median(self) -> float | None:
        return statistics.median(self.ratios) if self.ratios else None

    @property
    def kept(self) -> bool:
        if self.failed or not self.ratios:  # needed, or not measured: not proven neutral
            return True
        return self.decision.stands

    @property
    def decision(self) -> Decision:
        return Decision(self.ratios, 1 + self.min_gain, 1 + self.least_gain)

    @property
    def unresolved(self) -> bool:
        """The rounds ran out before its interval left the margin: kept if the interval
        lies above ``1 + least_gain``, else dropped (not proven within noise either)."""
        return not self.failed and bool(self.ratios) and self.decision.state == UNRESOLVED

    def to_dict(self) -> dict[str, Any]:
        return {
            "knob": self.knob,
            "winner_value": self.winner_value,
            "baseline_value": self.baseline_value,
            "trial": self.trial,
            "median_ratio": None if self.median is None else round(self.median, 4),
            "ratio_range": [round(min(self.ratios), 4), round(max(self.ratios), 4)]
            if self.ratios
            else None,
            "rounds": len(self.ratios),
            "min_gain": self.min_gain,
            "least_gain": self.least_gain,
            "decision": self.decision.to_dict() if self.ratios else None,
            "kept": self.kept,
            "failed": self.failed or None,
        }


@dataclass(frozen=True)
class KnobCost:
    """The search trials that moved one knob from the baseline, and what they cost."""

    knob: str
    trials: int = 0
    run_s: float = 0.0  # spawn to exit, compile included
    compile_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "knob": self.knob,
            "trials": self.trials,
            "run_s": round(self.run_s, 2),
            "compile_s": round(self.compile_s, 2),
        }


@dataclass(frozen=True)
class Reduction:
    """The winner with its neutral knobs (``knobs``) back at the baseline's values,
    measured in paired rounds with the winner: ``ratios`` per round, reduced over winner.
    ``accepted`` when it is within noise of the winner: the winner does not prove a gain
    over it (the rule that keeps a knob, :attr:`Contribution.kept`, so for one dropped knob,
    whose ablation is the reduced config, the two always agree). It is then the
    recommendation. Several dropped knobs are measured together in rounds of their own:
    if together they are worth more than the noise, the rounds show it and the winner
    is kept."""

    knobs: tuple[str, ...]
    record: TrialRecord | None
    ratios: tuple[float, ...]
    min_gain: float = MIN_GAIN  # the study's margin: its noise floor, at least search.min_gain
    least_gain: float = MIN_GAIN  # search.min_gain

    @property
    def median(self) -> float | None:
        return statistics.median(self.ratios) if self.ratios else None

    @property
    def decision(self) -> Decision:
        """The winner against the reduced config, per round: its gain stands (proven
        faster by more than the margin, or unresolved there with its interval above
        ``1 + least_gain``: the winner is kept), or not (the reduced config, the
        simpler, is taken)."""
        return Decision(
            tuple(1 / r for r in self.ratios if r), 1 + self.min_gain, 1 + self.least_gain
        )

    @property
    def accepted(self) -> bool:
        if self.record is None or not self.record.feasible or not self.ratios:
            return False
        # The mirror of a knob's test: rejected when the winner's gain over it stands.
        return not self.decision.stands


@dataclass(frozen=True)
class TuneResult:
    """The outcome of a study: every measured config, the baseline, the recommended config.

    ``storage`` is the study's storage URL with its password redacted
    (:func:`autotune.credentials.redact_url`), whatever URL it was made with: it is shown
    and written (``best_config.yaml``, ``report.json``, HTML, exports), never reopened.
    """

    study_name: str
    storage: str
    trials: list[TrialRecord]
    baseline: TrialRecord | None
    best: TrialRecord | None
    environment: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    best_config_path: Path | None = None
    memory_budget_bytes: int | None = None
    global_batch: int | None = None
    runner_up: TrialRecord | None = None
    winner: TrialRecord | None = None  # the fastest config, before dropping neutral knobs
    contributions: list[Contribution] = field(default_factory=list)
    reduction: Reduction | None = None
    plan: Plan | None = None  # the planned run (trial.planned_*, cost_per_hour)
    # The screening start's schedule as the study keeps it (autotune.study.screening):
    # "order" (move labels), "reasons", "profile"; None for a study without one.
    screening: dict[str, Any] | None = None
    # Per knob, the search runs that moved it and what they cost (:func:`knob_costs`).
    knob_time: list[KnobCost] = field(default_factory=list)
    # How far the baseline moved against itself, and the gain every decision must prove:
    # the floor, at least search.min_gain. The floor is paired (decisions.paired_floor)
    # when ``noise_rounds`` rounds ran the baseline's twin, else back to back
    # (decisions.noise_floor), which ``search_floor`` always is: the search's margins.
    noise_floor: float | None = None
    noise_rounds: int = 0
    search_floor: float | None = None
    margin: float = MIN_GAIN
    least_gain: float = MIN_GAIN  # search.min_gain: what a gain unresolved at the margin must prove
    # Per round both ran in: the winner's value over the runner-up's.
    lead_ratios: tuple[float, ...] = ()
    # The search runs pruning stopped, read from the runs (a config pruned in the search
    # and then measured in the rounds is feasible in ``trials``, yet it was stopped):
    # how many, and the measured seconds saved. None: read from ``trials``.
    pruned_runs: tuple[int, float] | None = None
    # What the values are (trial.objective): "throughput" (units/s) or "energy" (units/J).
    objective: str = THROUGHPUT

    def __post_init__(self) -> None:
        object.__setattr__(self, "storage", redact_url(self.storage))

    @classmethod
    def from_trials(
        cls,
        study_name: str,
        storage: str,
        trials: list[TrialRecord],
        confirmation: dict[str, Any] | None = None,
        min_gain: float = MIN_GAIN,
        **kwargs: Any,
    ) -> TuneResult:
        """Summarise raw trial records: baseline, winner, runner-up, each knob's
        contribution and the recommendation.

        ``confirmation`` is the study's record of its confirmation (the ``confirmation``
        user attr, see :mod:`autotune.study.confirm`): the finalists, and per winner the
        config keys of its ablations and of its reduced config. With it, the winner is
        the config measured in the rounds (a finalist, an ablation or the baseline) with
        the highest median paired ratio, and the recommendation is the reduced config when
        that is within noise of the winner; a winner the confirmation pinned
        (``pins["final"]``) stays the winner. Without it, configs rank by their (median)
        value. ``min_gain``: ``search.min_gain``, the least gain a knob must prove to stay;
        the study's noise floor (:func:`baseline_floor`) raises it.
        """
        raw = trials
        trials = summarize(raw)
        baseline = next((t for t in trials if t.role == BASELINE), None)
        searched = baseline_floor(raw)
        twins = twin_ratios(raw)
        paired = paired_floor(twins)
        floor = paired if paired is not None else searched
        least, min_gain = min_gain, margin(min_gain, floor)
        conf = confirmation or {}
        by_number = {t.number: t for t in trials}
        finalists = [by_number[n] for n in conf.get("finalists", []) if n in by_number]
        if finalists:  # every config measured in the rounds may win, ablations included
            confirmed = [t for t in trials if t.ratios]
            pool = {
                t.number: t
                for t in [*finalists, *confirmed, baseline]
                if t is not None and t.feasible
            }
            paired = [t for t in pool.values() if t.ratio is not None]
            if paired:  # a finalist the rounds never reached (cut short) cannot win
                top = sorted(paired, key=lambda t: t.ratio, reverse=True)
            else:  # no feasible baseline run to pair with: by the medians of the rounds
                top = sorted(pool.values(), key=lambda t: t.value, reverse=True)
            # The winner the confirmation settled on before its last rounds (the
            # reduced config's), which add runs of the winner and move its median.
            final = pool.get(conf.get("pins", {}).get("final"))
            if final is not None:
                top = [final, *(t for t in top if t is not final)]
        else:
            top = ranked(trials)
        winner = top[0] if top else None
        contributions: list[Contribution] = []
        reduction = None
        if winner is not None and baseline is not None:
            contributions = _contributions(raw, trials, winner, baseline, conf, min_gain, least)
            reduction = _reduction(raw, trials, winner, conf, min_gain, least)
        best = reduction.record if reduction is not None and reduction.accepted else winner
        runner_up = top[1] if len(top) > 1 else None
        lead = _paired_ratios(raw, winner, runner_up) if winner and runner_up else ()
        return cls(
            study_name=study_name,
            storage=storage,
            trials=trials,
            baseline=baseline,
            best=best,
            runner_up=runner_up,
            winner=winner,
            contributions=contributions,
            reduction=reduction,
            knob_time=knob_costs(raw),
            pruned_runs=_pruned(raw),
            noise_floor=floor,
            noise_rounds=len(twins) if paired is not None else 0,
            search_floor=searched,
            margin=min_gain,
            least_gain=least,
            lead_ratios=lead,
            **kwargs,
        )

    @property
    def unit(self) -> str:
        """What the objective counts: ``tokens`` (real tokens, token workloads) or ``samples``."""
        units = {t.measurement.unit for t in self.trials if t.measurement.rate}
        return "tokens" if "tokens" in units else "samples"

    @property
    def objective_unit(self) -> str:
        """The values' unit: ``samples/s`` (``tokens/s``), or ``samples/J`` for a study
        whose objective is energy."""
        return f"{self.unit}/{'J' if self.objective == ENERGY else 's'}"

    def mfu(self, record: TrialRecord | None) -> Mfu | None:
        """A config's MFU (:func:`autotune.mfu.mfu_of`: the one computation behind every
        view), from its (aggregated) measurement and the study's probe figures."""
        if record is None:
            return None
        return mfu_of(record.measurement, record.config, self.environment)

    @property
    def mfu_shown(self) -> bool:
        """Whether views show MFU (the study's probe counted, or tried to count, FLOPs)."""
        return shown(self.environment)

    @property
    def memory_label(self) -> str:
        """``peak mem``, or ``peak mem per rank`` where some trial ran several processes
        (the memory judged is then the largest of the ranks' peaks)."""
        sharded = any(t.config.world_size > 1 for t in self.trials)
        return "peak mem per rank" if sharded else "peak mem"

    @property
    def speedup(self) -> float | None:
        """The recommended config against the baseline: the median of their per-round
        paired ratios when both ran in confirmation rounds, else the ratio of their
        values; ``None`` when either is missing."""
        return self.vs_baseline(self.best)

    def vs_baseline(self, record: TrialRecord | None) -> float | None:
        """A config's speedup over the baseline (see :attr:`speedup`), ``None`` when it
        or the baseline did not run cleanly."""
        base = self.baseline
        if not (record and record.feasible and base and base.feasible and base.value):
            return None
        if record.ratio is not None:
            return record.ratio
        return record.value / base.value

    @property
    def projection(self) -> Projection | None:
        """The planned run with the baseline and with the recommendation, from the
        baseline's aggregated figures and :attr:`speedup` (:func:`autotune.planned.project`);
        ``None`` without a planned length or a speedup."""
        best, base = self.best, self.baseline
        if best is None or base is None or self.speedup is None:
            return None
        same = best.number == base.number
        # An energy study's ratio is not a time's: the recommended time is its own.
        speedup = None if self.objective == ENERGY else self.speedup
        return project(self.plan, base.measurement, speedup, same, best.measurement)

    @property
    def headroom_bytes(self) -> int | None:
        """Memory budget left unused by the recommended config."""
        peak = self.best.measurement.judged_mem_bytes if self.best else None
        if peak is None or self.memory_budget_bytes is None:
            return None
        return self.memory_budget_bytes - peak

    @property
    def _paired(self) -> bool:
        return bool(self.winner and self.runner_up and self.winner.ratios and self.runner_up.ratios)

    @property
    def lead(self) -> float | None:
        """How much faster the winner is than the runner-up (0.05 = 5%): by their median
        paired ratios when both were confirmed, else by their values."""
        win, up = self.winner, self.runner_up
        if self._paired:
            return win.ratio / up.ratio - 1
        if not (win and up and up.value):
            return None
        return win.value / up.value - 1

    @property
    def noise(self) -> float | None:
        """The relative measurement noise of the top two: half the range of their paired
        ratios when confirmed, else their repeat spread or step CV."""
        tops = [t for t in (self.winner, self.runner_up) if t is not None]
        if not tops:
            return None
        if self._paired:
            return max(_half_range(t.ratios) / t.ratio for t in tops)
        return max(
            t.spread if t.spread is not None else (t.measurement.step_time_cv or 0.0) for t in tops
        )

    @property
    def lead_decision(self) -> Decision | None:
        """The winner against the runner-up in the rounds both ran in: proven ahead by
        more than :attr:`margin`, within noise, or unresolved (and then standing where
        its interval lies above ``1 + least_gain``: a lead, not a tie)."""
        return self._lead(self.lead_ratios)

    def lead_over(self, trials: list[TrialRecord], other: TrialRecord) -> Decision | None:
        """The winner against ``other`` (the runner-up or another finalist) in the rounds
        both ran in, read as :attr:`lead_decision`; ``trials``: the raw runs."""
        if self.winner is None:
            return None
        return self._lead(_paired_ratios(trials, self.winner, other))

    def _lead(self, ratios: tuple[float, ...]) -> Decision | None:
        return Decision(ratios, 1 + self.margin, 1 + self.least_gain) if ratios else None

    @property
    def gain_decision(self) -> Decision | None:
        """The winner against the baseline, per confirmation round."""
        if self.winner is None or not self.winner.ratios:
            return None
        return Decision(self.winner.ratios, 1 + self.margin)

    @property
    def kept_together(self) -> tuple[str, ...]:
        """The knobs the recommendation keeps though each one's own rounds did not: the
        knobs of a reduced config (:class:`Reduction`) that was not taken, because the
        winner proved faster than it, it failed, or it was not measured. Each one's own
        effect is unresolved: the rounds showed only what the knobs are worth together."""
        r, best, winner = self.reduction, self.best, self.winner
        if r is None or best is None or winner is None or best.number != winner.number:
            return ()
        return r.knobs

    @property
    def within_noise(self) -> bool | None:
        """True when the winner's lead over the runner-up does not stand
        (:attr:`lead_decision`: within noise, or unresolved with its interval reaching
        ``1 + least_gain``). A lead the rounds prove above the user's least gain is no
        tie, though the noise floor's margin asks more: "either is as good" would be
        false."""
        decision = self.lead_decision
        if decision is not None:
            return not decision.stands
        if self.lead is None or self.noise is None:
            return None
        return self.lead <= self.noise

    def throttled_verdict(self) -> list[tuple[str, TrialRecord]]:
        """The configs the verdict compares (the recommendation, the full winner, the
        runner-up, the baseline every ratio is over) that had throttled runs behind
        their figures, each with its role: their ratios carry the clock's noise."""
        roles = (
            ("the recommendation", self.best),
            ("the full winner", self.winner),
            ("the runner-up", self.runner_up),
            ("the baseline", self.baseline),
        )
        seen: set[int] = set()
        out = []
        for role, record in roles:
            if record is None or record.number in seen:
                continue
            seen.add(record.number)
            if record.throttled_numbers:
                out.append((role, record))
        return out

    def status_counts(self) -> dict[str, int]:
        """Measured configs by status (a config's repeats are one, as in the table)."""
        counts: dict[str, int] = {}
        for t in self.trials:
            counts[t.status] = counts.get(t.status, 0) + 1
        return counts

    def pruning_saved_s(self) -> tuple[int, float]:
        """How many trials pruning stopped, and the measured seconds it saved."""
        return self.pruned_runs if self.pruned_runs is not None else _pruned(self.trials)

    def overhead(self) -> tuple[float, float] | None:
        """Median per-trial fixed cost and its median share of a trial's wall time over
        the measured configs (:func:`~autotune.measurement.fixed_cost`)."""
        return fixed_cost(self._measured())

    def time_split(self) -> tuple[dict[str, float], float, int] | None:
        """Where a trial's time goes: the median of each phase over the measured configs
        (one run each, see :meth:`Measurement.time_split`), the median total, and how
        many configs had the phases recorded."""
        splits = [s for m in self._measured() if (s := m.time_split()) is not None]
        if not splits:
            return None
        # a phase some runs have and others not (a wait for turns): 0 where it is not
        keys = dict.fromkeys(k for p, _ in splits for k in p)
        phases = {k: statistics.median(p.get(k, 0.0) for p, _ in splits) for k in keys}
        if "other" in phases:  # last, as in each run's
            phases["other"] = phases.pop("other")
        return phases, statistics.median(total for _, total in splits), len(splits)

    def knob_costs(self) -> list[KnobCost]:
        """Where the search's time went, per knob (:func:`knob_costs`)."""
        return self.knob_time

    def _measured(self) -> list[Measurement]:
        """Every config's measurement (one never run records no phases: left out)."""
        return [t.measurement for t in self.trials]


def _pruned(runs: list[TrialRecord]) -> tuple[int, float]:
    """How many of ``runs`` pruning stopped, and the measured seconds it saved."""
    pruned = [t for t in runs if t.status == PRUNED]
    return len(pruned), sum(t.measurement.pruned_saved_s or 0.0 for t in pruned)


def knob_costs(raw: list[TrialRecord]) -> list[KnobCost]:
    """Where the search's time went, per knob: the search runs (the sampler's and the
    screening's, not the baseline's or the confirmation's) that set the knob away from the
    baseline, and each run's own time from spawn to exit, its compile included. The runs
    themselves, not their configs' summaries: a confirmed config's summary carries its
    rounds' (warm-cache) medians, which its search run did not cost. A run moving two knobs
    counts for both, so the rows do not add up; most expensive first."""
    base = next((t for t in raw if t.role == BASELINE), None)
    if base is None:
        return []
    costs: dict[str, KnobCost] = {}
    for t in raw:
        m = t.measurement
        if t.role != SEARCH or m.wall_s is None:  # a config skipped unrun counts nothing
            continue
        split = m.time_split()
        run_s = split[1] if split else m.wall_s
        for name, value in t.config.to_dict().items():
            if name == "accumulation_steps" or value == getattr(base.config, name):
                continue
            c = costs.get(name, KnobCost(name))
            costs[name] = KnobCost(
                name, c.trials + 1, c.run_s + run_s, c.compile_s + (m.compile_s or 0.0)
            )
    return sorted(costs.values(), key=lambda c: c.run_s, reverse=True)


def summarize(trials: list[TrialRecord]) -> list[TrialRecord]:
    """One record per measured config; duplicates dropped, repeats folded into their
    original (feasible only if every run was; a search run that was pruned does not
    count against a config that then ran in paired rounds: pruning stopped it against
    the best so far, and the rounds measured it in full, as an ablation or the reduced
    config of the winner often is; nor against a config run again back to back, a
    screening move's second look: :func:`autotune.study.screening.second_look`). A
    pruned run's figure, a part of its window, counts only while no run went in full.

    A config with runs in paired confirmation rounds takes the medians over those rounds
    (value, rates: :func:`aggregate`) and its per-round ratios to the baseline's run of
    the same round. A config repeated without rounds (studies of older versions) takes
    the median over every run. A config a paired second look measured against the best
    (and no round) takes its :attr:`~TrialRecord.standing` from the pairs
    (:func:`standings`), which the search ranks it by.
    """
    trials = [t for t in trials if not t.twin]
    repeats: dict[int, list[TrialRecord]] = {}
    for t in trials:
        if t.role == REPEAT and t.repeat_of is not None:
            repeats.setdefault(t.repeat_of, []).append(t)
    base = next((t for t in trials if t.role == BASELINE), None)
    base_runs = _round_runs(trials, base.config.key()) if base is not None else {}
    base_rounds = {r: t.value for r, t in base_runs.items() if t.feasible}
    out = []
    for t in trials:
        if t.role in (DUPLICATE, REPEAT):
            continue
        runs = [t, *repeats.get(t.number, [])]
        if len(runs) == 1 and t.round is None:
            out.append(t)
            continue
        paired = [r for r in runs if r.round is not None]
        full = [r for r in runs if r.status != PRUNED]
        counted = paired or full or runs
        values = [r.value for r in counted]
        median = statistics.median(values)
        judged = [
            r for r in runs if not (r.round is None and r.status == PRUNED and (paired or full))
        ]
        bad = next((r for r in judged if not r.feasible), None)
        status, reason = (t.status, t.reason) if t in judged else (OK, "")
        if bad is not None and status == OK:
            status, reason = bad.status, f"repeat run #{bad.number}: {bad.reason}"
        ratios = tuple(
            r.value / base_rounds[r.round]
            for r in sorted(paired, key=lambda r: r.round)
            if r.feasible and base_rounds.get(r.round)
        )
        warm = [
            r.measurement.compile_s
            for r in runs
            if r.measurement.compile_cache == "warm" and r.measurement.compile_s is not None
        ]
        out.append(
            replace(
                t,
                value=median,
                measurement=aggregate([r.measurement for r in counted], runs[0].measurement),
                status=status,
                reason=reason,
                runs=len(counted),
                spread=(max(values) - min(values)) / median if median else None,
                ratios=ratios,
                compile_warm_s=statistics.median(warm) if warm else None,
                throttled_runs=tuple(r.number for r in counted if r.measurement.throttled),
            )
        )
    levels = standings(trials, out)
    rounds = {
        r.number if r.repeat_of is None else r.repeat_of for r in trials if r.round is not None
    }
    return [
        replace(t, standing=levels[t.number])
        if t.number in levels and t.number not in rounds
        else t
        for t in out
    ]


def baseline_floor(trials: list[TrialRecord]) -> float | None:
    """The study's noise floor (:func:`autotune.decisions.noise_floor`): the spread of
    the baseline's back-to-back repeats (run right after it, outside any confirmation
    round); ``None`` with fewer than 2. Not its first run: a study's first trial runs
    cold (the launcher's first fork, the data's first read) and was 19-46% slower than
    its repeats on the 2-core machine, which made the floor a cold start, not noise."""
    return noise_floor([t.value for t in baseline_runs(trials)[1:]])


def pruning_margin(least: float, trials: list[TrialRecord]) -> float:
    """How far behind the best a run may be and still not be stopped (the search's
    pruner; a layout the confirmation cannot rule out): twice the study's noise floor
    (:func:`baseline_floor`), at least ``least`` (``search.prune_margin``)."""
    floor = baseline_floor(trials)
    return max(least, round(2 * floor, 4)) if floor is not None else least


def baseline_runs(trials: list[TrialRecord]) -> list[TrialRecord]:
    """The baseline's first run, then its feasible back-to-back repeats (run right after
    it, outside any confirmation round: ``search.noise_runs``); ``[]`` before the
    baseline is measured."""
    base = next((t for t in trials if t.role == BASELINE), None)
    if base is None:
        return []
    return [base, *(t for t in back_to_back(trials, base.number) if t.feasible)]


def back_to_back(trials: list[TrialRecord], number: int) -> list[TrialRecord]:
    """The repeats of trial ``number`` outside any confirmation round (the baseline's
    noise runs, a new best's runs: ``search.noise_runs``, ``search.best_runs``; a move's
    second looks), failed ones included. Not a run of the best made as a move's partner
    in a paired look (``look_for``): it ran next to the move, not to its own runs, and
    it is no noise run of the baseline."""
    return [
        t
        for t in trials
        if t.role == REPEAT and t.repeat_of == number and t.round is None and t.look_for is None
    ]


def standings(trials: list[TrialRecord], summary: list[TrialRecord]) -> dict[int, float]:
    """Per config with paired second looks (by its first trial's number): its level read
    from the pairs, the median over them of its run over the best's run right before it,
    times that config's median (its value in ``summary``). Pairs with a run that did not
    go in full count for nothing. :func:`summarize` sets it as the standing only of a
    config with no paired confirmation rounds (their medians take over).

    Why: a move's runs back to back with itself see a slow stretch of the machine each
    time, and the best's runs, minutes before, did not. On text.yaml (AMD EPYC with
    AVX-512, 2026-12-07 09:05 UTC, bd47e8f, study 4) packed rows at batch 64 ran 80.2k,
    83.5k and 82.3k tokens/s in a row, behind batch 16's 91.9k and 91.3k of a minute
    before; paired rounds in the four other studies put batch 64 1.15-1.28x ahead of
    batch 16. It never became a finalist, and the study's pick was 10.6% behind the
    best. A pair sees a stretch on both sides."""
    by_number = {t.number: t for t in trials}
    values = {t.number: t.value for t in summary}
    estimates: dict[int, list[float]] = {}
    for run in trials:
        partner = by_number.get(run.paired_with) if run.paired_with is not None else None
        if partner is None or run.repeat_of is None or partner.repeat_of is None:
            continue
        if run.status != OK or partner.status != OK or partner.value <= 0:
            continue
        level = values.get(partner.repeat_of)
        if level is not None:
            estimates.setdefault(run.repeat_of, []).append(run.value / partner.value * level)
    return {n: statistics.median(v) for n, v in estimates.items()}


def runs_due(trials: list[TrialRecord], first: TrialRecord, most: int, gain: float) -> bool:
    """Whether ``first``'s config is due another back-to-back run: it has fewer than
    ``most`` runs, and one of them in full (a pruned run's figure is a part of its window)
    or full runs that differ by more than ``gain`` (the study's margin). A new best's runs
    (:func:`autotune.study.search.best_due`) and a screening move's second look
    (:func:`autotune.study.screening.second_look`) read it."""
    runs = [first, *back_to_back(trials, first.number)]
    if len(runs) >= most:
        return False
    full = [r.value for r in runs if r.status == OK] or [first.value]
    spread = noise_floor(full)
    return len(full) == 1 or (spread is not None and spread > gain)


def _paired_ratios(trials: list[TrialRecord], a: TrialRecord, b: TrialRecord) -> tuple[float, ...]:
    """Per confirmation round both ran in, ``a``'s value over ``b``'s."""
    ours, theirs = _round_runs(trials, a.config.key()), _round_runs(trials, b.config.key())
    return tuple(
        ours[r].value / theirs[r].value
        for r in sorted(set(ours) & set(theirs))
        if ours[r].feasible and theirs[r].feasible and theirs[r].value
    )


def _round_runs(trials: list[TrialRecord], key: str) -> dict[int, TrialRecord]:
    """Each run of config ``key`` in a confirmation round, by round (not the baseline's
    twin: :attr:`TrialRecord.twin`)."""
    return {
        t.round: t
        for t in trials
        if t.round is not None and t.role != DUPLICATE and not t.twin and t.config.key() == key
    }


def twin_ratios(trials: list[TrialRecord]) -> tuple[float, ...]:
    """Per confirmation round with both in full: the baseline's twin run over its run of
    the round, the baseline against itself, paired as every config is with it
    (:func:`autotune.decisions.paired_floor`)."""
    base = next((t for t in trials if t.role == BASELINE), None)
    if base is None:
        return ()
    runs = _round_runs(trials, base.config.key())
    twins = {t.round: t for t in trials if t.twin and t.round is not None}
    return tuple(
        twins[r].value / runs[r].value
        for r in sorted(twins)
        if r in runs and twins[r].status == OK and runs[r].status == OK and runs[r].value > 0
    )


_MEDIANS = (
    "samples_per_s",
    "tokens_per_s",
    "tokens_per_step",
    "padding_share",
    "step_time_median_s",
    "step_time_cv",
    "step_time_iqr_s",
    "window_s",
    "joules_per_sample",
    "joules_per_token",
    "sm_util_median_pct",
    "power_median_w",
)
_PEAKS = ("peak_mem_bytes", "peak_allocated_bytes", "peak_longest_bytes", "gpu_proc_mem_max_bytes")


def aggregate(runs: list[Measurement], first: Measurement) -> Measurement:
    """The measurement of a config over several runs: the median of each rate and step
    time (of the runs that have one), the largest memory peak, and the compile time of
    ``first`` (its first run: the cold-cache figure); the rest as ``first`` has it."""
    changes: dict[str, Any] = {}
    for name in _MEDIANS:
        values = [getattr(m, name) for m in runs if getattr(m, name) is not None]
        if values:
            changes[name] = statistics.median(values)
    for name in _PEAKS:
        values = [getattr(m, name) for m in runs if getattr(m, name) is not None]
        if values:
            changes[name] = max(values)
    throttled = [m.throttled for m in runs if m.throttled is not None]
    if throttled:  # a config that throttled in any run is flagged
        changes["throttled"] = sorted({r for reasons in throttled for r in reasons})
    base = next((m for m in runs if m.ok), runs[0]) if runs else first
    cold = {"compile_s": first.compile_s, "compile_cache": first.compile_cache}
    return base.replace(**changes, **cold)


def _contributions(
    raw: list[TrialRecord],
    summary: list[TrialRecord],
    winner: TrialRecord,
    baseline: TrialRecord,
    conf: dict[str, Any],
    min_gain: float = MIN_GAIN,
    least: float = MIN_GAIN,
) -> list[Contribution]:
    """Each ablated knob of ``winner`` (``conf["ablations"]``), from the rounds where both
    the winner and its ablation ran; ``min_gain`` the study's margin, ``least``
    ``search.min_gain``."""
    ablations = conf.get("ablations", {}).get(str(winner.number), {})
    if not ablations:
        return []
    ours = _round_runs(raw, winner.config.key())
    by_key = {t.config.key(): t for t in summary}
    out = []
    for knob, key in ablations.items():
        theirs = _round_runs(raw, key)
        ratios, failed = [], ""
        for r in sorted(set(ours) & set(theirs)):
            a, w = theirs[r], ours[r]
            if not a.feasible:
                failed = failed or f"{a.status}: {a.reason}"
            elif w.feasible and a.value:
                ratios.append(w.value / a.value)
        record = by_key.get(key)
        out.append(
            Contribution(
                knob,
                getattr(winner.config, knob),
                getattr(baseline.config, knob),
                tuple(ratios),
                record.number if record else None,
                failed,
                min_gain,
                least,
            )
        )
    return out


def _reduction(
    raw: list[TrialRecord],
    summary: list[TrialRecord],
    winner: TrialRecord,
    conf: dict[str, Any],
    min_gain: float = MIN_GAIN,
    least: float = MIN_GAIN,
) -> Reduction | None:
    """The winner's reduced config (``conf["reduced"]``) against the winner, by round."""
    reduced = conf.get("reduced", {}).get(str(winner.number))
    if not reduced:
        return None
    ours = _round_runs(raw, winner.config.key())
    theirs = _round_runs(raw, reduced["key"])
    ratios = tuple(
        theirs[r].value / ours[r].value
        for r in sorted(set(ours) & set(theirs))
        if theirs[r].feasible and ours[r].feasible and ours[r].value
    )
    record = next((t for t in summary if t.config.key() == reduced["key"]), None)
    return Reduction(tuple(reduced["knobs"]), record, ratios, min_gain, least)


def ranked(trials: list[TrialRecord]) -> list[TrialRecord]:
    """Feasible measured configs, fastest first (by :attr:`TrialRecord.rank`: a move a
    paired look measured against the best stands where the pairs put it)."""
    return sorted((t for t in trials if t.feasible), key=lambda t: t.rank, reverse=True)


def best_of(trials: list[TrialRecord]) -> TrialRecord | None:
    top = ranked(summarize(trials))
    return top[0] if top else None


def baseline_of(trials: list[TrialRecord]) -> TrialRecord | None:
    return next((t for t in summarize(trials) if t.role == BASELINE), None)


def recommendation(result: TuneResult) -> dict[str, Any]:
    """The recommended config and its evidence as plain data (``best_config.yaml``)."""
    best, base = result.best, result.baseline
    if best is None:
        raise ValueError("a result without a feasible trial has no recommendation")
    m = best.measurement
    measured: dict[str, Any] = {
        "trial": best.number,
        "aggregation": aggregation_text(best),
        "objective": _figure(best.value, result),
        "unit": m.unit,
        "samples_per_s": round(m.samples_per_s or 0.0, 3),
        "step_time_median_s": m.step_time_median_s,
        "step_time_cv": m.step_time_cv,
        "compile_s": m.compile_s,
        "compile_cache": m.compile_cache,
        "compile_warm_s": best.compile_warm_s,
        "warmup_s": m.warmup_s,
        "peak_mem_bytes": m.peak_mem_bytes,
        "mem_kind": m.mem_kind,
    }
    if best.loss_deviation is not None:
        measured["loss_deviation_vs_fp32_reference"] = round(best.loss_deviation, 5)
    if result.memory_budget_bytes is not None:
        measured["memory_budget_bytes"] = result.memory_budget_bytes
        measured["memory_headroom_bytes"] = result.headroom_bytes
    if m.tokens_per_s:
        measured["tokens_per_s"] = round(m.tokens_per_s, 1)
    if m.padding_share is not None:
        measured["padding_share"] = round(m.padding_share, 4)
    if m.peak_longest_bytes is not None:
        measured["peak_longest_batch_bytes"] = m.peak_longest_bytes
        measured["longest_batch_tokens"] = m.longest_batch_tokens
    if m.recompiles is not None:
        measured["recompiles"] = m.recompiles
    measured.update(_device_figures(best))
    if base is not None:
        measured["baseline_trial"] = base.number
        measured["baseline_objective"] = _figure(base.value, result)
        if result.speedup is not None:
            measured["speedup"] = round(result.speedup, 3)
        if best.ratio_range is not None:
            measured["speedup_range"] = [round(x, 3) for x in best.ratio_range]
    if result.mfu_shown:
        found, base_mfu = result.mfu(best), result.mfu(base)
        measured["mfu"] = found.to_dict() if found else None
        if base is not None:
            measured["baseline_mfu"] = base_mfu.to_dict() if base_mfu else None
        why_not = unavailable(result.environment)
        if why_not:
            measured["mfu_unavailable"] = why_not
    if result.objective == ENERGY:  # the values (and speedup: their ratio) are units/J
        measured["objective_unit"] = result.objective_unit
    if result.global_batch is None:
        measured["warning"] = FREE_BATCH_WARNING
    out: dict[str, Any] = {
        "config": best.config.to_dict(),
        "measured": measured,
    }
    winner = result.winner
    if winner is not None and winner.number != best.number:
        dropped = result.reduction.knobs if result.reduction else ()
        out["full_winner"] = {
            "trial": winner.number,
            "config": winner.config.to_dict(),
            "speedup": _rounded(result.vs_baseline(winner)),
            "dropped_knobs": list(dropped),
        }
    if result.contributions:
        out["contributions"] = [c.to_dict() for c in result.contributions]
    projection = result.projection
    if projection is not None:
        out["planned_run"] = projection.to_dict()
    out["environment"] = result.environment
    out["study"] = {"name": result.study_name, "storage": result.storage}
    return out


def _device_figures(best: TrialRecord) -> dict[str, Any]:
    """What the device says of the recommendation's runs: NVML's memory, energy, throttling."""
    m, out = best.measurement, {}
    if m.gpu_proc_mem_max_bytes is not None:  # NVML's figure of the process: what was judged
        out["gpu_proc_mem_max_bytes"] = m.gpu_proc_mem_max_bytes
    for name in ("energy_source", "joules_per_sample", "joules_per_token", "throttled"):
        if getattr(m, name) is not None:
            out[name] = getattr(m, name)
    if best.throttled_numbers:  # the runs behind its figures that throttled
        out["throttled_runs"] = list(best.throttled_numbers)
        out["runs"] = best.runs
    return out


def _figure(value: float, result: TuneResult) -> float:
    """A value rounded for a file: 3 decimals of units/s, 4 significant digits of units/J
    (often below 1)."""
    return float(f"{value:.4g}") if result.objective == ENERGY else round(value, 3)


def _rounded(x: float | None, digits: int = 3) -> float | None:
    return None if x is None else round(x, digits)


def aggregation_text(record: TrialRecord) -> str:
    """How a record's figures were aggregated, in words (shown next to them)."""
    if record.ratios:
        return (
            f"median of {record.runs} paired confirmation rounds (speedup: median of the "
            "per-round ratios to the baseline)"
        )
    if record.runs > 1:
        return f"median of {record.runs} runs"
    return "one run"


def machine_line(environment: dict[str, Any]) -> str:
    """Where a config was measured, in one line (a config is only valid there)."""
    env = environment
    return (
        f"{env.get('device_name', '?')} · torch {env.get('torch', '?')} · "
        f"autotune {env.get('autotune', '?')} · host {env.get('hostname', '?')}"
    )


def write_best_config(result: TuneResult, path: Path) -> Path:
    """Write ``best_config.yaml``; its ``config:`` loads back with :func:`autotune.load_config`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    header = (
        "# autotune recommendation. Valid on the machine it was measured on:\n"
        f"#   {machine_line(result.environment)}\n"
    )
    body = yaml.safe_dump(recommendation(result), sort_keys=False)
    path.write_text(header + body)
    return path
