"""Search machinery: dedupe, grid, replay, pruning (confirmation: test_confirm.py)."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import yaml

from autotune import Config, Measurement, SpaceError, load_space, tune
from autotune.errors import AutotuneError, WorkloadError
from autotune.measurement import TOKENS
from autotune.results import DUPLICATE, REPEAT, TrialRecord, TuneResult, summarize
from autotune.space import SearchSettings, TrialSettings
from autotune.study.pruning import Pruner
from autotune.study.replay import ReplayBackend, record_table
from autotune.study.scoring import objective
from autotune.study.storage import records

SPACE = """
    workload: {workloads}:tiny
    knobs: {batch_size: [4, 8, 16, 32], num_workers: [0, 1], gradient_checkpointing: [false, true]}
    baseline: {batch_size: 8}
    global_batch: 32
    search: {sampler: SAMPLER, confirm_top: CONFIRM, seed: 3, noise_runs: 0}
    budget: {n_trials: 16}
"""


def _table() -> dict:
    """16 configs; throughput grows with batch size, workers help, checkpointing costs."""
    rows = []
    for bs, w, ck in itertools.product([4, 8, 16, 32], [0, 1], [False, True]):
        config = Config(
            batch_size=bs, accumulation_steps=32 // bs, num_workers=w, gradient_checkpointing=ck
        )
        rate = 100.0 * bs**0.5 * (1.2 if w else 1.0) * (0.7 if ck else 1.0)
        m = Measurement(
            status="ok",
            samples_per_s=rate,
            samples_per_step=32,
            measured_steps=5,
            losses=[1.0, 0.9, 0.8],
            step_time_cv=0.01,
            wall_s=2.0,
            startup_s=1.0,
        )
        rows.append({"config": config.to_dict(), "measurement": m.to_dict()})
    return {
        "environment": {"device": "cpu"},
        "capabilities": {"device": "cpu", "cpu_count": 2, "workload_blocks": 2},
        "measurements": rows,
    }


def _space(write_space, sampler="tpe", confirm=0):
    return load_space(
        write_space(SPACE.replace("SAMPLER", sampler).replace("CONFIRM", str(confirm)))
    )


def test_replay_finds_the_table_optimum_and_never_reruns_a_config(write_space, tmp_path):
    space = _space(write_space)
    backend = ReplayBackend(_table())
    result = tune(space, storage="memory", out_dir=tmp_path, backend=backend, n_trials=12)
    keys = [c.key() for c in backend.calls]
    assert len(keys) == len(set(keys)) == 12  # duplicates were reused, not re-run
    optimum, value = backend.optimum(space)
    assert optimum == Config(batch_size=32, accumulation_steps=1, num_workers=1)
    assert result.best.config == optimum and abs(result.best.value - value) < 1e-9
    assert result.baseline.config.batch_size == 8
    assert round(result.speedup, 3) == 2.4  # sqrt(32/8) x 1.2 for the worker


def _repeated(table: dict, key_config: Config, runs: list[tuple[str, float]]) -> None:
    """Give ``key_config``'s row of ``table`` repeat runs: (pass, samples/s)."""
    for row in table["measurements"]:
        if Config.from_dict(row["config"]).key() == key_config.key():
            row["repeats"] = [
                {
                    "pass": p,
                    "measurement": {**row["measurement"], "samples_per_s": rate, "wall_s": 9.0},
                }
                for p, rate in runs
            ]


