"""Confirmation: paired rotated rounds, ablation of the winner, the simplest config within
noise. The tuner runs for real; the measurements come from a recorded table (replay), so
each knob's effect is known exactly."""

from __future__ import annotations

import itertools
import statistics
from types import SimpleNamespace

import optuna
import pytest
import yaml

from autotune import Config, Measurement, load_space, tune
from autotune.decisions import FLOOR_CAP, PROVEN, UNRESOLVED
from autotune.output.facts import contribution_text, summary_facts
from autotune.output.report import report_data
from autotune.results import BASELINE, CONFIRM, REPEAT, TuneResult, twin_ratios
from autotune.study.replay import ReplayBackend
from autotune.study.sampling import encode
from autotune.study.storage import records

SPACE = """
    workload: {workloads}:tiny
    knobs:
      batch_size: [8, 32]
      num_workers: [0, 1]
      zero_grad_set_to_none: [false, true]
      gradient_checkpointing: [false, true]
    baseline: {batch_size: 8, zero_grad_set_to_none: false}
    global_batch: 32
    search: {sampler: grid, confirm_top: 2, confirm_rounds: 3, seed: 0, prune: false, noise_runs: 0,
      confirm_max_rounds: 8}
    budget: {n_trials: 16}
"""


# Every knob of SPACE off its baseline value (the search's winner of several tests).
EVERY_KNOB_ON = {
    "batch_size": 32,
    "num_workers": 1,
    "zero_grad_set_to_none": True,
    "gradient_checkpointing": True,
}


def _table(effects: dict[str, float]) -> dict:
    """Every config of SPACE; ``effects`` multiply the rate when a knob is off the baseline."""
    rows = []
    for bs, w, none, ckpt in itertools.product([8, 32], [0, 1], [False, True], [False, True]):
        config = Config(
            batch_size=bs,
            accumulation_steps=32 // bs,
            num_workers=w,
            zero_grad_set_to_none=none,
            gradient_checkpointing=ckpt,
        )
        rate = 100.0
        rate *= effects["batch_size"] if bs == 32 else 1.0
        rate *= effects["num_workers"] if w else 1.0
        rate *= effects["zero_grad_set_to_none"] if none else 1.0
        rate *= effects["gradient_checkpointing"] if ckpt else 1.0
        m = Measurement(
            status="ok",
            samples_per_s=rate,
            samples_per_step=32,
            measured_steps=5,
            losses=[1.0, 0.9, 0.8],
            step_time_cv=0.01,
        )
        rows.append({"config": config.to_dict(), "measurement": m.to_dict()})
    caps = {"device": "cpu", "cpu_count": 2, "workload_blocks": 2}
    return {"environment": {"device": "cpu"}, "capabilities": caps, "measurements": rows}


class Drifting(ReplayBackend):
    """The table's rates, on a machine that gets slower with every run (thermal drift)."""

    def __init__(self, table: dict, drift: float) -> None:
        super().__init__(table)
        self.drift = drift
        self.runs: list[tuple[Config, float]] = []  # every run's config and samples/s

    def run_trial(self, space, config, folder, best_value=None):
        m = super().run_trial(space, config, folder, best_value)
        slow = (1 - self.drift) ** len(self.calls)
        m = m.replace(samples_per_s=m.samples_per_s * slow)
        self.runs.append((config, m.samples_per_s))
        return m


def _run(write_space, tmp_path, effects, backend_cls=ReplayBackend, **kw):
    """A study of SPACE whose confirmation runs its 3 rounds and no more."""
    space = load_space(write_space(SPACE.replace("confirm_max_rounds: 8", "confirm_max_s: 0")))
    backend = backend_cls(_table(effects), **kw)
    result = tune(space, storage="memory", out_dir=tmp_path, backend=backend)
    return space, backend, result


def test_a_neutral_knob_is_dropped_and_two_that_matter_stay(write_space, tmp_path):
    effects = {
        "batch_size": 2.0,
        "num_workers": 1.2,
        "zero_grad_set_to_none": 1.005,  # within noise: the winner has it, it proves nothing
        "gradient_checkpointing": 1.01,
    }
    space, backend, result = _run(write_space, tmp_path, effects)
    winner = result.winner.config
    assert (winner.zero_grad_set_to_none, winner.gradient_checkpointing) == (True, True)
    by_knob = {c.knob: c for c in result.contributions}
    assert set(by_knob) == {
        "batch_size",
        "num_workers",
        "zero_grad_set_to_none",
        "gradient_checkpointing",
    }
    assert round(by_knob["batch_size"].median, 6) == 2.0 and by_knob["batch_size"].kept
    assert round(by_knob["num_workers"].median, 6) == 1.2 and by_knob["num_workers"].kept
    assert not by_knob["zero_grad_set_to_none"].kept and not by_knob["gradient_checkpointing"].kept
    assert all(len(c.ratios) == 3 for c in result.contributions)
    # The recommendation is the winner without the two neutral knobs, measured in rounds.
    best = result.best.config
    assert (best.batch_size, best.num_workers) == (32, 1)
    assert (best.zero_grad_set_to_none, best.gradient_checkpointing) == (False, False)
    # It ran in the first lineup's 3 rounds, as the second finalist (the winner's
    # ablations, one knob off it, take no finalist's place; it is two knobs off), and in
    # the reduction's 3.
    assert result.reduction.accepted and result.best.runs == 6
    assert round(result.speedup, 6) == 2.4
    # best_config.yaml holds the recommendation, the full winner and the contributions.
    doc = yaml.safe_load(result.best_config_path.read_text())
    assert doc["config"]["gradient_checkpointing"] is False
    assert doc["full_winner"]["config"]["gradient_checkpointing"] is True
    assert sorted(doc["full_winner"]["dropped_knobs"]) == [
        "gradient_checkpointing",
        "zero_grad_set_to_none",
    ]
    kept = {c["knob"]: c["kept"] for c in doc["contributions"]}
    assert kept == {
        "batch_size": True,
        "num_workers": True,
        "zero_grad_set_to_none": False,
        "gradient_checkpointing": False,
    }


