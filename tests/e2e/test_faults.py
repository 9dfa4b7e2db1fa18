"""Fault injection: every kind of trial failure is a recorded trial, nothing survives."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from conftest import HERE, ROOT, cuda_available, wait_no_children

from autotune import load_space, tune

FAULTY = HERE / "faulty.py"


def test_every_fault_is_a_recorded_trial_and_the_study_completes(write_space, tmp_path):
    space = write_space(f"""
        workload: {FAULTY}:faulty
        knobs: {{batch_size: [8, 9, 10, 11, 12, 13, 14, 15], num_workers: 1}}
        baseline: {{batch_size: 8}}
        global_batch: free
        trial: {{warmup_steps: 1, measured_steps: 6, timeout_s: 10, memory_cap: 1.5GiB}}
        search: {{prune: false, confirm_top: 0}}  # every fault must run into its own end
        budget: {{n_trials: 8}}
    """)
    result = tune(space, storage=f"sqlite:///{tmp_path}/s.db", out_dir=tmp_path / "runs")
    by_batch = {t.config.batch_size: t for t in result.trials if t.role != "duplicate"}
    assert sorted(by_batch) == [8, 9, 10, 11, 12, 13, 14, 15]  # the whole budget ran
    expect = {
        8: ("ok", ""),
        9: ("failed", "ValueError: the user's loss function has a bug"),
        10: ("oom", "can't allocate memory"),
        11: ("oom", "over the per-trial cap of 1536 MiB; killed"),
        12: ("failed", "killed by SIGABRT in _abort (faulty.py:"),
        13: ("failed", "killed by SIGSEGV in _segfault (faulty.py:"),
        14: ("timeout", "no result within 10 s; killed: hung in _hang (faulty.py:"),
        15: ("nan", "loss is nan at step 0"),
    }
    for batch, (status, text) in expect.items():
        trial = by_batch[batch]
        assert trial.status == status, (batch, trial.status, trial.reason)
        assert text in trial.reason, (batch, trial.reason)
    assert result.best.config.batch_size == 8
    # Failures are infeasible for Optuna (so samplers avoid them), not lost.
    study = optuna.load_study(study_name="space", storage=f"sqlite:///{tmp_path}/s.db")
    states = {t.state for t in study.trials}
    assert states == {optuna.trial.TrialState.COMPLETE}
    measured = [t for t in study.trials if t.user_attrs["role"] != "duplicate"]
    assert sum(1 for t in measured if t.constraints["failed"] > 0) == 6
    assert wait_no_children(tmp_path) == []  # the hung trial's DataLoader worker included


def test_a_hung_worker_and_an_aborted_forward_are_named(write_space, tmp_path):
    """The faults that used to leave empty logs: the reason names the function, its file
    and line, and the process (from the stacks faulthandler wrote)."""
    from autotune import Config
    from autotune.study.runner import run_trial

    space = load_space(
        write_space(f"""
        workload: {FAULTY}:hangs_and_aborts
        global_batch: free
        trial: {{warmup_steps: 1, measured_steps: 2, timeout_s: 10}}
    """)
    )
    hung = run_trial(space, Config(batch_size=8, num_workers=1), tmp_path / "hung")
    assert hung.status == "timeout"
    assert "hung in __getitem__ (faulty.py:" in hung.reason, hung.reason
    assert hung.reason.endswith("in a DataLoader worker"), hung.reason
    aborted = run_trial(space, Config(batch_size=64), tmp_path / "aborted")
    assert aborted.status == "failed"
    assert "killed by SIGABRT in forward (faulty.py:" in aborted.reason, aborted.reason
    assert aborted.reason.endswith("in the trial process"), aborted.reason
    assert wait_no_children(tmp_path) == []


def test_compile_failure_is_recorded_not_fatal(write_space, tmp_path):
    space = write_space(f"""
        workload: {FAULTY}:compile_error
        knobs: {{compile_mode: [off, default]}}
        trial: {{warmup_steps: 1, measured_steps: 2}}
        budget: {{n_trials: 2}}
    """)
    result = tune(space, storage=f"sqlite:///{tmp_path}/s.db", out_dir=tmp_path / "runs")
    by_mode = {t.config.compile_mode: t for t in result.trials}
    assert by_mode["off"].status == "ok"
    assert by_mode["default"].status == "failed"
    assert "InductorError: InvalidCxxCompiler" in by_mode["default"].reason


def _default_sigint() -> None:
    # A shell without job control starts background commands with SIGINT ignored, and
    # the ignore is inherited: a suite run as `.ci/run &` would otherwise see a driver
    # that Ctrl-C cannot reach. The driver gets SIGINT as a terminal would deliver it.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _cli(space: Path, cwd: Path, *args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", "autotune", "run", str(space), *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_default_sigint,
    )


def _wait_for_trial(n: int, cwd: Path, proc: subprocess.Popen, within_s: float = 120) -> None:
    """Wait until the n-th measured trial (1-based) has started."""
    deadline = time.monotonic() + within_s
    while len(list((cwd / "autotune-runs/space").glob("trial-*/spec.json"))) < n:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"trial {n} never started"
        time.sleep(0.1)


SLOW_SPACE = """
    workload: {workloads}:tiny
    knobs: {batch_size: [4, 8, 16, 32]}
    baseline: {batch_size: 8}
    global_batch: free
    trial: {warmup_steps: 1, measured_steps: 1500}
    budget: {n_trials: 4}
