"""benchmarks/reproducibility.py's verdict on regret (its studies time real runs: not here)."""

from __future__ import annotations

import importlib.util
import sys

import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
_spec = importlib.util.spec_from_file_location("repro", ROOT / "benchmarks" / "reproducibility.py")
repro = sys.modules["repro_benchmark"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(repro)

# The head-to-head of 2026-12-06 (docs/confirmation.md): ratios to the baseline per round.
BEST = [2.932, 1.547, 2.361, 2.684, 1.391, 2.404]  # bs=32 acc=4 amp=bf16 compile=default
BF16 = [2.506, 1.232, 1.372, 1.377, 1.711, 1.620]  # bs=32 acc=4 amp=bf16
NHWC = [2.248, 1.701, 2.146, 1.793, 1.284, 2.744]  # bs=32 acc=4 amp=bf16 nhwc


def test_the_regret_interval_is_the_sign_tests_on_the_paired_ratios_to_the_best():
    low, high = repro.regret_interval(BEST, BF16)
    # best/ours per round, sorted: 0.813 1.170 1.256 1.484 1.721 1.949: the 2nd and the
    # 5th of six bound the median at 87.5% one-sided.
    assert low == pytest.approx(1 - 1 / (2.932 / 2.506))
    assert high == pytest.approx(1 - 1 / (2.361 / 1.372))
    assert repro.regret_interval(BEST, BEST) == (0.0, 0.0)
    assert repro.regret_interval(BEST, [*BF16[:5], 0.0]) is None  # a failed round


@pytest.mark.parametrize(
    "bounds, verdict",
    [
        ([(0.0, 0.0), (-0.02, 0.03)], "met"),  # at the goal: met
        ([(0.0, 0.0), (-0.02, 0.031)], "unresolved"),  # an interval across the goal
        ([(0.0, 0.0), (0.031, 0.2)], "NOT met"),  # wholly above it
        ([(0.0, 0.0), (-0.1, 0.23), (0.145, 0.42)], "NOT met"),  # 2026-12-06
        ([(0.0, 0.0), None], "unresolved"),  # too few rounds to bound
    ],
)
def test_the_regret_goal_is_met_only_when_every_interval_clears_it(bounds, verdict):
    assert repro.verdict(bounds) == verdict