def test_rounds_rotate_and_every_run_is_paired_with_a_baseline_run(write_space, tmp_path):
    effects = {
        "batch_size": 2.0,
        "num_workers": 1.2,
        "zero_grad_set_to_none": 1.0,
        "gradient_checkpointing": 1.3,
    }
    space, backend, result = _run(write_space, tmp_path, effects)
    confirm = backend.calls[16:]
    # Plan 1: baseline, 2 finalists, 3 ablations (the winner differs from the baseline in
    # batch_size, num_workers and gradient_checkpointing) = 6 configs x 3 rounds.
    lineup = confirm[:6]
    assert lineup[0] == space.baseline
    assert confirm[6:12] == lineup[1:] + lineup[:1]  # round 2: rotated by one
    assert confirm[12:18] == lineup[2:] + lineup[:2]
    assert len({c.key() for c in lineup}) == 6
    # Nothing was within noise, so no reduction rounds.
    assert len(confirm) == 18 and result.reduction is None
    assert result.best.number == result.winner.number
    rounds = [t for t in result.trials if t.ratios]
    assert all(len(t.ratios) == 3 for t in rounds)
    assert next(t for t in result.trials if t.role == BASELINE).ratios == (1.0, 1.0, 1.0)


def test_paired_rounds_cancel_drift_and_rank_by_the_median_ratio(write_space, tmp_path):
    # 3% slower per run: unpaired, a config measured late looks worse than it is.
    effects = {
        "batch_size": 2.0,
        "num_workers": 1.2,
        "zero_grad_set_to_none": 1.0,
        "gradient_checkpointing": 1.0,
    }
    space, backend, result = _run(write_space, tmp_path, effects, Drifting, drift=0.03)
    assert result.winner.config.batch_size == 32 and result.winner.config.num_workers == 1
    # The paired ratio is the true 2.4 within the drift between two neighbouring runs.
    assert 2.4 * 0.97**5 < result.speedup < 2.4 / 0.97**5
    # Unpaired, the drift decides: the winner's search run, made many runs after the
    # baseline's, against the baseline's (what a study without rounds would report).
    first = {}
    for config, rate in backend.runs:
        first.setdefault(config.key(), rate)
    unpaired = first[result.winner.config.key()] / first[result.baseline.config.key()]
    assert abs(unpaired - 2.4) > 0.3, unpaired
    assert abs(result.speedup - 2.4) < abs(unpaired - 2.4) / 4, (result.speedup, unpaired)


def test_knobs_within_noise_each_but_not_together_are_kept(write_space, tmp_path):
    effects = {
        "batch_size": 2.0,
        "num_workers": 1.0,
        "zero_grad_set_to_none": 1.02,
        "gradient_checkpointing": 1.02,
    }
    space, backend, result = _run(write_space, tmp_path, effects)
    dropped = {c.knob for c in result.contributions if not c.kept}
    assert dropped == {"zero_grad_set_to_none", "gradient_checkpointing"}
    # Together they are worth 4%: the reduced config is measurably slower, so not taken.
    from autotune.output.facts import summary_facts

    fact = next(f for f in summary_facts(result) if f.key == "reduced")
    assert fact.level == "warning" and "are worth more than 3% together" in fact.text
    assert result.reduction is not None and not result.reduction.accepted
    assert result.best.number == result.winner.number
    assert result.best.config.gradient_checkpointing
    # Each is kept, so the summary does not call either "dropped": kept with the other,
    # its own effect unresolved; report.json lists them.
    assert set(result.kept_together) == dropped
    text = next(f for f in summary_facts(result) if f.key == "contributions").text
    for knob, other in [("zero_grad", "gradient_checkpointing"), ("gradient_ch", "zero_grad")]:
        part = next(p for p in text.split("; ") if p.startswith(knob))
        assert "dropped" not in part and "its own effect unresolved" in part, part
        assert f"kept with {other}" in part, part
    from autotune.output.report import report_data

    assert set(report_data(result, {})["kept_together"]) == dropped


def test_one_aggregation_in_summary_best_config_and_report(write_space, tmp_path):
    from autotune.output.facts import summary_facts
    from autotune.study.storage import load_result, records

    effects = {
        "batch_size": 2.0,
        "num_workers": 1.2,
        "zero_grad_set_to_none": 1.005,
        "gradient_checkpointing": 1.0,
    }
    space = load_space(write_space(SPACE))
    storage = f"sqlite:///{tmp_path}/s.db"
    backend = Drifting(_table(effects), drift=0.01)
    result = tune(space, storage=storage, out_dir=tmp_path, backend=backend)
    best = result.best
    doc = yaml.safe_load(result.best_config_path.read_text())["measured"]
    data = report_data(result, {})
    row = next(r for r in data["trials"] if r["number"] == best.number)
    # samples/s and the objective: the median over the rounds, everywhere.
    study, loaded = load_result(space, storage)
    runs = [t for t in records(study) if t.config == best.config and t.round is not None]
    assert len(runs) == best.runs >= 3 and {t.role for t in runs} <= {REPEAT, CONFIRM}
    median = statistics.median(r.measurement.samples_per_s for r in runs)
    assert doc["samples_per_s"] == round(median, 3) == round(row["samples_per_s"], 3)
    assert doc["objective"] == round(best.value, 3) == round(row["objective"], 3)
    assert doc["speedup"] == round(result.speedup, 3) == round(data["speedup"], 3)
    assert row["speedup"] == data["speedup"]
    speedup = next(f for f in summary_facts(result) if f.key == "speedup")
    assert speedup.text.startswith(
        f"{result.speedup:.2f}x ({result.baseline.value:,.1f} -> {best.value:,.1f}"
    )
    assert f"median of {best.runs} paired rounds" in speedup.text
    # The HTML report draws each knob's contribution with the same words.
    import html

    from autotune.output.facts import contribution_text
    from autotune.output.html import render_html

    page = render_html(result, {}, {}, [])
    assert "What each knob contributes" in page
    assert all(html.escape(contribution_text(c)) in page for c in result.contributions)
    # The exports' header quotes the same figures.
    from autotune.output.export import export_config

    full = yaml.safe_load(result.best_config_path.read_text())
    header = export_config(full["config"], "hf", evidence=full).splitlines()[0]
    assert speedup.text.split(", median")[0] in header
    # The stored study reads back to the same recommendation and figures.
    assert loaded.best.number == best.number and loaded.speedup == result.speedup
    assert [c.to_dict() for c in loaded.contributions] == [
        c.to_dict() for c in result.contributions
    ]