def test_a_repeated_config_answers_with_its_median_run_as_measured():
    table = _table()
    base = Config(batch_size=8, accumulation_steps=4)
    best = Config(batch_size=32, accumulation_steps=1, num_workers=1)
    recorded = 100.0 * 8**0.5
    # The baseline slowed in pass b while the best config held: no scaling by the
    # baseline's pace may lift the best config above every run it made.
    _repeated(table, base, [("a", recorded * 0.95), ("b", recorded * 0.8)])
    _repeated(table, best, [("a", recorded * 2.3), ("b", recorded * 2.5)])
    raw = ReplayBackend(table)
    assert raw.rows[best.key()][1].samples_per_s == pytest.approx(recorded * 2.4)
    medians = ReplayBackend(table, base)
    m = medians.rows[best.key()][1]
    assert m.samples_per_s == pytest.approx(recorded * 2.4)  # the middle of 2.3, 2.4, 2.5
    assert medians.rows[base.key()][1].samples_per_s == pytest.approx(recorded * 0.95)
    assert medians.rows[base.key()][1].wall_s == 9.0  # pass a's run itself
    other = Config(batch_size=16, accumulation_steps=2)
    assert medians.rows[other.key()][1] == raw.rows[other.key()][1]


def test_the_baselines_profile_is_the_median_of_its_runs():
    """A rule reads the baseline's data wait: from the median of its runs, not from the
    run whose throughput is the median (cnn_amp_grid's: 0.0504 recorded, 0.046, 0.039)."""
    table = _table()
    base = Config(batch_size=8, accumulation_steps=4)
    recorded = 100.0 * 8**0.5
    _repeated(table, base, [("a", recorded * 1.1), ("b", recorded * 0.9)])
    row = next(r for r in table["measurements"] if r["config"] == base.to_dict())
    for run, share in zip([row, *row["repeats"]], (0.0504, 0.046, 0.039), strict=True):
        run["measurement"] = {**run["measurement"], "data_share": share}
    m = ReplayBackend(table, base).rows[base.key()][1]
    assert m.samples_per_s == pytest.approx(recorded)  # the recorded run is the median...
    assert m.data_share == pytest.approx(0.046)  # ...its data wait the median wait


def test_cnn_amp_grids_optimum_is_a_rate_its_config_reached():
    """The replay's optimum of the recorded cnn_amp_grid is the median of its config's
    runs, a rate a run reached: not above every run (1,912 samples/s when each pass was
    scaled by its fp32 baseline, against runs of 1,719, 1,768 and 1,698)."""
    root = Path(__file__).resolve().parents[2]
    table = json.loads((root / "benchmarks/tables/cnn_amp_grid.json").read_text())
    space = load_space(root / "benchmarks/spaces/cnn_amp_grid.yaml")
    config, optimum = ReplayBackend(table, space.baseline).optimum(space)
    row = next(
        r for r in table["measurements"] if Config.from_dict(r["config"]).key() == config.key()
    )
    runs = [Measurement.from_dict(r["measurement"]) for r in [row, *row.get("repeats", [])]]
    rates = sorted(objective(m, space.trial) for m in runs)
    assert len(rates) == 3 and optimum == pytest.approx(rates[1])


def test_a_table_without_a_config_the_study_asks_for_names_it(write_space, tmp_path):
    table = _table()
    missing = Config(batch_size=32, accumulation_steps=1, num_workers=1)
    table["measurements"] = [r for r in table["measurements"] if r["config"] != missing.to_dict()]
    space = _space(write_space, sampler="grid")
    backend = ReplayBackend(table, name="t.json")
    with pytest.raises(AutotuneError, match=r"replay table t\.json has no row .*bs=32 workers=1"):
        tune(space, storage="memory", out_dir=tmp_path, backend=backend, n_trials=100)


