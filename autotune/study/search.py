"""The search: sample and measure configs until the budget is spent or the space is done.

Each round of the loop re-reads the study (other workers may share it, so the budget, the
configs measured or being measured and stale trials are global), lets the screening
queue its next move (:mod:`autotune.study.screening`), asks the sampler for a config and
then does one of:

- measure it (:meth:`Trials.measure`), pruned against the best so far;
- reuse an earlier measurement of the same config (a duplicate: no budget spent);
- skip it, predicted over the memory budget (:mod:`autotune.study.memory`: no run);
- leave it unrun: another worker measures it, or it is a compiled config whose eager
  twin is far behind (not worth its cold compile).

When the sampler settles on measured ground, an unmeasured neighbour of the best configs
is queued at once instead (:func:`autotune.study.sampling.unmeasured`).

Three kinds of run spend no budget: the baseline's back-to-back repeats (the noise floor,
``search.noise_runs``), the repeats of a new best (``search.best_runs``,
:func:`best_due`): the best so far is the bar every later trial is pruned against, the
screening moves from and the finalists are drawn by, so its figure is the median of its
runs, not one run that may have been lucky; and a second look at a screening move that
landed behind the best but not clearly (:func:`screening.second_look`: a layout or a
compile at half the best or more, any other move within the pruning margin): one run of
it sets the screening's path. So does a runner-up within the study's margin of the
best, never paired (:func:`screening.runner_up_look`: a best displaced by runs minutes
later, on a drifting machine): it gets one look. The look is paired: the best runs again
beside the move (side by side where they can), and the move ranks by their ratio
(:func:`autotune.results.standings`).
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field, replace
from typing import Any

import optuna

from ..config import Config
from ..decisions import margin
from ..measurement import PREDICTED_OVER_MEMORY
from ..results import (
    BASELINE,
    CONFIRM,
    REPEAT,
    SEARCH,
    TrialRecord,
    back_to_back,
    baseline_floor,
    baseline_of,
    baseline_runs,
    best_of,
    pruning_margin,
    ranked,
    runs_due,
    summarize,
)
from ..space import Space
from . import coordination, screening
from .coordination import claim, running_keys, waiting_roles
from .heartbeat import fail_stale_trials, grace_s
from .memory import MemoryModel, Prediction
from .reporter import Reporter
from .sampling import encode, every_config, sample, unmeasured
from .storage import records
from .trials import Trials

# The search stops when the sampler proposes this many measured configs in a row and no
# unmeasured config can be found instead. A config skipped as predicted over memory
# counts as such a proposal: it spends no budget (it costs nothing), so without the
# streak a sampler stuck in an over-memory region would loop.
MAX_DUPLICATES_IN_A_ROW = 30


def sampled(trial: optuna.Trial) -> bool:
    """Whether a search trial is the sampler's or the screening's own proposal: not the
    baseline, a confirmation run or a retry of a trial a dead worker left."""
    return trial.user_attrs.get("role", SEARCH) == SEARCH and "retry_of" not in trial.user_attrs


@dataclass
class Ground:
    """What the study holds at one round of the loop: the configs measured (first runs,
    by key), being measured, and skipped as predicted over memory; ``done`` is the
    budget spent (the confirmation's configs do not spend it)."""

    trials: list[TrialRecord]
    measured: dict[str, TrialRecord]
    running: set[str]
    skipped: dict[str, TrialRecord]
    done: int = field(init=False)
    covered: int = field(init=False)

    def __post_init__(self) -> None:
        searched = {k for k, t in self.measured.items() if t.role != CONFIRM}
        self.done = len(searched | self.running)
        self.covered = len(searched | self.running | self.skipped.keys())

    @classmethod
    def of(cls, study: optuna.Study) -> Ground:
        trials = records(study)
        skipped = {
            t.config.key(): t
            for t in trials
            if t.status == PREDICTED_OVER_MEMORY and t.role == SEARCH
        }
        return cls(trials, coordination.first_runs(trials), running_keys(study), skipped)

    @property
    def taken(self) -> set[str]:
        return self.measured.keys() | self.running | self.skipped.keys()


class Search:
    """The search loop of one study over ``trials.space``.

    ``n_trials`` and ``timeout_s`` bound it; ``capabilities`` (the probe's) tell the memory
    model the device; ``environment`` feeds the screening's profile. Notes for the result
    are appended to ``notes``.
    """

    def __init__(
        self,
        trials: Trials,
        reporter: Reporter,
        notes: list[str],
        *,
        n_trials: int | None,
        timeout_s: float | None,
        capabilities: dict[str, Any],
        environment: dict[str, Any],
        worker_index: int = 0,
    ) -> None:
        self.trials = trials
        self.reporter = reporter
        self.notes = notes
        self.n_trials = n_trials
        self.timeout_s = timeout_s
        self.capabilities = capabilities
        self.environment = environment
        self.worker_index = worker_index
        self.not_compiled = 0
        self.streak = 0  # proposals in a row that measured nothing new
        self.exhausted = False  # no unmeasured config could be found

    @property
    def space(self) -> Space:
        return self.trials.space

    def run(self, study: optuna.Study) -> None:
        """Sample and measure until the budget is spent or the space is exhausted."""
        pool = every_config(self.space)
        size = len(pool) if pool is not None else math.prod(map(len, self.space.searched.values()))
        rng = random.Random(self.space.search.seed)
        start = time.monotonic()
        ground = Ground.of(study)
        while not self._over(ground, size, start):
            if not waiting_roles(study):  # a queued trial (a retry) comes first
                if (
                    self._noise(study, ground)
                    or self._again(study, ground)
                    or self._look(study, ground)
                ):
                    ground = Ground.of(study)
                    continue
                self._screen(study, ground)
            self._widen_pruning(ground)
            self._step(study, ground, rng, pool)
            ground = Ground.of(study)
        self._closing_notes(ground, size)

    def _noise(self, study: optuna.Study, ground: Ground) -> bool:
        """Once the baseline is measured, run it ``search.noise_runs`` more times back to
        back (:func:`autotune.results.baseline_floor`: the study's noise floor). One run
        per call; False when none is due. Only the first worker runs them, and they
        spend no budget (repeats, never pruned)."""
        base = next((t for t in ground.trials if t.role == BASELINE), None)
        if self.worker_index or base is None or not self._noise_due(ground):
            return False
        return self._repeat(study, ground, base) is not None

    def _again(self, study: optuna.Study, ground: Ground) -> bool:
        """Run the best search config so far once more when its figure is not yet the
        median of enough runs (:func:`best_due`). One run per call; False when none is
        due. Only the first worker runs them, as it runs the noise runs."""
        if self.worker_index or not getattr(self.trials.backend, "noisy", True):
            return False  # a replay answers the same every time
        best = best_due(ground.trials, self.space.search.best_runs, self._margin(ground))
        return best is not None and self._repeat(study, ground, best) is not None

    def _look(self, study: optuna.Study, ground: Ground) -> bool:
        """Look again at a screening move whose run landed behind the best but not
        clearly (:func:`screening.second_look`): one run of it sets the screening's path;
        else at the runner-up, once, when its runs and the best's do not tell the two
        apart (:func:`screening.runner_up_look`): the screening moves from the one that
        leads. The look is paired: the best so far runs once more beside the move, and
        the search ranks the move by their ratio (:func:`autotune.results.standings`), so
        that a slow stretch of the machine falls on both. The two run side by side, taking turns on
        the machine (:meth:`Trials.apart` says when they can), else the best first, then
        the move. One look per call, by the first worker, spending no budget, as
        :meth:`_again`."""
        if self.worker_index or not getattr(self.trials.backend, "noisy", True):
            return False
        gain = self._margin(ground)
        search = self.space.search
        due = screening.second_look(
            ground.trials, search.best_runs, gain, self._prune_margin(ground)
        ) or (screening.runner_up_look(ground.trials, gain) if search.best_runs > 1 else None)
        best = best_of(ground.trials)
        if due is None or best is None:
            return False
        first = next(t for t in ground.trials if t.number == best.number)
        partner = self._claim(study, first, look_for=due.number)
        if partner is None:
            return False
        move = self._claim(study, due, paired_with=partner[0].number)
        pair = [partner] if move is None else [partner, move]
        why = "" if move is None else self.trials.apart(ground.trials, [first.config, due.config])
        if why is None:
            said = "the screening's paired looks ran side by side"  # taking turns on the machine
            if said not in self.notes:
                self.notes.append(said)
            for record in self.trials.measure_round(study, pair):
                self._told(ground, record)
            return True
        said = "the screening's paired looks ran one after the other:"
        if why and not any(n.startswith(said) for n in self.notes):
            self.notes.append(f"{said} {why}")  # their memory kept them apart
        for trial, config, told in pair:  # move None: another worker's trial came between
            self._told(ground, self.trials.measure(study, trial, config, **told))
        return move is not None

    def _margin(self, ground: Ground) -> float:
        """The gain a config must show over another to count as ahead: the study's noise
        floor so far, at least ``search.min_gain`` (:func:`autotune.decisions.margin`)."""
        return margin(self.space.search.min_gain, baseline_floor(ground.trials))

    def _repeat(
        self, study: optuna.Study, ground: Ground, first: TrialRecord
    ) -> TrialRecord | None:
        """One more run of ``first``'s config, a repeat of it (never pruned, no budget
        spent); ``None`` when another worker's queued trial came first."""
        claimed = self._claim(study, first)
        if claimed is None:
            return None
        trial, config, told = claimed
        return self._told(ground, self.trials.measure(study, trial, config, **told))

    def _claim(
        self, study: optuna.Study, first: TrialRecord, **look: int
    ) -> tuple[optuna.Trial, Config, dict[str, Any]] | None:
        """A trial of the study for a repeat of ``first``'s config (queued, then taken),
        and what :meth:`Trials.tell` takes besides; ``None`` when another worker's queued
        trial came first. ``look``: the paired look's attrs (``look_for`` on the best's
        run, ``paired_with`` on the move's: :class:`~autotune.results.TrialRecord`)."""
        attrs = {"role": REPEAT, "repeat_of": first.number, **look}
        study.enqueue_trial(encode(self.space, first.config), user_attrs=attrs)
        trial = study.ask()
        if trial.user_attrs.get("repeat_of") != first.number:
            # Another worker queued a trial between our check of the queue and our ask:
            # failed unrun, as a lost claim is in the loop. Rare: only the first worker
            # makes repeats, with nothing queued.
            self.trials.not_run(study, trial)
            return None
        sample(self.space, trial)
        # a repeat's compile is charged as the confirmation charges one
        told = {"repeat_of": first.number, "cold_compile_s": first.measurement.compile_s}
        return trial, first.config, told

    def _told(self, ground: Ground, record: TrialRecord) -> TrialRecord:
        """A repeat's record, after the reporter hears of it."""
        every = [*ground.trials, record]
        self.reporter.trial(record, best_of(every), baseline_of(every), ground.done, None)
        return record

    def _noise_due(self, ground: Ground) -> bool:
        """Whether a noise run of the measured baseline is still to be made (by the first
        worker, :meth:`_noise`): fewer than ``search.noise_runs`` ran (failed ones count,
        so a run that fails is not made again)."""
        base = next((t for t in ground.trials if t.role == BASELINE), None)
        if base is None or not base.feasible:
            return False
        if not getattr(self.trials.backend, "noisy", True):  # a replay: nothing to measure
            return False
        return len(back_to_back(ground.trials, base.number)) < self.space.search.noise_runs

    def _widen_pruning(self, ground: Ground) -> None:
        """A trial is pruned only when it trails the best by more than twice the noise
        floor (and ``search.prune_margin``): on a noisy machine, a config unlucky in its
        first steps is not a slow one."""
        search = self.space.search
        bar = self._prune_margin(ground)
        if bar > search.prune_margin:
            self.trials.space = replace(self.space, search=replace(search, prune_margin=bar))

    def _prune_margin(self, ground: Ground) -> float:
        """How far behind the best a run may be and still not be stopped: twice the noise
        floor, at least ``search.prune_margin`` (:meth:`_widen_pruning`)."""
        return pruning_margin(self.space.search.prune_margin, ground.trials)

    def _over(self, ground: Ground, size: int, start: float) -> bool:
        if self.n_trials is not None and ground.done >= self.n_trials:
            return True
        if self.timeout_s is not None and time.monotonic() - start >= self.timeout_s:
            return True
        return self.exhausted or ground.covered >= size or self.streak >= MAX_DUPLICATES_IN_A_ROW

    def _step(
        self, study: optuna.Study, ground: Ground, rng: random.Random, pool: list[Config] | None
    ) -> None:
        """One proposal of the sampler: measured, or reused, skipped or left unrun (then
        an unmeasured config is measured in its place, if one can be found)."""
        trial = study.ask()
        config = sample(self.space, trial)
        key = config.key()
        previous = ground.measured.get(key)
        skip = hopeless = None
        if previous is None and key not in ground.running:
            hopeless = self._hopeless(trial, config, ground)
            skip = None if hopeless else self._predicted(ground.trials, trial, config)
        if (
            previous is not None
            or key in ground.running
            or hopeless
            or (skip and key in ground.skipped)
        ):
            if previous is not None:  # measured before: reuse it, spend nothing
                self.trials.reuse(study, trial, previous)
            elif skip is not None:  # skipped before, and still predicted over
                self.trials.skip(study, trial, config, skip, ground.skipped[key].number)
            else:  # another worker is measuring it right now, or not worth compiling
                self.not_compiled += bool(hopeless)
                self.trials.not_run(study, trial, hopeless)
            self.streak += 1
            if waiting_roles(study):  # a queued trial (a retry) comes first
                return
            found = self._instead(study, ground, rng, pool)
            if found is None:
                return
            trial, config = found
            skip = self._predicted(ground.trials, trial, config)
        self._run(study, ground, trial, config, skip)

    def _instead(
        self, study: optuna.Study, ground: Ground, rng: random.Random, pool: list[Config] | None
    ) -> tuple[optuna.Trial, Config] | None:
        """The sampler settled on measured ground: an unmeasured config taken at once, a
        neighbour of the best ones, else a random one. At once beat waiting for 3 such
        proposals in the replay benchmark (TPE within 5% of the optimum at 20 trials: LM
        grid 20/20 seeds against 12/20). Random search stays random (without
        replacement): no local moves. ``None`` when every config is measured (the search
        then ends) or another worker queued the same one."""
        space = self.space
        top = [] if space.search.sampler == "random" else ranked(summarize(ground.trials))
        found = unmeasured(space, [t.config for t in top[:3]], ground.taken, rng, pool)
        if found is None:
            self.exhausted = True  # every config is measured
            return None
        # Queued and taken at once, so no queued trial outlives the loop.
        study.enqueue_trial(encode(space, found[0]), user_attrs={"proposed_by": found[1]})
        trial = study.ask()
        config = sample(space, trial)
        key = config.key()
        if key in ground.measured or key in ground.running:  # another worker queued it
            self.trials.not_run(study, trial)
            return None
        return trial, config

    def _run(
        self,
        study: optuna.Study,
        ground: Ground,
        trial: optuna.Trial,
        config: Config,
        skip: Prediction | None,
    ) -> None:
        """Measure ``config`` on ``trial``, or record it skipped (predicted over memory)."""
        trials = ground.trials
        if skip is not None:  # predicted over memory: recorded, not run
            record = self.trials.skip(study, trial, config, skip)
            trials.append(record)
            self.reporter.trial(record, best_of(trials), baseline_of(trials), ground.done, None)
            self.streak += 1
            return
        if not claim(study, trial, config.key()):  # a worker beside us raced us to it
            self.trials.not_run(study, trial)
            self.streak += 1
            return
        self.streak = 0
        best = best_of(trials)
        record = self.trials.measure(study, trial, config, best.value if best else None)
        trials.append(record)
        self.reporter.trial(
            record, best_of(trials), baseline_of(trials), ground.done + 1, self.n_trials
        )
        # a worker beside us may have died meanwhile
        fail_stale_trials(study, grace_s(self.space.study.heartbeat_s))

    def _closing_notes(self, ground: Ground, size: int) -> None:
        if self.not_compiled:
            self.notes.append(
                f"{self.not_compiled} compiled config(s) the sampler proposed were not run: "
                f"their eager twin made under {screening.FAR_BELOW:.0%} of the best config"
            )
        if self.streak >= MAX_DUPLICATES_IN_A_ROW:
            self.notes.append(
                f"stopped: the sampler proposed {self.streak} measured (or predicted over "
                "memory) configs in a row"
            )
        elif ground.done >= size:
            self.notes.append(f"all {size} configs of the space are measured")
        elif ground.covered >= size:
            self.notes.append(
                f"all {size} configs of the space are measured or predicted over memory"
            )

    def _screen(self, study: optuna.Study, ground: Ground) -> None:
        """Queue the screening's next move (:mod:`autotune.study.screening`), if any: one
        knob moved from the best feasible config so far. The schedule is made once, when
        the baseline and its noise runs are measured, from their median shares
        (:meth:`screening.Shares.median`), and kept in the study; a study made before
        the screening existed (no :data:`screening.ATTR`) is not screened."""
        search = self.space.search
        if not search.screening or search.sampler == "grid":
            return
        stored = study.user_attrs.get(screening.ATTR)
        if stored is None:  # a study made before the screening existed goes on without
            return
        if stored == screening.PENDING:
            base = baseline_of(ground.trials)
            if base is None:  # a worker beside us measures it: the sampler meanwhile
                return
            if self._noise_due(ground):
                # The first worker is still running the baseline's noise runs (the first
                # worker itself gets here only when its own try lost a race, and makes
                # the run next round). Another worker waits for them, using the sampler
                # meanwhile, rather than make the schedule from a partial set: the
                # schedule is made once, and one run must not set it. Should the first
                # worker die before they end, the study goes on unscreened until a first
                # worker resumes it.
                return
            runs = [t.measurement for t in baseline_runs(ground.trials)]
            shares = screening.Shares.median(
                runs, self.trials.memory_budget, self.space, self.environment
            )
            schedule = screening.make_schedule(self.space, self.space.baseline, shares)
            study.set_user_attr(screening.ATTR, schedule.to_dict())
            left = None if self.n_trials is None else max(0, self.n_trials - ground.done)
            self.reporter.note(screening.describe(schedule, left))
        else:
            schedule = screening.Schedule.from_dict(stored)
        made = {
            str(t.user_attrs[screening.MOVE])
            for t in study.get_trials(deepcopy=False)
            if screening.MOVE in t.user_attrs
        }
        # Each config at the median of its runs: a new best's repeats (best_due) and the
        # baseline's noise runs move where the next move starts.
        gain, summary = self._margin(ground), summarize(ground.trials)
        begin = [t.config for t in screening.starts(summary, gain)] or [self.space.baseline]
        layout = screening.rival_layout(summary, gain, self._prune_margin(ground))
        found = screening.next_move(
            self.space, schedule, begin, made, ground.taken, layout and layout.config
        )
        if found is not None:
            move, config = found
            study.enqueue_trial(
                encode(self.space, config),
                user_attrs={"proposed_by": screening.PROPOSED_BY, screening.MOVE: move.label},
            )

    def _hopeless(self, trial: optuna.Trial, config: Config, ground: Ground) -> str | None:
        """Why a compiled config the sampler proposed is not worth its cold compile
        (:func:`autotune.study.screening.not_worth_compiling`); queued trials (the
        baseline, retries, the screening's moves) always run, and so does every config of a
        grid (a recorded table, the truth replays are judged against)."""
        if self.space.search.sampler == "grid":
            return None
        if not sampled(trial) or trial.user_attrs.get("proposed_by"):
            return None
        return screening.not_worth_compiling(
            self.space, config, ground.measured, best_of(ground.trials)
        )

    def _predicted(
        self, trials: list[TrialRecord], trial: optuna.Trial, config: Config
    ) -> Prediction | None:
        """The prediction that ``config`` cannot fit the memory budget, or ``None`` (it may
        fit, or the trial must run: the baseline, a retry, ``search.predict_memory`` off).

        The model is fitted afresh from ``trials`` (read from storage this round): a
        config predicted to fit that then went over is data for the next prediction.
        """
        budget = self.trials.memory_budget
        if not self.space.search.predict_memory or budget is None or not sampled(trial):
            return None
        device = str(self.capabilities.get("device", "cpu"))
        prediction = MemoryModel(trials, budget, device).predict(config)
        return prediction if prediction.over else None


def best_due(trials: list[TrialRecord], best_runs: int, gain: float) -> TrialRecord | None:
    """The best search config so far (:func:`~autotune.results.best_of`: each config at the
    median of its runs) when it is due another run before its figure is the bar: it has
    one run, or fewer than ``best_runs`` that differ by more than ``gain`` (their range
    over their median, the study's margin). ``None`` when it is not, or the best is the
    baseline (its noise runs repeat it) or a config of the confirmation's rounds.

    On cpu.yaml (2026-12-06) one run of ``channels_last`` at 1.16x its later median set
    the bar: the compiled config after it was pruned against that run and never seen
    again, and the study recommended a config 14% slower than the best it could have
    found."""
    best = best_of(trials)
    if best is None or best.role != SEARCH:
        return None
    key = best.config.key()
    if any(t.round is not None and t.config.key() == key for t in trials):
        return None  # the confirmation's rounds measure it
    first = next(t for t in trials if t.number == best.number)
    return best if runs_due(trials, first, best_runs, gain) else None
