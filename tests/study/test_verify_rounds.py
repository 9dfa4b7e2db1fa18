"""autotune.study.verify without processes: the paired rounds' order, the observed speedup
(median of per-round ratios), the error, failed runs and the planned-run objective.

A fake ``run`` answers each run with a fixed throughput per config; the real process
path is in tests/e2e/test_verify.py.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import replace
from pathlib import Path

import pytest

from autotune.config import Config
from autotune.errors import ArgumentError, StorageError
from autotune.measurement import Measurement
from autotune.output.verify_view import verification_lines
from autotune.results import BASELINE, TrialRecord, TuneResult
from autotune.space import Space, TrialSettings
from autotune.study.verify import RECOMMENDED, verify_result
from autotune.trial_spec import TrialSpec

SPACE = Space(
    workload="tests/workloads.py:tiny",
    knobs={"batch_size": (8, 32)},
    baseline=Config(batch_size=8, accumulation_steps=4),
    trial=TrialSettings(warmup_steps=1, measured_steps=4, timeout_s=30),
    global_batch=32,
)


def _record(number: int, config: Config, value: float, role: str = "search") -> TrialRecord:
    m = Measurement(status="ok", samples_per_s=value, samples_per_step=32, measured_steps=4)
    return TrialRecord(number=number, config=config, measurement=m, value=value, role=role)


def _result(base_value: float = 100.0, best_value: float = 250.0) -> TuneResult:
    base = _record(0, SPACE.baseline, base_value, BASELINE)
    best = _record(1, Config(batch_size=32), best_value)
    return TuneResult("fake", "memory", [base, best], baseline=base, best=best)


class FakeRun:
    """Answers a run with the samples/s listed for its batch size, one per call."""

    def __init__(self, rates: dict[int, list[float]], compile_s: dict[int, float] | None = None):
        self.rates = {k: list(v) for k, v in rates.items()}
        self.compile_s = compile_s or {}  # seconds a batch size's warm-up spends compiling
        self.calls: list[tuple[dict, Path, float]] = []

    def __call__(self, spec: TrialSpec, folder: Path, timeout_s: float, cap: int | None) -> dict:
        self.calls.append((spec, folder, timeout_s))
        rate = self.rates[spec.config.batch_size].pop(0)
        if rate is None:
            return {"status": "failed", "reason": "RuntimeError: boom"}
        steps = spec.measured_steps
        return {
            "status": "ok",
            "samples_per_s": rate,
            "tokens_per_s": None,
            "steps": steps,
            "window_s": steps * 32 / rate,
            "warmup_steps": spec.warmup_steps,
            "warmup_s": 32 / rate + self.compile_s.get(spec.config.batch_size, 0.0),
            "wall_s": 1.0,
        }


def test_rounds_alternate_and_the_error_is_observed_over_predicted(tmp_path):
    fake = FakeRun({8: [100.0, 110.0, 90.0], 32: [260.0, 270.0, 230.0]})
    v = verify_result(SPACE, _result(), tmp_path, rounds=3, steps_factor=5, run=fake)
    order = [(r.round, r.role) for r in v.runs]
    assert order == [
        (1, "baseline"),
        (1, "recommended"),
        (2, "recommended"),
        (2, "baseline"),
        (3, "baseline"),
        (3, "recommended"),
    ]
    assert [spec.measured_steps for spec, _, _ in fake.calls] == [20] * 6  # 5x the 4 measured steps
    assert [timeout for _, _, timeout in fake.calls] == [150] * 6  # 5x the trial's 30 s
    ratios = [2.6, 270.0 / 110.0, 230.0 / 90.0]
    assert [ratio for _, ratio in v.ratios()] == pytest.approx(ratios)
    assert v.predicted == pytest.approx(2.5)
    assert v.observed == pytest.approx(statistics.median(ratios))
    assert v.error == pytest.approx(statistics.median(ratios) / 2.5 - 1)
    assert v.within_tolerance is True  # every round within 5% of 2.5: resolved in 3
    assert v.verdict == "within" and v.rounds == 3
    data = json.loads((tmp_path / "verify.json").read_text())
    assert data["order"] == [list(o) for o in order]
    assert data["observed_speedup"] == pytest.approx(v.observed)
    assert data["error"] == pytest.approx(v.error)
    assert v.spread == pytest.approx((2.6 - 270.0 / 110.0) / 2 / statistics.median(ratios))
    assert data["spread"] == pytest.approx(v.spread)
    lines = verification_lines(v)
    assert (
        "error: +2.2% (observed / predicted - 1); within the ±5% goal: the error's interval "
        "-1.8%..+4.0% (sign test, 87.5% each side), 3 rounds"
    ) in lines
    assert not any(line.startswith("note: the rounds") for line in lines)  # ±4.1%
    assert any(line.startswith("round 2: baseline 110.0 · recommended 270.0") for line in lines)
    assert any(line.endswith("(recommended first)") for line in lines)


def test_a_failed_run_drops_its_round_and_is_reported(tmp_path):
    fake = FakeRun({8: [100.0, 100.0], 32: [None, 300.0]})
    v = verify_result(SPACE, _result(), tmp_path, rounds=2, max_rounds=2, steps_factor=1, run=fake)
    assert [n for n, _ in v.ratios()] == [2]
    assert v.observed == pytest.approx(3.0)
    failed = next(r for r in v.runs if not r.ok)
    assert (failed.round, failed.role, failed.reason) == (1, RECOMMENDED, "RuntimeError: boom")
    lines = verification_lines(v)
    assert any("recommended failed" in line and "no ratio" in line for line in lines)


def test_no_complete_round_leaves_observed_and_error_empty(tmp_path):
    fake = FakeRun({8: [None], 32: [200.0]})
    v = verify_result(SPACE, _result(), tmp_path, rounds=1, max_rounds=1, steps_factor=1, run=fake)
    assert v.observed is None and v.error is None
    assert "observed speedup: - (no round completed both runs)" in verification_lines(v)


def test_planned_steps_compares_the_planned_runs_like_the_study(tmp_path):
    space = replace(SPACE, trial=replace(SPACE.trial, planned_steps=10))
    fake = FakeRun({8: [100.0], 32: [200.0]})
    v = verify_result(space, _result(), tmp_path, rounds=1, max_rounds=1, steps_factor=1, run=fake)
    base, rec = sorted(v.runs, key=lambda r: r.role)
    # the fake's warm-up is one steady step: no compile time, so the objective is the rate
    assert (base.value, rec.value) == pytest.approx((100.0, 200.0))
    assert any(line.startswith("note: planned_steps is 10") for line in verification_lines(v))


def test_planned_steps_charge_the_compile_to_the_planned_run(tmp_path):
    """With a planned length, a run's value is the planned run's mean throughput: its
    compile (the warm-up beyond a steady step) spread over ``planned_steps``. A 5 s compile
    over 10 steps of 0.16 s: 320 samples in 6.6 s, 48.5 samples/s, not the 200 of the
    window; a verify that ignored the planned length would observe 2x, not 0.48x."""
    space = replace(SPACE, trial=replace(SPACE.trial, planned_steps=10))
    fake = FakeRun({8: [100.0], 32: [200.0]}, compile_s={32: 5.0})
    v = verify_result(space, _result(), tmp_path, rounds=1, max_rounds=1, steps_factor=1, run=fake)
    base, rec = sorted(v.runs, key=lambda r: r.role)
    assert base.value == pytest.approx(100.0)
    assert rec.rate == pytest.approx(200.0)
    assert rec.value == pytest.approx(10 * 32 / (10 * 32 / 200.0 + 5.0))
    assert v.observed == pytest.approx(rec.value / 100.0)


def test_the_baseline_as_recommendation_runs_nothing(tmp_path):
    base = _record(0, SPACE.baseline, 100.0, BASELINE)
    result = TuneResult("fake", "memory", [base], baseline=base, best=base)
    fake = FakeRun({})
    v = verify_result(SPACE, result, tmp_path, run=fake)
    assert v.same_config and v.runs == [] and fake.calls == []
    assert "nothing to verify" in verification_lines(v)[0]


def test_an_infeasible_baseline_or_no_best_is_a_one_line_error(tmp_path):
    result = _result()
    bad = replace(result.baseline, status="oom", reason="CUDA out of memory")
    with pytest.raises(StorageError, match="baseline of study 'fake' was not feasible"):
        verify_result(SPACE, replace(result, baseline=bad), tmp_path, run=FakeRun({}))
    with pytest.raises(StorageError, match="no feasible config"):
        verify_result(SPACE, replace(result, best=None), tmp_path, run=FakeRun({}))


@pytest.mark.parametrize(
    "kwargs", [{"rounds": 0}, {"steps_factor": 0}, {"steps_factor": 1.5}, {"timeout_s": -1}]
)
def test_arguments_out_of_range(tmp_path, kwargs):
    with pytest.raises(ArgumentError):
        verify_result(SPACE, _result(), tmp_path, run=FakeRun({}), **kwargs)


def test_rounds_that_spread_wider_than_the_goal_say_the_verdict_is_not_to_be_read(tmp_path):
    """The CNN study's verify of 2026-12-05 (docs/confirmation.md): ratios 1.554, 1.602
    and 1.378 against a predicted 1.738, an error of -10.6% whose rounds alone spread
    ±7.2%; the next two verifies of the same study were -5.0% and -3.5%."""
    fake = FakeRun({8: [941.6, 1003.4, 880.9], 32: [1463.6, 1607.9, 1214.0]})
    v = verify_result(SPACE, _result(938.1, 1630.8), tmp_path, rounds=3, steps_factor=1, run=fake)
    assert v.error == pytest.approx(1.554 / 1.738 - 1, abs=1e-3)
    assert v.spread == pytest.approx((1.602 - 1.378) / 2 / 1.554, abs=1e-3)
    lines = verification_lines(v)
    assert "note: the rounds' ratios lay within ±7.2% of their median, wider than the ±5% " in (
        "".join(line for line in lines if line.startswith("note: the rounds"))
    )


def test_verify_adds_rounds_until_the_error_leaves_the_goals_edge(tmp_path):
    """Round 2's ratio (2.35, -6%) puts the error's interval across -5% after 3 rounds;
    from 6 rounds the sign test lets one round fall outside: within, after 6."""
    fake = FakeRun({8: [100.0] * 8, 32: [255.0, 235.0, 250.0, 252.0, 248.0, 251.0, 250.0, 250.0]})
    v = verify_result(SPACE, _result(), tmp_path, rounds=3, steps_factor=1, run=fake)
    assert v.rounds == 6 and len(v.runs) == 12 and v.verdict == "within"
    assert v.within_tolerance is True
    data = json.loads((tmp_path / "verify.json").read_text())
    assert data["verdict"] == "within" and data["rounds"] == 6 and data["min_rounds"] == 3


def test_verify_says_unresolved_at_its_cap_and_never_within(tmp_path):
    """Rounds alternating at +1% and -9%: the median error is -4% (inside the goal), but
    its interval crosses -5% at every count: unresolved at the cap, not "within"."""
    fake = FakeRun({8: [100.0] * 8, 32: [252.5, 227.5] * 4})
    v = verify_result(SPACE, _result(), tmp_path, rounds=3, max_rounds=5, steps_factor=1, run=fake)
    assert v.rounds == 5 and v.verdict == "unresolved" and v.within_tolerance is None
    assert abs(v.error) < 0.05  # the median alone would have called it within
    lines = verification_lines(v)
    (line,) = [x for x in lines if x.startswith("error:")]
    assert "unresolved after 5 rounds (--max-rounds)" in line and "within" not in line
