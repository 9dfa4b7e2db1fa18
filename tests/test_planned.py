"""The planned run: its length in steps, the projection of baseline and recommendation
from the figures the speedup uses, and the durations a person reads."""

from __future__ import annotations

import pytest
import yaml

from autotune import Config, Measurement, TrialRecord, TuneResult
from autotune.planned import Plan, Projection, duration_text, project
from autotune.results import BASELINE, REPEAT, SEARCH, write_best_config
from autotune.space_file import parse_space
from autotune.study.scoring import objective

P = 100_000  # planned optimizer steps
SPS = 32  # samples per step (fixed global batch)


def _trial(**planned):
    return parse_space({"workload": "m:f", "trial": planned}).trial


def _m(rate: float, compile_s: float | None = None, cache: str | None = None) -> Measurement:
    return Measurement(
        status="ok",
        samples_per_s=rate,
        samples_per_step=SPS,
        compile_s=compile_s,
        compile_cache=cache,
    )


def _run(number, config, m, trial, role=SEARCH, round_=None, repeat_of=None, cold=None):
    """A trial record whose value is the study's objective (the cold compile charged to a
    warm-cache repeat, as the tuner does)."""
    return TrialRecord(
        number,
        config,
        m,
        objective(m, trial, cold),
        role,
        repeat_of=repeat_of,
        round=round_,
    )


BASE = Config(batch_size=8)
FAST = Config(batch_size=8, compile_mode="default")


def _study(trial, base_rates, fast_rates, base_compile=None):
    """The baseline and a compiled config: a search run each (cold caches), then three
    paired rounds whose compiled runs hit the warm cache (5 s, charged the cold 600 s)."""
    cache = "cold" if base_compile else None
    trials = [
        _run(0, BASE, _m(base_rates[0], base_compile, cache), trial, BASELINE),
        _run(1, FAST, _m(fast_rates[0], 600.0, "cold"), trial),
    ]
    n = 2
    for r in range(3):
        base_m = _m(base_rates[r + 1], 5.0 if base_compile else None, "warm" if cache else None)
        trials.append(_run(n, BASE, base_m, trial, REPEAT, r, 0, base_compile))
        trials.append(
            _run(n + 1, FAST, _m(fast_rates[r + 1], 5.0, "warm"), trial, REPEAT, r, 1, 600.0)
        )
        n += 2
    return TuneResult.from_trials(
        "s", "memory", trials, {"finalists": [1]}, plan=Plan.of(trial), global_batch=256
    )


def test_the_planned_length_in_steps_of_each_kind():
    """Would catch samples or tokens counted per sample instead of per step, or a token
    length divided by samples."""
    assert Plan.of(_trial(planned_steps=500)).steps(32, 4000) == 500
    assert Plan.of(_trial(planned_samples=64_000)).steps(32, 4000) == 2000
    assert Plan.of(_trial(planned_tokens=8_000_000)).steps(32, 4000) == 2000
    assert Plan.of(_trial(planned_tokens=8_000_000)).steps(32, None) is None
    assert Plan.of(_trial()) is None
    assert Plan.of(_trial(cost_per_hour=3.0)) is None  # a cost alone projects nothing


def test_projection_agrees_with_the_speedup_after_paired_rounds():
    """The baseline's time comes from its medians over the rounds, the recommendation's is
    it over the printed speedup (the median of the paired ratios). Would catch the
    recommendation's own medians (a ratio that disagrees with the speedup), the search
    run (a lucky 900 samples/s) or a mean over the rounds instead of the median."""
    trial = _trial(planned_steps=P, cost_per_hour=12.0)
    result = _study(trial, [320, 300, 320, 400], [900, 600, 700, 650])
    assert result.best.number == 1 and result.best.ratios  # the compiled config, paired
    p = result.projection
    assert p.baseline_s == pytest.approx(P * SPS / 320)  # median of 300, 320, 400
    assert p.baseline_s / p.recommended_s == pytest.approx(result.speedup)
    assert result.best.value / result.baseline.value != pytest.approx(result.speedup)
    assert p.saved_s == pytest.approx(p.baseline_s - p.recommended_s)
    assert p.cost(p.baseline_s) == pytest.approx(p.baseline_s / 3600 * 12.0)
    # the baseline's time is what its objective amortises: P steps' samples at its value
    assert p.baseline_s == pytest.approx(P * SPS / result.baseline.value)


def test_a_warm_cache_repeat_is_charged_the_cold_compile():
    """A compiled baseline whose rounds hit a warm cache (5 s) still compiles for 600 s on
    the real run: would catch the warm figure, or the median of the compile times."""
    trial = _trial(planned_steps=1000)
    result = _study(trial, [320, 320, 320, 320], [640, 640, 640, 640], base_compile=600.0)
    p = result.projection
    assert p.baseline_s == pytest.approx(600.0 + 1000 * SPS / 320)
    assert p.baseline_s / p.recommended_s == pytest.approx(result.speedup)