"""


def _completed(tmp_path: Path) -> list[optuna.trial.FrozenTrial]:
    study = optuna.load_study(study_name="space", storage=f"sqlite:///{tmp_path}/autotune.db")
    return study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))


def test_ctrl_c_stops_cleanly_and_resumes(write_space, tmp_path):
    space = write_space(SLOW_SPACE)
    driver = _cli(space, tmp_path)
    _wait_for_trial(2, tmp_path, driver)
    time.sleep(1.0)
    driver.send_signal(signal.SIGINT)
    out, err = driver.communicate(timeout=60)
    assert driver.returncode == 130
    assert "interrupted; rerun the same command to resume" in err
    assert "Traceback" not in err
    assert wait_no_children(tmp_path, within_s=2) == []
    rerun = _cli(space, tmp_path)
    out, err = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, err
    assert len({t.user_attrs["config_key"] for t in _completed(tmp_path)}) == 4


@pytest.mark.parametrize(
    ("space_text", "args", "message"),
    [
        (
            "workload: {workloads}:raises_in_factory\n",
            (),
            "raised RuntimeError: the user's factory is broken",
        ),
        (
            "workload: {workloads}:not_a_workload\n",
            (),
            "must return autotune.Workload but returned int",
        ),
        ("workload: {workloads}:missing\n", (), "has no attribute 'missing'"),
        ("workload: nowhere/file.py:f\n", (), "nowhere/file.py does not exist"),
        (
            "workload: {workloads}:tiny\n",
            ("--storage", "sqlite:////nonexistent/dir/x.db"),
            "cannot open storage 'sqlite:////nonexistent/dir/x.db'",
        ),
        ("workload: {workloads}:tiny\n", ("--storage", "nosuchdb://x"), "cannot open storage"),
        pytest.param(
            "workload: {workloads}:tiny\ndevice: cuda\n",
            (),
            "device: cuda, but torch",
            marks=pytest.mark.skipif(cuda_available(), reason="a GPU is visible here"),
        ),
    ],
)
def test_bad_input_is_one_line(write_space, tmp_path, space_text, args, message):
    space = write_space(space_text)
    proc = _cli(space, tmp_path, *args)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, (out, err)
    assert message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err


def test_space_fingerprint_guards_the_study(write_space, tmp_path):
    from autotune import StorageError

    a = write_space(
        "workload: {workloads}:tiny\nknobs: {batch_size: [8, 16]}\n"
        "global_batch: free\ntrial: {measured_steps: 2, warmup_steps: 0}\n"
        "budget: {n_trials: 1}\n",
        "s.yaml",
    )
    storage = f"sqlite:///{tmp_path}/s.db"
    tune(a, storage=storage, out_dir=tmp_path / "runs")
    a.write_text(a.read_text().replace("[8, 16]", "[8, 32]"))
    with pytest.raises(StorageError, match="was made from a different space"):
        tune(load_space(a), storage=storage, out_dir=tmp_path / "runs")
