"""What runs trials for the tuner: the :class:`TrialBackend` protocol.

:class:`SubprocessBackend` (the default) runs each probe, trial and profile as a real
subprocess (:mod:`autotune.study.runner`); :class:`~autotune.study.replay.ReplayBackend`
answers from a recorded table. The tuner and the profiling of a report only talk to a
backend, so a replay substitutes for every run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from ..config import Config
from ..measurement import Measurement
from ..space import Space
from . import runner


class TrialBackend(Protocol):
    """Runs the probe, trials and profiles of a study.

    ``noisy``: whether two runs of one config can differ (a machine runs them); a study
    measures its noise floor only then (``search.noise_runs``).
    """

    noisy: bool

    def probe(self, space: Space, folder: Path) -> dict[str, Any]:
        """Capabilities and environment of the trial machine (``capabilities``,
        ``environment``); raises :class:`~autotune.errors.WorkloadError` when the
        workload cannot be built."""
        ...

    def run_trial(
        self, space: Space, config: Config, folder: Path, best_value: float | None = None
    ) -> Measurement:
        """Measure ``config``; never raises for a failing trial."""
        ...

    def run_round(
        self, space: Space, configs: list[Config], folders: list[Path]
    ) -> list[Measurement]:
        """Measure ``configs`` side by side, taking turns on the machine (a confirmation
        round: :func:`autotune.study.runner.run_interleaved`); their measurements in
        order; never raises for a failing trial."""
        ...

    def profile_trial(
        self, space: Space, config: Config, folder: Path, steps: int
    ) -> dict[str, Any]:
        """Profile ``steps`` steps of ``config``; a payload with ``status`` and, when
        ``ok``, the shares of the step."""
        ...


class SubprocessBackend:
    """Each run in a fresh subprocess (``python -m autotune.trial``)."""

    noisy = True

    def probe(self, space: Space, folder: Path) -> dict[str, Any]:
        return runner.probe(space, folder)

    def run_trial(
        self, space: Space, config: Config, folder: Path, best_value: float | None = None
    ) -> Measurement:
        return runner.run_trial(space, config, folder, best_value=best_value)

    def run_round(
        self, space: Space, configs: list[Config], folders: list[Path]
    ) -> list[Measurement]:
        return runner.run_interleaved(space, configs, folders)

    def profile_trial(
        self, space: Space, config: Config, folder: Path, steps: int
    ) -> dict[str, Any]:
        return runner.profile_trial(space, config, folder, steps)
