"""The study engine: samples configs, runs them as trials, keeps every result in storage.

The baseline (the space's defaults) is always trial 0, so every result is a speedup over
it. A rerun with the same storage and study name resumes: finished trials are kept and the
budget is filled up, never restarted. Before the search, the fp32 reference that the
accuracy guard judges trials against is read back or run (:mod:`autotune.study.reference`).
After the budget, the confirmation (:mod:`autotune.study.confirm`) measures the baseline and
the top configs in paired rounds, ablates the winner's knobs and recommends the simplest
config within noise of it.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import optuna

from .. import mfu
from ..errors import ArgumentError, SpaceError, make_folder
from ..knobs import Capabilities
from ..planned import Plan
from ..results import (
    TuneResult,
    write_best_config,
)
from ..space import Space
from ..space_file import load_space, with_workload_baseline
from . import coordination, forks, screening
from .backend import SubprocessBackend, TrialBackend
from .confirm import Confirmation
from .forks import FORK
from .heartbeat import fail_stale_trials, grace_s
from .reference import References
from .reporter import Reporter
from .sampling import make_sampler
from .search import Search
from .storage import open_study, records
from .trials import Trials

# The study's record of a workload's own settings (a Trainer's arguments): its baseline.
WORKLOAD_BASELINE = "workload_baseline"


class Tuner:
    """Runs a study over a space. See :func:`autotune.tune` for the arguments.

    ``backend`` runs the probe and the trials: real subprocesses by default, or a
    :class:`~autotune.study.replay.ReplayBackend` answering from a recorded table.

    Raises:
        ArgumentError: ``n_trials`` below 1, ``timeout_s`` not above 0, or a negative
            ``worker_index``.
    """

    def __init__(
        self,
        space: Space,
        *,
        n_trials: int | None = None,
        timeout_s: float | None = None,
        storage: str | None = None,
        study_name: str | None = None,
        out_dir: str | Path | None = None,
        reporter: Reporter | None = None,
        backend: TrialBackend | None = None,
        worker_index: int = 0,
    ) -> None:
        check_arguments(n_trials, timeout_s, worker_index)
        if worker_index:  # workers sharing a study must not propose the same sequence
            space = replace(
                space, search=replace(space.search, seed=space.search.seed + worker_index)
            )
        self.space = space
        self.worker_index = worker_index
        self.n_trials = n_trials if n_trials is not None else space.budget.n_trials
        self.timeout_s = timeout_s if timeout_s is not None else space.budget.timeout_s
        self.storage = space.storage_url(storage)
        self.study_name = study_name or space.study.name
        self.out_dir = make_folder(Path(out_dir or space.output_dir) / self.study_name, "out")
        self.reporter = reporter or Reporter()
        self.backend = backend or SubprocessBackend()
        self.references: References | None = None  # made by run() once _prepare is done
        self.memory_budget: int | None = None
        self.environment: dict[str, Any] = {}
        self.capabilities: dict[str, Any] = {}
        self.notes: list[str] = []
        self.workload_baseline: dict[str, Any] | None = None  # a Trainer's own settings

    def _prepare(self) -> None:
        """Probe the machine and workload; restrict the space to what can run here."""
        folder = "probe" if not self.worker_index else f"probe-{self.worker_index}"
        probe = self.backend.probe(self.space, self.out_dir / folder)
        lengths = self.out_dir / folder / "lengths.json"
        if lengths.is_file():  # the trials read the samples' lengths instead of a pass
            self.space = replace(self.space, lengths_path=str(lengths.resolve()))
        facts = probe.get("workload") or {}
        self.workload_baseline = facts.get("baseline")
        if self.workload_baseline:  # a Trainer's own arguments: the baseline
            self.space = with_workload_baseline(self.space, self.workload_baseline, facts["name"])
        self.capabilities = probe["capabilities"]
        caps = Capabilities.from_dict(self.capabilities)
        if self.space.trial.planned_tokens is not None and not caps.tokens:
            raise SpaceError(
                f"{self.space.source}: trial.planned_tokens: the workload's samples are not "
                "token sequences (Workload.tokens); give the planned run in planned_steps "
                "or planned_samples"
            )
        self.space, notes = self.space.restrict(caps)
        self.environment = probe["environment"]
        self.notes = [*self.space.notes, *notes]
        if not self.space.fixed_batch:
            self.notes.append(
                "global_batch is free: trials differ in samples per optimizer step, so "
                "convergence may change and loss trajectories are only checked for NaN/divergence"
            )
        for note in self.notes:
            self.reporter.note(note)
        self.reporter.environment(self.environment)
        why_not, basis = mfu.unavailable(self.environment), mfu.describe(self.environment)
        if why_not:
            self.reporter.note(f"no {mfu.LABEL}: {why_not}")
        elif basis:
            self.reporter.note(f"{mfu.LABEL} basis: {basis}")
        self.memory_budget = self.space.limits.memory_bytes(
            self.environment.get("device_memory_bytes")
        )

    def _same_workload_baseline(self, study: optuna.Study) -> None:
        """A study resumed with a Trainer whose arguments changed would keep the old
        baseline trial (the fingerprint covers the space file, not the arguments)."""
        own, stored = self.workload_baseline, study.user_attrs.get(WORKLOAD_BASELINE)
        if not own:
            return
        if stored is not None and stored != own:
            changed = ", ".join(
                f"{k} {stored.get(k)!r} -> {own.get(k)!r}"
                for k in sorted(set(own) | set(stored))
                if own.get(k) != stored.get(k)
            )
            raise SpaceError(
                f"{self.space.source}: the workload's own settings changed since study "
                f"{self.study_name!r} measured its baseline ({changed}): start a new study "
                "(--study-name)"
            )
        study.set_user_attr(WORKLOAD_BASELINE, own)

    def run(self) -> TuneResult:
        # Storage first: a bad URL or a study from another space fails before any work.
        study = open_study(self.space, self.storage, self.study_name, make_sampler(self.space))
        if not study.get_trials(deepcopy=False):  # a new study: screened once its baseline ran
            study.set_user_attr(screening.ATTR, screening.PENDING)
        # The launcher imports torch while the probe is set up; a replay runs no process.
        if self.space.trial.launcher == FORK and isinstance(self.backend, SubprocessBackend):
            forks.prestart(self.out_dir / "launcher.log")
        try:
            self._prepare()
            self._resume(study)
            trials = self._references(study)
            Search(
                trials,
                self.reporter,
                self.notes,
                n_trials=self.n_trials,
                timeout_s=self.timeout_s,
                capabilities=self.capabilities,
                environment=self.environment,
                worker_index=self.worker_index,
            ).run(study)
            if not self.worker_index:  # paired rounds need the machine to themselves
                Confirmation(
                    self.space, self.study_name, self.storage, self.notes, self.reporter, trials
                ).confirm(study)
        finally:  # a tune() call leaves no process behind, not even the idle launcher
            forks.shutdown()
        return self._result(study)

    def _resume(self, study: optuna.Study) -> None:
        """What the study keeps of this run's machine, and the trials a dead driver left."""
        self._same_workload_baseline(study)
        study.set_user_attr("environment", self.environment)
        study.set_user_attr("capabilities", self.capabilities)
        stale = fail_stale_trials(study, grace_s=grace_s(self.space.study.heartbeat_s))
        if stale:
            self.reporter.note(
                f"trial(s) {', '.join(map(str, stale))} were left running by a driver "
                "that died; marked failed and queued again"
            )

    def _references(self, study: optuna.Study) -> Trials:
        """The study's trials, once the baseline is queued and the fp32 reference the
        accuracy guard judges them against is read back or run."""
        stored = records(study)
        coordination.queue_baseline(study, self.space, stored)
        trials = Trials(self.space, self.backend, self.out_dir, self.memory_budget, self.reporter)
        self.references = References(
            self.space,
            self.backend,
            self.out_dir,
            self.reporter,
            worker_index=self.worker_index,
            n_trials=self.n_trials,
            trials=trials,
        )
        trials.references = self.references
        self.references.study_reference(study, stored)
        return trials

    def _result(self, study: optuna.Study) -> TuneResult:
        result = TuneResult.from_trials(
            self.study_name,
            self.storage,
            records(study),
            confirmation=study.user_attrs.get("confirmation"),
            min_gain=self.space.search.min_gain,
            environment=self.environment,
            notes=self.notes,
            memory_budget_bytes=self.memory_budget,
            global_batch=self.space.global_batch,
            plan=Plan.of(self.space.trial),
            screening=screening.kept(study.user_attrs),
            objective=self.space.trial.objective,
        )
        if result.best is not None:
            path = write_best_config(result, self.out_dir / "best_config.yaml")
            result = replace(result, best_config_path=path)
        return result


