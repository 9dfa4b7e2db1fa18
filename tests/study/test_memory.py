"""The memory model (autotune.study.memory) and the tuner skipping what cannot fit."""

from __future__ import annotations

import itertools
import json

import optuna
import pytest

from autotune import Config, Measurement, load_space, tune
from autotune.errors import SpaceError
from autotune.knobs import KNOBS
from autotune.measurement import OVER_MEMORY, PREDICTED_OVER_MEMORY
from autotune.results import DUPLICATE, SEARCH, TrialRecord
from autotune.study.memory import MARGIN, MemoryModel, memory_key
from autotune.study.replay import ReplayBackend

GIB = 2**30
MIB = 2**20
BUDGET = int(1.75 * GIB)


def rec(number, bs, peak_gib, status="ok", m_status="ok", role="search", **knobs):
    peak = None if peak_gib is None else int(peak_gib * GIB)
    m = Measurement(status=m_status, peak_mem_bytes=peak)
    return TrialRecord(number, Config(batch_size=bs, **knobs), m, 1.0, role, status)


def line(a_gib, b_mib, sizes, first=0, **knobs):
    """Exact points of peak = a + b * bs, judged against BUDGET as the tuner would."""
    out = []
    for i, bs in enumerate(sizes):
        peak = a_gib + b_mib * bs * MIB / GIB
        status = OVER_MEMORY if peak * GIB > BUDGET else "ok"
        out.append(rec(first + i, bs, peak, status, **knobs))
    return out


def predict(trials, device="cpu", **config):
    return MemoryModel(trials, BUDGET, device).predict(Config(**config))


# -- the groups: which knobs change memory ---------------------------------------------


def test_every_knob_is_a_memory_knob_unless_listed_neutral():
    # A knob added later (the FSDP knobs) is in the key without anyone listing it.
    cpu = {k for k, _ in memory_key(Config(), "cpu")}
    assert cpu == set(KNOBS) - {"batch_size", "matmul_precision"}
    cuda = {k for k, _ in memory_key(Config(), "cuda")}
    assert "num_workers" in cpu and "num_workers" not in cuda  # RSS holds worker batches
    assert {"gradient_checkpointing", "amp_dtype", "compile_mode", "world_size"} <= cuda


def test_accumulation_counts_only_as_on_or_off():
    # Fixed global batch: 64 x 2 and 32 x 4 share a line; 128 x 1 frees its gradients.
    assert memory_key(Config(accumulation_steps=2)) == memory_key(Config(accumulation_steps=4))
    assert memory_key(Config(accumulation_steps=1)) != memory_key(Config(accumulation_steps=2))


# -- the monotone rule -----------------------------------------------------------------


def test_a_larger_batch_of_a_group_that_went_over_cannot_fit():
    trials = [rec(0, 32, 1.0), rec(1, 64, 2.0, OVER_MEMORY)]
    p = predict(trials, batch_size=128)
    assert p.over and p.certain and "trial 1" in p.basis
    assert ">= 2048 MiB > budget 1792 MiB" in p.reason(BUDGET)
    # ... but not a smaller batch, nor another group (checkpointing changes the slope)
    assert not predict(trials, batch_size=48).over
    assert not predict(trials, batch_size=128, gradient_checkpointing=True).over


def test_out_of_memory_is_at_least_the_budget():
    trials = [rec(0, 64, None, "oom", m_status="oom")]
    p = predict(trials, batch_size=64)
    assert p.over and p.peak_bytes is None
    assert p.reason(BUDGET).startswith("out of memory (trial 0")
    assert not predict(trials, batch_size=32).over


def test_a_measured_fit_at_a_larger_batch_always_wins():
    # Noise: 64 measured over, 128 measured under. Nothing up to 128 is skipped.
    trials = [rec(0, 64, 1.8, OVER_MEMORY), rec(1, 128, 1.7)]
    assert not predict(trials, batch_size=96).over
    assert not predict(trials, batch_size=128).over
    assert predict(trials, batch_size=256).over  # beyond every fit: the over point rules


def test_copies_and_skipped_configs_are_no_data():
    trials = [
        rec(0, 64, 2.0, OVER_MEMORY, role=DUPLICATE),
        rec(1, 64, None, PREDICTED_OVER_MEMORY, m_status=PREDICTED_OVER_MEMORY),
    ]
    assert not predict(trials, batch_size=128).over


# -- the line ---------------------------------------------------------------------------


