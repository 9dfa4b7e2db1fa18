"""benchmarks/search.py's own choices (its replays and recordings time real runs: not here)."""

from __future__ import annotations

import importlib.util
import sys

import pytest
from conftest import ROOT

from autotune.errors import ArgumentError

sys.path.insert(0, str(ROOT / "benchmarks"))  # search.py imports its neighbour docblock
_spec = importlib.util.spec_from_file_location("search", ROOT / "benchmarks" / "search.py")
search = sys.modules["search_benchmark"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(search)


def test_repeat_takes_every_config_within_15_percent_of_the_top():
    values = {"a": 100.0, "b": 85.5, "c": 84.5, "d": 99.0, "e": 0.0, "f": 86.0}
    assert search.near_the_top(values, 0.15) == ["a", "d", "f", "b"]  # not c: 15.5% below
    assert search.near_the_top(values, 0.0) == ["a"]


def test_repeat_takes_more_than_12_on_a_plateau_and_fewer_below_a_clear_winner():
    plateau = {str(i): 100.0 - i for i in range(20)}  # 100 down to 81
    assert len(search.near_the_top(plateau, 0.15)) == 16  # 100 to 85
    winner = {"w": 100.0, **{str(i): 80.0 - i for i in range(20)}}
    assert search.near_the_top(winner, 0.15) == ["w"]


def test_repeat_refuses_a_share_out_of_range():
    with pytest.raises(ArgumentError, match="--within must be a share in"):
        search.near_the_top({"a": 1.0}, 1.5)
    assert search.near_the_top({"a": 0.0}, 0.15) == []  # nothing ran: nothing to repeat


def _flat_case(write_space, base_runs, best_runs):
    from autotune import Config, Measurement, load_space

    space = load_space(
        write_space("""
        workload: {workloads}:tiny
        knobs: {batch_size: [8, 32]}
        baseline: {batch_size: 8}
        global_batch: 32
    """)
    )
    best = Config(batch_size=32)

    def row(config, rates):
        runs = [Measurement(status="ok", samples_per_s=r, samples_per_step=32) for r in rates]
        return {
            "config": config.to_dict(),
            "measurement": runs[0].to_dict(),
            "repeats": [
                {"pass": str(i), "measurement": m.to_dict()} for i, m in enumerate(runs[1:])
            ],
        }

    table = {"measurements": [row(space.baseline, base_runs), row(best, best_runs)]}
    return search._flat_text(table, space, best, sorted(best_runs)[len(best_runs) // 2])


def test_a_grid_whose_optimum_is_within_the_noise_of_its_baseline_is_flat(write_space):
    # cnn_grid240's runs: the optimum 2,688, 2,379, 2,633; the baseline 2,427, 2,298, 2,615
    overlap = _flat_case(write_space, [2427, 2298, 2615], [2688, 2379, 2633])
    assert "overlap the baseline's (2,298-2,615)" in overlap
    assert "within 5%" in _flat_case(write_space, [1000, 990, 1010], [1040, 1030, 1045])
    # cnn_amp_grid's: a lead above every baseline run judges
    assert _flat_case(write_space, [988, 914, 828], [1719, 1768, 1698]) == ""


def test_repeat_ranks_a_repeated_config_by_its_median_run():
    """A lucky first run put A on top and kept B out of the first pass; A's repeats pull it
    to its median, so a second pass ranks B by its one run against A's median."""

    def rate(m):
        return m["rate"]

    a = {
        "measurement": {"rate": 150.0},
        "repeats": [{"measurement": {"rate": 110.0}}, {"measurement": {"rate": 99.0}}],
    }
    b = {"measurement": {"rate": 123.0}}
    assert search.standing(a, rate) == 110.0  # the median of 150, 110, 99
    assert search.standing(b, rate) == 123.0
    even = {"measurement": {"rate": 10.0}, "repeats": [{"measurement": {"rate": 20.0}}]}
    assert search.standing(even, rate) == 10.0  # the lower middle: a run that happened
    assert search.near_the_top({"a": 110.0, "b": 123.0}, 0.15) == ["b", "a"]
