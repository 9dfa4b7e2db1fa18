"""``trial.objective: energy``: a study ranks by samples per joule of the training device.

The real tuner (sampling, dedupe, paired confirmation rounds, ablations, SQLite storage)
runs against a recorded table whose measurements carry the window's energy, as a GPU's
trials would (ReplayBackend: only the measurement is looked up); a machine that cannot
read energy stops the study before any trial with one line; pruning, which sees no
energy in a trial's progress, is off (a real trial process)."""

from __future__ import annotations

import io
import itertools

import pytest
import yaml
from rich.console import Console

from autotune import Config, Measurement, SpaceError, load_space, tune
from autotune.output.console import print_summary
from autotune.output.facts import summary_facts
from autotune.output.html import render_html
from autotune.output.report import report_data
from autotune.study.replay import ReplayBackend
from autotune.study.runner import run_trial
from autotune.study.storage import load_result
from autotune.study.verify import verify_result

# Throughput grows with the micro-batch and with a worker; joules per sample are lowest
# at batch 16 without workers: the fastest config is not the most efficient one.
JOULES = {4: 3.0, 8: 2.0, 16: 1.0, 32: 1.6}
FASTEST, THRIFTIEST = (32, 1), (16, 0)

SPACE = """
    workload: {workloads}:tiny
    knobs: {batch_size: [4, 8, 16, 32], num_workers: [0, 1]}
    baseline: {batch_size: 8}
    global_batch: 32
    trial: {objective: OBJECTIVE}
    search: {sampler: grid, confirm_top: 2, confirm_rounds: 3, seed: 3}
    budget: {n_trials: 8}
"""


