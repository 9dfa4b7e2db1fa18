"""The terminal: one line per finished trial, the summary at the end, and the terminal
side of ``autotune report``."""

from __future__ import annotations

import sys
from typing import Any

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..measurement import OK, PREDICTED_OVER_MEMORY, TOKENS
from ..mfu import LABEL, mfu_of, shown
from ..results import REPEAT, TrialRecord, TuneResult
from ..study.reporter import Reporter
from .advice import Evidence, advice
from .facts import (
    ERROR,
    WARNING,
    compile_cell,
    energy_text,
    memory_cell,
    rate_text,
    summary_facts,
    throttle_text,
)
from .report import Report


def _speedup(record: TrialRecord, baseline: TrialRecord | None) -> str:
    """Progress lines: the record's value over the baseline's (as summarised so far)."""
    if not (baseline and baseline.feasible and baseline.value and record.feasible):
        return "-"
    return f"{record.value / baseline.value:.2f}x"


def _vs_baseline(record: TrialRecord, result: TuneResult) -> str:
    speedup = result.vs_baseline(record)
    return "-" if speedup is None else f"{speedup:.2f}x"


# Wide enough that rich never wraps or cuts a line of a file or pipe.
PLAIN_WIDTH = 100_000


def make_console() -> Console:
    """The terminal as rich draws it; a file or a pipe gets plain lines, never wrapped or
    cut at a width, without colour codes (what a reader greps or a log keeps)."""
    if sys.stdout.isatty():
        return Console(highlight=False)
    return Console(highlight=False, width=PLAIN_WIDTH, soft_wrap=True, no_color=True)


class ConsoleReporter(Reporter):
    """Prints notes and one line per trial to a rich console."""

    def __init__(self, console: Console | None = None, prefix: str = "") -> None:
        self.console = console or make_console()
        self.prefix = escape(prefix)
        self.machine: dict[str, Any] = {}

    def environment(self, environment: dict[str, Any]) -> None:
        self.machine = environment

    def _mfu(self, record: TrialRecord) -> str:
        """`` | MFU 12% fp32`` for an ok trial of a study with MFU; ``-`` without one."""
        if not shown(self.machine):
            return ""
        found = mfu_of(record.measurement, record.config, self.machine)
        return f" | {LABEL} {found.text() if found else '-'}"

    def note(self, message: str) -> None:
        self.console.print(f"{self.prefix}[dim]note:[/dim] {message}")

    def trial(self, record, best, baseline, done, total) -> None:
        if record.feasible:
            status = "[green]ok[/green]"
        else:
            status = f"[red]{record.status}[/red]: {escape(record.reason)}"
        best_text = f"best #{best.number} {_speedup(best, baseline)}" if best else "best -"
        of = f"/{total}" if total else ""
        if record.status == PREDICTED_OVER_MEMORY:  # not run: no place in the budget
            head = "skipped"
        elif record.round is not None:
            again = f", again #{record.repeat_of}" if record.role == REPEAT else ""
            twin = " (the baseline against itself)" if record.twin else ""
            head = f"confirm round {record.round}{again}{twin}"
        elif record.role == REPEAT and record.look_for is not None:  # a paired look's best
            head = f"paired look, best again #{record.repeat_of} next to #{record.look_for}"
        elif record.role == REPEAT and record.paired_with is not None:
            head = f"paired look, again #{record.repeat_of} next to #{record.paired_with}"
        elif record.role == REPEAT and baseline and record.repeat_of == baseline.number:
            head = f"noise run, again #{record.repeat_of}"  # back to back: the noise floor
        elif record.role == REPEAT:  # a new best's runs, a screening move's second look
            head = f"run again #{record.repeat_of}"
        else:
            head = f"trial {done}{of}"
        role = f"screen {record.move}" if record.move else record.role
        m = record.measurement
        extra = "".join(f" | {x}" for x in (energy_text(m), throttle_text(m)) if x)
        self.console.print(
            f"{self.prefix}{head} #{record.number} {escape(f'[{role}]')} "
            f"{record.config.short()} | "
            f"{rate_text(m)}{self._mfu(record)}{escape(extra)} | {status} | {best_text}"
        )


