"""Results as values: repeats folded into their config, the ranking, best_config.yaml."""

from __future__ import annotations

import pytest
import yaml

from autotune import Config, Measurement, TrialRecord, TuneResult, load_config
from autotune.results import (
    BASELINE,
    REPEAT,
    SEARCH,
    Contribution,
    Reduction,
    summarize,
    write_best_config,
)

OK = Measurement(status="ok", samples_per_s=1.0, peak_mem_bytes=100)


def run(number, batch, value, role=SEARCH, repeat_of=None, status="ok", reason=""):
    return TrialRecord(
        number,
        Config(batch_size=batch),
        OK,
        value,
        role,
        status=status,
        reason=reason,
        repeat_of=repeat_of,
    )


def test_configs_are_ranked_by_the_median_of_their_runs_not_the_first():
    trials = [
        run(0, 8, 100.0, BASELINE),
        run(1, 16, 300.0),  # a lucky first run...
        run(2, 32, 200.0),
        run(3, 16, 150.0, REPEAT, repeat_of=1),  # ...that its repeats do not confirm
        run(4, 16, 140.0, REPEAT, repeat_of=1),
        run(5, 32, 210.0, REPEAT, repeat_of=2),
        run(6, 32, 190.0, REPEAT, repeat_of=2),
    ]
    result = TuneResult.from_trials("s", "memory", trials)
    assert result.best.number == 2 and result.best.value == 200.0
    assert result.runner_up.number == 1 and result.runner_up.value == 150.0
    assert (result.best.runs, result.runner_up.runs) == (3, 3)
    assert result.runner_up.spread == (300.0 - 140.0) / 150.0
    assert [t.number for t in result.trials] == [0, 1, 2]  # repeats folded in


def test_a_failed_repeat_makes_its_config_infeasible():
    trials = [
        run(0, 8, 100.0, BASELINE),
        run(1, 16, 300.0),
        run(2, 16, 0.0, REPEAT, repeat_of=1, status="oom", reason="out of memory"),
    ]
    result = TuneResult.from_trials("s", "memory", trials)
    folded = next(t for t in result.trials if t.number == 1)
    assert not folded.feasible and folded.status == "oom"
    assert folded.reason == "repeat run #2: out of memory"
    assert result.best.number == 0  # the baseline is the only feasible config


def test_best_config_yaml_loads_back_and_carries_the_evidence(tmp_path):
    trials = [run(0, 8, 100.0, BASELINE), run(1, 16, 150.0)]
    result = TuneResult.from_trials(
        "s", "memory", trials, environment={"device_name": "cpu"}, global_batch=None
    )
    path = write_best_config(result, tmp_path / "best_config.yaml")
    assert load_config(str(path)) == Config(batch_size=16)
    data = yaml.safe_load(path.read_text())
    assert data["measured"]["speedup"] == 1.5 and data["measured"]["baseline_trial"] == 0
    assert "convergence may differ" in data["measured"]["warning"]  # free global batch
    assert path.read_text().startswith("# autotune recommendation.")


def paired(number, batch, value, round_, role=REPEAT, repeat_of=None, status="ok"):
    return TrialRecord(
        number,
        Config(batch_size=batch),
        OK,
        value,
        role,
        status=status,
        reason="out of memory" if status != "ok" else "",
        repeat_of=repeat_of,
        round=round_,
    )


def _rounds(b16: list[float], b32: list[float], status32: str = "ok") -> list[TrialRecord]:
    """Baseline (bs 8, 100 every round), bs 16 and bs 32 in three paired rounds."""
    trials = [run(0, 8, 100.0, BASELINE), run(1, 16, 500.0), run(2, 32, 150.0)]
    n = 3
    for r in range(3):
        trials.append(paired(n, 8, 100.0, r, repeat_of=0))
        trials.append(paired(n + 1, 16, b16[r], r, repeat_of=1))
        status = status32 if r == 2 else "ok"
        trials.append(paired(n + 2, 32, b32[r], r, repeat_of=2, status=status))
        n += 3
    return trials


def test_paired_rounds_rank_by_the_median_ratio_and_flag_overlapping_ranges():
    conf = {"finalists": [1, 2]}
    # bs 16's lucky search run (500) counts for nothing: its rounds say 1.2x.
    result = TuneResult.from_trials("s", "m", _rounds([120, 118, 125], [140, 150, 145]), conf)
    assert result.winner.number == 2 and result.best.number == 2
    assert result.best.ratios == (1.4, 1.5, 1.45) and result.speedup == 1.45
    assert result.best.value == 145.0 and result.best.runs == 3  # the search run is not in it
    assert result.within_noise is False  # ahead by 1.16-1.27x in every round
    assert result.lead_decision.state == "proven"
    # Paired, round by round: bs 16 led in round 1, so the lead is not proven in 3 rounds.
    close = TuneResult.from_trials("s", "m", _rounds([120, 152, 125], [140, 150, 130]), conf)
    assert close.winner.number == 2 and close.within_noise
    assert close.lead_decision.state == "unresolved"
    # Overlapping ranges, yet bs 32 led by more than 3% in each round: proven ahead.
    apart = TuneResult.from_trials("s", "m", _rounds([120, 142, 125], [140, 150, 130]), conf)
    assert apart.within_noise is False