def tune(
    space: Space | str | Path,
    *,
    n_trials: int | None = None,
    timeout_s: float | None = None,
    storage: str | None = None,
    study_name: str | None = None,
    out_dir: str | Path | None = None,
    reporter: Reporter | None = None,
    backend: TrialBackend | None = None,
    worker_index: int = 0,
) -> TuneResult:
    """Search the space for the fastest config; the library form of ``autotune run``.

    Args:
        space: a :class:`Space` or the path of a space file.
        n_trials: distinct configs to measure in total (finished ones of a resumed study
            count); defaults to the space's ``budget.n_trials``.
        timeout_s: stop starting trials after this many seconds of this call.
        storage: Optuna storage URL; defaults to ``$AUTOTUNE_STORAGE``, else the space's
            ``study.storage`` (:meth:`Space.storage_url`);
            ``"memory"`` keeps the study in this process only (benchmarks, tests).
        study_name: defaults to the space's ``study.name`` (the file's stem).
        out_dir: folder for trial logs and ``best_config.yaml``.
        reporter: receives notes and per-trial progress.
        backend: what runs trials (default: real subprocesses; see :class:`Tuner`).
        worker_index: this worker's number when several share the study (offsets the
            sampler's seed).

    Returns:
        A :class:`TuneResult` with every measured config, the baseline and the
        recommended config.

    Raises:
        ArgumentError: an argument is out of range (``n_trials`` below 1...).
        SpaceError, WorkloadError, StorageError: the space, workload or storage is wrong.
    """
    if not isinstance(space, Space):
        space = load_space(space)
    return Tuner(
        space,
        n_trials=n_trials,
        timeout_s=timeout_s,
        storage=storage,
        study_name=study_name,
        out_dir=out_dir,
        reporter=reporter,
        backend=backend,
        worker_index=worker_index,
    ).run()


def check_arguments(n_trials: int | None, timeout_s: float | None, worker_index: int = 0) -> None:
    """Reject out-of-range arguments at once, naming the argument."""
    if n_trials is not None and (isinstance(n_trials, bool) or n_trials < 1):
        raise ArgumentError(f"n_trials must be at least 1 but got {n_trials}")
    if timeout_s is not None and not timeout_s > 0:  # NaN fails too
        raise ArgumentError(f"timeout_s must be a number > 0 but got {timeout_s}")
    if worker_index < 0:
        raise ArgumentError(f"worker_index must be at least 0 but got {worker_index}")
