"""MFU in every view: the progress line, the summary table and line, best_config.yaml,
report.json, the HTML page and its plot, and the advice rule; all from one computation
(autotune.mfu.mfu_of), so they agree. A study whose step could not be counted shows "-"
and one line saying why; a study from before MFU shows nothing of it."""

from __future__ import annotations

import io

import pytest
import yaml
from rich.console import Console

from autotune import Config, Measurement, TrialRecord, TuneResult
from autotune.output.advice import Evidence, advice
from autotune.output.console import ConsoleReporter, print_summary
from autotune.output.html import render_html
from autotune.output.plots import draw_plots
from autotune.output.report import mfu_points, report_data
from autotune.results import BASELINE, recommendation, write_best_config

# 2 MFLOP a sample; peaks fp32 100 GFLOP/s, bf16 400 GFLOP/s.
ENV = {
    "device": "cpu",
    "model_flops": {"unit": "samples", "per_unit": 2e6, "counted_units": 32},
    "peak_flops": {"fp32": {"flops_per_s": 100e9}, "bf16": {"flops_per_s": 400e9}},
}
BASE = Config(batch_size=16, accumulation_steps=2)
BEST = Config(batch_size=32, amp_dtype="bf16")


def _result(environment=ENV) -> TuneResult:
    """Baseline 5,500 samples/s in fp32 (11%), the bf16 recommendation 76,000 (38%)."""
    trials = [
        TrialRecord(0, BASE, Measurement(status="ok", samples_per_s=5_500.0), 5_500.0, BASELINE),
        TrialRecord(1, BEST, Measurement(status="ok", samples_per_s=76_000.0), 76_000.0),
        TrialRecord(2, Config(batch_size=64), Measurement(status="oom", reason="x"), 0.0),
    ]
    return TuneResult.from_trials("s", "memory", trials, environment=environment, global_batch=32)


def _terminal(result: TuneResult) -> str:
    out = io.StringIO()
    print_summary(result, Console(file=out, width=300, highlight=False))
    return out.getvalue()


def test_every_view_shows_the_same_mfu():
    result = _result()
    assert result.mfu(result.best).mfu == pytest.approx(2e6 * 76_000 / 400e9)  # 0.38
    assert result.mfu(result.baseline).mfu == pytest.approx(2e6 * 5_500 / 100e9)  # 0.11
    text = _terminal(result)
    line = "recommended: 38% of this machine's measured bf16 peak; baseline 11% of the fp32 peak"
    assert line in text
    assert "38% bf16" in text and "11% fp32" in text  # the table's column
    assert "MFU basis: the model computes 2 MFLOP per sample per step" in text
    assert "measured fp32 100 GFLOP/s, bf16 400 GFLOP/s" in text
    measured = recommendation(result)["measured"]
    assert measured["mfu"]["mfu"] == pytest.approx(0.38) and measured["mfu"]["peak"] == "bf16"
    assert measured["baseline_mfu"]["mfu"] == pytest.approx(0.11)
    data = report_data(result, {})
    assert data["mfu"]["recommended"] == measured["mfu"]
    rows = {row["number"]: row for row in data["trials"]}
    assert rows[1]["mfu"] == pytest.approx(0.38) and rows[2]["mfu"] is None
    page = render_html(result, {}, {}, [])
    assert "<th>MFU</th>" in page and "38% bf16" in page and "11% fp32" in page


def test_the_progress_line_shows_each_ok_trial_s_mfu(tmp_path):
    out = io.StringIO()
    reporter = ConsoleReporter(Console(file=out, width=300, highlight=False))
    reporter.environment(ENV)
    result = _result()
    for record in result.trials:
        reporter.trial(record, result.best, result.baseline, 1, 3)
    lines = out.getvalue().splitlines()
    assert "| MFU 11% fp32 |" in lines[0] and "| MFU 38% bf16 |" in lines[1]
    assert "| MFU - |" in lines[2]  # out of memory: no MFU
    path = write_best_config(result, tmp_path / "best_config.yaml")
    assert yaml.safe_load(path.read_text().split("\n", 2)[2])["measured"]["mfu"]["mfu"] == 0.38


def test_the_report_plots_throughput_against_mfu():
    result = _result()
    points = mfu_points(result)
    assert [(p["number"], p["best"], p["baseline"]) for p in points] == [
        (0, False, True),
        (1, True, False),
    ]
    import optuna

    figures, _ = draw_plots(optuna.create_study(), mfu_points=points)
    ax = figures["mfu"].axes[0]
    assert ax.get_xlabel().startswith("MFU")
    assert sorted(round(x) for c in ax.collections for x, _ in c.get_offsets()) == [11, 38, 38]


