"""The summary facts of a study, computed once: the terminal, the HTML report and the
exports all render these, so a figure reads the same wherever it is shown.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..decisions import FLOOR_CAP, PROVEN, WITHIN, Decision
from ..knobs import show
from ..measurement import PREDICTED_OVER_MEMORY, TOKENS, Measurement
from ..mfu import LABEL, MEANING, describe, peak_name, percent, unavailable
from ..planned import Projection
from ..results import (
    FREE_BATCH_WARNING,
    Contribution,
    TrialRecord,
    TuneResult,
)
from ..space import ENERGY

INFO, WARNING, ERROR = "info", "warning", "error"


@dataclass(frozen=True)
class Fact:
    """One line of the summary.

    Attributes:
        key: what it is about (``speedup``, ``memory``...), for renderers that place it.
        label: the words before the colon.
        text: the fact itself, plain text.
        level: ``info``, ``warning`` or ``error`` (how a renderer colours it).
    """

    key: str
    label: str
    text: str
    level: str = INFO


def fmt_bytes(n: int | float | None) -> str:
    """``1536`` -> ``1.5 KiB``; ``None`` -> ``-``."""
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def speedup_text(
    speedup: float, baseline_value: float, best_value: float, unit: str = "samples/s"
) -> str:
    """``1.50x (100.0 -> 150.0 samples/s)``: the speedup with the two objectives
    (``unit``: :attr:`TuneResult.objective_unit`; ``samples`` alone means per second)."""
    unit = unit if "/" in unit else f"{unit}/s"
    digits = ".3g" if unit.endswith("/J") else ",.1f"  # samples/J are often below 1
    return f"{speedup:.2f}x ({baseline_value:{digits}} -> {best_value:{digits}} {unit})"


def rate_text(m: Measurement) -> str:
    """A trial's throughput: ``1,234.5 samples/s``, or for a token workload the real
    tokens/s first, with samples/s and the padding share."""
    if m.samples_per_s is None:
        return "-"
    if m.unit == TOKENS and m.tokens_per_s is not None:
        text = f"{m.tokens_per_s:,.0f} tokens/s ({m.samples_per_s:,.1f} samples/s"
        if m.padding_share is not None:
            text += f", {m.padding_share:.0%} padding"
        return text + ")"
    text = f"{m.samples_per_s:,.1f} samples/s"
    if m.tokens_per_s:
        text += f" ({m.tokens_per_s:,.0f} tok/s)"
    return text


def compile_text(m: Measurement, warm_s: float | None = None) -> str:
    """A config's compile time, saying what was measured: torch.compile's own counters on
    a cold (or warm) cache, or TorchScript's warm-up excess; ``warm_s`` for repeats."""
    if m.compile_cache is None:
        return f"{m.compile_s:.1f} s (warm-up beyond steady-state steps), not in the throughput"
    text = f"{m.compile_s:.1f} s on a {m.compile_cache} cache (torch.compile's counters)"
    if warm_s is not None:
        text += f", {warm_s:.1f} s warm"
    return text + ", not in the throughput"


def compile_cell(record: TrialRecord) -> str:
    """``21.0 cold / 2.7 warm``: a config's compile seconds, and its recompiles."""
    m = record.measurement
    if m.compile_s is None:
        return "-"
    text = f"{m.compile_s:.1f}"
    if m.compile_cache:
        text += f" {m.compile_cache}"
    if record.compile_warm_s is not None:
        text += f" / {record.compile_warm_s:.1f} warm"
    if m.recompiles:
        text += f" +{m.recompiles} recompiles"
    return text


