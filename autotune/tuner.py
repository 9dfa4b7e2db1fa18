"""The study: samples configs, runs them as trials, and keeps every result in Optuna storage.

The baseline (the space's defaults) is always trial 0, so every result is a speedup over
it. A rerun with the same storage and study name resumes: finished trials are kept and the
budget is filled up, never restarted.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import optuna

from . import runner, scoring
from .config import Config, resolve_inactive
from .errors import StorageError, WorkloadError
from .knobs import KNOBS, Capabilities
from .measurement import OK, Measurement
from .space import Space

BASELINE, SEARCH, DUPLICATE = "baseline", "search", "duplicate"
MAX_DUPLICATES_IN_A_ROW = 30


@dataclass(frozen=True)
class TrialRecord:
    """One finished trial: its config, what it measured, the verdict and objective value."""

    number: int
    config: Config
    measurement: Measurement
    value: float
    role: str = SEARCH
    status: str = "ok"
    reason: str = ""
    duplicate_of: int | None = None
    loss_deviation: float | None = None

    @property
    def feasible(self) -> bool:
        return self.status == OK


@dataclass(frozen=True)
class TuneResult:
    """The outcome of a study: every trial, the baseline, the recommended config."""

    study_name: str
    storage: str
    trials: list[TrialRecord]
    baseline: TrialRecord | None
    best: TrialRecord | None
    environment: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    best_config_path: Path | None = None
    memory_budget_bytes: int | None = None
    global_batch: int | None = None

    @property
    def speedup(self) -> float | None:
        """Best objective over the baseline's; ``None`` when either is missing."""
        if not (self.best and self.baseline and self.baseline.feasible and self.baseline.value):
            return None
        return self.best.value / self.baseline.value

    @property
    def headroom_bytes(self) -> int | None:
        """Memory budget left unused by the recommended config."""
        peak = self.best.measurement.peak_mem_bytes if self.best else None
        if peak is None or self.memory_budget_bytes is None:
            return None
        return self.memory_budget_bytes - peak

    def status_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for t in self.trials:
            if t.role != DUPLICATE:
                counts[t.status] = counts.get(t.status, 0) + 1
        return counts


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


def _encode(space: Space, config: Config) -> dict[str, Any]:
    """Optuna params of ``config``: index for ordinal knobs, the value for the others.

    Inactive knobs (see :attr:`Knob.requires`) have no param, as in :func:`_sample`.
    """
    values = config.to_dict()
    params = {}
    for name, choices in space.searched.items():
        if KNOBS[name].requires(values) is None:
            value = values[name]
            params[name] = choices.index(value) if KNOBS[name].ordinal else value
    return params


def _sample(space: Space, trial: optuna.Trial) -> Config:
    """Ask the trial for a config, define-by-run: a knob that is inactive given the
    knobs before it (prefetch_factor without workers...) is not sampled and keeps its
    default, so equivalent configs are one point of the space, not several.

    Ordinal knobs (batch size, workers...) are searched by index so the sampler can use
    their order; NOTES-optuna-torch.md measured this beating categorical encoding.
    """
    values = space.config_from({}).to_dict()
    for name in KNOBS:  # registry order: a knob's conditions look only at earlier knobs
        knob = KNOBS[name]
        choices = space.searched.get(name)
        if knob.requires(values) is not None:
            values[name] = knob.default  # inactive, searched or not
        elif choices is None:
            continue
        elif knob.ordinal:
            values[name] = choices[trial.suggest_int(name, 0, len(choices) - 1)]
        else:
            values[name] = trial.suggest_categorical(name, choices)
    return space.config_from({name: values[name] for name in space.searched})


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


def _make_sampler(space: Space) -> optuna.samplers.BaseSampler:
    seed = space.study.seed
    if space.study.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(
            seed=seed, multivariate=True, group=True, n_startup_trials=5
        )