def summary_table(result: TuneResult, plain: bool = False) -> Table:
    """Every measured config: status, objective (median of its runs), memory, compile;
    and the configs skipped as predicted over memory. ``plain`` (a file or pipe): ASCII
    borders and every reason whole, a row a line; else reasons cut to fit a terminal."""
    tokens = result.unit == TOKENS
    rate = result.objective_unit  # the values' unit: samples/s, or samples/J (energy)
    digits = ".3g" if rate.endswith("/J") else ",.1f"
    title = f"study {result.study_name}: {len(result.trials)} configs"
    skipped = result.status_counts().get(PREDICTED_OVER_MEMORY, 0)
    if skipped:
        title += f" ({skipped} predicted over memory, not run)"
    if any(t.ratios for t in result.trials):
        title += " (xN: the median of N paired confirmation rounds; vs baseline: their ratios)"
    if any(t.standing is not None for t in result.trials):
        title += " (paired: the rate its second look, beside the best, ranks it at)"
    table = Table(title=title, box=box.ASCII if plain else box.HEAVY_HEAD)
    columns = ["#", "role", "config", "status", rate, "vs baseline", result.memory_label]
    columns += ["padding"] if tokens else []
    columns += [LABEL] if result.mfu_shown else []
    energy = any(energy_text(t.measurement) for t in result.trials)
    throttled = any(t.measurement.throttled is not None for t in result.trials)
    columns += ["compile s", "step cv"]
    columns += ["energy"] if energy else []
    columns += ["throttled"] if throttled else []
    paired = any(t.ratios for t in result.trials)
    for col in columns:
        table.add_column(col, justify="right" if col in ("#", rate) else "left")
    for t in result.trials:
        m = t.measurement
        mark = " *" if result.best and t.number == result.best.number else ""
        row = [
            f"{t.number}{mark}",
            t.role,
            t.config.short(),
            t.status if t.feasible else escape(f"{t.status}: {t.reason[: None if plain else 40]}"),
            (
                f"{t.value:{digits}}"
                + (f" (x{t.runs})" if t.runs > 1 else "")
                + (f" (paired {t.standing:{digits}})" if t.standing is not None else "")
            )
            if m.rate
            else "-",
            _vs_baseline(t, result)
            + (f" ({min(t.ratios):.2f}-{max(t.ratios):.2f})" if paired and t.ratios else ""),
            memory_cell(m),
        ]
        if tokens:
            row.append(f"{m.padding_share:.0%}" if m.padding_share is not None else "-")
        if result.mfu_shown:
            found = result.mfu(t)
            row.append(found.text() if found else "-")
        row += [compile_cell(t), f"{m.step_time_cv:.1%}" if m.step_time_cv is not None else "-"]
        row += [energy_text(m) or "-"] if energy else []
        row += [", ".join(m.throttled or []) or "-"] if throttled else []
        table.add_row(*row)
    return table


def print_summary(result: TuneResult, console: Console | None = None) -> None:
    """The summary table, the study's notes and the summary facts."""
    console = console or make_console()
    console.print(summary_table(result, plain=not console.is_terminal))
    for note in result.notes:
        console.print(f"[dim]note:[/dim] {escape(note)}")
    for fact in summary_facts(result):
        if fact.level == ERROR:
            console.print(f"[red]{escape(fact.text)}[/red]")
        elif fact.level == WARNING and fact.label == "warning":
            console.print(f"[yellow]warning:[/yellow] {escape(fact.text)}")
        elif fact.key == "speedup" and fact.level != WARNING:
            head, _, rest = fact.text.partition(" ")
            console.print(f"{escape(fact.label)}: [bold]{head}[/bold] {escape(rest)}")
        else:
            console.print(f"{escape(fact.label)}: {escape(fact.text)}")


def _profile_lines(
    label: str, record: TrialRecord, profile: dict[str, Any], evidence: Evidence | None = None
) -> list[str]:
    head = f"bottleneck of the {label} (trial #{record.number}, {record.config.short()})"
    if profile.get("status") != OK:
        return [f"{head}: profile failed: {escape(str(profile.get('reason')))}"]
    shares = " · ".join(f"{k} {v:.0%}" for k, v in profile["shares"].items())
    busy = profile.get("device_busy")
    lines = [f"{head}: {shares}" + (f" · GPU busy {busy:.0%}" if busy is not None else "")]
    top = ", ".join(f"{op['name'][:40]} {op['share']:.0%}" for op in profile["top_ops"][:4])
    lines.append(f"  top ops: {escape(top)}")
    lines += [f"  [bold]advice:[/bold] {escape(tip)}" for tip in advice(profile, evidence)]
    if profile.get("trace_path"):
        lines.append(f"  trace: {profile['trace_path']}")
    return lines


def print_report(report: Report, console: Console | None = None) -> None:
    """The terminal side of ``autotune report``: summary, bottlenecks, where the files are."""
    console = console or make_console()
    result = report.result
    print_summary(result, console)
    evidence = Evidence.from_result(result)
    seen = set()
    for label, record in (("baseline", result.baseline), ("recommended config", result.best)):
        if record is None or record.number in seen or record.number not in report.profiles:
            continue
        seen.add(record.number)
        for line in _profile_lines(label, record, report.profiles[record.number], evidence):
            console.print(line)
    for note in report.notes:
        console.print(f"[dim]note:[/dim] {escape(note)}")
    plots = ", ".join(path.name for path in report.plots.values()) or "none"
    console.print(f"report written to {report.html} (plots: {plots}; data: {report.data.name})")
