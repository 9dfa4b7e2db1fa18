"""Run one trial (or the probe, or a profile) in a fresh subprocess and collect its result.

Each run gets a folder holding ``spec.json`` (what to run), ``stdout.log``/``stderr.log``
and ``result.json`` (written by the trial process, ``python -m autotune.trial``). The
trial runs in its own process group, so a timeout or Ctrl-C kills it together with its
DataLoader workers. The driver starts it by module name and never imports it.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..config import Config
from ..errors import WorkloadError
from ..knobs import Capabilities
from ..measurement import FAILED, OK, OOM, PRUNED, TIMEOUT, Measurement
from ..mfu import peak_keys
from ..space import ENERGY, Space
from ..trial_spec import (
    GRANT,
    READY,
    RELEASE,
    SPAWNED_AT,
    STACKS_SIGNAL,
    TURN,
    TrialSpec,
    trial_spec,
)
from . import forks, stacks
from .compile_cache import compile_cache, keep_machine_probe, machine_probe
from .forks import FORK, SPAWN, Forked, LauncherError
from .procs import group_memory_over
from .pruning import Pruner
from .stacks import STACKS_WAIT_S, read_location


def _kill_group(proc: subprocess.Popen | Forked) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _ask_for_stacks(proc: subprocess.Popen | Forked) -> None:
    """Make every process of the trial write its Python stacks to its log (faulthandler,
    registered by the trial process and inherited by its forked DataLoader workers)."""
    try:
        os.killpg(proc.pid, STACKS_SIGNAL)
    except (ProcessLookupError, PermissionError):
        return
    time.sleep(STACKS_WAIT_S)


def _describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"trial process killed by {name}"
    return f"trial process exited with code {returncode} before writing its result"


def _last_line(path: Path) -> str:
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:300] if lines else ""


# How often the driver checks on a running trial (memory cap, early stop).
POLL_S = 0.25


def _start(
    spec_path: Path,
    result_path: Path,
    out: Any,
    err: Any,
    world_size: int = 1,
    extra_env: dict[str, str] | None = None,
    module: str = "autotune.trial",
    how: str = SPAWN,
) -> tuple[subprocess.Popen | Forked, str]:
    """Start the run's process: forked by the warm launcher (``how="fork"``, one process
    runs only) or spawned; the process and how it was started (``fork`` or ``spawn``:
    a launcher that cannot start or died means spawn)."""
    env = forks.run_env(extra_env)
    env[SPAWNED_AT] = repr(time.time())  # the trial's process_start_s counts from here
    args = [str(spec_path), str(result_path)]
    if how == FORK and world_size == 1:
        warm = forks.shared()
        if warm is not None:
            try:
                return warm.launch(module, args, Path(out.name), Path(err.name), env), FORK
            except LauncherError:
                pass  # spawned instead; the next run starts a new launcher
    argv = [sys.executable, "-m", module]
    if world_size > 1:  # torch.distributed.run starts the ranks (autotune.trial.guard)
        argv += ["--ranks", str(world_size)]
    proc = subprocess.Popen(
        [*argv, *args],
        stdout=out,
        stderr=err,
        stdin=subprocess.DEVNULL,
        env=env,
        start_new_session=True,  # its own process group: one kill reaches its workers
    )
    return proc, SPAWN


def _supervise(
    proc: subprocess.Popen | Forked,
    timeout_s: float,
    memory_cap_bytes: int | None,
    stop_early: Callable[[], str | None] | None,
) -> dict[str, Any] | None:
    """Wait for the child; kill its group and say why when a limit is hit."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            proc.wait(timeout=POLL_S)
            return None
        except subprocess.TimeoutExpired:
            pass
        if time.monotonic() >= deadline:
            return _timed_out(proc, f"no result within {timeout_s:g} s; killed")
        over = _over_memory(proc, memory_cap_bytes)
        if over is not None:
            return over
        if stop_early is not None:
            reason = stop_early()
            if reason:
                _kill_group(proc)
                return {"status": PRUNED, "reason": reason}


def _timed_out(proc: subprocess.Popen | Forked, reason: str) -> dict[str, Any]:
    """Stop a run past its time: its stacks first (where it hung), then its group."""
    _ask_for_stacks(proc)
    _kill_group(proc)
    return {"status": TIMEOUT, "reason": reason}