class Lucky(ReplayBackend):
    """The table's rates, except a lucky first run of one config (1.3x its true rate)."""

    def __init__(self, table: dict, lucky: Config) -> None:
        super().__init__(table)
        self.lucky = lucky

    def run_trial(self, space, config, folder, best_value=None):
        m = super().run_trial(space, config, folder, best_value)
        if config == self.lucky and self.calls.count(config) == 1:
            return m.replace(samples_per_s=m.samples_per_s * 1.3)
        return m


def test_a_lucky_search_run_loses_to_the_rounds_and_the_new_winner_is_ablated(
    write_space, tmp_path
):
    effects = {
        "batch_size": 2.0,
        "num_workers": 1.2,
        "zero_grad_set_to_none": 1.05,
        "gradient_checkpointing": 0.95,  # costs: only a lucky first run made it look good
    }
    space = load_space(write_space(SPACE))
    lucky = space.config_from(EVERY_KNOB_ON)
    backend = Lucky(_table(effects), lucky)
    result = tune(space, storage="memory", out_dir=tmp_path, backend=backend)
    # The rounds rank by the median: the lucky config is not the winner, its ablation is.
    assert result.winner.config == lucky.replace(gradient_checkpointing=False)
    assert round(result.speedup, 6) == round(2.0 * 1.2 * 1.05, 6)
    # The new winner's own ablations ran in rounds of their own (3 rounds x baseline,
    # winner and its 3 ablations), after the first plan's 3 x 6.
    assert len(backend.calls) == 16 + 18 + 15
    assert {c.knob for c in result.contributions} == {
        "batch_size",
        "num_workers",
        "zero_grad_set_to_none",
    }
    assert all(c.kept for c in result.contributions)


class Fickle(ReplayBackend):
    """The table's rates, except one config: a hair faster in its first ``fast`` runs
    (the search run and the first plan's rounds), slower after."""

    def __init__(self, table: dict, config: Config, fast: int) -> None:
        super().__init__(table)
        self.config, self.fast = config, fast

    def run_trial(self, space, config, folder, best_value=None):
        m = super().run_trial(space, config, folder, best_value)
        if config != self.config:
            return m
        factor = 1.01 if self.calls.count(config) <= self.fast else 0.95
        return m.replace(samples_per_s=m.samples_per_s * factor)


def test_the_search_winner_crowned_again_after_another_winners_rounds_is_reduced(
    write_space, tmp_path
):
    """The first rounds crown B (the search winner A without its neutral knob); B's own
    ablations run in rounds of their own, where B is slower, so A wins again. A's dropped
    knob is looked up in A's ablations (it was looked up in B's: a KeyError in CI) and
    the recommendation is A reduced, which is B, measured in the same rounds as A."""
    effects = {
        "batch_size": 2.0,
        "num_workers": 1.2,
        "zero_grad_set_to_none": 1.0,
        "gradient_checkpointing": 0.9,
    }
    space = load_space(write_space(SPACE))
    a = space.config_from({"batch_size": 32, "num_workers": 1, "zero_grad_set_to_none": True})
    b = a.replace(zero_grad_set_to_none=False)

    class LuckyA(Fickle):
        def run_trial(self, space, config, folder, best_value=None):
            m = super().run_trial(space, config, folder, best_value)
            if config == a and self.calls.count(config) == 1:
                return m.replace(samples_per_s=m.samples_per_s * 1.3)
            return m

    backend = LuckyA(_table(effects), b, fast=4)
    result = tune(space, storage="memory", out_dir=tmp_path, backend=backend)
    assert result.winner.config == a
    assert [c.knob for c in result.contributions if not c.kept] == ["zero_grad_set_to_none"]
    assert result.reduction is not None and result.reduction.knobs == ("zero_grad_set_to_none",)
    assert result.reduction.accepted and result.best.config == b
    # B ran in the search, the first plan's 3 rounds and the 3 rounds of its ablations.
    assert backend.calls.count(b) == 7


class Interrupted(Exception):
    """Stands for Ctrl-C or a killed driver in the middle of a run."""


class SlowInRounds(ReplayBackend):
    """The table's rates, except ``slow``: 0.9x in every run after the search (trial
    numbers from ``first_round_trial`` on); raises :class:`Interrupted` at call ``stop``."""

    def __init__(self, table: dict, slow: Config, first_round_trial: int, stop=None) -> None:
        super().__init__(table)
        self.slow, self.first, self.stop = slow, first_round_trial, stop

    def run_trial(self, space, config, folder, best_value=None):
        if len(self.calls) == self.stop:
            raise Interrupted
        m = super().run_trial(space, config, folder, best_value)
        if config == self.slow and int(folder.name.split("-")[1]) >= self.first:
            return m.replace(samples_per_s=m.samples_per_s * 0.9)
        return m


def test_an_interrupted_confirmation_resumes_its_plan_though_its_runs_moved_the_ranking(
    write_space, tmp_path
):
    """The search's best config A is slower in the rounds; three runs into round 0 the
    driver stops (and one more run is left queued). A's round run moved its median below
    the second finalist's, so ranking again would start another plan and leave the first
    unfinished (seen in the kill soak); the resumed confirmation finishes the first plan,
    its rounds all complete."""
    effects = {
        "batch_size": 2.0,
        "num_workers": 1.2,
        "zero_grad_set_to_none": 1.05,
        "gradient_checkpointing": 1.01,
    }
    space = load_space(write_space(SPACE))
    a = space.config_from(EVERY_KNOB_ON)
    storage = f"sqlite:///{tmp_path}/study.db"
    first = SlowInRounds(_table(effects), a, first_round_trial=16, stop=16 + 3)
    with pytest.raises(Interrupted):
        tune(space, storage=storage, out_dir=tmp_path, backend=first)
    study = optuna.load_study(study_name="space", storage=storage)
    plans = dict(study.user_attrs["confirmation"]["plans"])
    assert list(plans.values()) == [[0, 3]]
    # A driver killed between queueing a round's run and taking it leaves it queued.
    study.enqueue_trial(encode(space, a), user_attrs={"role": "repeat", "round": 0})
    result = tune(
        space, storage=storage, out_dir=tmp_path, backend=SlowInRounds(_table(effects), a, 16)
    )
    conf = optuna.load_study(study_name="space", storage=storage).user_attrs["confirmation"]
    assert conf["plans"] | plans == conf["plans"]  # the first plan kept its rounds 0-2
    runs = {}
    done = [
        (t.user_attrs["round"], t.user_attrs["config_key"])
        for t in optuna.load_study(study_name="space", storage=storage).get_trials(
            states=(optuna.trial.TrialState.COMPLETE,)
        )
        if t.user_attrs.get("round") is not None
    ]
    # Baseline, A, the second finalist (two knobs off A: none of its ablations, which
    # take no finalist's place) and A's 4 ablations.
    for r in range(3):
        runs[r] = sum(1 for rr, _ in done if rr == r)
    assert runs == {0: 7, 1: 7, 2: 7}
    assert len(done) == len(set(done))
    left = optuna.load_study(study_name="space", storage=storage).get_trials(
        states=(optuna.trial.TrialState.WAITING, optuna.trial.TrialState.RUNNING)
    )
    assert left == []  # the orphan was failed, not left to hold the rounds back
    assert result.winner.config != a  # A's rounds were slower: the rounds crowned another


