from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
WORKLOADS = HERE / "workloads.py"

# Keep matplotlib and the inductor cache out of the home directory.
os.environ.setdefault("MPLCONFIGDIR", "/tmp/autotune-test-mpl")


def child_processes(marker: Path) -> list[int]:
    """PIDs of trial processes (and their forked workers) whose command line names marker
    (a spawned trial) or whose stdout or stderr is a run's log under marker (a trial
    forked by the warm launcher has the launcher's command line; the launcher's own log is
    ``launcher.log``)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if "autotune.trial" not in cmdline:
            continue
        if str(marker) in cmdline or any(
            log.startswith(str(marker)) and log.endswith(("stdout.log", "stderr.log"))
            for log in _logs(entry)
        ):
            pids.append(int(entry.name))
    return pids


def _logs(proc: Path) -> list[str]:
    """Where a process's stdout and stderr go."""
    out = []
    for fd in ("1", "2"):
        try:
            out.append(os.readlink(proc / "fd" / fd))
        except OSError:
            pass
    return out


def wait_no_children(marker: Path, within_s: float = 10.0) -> list[int]:
    deadline = time.monotonic() + within_s
    while (left := child_processes(marker)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def run_cli(*args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    """``python -m autotune ARGS`` in a subprocess, with this checkout on the path."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "autotune", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    """The one skip helper for GPU tests: `@pytest.mark.cuda` skips cleanly without CUDA."""
    if cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def eager_inductor(monkeypatch):
    """Replace inductor's code generation by the eager FX graph and record each graph's inputs.

    Dynamo still traces, guards and recompiles for real; only the slow C++ build is skipped.
    """
    import torch
    import torch._inductor.compile_fx as compile_fx

    graphs = []

    def record(gm, example_inputs, **kwargs):
        graphs.append(example_inputs)
        return gm.forward

    monkeypatch.setattr(compile_fx, "compile_fx", record)
    torch._dynamo.reset()
    yield graphs
    torch._dynamo.reset()


@pytest.fixture
def write_space(tmp_path):
    """Write a space file into tmp_path; `{workloads}` expands to the test workloads file.

    The suite's spaces time their steps, not a minimum time (:func:`quick_windows`), and
    confirm in their least rounds (:func:`quick_rounds`)."""

    def write(text: str, name: str = "space.yaml") -> Path:
        path = tmp_path / name
        text = textwrap.dedent(text).replace("{workloads}", str(WORKLOADS))
        text = quick_rounds(quick_windows(text))
        path.write_text(text)
        return path

    return write


QUICK = "min_window_s: 0, min_warmup_s: 0"


def _into_flow(line: str, section: str, entries: str) -> str | None:
    """``line`` when it is a flow-style ``section: {...}`` line, with ``entries`` put
    first inside its braces (a trailing comment dropped); else ``None``."""
    found = re.match(rf"^(\s*){section}: \{{(.*)\}}(\s*#.*)?$", line)
    if not found:
        return None
    inside = found.group(2).strip()
    return f"{found.group(1)}{section}: {{{entries}{', ' + inside if inside else ''}}}"


def quick_rounds(text: str) -> str:
    """A test space's confirmation runs its ``confirm_rounds`` and no more: a flow-style
    ``search: {...}`` line that says nothing of ``confirm_max_rounds`` or
    ``confirm_max_s`` gets ``confirm_max_s: 0`` (no round past the least).
    Tiny workloads leave many decisions unresolved, and up to 20 rounds of every live
    study would triple the suite; the added rounds are tested on replayed studies
    (tests/study/test_confirm.py) and in tests/e2e/test_ablation.py, which asks for them."""
    if "confirm_max" in text:
        return text
    lines = text.splitlines()
    for i, line in enumerate(lines):
        quick = _into_flow(line, "search", "confirm_max_s: 0")
        if quick is not None:
            lines[i] = quick
            return "\n".join(lines) + "\n"
    return text


def quick_windows(text: str) -> str:
    """A test space's windows run their steps only: ``trial.min_window_s`` and
    ``min_warmup_s`` at 0 where the space says nothing of them. The defaults (a window of
    at least 1.5 s, a warm-up of 0.5 s) would add 2 s to each of the suite's hundreds of
    trial processes; tests/trial/test_window.py tests the minimums themselves. Only a
    flow-style ``trial: {...}`` line is touched, or a ``trial:`` line is added after the
    ``workload:`` line; a space that sets either minimum is left as written."""
    if "min_window_s" in text or "min_warmup_s" in text:
        return text
    lines = text.splitlines()
    for i, line in enumerate(lines):
        quick = _into_flow(line, "trial", QUICK)
        if quick is not None:
            lines[i] = quick
            return "\n".join(lines) + "\n"
        if re.match(r"^\s*trial:", line):  # a block or another style: as written
            return text
    for i, line in enumerate(lines):
        found = re.match(r"^(\s*)workload:", line)
        if found:
            lines.insert(i + 1, f"{found.group(1)}trial: {{{QUICK}}}")
            return "\n".join(lines) + "\n"
    return text


TINY_SPACE = """
    workload: {workloads}:tiny
    knobs:
      batch_size: [8, 16, 32]
      num_workers: [0, 1]
    baseline: {batch_size: 16}
    global_batch: 32
    trial: {warmup_steps: 1, measured_steps: 4, timeout_s: 120}
    budget: {n_trials: 3}
    search: {seed: 1, confirm_top: 0}
"""


SMALL_SPACE = """
    workload: {workloads}:tiny
    knobs:
      batch_size: [8, 16, 32]
      amp_dtype: [fp32, bf16]
    baseline: {batch_size: 16}
    global_batch: 32
    trial: {warmup_steps: 1, measured_steps: 4, timeout_s: 120}
    budget: {n_trials: 4}
    search: {seed: 1, confirm_top: 0}
"""


@pytest.fixture(scope="session")
def small_study(tmp_path_factory):
    """A real 4-trial study of the tiny workload, run once per test session.

    Returns (space, storage URL, run folder, TuneResult). Tests may add to the study's
    user attrs (profiles) but must not run more trials in it.
    """
    from autotune import load_space, tune

    root = tmp_path_factory.mktemp("small-study")
    path = root / "small.yaml"
    path.write_text(textwrap.dedent(SMALL_SPACE).replace("{workloads}", str(WORKLOADS)))
    space = load_space(path)
    storage = f"sqlite:///{root}/autotune.db"
    result = tune(space, storage=storage, out_dir=root / "runs")
    return space, storage, root / "runs", result
