"""The sign test's interval and the decisions read from it (autotune/decisions.py)."""

from __future__ import annotations

import math

import pytest

from autotune.decisions import (
    FLOOR_CAP,
    PROVEN,
    UNRESOLVED,
    WITHIN,
    Decision,
    bound_rank,
    decide,
    interval,
    margin,
    noise_floor,
    paired_floor,
)


def _below(n: int, k: int) -> float:
    """P(Bin(n, 1/2) <= k - 1): the chance that the k-th smallest of n values lies above
    the true median (the bound fails)."""
    return sum(math.comb(n, j) for j in range(k)) / 2**n


@pytest.mark.parametrize("n", range(1, 16))
def test_the_bound_is_the_highest_rank_whose_error_is_at_most_one_eighth(n):
    k = bound_rank(n)
    if k:
        assert _below(n, k) <= 0.125
    assert _below(n, k + 1) > 0.125  # one rank further in would claim too much


def test_known_ranks():
    # 3 rounds: all three on a side (1/8); 6 rounds: one may fall on the wrong side.
    assert [bound_rank(n) for n in (2, 3, 4, 5, 6, 8, 9, 12)] == [0, 1, 1, 1, 2, 2, 3, 4]


def test_the_interval_and_the_decisions():
    assert interval([1.2, 1.0]) is None  # two rounds bound nothing at 87.5%
    assert interval([1.3, 1.1, 1.2]) == (1.1, 1.3)
    assert interval([1.05, 0.9, 1.06, 1.04, 1.07, 1.05]) == (1.04, 1.06)
    assert decide([1.10, 1.08, 1.09], 1.03) == PROVEN
    assert decide([1.00, 0.98, 1.01], 1.03) == WITHIN
    assert decide([1.10, 0.99, 1.08], 1.03) == UNRESOLVED
    assert decide([1.10, 1.09], 1.03) == UNRESOLVED  # too few rounds


def test_the_noise_floor_and_the_margin():
    assert noise_floor([100.0, 88.0, 100.0]) == pytest.approx(0.12)
    assert noise_floor([100.0]) is None
    assert margin(0.03, 0.08) == 0.08 and margin(0.03, 0.01) == 0.03 and margin(0.03, None) == 0.03
    # A floor past FLOOR_CAP (one disturbed run) counts up to it; a larger min_gain stands
    assert margin(0.03, 0.454) == FLOOR_CAP == 0.10 and margin(0.15, 0.454) == 0.15


def test_the_paired_floor_is_the_median_distance_of_the_baseline_from_itself():
    assert paired_floor([1.02, 0.97]) is None  # under 3 rounds
    assert paired_floor([1.02, 0.97, 1.01]) == pytest.approx(0.02)
    # One disturbed round moves the median little; more rounds do not shrink it.
    assert paired_floor([1.02, 0.97, 1.01, 1.45]) == pytest.approx(0.025)
    assert paired_floor([1.02, 0.97, 1.01] * 4) == pytest.approx(0.02)


def test_a_gain_stands_when_proven_or_unresolved_above_the_least_gain():
    # Proven above the margin: stands, with or without a least gain.
    assert Decision((1.12, 1.13, 1.14), 1.10).stands
    # Across the margin (1.10), above the least gain (1.03): stands.
    across = (1.06, 1.12, 1.20)
    assert Decision(across, 1.10).state == "unresolved"
    assert Decision(across, 1.10, 1.03).stands
    assert not Decision(across, 1.10).stands  # no least gain: the simpler side
    # Across the margin and reaching the least gain: does not stand.
    assert not Decision((1.02, 1.12, 1.20), 1.10, 1.03).stands
    # Below the margin though proven above the least gain: a gain smaller than the noise
    # floor, not one too small to want. Unresolved (its rounds go on); it stands at the cap.
    below = (1.05, 1.06, 1.07)
    assert Decision(below, 1.10, 1.03).state == UNRESOLVED
    assert Decision(below, 1.10, 1.03).stands
    assert Decision(across, 1.10, 1.03).to_dict()["stands"] is True


def test_within_noise_is_proven_below_the_least_gain_not_below_the_margin():
    # Issue 41's judge (cpu.yaml, 57735aa), study 1: compile at 0.97-1.09x over 3 rounds
    # under a 9.5% paired floor was dropped as within noise; it was worth 1.03-1.15x.
    compile_ = (0.97, 1.03, 1.09)
    d = Decision(compile_, 1.095, 1.03)
    assert d.state == UNRESOLVED and d.below == 1.03 and not d.stands  # more rounds
    assert Decision((0.97, 1.01, 1.02), 1.095, 1.03).state == WITHIN
    assert decide((0.97, 1.01, 1.02), 1.095, 1.03) == WITHIN
    assert decide(compile_, 1.095, 1.03) == UNRESOLVED
    # Without a least gain (the winner against the baseline) the margin is both bars,
    # and a least gain above the margin never lets WITHIN reach past it.
    assert Decision(compile_, 1.095).state == WITHIN and Decision(compile_, 1.095).below == 1.095
    assert decide((1.05, 1.06, 1.07), 1.04, 1.10) == PROVEN
    assert decide((1.0, 1.02, 1.03), 1.04, 1.10) == WITHIN
