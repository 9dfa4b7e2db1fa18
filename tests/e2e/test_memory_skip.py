"""A real study skips a config its own trials predict over the memory budget (rule 2 of
autotune.study.memory: the group's line, fitted on the batch sizes it measured)."""

from __future__ import annotations

import optuna

from autotune import load_space, tune
from autotune.measurement import PREDICTED_OVER_MEMORY
from autotune.study.sampling import encode

MiB = 2**20

# The `broad` MLP holds ~1 MiB of activations a sample: its peak RSS grows by about
# 0.5 GiB from batch 64 to 512, far above the RSS noise, and a line through those puts
# 4096 several GiB over a 1.5 GiB budget.
SPACE = """
    workload: {workloads}:broad
    knobs:
      batch_size: [64, 128, 256, 512, 4096]
    baseline: {batch_size: 64}
    global_batch: free
    limits: {memory: 1.5GiB, accuracy: off}
    trial: {warmup_steps: 1, measured_steps: 2, timeout_s: 120}
    search: {screening: false, confirm_top: 0, prune: false}
    budget: {n_trials: 5}
"""
BUDGET = 1536 * MiB


def test_the_largest_batch_is_skipped_once_the_line_is_known(write_space, tmp_path):
    space = load_space(write_space(SPACE))
    storage = f"sqlite:///{tmp_path}/study.db"
    tune(space, storage=storage, out_dir=tmp_path / "runs", n_trials=1)  # the baseline
    study = optuna.load_study(study_name=space.study.name, storage=storage)
    for batch_size in (128, 256, 512, 4096):  # the line first, then far past it
        study.enqueue_trial(encode(space, space.config_from({"batch_size": batch_size})))
    result = tune(space, storage=storage, out_dir=tmp_path / "runs")

    by_batch = {t.config.batch_size: t for t in result.trials}
    assert set(by_batch) == {64, 128, 256, 512, 4096}
    for batch_size in (64, 128, 256, 512):
        measured = by_batch[batch_size]
        assert measured.status == "ok", (batch_size, measured.reason)
        assert measured.measurement.peak_mem_bytes < BUDGET
    skipped = by_batch[4096]
    assert skipped.status == PREDICTED_OVER_MEMORY, skipped.reason
    assert skipped.measurement.peak_mem_bytes is None  # never ran: no measurement
    assert "> budget 1536 MiB" in skipped.reason
    # The study keeps the prediction that skipped it.
    stored = [t for t in study.trials if t.user_attrs.get("status") == PREDICTED_OVER_MEMORY]
    assert len(stored) == 1 and stored[0].user_attrs["predicted_peak_bytes"] > BUDGET