def _over_memory(proc: subprocess.Popen | Forked, cap_bytes: int | None) -> dict[str, Any] | None:
    """Stop a run whose process group is over ``cap_bytes`` (None: no cap), and say why;
    None while it is under."""
    used = group_memory_over(proc.pid, cap_bytes) if cap_bytes is not None else None
    if used is None:
        return None
    _kill_group(proc)
    return {
        "status": OOM,
        "reason": (
            f"trial processes used {used / 2**20:.0f} MiB, over the per-trial cap of "
            f"{cap_bytes / 2**20:.0f} MiB; killed"
        ),
    }


def _prepare(spec: TrialSpec, folder: Path) -> None:
    """A run's folder: its spec written, an earlier run's result and stacks gone."""
    folder.mkdir(parents=True, exist_ok=True)
    spec.write(folder / "spec.json")
    (folder / "result.json").unlink(missing_ok=True)
    stacks.clear(folder)


def _finished(
    folder: Path,
    proc: subprocess.Popen | Forked,
    stopped: dict[str, Any] | None,
    start: float,
    how: str,
) -> dict[str, Any]:
    """A run that ended: what it left in its group reaped (DataLoader workers), its
    empty stack files gone, its payload (:func:`_outcome`) and how it started."""
    _kill_group(proc)
    stacks.clear(folder, empty_only=True)
    return {**_outcome(folder, proc, stopped, start), "launcher": how}


def run_child(
    spec: TrialSpec,
    folder: Path,
    timeout_s: float,
    *,
    memory_cap_bytes: int | None = None,
    stop_early: Callable[[], str | None] | None = None,
    env: dict[str, str] | None = None,
    module: str = "autotune.trial",
    how: str = SPAWN,
) -> dict[str, Any]:
    """Run ``python -m autotune.trial`` on ``spec`` in ``folder``; return its result payload.

    A child that dies, overruns ``timeout_s`` or ``memory_cap_bytes`` (its whole process
    group, DataLoader workers included), or that ``stop_early()`` gives a reason to stop,
    is killed and yields a payload with that status and reason. ``env`` adds environment
    variables; ``module`` is what runs (``autotune.trial.verify`` for a verify run);
    ``how`` starts it: ``fork`` from the warm launcher (:mod:`autotune.study.forks`)
    or ``spawn`` (``trial.launcher``). The payload says which in ``launcher``. This
    function raises only on KeyboardInterrupt, after killing the child's process group.
    """
    _prepare(spec, folder)
    spec_path, result_path = folder / "spec.json", folder / "result.json"
    start = time.perf_counter()
    with open(folder / "stdout.log", "wb") as out, open(folder / "stderr.log", "wb") as err:
        proc, started = _start(spec_path, result_path, out, err, spec.world_size, env, module, how)
        try:
            stopped = _supervise(proc, timeout_s, memory_cap_bytes, stop_early)
        except BaseException:
            _kill_group(proc)
            raise
    return _finished(folder, proc, stopped, start, started)


def _outcome(
    folder: Path, proc: subprocess.Popen | Forked, stopped: dict[str, Any] | None, start: float
) -> dict[str, Any]:
    """The payload of a finished run: the supervisor's verdict, the result file, or why
    the process died without one."""
    result_path = folder / "result.json"
    if stopped is not None:
        if stopped["status"] == TIMEOUT:  # where it hung, from the stacks it wrote
            where = read_location(folder)
            if where:
                stopped = {**stopped, "reason": f"{stopped['reason']}: hung in {where}"}
        return {**stopped, "wall_s": time.perf_counter() - start}
    if result_path.exists():  # written by the trial (rank 0 under DDP), whatever its status
        payload = json.loads(result_path.read_text())
        ran = (payload.get("process_start_s") or 0.0) + (payload.get("wall_s") or 0.0)
        if payload.get("wall_s") is not None:  # writing the result, exiting, reaping
            payload["exit_s"] = max(0.0, time.perf_counter() - start - ran)
        return payload
    reason = _describe_exit(proc.returncode)
    where = read_location(folder)  # a fatal signal's stacks (faulthandler)
    if where:
        return {
            "status": FAILED,
            "reason": f"{reason} in {where}",
            "wall_s": time.perf_counter() - start,
        }
    tail = _last_line(folder / "stderr.log")
    return {
        "status": FAILED,
        "reason": f"{reason}: {tail}" if tail else reason,
        "wall_s": time.perf_counter() - start,
    }


