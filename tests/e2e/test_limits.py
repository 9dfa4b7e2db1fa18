"""Memory budget, accuracy guard and fixed global batch, with real trials."""

from __future__ import annotations

import optuna
import pytest

from autotune import Config, load_space, tune
from autotune.study.runner import run_trial

# The memory and fp16 tests run on the CPU everywhere and on CUDA where there is a GPU.
DEVICES = pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])


@DEVICES
def test_memory_budget_makes_large_batches_infeasible(write_space, tmp_path, device):
    probe_space = load_space(
        write_space(
            f"""
        workload: {{workloads}}:wide
        device: {device}
        trial: {{warmup_steps: 1, measured_steps: 2}}
    """,
            "probe.yaml",
        )
    )
    small = run_trial(probe_space, Config(batch_size=8), tmp_path / "small")
    large = run_trial(probe_space, Config(batch_size=2048), tmp_path / "large")
    assert small.ok and large.ok
    assert large.peak_mem_bytes > small.peak_mem_bytes + 50 * 2**20
    budget = (small.peak_mem_bytes + large.peak_mem_bytes) // 2

    space = write_space(f"""
        workload: {{workloads}}:wide
        device: {device}
        knobs: {{batch_size: [8, 2048]}}
        baseline: {{batch_size: 2048}}
        global_batch: free
        limits: {{memory: {budget}}}
        trial: {{warmup_steps: 1, measured_steps: 2}}
        budget: {{n_trials: 2}}
        search: {{confirm_top: 0}}
    """)
    result = tune(space, storage=f"sqlite:///{tmp_path}/s.db", out_dir=tmp_path / "runs")
    by_batch = {t.config.batch_size: t for t in result.trials}
    assert by_batch[2048].status == "over-memory"
    assert "exceeds the budget" in by_batch[2048].reason
    # The large batch is faster per sample, but the winner respects the budget.
    assert by_batch[2048].measurement.samples_per_s > by_batch[8].measurement.samples_per_s
    assert result.best.config.batch_size == 8
    assert 0 < result.headroom_bytes < budget
    study = optuna.load_study(study_name="space", storage=f"sqlite:///{tmp_path}/s.db")
    assert study.best_trial.params["batch_size"] == 8  # Optuna sees the constraint


@DEVICES
def test_fp16_overflow_is_rejected_while_bf16_and_fp32_pass(write_space, tmp_path, device):
    space = write_space(f"""
        workload: {{workloads}}:overflow
        device: {device}
        knobs: {{amp_dtype: [fp32, bf16, fp16]}}
        trial: {{warmup_steps: 1, measured_steps: 3}}
        budget: {{n_trials: 3}}
        search: {{confirm_top: 0}}
    """)
    result = tune(space, storage=f"sqlite:///{tmp_path}/s.db", out_dir=tmp_path / "runs")
    status = {t.config.amp_dtype: t for t in result.trials}
    assert status["fp32"].status == "ok" and status["bf16"].status == "ok"
    assert status["fp16"].status == "nan"
    assert "loss is" in status["fp16"].reason
    # GradScaler saw the overflow and skipped the steps instead of applying inf gradients.
    assert status["fp16"].measurement.skipped_steps > 0
    assert result.best.config.amp_dtype in ("fp32", "bf16")


def test_fixed_global_batch_and_reference_stored_once(write_space, tmp_path):
    space = write_space("""
        workload: {workloads}:tiny
        knobs: {batch_size: [4, 8, 16, 32, 64], amp_dtype: [fp32, bf16]}
        baseline: {batch_size: 16, amp_dtype: bf16}
        global_batch: 32
        trial: {warmup_steps: 1, measured_steps: 3}
        budget: {n_trials: 3}
        search: {confirm_top: 0, prune: false}  # every trajectory is checked in full
    """)
    storage = f"sqlite:///{tmp_path}/s.db"
    result = tune(space, storage=storage, out_dir=tmp_path / "runs")
    assert any("batch_size 64 dropped" in n for n in result.notes)
    for t in result.trials:
        assert t.config.batch_size * t.config.accumulation_steps == 32
    # The baseline is bf16, so the fp32 reference ran apart and is kept in the study.
    reference_dir = tmp_path / "runs" / "space" / "reference"
    assert (reference_dir / "result.json").exists()
    study = optuna.load_study(study_name="space", storage=storage)
    reference = study.user_attrs["reference"]
    assert reference["config"]["amp_dtype"] == "fp32" and len(reference["losses"]) == 4
    for t in result.trials:  # equal work per step: every trajectory tracks the reference
        assert t.status == "ok", t.reason

    # Resume with a larger budget: the reference is not run again.
    for f in reference_dir.iterdir():
        f.unlink()
    more = tune(space, n_trials=5, storage=storage, out_dir=tmp_path / "runs")
    assert len([t for t in more.trials if t.role != "duplicate"]) == 5
    assert not (reference_dir / "result.json").exists()