@pytest.mark.parametrize("b32, tie", [([108, 105, 112], False), ([102, 108, 112], True)])
def test_a_lead_unresolved_at_the_margin_stands_above_the_least_gain(b32, tie):
    """The baseline's repeats 10.5% apart: a 10% margin. bs 32 leads bs 16 by 5-12% in
    every round (interval 1.05-1.12x across 1.10x): above the least gain (3%), a lead, no
    tie. By 2-12%: reaching it, a tie, as before."""
    trials = _rounds([100, 100, 100], b32)
    trials += [run(20, 8, 90.0, REPEAT, repeat_of=0), run(21, 8, 100.0, REPEAT, repeat_of=0)]
    result = TuneResult.from_trials("s", "m", trials, {"finalists": [1, 2]})
    assert result.margin == pytest.approx(0.10) and result.winner.number == 2
    lead = result.lead_decision
    assert lead.state == "unresolved" and lead.stands is not tie
    assert result.within_noise is tie


def test_a_failed_round_run_makes_its_config_infeasible():
    conf = {"finalists": [1, 2]}
    result = TuneResult.from_trials(
        "s", "m", _rounds([120, 118, 125], [140, 150, 0.0], status32="oom"), conf
    )
    folded = next(t for t in result.trials if t.number == 2)
    assert not folded.feasible and "out of memory" in folded.reason
    assert result.winner.number == 1 and result.best.number == 1


def test_a_finalist_the_rounds_never_reached_cannot_win():
    # Rounds cut short: bs 32 (a finalist, 150 in the search) never ran in them.
    trials = [run(0, 8, 100.0, BASELINE), run(1, 16, 120.0), run(2, 32, 150.0)]
    for r in range(2):
        trials += [paired(3 + 2 * r, 8, 100.0, r, repeat_of=0)]
        trials += [paired(4 + 2 * r, 16, 118.0, r, repeat_of=1)]
    result = TuneResult.from_trials("s", "m", trials, {"finalists": [1, 2]})
    assert result.winner.number == 1 and result.speedup == 1.18


def test_memory_of_a_multi_process_trial_is_labelled_per_rank():
    from autotune.output.console import summary_table
    from autotune.output.facts import summary_facts

    single = TuneResult.from_trials("s", "m", [run(0, 8, 100.0, BASELINE), run(1, 16, 150.0)])
    assert single.memory_label == "peak mem"
    sharded = TrialRecord(2, Config(batch_size=8, world_size=2, fsdp="blocks"), OK, 180.0)
    result = TuneResult.from_trials("s", "m", [run(0, 8, 100.0, BASELINE), sharded])
    assert result.memory_label == "peak mem per rank"
    assert summary_table(result).columns[6].header == "peak mem per rank"
    memory = next(f for f in summary_facts(result) if f.key == "memory")
    assert "the largest of its 2 processes' peaks" in memory.text


def _phased(start, imports, build, timed, exit_s=0.1):
    return Measurement(
        status="ok",
        samples_per_s=1.0,
        process_start_s=start,
        import_s=imports,
        device_init_s=0.0,
        build_s=build,
        warmup_s=0.5,
        window_s=timed,
        exit_s=exit_s,
        wall_s=imports + build + 0.5 + timed,
    )


def test_the_time_split_and_the_fixed_cost_come_from_the_same_phases():
    """Per config, the phases add up to spawn-to-exit; the summary's split is each
    phase's median, and the fixed cost is process start, imports, device, build and exit
    (not the imports and build alone, as the first version counted)."""
    runs = [_phased(0.1, 2.0, 0.5, 3.0), _phased(0.2, 3.0, 0.3, 5.0), _phased(0.1, 2.5, 0.4, 4.0)]
    trials = [
        TrialRecord(i, Config(batch_size=8 * (i + 1)), m, 1.0, BASELINE if i == 0 else SEARCH)
        for i, m in enumerate(runs)
    ]
    result = TuneResult.from_trials("s", "memory", trials)
    phases, total, n = result.time_split()
    assert n == 3
    assert phases["imports"] == 2.5 and phases["timed"] == 4.0 and phases["build"] == 0.4
    assert phases["warm-up"] == 0.5 and phases["other"] == 0.0
    assert round(total, 9) == round(0.1 + 2.5 + 0.4 + 0.5 + 4.0 + 0.1, 9)
    fixed, share = result.overhead()
    assert round(fixed, 9) == round(0.1 + 2.5 + 0.4 + 0.1, 9)  # median of the fixed costs
    assert round(share, 9) == round(3.1 / 7.6, 9)  # the middle share: the third run's