def contribution_text(c: Contribution, together: tuple[str, ...] = ()) -> str:
    """``compile_mode=default (baseline off): 1.35x, range 1.30-1.41x, kept``.

    ``together``: the knobs the recommendation keeps only together
    (:attr:`TuneResult.kept_together`); one of them that its own rounds would drop is
    said to be kept with the others, its own effect unresolved, not "dropped"."""
    head = f"{c.knob}={show(c.winner_value)} (baseline {show(c.baseline_value)})"
    if c.failed:
        return f"{head}: needed, without it {c.failed}"
    if c.median is None:
        return f"{head}: not measured"
    low, high = min(c.ratios), max(c.ratios)
    figures = f"{head}: {c.median:.2f}x, range {low:.2f}-{high:.2f}x"
    if c.knob in together and not c.kept:
        d, others = c.decision, [k for k in together if k != c.knob]
        if d.state == WITHIN:
            where = f"below {d.below:.2f}x"
        elif d.below_margin:  # below the margin, not the least gain
            where = f"below {d.threshold:.2f}x, across {d.below:.2f}x"
        else:
            where = f"across {d.threshold:.2f}x"
        with_ = f" with {', '.join(others)}" if others else ""
        return (
            f"{figures}, not proven alone ({_span(d)} {where}, "
            f"{d.rounds} rounds): kept{with_} (simplest config below), its own effect "
            "unresolved"
        )
    return f"{figures}, {decision_text(c.decision)}"


def _span(d: Decision) -> str:
    bounds = d.interval
    return f"interval {bounds[0]:.2f}-{bounds[1]:.2f}x" if bounds else "too few rounds"


def noise_fact(result: TuneResult) -> Fact:
    """The study's noise floor and the gain every decision must prove."""
    if result.noise_floor is None:
        text = "not measured (search.noise_runs: 0)"
    elif result.noise_rounds:
        text = (
            f"{result.noise_floor:.1%} (the baseline against itself in "
            f"{result.noise_rounds} paired rounds: the median of its twin's distance)"
        )
    else:
        text = f"{result.noise_floor:.1%} (the baseline against itself, back to back)"
    if result.noise_floor is not None and result.noise_floor > FLOOR_CAP:
        text += f", counted up to {FLOOR_CAP:.0%}"
    if result.noise_rounds and result.search_floor is not None:
        text += f"; back to back {result.search_floor:.1%} (the search's margins)"
    return Fact(
        "noise_floor",
        "noise floor",
        f"{text}; a gain is proven when its paired rounds put it above {result.margin:.1%}, "
        f"within noise when they put it below {result.least_gain:.1%} (search.min_gain); "
        "one still unresolved when they run out stands if they prove it above "
        f"{result.least_gain:.1%}",
    )


def decision_text(d: Decision, win: str = "kept", lose: str = "dropped") -> str:
    """``kept (interval 1.08-1.12x above 1.03x, 3 rounds)``: a decision of the paired
    rounds (:mod:`autotune.decisions`), with ``win`` or ``lose`` as its outcome."""
    span, bar = _span(d), f"{d.threshold:.2f}x"
    if d.state == PROVEN:
        return f"{win} ({span} above {bar}, {d.rounds} rounds)"
    if d.state == WITHIN:
        under = f"the least gain {d.below:.2f}x" if d.least is not None else bar
        return f"within noise ({span} below {under}, {d.rounds} rounds): {lose}"
    where = "below" if d.below_margin else "across"
    if d.stands:  # proven above the least gain, not past the margin: the gain is taken
        return (
            f"unresolved after {d.rounds} rounds ({span} {where} {bar}), "
            f"above the least gain {d.least:.2f}x: {win}"
        )
    if where == "below":  # below the margin, reaching the least gain
        bar = f"{bar}, across the least gain {d.below:.2f}x"
    return f"unresolved after {d.rounds} rounds ({span} {where} {bar}): {lose}, the simpler config"


