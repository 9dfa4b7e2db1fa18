"""The terminal side of ``autotune verify``: a line per run as it finishes, then the
rounds, predicted against observed speedup and the error."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape

from ..results import BASELINE
from ..study.verify import BEYOND, TOLERANCE, WITHIN, Verification, VerifyRun
from .console import make_console


def run_line(run: VerifyRun, index: int, total: int) -> str:
    """``run 2/6 · round 1 recommended #7: 1,234.5 samples/s (40 steps in 1.02 s, ...)``."""
    head = f"run {index}/{total} · round {run.round} {run.role} #{run.trial}"
    if not run.ok:
        return f"{head}: {run.status}: {run.reason} (log: {run.folder})"
    epochs = run.result.get("epochs")
    extra = f", {epochs} epochs" if epochs else ""
    return (
        f"{head}: {run.rate:,.1f} {run.unit}/s ({run.steps} steps in {run.window_s:.2f} s, "
        f"warm-up {run.warmup_s:.2f} s{extra})"
    )


def verdict_text(v: Verification) -> str:
    """``within the ±5% goal: the error's interval -2.1%..+3.0% (sign test, 87.5% each
    side), 3 rounds``; unresolved, the rounds it took and why it stopped."""
    goal = f"±{TOLERANCE:.0%} goal"
    bounds = v.error_interval
    span = (
        f"the error's interval {bounds[0]:+.1%}..{bounds[1]:+.1%} (sign test, 87.5% each side)"
        if bounds
        else "too few complete rounds to bound the error"
    )
    if v.verdict == WITHIN:
        return f"within the {goal}: {span}, {v.rounds} rounds"
    if v.verdict == BEYOND:
        return f"beyond the {goal}: {span}, {v.rounds} rounds"
    cap = " (--max-rounds)" if v.rounds >= v.max_rounds else ""
    return f"unresolved after {v.rounds} rounds{cap}: {span} crosses an edge of the {goal}"


def verification_lines(v: Verification) -> list[str]:
    """The summary of a verification, plain text, one fact a line."""
    base, best = v.baseline, v.best
    if v.same_config:
        return [
            f"the recommended config of study {v.study_name} is the baseline "
            f"(trial #{base.number}, {base.config.short()}): nothing to verify"
        ]
    unit = f"{v.unit}/s"
    lines = [
        f"verify study {v.study_name}: baseline #{base.number} ({base.config.short()}) "
        f"against recommended #{best.number} ({best.config.short()})"
    ]
    ratios = dict(v.ratios())
    for number in range(1, v.rounds + 1):
        pair = {run.role: run for run in v.runs if run.round == number}
        cells = []
        for role, run in sorted(pair.items(), key=lambda item: item[0] != BASELINE):
            cells.append(f"{role} {run.rate:,.1f}" if run.ok else f"{role} {run.status}")
        ratio = f"ratio {ratios[number]:.3f}" if number in ratios else "no ratio"
        first = v.first_in(number)
        lines.append(f"round {number}: {' · '.join(cells)} {unit} · {ratio} ({first} first)")
    if v.predicted is not None:
        lines.append(f"predicted speedup: {v.predicted:.3f}x (the study's)")
    else:
        lines.append("predicted speedup: - (the study has none)")
    if v.observed is None:
        lines.append("observed speedup: - (no round completed both runs)")
    else:
        values = sorted(ratios.values())
        lines.append(
            f"observed speedup: {v.observed:.3f}x (median of {len(values)} rounds, "
            f"range {values[0]:.3f}x-{values[-1]:.3f}x)"
        )
    if v.error is not None:
        lines.append(f"error: {v.error:+.1%} (observed / predicted - 1); {verdict_text(v)}")
    if v.spread is not None and v.spread > TOLERANCE:
        lines.append(
            f"note: the rounds' ratios lay within ±{v.spread:.1%} of their median, wider than "
            f"the ±{TOLERANCE:.0%} goal: this machine's run-to-run noise alone can move the "
            "verdict; verify again, or with more --rounds, before reading it"
        )
    loader = "the trials' endless stream" if v.endless else "epochs of the shuffled loader"
    lines.append(
        f"run length: {v.steps} optimizer steps ({v.steps_factor}x the trial's "
        f"{v.measured_steps} measured steps) after {v.warmup_steps} warm-up "
        f"step{'' if v.warmup_steps == 1 else 's'}, "
        f"each run a fresh process through autotune.apply_workload, {loader}"
    )
    if v.planned is not None:
        lines.append(
            f"note: {v.planned.key} is {v.planned.length}: both speedups compare the planned "
            "run's throughput (compile time amortised), as the study ranked configs"
        )
    lines.append(f"logs: {v.folder} (verify.json, one folder per run)")
    return lines


def print_verification(v: Verification, console: Console | None = None) -> None:
    """Print :func:`verification_lines` (never wrapped: each line is one fact)."""
    console = console or make_console()
    for line in verification_lines(v):
        console.print(escape(line), soft_wrap=True)
