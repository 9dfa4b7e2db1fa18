"""The CLI end to end, in a subprocess, with a real SQLite study."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import optuna
import yaml
from conftest import ROOT, TINY_SPACE, run_cli


def autotune(*args, cwd):
    return run_cli(*args, cwd=cwd)


def test_tiny_study_end_to_end_then_resume(write_space, tmp_path):
    space = write_space(TINY_SPACE)
    first = autotune("run", str(space), cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    out = first.stdout
    assert "trial 1/3 #0 [baseline] bs=16" in out
    assert "trial 3/3" in out and "recommended (trial #" in out and "speedup over baseline" in out
    # A plain PyTorch workload: the next step suggested is the training-loop export.
    assert re.search(r"^next: autotune report .* --format torch$", out, re.MULTILINE)
    best = yaml.safe_load((tmp_path / "autotune-runs/space/best_config.yaml").read_text())
    assert set(best) == {"config", "measured", "environment", "study"}
    assert best["measured"]["speedup"] >= 1.0
    assert best["environment"]["torch"] and best["environment"]["device"] == "cpu"

    study = optuna.load_study(study_name="space", storage=f"sqlite:///{tmp_path}/autotune.db")
    done = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    assert len(done) >= 3
    assert done[0].user_attrs["role"] == "baseline"
    assert done[0].user_attrs["config"]["batch_size"] == 16
    assert all("measurement" in t.user_attrs for t in done)

    # Same command again: the study is complete, nothing is re-run.
    again = autotune("run", str(space), cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert not re.search(r"^(trial \d|confirm)", again.stdout, re.MULTILINE)
    # A larger budget resumes: the 3 finished trials stay, 2 new ones run.
    more = autotune("run", str(space), "--n-trials", "5", cwd=tmp_path)
    assert more.returncode == 0, more.stderr
    assert "trial 4/5" in more.stdout and "trial 1/5" not in more.stdout
    numbers = [t.number for t in study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))]
    assert numbers[: len(done)] == [t.number for t in done]

    shown = autotune("show", str(space), cwd=tmp_path)
    assert shown.returncode == 0 and "recommended (trial #" in shown.stdout


def test_user_mistakes_give_one_line_and_exit_1(write_space, tmp_path):
    bad_yaml = write_space("workload: [oops\n", "bad.yaml")
    unknown_knob = write_space("workload: m:f\nknobs: {batchsize: [1]}\n", "knob.yaml")
    missing_workload = write_space("workload: no_such_module_xyz:build\n", "wl.yaml")
    conflict = write_space(
        "workload: {workloads}:tiny\nknobs: {compile_mode: default, jit: [off, trace]}\n",
        "conflict.yaml",
    )
    no_blocks = write_space(
        "workload: {workloads}:no_blocks\nknobs: {world_size: 2, fsdp: [off, blocks]}\n",
        "no_blocks.yaml",
    )
    negative_cost = write_space(
        "workload: {workloads}:tiny\ntrial: {planned_steps: 9, cost_per_hour: -1}\n", "cost.yaml"
    )
    two_lengths = write_space(
        "workload: {workloads}:tiny\ntrial: {planned_steps: 9, planned_tokens: 9}\n", "len.yaml"
    )
    for path, message in [
        (conflict, "knobs.jit: trace can never apply: needs compile_mode off"),
        (negative_cost, "trial.cost_per_hour: must be a number >= 0 but got -1"),
        (two_lengths, "trial.planned_steps and trial.planned_tokens: at most one of"),
        (bad_yaml, "not valid YAML"),
        (unknown_knob, "knobs.batchsize: unknown key (did you mean 'batch_size'?)"),
        (missing_workload, "cannot import module 'no_such_module_xyz'"),
        (no_blocks, "knobs.fsdp: blocks cannot apply: the workload exposes no blocks"),
    ]:
        r = autotune("run", str(path), cwd=tmp_path)
        assert r.returncode == 1
        assert message in r.stderr
        assert "Traceback" not in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
        if path in (conflict, negative_cost, two_lengths):  # before the probe and any trial
            assert not (tmp_path / "autotune-runs").exists()
        if path == no_blocks:  # rejected after the probe, before any trial
            assert not list((tmp_path / "autotune-runs").glob("*/trial-*"))


def test_debug_shows_the_traceback(write_space, tmp_path):
    path = write_space("workload: m:f\nknobs: {batchsize: [1]}\n")
    r = autotune("--debug", "validate", str(path), cwd=tmp_path)
    assert r.returncode == 1 and "Traceback" in r.stderr


def test_a_reader_that_leaves_the_pipe_early_gets_no_traceback(tmp_path):
    """`autotune knobs --markdown | head -0`: the reader closes the pipe before the CLI
    writes (its imports take a second), so the first write or the flush at exit fails."""
    command = [sys.executable, "-m", "autotune", "knobs", "--markdown"]
    proc = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    proc.wait(timeout=120)
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


def test_bad_run_arguments_give_one_line_and_exit_1(tmp_path):
    """Each is rejected before anything runs: no storage, no run folder."""
    space = str(ROOT / "search_spaces" / "cpu.yaml")
    cases = [
        (["--n-trials", "0"], "n_trials must be at least 1 but got 0"),
        (["--n-trials", "-1"], "n_trials must be at least 1 but got -1"),
        (["--timeout", "-5"], "timeout_s must be a number > 0 but got -5.0"),
        (["--timeout", "nan"], "timeout_s must be a number > 0 but got nan"),
        (["--gpus", "x"], "gpus must be 'all' or a list like 0,1,2 but got 'x'"),
        (["--gpus", "0,,1"], "gpus must be 'all' or a list like 0,1,2 but got '0,,1'"),
        (["--gpus", "1,0,1"], "gpus lists GPU 1 twice (one worker per GPU)"),
        (["--jobs", "0"], "jobs must be at least 1 but got 0"),
        (["--worker-index", "-1"], "worker_index must be at least 0 but got -1"),
        (
            ["--out", "/proc/x"],
            "out: cannot create the folder /proc/x/cpu: No such file or directory",
        ),
    ]
    for args, message in cases:
        r = autotune("run", space, *args, cwd=tmp_path)
        assert r.returncode == 1, (args, r.stdout, r.stderr)
        assert r.stderr.strip() == f"autotune: error: {message}", args
        assert list(tmp_path.iterdir()) == [], args  # no autotune.db, no autotune-runs


def test_bad_report_argument_gives_one_line_and_exit_1(tmp_path):
    space = str(ROOT / "search_spaces" / "cpu.yaml")
    r = autotune("report", space, "--profile-steps", "0", cwd=tmp_path)
    assert r.returncode == 1
    assert r.stderr.strip() == "autotune: error: profile_steps must be at least 1 but got 0"


PIPE_SPACE = """
    workload: {workloads}:sleepy
    knobs:
      batch_size: [4, 8, 16]
    baseline: {batch_size: 8}
    global_batch: 16
    trial: {warmup_steps: 1, measured_steps: 10}
    budget: {n_trials: 3}
    search: {sampler: grid, confirm_top: 1, prune: false}  # every line ok: none pruned