def test_a_single_run_projects_its_cold_compile_and_steady_rate():
    """Without confirmation the speedup is the ratio of values, and each side is its own
    cold compile plus the planned steps at its steady rate."""
    trial = _trial(planned_steps=P)
    trials = [
        _run(0, BASE, _m(320.0), trial, BASELINE),
        _run(1, FAST, _m(640.0, 600.0, "cold"), trial),
    ]
    result = TuneResult.from_trials("s", "memory", trials, plan=Plan.of(trial))
    p = result.projection
    assert p.baseline_s == pytest.approx(P * SPS / 320)
    assert p.recommended_s == pytest.approx(600.0 + P * SPS / 640)


def test_the_baseline_recommended_saves_nothing_and_says_so():
    trial = _trial(planned_steps=P, cost_per_hour=2.0)
    result = TuneResult.from_trials(
        "s", "memory", [_run(0, BASE, _m(320.0), trial, BASELINE)], plan=Plan.of(trial)
    )
    p = result.projection
    assert p.same and p.saved_s == 0 and p.recommended_s == p.baseline_s
    assert "the recommendation is the baseline: saves nothing (0 s)" in p.text()


def test_no_plan_no_speedup_no_projection():
    trial = _trial()
    trials = [_run(0, BASE, _m(320.0), trial, BASELINE), _run(1, FAST, _m(640.0), trial)]
    assert TuneResult.from_trials("s", "memory", trials).projection is None
    plan = Plan("planned_steps", 10)
    assert project(plan, _m(320.0), None) is None  # the baseline did not run cleanly
    assert project(None, _m(320.0), 2.0) is None


def test_samples_and_tokens_of_a_token_workload():
    """planned_samples counts samples even where the objective counts tokens: would catch
    a samples length divided by tokens per step."""
    m = Measurement(
        status="ok",
        unit="tokens",
        samples_per_s=80.0,
        tokens_per_s=40_000.0,
        samples_per_step=8,
        tokens_per_step=4000.0,
    )  # 0.1 s a step
    samples = project(Plan("planned_samples", 80_000), m, 2.0)
    tokens = project(Plan("planned_tokens", 40_000_000), m, 2.0)
    assert samples.baseline_s == pytest.approx(1000.0) == tokens.baseline_s


def test_the_summary_line_in_words_and_two_decimals():
    p = Projection(Plan("planned_steps", 100_000, 11.84), 45_000.0, 22_800.0)
    assert p.label == "planned run of 100,000 steps at 11.84 an hour"
    assert p.text() == (
        "baseline 12 h 30 min (148.00), recommended 6 h 20 min (74.99): saves 6 h 10 min, 73.01"
    )
    assert Projection.from_dict(p.to_dict()) == p
    slower = Projection(Plan("planned_samples", 10), 60.0, 90.0)
    assert slower.text() == "baseline 1 min 0 s, recommended 1 min 30 s: takes longer by 30 s"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.04, "0.0 s"),
        (4.24, "4.2 s"),
        (42.4, "42 s"),
        (59.6, "1 min 0 s"),
        (185, "3 min 5 s"),
        (3599.6, "1 h 0 min"),
        (22_200, "6 h 10 min"),
        (86_399, "1 d 0 h"),
        (183_600, "2 d 3 h"),
        (-90, "-1 min 30 s"),
    ],
)
def test_durations_for_a_person(seconds, text):
    """Would catch '59 min 60 s' at a boundary and a unit change in the wrong place."""
    assert duration_text(seconds) == text


def test_best_config_yaml_carries_the_planned_run_only_when_planned(tmp_path):
    trial = _trial(planned_steps=P, cost_per_hour=12.0)
    result = _study(trial, [320, 300, 320, 400], [900, 600, 700, 650])
    data = yaml.safe_load(write_best_config(result, tmp_path / "a.yaml").read_text())
    run = data["planned_run"]
    assert (run["length"], run["unit"], run["cost_per_hour"]) == (P, "steps", 12.0)
    p = result.projection
    assert run["baseline_s"] == round(p.baseline_s, 1)
    assert run["saved_cost"] == round(p.cost(p.saved_s), 2)
    assert run["recommended_cost"] == round(p.cost(p.recommended_s), 2)
    plain = _study(_trial(), [320, 300, 320, 400], [900, 600, 700, 650])
    data = yaml.safe_load(write_best_config(plain, tmp_path / "b.yaml").read_text())
    assert "planned_run" not in data
