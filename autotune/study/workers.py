"""Several workers on this machine sharing one study: one per GPU, or N on the CPU.

Each worker is an ``autotune run`` process pointed at the same storage and study (see
:mod:`autotune.study.coordination` for how they split the work); on a GPU machine each is
pinned to its GPU with ``CUDA_VISIBLE_DEVICES``. The storage URL reaches the workers in
their environment (``AUTOTUNE_STORAGE``), never on their command lines, which every local
user can read (``ps``, ``/proc/PID/cmdline``): it may hold a password.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import optuna

from ..credentials import ENV as STORAGE_ENV
from ..errors import ArgumentError, AutotuneError
from ..results import TuneResult
from ..space import Space
from ..space_file import load_space
from .reporter import Reporter
from .sampling import make_sampler
from .storage import load_result, open_study

CPU_WORKERS_WARNING = (
    "{n} CPU workers share this machine's cores; their trials slow each other down, so "
    "throughputs are distorted. Prefer one worker per machine or per GPU."
)


def gpu_ids(gpus: str | Sequence[int]) -> list[str]:
    """The GPUs to use: ``"all"`` (every GPU NVML sees), ``"0,1,2"`` or a list of indexes,
    each a GPU this machine has, none twice.

    Raises:
        ArgumentError: ``gpus`` is neither ``all`` nor a list of indexes, lists one twice,
            or names a GPU this machine does not have.
        AutotuneError: NVML finds no GPU.
    """
    if not isinstance(gpus, str):
        ids = [str(g) for g in gpus]
    elif gpus != "all":
        ids = [g.strip() for g in gpus.split(",")]
    else:
        return [str(i) for i in range(_gpu_count("all"))]
    if not ids or not all(g.isdigit() for g in ids):
        raise ArgumentError(f"gpus must be 'all' or a list like 0,1,2 but got {gpus!r}")
    twice = sorted({g for g in ids if ids.count(g) > 1}, key=int)
    if twice:
        raise ArgumentError(f"gpus lists GPU {twice[0]} twice (one worker per GPU)")
    count = _gpu_count(",".join(ids))
    missing = [g for g in ids if int(g) >= count]
    if missing:
        raise ArgumentError(
            f"gpus {','.join(ids)}: this machine has {count} GPU{'s' * (count != 1)} "
            f"(0-{count - 1}), no GPU {missing[0]}"
        )
    return ids


def _gpu_count(asked: str) -> int:
    """How many GPUs NVML sees (all of them: indexes before CUDA_VISIBLE_DEVICES)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
    except Exception as e:  # no driver, no library: NVMLError and friends
        raise AutotuneError(f"gpus {asked}: no NVIDIA GPUs found here ({e})") from None
    if count == 0:
        raise AutotuneError(f"gpus {asked}: no NVIDIA GPUs found here")
    return count


def worker_command(
    space: str | Path,
    storage: str,
    study_name: str,
    index: int,
    device: str | None,
    *,
    n_trials: int | None = None,
    timeout_s: float | None = None,
    out_dir: str | Path | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The command line and environment of one worker: the storage in ``AUTOTUNE_STORAGE``
    (not in argv), the GPU in ``CUDA_VISIBLE_DEVICES``."""
    cmd = [sys.executable, "-m", "autotune", "run", str(space), "--no-summary"]
    cmd += ["--study-name", study_name, "--worker-index", str(index)]
    for flag, value in (("--n-trials", n_trials), ("--timeout", timeout_s), ("--out", out_dir)):
        if value is not None:
            cmd += [flag, str(value)]
    env = {**os.environ, STORAGE_ENV: storage}
    if device is not None:
        env["CUDA_VISIBLE_DEVICES"] = device
    return cmd, env


def run_workers(
    space: str | Path,
    *,
    jobs: int | None = None,
    gpus: str | Sequence[int] | None = None,
    n_trials: int | None = None,
    timeout_s: float | None = None,
    storage: str | None = None,
    study_name: str | None = None,
    out_dir: str | Path | None = None,
    worker_index: int = 0,
    reporter: Reporter | None = None,
) -> TuneResult:
    """Run one worker per GPU (``gpus``) or ``jobs`` workers on this machine, sharing one
    study, and wait for them; the library form of ``autotune run --gpus/--jobs``.

    Args:
        space: the space file (each worker is an ``autotune run`` of it).
        jobs: how many CPU workers (each measures its own trials; they share the cores).
        gpus: ``"all"``, ``"0,1"`` or a list of GPU indexes: one worker per GPU.
        n_trials, timeout_s, storage, study_name, out_dir: as for :func:`autotune.tune`
            (the budget is the study's, shared by the workers). The storage reaches the
            workers in their environment (``AUTOTUNE_STORAGE``), never in their argv.
        worker_index: this host's index when several hosts share the study: worker
            indexes (sampler seeds) stay unique across hosts.
        reporter: receives the warning about CPU workers sharing cores.

    Returns:
        The study's result once every worker is done.

    Raises:
        ArgumentError: neither or both of ``jobs`` and ``gpus``, ``jobs`` below 1, or a
            bad GPU list.
        AutotuneError: a worker failed (its error is in its output).
    """
    if (jobs is None) == (gpus is None):
        raise ArgumentError("run_workers needs jobs or gpus (one of them)")
    if jobs is not None and (isinstance(jobs, bool) or jobs < 1):
        raise ArgumentError(f"jobs must be at least 1 but got {jobs}")
    if worker_index < 0:
        raise ArgumentError(f"worker_index must be at least 0 but got {worker_index}")
    devices: list[str | None] = list(gpu_ids(gpus)) if gpus is not None else [None] * jobs
    loaded: Space = load_space(space)
    storage = loaded.storage_url(storage)
    name = study_name or loaded.study.name
    if gpus is None and jobs > 1:
        (reporter or Reporter()).note(CPU_WORKERS_WARNING.format(n=jobs))
    # Create the study once: workers starting together then only load it.
    open_study(loaded, storage, name, make_sampler(loaded))
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    procs = []
    for index, device in enumerate(devices):
        cmd, env = worker_command(
            space,
            storage,
            name,
            worker_index * len(devices) + index,
            device,
            n_trials=n_trials,
            timeout_s=timeout_s,
            out_dir=out_dir,
        )
        procs.append(subprocess.Popen(cmd, env=env))
    try:
        codes = [p.wait() for p in procs]
    except KeyboardInterrupt:
        for p in procs:
            p.terminate()  # workers treat SIGTERM like Ctrl-C: trial killed, resumable
        for p in procs:
            p.wait()
        raise
    failed = [i for i, code in enumerate(codes) if code not in (0, 2)]  # 2: none feasible
    if failed:
        raise AutotuneError(
            f"worker(s) {', '.join(map(str, failed))} failed (exit codes "
            f"{', '.join(str(codes[i]) for i in failed)}); their errors are printed above"
        )
    return load_result(loaded, storage, name)[1]
