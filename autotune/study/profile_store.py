"""Profiles of a study's trials: run once through the backend, kept in the study.

:func:`ensure_profiles` runs the profile pass (the trial process in ``profile`` mode, see
:mod:`autotune.trial.profile`) for the baseline and the recommended config through the
study's :class:`~autotune.study.backend.TrialBackend`, and stores each summary in the
study's user attrs (``profile:<trial number>``), so ``autotune report`` profiles a trial
once and reuses the result on every later report. Artifacts go to
``<runs>/<study>/trial-NNNN/profile/``: ``result.json`` (the summary), ``trace.json`` (a
Chrome trace), ``stdout.log``/``stderr.log``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna

from ..errors import ArgumentError
from ..measurement import OK
from ..results import TrialRecord
from ..space import Space
from .backend import SubprocessBackend, TrialBackend
from .reporter import Reporter
from .trials import trial_folder

PROFILE_ATTR = "profile:{number}"
DEFAULT_PROFILE_STEPS = 5


def stored_profile(study: optuna.Study, record: TrialRecord) -> dict[str, Any] | None:
    """The stored profile of a trial, if it was made for that trial's config."""
    stored = study.user_attrs.get(PROFILE_ATTR.format(number=record.number))
    if stored and stored.get("config") == record.config.to_dict():
        return stored
    return None


def ensure_profiles(
    space: Space,
    study: optuna.Study,
    records: list[TrialRecord],
    runs_dir: Path,
    *,
    steps: int = DEFAULT_PROFILE_STEPS,
    force: bool = False,
    reporter: Reporter | None = None,
    backend: TrialBackend | None = None,
) -> dict[int, dict[str, Any]]:
    """Profile each of ``records`` unless the study already holds its profile.

    Args:
        space: the space the study was run from (workload, device, trial settings).
        study: where profiles are kept (``profile:<number>`` user attrs).
        records: the trials to profile, e.g. baseline and best; repeats are profiled once.
        runs_dir: the study's run folder (``<output_dir>/<study>``).
        steps: profiled optimizer steps (after the trial's warm-up steps).
        force: profile again even when a stored profile exists.
        reporter: receives a note before each profile run.
        backend: what runs the profiles (default: real subprocesses).

    Returns:
        Trial number -> profile summary (``status`` is ``ok`` or why it failed).

    Raises:
        ArgumentError: ``steps`` is below 1.
    """
    if steps < 1:
        raise ArgumentError(f"profile steps must be at least 1 but got {steps}")
    reporter = reporter or Reporter()
    backend = backend or SubprocessBackend()
    out: dict[int, dict[str, Any]] = {}
    for record in records:
        if record.number in out:
            continue
        stored = None if force else stored_profile(study, record)
        if stored is None:
            reporter.note(f"profiling trial #{record.number} ({record.config.short()})")
            folder = trial_folder(runs_dir, record.number) / "profile"
            stored = backend.profile_trial(space, record.config, folder, steps)
            stored["config"] = record.config.to_dict()
            if stored.get("status") == OK:  # a failed profile is retried next time
                study.set_user_attr(PROFILE_ATTR.format(number=record.number), stored)
        out[record.number] = stored
    return out
