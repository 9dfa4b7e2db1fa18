"""The driver's side of the warm launcher (:mod:`autotune.trial.launcher`): forked runs.

``trial.launcher: fork`` (the default where the OS can fork) starts each run by asking a
launcher process, which has imported torch and the trial code once, to fork it; ``spawn``
starts ``python -m autotune.trial`` afresh each time. Both give a run the same things:
its own process and process group, its log files, its environment, death with the
driver. A forked run is handed back as a :class:`Forked`, which answers the part of
:class:`subprocess.Popen` the supervisor uses (``pid``, ``wait``, ``poll``,
``returncode``).

One launcher per driver process, started on first use (or by :func:`prestart`) and kept
until the driver exits; it dies with the driver. When it cannot start or has died, runs
are spawned (:func:`shared` answers None and says why in :data:`State.failure`), and a
launcher that died is started again once.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..credentials import ENV as STORAGE_ENV
from ..space import LAUNCHERS

FORK, SPAWN = LAUNCHERS
# How long the launcher may take to import torch and the trial code before the driver
# gives up on it and spawns instead.
READY_TIMEOUT_S = 120.0
# A launcher that died is started again this many times per driver, then runs spawn.
RESTARTS = 1
# How long the launcher may take to answer a request with the forked child's pid.
FORK_TIMEOUT_S = 30.0
# Environment variables read when torch and its libraries load (thread pools, the
# linker, the interpreter): a run whose value differs from the launcher's cannot be
# forked from it, since the launcher read them already. It is spawned instead.
READ_AT_IMPORT = (
    "OMP_", "MKL_", "KMP_", "GOMP_", "OPENBLAS_", "LD_", "PYTHON", "MALLOC_", "TORCH", "TRITON_"
)  # fmt: skip
# Of those, the ones read later, in the run: a forked run takes its own value.
READ_IN_THE_RUN = ("PYTHONPATH", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")
# torch.compile's local caches, read when inductor's and AOTAutograd's configs load:
# the compiled graphs (the FX graph cache) and the joint forward-backward graphs (the
# AOTAutograd cache) are what a warm repeat of a config reuses.
COMPILE_CACHES = ("TORCHINDUCTOR_FX_GRAPH_CACHE", "TORCHINDUCTOR_AUTOGRAD_CACHE")


def import_env(environ: dict[str, str]) -> dict[str, str]:
    """What every run (and the launcher) adds to ``environ`` of the variables read at
    import: the compile caches on, unless the user set them."""
    return {name: "1" for name in COMPILE_CACHES if name not in environ}


def run_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a run, and of the launcher that forks runs: the driver's, with
    the compile caches on (:func:`import_env`: every run, compiling or not, since the
    launcher read them when it imported TorchDynamo), ``extra``, this very autotune on
    ``PYTHONPATH`` (even when it is not installed), unbuffered output and the driver's
    pid (:func:`autotune.trial.guard.die_with_driver`). Not the storage URL
    (``AUTOTUNE_STORAGE``, which may hold a password): runs never open the study."""
    env = {**os.environ, **import_env(os.environ), **(extra or {})}
    env.pop(STORAGE_ENV, None)
    # the folder holding the autotune package (not the package itself: on the path, its
    # modules would shadow top-level ones, e.g. a workload's `import lightning`)
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    env.setdefault("PYTHONUNBUFFERED", "1")
    env["AUTOTUNE_DRIVER_PID"] = str(os.getpid())
    return env


def default_launcher() -> str:
    """``fork`` where the OS can fork (POSIX), else ``spawn``."""
    return FORK if hasattr(os, "fork") and sys.platform != "win32" else SPAWN


class LauncherError(Exception):
    """The launcher cannot start a run (not started, died, or refused)."""


class Forked:
    """A run forked by the launcher: what the supervisor needs of a :class:`~subprocess.Popen`."""

    def __init__(self, launcher: Launcher, pid: int) -> None:
        self.launcher = launcher
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.launcher.pump(0.0)
            self.returncode = self.launcher.exits.pop(self.pid, None)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if self.launcher.dead:  # it took its children with it
                self.returncode = -9
                break
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
            self.launcher.pump(left)
        return self.returncode