class ColdThenWarm(ReplayBackend):
    """The table's rates; each config's first run pays a cold compile (30 s, 25 of them
    compiling), its repeats run on a warm cache (5 s, 2 compiling)."""

    def run_trial(self, space, config, folder, best_value=None):
        m = super().run_trial(space, config, folder, best_value)
        first = [c.key() for c in self.calls].count(config.key()) == 1
        return m.replace(wall_s=30.0 if first else 5.0, compile_s=25.0 if first else 2.0)


def test_the_time_per_knob_is_what_the_search_runs_cost_not_their_rounds(write_space, tmp_path):
    """A knob's time is its search runs' own (spawn to exit, cold compile included): a
    confirmed config's summary carries its rounds' warm medians, which the search run that
    moved the knob did not cost (a summary's 5 s against 25 s of compile read 'run time
    with compile 49 s (compile 62 s)' in a real study)."""
    effects = {
        "batch_size": 2.0,
        "num_workers": 1.2,
        "zero_grad_set_to_none": 1.005,
        "gradient_checkpointing": 1.01,
    }
    space, backend, result = _run(write_space, tmp_path, effects, ColdThenWarm)
    assert any(t.ratios for t in result.trials if t.role != BASELINE)  # rounds ran
    costs = {c.knob: c for c in result.knob_costs()}
    assert set(costs) == set(effects)
    for c in costs.values():
        assert c.run_s == pytest.approx(30.0 * c.trials)
        assert c.compile_s == pytest.approx(25.0 * c.trials)


# --- Sequential rounds and the noise floor (issue 41) ---------------------------------

STEADY = {
    "batch_size": 2.0,
    "num_workers": 1.2,
    "zero_grad_set_to_none": 0.9,  # the baseline's value wins: not in the winner
    "gradient_checkpointing": 1.0,  # its effect is the backend's, round by round
}


class RoundByRound(ReplayBackend):
    """The table's rates; a config with gradient checkpointing runs at ``first`` times
    its rate in its search run and ``seq[r]`` times in its ``r``-th run after it (the
    confirmation's rounds). Every such config runs once per round, so in round ``r``
    checkpointing is worth exactly ``seq[r]``."""

    def __init__(self, table: dict, seq: list[float], first: float = 1.05) -> None:
        super().__init__(table)
        self.seq, self.first = seq, first

    def run_trial(self, space, config, folder, best_value=None):
        m = super().run_trial(space, config, folder, best_value)
        if not config.gradient_checkpointing:
            return m
        n = self.calls.count(config) - 1  # 0: its search run
        return m.replace(samples_per_s=m.samples_per_s * (self.seq[n - 1] if n else self.first))


def _sequential(write_space, tmp_path, seq, extra=""):
    text = SPACE.replace("confirm_max_rounds: 8", extra or "confirm_max_rounds: 8")
    space = load_space(write_space(text))
    backend = RoundByRound(_table(STEADY), seq)
    result = tune(space, storage="memory", out_dir=tmp_path, backend=backend)
    ckpt = next(c for c in result.contributions if c.knob == "gradient_checkpointing")
    runs = {key: backend.calls.count(c) for key, c in {c.key(): c for c in backend.calls}.items()}
    return result, ckpt, backend, runs


def test_the_rounds_stop_at_the_least_on_a_clear_gain(write_space, tmp_path):
    result, ckpt, backend, _ = _sequential(write_space, tmp_path, [1.10] * 8)
    assert result.winner.config.gradient_checkpointing
    assert ckpt.kept and ckpt.decision.state == "proven" and len(ckpt.ratios) == 3
    assert all(len(c.ratios) == 3 for c in result.contributions)
    assert not any("unresolved" in n for n in result.notes)


def test_the_rounds_go_on_while_a_knob_is_a_close_call(write_space, tmp_path):
    # Round 2 disturbed: 3 rounds cannot prove 1.10 (the interval's floor is 0.99); 6 can
    # (one round of six may fall below).
    result, ckpt, backend, runs = _sequential(write_space, tmp_path, [1.10, 0.99] + [1.10] * 6)
    assert len(ckpt.ratios) == 6 and ckpt.kept and ckpt.decision.state == "proven"
    # Past the least rounds only the baseline and the close call's configs run again.
    bs_ablation = Config(
        **{**result.winner.config.to_dict(), "batch_size": 8, "accumulation_steps": 4}
    )
    assert runs[bs_ablation.key()] == 1 + 3
    assert runs[result.winner.config.key()] == 1 + 6
    assert result.best.config.gradient_checkpointing  # kept in the recommendation


def test_a_knob_still_unresolved_at_the_round_cap_is_dropped_and_said_so(write_space, tmp_path):
    seq = [1.10, 0.99] * 6
    result, ckpt, _, _ = _sequential(write_space, tmp_path, seq, "confirm_max_rounds: 5")
    assert len(ckpt.ratios) == 5 and ckpt.unresolved and not ckpt.kept
    assert any(n.startswith("unresolved after 5 rounds") for n in result.notes)
    assert not result.best.config.gradient_checkpointing  # the simpler config
    data = report_data(result, {})
    (entry,) = [c for c in data["contributions"] if c["knob"] == "gradient_checkpointing"]
    assert entry["decision"]["state"] == "unresolved" and entry["decision"]["rounds"] == 5


