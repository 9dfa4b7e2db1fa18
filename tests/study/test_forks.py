"""The warm launcher: trials forked from a process that has imported torch are what
spawned trials are, and a trial's crash or hang harms neither the launcher nor the next."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import HERE, TINY_SPACE

from autotune import Config, load_space, tune
from autotune.study import forks
from autotune.study.forks import Launcher, LauncherError
from autotune.study.runner import run_trial

# A workload that writes, when the trial imports it, what it finds of the process.
STATE_WORKLOAD = """
import faulthandler, json, os, random, signal, sys
import numpy as np
import torch
import torch._functorch.config, torch._inductor.config  # read the environment when loaded

def _state():
    return {
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "cudnn_deterministic": torch.backends.cudnn.deterministic,
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "tf32_cudnn": torch.backends.cudnn.allow_tf32,
        "matmul_precision": torch.get_float32_matmul_precision(),
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "num_threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "default_dtype": str(torch.get_default_dtype()),
        "grad_enabled": torch.is_grad_enabled(),
        "cuda_initialized": torch.cuda.is_initialized(),
        "fx_graph_cache": torch._inductor.config.fx_graph_cache,
        "autograd_cache": torch._functorch.config.enable_autograd_cache,
        "torch_seed": torch.initial_seed(),
        "torch_rand": torch.rand(3).tolist(),
        "python_rand": random.random(),
        "numpy_rand": float(np.random.rand()),
        "own_group": os.getpgid(0) == os.getpid(),
        "cwd": os.getcwd(),
        "path0": sys.path[0],
        "argv": sys.argv[1:],
        "main": sys.modules["__main__"].__spec__.name,
        "env": {k: v for k, v in os.environ.items() if k not in ("AUTOTUNE_SPAWNED_AT",
                                                                 "AUTOTUNE_DRIVER_PID")},
        "faulthandler": faulthandler.is_enabled(),
        "sigint": str(signal.getsignal(signal.SIGINT)),
        "sigchld": str(signal.getsignal(signal.SIGCHLD)),
        "stdin": os.readlink("/proc/self/fd/0"),
        "stdout": os.path.basename(os.readlink("/proc/self/fd/1")),
        "from_the_user_path": __import__("helper").VALUE,
    }

STATE = _state()
with open(os.path.join(os.path.dirname(sys.argv[-1]), "state.json"), "w") as f:
    json.dump(STATE, f)