def test_a_line_skips_what_is_clearly_over_and_runs_what_is_close():
    trials = line(0.5, 32, [8, 16, 32])  # 0.75, 1.0, 1.5 GiB
    far = predict(trials, batch_size=64)  # 2.5 GiB: 43% over
    assert far.over and not far.certain
    assert "linear in batch size from trials 0, 1, 2" in far.basis
    assert far.reason(BUDGET).startswith("peak ~2560 MiB > budget 1792 MiB")
    # Over the budget, but within the margin: it runs (and decides).
    close = predict(trials, batch_size=42)  # 1.81 GiB
    assert close.peak_bytes > BUDGET and not close.over
    assert close.peak_bytes < (1 + MARGIN) * BUDGET


def test_a_group_with_one_point_never_predicts():
    # Another group's line is perfect; this group's slope is still unknown.
    trials = [*line(0.5, 32, [8, 16, 32]), rec(3, 8, 1.0, gradient_checkpointing=True)]
    p = predict(trials, batch_size=256, gradient_checkpointing=True)
    assert not p.over and p.basis == "fewer than two batch sizes measured"


def test_two_points_predict_only_with_residuals_from_somewhere():
    two = line(0.5, 32, [8, 32], gradient_checkpointing=True)
    assert not predict(two, batch_size=256, gradient_checkpointing=True).over
    # Another group measured at three batch sizes shows the line holds: now it may.
    pooled = [*two, *line(0.6, 40, [8, 16, 32], first=2)]
    assert predict(pooled, batch_size=256, gradient_checkpointing=True).over


def test_noise_widens_the_interval():
    # +-4% around 0.5 + 32 MiB x bs: far out is still clearly over; nearer is not.
    noisy = [
        rec(i, bs, (0.5 + bs / 32) * f)
        for i, (bs, f) in enumerate(
            [(8, 1.04), (16, 0.96), (32, 1.04), (8, 0.96), (16, 1.04), (32, 0.96)]
        )
    ]
    exact = line(0.5, 32, [8, 16, 32])
    assert predict(noisy, batch_size=128).over
    assert predict(exact, batch_size=52).over and not predict(noisy, batch_size=52).over


def test_memory_that_is_not_linear_is_not_extrapolated():
    # Saturating: 1.0, 1.5, 1.7 GiB; a line through them would put 64 at 2.6 GiB.
    trials = [rec(0, 8, 1.0), rec(1, 16, 1.5), rec(2, 32, 1.7)]
    p = predict(trials, batch_size=64)
    assert not p.over and p.basis.startswith("not linear in batch size")


# -- through the tuner (replay) ---------------------------------------------------------

SIZES = [8, 16, 32, 64, 128, 256]
SPACE = """
    workload: {workloads}:tiny
    knobs:
      batch_size: [8, 16, 32, 64, 128, 256]
      gradient_checkpointing: [false, true]
      num_workers: [0, 1]
    baseline: {batch_size: 32}
    global_batch: free
    limits: {memory: BUDGET, accuracy: off}
    search: {confirm_top: 0, prune: false, seed: SEED, predict_memory: PREDICT, noise_runs: 0}
    budget: {n_trials: 14}
"""


def _peak(config: Config) -> int:
    """0.5 GiB + 32 MiB a sample, 14 MiB with checkpointing; workers hold no GPU memory."""
    slope = 14 if config.gradient_checkpointing else 32
    return int(0.5 * GIB + slope * MIB * config.batch_size)


def _table() -> dict:
    rows = []
    for bs, ck, w in itertools.product(SIZES, [False, True], [0, 1]):
        config = Config(batch_size=bs, gradient_checkpointing=ck, num_workers=w)
        m = Measurement(
            status="ok",
            samples_per_s=100.0 * bs**0.5 * (0.8 if ck else 1.0) * (1.1 if w else 1.0),
            samples_per_step=bs,
            measured_steps=5,
            losses=[1.0, 0.9],
            peak_mem_bytes=_peak(config),
            mem_kind="cuda_reserved",
        )
        rows.append({"config": config.to_dict(), "measurement": m.to_dict()})
    caps = {"device": "cuda", "cpu_count": 4, "workload_blocks": 2, "gpu_count": 1}
    return {"environment": {"device": "cuda"}, "capabilities": caps, "measurements": rows}


def _study(write_space, tmp_path, seed, predict_memory=True):
    text = SPACE.replace("BUDGET", str(BUDGET)).replace("SEED", str(seed))
    space = load_space(write_space(text.replace("PREDICT", str(predict_memory).lower())))
    backend = ReplayBackend(_table())
    result = tune(space, storage="memory", out_dir=tmp_path / str(seed), backend=backend)
    return result, backend


def test_the_table_is_half_over_budget():
    over = [c for c, _ in ReplayBackend(_table()).rows.values() if _peak(c) > BUDGET]
    assert len(over) == 10 and all(_peak(c) > 1.25 * BUDGET for c in over)  # 24 configs


