"""The trials of one study: running, measuring, telling and skipping a trial.

:class:`Trials` is the one writer of a trial's user attributes (what
:func:`autotune.study.storage.records` reads back): the search, the references and the
confirmation hand it their trials. Running a trial and judging it are apart: a trial is
run (:meth:`Trials.run`, in its folder :func:`trial_folder`), the fp32 reference it is
judged against is found (:meth:`Trials.measure`, which may run one), and only then is it
told (:meth:`Trials.tell`), which judges and stores and runs nothing.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Protocol

import optuna

from ..config import Config
from ..measurement import PREDICTED_OVER_MEMORY, Measurement
from ..results import DUPLICATE, SEARCH, TrialRecord
from ..space import ENERGY, Space
from . import scoring, screening
from .backend import TrialBackend
from .heartbeat import Heartbeat
from .memory import Prediction
from .reporter import Reporter

FAIL = optuna.trial.TrialState.FAIL


class ReferenceSource(Protocol):
    """What judges a run's losses: the study's fp32 references
    (:class:`~autotune.study.reference.References`)."""

    def for_config(
        self, study: optuna.Study, config: Config, m: Measurement | None = None
    ) -> list[float] | None: ...


def memory_together(runs: Iterable[TrialRecord], configs: list[Config]) -> int:
    """The bytes ``configs`` need side by side: the sum of each one's largest memory peak
    in ``runs``, one never measured counted as the largest of the others."""
    keys = {c.key() for c in configs}
    peaks: dict[str, int] = {}
    for t in runs:
        peak = t.measurement.peak_mem_bytes
        if peak is not None and t.config.key() in keys:
            peaks[t.config.key()] = max(peak, peaks.get(t.config.key(), 0))
    largest = max(peaks.values(), default=0)
    return sum(peaks.get(c.key(), largest) for c in configs)


def trial_folder(out_dir: Path, number: int) -> Path:
    """The folder of trial ``number`` under the study's output folder: its log, its
    progress, its profile (``trial-0007``)."""
    return out_dir / f"trial-{number:04d}"


class Trials:
    """Runs and stores the trials of one study.

    ``space`` is the restricted space (after the probe); ``memory_budget`` the bytes a
    trial may use (``None``: no limit); ``reporter`` hears of a trial the storage
    refused. :attr:`references` is set once the study's fp32 references exist
    (:class:`~autotune.study.reference.References` takes this object to run the baseline
    when it is the reference).
    """

    def __init__(
        self,
        space: Space,
        backend: TrialBackend,
        out_dir: Path,
        memory_budget: int | None,
        reporter: Reporter,
    ) -> None:
        self.space = space
        self.reporter = reporter
        self.backend = backend
        self.out_dir = out_dir
        self.memory_budget = memory_budget
        self.references: ReferenceSource | None = None

    def folder(self, number: int) -> Path:
        return trial_folder(self.out_dir, number)

    def run(
        self,
        study: optuna.Study,
        trial: optuna.Trial,
        config: Config,
        best_value: float | None = None,
    ) -> Measurement:
        """Run ``config`` on ``trial`` (taken from ``study``) in its own process; pruned
        against ``best_value`` when given. Interrupted (Ctrl-C), the trial is failed: it
        does not count."""
        try:
            with Heartbeat(trial, self.space.study.heartbeat_s):
                return self.backend.run_trial(
                    self.space, config, self.folder(trial.number), best_value=best_value
                )
        except BaseException:
            study.tell(trial, state=FAIL)
            raise

    def measure(
        self,
        study: optuna.Study,
        trial: optuna.Trial,
        config: Config,
        best_value: float | None = None,
        **told: Any,
    ) -> TrialRecord:
        """Run ``config``, find the reference it is judged against, and tell it. The role
        is the trial's (queued trials carry theirs); the baseline and every queued role
        but the search's are never pruned: they must be measured fully. ``told``: what
        :meth:`tell` takes besides (a confirmation round's ``round_``...)."""
        role = trial.user_attrs.get("role", SEARCH)
        m = self.run(study, trial, config, best_value if role == SEARCH else None)
        return self._judged(study, trial, config, m, **told)

    def _judged(
        self, study: optuna.Study, trial: optuna.Trial, config: Config, m: Measurement, **told: Any
    ) -> TrialRecord:
        """Tell ``trial``'s run ``m`` in its role (queued trials carry theirs), judged
        against the reference :meth:`reference` finds."""
        role = trial.user_attrs.get("role", SEARCH)
        return self.tell(
            study, trial, config, m, role, reference=self.reference(study, config, m), **told
        )

    def measure_round(
        self, study: optuna.Study, runs: list[tuple[optuna.Trial, Config, dict[str, Any]]]
    ) -> list[TrialRecord]:
        """Run the configs of ``runs`` (each on its trial, with what :meth:`tell` takes
        besides) side by side, taking turns on the machine (the backend's ``run_round``),
        then judge and tell each as :meth:`measure` does. Interrupted, every trial of
        the round is failed."""
        try:
            with ExitStack() as beats:
                for trial, _, _ in runs:
                    beats.enter_context(Heartbeat(trial, self.space.study.heartbeat_s))
                configs = [config for _, config, _ in runs]
                folders = [self.folder(trial.number) for trial, _, _ in runs]
                ms = self.backend.run_round(self.space, configs, folders)
        except BaseException:
            for trial, _, _ in runs:
                study.tell(trial, state=FAIL)
            raise
        return [
            self._judged(study, trial, config, m, **told)
            for (trial, config, told), m in zip(runs, ms, strict=True)
        ]

    def apart(self, runs: list[TrialRecord], configs: list[Config]) -> str | None:
        """Why runs of ``configs`` cannot go side by side, taking turns on the machine
        (:meth:`measure_round`); ``None`` when they can: ``search.interleave`` on, a
        noisy backend (a replay's table has no drift to share), named pipes for the turns
        (not Windows), a throughput objective (an interleaved window reads no energy),
        each config one process (no DDP ranks, which would each wait for a turn), the
        steps autotune's own (a framework's loop, a Trainer's, runs whole: a turn would
        be its whole run), and their memory peaks together within one trial's memory
        budget: each config's largest in ``runs`` (the study's so far), one not yet run
        counted as the largest of the others. "" when nothing is worth a note; the
        memory's reason otherwise."""
        if not self.space.search.interleave or any(c.world_size > 1 for c in configs):
            return ""
        if not getattr(self.backend, "noisy", True) or not hasattr(os, "mkfifo"):
            return ""
        if self.space.trial.objective == ENERGY:
            return ""
        if any(t.measurement.loop is not None for t in runs):
            return ""
        if self.memory_budget is None:
            return None
        need = memory_together(runs, configs)
        if need <= self.memory_budget:
            return None
        return (
            f"side by side their {len(configs)} runs would need {need / 2**30:.1f} GiB, over "
            f"the memory limit ({self.memory_budget / 2**30:.1f} GiB; search.interleave)"
        )

    def reference(self, study: optuna.Study, config: Config, m: Measurement) -> list[float] | None:
        """The fp32 loss trajectory ``config``'s run ``m`` is judged against (the first
        trial of a new data layout may run one)."""
        assert self.references is not None, "the study's references come before its trials"
        return self.references.for_config(study, config, m)

    def reuse(self, study: optuna.Study, trial: optuna.Trial, previous: TrialRecord) -> TrialRecord:
        """Finish ``trial`` with the measurement of a config measured before: a duplicate,
        which spends no budget."""
        m = previous.measurement
        return self.tell(
            study,
            trial,
            previous.config,
            m,
            DUPLICATE,
            duplicate_of=previous.number,
            reference=self.reference(study, previous.config, m),
        )

    def not_run(self, study: optuna.Study, trial: optuna.Trial, why: str | None = None) -> None:
        """Fail ``trial`` without running it: another worker measures its config, a worker
        raced us to it, or (``why``) it is not worth its cold compile."""
        if why:
            trial.set_user_attr("not_run", why)
        study.tell(trial, state=FAIL)

    def skip(
        self,
        study: optuna.Study,
        trial: optuna.Trial,
        config: Config,
        prediction: Prediction,
        duplicate_of: int | None = None,
    ) -> TrialRecord:
        """Store ``config`` as skipped, predicted over the memory budget: value 0 and a
        positive memory constraint, so the sampler avoids the region as after a run."""
        assert self.memory_budget is not None
        reason = prediction.reason(self.memory_budget)
        m = Measurement(status=PREDICTED_OVER_MEMORY, reason=reason)
        verdict = scoring.predicted_over(prediction.peak_bytes, reason, self.memory_budget)
        if prediction.peak_bytes is not None:
            trial.set_user_attr("predicted_peak_bytes", int(prediction.peak_bytes))
        role = SEARCH if duplicate_of is None else DUPLICATE
        return self.tell(study, trial, config, m, role, duplicate_of=duplicate_of, verdict=verdict)

    def tell(
        self,
        study: optuna.Study,
        trial: optuna.Trial,
        config: Config,
        m: Measurement,
        role: str,
        *,
        reference: list[float] | None = None,
        duplicate_of: int | None = None,
        repeat_of: int | None = None,
        round_: int | None = None,
        cold_compile_s: float | None = None,
        verdict: scoring.Verdict | None = None,
    ) -> TrialRecord:
        """Judge a measurement against ``reference``, store it on the trial and finish the
        trial. Runs nothing.

        ``verdict``: the verdict when it is not the measurement's (a skipped config).
        ``round_``: the confirmation round of the run; ``cold_compile_s``: the config's
        cold-cache compile time, charged (with a planned length) to a warm-cache run.
        """
        if verdict is None:
            verdict = scoring.judge(
                m, self.space, reference=reference, memory_budget_bytes=self.memory_budget
            )
        value = scoring.objective(m, self.space.trial, cold_compile_s)
        attrs: dict[str, Any] = {  # role first: a duplicate or repeat never looks like a claimant
            "role": role,
            "config": config.to_dict(),
            "config_key": config.key(),
            "measurement": m.to_dict(),
            "status": verdict.status,
            "reason": verdict.reason,
            "loss_deviation": verdict.loss_deviation,
        }
        for key, v in (("duplicate_of", duplicate_of), ("repeat_of", repeat_of), ("round", round_)):
            if v is not None:
                attrs[key] = v
        try:
            for key, v in attrs.items():
                trial.set_user_attr(key, v)
            for key, c in verdict.constraints.items():
                trial.set_constraint(key, c)
            study.tell(trial, value)
        except (ValueError, RuntimeError) as e:  # failed as stale by another driver meanwhile
            self.reporter.note(f"trial {trial.number} could not be stored ({e}); it is re-queued")
        return TrialRecord(
            trial.number,
            config,
            m,
            value,
            role,
            verdict.status,
            verdict.reason,
            duplicate_of,
            verdict.loss_deviation,
            repeat_of,
            round=round_,
            move=trial.user_attrs.get(screening.MOVE),
            look_for=trial.user_attrs.get("look_for"),
            paired_with=trial.user_attrs.get("paired_with"),
            twin=bool(trial.user_attrs.get("twin", False)),
        )
