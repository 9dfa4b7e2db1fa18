"""The report page (``index.html``): summary, recommended config, bottlenecks, plots, trials.

Plots are referenced by file name (they sit next to the page); every figure of the
summary comes from :func:`autotune.output.facts.summary_facts`.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from ..knobs import KNOBS
from ..measurement import OK, TOKENS, Measurement
from ..mfu import percent
from ..results import DUPLICATE, TrialRecord, TuneResult
from ..space import THROUGHPUT
from .advice import Evidence, advice
from .facts import (
    ERROR,
    compile_cell,
    contribution_text,
    energy_text,
    memory_cell,
    summary_facts,
    throttle_text,
)

PHASE_COLOURS = {
    "data": "#e4572e",
    "to_device": "#f3a712",
    "forward": "#29335c",
    "backward": "#4f6d7a",
    "optimizer": "#a8c686",
    "sync": "#db2763",
    "other": "#bbbbbb",
}


def trial_data(t: TrialRecord, result: TuneResult) -> dict[str, Any]:
    """One trial's row of the report (``report.json`` and the HTML table)."""
    m = t.measurement
    found = result.mfu(t)
    return {
        "number": t.number,
        "role": t.role,
        "config": t.config.to_dict(),
        "status": t.status,
        "reason": t.reason,
        "objective": t.value,
        "rate": m.rate,  # what the objective counts: samples/s or real tokens/s
        "samples_per_s": m.samples_per_s,
        "tokens_per_s": m.tokens_per_s,
        "padding_share": m.padding_share,
        "peak_longest_bytes": m.peak_longest_bytes,
        "recompiles": m.recompiles,
        "speedup": result.vs_baseline(t),
        "ratios": list(t.ratios),  # per paired confirmation round, vs the baseline
        "runs": t.runs,
        # what the search ranked it by: its paired second look beside the best (None: its value)
        "standing": t.standing,
        "peak_mem_bytes": m.peak_mem_bytes,
        "compile_s": m.compile_s,
        "compile_cache": m.compile_cache,
        "compile_warm_s": t.compile_warm_s,
        "warmup_s": m.warmup_s,
        "step_time_cv": m.step_time_cv,
        "loss_deviation": t.loss_deviation,
        "mfu": found.mfu if found else None,  # of the measured peak of "mfu_peak"
        "mfu_peak": found.peak if found else None,
        "model_flops_per_s": found.flops_per_s if found else None,
        **telemetry_data(m),
    }


# The window's telemetry (autotune.trial.telemetry) as a report shows it: present only
# where measured.
TELEMETRY = (
    "judged_mem_bytes",
    "gpu_proc_mem_max_bytes",
    "gpu_mem_used_max_bytes",
    "sm_util_median_pct",
    "mem_util_median_pct",
    "power_median_w",
    "power_max_w",
    "sm_clock_median_mhz",
    "sm_clock_min_mhz",
    "energy_j",
    "energy_s",
    "energy_source",
    "joules_per_sample",
    "joules_per_token",
    "cpu_energy_j",
    "cpu_util_cores",
    "throttled",
    "throttled_share",
)


def telemetry_data(m: Measurement) -> dict[str, Any]:
    """A trial's telemetry figures that were measured, with samples (or tokens) per
    joule; the allocator's peak is ``peak_mem_bytes``, what the limit judged
    ``judged_mem_bytes`` (shown only where NVML's figure of the process is)."""
    out = {k: getattr(m, k) for k in TELEMETRY if getattr(m, k) is not None}
    if m.gpu_proc_mem_max_bytes is None:
        out.pop("judged_mem_bytes", None)
    if m.unit_per_joule is not None:
        out[f"{'tokens' if m.unit == TOKENS else 'samples'}_per_joule"] = m.unit_per_joule
    return out


_CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: .5em 0; }
td, th { padding: 3px 8px; border-bottom: 1px solid #eee; text-align: left; vertical-align: top; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.best { background: #eef7ee; } tr.bad td { color: #999; }
.changed { font-weight: 600; color: #0a6d2c; }
.big { font-size: 1.6em; font-weight: 600; }
.contrib { position: relative; height: 16px; background: #f4f4f4; }
.contrib div { height: 12px; } .contrib span { position: absolute; top: 13px; height: 2px;
  background: #333; }
.bar { display: flex; height: 22px; width: 100%; max-width: 700px; border-radius: 3px;
       overflow: hidden; margin: .3em 0; }
.bar div { color: #fff; font-size: 11px; line-height: 22px; padding-left: 3px; overflow: hidden;
           white-space: nowrap; }
.legend span { display: inline-block; margin-right: 1em; font-size: 12px; }
.legend i { display: inline-block; width: 10px; height: 10px; margin-right: 4px; }
figure { margin: 1em 0; } figcaption { color: #555; max-width: 800px; }
img { max-width: 100%; border: 1px solid #eee; }
.note { color: #8a6d00; } code { background: #f4f4f4; padding: 0 3px; }
"""

_CAPTIONS = {
    "history": "Each trial's throughput in the order the sampler ran them; the line is the "
    "best feasible so far, the dashed line the baseline. Ok trials are blue circles, "
    "infeasible ones (over memory, accuracy, crashed) grey crosses, pruned ones (stopped "
    "early, their rate an estimate) hollow orange triangles; only ok trials count as best.",
    "pareto": "Throughput against peak memory, one point per measured config (#: trial "
    "number). Red points are the Pareto front: no other config is both faster and "
    "lighter. Pick from the front when you need memory headroom. Infeasible and pruned "
    "trials are drawn in their own styles (see the legend) and are never on the front.",
    "importances": "How much of the throughput's variation each knob explains (Optuna's "
    "PED-ANOVA, over feasible trials). A knob near 0 barely matters on this machine.",
    "mfu": "Throughput against MFU (model FLOPs/s over this machine's measured matmul "
    "peak of the dtype the config computes in; not counting recomputation or padding), one "
    "point per ok config. Configs of one dtype lie on one line through the origin: moving "
    "along it is speed; a config far left of 100% has room the hardware could give.",
    "slice": "Per-knob effect: every trial's throughput against the value of each knob "
    "(real values, not Optuna's indexes; ok trials shaded by trial number, infeasible and "
    "pruned ones in their own styles). A clear trend says which way to move the knob.",
}


def _e(x: Any) -> str:
    return html.escape(str(x))


def _num(x: float | None, fmt: str = ",.1f") -> str:
    return "-" if x is None else format(x, fmt)


def _summary_html(result: TuneResult) -> str:
    """The summary facts as a table, the speedup (when there is one) in large type first."""
    facts = summary_facts(result)
    rows = []
    speedup = next((f for f in facts if f.key == "speedup"), None)
    if speedup is not None and result.speedup is not None:
        head, _, rest = speedup.text.partition(" ")
        than = "faster than the baseline"
        if result.objective_unit.endswith("/J"):  # an energy study's ratio
            than = f"the {result.objective_unit} of the baseline"
        rows.append(
            f"<p><span class='big'>{_e(head)}</span> {than} {_e(rest)}: "
            f"{_e(speedup.label.partition(' over ')[2])}</p>"
        )
    cells = [
        f"<tr><th>{_e(f.label)}</th><td{' class=note' if f.level != 'info' else ''}>"
        f"{_e(f.text)}</td></tr>"
        for f in facts
        if f is not speedup or result.speedup is None
    ]
    if any(f.level == ERROR for f in facts):
        rows.append("<p class='note'>No feasible trial: nothing to recommend.</p>")
    rows.append("<table>" + "".join(cells) + "</table>")
    return "\n".join(rows)


def _contributions_html(result: TuneResult) -> str:
    """Each knob of the winner as a bar: its median contribution, the range of its
    per-round ratios as a whisker, kept or dropped (nothing without an ablation)."""
    if not result.contributions:
        return ""
    rows = []
    scale = max([1.05, *(max(c.ratios) for c in result.contributions if c.ratios)])
    together = result.kept_together
    for c in result.contributions:
        text = contribution_text(c, together)
        if not c.ratios:
            rows.append(f"<tr><td>{_e(c.knob)}</td><td colspan=2>{_e(text)}</td></tr>")
            continue
        width = 100 * (c.median - 1) / (scale - 1) if c.median > 1 else 0.0
        low = 100 * max(0.0, min(c.ratios) - 1) / (scale - 1)
        high = 100 * max(0.0, max(c.ratios) - 1) / (scale - 1)
        colour = "#2a7" if c.kept or c.knob in together else "#bbb"
        rows.append(
            f"<tr><td>{_e(c.knob)}</td><td style='width:320px'><div class='contrib'>"
            f"<div style='width:{width:.1f}%;background:{colour}'></div>"
            f"<span style='left:{low:.1f}%;width:{max(high - low, 0.5):.1f}%'></span>"
            f"</div></td><td>{_e(text)}</td></tr>"
        )
    return (
        "<h2>What each knob contributes</h2>"
        "<p>The winner against the winner with one knob back at the baseline's value, in the "
        "same paired rounds: the bar is the median ratio above 1x (its right end: the "
        f"winner's gain from that knob; full width {scale:.2f}x), the line under it the "
        "range over the rounds; grey bars were within noise and dropped.</p>"
        "<table>" + "".join(rows) + "</table>"
    )


def _config_html(result: TuneResult) -> str:
    best, base = result.best, result.baseline
    if best is None:
        return ""
    base_values = base.config.to_dict() if base else {}
    rows = []
    for name, value in best.config.to_dict().items():
        before = base_values.get(name, "-")
        cls = " class='changed'" if before != value else ""
        knob = KNOBS.get(name)
        rows.append(
            f"<tr><td>{_e(name)}</td><td>{_e(before)}</td><td{cls}>{_e(value)}</td>"
            f"<td>{_e(knob.help if knob else '')}</td></tr>"
        )
    return (
        "<table><tr><th>knob</th><th>baseline</th><th>recommended</th><th>what it trades</th>"
        "</tr>" + "".join(rows) + "</table>"
    )


def _bar(shares: dict[str, float]) -> str:
    cells = "".join(
        f"<div style='width:{share * 100:.2f}%;background:{PHASE_COLOURS.get(name, '#999')}' "
        f"title='{_e(name)} {share:.1%}'>{_e(name) if share >= 0.06 else ''}</div>"
        for name, share in shares.items()
        if share > 0
    )
    return f"<div class='bar'>{cells}</div>"


def _profile_html(
    label: str, record: TrialRecord, p: dict[str, Any], evidence: Evidence | None
) -> str:
    head = f"<h3>{_e(label)}: trial #{record.number} <code>{_e(record.config.short())}</code></h3>"
    if p.get("status") != OK:
        return head + f"<p class='note'>profile failed: {_e(p.get('reason'))}</p>"
    shares = p["shares"]
    parts = [
        head,
        _bar(shares),
        "<p>" + ", ".join(f"{_e(k)} {v:.0%}" for k, v in shares.items()) + f" of a "
        f"{p['step_s'] * 1000:,.1f} ms profiled step (profiling slows every op: compare "
        "shares, not times)"
        + (f"; GPU busy {p['device_busy']:.0%}" if p.get("device_busy") is not None else "")
        + "</p>",
        "<ul>" + "".join(f"<li>{_e(t)}</li>" for t in advice(p, evidence)) + "</ul>",
    ]
    for key, title in (("top_ops", "host ops"), ("top_kernels", "GPU kernels")):
        ops = p.get(key)
        if not ops:
            continue
        rows = "".join(
            f"<tr><td>{_e(op['name'][:90])}</td><td class='num'>{op['calls_per_step']:.0f}</td>"
            f"<td class='num'>{op['self_ms_per_step']:,.2f}</td>"
            f"<td class='num'>{op['share']:.1%}</td></tr>"
            for op in ops
        )
        parts.append(
            f"<details><summary>top {title} by self time</summary><table><tr><th>op</th>"
            "<th>calls/step</th><th>self ms/step</th><th>share of step</th></tr>"
            f"{rows}</table></details>"
        )
    if p.get("trace_path"):
        parts.append(
            f"<p>Chrome trace: <code>{_e(p['trace_path'])}</code> (open in "
            "<code>chrome://tracing</code> or https://ui.perfetto.dev)</p>"
        )
    return "\n".join(parts)


def _mfu_cell(d: dict[str, Any]) -> str:
    return "-" if d["mfu"] is None else f"{percent(d['mfu'])} {d['mfu_peak']}"


def _trials_html(result: TuneResult) -> str:
    energy = any(energy_text(t.measurement) for t in result.trials)
    head = (
        f"<tr><th>#</th><th>role</th><th>config</th><th>status</th><th>{result.unit}/s</th>"
        f"<th>vs baseline</th><th>{result.memory_label}</th><th>compile s</th><th>step cv</th>"
        "<th>loss dev.</th>"
        + ("<th>MFU</th>" if result.mfu_shown else "")
        + ("<th>energy</th>" if energy else "")
        + "</tr>"
    )
    rows = []
    rate_ranked = result.objective == THROUGHPUT  # the standing is in the rate's unit
    for t in result.trials:
        if t.role == DUPLICATE:
            continue
        d = trial_data(t, result)
        best = result.best is not None and t.number == result.best.number
        cls = "best" if best else ("" if t.feasible else "bad")
        status = t.status if t.feasible else f"{t.status}: {t.reason}"
        if t.measurement.throttled:
            status += f" ({throttle_text(t.measurement)})"
        rows.append(
            f"<tr class='{cls}'><td class='num'>{t.number}{' *' if best else ''}</td>"
            f"<td>{_e(t.role)}</td><td><code>{_e(t.config.short())}</code></td>"
            f"<td>{_e(status)}</td><td class='num'>{_num(d['rate'])}"
            + (f" (paired {_num(t.standing)})" if t.standing is not None and rate_ranked else "")
            + "</td>"
            f"<td class='num'>{_num(d['speedup'], '.2f')}{'x' if d['speedup'] else ''}</td>"
            f"<td class='num'>{_e(memory_cell(t.measurement))}</td>"
            f"<td class='num'>{_e(compile_cell(t))}</td>"
            f"<td class='num'>{_num(d['step_time_cv'], '.1%')}</td>"
            f"<td class='num'>{_num(d['loss_deviation'], '.2%')}</td>"
            + (f"<td class='num'>{_e(_mfu_cell(d))}</td>" if result.mfu_shown else "")
            + (f"<td class='num'>{_e(energy_text(t.measurement) or '-')}</td>" if energy else "")
            + "</tr>"
        )
    return f"<table>{head}{''.join(rows)}</table>"


def render_html(
    result: TuneResult,
    profiles: dict[int, dict[str, Any]],
    files: dict[str, Path],
    notes: list[str],
    source: str = "",
) -> str:
    """The report page; plots are referenced by file name (they sit next to it)."""
    env = result.environment
    machine = " · ".join(
        _e(x)
        for x in (
            env.get("device_name"),
            f"torch {env.get('torch', '?')}",
            f"host {env.get('hostname', '?')}",
        )
        if x
    )
    figures = "".join(
        f"<figure><img src='{_e(path.name)}' alt='{_e(name)}'>"
        f"<figcaption>{_e(_CAPTIONS.get(name, ''))}</figcaption></figure>"
        for name, path in files.items()
    )
    profile_parts = []
    evidence = Evidence.from_result(result)
    for label, record in (("baseline", result.baseline), ("recommended", result.best)):
        if record is not None and record.number in profiles:
            if (
                label == "recommended"
                and result.baseline
                and record.number == result.baseline.number
            ):
                continue
            profile_parts.append(_profile_html(label, record, profiles[record.number], evidence))
    bottlenecks = "".join(profile_parts) or (
        "<p>Not profiled: run <code>autotune report</code> without <code>--no-profile</code>.</p>"
    )
    legend = "".join(
        f"<span><i style='background:{c}'></i>{_e(n)}</span>" for n, c in PHASE_COLOURS.items()
    )
    note_html = "".join(f"<p class='note'>note: {_e(n)}</p>" for n in notes)
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>autotune report: {_e(result.study_name)}</title>
<style>{_CSS}</style></head><body>
<h1>autotune report: study {_e(result.study_name)}</h1>
<p>Space <code>{_e(source)}</code>, storage <code>{_e(result.storage)}</code>.<br>
Measured on {machine}. A config is only valid on the machine it was measured on.</p>
<h2>Summary</h2>
{_summary_html(result)}
<h2>Recommended config</h2>
{_config_html(result)}
{_contributions_html(result)}
<p>Adopt it with <code>autotune export</code> (yaml, json, Hugging Face, Lightning, shell)
or in code with <code>autotune.apply(autotune.load_config("best_config.yaml"), ...)</code>.</p>
<h2>Where the step time goes</h2>
<p>A short <code>torch.profiler</code> pass of the baseline and of the recommended config:
the share of one optimizer step spent loading data, copying it to the device, in forward,
backward and the optimizer, waiting on the device (sync), and elsewhere.</p>
<p class="legend">{legend}</p>
{bottlenecks}
<h2>Plots</h2>
{figures}
{note_html}
<h2>All trials</h2>
{_trials_html(result)}
</body></html>
"""
