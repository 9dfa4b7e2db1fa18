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