def test_an_uncounted_step_shows_a_dash_and_one_line_saying_why():
    env = {**ENV, "model_flops": {"unit": "samples", "per_unit": None, "reason": "custom op x"}}
    result = _result(env)
    text = _terminal(result)
    assert text.count("custom op x") == 1 and "no MFU: custom op x" in text
    assert "MFU basis" not in text and "% bf16" not in text
    assert recommendation(result)["measured"]["mfu"] is None
    assert report_data(result, {})["mfu"]["unavailable"] == "custom op x"
    assert mfu_points(result) is None


def test_a_study_from_before_mfu_shows_nothing_of_it():
    result = _result({"device": "cpu"})
    text = _terminal(result)
    assert "MFU" not in text
    assert "mfu" not in recommendation(result)["measured"]
    assert report_data(result, {})["mfu"] is None
    assert "MFU" not in render_html(result, {}, {}, [])


def _profile(config, **shares):
    base = dict.fromkeys(("data", "to_device", "forward", "backward", "optimizer", "sync"), 0.0)
    base.update(shares)
    base["other"] = max(0.0, 1 - sum(base.values()))
    return {"status": "ok", "device": "cpu", "shares": base, "config": config.to_dict()}


def _mfu_tip(profile, evidence):
    return next((t for t in advice(profile, evidence) if "MFU" in t), None)


def test_advice_near_the_peak_says_knobs_will_not_help_much():
    trials = [
        TrialRecord(0, BASE, Measurement(status="ok", samples_per_s=5_500.0), 5_500.0, BASELINE),
        TrialRecord(1, BEST, Measurement(status="ok", samples_per_s=130_000.0), 130_000.0),
    ]
    evidence = Evidence.from_result(TuneResult.from_trials("s", "memory", trials, environment=ENV))
    tip = _mfu_tip(_profile(BEST, forward=0.5, backward=0.4, data=0.06), evidence)
    assert tip == (
        "compute-bound near the peak, 65% of this machine's measured bf16 peak (MFU): further "
        "knobs will not help much; the rest is data loading (6% of the step) and the "
        "elementwise work the FLOP count leaves out; beyond that, fewer FLOPs per sample "
        "(a smaller model)"
    )
    # Near the fp32 peak with a 4x higher bf16 peak here: the dtype is the way on, and the
    # study's own measurement of it is cited.
    fast_base = TrialRecord(
        0, BASE, Measurement(status="ok", samples_per_s=30_000.0), 30_000.0, BASELINE
    )
    result = TuneResult.from_trials("s", "memory", [fast_base, trials[1]], environment=ENV)
    tip = _mfu_tip(_profile(BASE, forward=0.5, backward=0.45), Evidence.from_result(result))
    assert "60% of this machine's measured fp32 peak (MFU)" in tip
    assert "knobs that keep fp32 will not help much (the rest is the copy" not in tip
    assert "knobs that keep fp32 will not help much (the rest is " in tip
    assert "; bf16 has a 4.0x higher measured peak here: already measured: " in tip
    assert "already measured: bf16 autocast (amp_dtype) (the recommended config has it)" in tip
    # The baseline, far from its peak: the largest part of its step.
    tip = _mfu_tip(_profile(BASE, data=0.6, forward=0.2, backward=0.1), evidence)
    assert tip.startswith("far from the machine's limit, 11% of this machine's measured fp32")
    assert "the largest part of the step is data loading (60%)" in tip


def test_advice_between_the_marks_or_without_mfu_says_nothing_of_it():
    evidence = Evidence.from_result(_result())  # the recommendation at 38%: neither mark
    assert _mfu_tip(_profile(BEST, forward=0.5, backward=0.4), evidence) is None
    evidence = Evidence.from_result(_result({"device": "cpu"}))
    assert _mfu_tip(_profile(BASE, forward=0.5, backward=0.4), evidence) is None


def test_an_mfu_above_100_percent_is_flagged_as_a_peak_measured_low():
    low = {**ENV, "peak_flops": {"fp32": {"flops_per_s": 5e9}, "bf16": {"flops_per_s": 400e9}}}
    text = _terminal(_result(low))
    assert "baseline 220% of the fp32 peak" in text
    assert "warning: MFU above 100% (trial #0): the peak was measured low" in text
    assert "MFU above 100%" not in _terminal(_result())
