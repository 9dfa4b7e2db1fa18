"""The study engine: samples configs, runs them as trials, keeps every result in storage.

The baseline (the space's defaults) is always trial 0, so every result is a speedup over
it. A rerun with the same storage and study name resumes: finished trials are kept and the
budget is filled up, never restarted. After the budget, a confirmation round re-measures
the baseline and the top configs, interleaved, and ranks by the median.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import optuna

from . import runner, scoring
from ._heartbeat import Heartbeat, fail_stale_trials
from .config import Config, resolve_inactive
from .errors import StorageError, WorkloadError, first_line
from .knobs import Capabilities
from .measurement import Measurement
from .results import (  # noqa: F401  (re-exported: the engine's vocabulary)
    BASELINE,
    DUPLICATE,
    REPEAT,
    SEARCH,
    TrialRecord,
    TuneResult,
    baseline_of,
    best_of,
    ranked,
    records,
    summarize,
)
from .sampling import encode, every_config, make_sampler, sample, unmeasured
from .space import Space
from .storage import create_or_load, open_storage

MAX_DUPLICATES_IN_A_ROW = 30
# After this many measured configs proposed in a row, measure an unmeasured one instead:
# a neighbour of the best configs, else a random one (see sampling.unmeasured). 1 beat 3
# in the replay benchmark (TPE within 5% of the optimum at 20 trials: LM grid 20/20 seeds
# against 12/20, CNN grid 19/20 against 18/20).
FALLBACK_AFTER_DUPLICATES = 1


class Reporter:
    """Receives progress; the CLI prints it, the library default stays quiet."""

    def note(self, message: str) -> None:
        pass

    def trial(
        self,
        record: TrialRecord,
        best: TrialRecord | None,
        baseline: TrialRecord | None,
        done: int,
        total: int | None,
    ) -> None:
        pass


def reference_config(baseline: Config) -> Config:
    """The baseline with plain fp32 eager numerics: the accuracy guard's yardstick.

    Reduced-precision matmuls and compilers are off; knobs that only apply with them
    (compile_fullgraph...) go back to their defaults.
    """
    plain = {
        "amp_dtype": "fp32",
        "matmul_precision": "highest",
        "compile_mode": "off",
        "jit": "off",
    }
    return Config(**resolve_inactive({**baseline.to_dict(), **plain}))


def open_study(space: Space, storage: str, study_name: str) -> optuna.Study:
    """Create or load the study; refuse one that was made from a different space.

    Raises:
        StorageError: the storage cannot be opened, or the study's space differs.
    """
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        study = create_or_load(open_storage(storage), study_name, make_sampler(space))
    except StorageError:
        raise
    except Exception as e:  # SQLAlchemy/Optuna raise many types for a bad URL or file
        detail = first_line(e)
        raise StorageError(
            f"cannot open storage {storage!r}: {type(e).__name__}: {detail}"
        ) from None
    fingerprint = space.fingerprint()
    stored = study.user_attrs.get("space_fingerprint")
    if stored is None:
        study.set_user_attr("space_fingerprint", fingerprint)
        study.set_user_attr("space_source", space.source)
    elif stored != fingerprint:
        raise StorageError(
            f"study {study_name!r} in {storage} was made from a different space "
            f"({study.user_attrs.get('space_source')}); pass another --study-name to start anew"
        )
    return study


class Tuner:
    """Runs a study over a space. See :func:`autotune.tune` for the arguments.

    ``backend`` runs the probe and the trials: :mod:`autotune.runner` (real subprocesses)
    by default, or a :class:`autotune.replay.ReplayBackend` answering from a recorded table.
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
        backend: Any = runner,
        worker_index: int = 0,
    ) -> None:
        if worker_index:  # workers sharing a study must not propose the same sequence
            space = replace(
                space, search=replace(space.search, seed=space.search.seed + worker_index)
            )
        self.space = space
        self.worker_index = worker_index
        self.n_trials = n_trials if n_trials is not None else space.budget.n_trials
        self.timeout_s = timeout_s if timeout_s is not None else space.budget.timeout_s
        if self.n_trials is not None and self.n_trials < 1:
            raise ValueError(f"n_trials must be at least 1 but got {self.n_trials}")
        self.storage = storage or space.study.storage
        self.study_name = study_name or space.study.name
        self.out_dir = Path(out_dir or space.output_dir) / self.study_name
        self.reporter = reporter or Reporter()
        self.backend = backend
        self.reference: list[float] | None = None
        self.memory_budget: int | None = None
        self.environment: dict[str, Any] = {}
        self.capabilities: dict[str, Any] = {}
        self.notes: list[str] = []

    def _trial_dir(self, number: int) -> Path:
        return self.out_dir / f"trial-{number:04d}"

    def _prepare(self) -> None:
        """Probe the machine and workload; restrict the space to what can run here."""
        folder = "probe" if not self.worker_index else f"probe-{self.worker_index}"
        probe = self.backend.probe(self.space, self.out_dir / folder)
        self.capabilities = probe["capabilities"]
        caps = Capabilities.from_dict(self.capabilities)
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
        self.memory_budget = self.space.limits.memory_bytes(
            self.environment.get("device_memory_bytes")
        )

    def run(self) -> TuneResult:
        # Storage first: a bad URL or a study from another space fails before any work.
        study = open_study(self.space, self.storage, self.study_name)
        self._prepare()
        study.set_user_attr("environment", self.environment)
        study.set_user_attr("capabilities", self.capabilities)
        stale = fail_stale_trials(study, grace_s=3 * self.space.study.heartbeat_s)
        if stale:
            self.reporter.note(
                f"trial(s) {', '.join(map(str, stale))} were left running by a driver that "
                "died; marked failed and queued again"
            )
        trials = records(study)
        self._queue_baseline(study, trials)
        self.reference = self._reference(study, trials)
        self._search(study)
        self._confirm(study)
        return self._result(study)

    def _queue_baseline(self, study: optuna.Study, trials: list[TrialRecord]) -> None:
        """Queue the baseline unless it is measured, queued or being measured. Two workers
        starting at once may both queue it; :func:`_claim` lets only one measure it."""
        if baseline_of(trials) is None and BASELINE not in (
            _waiting_roles(study) + _running_roles(study)
        ):
            study.enqueue_trial(
                encode(self.space, self.space.baseline), user_attrs={"role": BASELINE}
            )

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
        start = time.monotonic()
        grace_s = 3 * space.study.heartbeat_s

        while True:
            trials = records(study)
            measured = {t.config.key(): t for t in trials if t.role not in (DUPLICATE, REPEAT)}
            running = _running_keys(study)
            done = len(measured.keys() | running)
            if self.n_trials is not None and done >= self.n_trials:
                break
            if self.timeout_s is not None and time.monotonic() - start >= self.timeout_s:
                break
            if done >= size or dup_streak >= MAX_DUPLICATES_IN_A_ROW:
                break
            trial = study.ask()
            config = sample(space, trial)
            key = config.key()
            previous = measured.get(key)
            if previous is not None or key in running:
                if previous is not None:  # measured before: reuse it, spend nothing
                    self._tell(
                        study,
                        trial,
                        previous.config,
                        previous.measurement,
                        DUPLICATE,
                        duplicate_of=previous.number,
                    )
                else:  # another worker is measuring it right now
                    study.tell(trial, state=optuna.trial.TrialState.FAIL)
                dup_streak += 1
                if dup_streak < FALLBACK_AFTER_DUPLICATES or _waiting_roles(study):
                    continue
                # random search stays random (without replacement): no local moves
                top = [] if space.search.sampler == "random" else ranked(summarize(trials))
                found = unmeasured(
                    space, [t.config for t in top[:3]], measured.keys() | running, rng, pool
                )
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
            if not _claim(study, trial, key):  # a worker beside us raced us to it
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
        if dup_streak >= MAX_DUPLICATES_IN_A_ROW:
            self.notes.append(
                f"stopped: the sampler proposed {dup_streak} measured configs in a row"
            )
        elif done >= size:
            self.notes.append(f"all {size} configs of the space are measured")

    def _confirm(self, study: optuna.Study) -> None:
        """Re-measure the baseline and the top configs, interleaved, so that the ranking
        and the speedup rest on more than one noisy run each."""
        search = self.space.search
        if search.confirm_top == 0 or search.confirm_repeats == 0:
            return
        trials = records(study)
        top = ranked(summarize(trials))[: search.confirm_top]
        base = baseline_of(trials)
        candidates = [base] if base is not None and base.feasible else []
        candidates += [t for t in top if t.role != BASELINE]
        if len(candidates) < 2:
            return
        have = {c.number: sum(1 for t in trials if t.repeat_of == c.number) for c in candidates}
        for round_ in range(search.confirm_repeats):
            for c in candidates:
                if have[c.number] > round_:
                    continue  # measured in an earlier, interrupted confirmation
                if _waiting_roles(study):
                    self.notes.append("confirmation skipped: other trials are queued")
                    return
                study.enqueue_trial(
                    encode(self.space, c.config), user_attrs={"role": REPEAT, "repeat_of": c.number}
                )
                trial = study.ask()
                sample(self.space, trial)
                m = self._run(study, trial, c.config)
                record = self._tell(study, trial, c.config, m, REPEAT, repeat_of=c.number)
                all_trials = records(study)
                self.reporter.trial(record, best_of(all_trials), baseline_of(all_trials), 0, None)

    def _reference(self, study: optuna.Study, trials: list[TrialRecord]) -> list[float] | None:
        """The fp32, no-compile loss trajectory trials are compared against.

        Run once per study and kept in its user attrs, so a resumed study reuses it. When
        the baseline itself is fp32 without compile, the baseline trial is the reference.
        """
        if not self.space.limits.accuracy.enabled:
            return None
        stored = study.user_attrs.get("reference")
        if stored is not None:
            return [float(x) for x in stored["losses"]]
        config = reference_config(self.space.baseline)
        if config == self.space.baseline and BASELINE in _running_roles(study):
            stored = self._wait_for_reference(study)  # another worker runs the baseline
            if stored is not None:
                return stored
        baseline = baseline_of(trials)
        if config == self.space.baseline and baseline is not None:
            m = baseline.measurement
        elif config == self.space.baseline and _waiting_roles(study)[:1] == [BASELINE]:
            # Run the enqueued baseline trial now; it is judged against its own losses.
            trial = study.ask()
            if trial.user_attrs.get("role") != BASELINE:  # another worker took it first
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
                return self._reference(study, records(study))
            sample(self.space, trial)  # takes the enqueued baseline params
            if not _claim(study, trial, config.key()):  # a second queued baseline: drop it
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
                # Both claimants may have backed off: after a random pause (so that two
                # workers fall out of step), queue it again if nobody measures it.
                time.sleep(random.uniform(0.1, 1.0))
                trials = records(study)
                if not _held(study, config.key()):
                    self._queue_baseline(study, trials)
                return self._reference(study, trials)
            m = self._run(study, trial, config)
            record = self._tell(
                study, trial, config, m, BASELINE, reference=m.losses if m.ok else None
            )
            trials.append(record)
            self.reporter.trial(record, best_of(trials), record, 1, self.n_trials)
        else:
            self.reporter.note(
                f"running the fp32 reference ({config.short()}) for the accuracy guard"
            )
            folder = "reference" if not self.worker_index else f"reference-{self.worker_index}"
            m = self.backend.run_trial(self.space, config, self.out_dir / folder)
        if not m.ok:
            raise WorkloadError(
                f"the fp32 reference run ({config.short()}) did not train cleanly: "
                f"{m.status}: {m.reason}; fix the workload, or set limits.accuracy: off"
            )
        study.set_user_attr("reference", {"config": config.to_dict(), "losses": m.losses})
        return m.losses

    def _wait_for_reference(self, study: optuna.Study) -> list[float] | None:
        deadline = time.monotonic() + self.space.trial.timeout_s + 30
        self.reporter.note("waiting for another worker's baseline run (the fp32 reference)")
        while time.monotonic() < deadline and BASELINE in _running_roles(study):
            time.sleep(1.0)
            # If that worker died, its baseline goes stale: fail it and queue it again.
            fail_stale_trials(study, grace_s=3 * self.space.study.heartbeat_s)
            stored = study.user_attrs.get("reference")
            if stored is not None:
                return [float(x) for x in stored["losses"]]
        return None

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
    ) -> TrialRecord:
        """Judge a measurement, store it on the trial and finish the trial."""
        verdict = scoring.judge(
            m,
            self.space,
            reference=reference or self.reference,
            memory_budget_bytes=self.memory_budget,
        )
        value = scoring.objective(m, self.space.trial)
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
        )

    def _result(self, study: optuna.Study) -> TuneResult:
        from .export import write_best_config

        result = TuneResult.from_trials(
            self.study_name,
            self.storage,
            records(study),
            environment=self.environment,
            notes=self.notes,
            memory_budget_bytes=self.memory_budget,
            global_batch=self.space.global_batch,
        )
        if result.best is not None:
            path = write_best_config(result, self.out_dir / "best_config.yaml")
            result = replace(result, best_config_path=path)
        return result