def _over_runs(backend: ReplayBackend) -> list[Config]:
    return [c for c in backend.calls if _peak(c) > BUDGET]


@pytest.mark.parametrize("seed", range(6))
def test_skips_only_what_cannot_fit_and_runs_few_over_memory(write_space, tmp_path, seed):
    result, backend = _study(write_space, tmp_path, seed)
    skipped = [t for t in result.trials if t.status == PREDICTED_OVER_MEMORY]
    assert skipped  # the half over the budget is not all run
    assert all(_peak(t.config) > BUDGET for t in skipped)  # (a) nothing feasible skipped
    # (b) over-memory runs only where the model had no evidence to skip: each run was
    # not predicted over by the model of the trials before it. So at most two per memory
    # group (checkpointing on/off): the first before the group has a line; a second only
    # while that line rests on two batch sizes and no group has residuals to trust a
    # line with. Every seed here runs such a second one: the screening's largest batch
    # (256) goes over, then its next size up (64), between that and the baseline's fit at
    # 32 with only those two points: a line through two points cannot tell linear memory
    # from memory that is not, so the model runs it (module docstring, rule 2).
    ran_over = [t for t in result.trials if t.status == OVER_MEMORY and t.role == SEARCH]
    assert [t.config for t in ran_over] == _over_runs(backend)
    for group in (False, True):
        runs = [t for t in ran_over if t.config.gradient_checkpointing == group]
        assert len(runs) <= 2
        for i, t in enumerate(runs):
            model = MemoryModel([r for r in result.trials if r.number < t.number], BUDGET, "cuda")
            said = model.predict(t.config)
            assert not said.over, f"{t.config.short()}: {said.basis}"
            assert i == 0 or model.noise is None, f"{t.config.short()}: {said.basis}"
    # Never over-memory at a batch size at or above one that went over in its group.
    for i, t in enumerate(ran_over):
        assert not any(
            o.config.gradient_checkpointing == t.config.gradient_checkpointing
            and o.config.batch_size <= t.config.batch_size
            for o in ran_over[:i]
        )
    # Skipped configs spend no budget: 14 configs ran.
    assert len(backend.calls) == 14
    for t in skipped:
        assert t.measurement.peak_mem_bytes is None and t.value == 0.0
        assert "> budget 1792 MiB" in t.reason
    assert result.best.config == Config(batch_size=64, gradient_checkpointing=True, num_workers=1)


def test_without_prediction_more_over_memory_trials_run(write_space, tmp_path):
    with_, without = 0, 0
    for seed in range(6):
        result, backend = _study(write_space, tmp_path / "on", seed)
        with_ += len(_over_runs(backend))
        result, backend = _study(write_space, tmp_path / "off", seed, predict_memory=False)
        assert not any(t.status == PREDICTED_OVER_MEMORY for t in result.trials)
        without += len(_over_runs(backend))
    assert with_ <= 15 and without >= 2 * with_  # 15 against 34 at the time of writing


def test_memory_that_saturates_is_never_skipped(write_space, tmp_path):
    # Every config fits, but a line through the small batches puts the large ones far
    # over: a model that extrapolates without checking the line would skip the best.
    shape = {8: 1.0, 16: 1.5, 32: 1.65, 64: 1.7, 128: 1.72, 256: 1.74}
    table = _table()
    for row in table["measurements"]:
        row["measurement"]["peak_mem_bytes"] = int(shape[row["config"]["batch_size"]] * GIB)
    text = SPACE.replace("BUDGET", str(BUDGET)).replace("SEED", "0").replace("PREDICT", "true")
    space = load_space(write_space(text.replace("n_trials: 14", "n_trials: 24")))
    backend = ReplayBackend(table)
    result = tune(space, storage="memory", out_dir=tmp_path, backend=backend)
    assert not any(t.status == PREDICTED_OVER_MEMORY for t in result.trials)
    assert len(backend.calls) == 24