def _proof_facts(result: TuneResult) -> list[Fact]:
    """What each knob of the winner contributes, and what was dropped."""
    facts = [noise_fact(result)] if result.contributions or result.lead_ratios else []
    if result.contributions:
        together = result.kept_together
        text = "; ".join(contribution_text(c, together) for c in result.contributions)
        facts.append(
            Fact(
                "contributions",
                "each knob's contribution (winner over winner without it, median of paired rounds)",
                text,
            )
        )
    winner, reduction = result.winner, result.reduction
    if reduction is not None and winner is not None:
        dropped = ", ".join(reduction.knobs)
        if result.best is not None and result.best.number != winner.number:
            speed = result.vs_baseline(winner)
            facts.append(
                Fact(
                    "reduced",
                    "simplest config within noise",
                    f"{dropped} back at the baseline's value: the full winner "
                    f"(#{winner.number}, {winner.config.short()}"
                    + (f", {speed:.2f}x" if speed is not None else "")
                    + f") is not measurably faster (reduced/full median "
                    f"{reduction.median:.3f})",
                )
            )
        else:
            record = reduction.record
            if record is None or reduction.median is None:
                why = f"without {dropped}: not measured (the confirmation was cut short)"
            elif not record.feasible:
                why = f"without {dropped}: {record.status}: {record.reason}"
            else:
                proven = reduction.decision.state == PROVEN
                gain = reduction.min_gain if proven else reduction.least_gain
                why = (
                    f"{dropped} (each within noise) are worth more than "
                    f"{gain:.0%} together (reduced/full median {reduction.median:.3f}"
                    + ("" if proven else f"; unresolved at the {reduction.min_gain:.0%} margin")
                    + ")"
                )
            facts.append(
                Fact(
                    "reduced",
                    "simplest config within noise",
                    f"{why}: the full winner is kept",
                    WARNING,
                )
            )
    return facts


def _search_facts(result: TuneResult) -> list[Fact]:
    """How the search spent its trials: the screening's order and why, the time per knob."""
    facts = []
    schedule = result.screening
    if schedule and schedule.get("order"):
        why = "; ".join(schedule.get("reasons", [])) or "no rule fired: registry order"
        made = [t.move for t in sorted(result.trials, key=lambda t: t.number) if t.move]
        left = [m for m in schedule["order"] if m not in made]
        # A planned move is not made when the budget ran out, when it cannot apply to the
        # best config (prefetch without workers), or against the batch size's trend.
        text = ", ".join(made) or "no move made yet"
        facts.append(
            Fact(
                "screening",
                "screening (one knob moved per trial, from the best config so far)",
                text + (f"; not made: {', '.join(left)}" if left else "") + f" ({why})",
            )
        )
    costs = result.knob_costs()
    if costs:
        parts = [
            f"{c.knob} {c.trials} trial{'s' * (c.trials != 1)} {c.run_s:.1f} s"
            + (f" (compile {c.compile_s:.1f} s)" if c.compile_s else "")
            for c in costs
        ]
        facts.append(
            Fact(
                "knob_time",
                "time per knob (search trials that move it from the baseline, run time with "
                "compile; a trial moving two knobs counts for both)",
                " · ".join(parts),
            )
        )
    return facts


def mfu_text(result: TuneResult) -> str | None:
    """``recommended: 38% of this machine's measured bf16 peak; baseline 11%`` (the
    baseline's peak named when it is another dtype's); ``None`` without an MFU."""
    best, base = result.mfu(result.best), result.mfu(result.baseline)
    if best is None:
        return None
    text = (
        f"recommended: {percent(best.mfu)} of this machine's measured {peak_name(best.peak)} peak"
    )
    if base is not None:
        same = base.peak == best.peak
        text += f"; baseline {percent(base.mfu)}"
        text += "" if same else f" of the {peak_name(base.peak)} peak"
    if best.datasheet is not None:
        text += f" ({best.datasheet:.0%} of the datasheet's)"
    return text