class Launcher:
    """A running launcher process and its channel."""

    def __init__(self, log: Path | None = None) -> None:
        self.env = env = run_env()
        err = open(log, "ab") if log is not None else subprocess.DEVNULL  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "autotune.trial.launcher"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            env=env,
            start_new_session=True,  # no terminal's Ctrl-C: the driver stops the runs
        )
        if err is not subprocess.DEVNULL:
            err.close()
        self.ready = False
        self.dead = False
        self.next_id = 0
        self.buffer = b""
        self.forked: dict[int, int | str] = {}  # request id -> pid, or why none
        self.exits: dict[int, int] = {}  # pid -> return code
        self.running: set[int] = set()

    def pump(self, timeout: float | None) -> None:
        """Read what the launcher said within ``timeout`` seconds (None: until it says
        something); a launcher that died reports its running children killed."""
        if self.dead:
            return
        fd = self.proc.stdout.fileno()
        ready, _, _ = select.select([fd], [], [], timeout)
        if not ready:
            return
        chunk = os.read(fd, 65536)
        if not chunk:
            self._died()
            return
        self.buffer += chunk
        while b"\n" in self.buffer:
            line, self.buffer = self.buffer.split(b"\n", 1)
            self._heard(json.loads(line))

    def _heard(self, message: dict[str, Any]) -> None:
        if "ready" in message:
            self.ready = True
        elif "returncode" in message:
            self.running.discard(message["pid"])
            self.exits[message["pid"]] = message["returncode"]
        elif "id" in message:
            self.forked[message["id"]] = message.get("pid") or message.get("error", "refused")
            if "pid" in message:
                self.running.add(message["pid"])

    def _died(self) -> None:
        """The launcher is gone: its children died with it (``PR_SET_PDEATHSIG``)."""
        self.dead = True
        self.proc.wait()
        for pid in self.running:
            self.exits[pid] = -9
        self.running.clear()

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while not self.ready:
            left = deadline - time.monotonic()
            if self.dead or left <= 0:
                self.close()
                raise LauncherError(
                    "the warm launcher did not start"
                    + (f" (exit code {self.proc.returncode})" if self.dead else " in time")
                )
            self.pump(left)

    def differs_at_import(self, env: dict[str, str]) -> list[str]:
        """The variables of ``env`` read at import (:data:`READ_AT_IMPORT`) whose value is
        not the launcher's: a run with them must be spawned. Those of
        :data:`READ_IN_THE_RUN` are not among them (a forked run puts its ``PYTHONPATH``
        on ``sys.path``; the compile cache folders are read when compiling)."""
        names = {k for k in (*env, *self.env) if k.startswith(READ_AT_IMPORT)}
        names -= set(READ_IN_THE_RUN)
        return sorted(k for k in names if env.get(k) != self.env.get(k))

    def launch(
        self, module: str, argv: list[str], stdout: Path, stderr: Path, env: dict[str, str]
    ) -> Forked:
        """Fork ``python -m module *argv`` with these logs and environment.

        Raises:
            LauncherError: the launcher is dead or could not fork, or ``env`` sets a
                variable read at import differently (:meth:`differs_at_import`).
        """
        differs = self.differs_at_import(env)
        if differs:
            raise LauncherError(f"the run sets {', '.join(differs)}, read at import: spawned")
        self.wait_ready()
        request_id = self.next_id = self.next_id + 1
        request = {
            "id": request_id,
            "module": module,
            "argv": argv,
            "stdout": str(Path(stdout).resolve()),
            "stderr": str(Path(stderr).resolve()),
            "cwd": os.getcwd(),
            "env": env,
        }
        try:
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()
        except OSError as e:
            self._died()
            raise LauncherError(f"the warm launcher is gone: {e}") from None
        deadline = time.monotonic() + FORK_TIMEOUT_S
        while request_id not in self.forked:
            left = deadline - time.monotonic()
            if self.dead or left <= 0:
                self.close()
                raise LauncherError("the warm launcher died or did not answer")
            self.pump(left)
        answer = self.forked.pop(request_id)
        if isinstance(answer, str):
            raise LauncherError(f"the warm launcher could not start the run: {answer}")
        return Forked(self, answer)

    def close(self) -> None:
        """End the launcher (its running children die with it)."""
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.dead = True


@dataclass
class State:
    """This driver's launcher: the running one, how many were started, why none runs."""

    launcher: Launcher | None = None
    started: int = 0
    failure: str | None = None
    log: Path | None = None


STATE = State()


def prestart(log: Path | None = None) -> None:
    """Start the launcher now (it imports torch while the driver does other work)."""
    if STATE.launcher is None and STATE.failure is None and default_launcher() == FORK:
        STATE.log = log or STATE.log
        _start()


def _start() -> None:
    try:
        STATE.launcher = Launcher(STATE.log)
    except OSError as e:
        STATE.failure = f"the warm launcher cannot start: {e}"
        return
    STATE.started += 1


def shared() -> Launcher | None:
    """The driver's running launcher (started if need be), or None: runs are spawned."""
    if default_launcher() != FORK or STATE.failure is not None:
        return None
    launcher = STATE.launcher
    if launcher is not None and (launcher.dead or launcher.proc.poll() is not None):
        STATE.launcher = launcher = None
        if STATE.started > RESTARTS:
            STATE.failure = "the warm launcher died again; runs are spawned"
            return None
    if launcher is None:
        _start()
        launcher = STATE.launcher
    if launcher is None:
        return None
    try:
        launcher.wait_ready()
    except LauncherError as e:
        STATE.launcher = None
        STATE.failure = str(e)
        return None
    return launcher


def shutdown() -> None:
    """End the launcher, if one runs (at the driver's exit, or for a test)."""
    if STATE.launcher is not None:
        STATE.launcher.close()
    STATE.launcher = None
    STATE.started = 0
    STATE.failure = None


atexit.register(shutdown)
