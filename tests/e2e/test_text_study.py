"""A study of a token workload end to end: layouts, their references, real tokens/s."""

from __future__ import annotations

import json

import optuna

from autotune import load_space, tune


def test_a_text_study_judges_each_layout_against_its_own_reference(write_space, tmp_path):
    space = load_space(
        write_space("""
        workload: {workloads}:texts
        knobs: {batch_size: [8, 16], length_grouping: ["off", grouped]}
        baseline: {batch_size: 8}
        global_batch: 16
        trial: {warmup_steps: 1, measured_steps: 4}
        budget: {n_trials: 4}
        search: {sampler: grid, confirm_top: 0, prune: false}
    """)
    )
    storage = f"sqlite:///{tmp_path}/s.db"
    result = tune(space, storage=storage, out_dir=tmp_path / "runs")
    assert result.unit == "tokens" and len(result.trials) == 4
    for t in result.trials:  # each layout tracks the fp32 reference of that layout
        assert t.status == "ok", t.reason
        assert t.loss_deviation is not None and t.loss_deviation < 0.05
    study = optuna.load_study(study_name="space", storage=storage)
    grouped_ref = study.user_attrs["reference:length_grouping=grouped"]
    assert grouped_ref["config"]["length_grouping"] == "grouped"
    assert grouped_ref["losses"] != study.user_attrs["reference"]["losses"]  # other steps
    padding = {t.config.length_grouping: t.measurement.padding_share for t in result.trials}
    assert padding["grouped"] < padding["off"]
    # Every ok trial has an MFU, counted per real token; the padding the baseline adds
    # is recorded apart (the MFU ordering follows throughput: no wall-clock assertion).
    flops = result.environment["model_flops"]
    assert flops["unit"] == "tokens" and flops["padded_ratio"] > 1
    for t in result.trials:
        found = result.mfu(t)
        assert found.flops_per_s == flops["per_unit"] * t.measurement.tokens_per_s
    # The probe found the samples' lengths once; every trial read them from its spec.
    runs = tmp_path / "runs" / "space"
    lengths = json.loads((runs / "probe" / "lengths.json").read_text())
    assert len(lengths) == 256
    spec = json.loads((runs / "trial-0000" / "spec.json").read_text())
    assert spec["lengths_path"] == str((runs / "probe" / "lengths.json").resolve())
    # Their rates are the epoch's: each window fitted against its steps' positions and
    # scaled to the mean step of an epoch of the same stream, computed from the lengths.
    for t in result.trials:
        m = t.measurement
        assert m.epoch_scale is not None and m.window_rate is not None, t.config.short()
        assert m.epoch_scale > 0 and m.tokens_per_s != m.window_rate
    best = json.loads(json.dumps(result.best.measurement.to_dict()))
    assert best["unit"] == "tokens" and best["tokens_per_s"] > 0