def test_search_py_replay_of_a_table_without_the_config_is_one_line(tmp_path):
    """benchmarks/search.py replay exits 1 with one line naming the config, no traceback."""
    root = Path(__file__).resolve().parents[2]
    table = json.loads((root / "benchmarks/tables/lm_grid.json").read_text())
    space = load_space(root / table["space"])
    base = space.baseline.key()
    table["measurements"] = [
        r for r in table["measurements"] if Config.from_dict(r["config"]).key() != base
    ]
    table["space"] = str(root / table["space"])
    path = tmp_path / "lacking.json"
    path.write_text(json.dumps(table))
    done = subprocess.run(
        [sys.executable, str(root / "benchmarks/search.py"), "replay", str(path), "--seeds", "1"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert f"{path} has no row for the config the study asks for: " in done.stderr


def _layout_rows(amp: tuple[str, ...]) -> dict:
    rows = [
        {
            "config": Config(batch_size=8, length_grouping=g, amp_dtype=a).to_dict(),
            "measurement": Measurement(
                status="ok",
                samples_per_s=10.0,
                samples_per_step=8,
                losses=[1.0, 0.9 if g == "off" else 0.95],
            ).to_dict(),
        }
        for g in ("off", "grouped")
        for a in amp
    ]
    caps = {"device": "cpu", "cpu_count": 2, "tokens": True, "token_collate": True, "bf16": True}
    return {"measurements": rows, "capabilities": caps}


def _layout_space(write_space, baseline: str):
    return load_space(
        write_space(f"""
        workload: {{workloads}}:texts
        workload_args: {{causal_lm: true}}
        knobs: {{length_grouping: ["off", grouped]}}
        baseline: {baseline}
        global_batch: 8
        search: {{sampler: grid, confirm_top: 0, prune: false, noise_runs: 0}}
    """)
    )


def test_a_layouts_reference_run_is_a_call_but_not_a_trial(write_space, tmp_path):
    space = _layout_space(write_space, "{batch_size: 8, amp_dtype: bf16}")
    backend = ReplayBackend(_layout_rows(("fp32", "bf16")))
    result = tune(space, storage="memory", out_dir=tmp_path, backend=backend, n_trials=2)
    assert len(result.trials) == 2, result.notes
    # The study's reference is an fp32 run of the bf16 baseline; the grouped bf16 trial
    # is judged against an fp32 run of its own layout: two calls kept apart from the trials.
    calls = [(c.length_grouping, c.amp_dtype) for c in backend.calls]
    assert calls == [("off", "fp32"), ("off", "bf16"), ("grouped", "bf16"), ("grouped", "fp32")]
    assert backend.references == {0, 3}


def test_a_trial_that_is_its_layouts_fp32_run_is_that_layouts_reference(write_space, tmp_path):
    space = _layout_space(write_space, "{batch_size: 8}")
    backend = ReplayBackend(_layout_rows(("fp32",)))
    storage = f"sqlite:///{tmp_path}/s.db"
    result = tune(space, storage=storage, out_dir=tmp_path, backend=backend, n_trials=2)
    assert len(result.trials) == 2, result.notes
    # The baseline is fp32 eager: it is the study's reference. The grouped trial moves the
    # layout alone: it is the fp32 run of its layout, so its losses are that layout's
    # reference, and the same config is not run again.
    assert [c.length_grouping for c in backend.calls] == ["off", "grouped"]
    assert backend.references == set()
    study = optuna.load_study(study_name=space.study.name, storage=storage)
    kept = study.user_attrs["reference:length_grouping=grouped"]
    assert kept["losses"] == [1.0, 0.95] and kept["config"]["length_grouping"] == "grouped"
    grouped = next(t for t in result.trials if t.config.length_grouping == "grouped")
    assert grouped.loss_deviation == 0.0


def test_grid_measures_every_config_once(write_space, tmp_path):
    space = _space(write_space, sampler="grid")
    backend = ReplayBackend(_table())
    result = tune(space, storage="memory", out_dir=tmp_path, backend=backend, n_trials=100)
    assert len(backend.calls) == 16 == len({c.key() for c in backend.calls})
    assert len(result.trials) == 16
    assert any("all 16 configs of the space are measured" in n for n in result.notes)


def test_a_grid_runs_each_config_of_the_restricted_space_exactly_once(write_space, tmp_path):
    """persistent_workers means nothing without workers (one config at num_workers 0, two
    with workers), and more workers than this machine's CPUs are dropped by the device
    restriction: the grid is the 6 configs left, each measured once, none dropped."""
    too_many = os.cpu_count() + 1
    space = load_space(
        write_space(f"""
        workload: {{workloads}}:tiny
        knobs:
          batch_size: [8, 16]
          num_workers: [0, 1, {too_many}]
          persistent_workers: [false, true]
        baseline: {{batch_size: 8}}
        global_batch: 32
        trial: {{warmup_steps: 1, measured_steps: 3}}
        search: {{sampler: grid, confirm_top: 0, prune: false}}
        budget: {{n_trials: 20}}
    """)
    )
    storage = f"sqlite:///{tmp_path}/grid.db"
    result = tune(space, storage=storage, out_dir=tmp_path / "runs")
    study = optuna.load_study(study_name="space", storage=storage)
    runs = [
        (t.config.batch_size, t.config.num_workers, t.config.persistent_workers)
        for t in records(study)
        if t.role not in (DUPLICATE, REPEAT)
    ]
    restricted = [(b, 0, False) for b in (8, 16)] + [
        (b, 1, p) for b in (8, 16) for p in (False, True)
    ]
    assert sorted(runs) == sorted(restricted), result.notes
    assert not [t for t in records(study) if t.role == DUPLICATE]  # no grid point twice
    assert any("all 6 configs of the space are measured" in n for n in result.notes)


def test_a_replayed_grid_never_runs_a_value_the_restriction_dropped(write_space, tmp_path):
    """The issue's case: num_workers 0-3 on a 2-CPU table (3 dropped), persistent_workers
    meaningful only with workers. Each of the 2 x (1 + 2 x 2) = 10 configs once."""
    rows = []
    for bs, w, p in itertools.product([8, 16], [0, 1, 2, 3], [False, True]):
        if w == 0 and p:
            continue
        m = Measurement(status="ok", samples_per_s=100.0 + bs + w, samples_per_step=32)
        config = Config(
            batch_size=bs, accumulation_steps=32 // bs, num_workers=w, persistent_workers=p
        )
        rows.append({"config": config.to_dict(), "measurement": m.to_dict()})
    table = {"capabilities": {"device": "cpu", "cpu_count": 2}, "measurements": rows}
    space = load_space(
        write_space("""
        workload: {workloads}:tiny
        knobs:
          batch_size: [8, 16]
          num_workers: [0, 1, 2, 3]
          persistent_workers: [false, true]
        baseline: {batch_size: 8}
        global_batch: 32
        search: {sampler: grid, confirm_top: 0, prune: false, seed: 1, noise_runs: 0}
        budget: {n_trials: 40}
    """)
    )
    backend = ReplayBackend(table)
    result = tune(space, storage="memory", out_dir=tmp_path, backend=backend)
    keys = [c.key() for c in backend.calls]
    assert len(keys) == len(set(keys)) == 10, result.notes
    assert max(c.num_workers for c in backend.calls) == 2


def test_within_noise_flag():
    def rec(n, value, spread):
        return TrialRecord(n, Config(), Measurement(status="ok"), value, runs=3, spread=spread)

    close = TuneResult.from_trials("s", "m", [rec(0, 100.0, 0.01), rec(1, 103.0, 0.05)])
    assert close.best.number == 1 and close.within_noise  # 3% lead, 5% spread
    clear = TuneResult.from_trials("s", "m", [rec(0, 100.0, 0.01), rec(1, 130.0, 0.02)])
    assert clear.within_noise is False and round(clear.lead, 2) == 0.30


def test_record_a_real_study_then_replay_it(write_space, tmp_path):
    # best_runs 1: the table holds each config's first run, so the live study must judge
    # on first runs too. With a new best run three times, the live best is the config of
    # the best median, and on a noisy machine (CI, 2026-12-06) that was not the config of
    # the best first run.
    space = load_space(
        write_space("""
        workload: {workloads}:tiny
        knobs: {batch_size: [8, 16, 32]}
        baseline: {batch_size: 16}
        global_batch: 32
        trial: {warmup_steps: 1, measured_steps: 3}
        search: {sampler: grid, confirm_top: 0, prune: false, noise_runs: 0, best_runs: 1}
        budget: {n_trials: 3}
    """)
    )
    storage = f"sqlite:///{tmp_path}/grid.db"
    live = tune(space, storage=storage, out_dir=tmp_path / "live")
    study = optuna.load_study(study_name="space", storage=storage)
    table = record_table(study, tmp_path / "table.json")
    assert len(table["measurements"]) == 3 and table["reference"]["losses"]
    backend = ReplayBackend(tmp_path / "table.json")
    replayed = tune(space, storage="memory", out_dir=tmp_path / "replay", backend=backend)
    assert replayed.best.config == live.best.config
    assert abs(replayed.best.value - live.best.value) < 1e-9
    assert backend.optimum(space)[0] == live.best.config


def test_a_clearly_slower_trial_is_pruned(write_space, tmp_path):
    # Micro-batch 4 sleeps 5 ms a step: once the baseline (8) is measured, the batch-4
    # trial is stopped after 30% of its measured steps.
    space = write_space("""
        workload: {workloads}:sleepy
        knobs: {batch_size: [8, 4]}
        baseline: {batch_size: 8}
        global_batch: free
        trial: {warmup_steps: 2, measured_steps: 600, timeout_s: 120,
                min_window_s: 0, min_warmup_s: 0}
        search: {prune: true, prune_after: 0.3, prune_margin: 0.2, confirm_top: 0, noise_runs: 0}
        budget: {n_trials: 2}
    """)
    result = tune(space, storage=f"sqlite:///{tmp_path}/s.db", out_dir=tmp_path / "runs")
    slow = next(t for t in result.trials if t.config.batch_size == 4)
    fast = next(t for t in result.trials if t.config.batch_size == 8)
    assert fast.status == "ok" and fast.measurement.measured_steps == 600
    assert slow.status == "pruned", slow.reason
    assert "cannot beat the best" in slow.reason
    assert 180 <= slow.measurement.measured_steps < 600
    assert slow.measurement.samples_per_s < fast.measurement.samples_per_s / 1.2
    count, saved_s = result.pruning_saved_s()
    assert count == 1 and saved_s > 0
    assert result.best.config.batch_size == 8


def test_pruning_on_a_token_workload_judges_real_tokens_per_second_not_samples(tmp_path):
    # Padded rows: 32 samples of 600 real tokens a step. Packed: 8 rows of 2000 real
    # tokens a step. Per second the padded config makes 4x the samples, the packed one
    # 3.3x the real tokens: the objective (real tokens/s) and the pruner rank by tokens.
    trial = TrialSettings(warmup_steps=2, measured_steps=20)
    search = SearchSettings(prune_margin=0.2, prune_after=0.3)
    runs = {"padded": (32, 600.0), "packed": (8, 2000.0)}  # samples, real tokens per step

    def full(name):  # the whole measured window: 20 steps in 20 s
        samples, tokens = runs[name]
        return Measurement(
            status="ok",
            unit=TOKENS,
            samples_per_s=samples,
            tokens_per_s=tokens,
            samples_per_step=samples,
            tokens_per_step=tokens,
            measured_steps=20,
        )

    def pruned(name, best):  # the pruner's verdict after 10 of those steps
        samples, tokens = runs[name]
        path = tmp_path / f"{name}.json"
        progress = {"samples_per_step": samples, "per_step": tokens, "unit": TOKENS}
        progress |= {"steps": 10, "elapsed_s": 10.0, "warmup_s": 2.0, "compile_s": 0.0}
        path.write_text(json.dumps(progress))
        return Pruner(path, objective(full(best), trial), trial, search)()

    assert full("padded").samples_per_s > full("packed").samples_per_s
    assert objective(full("packed"), trial) > objective(full("padded"), trial)
    assert pruned("packed", best="padded") is None  # more real tokens/s: kept
    reason = pruned("padded", best="packed")
    assert reason is not None and "600.0 tokens/s cannot beat the best 2,000.0" in reason


def test_a_sampler_proposing_measured_configs_still_spends_the_budget(write_space, tmp_path):
    # On 16 configs TPE soon proposes measured ones again and again; each is answered from
    # storage, and after a few in a row the tuner measures an unmeasured neighbour of the
    # best (or a random unmeasured config) instead of giving up with budget left.
    space = _space(write_space)
    backend = ReplayBackend(_table())
    storage = f"sqlite:///{tmp_path}/s.db"
    result = tune(space, storage=storage, out_dir=tmp_path, backend=backend, n_trials=16)
    keys = [c.key() for c in backend.calls]
    assert len(keys) == len(set(keys)) == 16
    assert any("all 16 configs of the space are measured" in n for n in result.notes)
    study = optuna.load_study(study_name="space", storage=storage)
    fallback = [t.user_attrs.get("proposed_by") for t in study.trials]
    assert {"neighbour", "random"} & set(fallback)


def _planned_space(write_space, trial: str):
    text = SPACE.replace("SAMPLER", "grid").replace("CONFIRM", "2")
    return load_space(write_space(text + f"    trial: {trial}\n"))


def test_planned_tokens_on_a_workload_without_tokens_fails_before_any_trial(write_space, tmp_path):
    """The space file cannot know the workload's samples; the probe can. Would catch a
    planned_tokens silently read as samples."""
    space = _planned_space(write_space, "{planned_tokens: 1000000}")
    backend = ReplayBackend(_table())
    with pytest.raises(SpaceError, match=r"trial.planned_tokens: the workload's samples are not"):
        tune(space, storage="memory", out_dir=tmp_path, backend=backend)
    assert backend.calls == []


def test_a_planned_study_projects_its_run_in_best_config_yaml(write_space, tmp_path):
    """The tuner hands the space's plan to the result: would catch a plan lost between
    the space and best_config.yaml."""
    space = _planned_space(write_space, "{planned_samples: 3200000, cost_per_hour: 10}")
    result = tune(space, storage="memory", out_dir=tmp_path, backend=ReplayBackend(_table()))
    p = result.projection
    assert p.plan.unit == "samples" and p.plan.cost_per_hour == 10
    assert p.baseline_s / p.recommended_s == pytest.approx(result.speedup)
    data = yaml.safe_load(result.best_config_path.read_text())
    assert data["planned_run"]["length"] == 3_200_000


@pytest.mark.parametrize(
    "status, reason, says, hint",
    [
        ("nan", "loss is nan at step 3", "went non-finite", "limits.accuracy: off"),
        ("failed", "TypeError: bad batch", "a bug in it, not a numerics problem", "validate"),
        ("oom", "CUDA out of memory", "ran out of memory", "smaller batch_size"),
        ("timeout", "hung in forward (m.py:3)", "did not finish", "trial.timeout_s"),
    ],
)
def test_a_failed_reference_says_crash_or_numerics_and_only_numerics_hints_the_guard(
    write_space, tmp_path, status, reason, says, hint
):
    """The baseline (fp32, eager) is the study's reference; its failure ends the study
    with a line that tells a broken workload from fp32 numerics."""
    table = _table()
    for row in table["measurements"]:
        if (
            Config.from_dict(row["config"]).batch_size == 8
            and row["config"].get("num_workers", 0) == 0
        ):
            row["measurement"] = Measurement(status=status, reason=reason).to_dict()
    backend = ReplayBackend(table)
    with pytest.raises(WorkloadError) as info:
        tune(_space(write_space), storage="memory", out_dir=tmp_path, backend=backend)
    message = str(info.value)
    assert message.startswith("the fp32 reference run (bs=8 acc=4")
    assert reason in message and says in message and hint in message
    assert ("limits.accuracy: off" in message) == (status in ("nan", "oom"))
    assert len(backend.calls) == 1


class _LuckyFirstRun(ReplayBackend):
    """The table's rates, except ``lucky``'s first run at ``factor`` times its rate; its
    answers vary, so the search runs a new best again (``search.best_runs``)."""

    noisy = True

    def __init__(self, table: dict, lucky: Config, factor: float) -> None:
        super().__init__(table)
        self.lucky, self.factor = lucky, factor

    def run_trial(self, space, config, folder, best_value=None):
        m = super().run_trial(space, config, folder, best_value)
        first = [c.key() for c in self.calls].count(config.key()) == 1
        if config.key() == self.lucky.key() and first:
            return m.replace(samples_per_s=m.samples_per_s * self.factor)
        return m


@pytest.mark.parametrize("best_runs", [3, 1])
def test_a_new_best_runs_again_before_its_figure_is_the_bar(write_space, tmp_path, best_runs):
    """Batch 16 with a worker (480/s) first runs at 720/s, above the fastest config (bs 32
    with a worker, 679/s). Run again, its runs differ by 40% (past the 3% margin), so it
    runs a third time and stands at its median: the fastest config is the one finalist
    (confirm_top 1) and the recommendation. The fastest's own two runs agree: no third.
    With best_runs 1 the lucky run is the figure, the lucky config the finalist."""
    lucky = Config(batch_size=16, accumulation_steps=2, num_workers=1)
    fastest = Config(batch_size=32, accumulation_steps=1, num_workers=1)
    text = SPACE.replace("SAMPLER", "grid").replace("CONFIRM", "1")
    space = load_space(
        write_space(text.replace("noise_runs: 0", f"noise_runs: 0, best_runs: {best_runs}"))
    )
    backend = _LuckyFirstRun(_table(), lucky, 1.5)
    storage = f"sqlite:///{tmp_path}/s.db"
    result = tune(space, storage=storage, out_dir=tmp_path, backend=backend)
    study = optuna.load_study(study_name=space.study.name, storage=storage)
    searched: dict[str, int] = {}  # runs of each config outside the confirmation's rounds
    for t in study.trials:
        if t.user_attrs.get("round") is None and t.user_attrs.get("role") != DUPLICATE:
            key = Config.from_dict(t.user_attrs["config"]).key()
            searched[key] = searched.get(key, 0) + 1
    if best_runs == 1:
        assert result.best.config.key() == lucky.key()
        assert max(searched.values()) == 1
        return
    assert result.best.config.key() == fastest.key()
    assert searched[lucky.key()] == 3 and searched[fastest.key()] == 2
    # Each new best ran again at once (the grid's running maxima: each one repeated, the
    # lucky one twice)...
    repeats = [t for t in study.trials if t.user_attrs.get("role") == REPEAT]
    searched_repeats = [t for t in repeats if t.user_attrs.get("round") is None]
    assert all(t.number - t.user_attrs["repeat_of"] in (1, 2) for t in searched_repeats), [
        (t.number, t.user_attrs["repeat_of"]) for t in searched_repeats
    ]
    # ... and spend no budget: the grid's 16 configs (n_trials 16) were all measured.
    assert max(searched.values()) == 3 and len(searched) == 16


def test_the_screening_moves_from_a_new_best_at_the_median_of_its_runs(write_space, tmp_path):
    """The screening moves batch size to 32 (566/s), then to 16, whose first run is lucky
    (640/s; 400/s in truth): run again, its median (520/s) is below batch 32's, so the
    next move (a worker) starts from batch 32, not from the lucky run's config. Behind the
    best within the pruning margin, its two runs 640 and 400 apart, it gets a third as a
    second look (:func:`screening.second_look`), not as the best."""
    text = SPACE.replace("SAMPLER", "tpe").replace("CONFIRM", "0")
    space = load_space(write_space(text.replace("noise_runs: 0", "noise_runs: 0, screening: true")))
    lucky = Config(batch_size=16, accumulation_steps=2)
    backend = _LuckyFirstRun(_table(), lucky, 1.6)
    result = tune(space, storage="memory", out_dir=tmp_path, backend=backend, n_trials=4)
    moved = [(t.move, t.config.short()) for t in result.trials if t.move]
    assert moved[:3] == [
        ("batch_size=32", "bs=32"),
        ("batch_size=16", "bs=16 acc=2"),
        ("num_workers=1", "bs=32 workers=1"),
    ], moved
    assert [c.key() for c in backend.calls].count(lucky.key()) == 3  # the best's 2, a look
    (summary,) = [t for t in summarize(result.trials) if t.config.key() == lucky.key()]
    assert summary.runs == 3 and summary.value == pytest.approx(400.0)