def open_study(space: Space, storage: str, study_name: str) -> optuna.Study:
    """Create or load the study; refuse one that was made from a different space.

    Raises:
        StorageError: the storage cannot be opened, or the study's space differs.
    """
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        study = optuna.create_study(
            storage=storage,
            study_name=study_name,
            direction="maximize",
            sampler=_make_sampler(space),
            load_if_exists=True,
        )
    except Exception as e:  # SQLAlchemy/Optuna raise many types for a bad URL or file
        raise StorageError(f"cannot open storage {storage!r}: {type(e).__name__}: {e}") from None
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


def records(study: optuna.Study) -> list[TrialRecord]:
    """The finished trials of a study, in order."""
    out = []
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        attrs = t.user_attrs
        if "config" not in attrs:
            continue
        out.append(
            TrialRecord(
                number=t.number,
                config=Config.from_dict(attrs["config"]),
                measurement=Measurement.from_dict(attrs["measurement"]),
                value=float(t.value) if t.value is not None else 0.0,
                role=attrs.get("role", SEARCH),
                status=attrs.get("status", attrs["measurement"].get("status", OK)),
                reason=attrs.get("reason", ""),
                duplicate_of=attrs.get("duplicate_of"),
                loss_deviation=attrs.get("loss_deviation"),
            )
        )
    return out


def best_of(trials: list[TrialRecord]) -> TrialRecord | None:
    feasible = [t for t in trials if t.feasible and t.role != DUPLICATE]
    return max(feasible, key=lambda t: t.value, default=None)


def baseline_of(trials: list[TrialRecord]) -> TrialRecord | None:
    return next((t for t in trials if t.role == BASELINE), None)


