"""A trial's turns on the machine when it runs interleaved with others (the trial's side
of :func:`autotune.study.runner.run_interleaved`).

On a shared machine the speed moves by 10-30% over seconds (other tenants, the host's
clock): two configs timed one after the other each see their own stretch of it, and a
paired ratio of two such runs spread 0.67-1.42x over 12 rounds on the 2-core development
VM. Run side by side, with the machine handed back and forth every fraction of a
second, both see the same stretch: the driver grants a *turn* to one process of the
round at a time, and each times only its own turns.

The protocol (two named pipes per trial, made by the driver; the bytes are
:mod:`autotune.trial_spec`'s): the trial says it is ready (its imports done: a spawned
trial's imports must not run beside another's window), then reads one byte from
``<baton>.grant`` before it does anything (the build and the warm-up are one turn: no
compile runs beside another's window), and in the window hands the machine back (a byte
on ``<baton>.release``) once a turn has held it ``turn_s``, waits for the next grant,
and goes on. It says it is done when its result is written. While it waits
its DataLoader workers (its child processes) are stopped, so that they neither work for
it on another's turn nor take the cores from the one whose turn it is; on CUDA the
device is synchronized before the machine is handed back.

Every clock of the window (:class:`~autotune.trial.clock.StepClock`, the loader's
arrivals, the telemetry's span) reads :func:`own_time`: the process's time less its
waits, so a window's figures are those of its own turns. No torch at module level (the
telemetry imports this).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

from ..trial_spec import DONE, GRANT, READY, RELEASE, TURN


class Baton:
    """The trial process's turns (one per process: :data:`BATON`). Inactive (no baton
    path) it does nothing: the trial runs alone, as every run but an interleaved round's."""

    def __init__(self) -> None:
        self.path: str | None = None
        self.turn_s = 0.0
        self.waited_s = 0.0  # the time spent waiting for turns
        self.turns = 0  # grants taken
        self._grant = -1
        self._release = -1
        self._held_since = 0.0

    @property
    def active(self) -> bool:
        return self.path is not None

    def open(self, path: str | None, turn_s: float) -> None:
        """Join the round whose pipes are ``path`` + ``.grant``/``.release``, and say so
        (the driver grants the first turn once every run of the round is ready); nothing
        without a path."""
        if path is None:
            return
        self.path, self.turn_s = path, turn_s
        self._grant = os.open(path + GRANT, os.O_RDONLY)
        self._release = os.open(path + RELEASE, os.O_WRONLY)
        os.write(self._release, READY)

    def take(self) -> None:
        """Wait for this process's turn (the time waited is not its own), then wake its
        workers."""
        if not self.active:
            return
        began = time.perf_counter()
        if os.read(self._grant, 1) == b"":
            raise RuntimeError("the interleaved round's driver is gone")
        self.waited_s += time.perf_counter() - began
        self.turns += 1
        _signal_children(signal.SIGCONT)
        self._held_since = own_time()

    def due(self) -> bool:
        """Whether this turn has held the machine ``turn_s``: time to hand it back."""
        return self.active and own_time() - self._held_since >= self.turn_s

    def hand_back(self, device: Any) -> None:
        """End the turn: the device's queued work is finished first (it is this turn's),
        the workers are stopped, and the driver is told."""
        if not self.active:
            return
        if device.type == "cuda":  # a torch.device; torch is imported by then
            import torch

            torch.cuda.synchronize(device)
        _signal_children(signal.SIGSTOP)
        os.write(self._release, TURN)

    def done(self) -> None:
        """Leave the round (the result is written); the next process's turn starts."""
        if self.active:
            os.write(self._release, DONE)


BATON = Baton()


def own_time() -> float:
    """``time.perf_counter()`` less the time this process waited for its turns: the clock
    of a window that may be interleaved with others."""
    return time.perf_counter() - BATON.waited_s


def _signal_children(sig: int) -> None:
    """Send ``sig`` to this process's child processes (its DataLoader workers; Linux's
    /proc lists them, elsewhere none are found and the workers run on)."""
    for pid in _children():
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _children() -> list[int]:
    pids: list[int] = []
    try:
        tasks = list(Path(f"/proc/{os.getpid()}/task").iterdir())
    except OSError:
        return pids
    for task in tasks:
        try:
            pids += [int(p) for p in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue
    return pids
