"""Liveness of running trials, for any Optuna storage (RDB and journal alike).

While a trial runs, its driver refreshes a ``heartbeat`` user attr. A RUNNING trial whose
heartbeat is older than the grace period, or whose driver on this host is gone (killed
with SIGKILL, say), is *stale*: the next driver to start fails it and queues it once more.
Optuna's own RDB heartbeat only runs inside ``Study.optimize`` and the journal storage has
none, hence this small replacement.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any

import optuna

from .procs import pid_alive

KEY = "heartbeat"
RUNNING = optuna.trial.TrialState.RUNNING
# A running trial whose heartbeat is this many intervals old is stale (space.study.heartbeat_s).
STALE_BEATS = 3


def grace_s(heartbeat_s: float) -> float:
    """How long a running trial may go unheard of before it is stale: :data:`STALE_BEATS`
    heartbeat intervals (a beat or two late is a busy storage, not a dead driver)."""
    return STALE_BEATS * heartbeat_s


def _beat() -> dict[str, Any]:
    return {"t": time.time(), "host": socket.gethostname(), "pid": os.getpid()}


class Heartbeat:
    """Context manager: refresh ``trial``'s heartbeat every ``interval_s`` in a thread."""

    def __init__(self, trial: optuna.Trial, interval_s: float) -> None:
        self.trial = trial
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="autotune-heartbeat")

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.trial.set_user_attr(KEY, _beat())
            except Exception:  # the trial was finished elsewhere, or storage hiccup: retry
                pass

    def __enter__(self) -> Heartbeat:
        self.trial.set_user_attr(KEY, _beat())
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _is_stale(trial: optuna.trial.FrozenTrial, grace_s: float, now: float) -> bool:
    beat = trial.user_attrs.get(KEY)
    if beat is None:
        started = trial.datetime_start.timestamp() if trial.datetime_start else now
        return now - started > grace_s
    if beat.get("host") == socket.gethostname() and not pid_alive(int(beat.get("pid", -1))):
        return True
    return now - float(beat.get("t", 0)) > grace_s


def fail_stale_trials(study: optuna.Study, grace_s: float) -> list[int]:
    """Fail the stale RUNNING trials and queue each once more; return their numbers.

    A trial that is itself a retry is not queued again: it may be what kills its driver.
    Nor is a run of a confirmation round: the rounds resume where they stopped and make
    the missing runs themselves (a queued one held the confirmation back for good: its
    rounds wait for the queue to empty, and the search, its budget spent, never emptied it).
    """
    now = time.time()
    failed = []
    for trial in study.get_trials(deepcopy=False, states=(RUNNING,)):
        if not _is_stale(trial, grace_s, now):
            continue
        try:
            study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
        except (ValueError, RuntimeError):  # another driver got there first
            continue
        failed.append(trial.number)
        if "retry_of" not in trial.user_attrs and trial.user_attrs.get("round") is None:
            attrs = {"role": trial.user_attrs.get("role", "search"), "retry_of": trial.number}
            study.enqueue_trial(trial.params, user_attrs=attrs, skip_if_exists=False)
    return failed
