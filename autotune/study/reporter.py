"""Progress of a study, for whoever shows it (the CLI prints it; the library stays quiet)."""

from __future__ import annotations

from typing import Any

from ..results import TrialRecord


class Reporter:
    """Receives progress; subclass it to show notes and finished trials."""

    def note(self, message: str) -> None:
        """A sentence about the study: a dropped knob, a stale trial re-queued..."""

    def environment(self, environment: dict[str, Any]) -> None:
        """The machine and workload the probe found (peaks and model FLOPs for MFU),
        before the first trial."""

    def trial(
        self,
        record: TrialRecord,
        best: TrialRecord | None,
        baseline: TrialRecord | None,
        done: int,
        total: int | None,
    ) -> None:
        """A finished trial, the best and the baseline so far, and the budget used."""
