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

import math
import random
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import optuna

from .. import mfu
from ..config import Config
from ..errors import ArgumentError, SpaceError, make_folder
from ..knobs import Capabilities
from ..measurement import Measurement
from ..planned import Plan
from ..results import (
    CONFIRM,
    DUPLICATE,
    SEARCH,
    TrialRecord,
    TuneResult,
    baseline_of,
    best_of,
    ranked,
    summarize,
    write_best_config,
)
from ..space import Space
from ..space_file import load_space, with_workload_baseline
from . import coordination, launcher, scoring, screening
from .backend import SubprocessBackend, TrialBackend
from .confirm import Confirmation
from .coordination import claim, running_keys, waiting_roles
from .heartbeat import Heartbeat, fail_stale_trials
from .launcher import FORK
from .memory import MemoryModel, Prediction
from .reference import References
from .reporter import Reporter
from .sampling import encode, every_config, make_sampler, sample, unmeasured
from .storage import open_study, records

# The search stops when the sampler proposes this many measured configs in a row and no
# unmeasured config can be found instead. A config skipped as predicted over memory
# counts as such a proposal: it spends no budget (it costs nothing), so without the
# streak a sampler stuck in an over-memory region would loop.
MAX_DUPLICATES_IN_A_ROW = 30
# The study's record of a workload's own settings (a Trainer's arguments): its baseline.
WORKLOAD_BASELINE = "workload_baseline"