"""


def test_run_into_a_file_gives_whole_lines(write_space, tmp_path):
    """`autotune run SPACE > out.txt`: every progress line whole, one summary row a line
    between ASCII borders, no colour codes (issue 28: a file cut the table at a fixed width,
    mid-character, and wrapped long reasons mid-number)."""
    space = write_space(PIPE_SPACE)
    with open(tmp_path / "out.txt", "w") as out:
        r = subprocess.run(
            [sys.executable, "-m", "autotune", "run", str(space)],
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=out,
            stderr=subprocess.PIPE,
            text=True,
            timeout=600,
        )
    assert r.returncode == 0, r.stderr
    lines = (tmp_path / "out.txt").read_text().splitlines()
    assert not any("\x1b[" in line for line in lines)  # no colour codes in a file
    progress = [ln for ln in lines if re.match(r"(trial \d|confirm round \d)", ln)]
    assert len(progress) >= 3
    for line in progress:  # each whole: head, config, rate, status, best
        assert re.fullmatch(r".+ \| .+/s.* \| ok \| best #\d+ [\d.]+x", line), line
    border = [i for i, ln in enumerate(lines) if re.fullmatch(r"\+-+\+", ln)]
    assert len(border) == 2, lines
    header, rows = lines[border[0] + 1], lines[border[0] + 3 : border[1]]
    assert len(rows) == 3  # one line per config
    for row in [header, *rows]:
        assert row.startswith("|") and row.endswith("|") and row.count("|") == header.count("|")
    assert any(ln.startswith("recommended (trial #") for ln in lines)
    # A summary line longer than any terminal is one line, not wrapped at a width.
    split = [ln for ln in lines if ln.startswith("where a trial's time goes")]
    assert len(split) == 1 and len(split[0]) > 160, split
    assert re.fullmatch(r"where a trial's time goes \(.*\(of [\d.]+ from spawn to exit\)", split[0])


def test_a_long_reason_is_whole_in_plain_output():
    """The summary table of a file or pipe keeps a trial's whole reason on its row (a
    terminal's table cuts it to 40 characters)."""
    import io

    from rich.console import Console

    from autotune import Config, Measurement
    from autotune.output.console import PLAIN_WIDTH, print_summary
    from autotune.results import BASELINE, TrialRecord, TuneResult

    ok = Measurement(status="ok", samples_per_s=100.0, samples_per_step=32, measured_steps=4)
    base = TrialRecord(0, Config(batch_size=8), ok, 100.0, role=BASELINE)
    reason = (
        "pruned after 5/15 measured steps: ~67,566.6 tokens/s cannot beat the best 84,386.9 by 20%"
    )
    pruned = TrialRecord(
        1, Config(batch_size=16), ok.replace(status="pruned"), 0.0, status="pruned", reason=reason
    )
    result = TuneResult("s", "memory", [base, pruned], baseline=base, best=base)
    out = io.StringIO()
    print_summary(result, Console(file=out, width=PLAIN_WIDTH, soft_wrap=True, no_color=True))
    row = next(ln for ln in out.getvalue().splitlines() if ln.startswith("|   1 "))
    assert f"pruned: {reason}" in row