class Tuner:
    """Runs a study over a space. See :func:`autotune.tune` for the arguments."""

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
    ) -> None:
        self.space = space
        self.n_trials = n_trials if n_trials is not None else space.budget.n_trials
        self.timeout_s = timeout_s if timeout_s is not None else space.budget.timeout_s
        if self.n_trials is not None and self.n_trials < 1:
            raise ValueError(f"n_trials must be at least 1 but got {self.n_trials}")
        self.storage = storage or space.study.storage
        self.study_name = study_name or space.study.name
        self.out_dir = Path(out_dir or space.output_dir) / self.study_name
        self.reporter = reporter or Reporter()
        self.reference: list[float] | None = None
        self.memory_budget: int | None = None
        self.environment: dict[str, Any] = {}
        self.notes: list[str] = []

    def _trial_dir(self, number: int) -> Path:
        return self.out_dir / f"trial-{number:04d}"

    def _prepare(self) -> None:
        """Probe the machine and workload; restrict the space to what can run here."""
        probe = runner.probe(self.space, self.out_dir / "probe")
        caps = Capabilities.from_dict(probe["capabilities"])
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
        self._prepare()
        space = self.space
        study = open_study(space, self.storage, self.study_name)
        study.set_user_attr("environment", self.environment)
        trials = records(study)
        if baseline_of(trials) is None and not _waiting(study):
            study.enqueue_trial(_encode(space, space.baseline), user_attrs={"role": BASELINE})
        self.reference = self._reference(study, trials)
        size = math.prod(len(v) for v in space.searched.values())
        measured = {t.config.key(): t for t in trials if t.role != DUPLICATE}
        done = len(measured)
        dup_streak = 0
        start = time.monotonic()

        def budget_left() -> bool:
            if self.n_trials is not None and done >= self.n_trials:
                return False
            if self.timeout_s is not None and time.monotonic() - start >= self.timeout_s:
                return False
            return done < size and dup_streak < MAX_DUPLICATES_IN_A_ROW

        while budget_left():
            trial = study.ask()
            config = _sample(space, trial)
            previous = measured.get(config.key())
            if previous is not None:
                self._tell(
                    study,
                    trial,
                    previous.config,
                    previous.measurement,
                    DUPLICATE,
                    duplicate_of=previous.number,
                )
                dup_streak += 1
                continue
            dup_streak = 0
            record = self._measure(study, trial, config)
            measured[config.key()] = record
            trials.append(record)
            done += 1
            self.reporter.trial(record, best_of(trials), baseline_of(trials), done, self.n_trials)
        if dup_streak >= MAX_DUPLICATES_IN_A_ROW:
            self.notes.append(
                f"stopped: the sampler proposed {dup_streak} measured configs in a row"
            )
        elif done >= size:
            self.notes.append(f"all {size} configs of the space are measured")
        return self._result(study)

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
        baseline = baseline_of(trials)
        if config == self.space.baseline and baseline is not None:
            m = baseline.measurement
        elif config == self.space.baseline:
            # Run the enqueued baseline trial now; it is judged against its own losses.
            trial = study.ask()
            _sample(self.space, trial)  # takes the enqueued baseline params
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
            m = runner.run_trial(self.space, config, self.out_dir / "reference")
        if not m.ok:
            raise WorkloadError(
                f"the fp32 reference run ({config.short()}) did not train cleanly: "
                f"{m.status}: {m.reason}; fix the workload, or set limits.accuracy: off"
            )
        study.set_user_attr("reference", {"config": config.to_dict(), "losses": m.losses})
        return m.losses

    def _run(self, study: optuna.Study, trial: optuna.Trial, config: Config) -> Measurement:
        try:
            return runner.run_trial(self.space, config, self._trial_dir(trial.number))
        except BaseException:  # Ctrl-C: the trial is not finished; it does not count
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            raise

    def _measure(self, study: optuna.Study, trial: optuna.Trial, config: Config) -> TrialRecord:
        m = self._run(study, trial, config)
        return self._tell(study, trial, config, m, trial.user_attrs.get("role", SEARCH))

    def _tell(
        self,
        study: optuna.Study,
        trial: optuna.Trial,
        config: Config,
        m: Measurement,
        role: str,
        *,
        duplicate_of: int | None = None,
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
        attrs = {
            "config": config.to_dict(),
            "config_key": config.key(),
            "measurement": m.to_dict(),
            "role": role,
            "status": verdict.status,
            "reason": verdict.reason,
            "loss_deviation": verdict.loss_deviation,
        }
        if duplicate_of is not None:
            attrs["duplicate_of"] = duplicate_of
        for key, v in attrs.items():
            trial.set_user_attr(key, v)
        for key, c in verdict.constraints.items():
            trial.set_constraint(key, c)
        study.tell(trial, value)
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
        )

    def _result(self, study: optuna.Study) -> TuneResult:
        from .export import write_best_config

        trials = records(study)
        result = TuneResult(
            study_name=self.study_name,
            storage=self.storage,
            trials=trials,
            baseline=baseline_of(trials),
            best=best_of(trials),
            environment=self.environment,
            notes=self.notes,
            memory_budget_bytes=self.memory_budget,
            global_batch=self.space.global_batch,
        )
        if result.best is not None:
            path = write_best_config(result, self.out_dir / "best_config.yaml")
            result = replace(result, best_config_path=path)
        return result


def _waiting(study: optuna.Study) -> bool:
    return bool(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,)))


def tune(
    space: Space | str | Path,
    *,
    n_trials: int | None = None,
    timeout_s: float | None = None,
    storage: str | None = None,
    study_name: str | None = None,
    out_dir: str | Path | None = None,
    reporter: Reporter | None = None,
) -> TuneResult:
    """Search the space for the fastest config; the library form of ``autotune run``.

    Args:
        space: a :class:`Space` or the path of a space file.
        n_trials: distinct configs to measure in total (finished ones of a resumed study
            count); defaults to the space's ``budget.n_trials``.
        timeout_s: stop starting trials after this many seconds of this call.
        storage: Optuna storage URL; defaults to the space's ``study.storage``.
        study_name: defaults to the space's ``study.name`` (the file's stem).
        out_dir: folder for trial logs and ``best_config.yaml``.
        reporter: receives notes and per-trial progress.

    Returns:
        A :class:`TuneResult` with every trial, the baseline and the recommended config.
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
    ).run()