def test_a_knob_is_judged_by_the_interval_of_its_rounds_not_its_best_or_worst_round():
    # A neutral knob with one lucky round: not a gain.
    assert not Contribution("pin_memory", True, False, (0.98, 1.00, 1.25), min_gain=0.03).kept
    # Three rounds, one disturbed: the median (1.04) is above 1 + min_gain, but 3 rounds
    # cannot prove it; the knob is unresolved (the confirmation adds rounds).
    three = Contribution("pin_memory", True, False, (1.04, 1.05, 0.90), min_gain=0.03)
    assert not three.kept and three.unresolved
    # Six rounds, one disturbed: the sign test's lower bound (the 2nd smallest) is 1.04.
    six = (1.04, 1.05, 0.90, 1.06, 1.05, 1.04)
    assert Contribution("pin_memory", True, False, six, min_gain=0.03).kept
    # Two disturbed rounds of six: not proven.
    two = (1.04, 1.05, 0.90, 1.06, 1.05, 0.99)
    assert not Contribution("pin_memory", True, False, two, min_gain=0.03).kept


def test_the_reduced_config_mirrors_a_knob_unresolved_at_the_cap():
    """Several dropped knobs measured together: the full winner is kept where its gain over
    the reduced config stands (unresolved at a 10% margin, above the 3% least gain), the
    reduced config taken where the interval reaches the least gain, or lies below it
    (within noise). Below the margin and above the least gain, the gain stands too."""
    reduced = run(5, 8, 100.0)
    cases = [((1.06, 1.12), True), ((1.02, 1.12), False), ((1.05, 1.07), True)]
    for full, kept in [*cases, ((1.01, 1.02), False)]:
        ratios = tuple(1 / full[i % 2] for i in range(5))  # reduced over full, per round
        cut = Reduction(("num_workers", "pin_memory"), reduced, ratios, 0.10, 0.03)
        assert cut.accepted is not kept, full
        assert cut.decision.stands is kept, full


def test_a_config_pruned_in_the_search_and_measured_in_the_rounds_is_feasible():
    """On cpu.yaml (2026-12-06, study 1) the winner's batch-size ablation had been pruned in
    the search; it then ran 8 full rounds, but its record stayed "pruned", so the reduced
    config could not be taken ("without batch_size: pruned ...: the full winner is
    kept"). A failed search run still counts; a pruned config with no rounds stays
    pruned."""
    from dataclasses import replace

    def rounds(number, batch, values, of):
        return [
            replace(run(number + i, batch, v, REPEAT, of), round=i) for i, v in enumerate(values)
        ]

    base = [run(0, 8, 100.0, BASELINE), *rounds(10, 8, [100.0, 100.0, 100.0], 0)]
    winner = [run(1, 32, 130.0), *rounds(20, 32, [131.0, 129.0, 130.0], 1)]
    pruned = [run(2, 16, 60.0, status="pruned", reason="pruned after 3/12 measured steps")]
    ablation = [*pruned, *rounds(30, 16, [128.0, 129.0, 127.0], 2)]
    failed = [run(3, 64, 0.0, status="oom", reason="out of memory")]
    failed += rounds(40, 64, [140.0, 141.0, 139.0], 3)
    never = [run(4, 128, 50.0, status="pruned", reason="pruned after 2/12 measured steps")]
    raw = [*base, *winner, *ablation, *failed, *never]
    by_number = {t.number: t for t in summarize(raw)}
    assert by_number[2].feasible and by_number[2].ratios == (1.28, 1.29, 1.27)
    assert by_number[2].reason == ""
    assert by_number[3].status == "oom"  # a failure is a failure, whatever ran after
    assert by_number[4].status == "pruned"
    # As the reduced config (the winner without its batch size, within noise): taken.
    key = Config(batch_size=16).key()
    conf = {
        "finalists": [1],
        "ablations": {"1": {"batch_size": key}},
        "reduced": {"1": {"knobs": ["batch_size"], "key": key}},
    }
    result = TuneResult.from_trials("s", "m", raw, confirmation=conf)
    assert result.winner.number == 1 and result.reduction.record.number == 2
    assert result.best.number == 2
    # Pruning stopped both search runs, the one the rounds then measured included.
    assert result.pruning_saved_s()[0] == 2


def test_aggregate_keeps_the_largest_device_memory_and_any_throttle_of_the_runs():
    from autotune.results import aggregate

    runs = [
        Measurement(
            status="ok", samples_per_s=s, joules_per_sample=j, throttled=t, gpu_proc_mem_max_bytes=b
        )
        for s, j, t, b in [(10.0, 3.0, [], 5), (12.0, 2.0, ["sw_thermal"], 7), (11.0, 4.0, [], 6)]
    ]
    m = aggregate(runs, runs[0])
    assert m.throttled == ["sw_thermal"] and m.gpu_proc_mem_max_bytes == 7
    assert m.joules_per_sample == 3.0 and m.samples_per_s == 11.0