def _table(energy_unavailable: str | None = "") -> dict:
    rows = []
    for bs, w in itertools.product(JOULES, [0, 1]):
        config = Config(batch_size=bs, accumulation_steps=32 // bs, num_workers=w)
        m = Measurement(
            status="ok",
            samples_per_s=100.0 * bs**0.5 * (1.2 if w else 1.0),
            samples_per_step=32,
            measured_steps=5,
            losses=[1.0, 0.9, 0.8],
            step_time_cv=0.01,
            wall_s=2.0,
            joules_per_sample=JOULES[bs] * (1.3 if w else 1.0),
            energy_source="nvml counter",
        )
        rows.append({"config": config.to_dict(), "measurement": m.to_dict()})
    caps = {"device": "cuda", "cpu_count": 2, "workload_blocks": 2, "gpu_count": 1}
    if energy_unavailable is not None:  # None: a table of a probe that did not say
        caps["energy_unavailable"] = energy_unavailable
    return {
        "environment": {"device": "cuda", "energy_unavailable": energy_unavailable or ""},
        "capabilities": caps,
        "measurements": rows,
    }


def _space(write_space, objective: str, extra: str = ""):
    return load_space(write_space(SPACE.replace("OBJECTIVE", objective) + extra))


def _key(record) -> tuple[int, int]:
    return record.config.batch_size, record.config.num_workers


def test_an_energy_study_recommends_the_most_samples_per_joule(write_space, tmp_path):
    """The same table recommends its fastest config under throughput and its thriftiest
    under energy. Would catch the objective still counting samples/s, or the summary of
    the stored study naming the values samples/s."""
    fast = tune(_space(write_space, "throughput"), storage="memory", out_dir=tmp_path / "t",
                backend=ReplayBackend(_table()))  # fmt: skip
    assert _key(fast.best) == FASTEST

    space = _space(write_space, "energy")
    storage = f"sqlite:///{tmp_path}/s.db"
    result = tune(space, storage=storage, out_dir=tmp_path / "e", backend=ReplayBackend(_table()))
    assert _key(result.best) == THRIFTIEST
    assert any(t.ratios for t in result.trials)  # ranked in paired confirmation rounds
    assert result.best.value == pytest.approx(1.0)  # samples per joule, not per second
    assert result.baseline.value == pytest.approx(0.5)

    _, stored = load_result(space, storage)
    assert stored.objective == "energy" and _key(stored.best) == THRIFTIEST
    facts = {f.key: f for f in summary_facts(stored)}
    assert facts["speedup"].label.startswith("energy efficiency over baseline (trial #0")
    assert facts["speedup"].text.startswith("2.00x (0.5 -> 1 samples/J)")
    n = stored.best.number
    assert facts["throughput"].text == f"#{n} 400.0 samples/s · baseline #0 282.8 samples/s"
    measured = yaml.safe_load(result.best_config_path.read_text())["measured"]
    assert measured["joules_per_sample"] == 1.0
    out = io.StringIO()
    print_summary(stored, Console(file=out, width=300, highlight=False))
    assert "samples/J" in out.getvalue() and "samples/s |" not in out.getvalue()
    assert report_data(stored, {})["objective_unit"] == "samples/J"
    page = render_html(stored, {}, {}, [])
    assert "2.00x</span> the samples/J of the baseline (0.5 -&gt; 1 samples/J" in page
    assert "faster than the baseline" not in page
    # autotune verify compares throughput: it refuses the study before running anything
    with pytest.raises(SpaceError, match="trial.objective: energy: autotune verify compares"):
        verify_result(space, stored, tmp_path / "verify")
    assert not (tmp_path / "verify").exists()


@pytest.mark.parametrize(
    ("energy_unavailable", "why"),
    [
        ("NVML cannot be loaded (no pynvml)", r"\(NVML cannot be loaded \(no pynvml\)\)"),
        (None, r"\(the probe did not say whether energy can be read here\)"),
    ],
)
def test_a_machine_that_cannot_read_energy_stops_an_energy_study_before_any_trial(
    write_space, tmp_path, energy_unavailable, why
):
    """Would catch an energy study ranking every config at 0 samples/J."""
    backend = ReplayBackend(_table(energy_unavailable))
    message = rf"trial.objective: energy: energy cannot be read on this machine {why}"
    with pytest.raises(SpaceError, match=message):
        tune(_space(write_space, "energy"), storage="memory", out_dir=tmp_path, backend=backend)
    assert backend.calls == []


def test_an_energy_study_cannot_search_several_ranks(write_space, tmp_path):
    """A DDP trial gives no per-sample energy (rank 0's GPU only)."""
    space = load_space(
        write_space(
            SPACE.replace("OBJECTIVE", "energy").replace(
                "num_workers: [0, 1]", "world_size: [1, 2]"
            )
        )
    )
    backend = ReplayBackend(_table())
    with pytest.raises(SpaceError, match=r"trial.objective: energy: world_size 2 runs several"):
        tune(space, storage="memory", out_dir=tmp_path, backend=backend)
    assert backend.calls == []


def test_an_energy_study_does_not_prune_on_a_trials_rate(write_space, tmp_path):
    """A real trial process, with a best value no rate can beat: a throughput study prunes
    it; an energy study, whose best value is samples per joule and whose trial progress
    carries no energy, measures it in full."""
    text = """
        workload: {workloads}:tiny
        baseline: {batch_size: 8}
        trial: {warmup_steps: 1, measured_steps: 50, min_window_s: 3, min_warmup_s: 0,
                timeout_s: 120, objective: OBJECTIVE}
        search: {prune: true, prune_after: 0.1}
    """
    config = Config(batch_size=8)
    for objective, status in (("throughput", "pruned"), ("energy", "ok")):
        space = load_space(write_space(text.replace("OBJECTIVE", objective)))
        m = run_trial(space, config, tmp_path / objective, best_value=1e12)
        assert m.status == status, m.reason


def test_on_this_cpu_the_real_probe_says_why_an_energy_study_cannot_run(write_space, tmp_path):
    """The real probe subprocess: where RAPL cannot be read (most machines, this one),
    its capabilities carry the reason and the study stops on it before any trial."""
    from autotune.trial.telemetry import rapl_joules

    joules, why = rapl_joules()
    if joules:
        pytest.skip("this machine's RAPL counters are readable: an energy study can run")
    space = write_space(
        """
        workload: {workloads}:tiny
        baseline: {batch_size: 8}
        trial: {objective: energy}
        """
    )
    with pytest.raises(SpaceError, match="energy cannot be read on this machine") as e:
        tune(space, storage="memory", out_dir=tmp_path / "runs")
    assert why in str(e.value)
    assert not list((tmp_path / "runs").rglob("trial-*"))


def test_the_result_tune_returns_knows_its_objective(write_space, tmp_path):
    space = _space(write_space, "energy")
    result = tune(space, storage="memory", out_dir=tmp_path, backend=ReplayBackend(_table()))
    assert result.objective == "energy"