class Timed(RoundByRound):
    """As :class:`RoundByRound`, on a clock every run moves 10 s on."""

    def __init__(self, table: dict, seq: list[float], clock: list[float]) -> None:
        super().__init__(table, seq)
        self.clock = clock

    def run_trial(self, space, config, folder, best_value=None):
        self.clock[0] += 10.0
        return super().run_trial(space, config, folder, best_value)


def test_the_time_cap_counts_past_the_least_rounds(write_space, tmp_path, monkeypatch):
    """A close call, runs of 10 s, 25 s past the least rounds: those (over 100 s) are
    never cut, round 4 (the baseline, the winner, its checkpointing ablation: 30 s) runs,
    round 5 does not. Counted from the confirmation's start, as before, the least
    rounds' time left no round past them, in any lineup."""
    from autotune.study import confirm

    clock = [0.0]
    monkeypatch.setattr(confirm, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    space = load_space(write_space(SPACE.replace("confirm_max_rounds: 8", "confirm_max_s: 25")))
    backend = Timed(_table(STEADY), [1.10, 0.99] * 6, clock)
    result = tune(space, storage="memory", out_dir=tmp_path, backend=backend)
    ckpt = next(c for c in result.contributions if c.knob == "gradient_checkpointing")
    assert len(ckpt.ratios) == 4 and ckpt.unresolved
    assert backend.calls.count(result.winner.config) == 1 + 4  # its search run, 4 rounds
    cap = "unresolved after 4 rounds: the 25 s past the least rounds"
    assert any(n.startswith(cap) for n in result.notes), result.notes


class NoisyBaseline(RoundByRound):
    """As :class:`RoundByRound`; the baseline's second run (its first back-to-back
    repeat, the noise floor's) is ``dip`` times its rate, and in each confirmation round
    its first run (its own or its twin, whichever the rotation puts first) is ``twin``
    times its rate: the baseline against itself, paired, is ``twin`` or ``1 / twin``."""

    noisy = True  # its answers vary: the study measures its noise floor

    def __init__(self, table: dict, seq: list[float], dip: float, twin: float = 1.0) -> None:
        super().__init__(table, seq)
        self.dip, self.twin = dip, twin

    def run_trial(self, space, config, folder, best_value=None):
        m = super().run_trial(space, config, folder, best_value)
        n = self.calls.count(config)
        if config == space.baseline and n == 2:
            return m.replace(samples_per_s=m.samples_per_s * self.dip)
        if config == space.baseline and n > 3 and n % 2 == 0:  # two runs a round from the 4th
            return m.replace(samples_per_s=m.samples_per_s * self.twin)
        return m


@pytest.mark.parametrize(
    "dip, twin, state, rounds",
    [(1.0, 1.0, PROVEN, 3), (0.88, 1.0, PROVEN, 3), (1.0, 0.88, UNRESOLVED, 8)],
)
def test_the_paired_noise_floor_moves_the_keep_threshold(
    write_space, tmp_path, dip, twin, state, rounds
):
    """Checkpointing is worth 8% in every round. Each round runs the baseline twice, and
    its twin against its own run is the floor decisions use: proven at 3 rounds on a
    quiet machine (margin 3%, search.min_gain), and where only the baseline's two
    back-to-back repeats were 12% apart (cpu.yaml, 2026-12-07: floors of 8.8-34.9% read
    that way dropped a compile the rounds measured at 1.06-1.09x). Where the rounds put
    the baseline 12-14% from itself (margin 10%, the floor's cap) the 8% is not proven:
    its rounds go on to the cap (8), where it stands, proven above the least gain; it is
    not dropped as within noise (below the margin, above the least gain: issue 41's
    judge dropped a real compile so). The back-to-back floor stays the search's."""
    text = SPACE.replace("noise_runs: 0,", "noise_runs: 2,")
    space = load_space(write_space(text))
    backend = NoisyBaseline(_table(STEADY), [1.08] * 30, dip, twin)
    storage = f"sqlite:///{tmp_path}/s.db"
    result = tune(space, storage=storage, out_dir=tmp_path, backend=backend)
    assert backend.calls[:3] == [space.baseline] * 3  # the baseline, then its 2 repeats
    ckpt = next(c for c in result.contributions if c.knob == "gradient_checkpointing")
    assert ckpt.decision.state == state and len(ckpt.ratios) == rounds
    assert ckpt.kept and result.best.number == result.winner.number
    base = result.baseline
    # one twin a round, not a run of its own
    assert len(base.ratios) == result.noise_rounds == rounds
    paired = 0.0 if twin == 1.0 else statistics.median([0.12, 0.12, 1 / 0.88 - 1])
    assert result.noise_floor == pytest.approx(paired, abs=0.0137)
    study = optuna.load_study(study_name=space.study.name, storage=storage)
    ratios = twin_ratios(records(study))  # each round's twin over the baseline's own run
    assert len(ratios) == rounds and all(
        r in (pytest.approx(twin), pytest.approx(1 / twin)) for r in ratios
    )
    assert result.margin == pytest.approx(max(0.03, min(result.noise_floor, FLOOR_CAP)))
    assert result.search_floor == pytest.approx((1 - dip) / ((1 + dip) / 2))
    data = report_data(result, {})
    assert data["noise_floor"] == result.noise_floor and data["noise_rounds"] == rounds
    assert data["search_floor"] == pytest.approx(result.search_floor)
    fact = next(f for f in summary_facts(result) if f.key == "noise_floor")
    assert f"the baseline against itself in {rounds} paired rounds" in fact.text, fact.text
    if state == UNRESOLVED:
        said = "unresolved after 8 rounds (interval 1.08-1.08x below 1.10x), above the least"
        assert said in contribution_text(ckpt), contribution_text(ckpt)


def test_the_baseline_s_twin_runs_half_a_round_from_it():
    from autotune.study.confirm import with_twin

    base, a, b, c, d = (Config(batch_size=n) for n in (8, 16, 32, 64, 128))
    twin = [(base, True)]

    def runs(*configs):
        return [(x, False) for x in configs]

    assert with_twin([base, a], base) == runs(base, a) + twin
    assert with_twin([a, base], base) == twin + runs(a, base)
    assert with_twin([a, base, b, c, d], base) == runs(a, base, b, c) + twin + runs(d)
    assert with_twin([c, d, a, b, base], base) == runs(c, d) + twin + runs(a, b, base)
    assert with_twin([a, b], base) == runs(a, b)  # no baseline in the round: no twin
    assert with_twin([base], base) == runs(base)  # nothing to pair: no twin


def test_without_twin_runs_the_back_to_back_floor_decides(write_space, tmp_path):
    """A study whose rounds ran no twin (made before the twin existed: the twins are
    taken out of its records here) reads the floor back to back, as it did: the
    baseline's repeats 12% apart, margin 10%, checkpointing's 8% (proven at 3 rounds
    under the paired floor) not proven: unresolved, its rounds would go on."""
    text = SPACE.replace("noise_runs: 0,", "noise_runs: 2,")
    space = load_space(write_space(text))
    storage = f"sqlite:///{tmp_path}/s.db"
    backend = NoisyBaseline(_table(STEADY), [1.08] * 8, 0.88)
    tune(space, storage=storage, out_dir=tmp_path, backend=backend)
    study = optuna.load_study(study_name=space.study.name, storage=storage)
    raw = [t for t in records(study) if not t.twin]
    assert len(raw) < len(records(study))
    conf = study.user_attrs["confirmation"]
    result = TuneResult.from_trials("s", storage, raw, confirmation=conf, min_gain=0.03)
    assert result.noise_rounds == 0 and result.noise_floor == pytest.approx(0.12 / 0.94)
    assert result.margin == FLOOR_CAP
    ckpt = next(c for c in result.contributions if c.knob == "gradient_checkpointing")
    assert ckpt.decision.state == UNRESOLVED and len(ckpt.ratios) == 3


@pytest.mark.parametrize("low, kept", [(1.06, True), (1.02, False)])
def test_a_gain_unresolved_at_the_cap_stands_where_its_rounds_prove_the_least_gain(
    write_space, tmp_path, low, kept
):
    """Margin 10% (the baseline's twin 12-14% from it in every round), rounds capped at
    5: checkpointing worth 1.12x and ``low`` in turns leaves an interval across 1.10x,
    unresolved. Above
    1.03x (search.min_gain) the gain stands: kept, the full winner recommended; reaching
    it, dropped for the simpler config."""
    text = SPACE.replace("noise_runs: 0,", "noise_runs: 2,")
    space = load_space(write_space(text.replace("confirm_max_rounds: 8", "confirm_max_rounds: 5")))
    backend = NoisyBaseline(_table(STEADY), [1.12, low] * 6, 1.0, 0.88)
    result = tune(space, storage="memory", out_dir=tmp_path, backend=backend)
    assert result.margin == pytest.approx(FLOOR_CAP) and result.least_gain == 0.03
    ckpt = next(c for c in result.contributions if c.knob == "gradient_checkpointing")
    assert len(ckpt.ratios) == 5 and ckpt.unresolved
    assert ckpt.decision.interval == pytest.approx((low, 1.12))
    assert ckpt.kept is kept
    assert result.best.config.gradient_checkpointing is kept
    text = contribution_text(ckpt)
    if kept:
        assert "unresolved after 5 rounds (interval 1.06-1.12x across 1.10x)" in text, text
        assert text.endswith("above the least gain 1.03x: kept"), text
    else:
        assert text.endswith("dropped, the simpler config"), text
    (entry,) = [
        c for c in report_data(result, {})["contributions"] if c["knob"] == "gradient_checkpointing"
    ]
    assert entry["decision"]["state"] == "unresolved" and entry["decision"]["stands"] is kept
    assert entry["kept"] is kept


class LedByAnother(RoundByRound):
    """As :class:`RoundByRound` (checkpointing worth ``seq[r]`` in round ``r``), and one
    more config, ``other``: 1.35x its rate in its search run, 1.3x in its next three runs
    (the first rounds), 0.9x after (its own ablations' rounds)."""

    def __init__(self, table: dict, seq: list[float], other: Config) -> None:
        super().__init__(table, seq, first=1.3)
        self.other = other

    def run_trial(self, space, config, folder, best_value=None):
        m = super().run_trial(space, config, folder, best_value)
        if config != self.other:
            return m
        n = self.calls.count(config)
        factor = 1.35 if n == 1 else 1.3 if n <= 4 else 0.9
        return m.replace(samples_per_s=m.samples_per_s * factor)


def test_the_search_winners_close_call_gets_its_rounds_while_another_finalist_leads(
    write_space, tmp_path
):
    """The search winner A (with checkpointing, a close call: round 2 disturbed) and the
    finalist F, which leads the first rounds, is crowned, and falls back in its own
    ablations' rounds, so A is the final winner. A's checkpointing decision must get the
    rounds it needs in the first rounds, where its ablation runs; reading only the leader's
    decisions there (F's ablations are in no round yet) stopped at 3 rounds and dropped
    checkpointing unresolved."""
    space = load_space(write_space(SPACE))
    a = space.config_from({"batch_size": 32, "num_workers": 1, "gradient_checkpointing": True})
    f = space.config_from({"batch_size": 32, "num_workers": 1, "zero_grad_set_to_none": True})
    backend = LedByAnother(_table(STEADY), [1.10, 0.99] + [1.10] * 6, f)
    result = tune(space, storage="memory", out_dir=tmp_path, backend=backend)
    assert backend.calls.count(f) == 1 + 3 + 3  # search, the first rounds, its own rounds
    assert result.winner.config == a
    ckpt = next(c for c in result.contributions if c.knob == "gradient_checkpointing")
    assert len(ckpt.ratios) == 6 and ckpt.decision.state == "proven" and ckpt.kept
    assert result.best.config == a


class CloseThird(RoundByRound):
    """As :class:`RoundByRound` (checkpointing worth ``seq[r]`` in round ``r``), and
    ``third`` runs at ``shares[r]`` times the search winner's rate (2.64x the baseline's
    under :data:`STEADY` and a 1.10 checkpointing) in its ``r``-th round."""

    def __init__(self, table: dict, seq: list[float], third: Config, shares: list[float]):
        super().__init__(table, seq)
        self.third, self.shares = third, shares

    def run_trial(self, space, config, folder, best_value=None):
        m = super().run_trial(space, config, folder, best_value)
        n = self.calls.count(config) - 1
        if config != self.third or n == 0:
            return m
        return m.replace(samples_per_s=264.0 * self.shares[n - 1])


def test_a_finalist_third_by_median_gets_rounds_while_the_winners_lead_over_it_is_open(
    write_space, tmp_path
):
    """Three finalists: the winner A, its checkpointing ablation B (10% behind: the
    runner-up) and T, third by median, whose one round of three put it 5% ahead of A.
    A's lead over T is open after the least rounds; the rounds go on for T until it is
    proven (6 rounds: one round of six may fall below), not only for the runner-up."""
    space = load_space(write_space(SPACE.replace("confirm_top: 2", "confirm_top: 3")))
    a = space.config_from({"batch_size": 32, "num_workers": 1, "gradient_checkpointing": True})
    t = space.config_from(
        {
            "batch_size": 32,
            "num_workers": 1,
            "zero_grad_set_to_none": True,
            "gradient_checkpointing": True,
        }
    )
    shares = [0.85, 1.05, 0.88] + [0.85] * 5
    backend = CloseThird(_table(STEADY), [1.10] * 8, t, shares)
    result = tune(space, storage="memory", out_dir=tmp_path, backend=backend)
    assert result.winner.config == a and result.runner_up.config != t
    assert backend.calls.count(t) == 1 + 6  # its search run and six rounds
    assert backend.calls.count(a) == 1 + 6
    others = [c for c in set(backend.calls) if c not in (a, t, space.baseline)]
    assert all(backend.calls.count(c) <= 1 + 3 for c in others)  # they were settled at 3
    assert not any("unresolved" in n for n in result.notes)


class LuckyThenFickle(Lucky):
    """As :class:`Lucky` (``lucky`` 1.3x in its first run), and ``fickle`` 0.85x after its
    first four runs (the search and the first rounds)."""

    def __init__(self, table: dict, lucky: Config, fickle: Config) -> None:
        super().__init__(table, lucky)
        self.fickle = fickle

    def run_trial(self, space, config, folder, best_value=None):
        m = super().run_trial(space, config, folder, best_value)
        if config == self.fickle and self.calls.count(config) > 4:
            return m.replace(samples_per_s=m.samples_per_s * 0.85)
        return m


def test_a_final_winner_that_was_not_crowned_gets_its_own_ablations(write_space, tmp_path):
    """The search's lucky L loses the first rounds to W (L without checkpointing); in W's
    own ablations' rounds W slows and its ablation X (W without set_to_none) comes first:
    X is the final winner. X's knobs must be ablated in rounds with X, or the
    recommendation comes without its contributions (cnn_small_batch, 2026-12-06)."""
    effects = {
        "batch_size": 2.0,
        "num_workers": 1.2,
        "zero_grad_set_to_none": 1.05,
        "gradient_checkpointing": 0.95,
    }
    space = load_space(write_space(SPACE))
    lucky = space.config_from(EVERY_KNOB_ON)
    w = lucky.replace(gradient_checkpointing=False)
    x = w.replace(zero_grad_set_to_none=False)
    backend = LuckyThenFickle(_table(effects), lucky, w)
    study_storage = f"sqlite:///{tmp_path}/s.db"
    result = tune(space, storage=study_storage, out_dir=tmp_path, backend=backend)
    pins = optuna.load_study(study_name=space.study.name, storage=study_storage).user_attrs[
        "confirmation"
    ]["pins"]
    by_config = {t.config.key(): t.number for t in result.trials}
    assert pins["crowned"] == by_config[w.key()] and pins["final"] == by_config[x.key()]
    assert result.winner.config == x
    assert {c.knob for c in result.contributions} == {"batch_size", "num_workers"}
    assert all(c.kept and len(c.ratios) >= 3 for c in result.contributions)


class CrownedCloseCall(ReplayBackend):
    """The table's rates (no knob worth anything but the batch size and the workers),
    except: ``a`` 1.4x in its search run (the search's winner), ``f`` 1.3x in its search
    run and ``seq[i]`` in its ``i``-th run after it; raises :class:`Interrupted` at call
    ``stop``."""

    def __init__(self, table: dict, a: Config, f: Config, seq: list[float], stop=None) -> None:
        super().__init__(table)
        self.a, self.f, self.seq, self.stop = a, f, seq, stop

    def run_trial(self, space, config, folder, best_value=None):
        if len(self.calls) == self.stop:
            raise Interrupted
        m = super().run_trial(space, config, folder, best_value)
        n = self.calls.count(config)
        if config == self.a and n == 1:
            return m.replace(samples_per_s=m.samples_per_s * 1.4)
        if config == self.f:
            factor = 1.3 if n == 1 else self.seq[n - 2]
            return m.replace(samples_per_s=m.samples_per_s * factor)
        return m


CLOSE_CALL = [1.10, 0.99] + [1.10] * 10  # F over F without set_to_none, round by round
NEUTRAL = {"batch_size": 2.0, "num_workers": 1.2, "zero_grad_set_to_none": 1.0,
           "gradient_checkpointing": 1.0}  # fmt: skip


def _crowned_close_call(space):
    a = space.config_from({"batch_size": 32, "num_workers": 1, "gradient_checkpointing": True})
    f = space.config_from({"batch_size": 32, "num_workers": 1, "zero_grad_set_to_none": True})
    return a, f, a.replace(gradient_checkpointing=False)  # A's ablation and F's: one config


def _set_to_none(result):
    return next(c for c in result.contributions if c.knob == "zero_grad_set_to_none")


def test_the_crowned_configs_close_call_measured_in_anothers_rounds_gets_more(
    write_space, tmp_path
):
    """The search's winner A and the finalist F: F leads the first rounds and is crowned.
    F's set_to_none ablation is A's checkpointing ablation, so it ran in the first rounds
    with F, 3 rounds of 1.10, 0.99, 1.10x: unresolved. Those rounds were A's and stopped
    when A's decisions were settled; F's own rounds must run that ablation again until
    its decision resolves (cpu.yaml, 2026-12-06: compile dropped "unresolved after 3
    rounds" with 5 of its 8 rounds never run)."""
    space = load_space(write_space(SPACE))
    a, f, shared = _crowned_close_call(space)
    backend = CrownedCloseCall(_table(NEUTRAL), a, f, CLOSE_CALL)
    result = tune(space, storage="memory", out_dir=tmp_path, backend=backend)
    assert result.winner.config == f
    zg = _set_to_none(result)
    assert len(zg.ratios) == 6 and zg.decision.state == "proven" and zg.kept
    assert backend.calls.count(shared) == 1 + 3 + 3  # search, A's rounds, F's rounds
    assert result.best.config == f


def test_a_resumed_crowned_step_runs_the_lineup_it_chose(write_space, tmp_path):
    """Interrupted in the second of F's own rounds: the resumed confirmation finishes
    the lineup chosen before, not one chosen again from the rounds as they stand (F's
    batch-size and workers ablations now paired with it, which would leave them out
    with 2 rounds each)."""
    space = load_space(write_space(SPACE))
    a, f, shared = _crowned_close_call(space)
    storage = f"sqlite:///{tmp_path}/study.db"
    # 16 search runs, 3 rounds of 6, then F's lineup (baseline, F, 3 ablations) 5 a round:
    # stop in its second round.
    stop = 16 + 18 + 5 + 2
    first = CrownedCloseCall(_table(NEUTRAL), a, f, CLOSE_CALL, stop=stop)
    with pytest.raises(Interrupted):
        tune(space, storage=storage, out_dir=tmp_path, backend=first)
    resumed = CrownedCloseCall(_table(NEUTRAL), a, f, CLOSE_CALL[first.calls.count(f) - 1 :])
    result = tune(space, storage=storage, out_dir=tmp_path, backend=resumed)
    assert result.winner.config == f and _set_to_none(result).kept
    assert all(len(c.ratios) >= 3 and c.kept for c in result.contributions)
    conf = optuna.load_study(study_name="space", storage=storage).user_attrs["confirmation"]
    assert shared.key() in conf["steps"]["crowned"]


class Rounds(ReplayBackend):
    """The replay as a machine would run it (``noisy``: a replay's rounds have no drift
    to share, and run one at a time), noting how each confirmation round was run: side
    by side (``run_round``, its size) or one run at a time."""

    noisy = True

    def __init__(self, table: dict) -> None:
        super().__init__(table)
        self.together: list[int] = []

    def run_round(self, space, configs, folders):
        self.together.append(len(configs))
        return super().run_round(space, configs, folders)


@pytest.mark.parametrize(
    ("limits", "search", "together"),
    [
        ("{memory: 4GiB}", "", True),  # 6-7 runs of 300 MiB: 2.1 GiB together
        ("{memory: 1GiB}", "", False),  # each fits, together they do not
        ("{memory: 512MiB}", "", False),  # nor do a paired look's two
        ("{memory: 4GiB}", ", interleave: false", False),
    ],
)
def test_a_round_runs_side_by_side_when_its_runs_fit_in_memory_together(
    write_space, tmp_path, limits, search, together
):
    text = SPACE.replace("confirm_max_rounds: 8", f"confirm_max_s: 0{search}")
    space = load_space(write_space(text + f"    limits: {limits}\n"))
    table = _table({"batch_size": 2.0, "num_workers": 1.2, "zero_grad_set_to_none": 1.0,
                    "gradient_checkpointing": 1.3})  # fmt: skip
    for row in table["measurements"]:
        row["measurement"]["peak_mem_bytes"] = 300 * 2**20
    backend = Rounds(table)
    storage = f"sqlite:///{tmp_path}/s.db"
    result = tune(space, storage=storage, out_dir=tmp_path, backend=backend)
    assert result.winner is not None and len(backend.calls) > 16
    raw = records(optuna.load_study(study_name=space.study.name, storage=storage))
    note = "confirmation rounds ran one config at a time: side by side their"
    # The search's paired looks are rounds of two (600 MiB: side by side within 1 GiB,
    # not within 512 MiB, and a note says why); the confirmation's are its lineup's six
    # or more.
    looks = [n for n in backend.together if n == 2]
    rounds = [n for n in backend.together if n != 2]
    made = sum(t.look_for is not None for t in raw)
    assert made > 0 and backend.together[: len(looks)] == looks
    apart = "the screening's paired looks ran one after the other: side by side their 2 runs"
    apart += " would need 0.6 GiB, over the memory limit (0.5 GiB; search.interleave)"
    if search or "512MiB" in limits:
        assert looks == [] and ("the screening's paired looks ran side by side" not in result.notes)
        assert (apart in result.notes) == (search == "")
    else:
        assert len(looks) == made and apart not in result.notes
    if together:
        # every round of the confirmation: its runs at once (the first plan's 6 configs)
        assert rounds[:3] == [6, 6, 6]
        assert not any(note in n for n in result.notes)
    else:
        assert rounds == []
        assert any(note in n for n in result.notes) == (search == "")


def test_a_finalists_place_goes_past_the_first_finalists_own_ablation(write_space, tmp_path):
    """Every knob on leads; second by the search's figures is the same without
    ``zero_grad_set_to_none`` (1% behind), its ablation, which runs in the lineup anyway.
    The second finalist's place goes to the next config that is none of the first's
    ablations (batch 32, checkpointing, nothing else: two knobs off), which then runs in
    the rounds beside the first; the ablation still does too."""
    effects = {
        "batch_size": 2.0,
        "num_workers": 1.2,
        "zero_grad_set_to_none": 1.01,
        "gradient_checkpointing": 1.3,
    }
    space = load_space(write_space(SPACE.replace("confirm_max_rounds: 8", "confirm_max_s: 0")))
    backend = ReplayBackend(_table(effects))
    storage = f"sqlite:///{tmp_path}/s.db"
    result = tune(space, storage=storage, out_dir=tmp_path, backend=backend)
    top = space.config_from(EVERY_KNOB_ON)
    ablation = top.replace(zero_grad_set_to_none=False)
    lineup = {c.key() for c in backend.calls[16:]}
    assert top.key() in lineup and ablation.key() in lineup
    by_number = {t.number: t for t in result.trials}
    study = optuna.load_study(study_name=space.study.name, storage=storage)
    finalists = {by_number[n].config.key() for n in study.user_attrs["confirmation"]["finalists"]}
    (second,) = finalists - {top.key()}
    assert second != ablation.key()
    config = next(c for c in backend.calls if c.key() == second)
    assert sum(getattr(config, k) != getattr(top, k) for k in EVERY_KNOB_ON) == 2
    assert second in lineup