def _mfu_facts(result: TuneResult) -> list[Fact]:
    """The recommendation's and the baseline's MFU and what they are measured against,
    or the one line saying why there is none."""
    if not result.mfu_shown:
        return []
    reason = unavailable(result.environment)
    if reason:
        return [Fact("mfu", f"no {LABEL}", reason)]
    facts = []
    text = mfu_text(result)
    if text:
        facts.append(Fact("mfu", f"{LABEL} ({MEANING})", text))
    over = [t.number for t in result.trials if (found := result.mfu(t)) and found.mfu > 1]
    if over:
        facts.append(
            Fact(
                "mfu_over",
                "warning",
                f"{LABEL} above 100% (trial {', '.join(f'#{n}' for n in over)}): the peak was "
                "measured low, most likely while other processes used the machine during the "
                "probe; a new study (or a quiet machine) measures it again",
                WARNING,
            )
        )
    basis = describe(result.environment)
    if basis:
        facts.append(Fact("mfu_basis", f"{LABEL} basis", basis))
    return facts


def memory_cell(m: Measurement) -> str:
    """A table's memory cell: the peak, and where NVML gave the process's figure and it
    is larger (the memory judged), that figure: ``7.0 GiB (NVML 9.0 GiB)``."""
    text = fmt_bytes(m.peak_mem_bytes)
    if m.gpu_proc_mem_max_bytes is not None:
        text += f" (NVML {fmt_bytes(m.gpu_proc_mem_max_bytes)})"
    return text


def energy_text(m: Measurement) -> str | None:
    """``3.2 J/sample (0.31 samples/J)``: the training device's energy per unit of the
    objective and its inverse; ``None`` where no energy was measured."""
    per = m.joules_per_token if m.unit == TOKENS else m.joules_per_sample
    if not per:
        return None
    unit = "token" if m.unit == TOKENS else "sample"
    return f"{per:.3g} J/{unit} ({m.unit_per_joule:.3g} {unit}s/J)"


def throttle_text(m: Measurement) -> str | None:
    """``throttled: sw_power_cap`` where a throttle reason was seen in the window."""
    return f"throttled: {', '.join(m.throttled)}" if m.throttled else None


def energy_facts(result: TuneResult) -> list[Fact]:
    """The recommendation's and the baseline's energy per unit, the throttled configs, or
    (once) why energy is not available on this machine."""
    why = result.environment.get("energy_unavailable")
    best, base = result.best, result.baseline
    facts = []
    texts = [(r, energy_text(r.measurement)) for r in (best, base) if r is not None]
    if any(text for _, text in texts):
        shown = [f"#{r.number} {text or '-'}" for r, text in texts if r is not None]
        source = (best or base).measurement.energy_source
        facts.append(Fact("energy", f"energy ({source})", " · baseline ".join(shown)))
    elif why:
        planned = " (the planned run's energy is not projected)" if result.projection else ""
        facts.append(Fact("energy", "energy", f"not available here: {why}{planned}"))
    throttled = [t for t in result.trials if t.measurement.throttled]
    if throttled:
        numbers = ", ".join(f"#{t.number}" for t in throttled)
        reasons = sorted({r for t in throttled for r in t.measurement.throttled})
        facts.append(
            Fact(
                "throttled",
                "throttled",
                f"the GPU slowed its clock during the window of {numbers} "
                f"({', '.join(reasons)}): their figures are noisier",
                WARNING,
            )
        )
    return facts


def gain_name(result: TuneResult) -> str:
    """What the ratio of two values is: ``speedup``, or ``energy efficiency`` (a study
    whose objective is energy: units per joule over the baseline's)."""
    return "energy efficiency" if result.objective == ENERGY else "speedup"


def planned_energy_facts(result: TuneResult, projection: Projection) -> list[Fact]:
    """The planned run's energy (and its cost), or why it is not projected: said where
    some energy was measured or a price is set, and not where the energy line already
    says energy is not available here."""
    if projection.baseline_kwh is not None and projection.recommended_kwh is not None:
        return [Fact("planned_energy", projection.energy_label, projection.energy_text())]
    if result.environment.get("energy_unavailable"):
        return []
    measured = any(energy_text(t.measurement) for t in result.trials)
    if measured or projection.plan.energy_price_per_kwh is not None:
        return [Fact("planned_energy", projection.energy_label, projection.energy_text())]
    return []


