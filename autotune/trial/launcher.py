"""``python -m autotune.trial.launcher``: the warm launcher that forks trial processes.

A trial process spends seconds importing torch before it runs a step. The launcher
imports torch and autotune's trial code once, then forks one child per run; each child
is what ``python -m autotune.trial SPEC RESULT`` would be, minus the imports. The
launcher never imports a workload and never touches CUDA (a forked CUDA context is
unusable), so each child loads the user's code and makes its own context.

Each child, right after the fork: its own process group (the driver kills it and its
DataLoader workers with one ``killpg``), the run's log files as stdout and stderr, the
run's working directory and environment, fresh RNG seeds where a spawned process would
have fresh ones, and death with the launcher (``PR_SET_PDEATHSIG``: the launcher dies
with the driver, so a killed driver leaves nothing running). Then it runs the module as
``python -m`` would (:func:`runpy.run_module`).

The protocol is one JSON object per line. The driver writes requests on the launcher's
stdin: ``{"id", "module", "argv", "stdout", "stderr", "cwd", "env"}``; the launcher
answers on its stdout: ``{"ready": pid}`` once, ``{"id", "pid"}`` when a child is
forked (or ``{"id", "error"}``) and ``{"pid", "returncode"}`` when one exits
(a negative return code: killed by that signal, as :class:`subprocess.Popen` reports).
End of stdin ends the launcher. The driver's side is :mod:`autotune.study.forks`.
"""

from __future__ import annotations

import gc
import json
import os
import select
import sys

from .guard import die_with_driver


def preload() -> None:
    """What every trial imports before its workload: torch, TorchDynamo and the trial
    code. Never CUDA (``torch.cuda.is_initialized()`` stays false) and never the workload.

    TorchDynamo is imported by the first optimizer a trial builds (``torch.optim`` loads
    it lazily), inductor's compiler by ``torch.compile()``: about 1 s each on a 2-core
    CPU, which every trial would pay in its build (not in its compile time: both load
    before the first compiled step, in a spawned trial as in a forked one). They load
    inductor's and AOTAutograd's configs, which read ``TORCH*`` variables when
    imported: the driver gives the launcher the values it gives each run (the compile
    cache flags, :func:`autotune.study.forks.import_env`), and a run whose values
    differ is spawned. The cache folders are read when a graph is compiled, in the run.
    """
    import torch
    import torch._dynamo  # noqa: F401
    import torch._dynamo.repro.after_dynamo  # noqa: F401
    import torch._inductor.compile_fx  # noqa: F401

    from . import check, main, probe, profile  # noqa: F401

    del torch


def _fresh_rngs() -> None:
    """Seed the generators a spawned process seeds from the OS (torch's default
    generator, numpy's global one), so that children do not share the launcher's state
    (Python's ``random`` reseeds itself at fork). A trial seeds them itself before it
    builds the model; a workload's module-level draws see what a fresh interpreter sees."""
    import torch

    torch.seed()
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed()


def _import_side_effects() -> None:
    """What loading TorchDynamo did to the environment, done again with the run's: it
    resolved inductor's cache folder (``TORCHINDUCTOR_CACHE_DIR``, the run's own where
    it compiles) and put it in ``os.environ``, which the run's subprocesses inherit."""
    cache_dir_utils = sys.modules.get("torch._inductor.runtime.cache_dir_utils")
    if cache_dir_utils is not None:
        cache_dir_utils.cache_dir()


def _sync_path(env: dict[str, str]) -> None:
    """``PYTHONPATH`` entries of the run that the launcher's ``sys.path`` lacks go first,
    where a spawned interpreter would have put them."""
    entries = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    for i, entry in enumerate(e for e in entries if os.path.abspath(e) not in sys.path):
        sys.path.insert(1 + i, os.path.abspath(entry))


def _child(request: dict, channel: tuple[int, int]) -> None:
    """The forked child: become the run's process, run its module; never returns."""
    code = 1
    try:
        os.setpgid(0, 0)  # the launcher does it too: no race with the driver's killpg
        for fd in channel:
            os.close(fd)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            os.dup2(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644), fd)
        os.chdir(request["cwd"])
        sys.path[0] = os.getcwd()  # as ``python -m`` puts it
        env = {**request["env"], "AUTOTUNE_DRIVER_PID": os.environ["AUTOTUNE_DRIVER_PID"]}
        os.environ.clear()
        os.environ.update(env)
        _sync_path(env)
        _import_side_effects()
        _fresh_rngs()
        import runpy

        sys.argv = [request["module"], *request["argv"]]
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _send(out: int, message: dict) -> None:
    data = (json.dumps(message) + "\n").encode()
    while data:
        data = data[os.write(out, data) :]


def _exit_code(status: int) -> int:
    return os.waitstatus_to_exitcode(status)


def serve(inp: int, out: int) -> None:
    """Fork a child per request read from ``inp``; report forks and exits on ``out``."""
    children: dict[int, int | None] = {}  # pid -> pidfd (None where pidfd_open is missing)
    buffer = b""
    while True:
        pidfds = [fd for fd in children.values() if fd is not None]
        polled = len(pidfds) < len(children)
        ready, _, _ = select.select([inp, *pidfds], [], [], 0.05 if polled else None)
        for pid in list(children):  # reap every child that exited
            try:
                done, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done, status = pid, 0
            if done:
                fd = children.pop(pid)
                if fd is not None:
                    os.close(fd)
                _send(out, {"pid": pid, "returncode": _exit_code(status)})
        if inp not in ready:
            continue
        chunk = os.read(inp, 65536)
        if not chunk:  # the driver closed the channel: done
            return
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            if line.strip():
                request = json.loads(line)
                pid = _fork(request, (inp, out))
                if isinstance(pid, str):
                    _send(out, {"id": request["id"], "error": pid})
                    continue
                try:
                    children[pid] = os.pidfd_open(pid)
                except (AttributeError, OSError):
                    children[pid] = None
                _send(out, {"id": request["id"], "pid": pid})


def _fork(request: dict, channel: tuple[int, int]) -> int | str:
    """The child's pid, or why there is none."""
    sys.stdout.flush()
    sys.stderr.flush()
    launcher = os.getpid()
    try:
        pid = os.fork()
    except OSError as e:
        return f"fork failed: {e.strerror or e}"
    if pid == 0:  # the child dies with the launcher: PR_SET_PDEATHSIG, before anything else
        os.environ["AUTOTUNE_DRIVER_PID"] = str(launcher)
        die_with_driver()
        _child(request, channel)
    try:
        os.setpgid(pid, pid)
    except OSError:  # the child did it first, or already exited
        pass
    return pid


def main() -> None:
    die_with_driver()
    # Should anything ask whether CUDA is there, ask NVML (fork-safe) rather than the
    # CUDA driver: a driver initialised here would be unusable in every forked run.
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    # The channel moves off fds 0 and 1: stray prints of imported code go to stderr.
    inp, out = os.dup(0), os.dup(1)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.dup2(2, 1)
    preload()
    # What the imports made goes to the permanent generation: a forked run's collections
    # then never write to those objects' headers, which would copy their pages
    # (copy-on-write). Measured here without it: a forked cold torch.compile of the
    # example CNN took 1-2% longer than a spawned one; with it, as long or shorter.
    gc.collect()
    gc.freeze()
    _send(out, {"ready": os.getpid()})
    serve(inp, out)


if __name__ == "__main__":
    main()
