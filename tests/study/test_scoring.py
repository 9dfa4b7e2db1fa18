"""The verdict on a measurement (memory, accuracy, NaN) and the objective."""

from __future__ import annotations

import pytest

from autotune import Measurement
from autotune.space_file import parse_space
from autotune.study.scoring import judge, objective, rate_objective


def _space(**limits):
    return parse_space({"workload": "m:f", "limits": limits})


def _m(**kw):
    return Measurement(**{"status": "ok", "samples_per_s": 100.0, **kw})


def test_judge_accuracy_tolerance_and_divergence():
    space = _space(accuracy={"tolerance": 0.05, "last_k": 2})
    ref = [2.0, 1.5, 1.0, 1.0]
    assert judge(_m(losses=[2.0, 1.5, 1.02, 1.03]), space, reference=ref).status == "ok"
    v = judge(_m(losses=[2.0, 1.5, 1.2, 1.2]), space, reference=ref)
    assert v.status == "accuracy" and "deviates 20.0%" in v.reason
    assert v.constraints["accuracy"] > 0
    v = judge(_m(losses=[2.0, 50.0, 1.0, 1.0]), space, reference=ref)
    assert v.status == "accuracy" and "diverged" in v.reason
    v = judge(
        _m(status="nan", reason="loss is nan at step 2", losses=[2.0, float("nan")]),
        space,
        reference=ref,
    )
    assert v.status == "nan" and v.constraints["accuracy"] == 1.0


def test_judge_free_batch_checks_only_nan_and_divergence():
    space = parse_space({"workload": "m:f", "global_batch": "free"})
    assert judge(_m(losses=[2.0, 1.9]), space, reference=[2.0, 0.5]).status == "ok"


@pytest.mark.parametrize(
    ("m", "status", "text"),
    [
        (_m(peak_mem_bytes=3000), "over-memory", "exceeds the budget"),
        (_m(peak_mem_bytes=1000, alloc_retries=2), "over-memory", "allocator retried 2 times"),
        (_m(peak_mem_bytes=1000, alloc_retries=0), "ok", ""),
        (Measurement(status="oom", reason="CUDA out of memory"), "oom", "out of memory"),
        (Measurement(status="timeout", reason="no result"), "timeout", "no result"),
    ],
)
def test_judge_memory(m, status, text):
    v = judge(m, _space(memory=2000), memory_budget_bytes=2000)
    assert v.status == status and text in v.reason
    assert (v.constraints["memory"] > 0 or v.constraints["failed"] > 0) == (status != "ok")


def test_planned_steps_charges_the_compile_time_once():
    """With planned_steps P the objective is P * samples_per_step / (compile_s + P * step_s):
    a 90 s compile that saves 2% per step loses on a 500-step run, wins on a long one."""
    short = parse_space({"workload": "m:f", "trial": {"planned_steps": 500}}).trial
    long = parse_space({"workload": "m:f", "trial": {"planned_steps": 500_000}}).trial
    eager = _m(samples_per_s=100.0, samples_per_step=10, compile_s=0.0)
    compiled = _m(samples_per_s=102.0, samples_per_step=10, compile_s=90.0)
    # 500 steps of 0.1 s: 50 s eager; 90 s + 49.0 s compiled
    assert objective(eager, short) == pytest.approx(100.0)
    assert objective(compiled, short) == pytest.approx(5000 / (90 + 500 * 10 / 102))
    assert objective(compiled, short) < objective(eager, short)
    assert objective(compiled, long) > objective(eager, long)
    # the pruner's estimate uses the same formula
    assert rate_objective(102.0, 90.0, 10, short) == objective(compiled, short)
    # without planned_steps the objective is the throughput, compile apart
    plain = parse_space({"workload": "m:f"}).trial
    assert objective(compiled, plain) == 102.0


def test_planned_samples_and_tokens_amortise_compile_like_the_equivalent_steps():
    """planned_samples S (or planned_tokens T) is planned_steps S / samples_per_step (T /
    tokens_per_step): would catch a length taken as steps, or samples divided by the
    tokens the objective counts."""

    def trial(**planned):
        return parse_space({"workload": "m:f", "trial": planned}).trial

    compiled = _m(samples_per_s=102.0, samples_per_step=10, compile_s=90.0)
    steps = objective(compiled, trial(planned_steps=500))
    assert objective(compiled, trial(planned_samples=5000)) == pytest.approx(steps)
    assert steps < 102.0  # the compile is charged
    tokens = Measurement(
        status="ok",
        unit="tokens",
        samples_per_s=102.0,
        tokens_per_s=51_000.0,
        samples_per_step=10,
        tokens_per_step=5000.0,
        compile_s=90.0,
    )
    by_steps = objective(tokens, trial(planned_steps=500))
    assert by_steps < 51_000.0
    assert objective(tokens, trial(planned_samples=5000)) == pytest.approx(by_steps)
    assert objective(tokens, trial(planned_tokens=2_500_000)) == pytest.approx(by_steps)
    # the pruner and `autotune verify` pass the counts the same way
    samples = trial(planned_samples=5000)
    assert rate_objective(
        51_000.0, 90.0, 5000.0, samples, samples_per_step=10, tokens_per_step=5000.0
    ) == pytest.approx(by_steps)


def test_the_memory_limit_judges_nvmls_figure_of_the_process_and_names_both():
    gib = 2**30
    m = _m(peak_mem_bytes=7 * gib, gpu_proc_mem_max_bytes=9 * gib)  # context, workspaces
    verdict = judge(m, _space(), memory_budget_bytes=8 * gib)
    assert verdict.status == "over-memory"
    assert verdict.reason == (
        "device memory 9216 MiB (NVML, this process; allocator peak 7168 MiB) "
        "exceeds the budget 8192 MiB"
    )
    assert verdict.constraints["memory"] == pytest.approx(1 / 8)
    without = judge(m.replace(gpu_proc_mem_max_bytes=None), _space(), memory_budget_bytes=8 * gib)
    assert without.status == "ok" and without.constraints["memory"] == pytest.approx(-1 / 8)
    sampled_low = m.replace(gpu_proc_mem_max_bytes=6 * gib, peak_mem_bytes=9 * gib)
    verdict = judge(sampled_low, _space(), memory_budget_bytes=8 * gib)  # a peak NVML missed
    assert verdict.reason == "peak memory 9216 MiB exceeds the budget 8192 MiB"