def _claim(study: optuna.Study, trial: optuna.Trial, key: str) -> bool:
    """Mark ``trial`` as measuring config ``key``; False if another trial (running or
    finished, of this worker or another) already is, and the caller must not measure it.

    Each claimant writes its key before it looks for others, so of two workers claiming
    the same config at once at least one sees the other: never do both measure it. Both
    may see each other and back off; the config then stays free for a later trial.
    """
    trial.set_user_attr("config_key", key)
    return not _held(study, key, other_than=trial.number)


def _held(study: optuna.Study, key: str, other_than: int | None = None) -> bool:
    """Whether a running or finished trial (not a duplicate or repeat) measures ``key``."""
    states = (optuna.trial.TrialState.RUNNING, optuna.trial.TrialState.COMPLETE)
    return any(
        t.number != other_than
        and t.user_attrs.get("config_key") == key
        and t.user_attrs.get("role") not in (DUPLICATE, REPEAT)
        for t in study.get_trials(deepcopy=False, states=states)
    )


def _running_roles(study: optuna.Study) -> list[str]:
    running = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
    return [t.user_attrs.get("role", SEARCH) for t in running]


def _running_keys(study: optuna.Study) -> set[str]:
    """Configs being measured right now (by this or another worker)."""
    running = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
    return {t.user_attrs["config_key"] for t in running if "config_key" in t.user_attrs}


