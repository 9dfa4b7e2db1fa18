"""The window's telemetry in every view: the progress line, the summary table and lines,
best_config.yaml, report.json and the HTML page show joules per sample (or token),
samples per joule, NVML's device memory beside the peak, and the throttled flag, where
they were measured; a study without them shows nothing of them, and a machine that cannot
read energy says so once."""

from __future__ import annotations

import io
from dataclasses import replace

import pytest
from rich.console import Console

from autotune import Config, Measurement, TrialRecord, TuneResult, export_config
from autotune.output.console import ConsoleReporter, print_summary
from autotune.output.html import render_html
from autotune.output.report import report_data
from autotune.planned import Plan, Projection
from autotune.results import BASELINE, REPEAT, SEARCH, recommendation

GIB = 2**30
GPU = {"device": "cuda", "energy_unavailable": ""}
NO_RAPL = {
    "device": "cpu",
    "energy_unavailable": "no /sys/class/powercap (no RAPL on this machine)",
}


def _m(rate, **kw):
    return Measurement(
        status="ok", samples_per_s=rate, samples_per_step=32, peak_mem_bytes=7 * GIB, **kw
    )


def _result(environment=GPU, measured=True) -> TuneResult:
    """Baseline 100 samples/s at 4 J a sample; the recommendation 250 samples/s at 1.2 J,
    NVML 9 GiB for the process, throttled at the power cap."""
    tele = [{}, {}]
    if measured:
        tele = [
            {"joules_per_sample": 4.0, "energy_source": "nvml counter", "throttled": []},
            {
                "joules_per_sample": 1.25,
                "energy_source": "nvml counter",
                "throttled": ["sw_power_cap"],
                "gpu_proc_mem_max_bytes": 9 * GIB,
            },
        ]
    trials = [
        TrialRecord(0, Config(batch_size=16), _m(100.0, **tele[0]), 100.0, BASELINE),
        TrialRecord(1, Config(batch_size=32), _m(250.0, **tele[1]), 250.0),
    ]
    return TuneResult.from_trials("s", "memory", trials, environment=environment, global_batch=32)


def _terminal(result: TuneResult) -> str:
    out = io.StringIO()
    print_summary(result, Console(file=out, width=300, highlight=False))
    return out.getvalue()


def test_every_view_shows_energy_per_sample_and_the_throttle():
    result = _result()
    text = _terminal(result)
    assert (
        "energy (nvml counter): #1 1.25 J/sample (0.8 samples/J) · baseline #0 4 J/sample" in text
    )
    assert "throttled: the GPU slowed its clock during the window of #1 (sw_power_cap)" in text
    assert "7.0 GiB (NVML 9.0 GiB)" in text  # the table's memory: the peak and NVML's figure
    assert "NVML: 9.0 GiB on the device for the process (9.0 GiB judged)" in text
    measured = recommendation(result)["measured"]
    assert measured["joules_per_sample"] == 1.25 and measured["throttled"] == ["sw_power_cap"]
    assert measured["gpu_proc_mem_max_bytes"] == 9 * GIB
    rows = {row["number"]: row for row in report_data(result, {})["trials"]}
    assert rows[1]["samples_per_joule"] == pytest.approx(0.8)
    assert rows[1]["judged_mem_bytes"] == 9 * GIB and rows[1]["throttled"] == ["sw_power_cap"]
    assert "judged_mem_bytes" not in rows[0]  # no NVML figure: only the peak
    page = render_html(result, {}, {}, [])
    assert "1.25 J/sample (0.8 samples/J)" in page and "(throttled: sw_power_cap)" in page


def test_the_progress_line_shows_energy_and_the_throttle():
    out = io.StringIO()
    reporter = ConsoleReporter(Console(file=out, width=300, highlight=False))
    result = _result()
    for record in result.trials:
        reporter.trial(record, result.best, result.baseline, 1, 2)
    lines = out.getvalue().splitlines()
    assert "| 4 J/sample (0.25 samples/J) | ok" in lines[0]
    assert "| 1.25 J/sample (0.8 samples/J) | throttled: sw_power_cap | ok" in lines[1]