def probe(space: Space, folder: Path) -> dict[str, Any]:
    """Load the workload once in a subprocess: capabilities, environment, dataset size;
    for a token workload every sample's length, written to ``folder/lengths.json``; for
    a space that may compile, inductor's vector-ISA probe, which seeds every config's
    compile cache (:mod:`autotune.study.compile_cache`).

    Raises:
        WorkloadError: the workload cannot be loaded or built.
    """
    vec_isa = machine_probe(space, folder)
    spec = trial_spec(
        space,
        "probe",
        lengths_path=str(folder / "lengths.json"),
        # MFU: the baseline's step is FLOP-counted, the peaks of these dtypes measured
        baseline=space.baseline,
        peak_keys=tuple(peak_keys(space.knobs, space.baseline)),
        # inductor's vector-ISA probe, once for every config's cache
        vec_isa=vec_isa is not None,
    )
    env = None if vec_isa is None else {"TORCHINDUCTOR_CACHE_DIR": str(vec_isa)}
    result = run_child(spec, folder, space.trial.timeout_s, env=env, how=space.trial.launcher)
    if vec_isa is not None:
        keep_machine_probe(vec_isa, result.get("status") == OK)
    if result.get("status") != OK:
        raise WorkloadError(f"{result.get('reason', 'probe failed')} (log: {folder})")
    return result


def check(space: Space, folder: Path) -> dict[str, Any]:
    """``autotune validate``'s build check in a subprocess (:mod:`autotune.trial.check`):
    one fp32 step on the CPU at the smallest batch size of the space. Spawned: a warm
    launcher would cost more than it saves for one run.

    Returns the payload: ``problems`` (one line each; none when the workload is right)
    and ``facts``, or a failed status with its reason (the workload cannot be loaded, or
    the process crashed or hung).
    """
    sizes = space.knobs.get("batch_size", (space.baseline.batch_size,))
    spec = trial_spec(space, "check", device="cpu", batch_size=min(sizes))
    result = run_child(spec, folder, space.trial.timeout_s)
    refused = result.get("facts", {}).get("framework_refused")
    if result.get("status") == OK and refused:  # knobs a Trainer's own loop cannot set
        caps = Capabilities(device="cpu", framework_refused=refused)
        result["problems"] = [*result["problems"], *space.framework_refusals(caps)]
    return result


def run_trial(
    space: Space,
    config: Config,
    folder: Path,
    best_value: float | None = None,
) -> Measurement:
    """Measure ``config`` in a fresh subprocess. Never raises for a failing trial.

    With ``best_value`` (the best feasible objective so far) and ``search.prune`` on, the
    trial is stopped as soon as its measured steps show it cannot beat that.
    """
    spec = trial_spec(space, "trial", config)
    pruner = None
    # An energy study's best value is units per joule; a trial's progress has no energy.
    if space.search.prune and best_value and space.trial.objective != ENERGY:
        spec = replace(spec, progress_path=str(folder / "progress.json"))
        (folder / "progress.json").unlink(missing_ok=True)
        pruner = Pruner(folder / "progress.json", best_value, space.trial, space.search)
    env, cache = compile_cache(config, folder)
    result = run_child(
        spec,
        folder,
        space.trial.timeout_s,
        memory_cap_bytes=space.trial.memory_cap_bytes(),
        stop_early=pruner,
        env=env,
        how=space.trial.launcher,
    )
    if pruner is not None and result.get("status") == PRUNED:
        m = pruner.measurement(result["reason"], result.get("wall_s"))
        m = m.replace(launcher=result.get("launcher"))  # how it started, as any trial's
    else:
        m = Measurement.from_dict(result)
    return m.replace(compile_cache=cache)


def profile_trial(space: Space, config: Config, folder: Path, steps: int) -> dict[str, Any]:
    """Profile ``steps`` steps of ``config`` in a fresh subprocess (:mod:`autotune.trial.profile`).

    The child builds the trial as :func:`run_trial` does, writes its summary to
    ``folder/result.json`` and a Chrome trace to ``folder/trace.json``. Never raises for a
    failing profile: the payload then has ``status`` and ``reason``.
    """
    spec = trial_spec(
        space,
        "profile",
        config,
        profile_steps=steps,
        trace_path=str((folder / "trace.json").resolve()),
    )
    env, _ = compile_cache(config, folder)
    return run_child(spec, folder, space.trial.timeout_s, env=env, how=space.trial.launcher)


# How long one turn of an interleaved run holds the machine in its window (trial.turn_s):
# the machine's speed drifts over seconds (a 2-core VM: 0.87-1.06x of its median from
# one second to the next), far slower than turns of a quarter second.
TURN_S = 0.25


