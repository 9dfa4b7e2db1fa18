"""MFU end to end: a real study of a model of known FLOPs, read back from storage."""

from __future__ import annotations

import pytest
import workloads

from autotune import load_space, tune
from autotune.study.storage import load_result


def test_a_stored_mfu_is_the_flops_per_second_over_the_measured_peak(write_space, tmp_path):
    space = load_space(
        write_space("""
        workload: {workloads}:linear_stack
        knobs: {batch_size: [16, 32]}
        baseline: {batch_size: 16}
        global_batch: 32
        trial: {warmup_steps: 1, measured_steps: 4}
        budget: {n_trials: 2}
        search: {sampler: grid, confirm_top: 0, prune: false}
    """)
    )
    storage = f"sqlite:///{tmp_path}/s.db"
    tune(space, storage=storage, out_dir=tmp_path / "runs")
    _, result = load_result(space, storage)  # everything from storage
    env = result.environment
    flops = env["model_flops"]
    widths = workloads.LINEAR_WIDTHS
    weights = [a * b for a, b in workloads.pairs(widths)]
    per_sample = 6 * sum(weights) - 2 * weights[0]  # forward 2W, backward 4W less dL/dx
    assert flops["unit"] == "samples" and flops["per_unit"] == pytest.approx(per_sample, rel=0.01)
    peak = env["peak_flops"]["fp32"]["flops_per_s"]
    assert peak > 1e8 and env["peak_flops"]["fp32"]["size"] >= 256
    for t in result.trials:
        found = result.mfu(t)
        assert t.status == "ok", t.reason
        assert found.flops_per_s == pytest.approx(flops["per_unit"] * t.measurement.samples_per_s)
        assert found.mfu == pytest.approx(found.flops_per_s / peak)
        assert found.peak == "fp32" and 0 < found.mfu < 1