def throttled_runs_text(record: TrialRecord) -> str:
    """``2 of its 3 paired runs throttled (sw_power_cap: #7, #12)``."""
    numbers = record.throttled_numbers
    runs = "paired runs" if record.ratios else "runs"
    reasons = ", ".join(record.measurement.throttled or []) or "throttled"
    listed = ", ".join(f"#{n}" for n in numbers)
    return f"{len(numbers)} of its {record.runs} {runs} throttled ({reasons}: {listed})"


def throttled_verdict_facts(result: TuneResult) -> list[Fact]:
    """The verdict's note where a config it compares had throttled runs behind its
    figures: which, how many, and what it means for the ratios."""
    found = result.throttled_verdict()
    if not found:
        return []
    parts = "; ".join(f"{role} #{r.number}: {throttled_runs_text(r)}" for role, r in found)
    return [
        Fact(
            "throttled_verdict",
            "verdict measured while the GPU throttled",
            f"{parts}. The ratios between them carry the clock's noise: confirm on a GPU "
            "that holds its clocks (cooling, power limit), or check with autotune verify",
            WARNING,
        )
    ]


def summary_facts(result: TuneResult) -> list[Fact]:
    """Everything the summary says about a study, in reading order."""
    facts = _cost_facts(result)
    facts += _search_facts(result)
    if not result.global_batch:
        facts.append(Fact("free_batch", "warning", FREE_BATCH_WARNING, WARNING))
    best = result.best
    if best is None:
        nothing = "no feasible trial: nothing to recommend"
        facts.append(Fact("recommended", "recommended", nothing, ERROR))
        return facts
    facts += _recommendation_facts(result, best)
    facts += _mfu_facts(result)
    facts += energy_facts(result)
    projection = result.projection
    if projection is not None:
        facts.append(Fact("planned_run", projection.label, projection.text()))
        facts += planned_energy_facts(result, projection)
    facts += _proof_facts(result)
    facts += throttled_verdict_facts(result)
    facts += _best_run_facts(result, best)
    facts += _tie_facts(result)
    facts += _check_facts(result, best)
    return facts


def _cost_facts(result: TuneResult) -> list[Fact]:
    """What the study ran and spent: statuses, pruning, skipped configs, per-trial costs."""
    facts: list[Fact] = []
    counts = ", ".join(f"{n} {status}" for status, n in sorted(result.status_counts().items()))
    facts.append(Fact("status_counts", "configs by status", counts))
    pruned, saved_s = result.pruning_saved_s()
    if pruned:
        facts.append(
            Fact(
                "pruning",
                "pruning",
                f"stopped {pruned} trial(s) early, saving ~{saved_s:.1f} s of measured steps",
            )
        )
    skipped = result.status_counts().get(PREDICTED_OVER_MEMORY, 0)
    if skipped:
        facts.append(
            Fact(
                "memory_prediction",
                "memory prediction",
                f"skipped {skipped} config(s) predicted over the memory budget, not run "
                "(search.predict_memory)",
            )
        )
    overhead = result.overhead()
    if overhead:
        facts.append(
            Fact(
                "overhead",
                "per-trial fixed cost (process start, imports, device, build, result and exit)",
                f"median {overhead[0]:.1f} s, {overhead[1]:.0%} of a trial's wall time",
            )
        )
    split = result.time_split()
    if split:
        phases, total, n = split
        parts = " · ".join(f"{k} {v:.2f}" for k, v in phases.items() if k != "other" or v >= 0.01)
        facts.append(
            Fact(
                "time_split",
                f"where a trial's time goes (s, median of {n} config{'s' * (n != 1)})",
                f"{parts} (of {total:.1f} from spawn to exit)",
            )
        )
    return facts