def test_a_study_without_energy_shows_nothing_of_it():
    result = _result({"device": "cpu"}, measured=False)  # or stored before the telemetry
    text = _terminal(result)
    assert "J/sample" not in text and "energy" not in text and "throttled" not in text
    assert "joules_per_sample" not in recommendation(result)["measured"]
    assert "samples_per_joule" not in report_data(result, {})["trials"][0]
    assert "energy" not in render_html(result, {}, {}, [])


def test_a_machine_without_energy_says_so_once():
    result = _result(NO_RAPL, measured=False)
    text = _terminal(result)
    assert text.count("energy: not available here: no /sys/class/powercap") == 1
    assert text.count("energy") == 1
    assert report_data(result, {})["energy_unavailable"] == NO_RAPL["energy_unavailable"]


# The planned run's energy: 3,600,000 samples, the baseline at 4 J a sample (4 kWh), the
# recommendation at 1.25 J (1.25 kWh), a kWh at 0.32.
PLANNED = Plan("planned_samples", 3_600_000, None, 0.32)
ENERGY_LINE = (
    "planned run's energy (training device, steady-state steps) at 0.32 a kWh: "
    "baseline 4 kWh (1.28), recommended 1.25 kWh (0.40): saves 2.75 kWh, 0.88"
)


def _planned(plan, environment=GPU, measured=True) -> TuneResult:
    return replace(_result(environment, measured), plan=plan)


def test_the_planned_run_gives_its_kwh_and_their_cost_in_every_view(tmp_path):
    """Would catch the recommendation's kWh taken at the baseline's joules, J -> kWh by
    3,600 instead of 3,600,000, or the cost missing from a view."""
    result = _planned(PLANNED)
    assert ENERGY_LINE in _terminal(result)
    page = render_html(result, {}, {}, [])
    assert "at 0.32 a kWh" in page and ENERGY_LINE.partition("kWh: ")[2] in page
    run = report_data(result, {})["planned_run"]
    assert (run["baseline_kwh"], run["recommended_kwh"], run["saved_kwh"]) == (4.0, 1.25, 2.75)
    assert (run["baseline_energy_cost"], run["saved_energy_cost"]) == (1.28, 0.88)
    assert recommendation(result)["planned_run"] == run  # best_config.yaml
    header = export_config(result.best.config, "hf", evidence=recommendation(result))
    assert ENERGY_LINE in header


def test_without_a_price_the_kwh_alone_and_without_energy_one_line_and_no_number():
    """Would catch a number invented where energy was not measured (a 0 kWh), or the
    missing energy said twice."""
    no_price = _planned(Plan("planned_samples", 3_600_000))
    assert "planned run's energy (training device, steady-state steps): baseline 4 kWh, " in (
        _terminal(no_price)
    )
    result = _planned(PLANNED, NO_RAPL, measured=False)
    text = _terminal(result)
    assert sum("energy" in line for line in text.splitlines()) == 1 and "kWh" not in text
    assert (
        "energy: not available here: no /sys/class/powercap (no RAPL on this machine) "
        "(the planned run's energy is not projected)" in text
    )
    run = report_data(result, {})["planned_run"]
    assert "baseline_kwh" not in run and "baseline_energy_cost" not in run


def test_a_side_without_energy_is_not_projected_and_says_which():
    """The recommendation ran where its energy could not be read (several ranks): the
    line says so and gives no kWh for either side."""
    result = _planned(PLANNED)
    best = result.best
    unread = replace(best.measurement, joules_per_sample=None, energy_source=None)
    result = replace(result, best=replace(best, measurement=unread))
    line = (
        "planned run's energy (training device, steady-state steps) at 0.32 a kWh: "
        "not projected: the recommendation's energy was not measured"
    )
    assert line in _terminal(result)
    run = report_data(result, {})["planned_run"]
    assert run["energy_missing"] == "the recommendation's energy was not measured"
    assert "recommended_kwh" not in run and "baseline_kwh" not in run