from workloads import tiny as workload
"""


@pytest.fixture
def state_space(write_space, tmp_path, monkeypatch):
    # The launcher starts before the driver's environment, path and folder change: the
    # forked run must take the run's, not the launcher's.
    forks.shutdown()
    forks.prestart()
    (tmp_path / "state_workload.py").write_text(STATE_WORKLOAD)
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "helper.py").write_text("VALUE = 42\n")
    # on the run's PYTHONPATH: a spawned interpreter puts it on sys.path, so must a fork
    path = [str(lib), str(HERE), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, path)))
    monkeypatch.setenv("AUTOTUNE_TEST_MARK", "set by the driver")
    monkeypatch.chdir(tmp_path)
    space = load_space(
        write_space("""
        workload: state_workload.py:workload
        trial: {warmup_steps: 1, measured_steps: 2, timeout_s: 120,
                min_window_s: 0, min_warmup_s: 0}
    """)
    )
    return space


def _with(space, how):
    return replace(space, trial=replace(space.trial, launcher=how))


def _state(folder: Path) -> dict:
    return json.loads((folder / "state.json").read_text())


def test_a_forked_trial_finds_the_process_a_spawned_one_finds(state_space, tmp_path):
    config = Config(batch_size=16)
    runs = {}
    for name, how in (("fork-a", "fork"), ("spawn", "spawn"), ("fork-b", "fork")):
        m = run_trial(_with(state_space, how), config, tmp_path / name)
        assert m.ok, m.reason
        assert m.launcher == how
        runs[name] = _state(tmp_path / name)
    forked, spawned, other = runs["fork-a"], runs["spawn"], runs["fork-b"]
    random_draws = ("torch_seed", "torch_rand", "python_rand", "numpy_rand")
    differs = {k for k in spawned if k not in random_draws and forked[k] != spawned[k]}
    # the run's own folder is the only difference (argv names it)
    assert differs == {"argv"}, {k: (forked[k], spawned[k]) for k in differs}
    assert forked["env"]["AUTOTUNE_TEST_MARK"] == "set by the driver"
    assert forked["cuda_initialized"] is False and forked["own_group"] is True
    # seeds a spawned interpreter draws from the OS are not the launcher's, shared
    for key in random_draws:
        assert forked[key] != other[key], key


@pytest.fixture
def faulty_space(write_space):
    return load_space(
        write_space(f"""
        workload: {HERE / "faulty.py"}:hangs_and_aborts
        global_batch: free
        trial: {{warmup_steps: 1, measured_steps: 2, timeout_s: 15,
                 min_window_s: 0, min_warmup_s: 0}}
    """)
    )


def test_a_crash_or_a_hang_harms_neither_the_launcher_nor_the_next_trial(faulty_space, tmp_path):
    ok = run_trial(faulty_space, Config(batch_size=8), tmp_path / "first")
    assert ok.ok and ok.launcher == "fork", ok.reason
    pid = forks.STATE.launcher.proc.pid
    aborted = run_trial(faulty_space, Config(batch_size=64), tmp_path / "abort")
    assert aborted.status == "failed" and "SIGABRT" in aborted.reason
    assert "forward" in aborted.reason, aborted.reason
    hung = run_trial(faulty_space, Config(batch_size=8, num_workers=1), tmp_path / "hang")
    assert hung.status == "timeout" and "__getitem__" in hung.reason, hung.reason
    assert "DataLoader worker" in hung.reason, hung.reason
    again = run_trial(faulty_space, Config(batch_size=8), tmp_path / "again")
    assert again.ok and again.launcher == "fork", again.reason
    assert forks.STATE.launcher.proc.pid == pid  # the same launcher served them all
    assert again.losses == ok.losses  # and the next trial is the trial it was


def test_a_launcher_that_dies_takes_its_runs_with_it_and_the_next_run_gets_a_new_one(
    tmp_path, write_space
):
    warm = Launcher()
    (tmp_path / "out.log").touch()
    sleeper = warm.launch(
        "timeit",
        ["-n", "1", "import time; time.sleep(120)"],
        tmp_path / "out.log",
        tmp_path / "err.log",
        warm.env,
    )
    assert sleeper.poll() is None
    os.kill(warm.proc.pid, signal.SIGKILL)
    assert sleeper.wait(timeout=10) == -signal.SIGKILL
    with pytest.raises(ProcessLookupError):  # died with the launcher (PR_SET_PDEATHSIG)
        _wait_gone(sleeper.pid)
    with pytest.raises(LauncherError, match="gone|died"):
        warm.launch("timeit", ["pass"], tmp_path / "o", tmp_path / "e", warm.env)
    # the driver's shared launcher is started again once after it died
    forks.shutdown()
    space = load_space(
        write_space("""
        workload: {workloads}:tiny
        trial: {warmup_steps: 1, measured_steps: 2, timeout_s: 120,
                min_window_s: 0, min_warmup_s: 0}
    """)
    )
    first = run_trial(space, Config(batch_size=16), tmp_path / "a")
    shared = forks.STATE.launcher
    os.kill(shared.proc.pid, signal.SIGKILL)
    shared.proc.wait()
    second = run_trial(space, Config(batch_size=16), tmp_path / "b")
    assert first.launcher == second.launcher == "fork"
    assert forks.STATE.launcher is not shared and second.losses == first.losses


def _wait_gone(pid: int) -> None:
    """Raise ProcessLookupError once ``pid`` is gone (a zombie counts as alive for kill)."""
    import time

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        os.kill(pid, 0)
        time.sleep(0.05)


def test_launcher_spawn_spawns_each_run(write_space, tmp_path):
    space = load_space(
        write_space("""
        workload: {workloads}:tiny
        trial: {warmup_steps: 1, measured_steps: 2, timeout_s: 120, launcher: spawn,
                min_window_s: 0, min_warmup_s: 0}
    """)
    )
    m = run_trial(space, Config(batch_size=16), tmp_path / "s")
    assert m.ok and m.launcher == "spawn", m.reason
    assert m.import_s > 0.2  # a spawned interpreter imports torch itself


def test_the_launcher_loads_the_trial_code_and_the_compiler_but_not_cuda():
    """A forked CUDA context is unusable: CUDA starts in the trial. TorchDynamo (which
    every optimizer imports) and inductor (which ``torch.compile()`` imports) are loaded."""
    code = textwrap.dedent("""
        import sys
        from autotune.trial.launcher import preload
        preload()
        import torch
        names = ("autotune.trial.main", "torch._dynamo", "torch._inductor.compile_fx")
        print(torch.cuda.is_initialized(), *(m in sys.modules for m in names))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True", "True", "True"]


def test_a_run_that_changes_a_variable_read_at_import_is_spawned(
    write_space, tmp_path, monkeypatch
):
    """The launcher read OMP_NUM_THREADS when it loaded torch: a run that sets another
    value would get the launcher's thread pool, so it is spawned."""
    space = load_space(
        write_space("""
        workload: {workloads}:tiny
        trial: {warmup_steps: 1, measured_steps: 2, timeout_s: 120,
                min_window_s: 0, min_warmup_s: 0}
    """)
    )
    first = run_trial(space, Config(batch_size=16), tmp_path / "a")
    monkeypatch.setenv("OMP_NUM_THREADS", "2" if os.environ.get("OMP_NUM_THREADS") == "1" else "1")
    second = run_trial(space, Config(batch_size=16), tmp_path / "b")
    assert (first.launcher, second.launcher) == ("fork", "spawn")
    assert second.ok and second.losses == first.losses, second.reason
    warm = forks.STATE.launcher
    env = {**os.environ, **forks.import_env(os.environ)}  # what a run gets
    assert warm.differs_at_import(env) == ["OMP_NUM_THREADS"]
    # read by the run itself: its own value is taken
    for name in ("PYTHONPATH", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        assert warm.differs_at_import({**warm.env, name: "/elsewhere"}) == []
    # read when inductor's config loads, in the launcher
    off = {**warm.env, "TORCHINDUCTOR_FX_GRAPH_CACHE": "0"}
    assert warm.differs_at_import(off) == ["TORCHINDUCTOR_FX_GRAPH_CACHE"]


def _launchers_of(pid: int) -> list[int]:
    """The warm launchers among the children of ``pid``."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    found = []
    for child in children:
        try:
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            continue
        if b"autotune.trial.launcher" in cmdline:
            found.append(int(child))
    return found


def test_a_study_forks_its_runs_and_leaves_no_launcher_behind(write_space, tmp_path):
    forks.shutdown()
    space = load_space(write_space(TINY_SPACE))
    result = tune(space, storage=f"sqlite:///{tmp_path}/s.db", out_dir=tmp_path / "runs")
    assert len(result.trials) == 3
    assert {t.measurement.launcher for t in result.trials} == {"fork"}
    assert (tmp_path / "runs" / "space" / "launcher.log").is_file()
    assert forks.STATE.launcher is None and _launchers_of(os.getpid()) == []
