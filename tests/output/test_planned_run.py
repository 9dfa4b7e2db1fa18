"""The planned run in every output: the terminal summary, the HTML page, report.json and
the header of an exported config; nothing of it without a planned length."""

from __future__ import annotations

import io
import json

from rich.console import Console

from autotune import Config, Measurement, TrialRecord, TuneResult, export_config
from autotune.output.console import print_summary
from autotune.output.html import render_html
from autotune.output.report import report_data
from autotune.planned import Plan, duration_text
from autotune.results import BASELINE, recommendation

STEPS = 100_000


def _result(plan: Plan | None) -> TuneResult:
    """Baseline 320 samples/s, the recommendation 640 (a 600 s cold compile), 32 a step."""

    def m(rate, compile_s=None):
        cache = "cold" if compile_s else None
        return Measurement(
            status="ok",
            samples_per_s=rate,
            samples_per_step=32,
            compile_s=compile_s,
            compile_cache=cache,
        )

    run_s = 600.0 + STEPS * 32 / 640
    trials = [
        TrialRecord(0, Config(batch_size=8), m(320.0), 320.0, BASELINE),
        TrialRecord(
            1, Config(batch_size=8, compile_mode="default"), m(640.0, 600.0), STEPS * 32 / run_s
        ),
    ]
    return TuneResult.from_trials("s", "memory", trials, plan=plan, global_batch=256)


PLAN = Plan("planned_steps", STEPS, 11.84)
# baseline 10,000 s; recommended 600 + 5,000 s
LINE = (
    "planned run of 100,000 steps at 11.84 an hour: baseline 2 h 47 min (32.89), "
    "recommended 1 h 33 min (18.42): saves 1 h 13 min, 14.47"
)


def _terminal(result: TuneResult) -> str:
    out = io.StringIO()
    print_summary(result, Console(file=out, width=300, highlight=False))
    return out.getvalue()


def test_the_terminal_summary_says_what_the_planned_run_takes_and_saves():
    """Would catch the line missing, the cost missing, or durations in raw seconds."""
    assert duration_text(10_000) == "2 h 47 min"
    assert LINE in _terminal(_result(PLAN))
    assert "planned run" not in _terminal(_result(None))


def test_report_json_and_the_html_page_carry_the_same_projection():
    result = _result(PLAN)
    data = json.loads(json.dumps(report_data(result, {}), default=str))
    run = data["planned_run"]
    assert run["baseline_s"] == 10_000.0 and run["recommended_s"] == 5_600.0
    assert run["saved_cost"] == round(4_400 / 3600 * 11.84, 2)
    html = render_html(result, {}, {}, [])
    assert "planned run of 100,000 steps at 11.84 an hour" in html
    assert "saves 1 h 13 min, 14.47" in html
    plain = _result(None)
    assert report_data(plain, {})["planned_run"] is None
    assert "planned run" not in render_html(plain, {}, {}, [])


def test_an_exported_config_repeats_the_projection_in_its_header():
    result = _result(PLAN)
    text = export_config(result.best.config, "hf", evidence=recommendation(result))
    assert f"# {LINE}" in text
    plain = _result(None)
    assert "planned run" not in export_config(
        plain.best.config, "hf", evidence=recommendation(plain)
    )


def test_without_a_cost_the_times_alone():
    result = _result(Plan("planned_samples", STEPS * 32))
    assert (
        "planned run of 3,200,000 samples: baseline 2 h 47 min, recommended 1 h 33 min: "
        "saves 1 h 13 min"
    ) in _terminal(result)