def _sampled(trial: optuna.Trial) -> bool:
    """Whether a search trial is the sampler's or the screening's own proposal: not the
    baseline, a confirmation run or a retry of a trial a dead worker left."""
    return trial.user_attrs.get("role", SEARCH) == SEARCH and "retry_of" not in trial.user_attrs


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

    def _trial_dir(self, number: int) -> Path:
        return self.out_dir / f"trial-{number:04d}"

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
            launcher.prestart(self.out_dir / "launcher.log")
        try:
            self._prepare()
            self._same_workload_baseline(study)
            study.set_user_attr("environment", self.environment)
            study.set_user_attr("capabilities", self.capabilities)
            stale = fail_stale_trials(study, grace_s=3 * self.space.study.heartbeat_s)
            if stale:
                self.reporter.note(
                    f"trial(s) {', '.join(map(str, stale))} were left running by a driver "
                    "that died; marked failed and queued again"
                )
            trials = records(study)
            coordination.queue_baseline(study, self.space, trials)
            self.references = References(
                self.space,
                self.backend,
                self.out_dir,
                self.reporter,
                worker_index=self.worker_index,
                n_trials=self.n_trials,
                run=self._run,
                tell=self._tell,
            )
            self.references.study_reference(study, trials)
            self._search(study)
            self._confirm(study)
        finally:  # a tune() call leaves no process behind, not even the idle launcher
            launcher.shutdown()
        return self._result(study)

    def _search(self, study: optuna.Study) -> None:
        """Sample and measure until the budget is spent or the space is exhausted.

        The study is re-read every iteration: other workers may share it, so the budget,
        the configs already measured (or being measured) and stale trials are global.
        """
        space = self.space
        pool = every_config(space)
        size = len(pool) if pool is not None else math.prod(map(len, space.searched.values()))
        rng = random.Random(space.search.seed)
        dup_streak = 0
        done = 0
        not_compiled = 0
        start = time.monotonic()
        grace_s = 3 * space.study.heartbeat_s

        while True:
            trials = records(study)
            # Configs skipped as predicted over memory were never run: not measured, and
            # they spend no budget (their streak is bounded like the duplicates').
            skipped = {
                t.config.key(): t
                for t in trials
                if t.status == scoring.PREDICTED_OVER_MEMORY and t.role == SEARCH
            }
            measured = coordination.measured(trials)
            running = running_keys(study)
            # Configs the confirmation measured (ablations) do not spend the budget.
            searched = {k for k, t in measured.items() if t.role != CONFIRM}
            done = len(searched | running)
            covered = len(searched | running | skipped.keys())
            if self.n_trials is not None and done >= self.n_trials:
                break
            if self.timeout_s is not None and time.monotonic() - start >= self.timeout_s:
                break
            if covered >= size or dup_streak >= MAX_DUPLICATES_IN_A_ROW:
                break
            if not waiting_roles(study):  # a queued trial (a retry) comes first
                self._screen(study, trials, measured.keys() | running | skipped.keys(), done)
            trial = study.ask()
            config = sample(space, trial)
            key = config.key()
            previous = measured.get(key)
            skip = hopeless = None
            if previous is None and key not in running:
                hopeless = self._hopeless(trial, config, measured, trials)
                skip = None if hopeless else self._predicted(trials, trial, config)
            if previous is not None or key in running or hopeless or (skip and key in skipped):
                if previous is not None:  # measured before: reuse it, spend nothing
                    self._tell(
                        study,
                        trial,
                        previous.config,
                        previous.measurement,
                        DUPLICATE,
                        duplicate_of=previous.number,
                    )
                elif skip is not None:  # skipped before, and still predicted over
                    self._skip(study, trial, config, skip, duplicate_of=skipped[key].number)
                else:  # another worker is measuring it right now, or not worth compiling
                    if hopeless:
                        trial.set_user_attr("not_run", hopeless)
                        not_compiled += 1
                    study.tell(trial, state=optuna.trial.TrialState.FAIL)
                dup_streak += 1
                if waiting_roles(study):  # a queued trial (a retry) comes first
                    continue
                # The sampler settled on measured ground: measure an unmeasured config at
                # once, a neighbour of the best ones, else a random one. At once beat
                # waiting for 3 such proposals in the replay benchmark (TPE within 5% of
                # the optimum at 20 trials: LM grid 20/20 seeds against 12/20).
                # Random search stays random (without replacement): no local moves.
                top = [] if space.search.sampler == "random" else ranked(summarize(trials))
                taken = measured.keys() | running | skipped.keys()
                found = unmeasured(space, [t.config for t in top[:3]], taken, rng, pool)
                if found is None:
                    break  # every config is measured
                # Queued and taken at once, so no queued trial outlives the loop.
                study.enqueue_trial(encode(space, found[0]), user_attrs={"proposed_by": found[1]})
                trial = study.ask()
                config = sample(space, trial)
                key = config.key()
                if key in measured or key in running:  # not ours: another worker queued it
                    study.tell(trial, state=optuna.trial.TrialState.FAIL)
                    continue
                skip = self._predicted(trials, trial, config)
            if skip is not None:  # predicted over memory: recorded, not run
                record = self._skip(study, trial, config, skip)
                trials.append(record)
                self.reporter.trial(record, best_of(trials), baseline_of(trials), done, None)
                dup_streak += 1
                continue
            if not claim(study, trial, key):  # a worker beside us raced us to it
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
                dup_streak += 1
                continue
            dup_streak = 0
            best = best_of(trials)
            record = self._measure(study, trial, config, best.value if best else None)
            trials.append(record)
            self.reporter.trial(
                record, best_of(trials), baseline_of(trials), done + 1, self.n_trials
            )
            fail_stale_trials(study, grace_s)  # a worker beside us may have died meanwhile
        if not_compiled:
            self.notes.append(
                f"{not_compiled} compiled config(s) the sampler proposed were not run: their "
                f"eager twin made under {screening.FAR_BELOW:.0%} of the best config"
            )
        if dup_streak >= MAX_DUPLICATES_IN_A_ROW:
            self.notes.append(
                f"stopped: the sampler proposed {dup_streak} measured (or predicted over "
                "memory) configs in a row"
            )
        elif done >= size:
            self.notes.append(f"all {size} configs of the space are measured")
        elif covered >= size:
            self.notes.append(
                f"all {size} configs of the space are measured or predicted over memory"
            )

    def _screen(
        self, study: optuna.Study, trials: list[TrialRecord], taken: set[str], done: int
    ) -> None:
        """Queue the screening's next move (:mod:`autotune.study.screening`), if any: one
        knob moved from the best feasible config so far. The plan is made once, when
        the baseline is measured, and kept in the study; a study made before the
        screening existed (no :data:`screening.ATTR`) is not screened."""
        search = self.space.search
        if not search.screening or search.sampler == "grid":
            return
        stored = study.user_attrs.get(screening.ATTR)
        if stored is None:  # a study made before the screening existed goes on without
            return
        if stored == screening.PENDING:
            base = baseline_of(trials)
            if base is None:  # a worker beside us measures it: the sampler meanwhile
                return
            profile = screening.Profile.of(
                base.measurement, self.memory_budget, self.space, self.environment
            )
            plan = screening.make_plan(self.space, self.space.baseline, profile)
            study.set_user_attr(screening.ATTR, plan.to_dict())
            left = None if self.n_trials is None else max(0, self.n_trials - done)
            self.reporter.note(screening.describe(plan, left))
        else:
            plan = screening.Plan.from_dict(stored)
        made = {
            str(t.user_attrs[screening.MOVE])
            for t in study.get_trials(deepcopy=False)
            if screening.MOVE in t.user_attrs
        }
        begin = screening.starts(trials, search.min_gain) or [self.space.baseline]
        found = screening.next_move(self.space, plan, begin, made, taken)
        if found is not None:
            move, config = found
            study.enqueue_trial(
                encode(self.space, config),
                user_attrs={"proposed_by": screening.PROPOSED_BY, screening.MOVE: move.label},
            )

    def _hopeless(
        self,
        trial: optuna.Trial,
        config: Config,
        measured: dict[str, TrialRecord],
        trials: list[TrialRecord],
    ) -> str | None:
        """Why a compiled config the sampler proposed is not worth its cold compile
        (:func:`autotune.study.screening.not_worth_compiling`); queued trials (the
        baseline, retries, the screening's moves) always run, and so does every config of a
        grid (a recorded table, the truth replays are judged against)."""
        if self.space.search.sampler == "grid":
            return None
        if not _sampled(trial) or trial.user_attrs.get("proposed_by"):
            return None
        return screening.not_worth_compiling(self.space, config, measured, best_of(trials))

    def _predicted(
        self, trials: list[TrialRecord], trial: optuna.Trial, config: Config
    ) -> Prediction | None:
        """The prediction that ``config`` cannot fit the memory budget, or ``None`` (it may
        fit, or the trial must run: the baseline, a retry, ``search.predict_memory`` off).

        The model is fitted afresh from ``trials`` (read from storage this iteration): a
        config predicted to fit that then went over is data for the next prediction.
        """
        if not self.space.search.predict_memory or self.memory_budget is None:
            return None
        if not _sampled(trial):
            return None
        device = str(self.capabilities.get("device", "cpu"))
        prediction = MemoryModel(trials, self.memory_budget, device).predict(config)
        return prediction if prediction.over else None

    def _skip(
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
        m = Measurement(status=scoring.PREDICTED_OVER_MEMORY, reason=reason)
        verdict = scoring.predicted_over(prediction.peak_bytes, reason, self.memory_budget)
        if prediction.peak_bytes is not None:
            trial.set_user_attr("predicted_peak_bytes", int(prediction.peak_bytes))
        role = SEARCH if duplicate_of is None else DUPLICATE
        return self._tell(study, trial, config, m, role, duplicate_of=duplicate_of, verdict=verdict)

    def _confirm(self, study: optuna.Study) -> None:
        """The confirmation after the search (:class:`~autotune.study.confirm.Confirmation`).

        Only the first worker confirms: paired rounds need the machine to themselves.
        """
        if not self.worker_index:
            Confirmation(
                self.space,
                self.study_name,
                self.storage,
                self.notes,
                self.reporter,
                run=self._run,
                tell=self._tell,
            ).confirm(study)

    def _run(
        self,
        study: optuna.Study,
        trial: optuna.Trial,
        config: Config,
        best_value: float | None = None,
    ) -> Measurement:
        try:
            with Heartbeat(trial, self.space.study.heartbeat_s):
                return self.backend.run_trial(
                    self.space, config, self._trial_dir(trial.number), best_value=best_value
                )
        except BaseException:  # Ctrl-C: the trial is not finished; it does not count
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            raise

    def _measure(
        self, study: optuna.Study, trial: optuna.Trial, config: Config, best_value: float | None
    ) -> TrialRecord:
        role = trial.user_attrs.get("role", SEARCH)
        # The baseline and retried trials are never pruned: they must be measured fully.
        m = self._run(study, trial, config, best_value if role == SEARCH else None)
        return self._tell(study, trial, config, m, role)

    def _tell(
        self,
        study: optuna.Study,
        trial: optuna.Trial,
        config: Config,
        m: Measurement,
        role: str,
        *,
        duplicate_of: int | None = None,
        repeat_of: int | None = None,
        reference: list[float] | None = None,
        round_: int | None = None,
        cold_compile_s: float | None = None,
        verdict: scoring.Verdict | None = None,
    ) -> TrialRecord:
        """Judge a measurement, store it on the trial and finish the trial.

        ``verdict``: the verdict when it is not the measurement's (a skipped config).
        ``round_``: the confirmation round of the run; ``cold_compile_s``: the config's
        cold-cache compile time, charged (with a planned length) to a warm-cache run.
        """
        if verdict is None:
            assert self.references is not None
            verdict = scoring.judge(
                m,
                self.space,
                reference=reference or self.references.for_config(study, config, m),
                memory_budget_bytes=self.memory_budget,
            )
        value = scoring.objective(m, self.space.trial, cold_compile_s)
        attrs = {  # role first: a duplicate or repeat never looks like a claimant
            "role": role,
            "config": config.to_dict(),
            "config_key": config.key(),
            "measurement": m.to_dict(),
            "status": verdict.status,
            "reason": verdict.reason,
            "loss_deviation": verdict.loss_deviation,
        }
        if duplicate_of is not None:
            attrs["duplicate_of"] = duplicate_of
        if repeat_of is not None:
            attrs["repeat_of"] = repeat_of
        if round_ is not None:
            attrs["round"] = round_
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
        )

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