def _waiting_roles(study: optuna.Study) -> list[str]:
    """Roles of the queued trials, in the order ``ask`` will hand them out."""
    waiting = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
    return [t.user_attrs.get("role", SEARCH) for t in sorted(waiting, key=lambda t: t.number)]


def load_result(
    space: Space, storage: str | None = None, study_name: str | None = None
) -> tuple[optuna.Study, TuneResult]:
    """Load the stored study of ``space`` without running anything.

    The memory budget is recomputed from the stored environment, so the headroom of the
    recommended config is reported as ``autotune run`` did.

    Raises:
        StorageError: the storage cannot be opened or holds no such study.
    """
    storage = storage or space.study.storage
    name = study_name or space.study.name
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if storage.startswith("sqlite:///") and not Path(storage.removeprefix("sqlite:///")).exists():
        # load_study would create an empty database file instead.
        raise StorageError(
            f"storage {storage!r} does not exist (relative paths are from the current folder); "
            "run `autotune run` first, or pass --storage"
        )
    try:
        study = optuna.load_study(study_name=name, storage=open_storage(storage))
    except StorageError:
        raise
    except Exception as e:  # KeyError for a missing study, SQLAlchemy errors for a bad URL
        detail = first_line(e)
        raise StorageError(
            f"cannot load study {name!r} from {storage!r}: {type(e).__name__}: {detail}; "
            "run `autotune run` first, or pass --storage/--study-name"
        ) from None
    environment = study.user_attrs.get("environment", {})
    result = TuneResult.from_trials(
        name,
        storage,
        records(study),
        environment=environment,
        memory_budget_bytes=space.limits.memory_bytes(environment.get("device_memory_bytes")),
        global_batch=space.global_batch,
    )
    return study, result


def tune(
    space: Space | str | Path,
    *,
    n_trials: int | None = None,
    timeout_s: float | None = None,
    storage: str | None = None,
    study_name: str | None = None,
    out_dir: str | Path | None = None,
    reporter: Reporter | None = None,
    backend: Any = runner,
    worker_index: int = 0,
) -> TuneResult:
    """Search the space for the fastest config; the library form of ``autotune run``.

    Args:
        space: a :class:`Space` or the path of a space file.
        n_trials: distinct configs to measure in total (finished ones of a resumed study
            count); defaults to the space's ``budget.n_trials``.
        timeout_s: stop starting trials after this many seconds of this call.
        storage: Optuna storage URL; defaults to the space's ``study.storage``;
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
    """
    if not isinstance(space, Space):
        from .space import load_space

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