@dataclass
class _Member:
    """One trial process of an interleaved run, as the driver sees it."""

    folder: Path
    spec: TrialSpec
    env: dict[str, str]  # the run's compile cache (compile_cache)
    cache: str | None
    grant: int  # the pipes' descriptors, both opened read-write: neither open blocks
    release: int
    out: Any = None
    err: Any = None
    proc: subprocess.Popen | Forked | None = None
    how: str = SPAWN
    start: float = 0.0
    held_s: float = 0.0  # the turns it held the machine: its timeout counts these
    stopped: dict[str, Any] | None = None


def run_interleaved(
    space: Space, configs: list[Config], folders: list[Path], turn_s: float = TURN_S
) -> list[Measurement]:
    """Measure ``configs`` side by side: one trial process each (in ``folders``), all
    started at once, taking turns on the machine (:mod:`autotune.trial.baton`). The first
    turn of each is its build and warm-up, one after the other; then, in this order round
    and round, each window runs ``turn_s`` of its steps and hands the machine on, so that
    the machine's drift over seconds falls on every config alike. Each window's figures
    are those of its own turns. The measurements, in the order of ``configs``; never
    raises for a failing trial.

    A trial that crashes, overruns ``trial.timeout_s`` (counted over its own turns) or
    its memory cap leaves the ring with that status; the others go on. All the configs
    are in memory at once: the caller makes sure they fit."""
    if len({Path(f).resolve() for f in folders}) < len(folders):
        raise ValueError(f"each run side by side needs a folder of its own: {folders}")
    members: list[_Member] = []
    try:
        for config, folder in zip(configs, folders, strict=True):
            members.append(_join(space, config, folder, turn_s))
        for m in members:
            m.out, m.err = open(m.folder / "stdout.log", "wb"), open(m.folder / "stderr.log", "wb")  # noqa: SIM115
            m.start = time.perf_counter()
            m.proc, m.how = _start(
                m.folder / "spec.json", m.folder / "result.json", m.out, m.err,
                extra_env=m.env, how=space.trial.launcher,
            )  # fmt: skip
        _take_turns(members, space.trial.timeout_s, space.trial.memory_cap_bytes())
    except BaseException:
        for m in members:
            if m.proc is not None:
                _kill_group(m.proc)
        raise
    finally:
        for m in members:
            for fd in (m.grant, m.release):
                os.close(fd)
            for f in (m.out, m.err):
                if f is not None:
                    f.close()
    return [
        Measurement.from_dict(_finished(m.folder, m.proc, m.stopped, m.start, m.how)).replace(
            compile_cache=m.cache
        )
        for m in members
    ]


def _join(space: Space, config: Config, folder: Path, turn_s: float) -> _Member:
    """The member's folder: its spec, the pipes its turns pass through, no old result."""
    baton = (folder / "baton").resolve()
    spec = trial_spec(space, "trial", config, baton=str(baton), turn_s=turn_s)
    _prepare(spec, folder)
    fds = []
    for suffix in (GRANT, RELEASE):
        path = Path(f"{baton}{suffix}")
        path.unlink(missing_ok=True)
        os.mkfifo(path)
        fds.append(os.open(path, os.O_RDWR))
    env, cache = compile_cache(config, folder)
    return _Member(folder, spec, env, cache, *fds)


def _take_turns(members: list[_Member], timeout_s: float, memory_cap: int | None) -> None:
    """Once every member is ready (imported, waiting for its first turn: a spawned one's
    imports take the cores), grant the machine to one member at a time, round and round,
    until each has said it is done, died or been stopped (``stopped``: a timeout over
    its own turns, its memory cap). The wait for a member to be ready counts as its own
    time."""
    ring = [m for m in members if _turn(m, timeout_s, memory_cap) == READY]
    while ring:  # a member that died since its last word: _turn sees it at once
        m = ring.pop(0)
        os.write(m.grant, b"g")
        if _turn(m, timeout_s, memory_cap) == TURN:
            ring.append(m)


def _turn(m: _Member, timeout_s: float, memory_cap: int | None) -> bytes | None:
    """Wait for ``m``'s next word: ``READY``, ``TURN`` (it handed the machine back and
    wants another), ``DONE``, or None when it died or was stopped (killed, with the
    reason in ``m.stopped``)."""
    began = time.monotonic()
    while True:
        ready, _, _ = select.select([m.release], [], [], POLL_S)
        if ready:
            m.held_s += time.monotonic() - began
            return os.read(m.release, 1)
        if m.proc.poll() is not None:
            return None
        if m.held_s + time.monotonic() - began >= timeout_s:
            why = f"no result within {timeout_s:g} s of its own turns; killed"
            m.stopped = _timed_out(m.proc, why)
            return None
        m.stopped = _over_memory(m.proc, memory_cap)
        if m.stopped is not None:
            return None
