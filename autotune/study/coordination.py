"""Workers sharing one study: who measures which config, and who runs the baseline.

Every ``autotune run`` pointed at the same storage and study name is a worker. A config is
*claimed* by the trial that measures it (its ``config_key`` user attr); roles (baseline,
search, duplicate, repeat) say what a trial is for. These functions read the study as it
is now in storage, so they see the other workers' trials too.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import optuna

from ..config import Config
from ..measurement import PREDICTED_OVER_MEMORY
from ..results import BASELINE, DUPLICATE, REPEAT, SEARCH, TrialRecord, baseline_of
from ..space import Space
from .heartbeat import fail_stale_trials
from .sampling import encode

RUNNING = optuna.trial.TrialState.RUNNING
COMPLETE = optuna.trial.TrialState.COMPLETE
WAITING = optuna.trial.TrialState.WAITING


def claim(study: optuna.Study, trial: optuna.Trial, key: str) -> bool:
    """Mark ``trial`` as measuring config ``key``; False if another trial (running or
    finished, of this worker or another) already is, and the caller must not measure it.

    Each claimant writes its key before it looks for others, so of two workers claiming
    the same config at once at least one sees the other: never do both measure it. Both
    may see each other and back off; the config then stays free for a later trial.
    """
    trial.set_user_attr("config_key", key)
    return not held(study, key, other_than=trial.number)


def config_key(trial: optuna.trial.FrozenTrial) -> str | None:
    """The key of the config a trial measures: from its stored config when it has one (so
    a trial stored by an older autotune, whose key string had another form, still
    matches), else the key it claimed."""
    config = trial.user_attrs.get("config")
    if config is not None:
        return Config.from_dict(config).key()
    return trial.user_attrs.get("config_key")


def held(study: optuna.Study, key: str, other_than: int | None = None) -> bool:
    """Whether a running or finished trial (not a duplicate or repeat) measures ``key``."""
    return any(
        t.number != other_than
        and t.user_attrs.get("role") not in (DUPLICATE, REPEAT)
        and config_key(t) == key
        for t in study.get_trials(deepcopy=False, states=(RUNNING, COMPLETE))
    )


def first_runs(trials: list[TrialRecord]) -> dict[str, TrialRecord]:
    """Each config's first measured run, by config key: not a duplicate or repeat, and not
    a config skipped as predicted over memory (never measured)."""
    return {
        t.config.key(): t
        for t in trials
        if t.role not in (DUPLICATE, REPEAT) and t.status != PREDICTED_OVER_MEMORY
    }


def running_roles(study: optuna.Study) -> list[str]:
    """Roles of the trials being measured right now (by this or another worker)."""
    running = study.get_trials(deepcopy=False, states=(RUNNING,))
    return [t.user_attrs.get("role", SEARCH) for t in running]


def running_keys(study: optuna.Study) -> set[str]:
    """Configs being measured right now (by this or another worker)."""
    running = study.get_trials(deepcopy=False, states=(RUNNING,))
    return {t.user_attrs["config_key"] for t in running if "config_key" in t.user_attrs}


def waiting_roles(study: optuna.Study) -> list[str]:
    """Roles of the queued trials, in the order ``ask`` will hand them out."""
    waiting = study.get_trials(deepcopy=False, states=(WAITING,))
    return [t.user_attrs.get("role", SEARCH) for t in sorted(waiting, key=lambda t: t.number)]


def queue_baseline(study: optuna.Study, space: Space, trials: list[TrialRecord]) -> None:
    """Queue the baseline unless it is measured, queued or being measured. Two workers
    starting at once may both queue it; :func:`claim` lets only one measure it."""
    if baseline_of(trials) is None and BASELINE not in (
        waiting_roles(study) + running_roles(study)
    ):
        study.enqueue_trial(encode(space, space.baseline), user_attrs={"role": BASELINE})


def wait_for_reference(
    study: optuna.Study, timeout_s: float, grace_s: float, note: Callable[[str], None]
) -> list[float] | None:
    """Wait while another worker runs the baseline that is also the fp32 reference; its
    losses, or ``None`` when that run ended without one (or ``timeout_s`` passed)."""
    deadline = time.monotonic() + timeout_s
    note("waiting for another worker's baseline run (the fp32 reference)")
    while time.monotonic() < deadline and BASELINE in running_roles(study):
        time.sleep(1.0)
        # If that worker died, its baseline goes stale: fail it and queue it again.
        fail_stale_trials(study, grace_s=grace_s)
        stored = study.user_attrs.get("reference")
        if stored is not None:
            return [float(x) for x in stored["losses"]]
    return None