def _confirmed_with_throttles() -> TuneResult:
    """The baseline (#0), the winner (#1, its search run throttled hw_thermal) and a
    runner-up (#2) in three paired rounds; the winner's rounds 0 and 2 and the baseline's
    round 1 throttled."""
    base, win, up = Config(batch_size=8), Config(batch_size=16), Config(batch_size=32)
    throttles = {1: ["hw_thermal"], 4: ["sw_power_cap"], 6: ["hw_slowdown"], 10: ["sw_power_cap"]}

    def run(n, config, rate, role, round_=None, of=None):
        m = _m(rate, throttled=throttles.get(n, []))
        return TrialRecord(n, config, m, rate, role, repeat_of=of, round=round_)

    trials = [run(0, base, 100.0, BASELINE), run(1, win, 200.0, SEARCH), run(2, up, 150.0, SEARCH)]
    for r in range(3):
        n = 3 + 3 * r
        trials += [
            run(n, base, 100.0, REPEAT, r, 0),
            run(n + 1, win, 200.0, REPEAT, r, 1),
            run(n + 2, up, 150.0, REPEAT, r, 2),
        ]
    confirmation = {"finalists": [1, 2]}
    return TuneResult.from_trials("s", "memory", trials, confirmation, environment=GPU)


def test_the_verdict_notes_the_throttled_runs_of_the_configs_it_compares():
    """Would catch the runs counted beyond those the figures are medians of (the
    winner's throttled search run), or the baseline every ratio is over left out."""
    result = _confirmed_with_throttles()
    assert result.best.number == 1 and result.best.ratios
    note = (
        "verdict measured while the GPU throttled: the recommendation #1: 2 of its 3 paired "
        "runs throttled (sw_power_cap: #4, #10); the baseline #0: 1 of its 3 paired runs "
        "throttled (hw_slowdown: #6). The ratios between them carry the clock's noise"
    )
    assert note in _terminal(result)
    assert "runner-up" not in _terminal(result)  # none of its runs throttled
    measured = recommendation(result)["measured"]
    assert measured["throttled_runs"] == [4, 10] and measured["runs"] == 3
    verdict = report_data(result, {})["throttled_verdict"]
    assert [(v["role"], v["throttled_runs"]) for v in verdict] == [
        ("the recommendation", [4, 10]),
        ("the baseline", [6]),
    ]
    assert "2 of its 3 paired runs throttled (sw_power_cap: #4, #10)" in render_html(
        result, {}, {}, []
    )
    assert report_data(_result(), {})["throttled_verdict"][0]["throttled_runs"] == [1]


def test_an_energy_study_projects_the_recommendations_time_from_its_own_rate():
    """Its printed ratio is samples/J over samples/J (3.2x here), not a speedup: would
    catch the planned run's time divided by it."""
    result = _planned(PLANNED)
    values = {0: 0.25, 1: 0.8}  # samples per joule: the energy objective's values
    trials = [replace(t, value=values[t.number]) for t in result.trials]
    energy = TuneResult.from_trials(
        "s", "memory", trials, environment=GPU, global_batch=32, plan=PLANNED, objective="energy"
    )
    assert energy.speedup == pytest.approx(3.2) and energy.best.number == 1
    p = energy.projection
    assert p.baseline_s == pytest.approx(36_000) and p.recommended_s == pytest.approx(14_400)
    assert (p.baseline_kwh, p.recommended_kwh) == (pytest.approx(4.0), pytest.approx(1.25))
    assert Projection.from_dict(p.to_dict()) == p  # best_config.yaml reads back alike
    assert "energy efficiency over baseline (trial #0" in _terminal(energy)
    assert "3.20x (0.25 -> 0.8 samples/J)" in _terminal(energy)
