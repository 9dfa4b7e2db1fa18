"""``autotune verify``: a real tiny study, then its baseline and recommendation run longer
in fresh processes through ``autotune.apply_workload``, in paired rounds, via the CLI."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

import pytest
from conftest import run_cli, wait_no_children

from autotune import load_space, tune

# Batch 2 with 16 accumulation steps against batch 32: on the tiny MLP the per-micro-batch
# overhead dominates, so batch 32 wins by far more than a loaded machine's noise.
VERIFY_SPACE = """
    workload: {workloads}:tiny
    knobs:
      batch_size: [2, 32]
    baseline: {batch_size: 2}
    global_batch: 32
    trial: {min_window_s: 0, min_warmup_s: 0, warmup_steps: 1, measured_steps: 4, timeout_s: 120}
    budget: {n_trials: 2}
    search: {sampler: grid, confirm_top: 0}
"""

# One config: the baseline is the only trial, so it is the recommendation.
ONE_CONFIG_SPACE = """
    workload: {workloads}:tiny
    knobs:
      batch_size: [16]
    trial: {warmup_steps: 1, measured_steps: 2, timeout_s: 120}
    budget: {n_trials: 1}
    search: {confirm_top: 0}
"""


def _number(pattern: str, text: str) -> tuple[float, ...]:
    found = re.search(pattern, text, re.MULTILINE)
    assert found, f"no line matching {pattern!r} in:\n{text}"
    return tuple(float(g) for g in found.groups())


def test_verify_runs_paired_rounds_and_prints_predicted_observed_and_error(write_space, tmp_path):
    space_path = write_space(VERIFY_SPACE)
    storage, runs = f"sqlite:///{tmp_path}/autotune.db", tmp_path / "runs"
    result = tune(load_space(space_path), storage=storage, out_dir=runs)
    assert result.best.config.batch_size == 32 and result.baseline.config.batch_size == 2

    out = run_cli(
        "verify",
        str(space_path),
        "--storage",
        storage,
        "--out",
        str(runs),
        "--rounds",
        "2",
        "--max-rounds",
        "2",
        "--steps-factor",
        "2",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout
    # a line per run as it finishes, in the order they ran
    starts = [ln.split(":")[0] for ln in text.splitlines() if re.match(r"run \d+/", ln)]
    base, best = f"baseline #{result.baseline.number}", f"recommended #{result.best.number}"
    assert starts == [
        f"run 1/4 · round 1 {base}",
        f"run 2/4 · round 1 {best}",
        f"run 3/4 · round 2 {best}",
        f"run 4/4 · round 2 {base}",
    ]
    assert re.search(
        r"^round 1: baseline [\d,.]+ · recommended [\d,.]+ samples/s · ratio "
        r"[\d.]+ \(baseline first\)$",
        text,
        re.MULTILINE,
    ), text
    assert re.search(r"^round 2: .* \(recommended first\)$", text, re.MULTILINE), text
    (predicted,) = _number(r"^predicted speedup: ([\d.]+)x \(the study's\)$", text)
    observed, low, high = _number(
        r"^observed speedup: ([\d.]+)x \(median of 2 rounds, range ([\d.]+)x-([\d.]+)x\)$", text
    )
    (error_pct,) = _number(r"^error: ([+-][\d.]+)% \(observed / predicted - 1\); ", text)
    assert (
        "run length: 8 optimizer steps (2x the trial's 4 measured steps) after 1 warm-up step,"
        in text
    )
    (logs,) = re.search(r"^logs: (.+) \(verify\.json", text, re.MULTILINE).groups()

    # the data agrees with the printed figures
    folder = Path(logs) if Path(logs).is_absolute() else tmp_path / logs
    data = json.loads((folder / "verify.json").read_text())
    assert data["order"] == [
        [1, "baseline"],
        [1, "recommended"],
        [2, "recommended"],
        [2, "baseline"],
    ]
    assert data["predicted_speedup"] == pytest.approx(result.speedup)
    ratios = [r["ratio"] for r in data["ratios"]]
    assert len(ratios) == 2
    assert data["observed_speedup"] == pytest.approx(statistics.median(ratios))
    assert data["error"] == pytest.approx(data["observed_speedup"] / data["predicted_speedup"] - 1)
    assert predicted == round(data["predicted_speedup"], 3)
    assert observed == round(data["observed_speedup"], 3)
    assert (low, high) == (round(min(ratios), 3), round(max(ratios), 3))
    assert error_pct == round(100 * data["error"], 1)
    # The designed gap shows in both: 16 micro-batches against one, every round (a verify
    # that ran the baseline twice, or divided the wrong way, observes ~1x or below).
    assert predicted > 2 and observed > 2 and low > 1.5, (predicted, observed, low)

    # each run: a fresh process of autotune.trial.verify, its own folder, the asked steps
    for run in data["runs"]:
        assert run["status"] == "ok", run
        assert run["steps"] == 8 and run["result"]["warmup_steps"] == 1
        assert run["rate"] == pytest.approx(run["result"]["samples_per_s"])
        spec = json.loads((Path(run["folder"]) / "spec.json").read_text())
        trial = result.baseline if run["role"] == "baseline" else result.best
        assert spec["config"] == trial.config.to_dict()
    by_round = {(r["round"], r["role"]): r["rate"] for r in data["runs"]}
    assert ratios[0] == pytest.approx(by_round[1, "recommended"] / by_round[1, "baseline"])

    # a run that cannot finish is a clear line and no ratio, not a traceback; exit code 2
    out = run_cli(
        "verify",
        str(space_path),
        "--storage",
        storage,
        "--out",
        str(runs),
        "--rounds",
        "1",
        "--timeout",
        "0.5",
        cwd=tmp_path,
    )
    assert out.returncode == 2, out.stdout + out.stderr
    assert f"run 1/2 · round 1 {base}: timeout: no result within 0.5 s; killed" in out.stdout
    assert "observed speedup: - (no round completed both runs)" in out.stdout
    assert "Traceback" not in out.stdout + out.stderr
    assert wait_no_children(runs) == []  # killed with its process group


def test_verify_a_study_whose_recommendation_is_the_baseline_says_so(write_space, tmp_path):
    space_path = write_space(ONE_CONFIG_SPACE)
    storage, runs = f"sqlite:///{tmp_path}/autotune.db", tmp_path / "runs"
    tune(load_space(space_path), storage=storage, out_dir=runs)
    args = ("verify", str(space_path), "--storage", storage, "--out", str(runs))
    out = run_cli(*args, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "is the baseline (trial #0, bs=16): nothing to verify" in out.stdout
    out = run_cli(*args, "--json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["same_config"] is True and data["runs"] == []
    assert not (runs / "space" / "verify").exists()


@pytest.mark.parametrize(
    "extra, message",
    [
        ((), "storage 'sqlite:///nothing.db' does not exist"),
        (("--rounds", "0"), "rounds must be an integer >= 1 but got 0"),
    ],
)
def test_verify_errors_are_one_line(write_space, tmp_path, extra, message):
    space_path = write_space(VERIFY_SPACE)
    out = run_cli(
        "verify", str(space_path), "--storage", "sqlite:///nothing.db", *extra, cwd=tmp_path
    )
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"autotune: error: {message}"), out.stderr
    assert not (tmp_path / "nothing.db").exists()