def _recommendation_facts(result: TuneResult, best: TrialRecord) -> list[Fact]:
    """The recommended config and its speedup over the baseline (or why there is none)."""
    facts: list[Fact] = []
    base = result.baseline
    facts.append(Fact("recommended", f"recommended (trial #{best.number})", best.config.short()))
    if base is not None and result.speedup is not None:
        text = speedup_text(result.speedup, base.value, best.value, result.objective_unit)
        if best.ratio_range is not None:
            low, high = best.ratio_range
            text += f", median of {best.runs} paired rounds (range {low:.2f}-{high:.2f}x)"
        facts.append(
            Fact(
                "speedup",
                f"{gain_name(result)} over baseline (trial #{base.number}, {base.config.short()})",
                text,
            )
        )
    elif base is not None:
        facts.append(
            Fact(
                "speedup",
                f"baseline (trial #{base.number})",
                f"did not run cleanly: {base.status}: {base.reason}",
                WARNING,
            )
        )
    if result.objective == ENERGY:  # what the thriftier config costs in time
        rates = [f"#{r.number} {rate_text(r.measurement)}" for r in (best, base) if r is not None]
        facts.append(
            Fact("throughput", "throughput (not the objective)", " · baseline ".join(rates))
        )
    return facts


def _best_run_facts(result: TuneResult, best: TrialRecord) -> list[Fact]:
    """What the recommended config's run held: memory, longest batch, padding, recompiles."""
    facts: list[Fact] = []
    m = best.measurement
    memory = fmt_bytes(m.peak_mem_bytes)
    if result.memory_budget_bytes is not None and result.headroom_bytes is not None:
        memory = (
            f"peak {memory} of a {fmt_bytes(result.memory_budget_bytes)} budget "
            f"(headroom {fmt_bytes(result.headroom_bytes)})"
        )
    if m.gpu_proc_mem_max_bytes is not None:  # what the limit judged beside the peak
        memory += f"; NVML: {fmt_bytes(m.gpu_proc_mem_max_bytes)} on the device for the process"
        memory += f" ({fmt_bytes(m.judged_mem_bytes)} judged)"
    if best.config.world_size > 1:
        memory += f" (the largest of its {best.config.world_size} processes' peaks)"
    facts.append(Fact("memory", "memory", memory))
    if m.peak_longest_bytes is not None:
        facts.append(
            Fact(
                "longest_batch",
                "peak at longest batch",
                f"{fmt_bytes(m.peak_longest_bytes)} (a micro-batch of the dataset's longest "
                f"samples, {m.longest_batch_tokens} tokens wide; in the memory verdict)",
            )
        )
    if m.padding_share is not None:
        facts.append(
            Fact("padding", "padding", f"{m.padding_share:.0%} of token positions in the window")
        )
    if m.recompiles:
        facts.append(
            Fact(
                "recompiles",
                "recompiles",
                f"{m.recompiles} after the first step, {m.recompile_s or 0:.1f} s",
            )
        )
    return facts


def _tie_facts(result: TuneResult) -> list[Fact]:
    """A warning when the winner's lead over the runner-up is within noise."""
    facts: list[Fact] = []
    if result.within_noise and result.runner_up is not None and result.best is result.winner:
        up, lead = result.runner_up, result.lead_decision
        if lead is not None:
            why = "its lead per round is " + decision_text(lead, "proven", "a tie").split(": ")[0]
        else:
            why = f"within measurement noise ({result.noise:.1%})"
        facts.append(
            Fact(
                "within_noise",
                "warning",
                f"the winner leads the runner-up (#{up.number}, {up.config.short()}) by "
                f"{result.lead:.1%}, {why}: a tie, either is as good",
                WARNING,
            )
        )
    return facts


def _check_facts(result: TuneResult, best: TrialRecord) -> list[Fact]:
    """The recommended config's accuracy and compile figures, and where it was written."""
    facts: list[Fact] = []
    if best.loss_deviation is not None:
        facts.append(
            Fact(
                "accuracy",
                "accuracy",
                f"final losses within {best.loss_deviation:.2%} of the fp32 reference run",
            )
        )
    m = best.measurement
    if m.compile_s is not None:
        facts.append(Fact("compile", "compile", compile_text(m, best.compile_warm_s)))
    if result.best_config_path:
        facts.append(Fact("best_config", "best config written to", str(result.best_config_path)))
    return facts