def test_the_report_shows_what_was_skipped_and_why(write_space, tmp_path):
    # The summary facts, the status counts, report.json, the HTML page and the plots.
    from autotune.output.facts import summary_facts
    from autotune.output.report import make_report

    text = SPACE.replace("BUDGET", str(BUDGET)).replace("SEED", "0").replace("PREDICT", "true")
    space = load_space(write_space(text))
    storage = f"sqlite:///{tmp_path}/s.db"
    backend = ReplayBackend(_table())
    result = tune(space, storage=storage, out_dir=tmp_path / "runs", backend=backend)
    skipped = result.status_counts()[PREDICTED_OVER_MEMORY]
    facts = {f.key: f.text for f in summary_facts(result)}
    assert facts["memory_prediction"].startswith(f"skipped {skipped} config(s) predicted over")
    report = make_report(
        space, storage=storage, out_dir=tmp_path / "runs", profile=False, backend=backend
    )
    study = optuna.load_study(study_name="space", storage=storage)
    stored = [t for t in study.trials if t.user_attrs.get("status") == PREDICTED_OVER_MEMORY]
    assert stored and all(t.value == 0.0 for t in stored)
    # Infeasible for the sampler through memory, as a measured over-memory trial is.
    assert all(t.constraints["memory"] > 0 and t.constraints["failed"] == 0 for t in stored)
    assert all(t.user_attrs["predicted_peak_bytes"] > BUDGET for t in stored)
    data = json.loads(report.data.read_text())
    rows = [t for t in data["trials"] if t["status"] == PREDICTED_OVER_MEMORY]
    assert len(rows) == skipped and all("> budget 1792 MiB" in t["reason"] for t in rows)
    assert f"{PREDICTED_OVER_MEMORY}: peak" in report.html.read_text()
    assert any(
        "skipped as predicted over the memory budget are not drawn" in n for n in report.notes
    )


def test_predict_memory_must_be_a_boolean(write_space):
    with pytest.raises(SpaceError, match=r"search.predict_memory: must be"):
        load_space(write_space("workload: m:f\nsearch: {predict_memory: maybe}\n"))
    assert load_space(write_space("workload: m:f\nbudget: {n_trials: 1}\n")).search.predict_memory


def test_the_summary_table_says_which_configs_did_not_run(write_space, tmp_path):
    from rich.console import Console

    from autotune.output.console import summary_table

    result, _ = _study(write_space, tmp_path, seed=0)
    skipped = result.status_counts()[PREDICTED_OVER_MEMORY]
    console = Console(width=200, record=True)
    console.print(summary_table(result))
    text = console.export_text()
    assert f"configs ({skipped} predicted over memory, not run)" in text
    assert "predicted-over-memory: peak" in text


def test_advice_does_not_count_a_skipped_config_as_measured(write_space, tmp_path):
    from autotune.output.advice import Evidence

    result, _ = _study(write_space, tmp_path, seed=0)
    evidence = Evidence.from_result(result)
    assert (
        len(evidence.trials) == len(result.trials) - result.status_counts()[PREDICTED_OVER_MEMORY]
    )


def test_grid_ends_when_every_config_is_measured_or_skipped(write_space, tmp_path):
    text = SPACE.replace("BUDGET", str(BUDGET)).replace("SEED", "0").replace("PREDICT", "true")
    text = text.replace("search: {", "search: {sampler: grid, ").replace("14}", "100}")
    backend = ReplayBackend(_table())
    result = tune(
        load_space(write_space(text)), storage="memory", out_dir=tmp_path, backend=backend
    )
    skipped = result.status_counts()[PREDICTED_OVER_MEMORY]
    assert len(backend.calls) + skipped == 24  # each config run or skipped, once
    # At most the first of each group (checkpointing or not): 8 or more of 10 skipped. How
    # many depends on the grid's order (the feasible runs before the first over-memory one).
    assert 1 <= len(_over_runs(backend)) <= 2
    assert any("measured or predicted over memory" in n for n in result.notes)


def test_a_resumed_study_refits_from_storage_and_skips_do_not_spend_budget(write_space, tmp_path):
    text = SPACE.replace("BUDGET", str(BUDGET)).replace("SEED", "1").replace("PREDICT", "true")
    space = load_space(write_space(text))
    storage = f"sqlite:///{tmp_path}/s.db"
    first = ReplayBackend(_table())
    tune(space, storage=storage, out_dir=tmp_path, backend=first, n_trials=6)
    again = ReplayBackend(_table())
    result = tune(space, storage=storage, out_dir=tmp_path, backend=again, n_trials=14)
    calls = [c.key() for c in first.calls + again.calls]
    assert len(calls) == len(set(calls)) == 14  # nothing run twice, skips not counted
    assert not any(_peak(c) > BUDGET for c in again.calls)  # the model came back whole
    assert all(_peak(t.config) > BUDGET for t in result.trials if not t.feasible)


def test_the_model_learns_from_nvmls_figure_of_the_process():
    # The allocator's peaks fit; with the CUDA context NVML sees the config over.
    m = Measurement(status="ok", peak_mem_bytes=GIB, gpu_proc_mem_max_bytes=2 * GIB)
    trials = [rec(0, 32, 0.9), TrialRecord(1, Config(batch_size=64), m, 1.0, "search", OVER_MEMORY)]
    p = predict(trials, batch_size=128)
    assert p.over and ">= 2048 MiB > budget 1792 MiB" in p.reason(BUDGET)
