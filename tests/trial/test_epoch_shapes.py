"""A token workload's rate over the epoch: the batches' shapes from the samples' lengths,
the window's time fitted against its steps' positions (autotune/trial/epoch.py)."""

from __future__ import annotations

import pytest

from autotune.trial.epoch import Shape, epoch_scale, epoch_shapes, fit, micro_batch_shape
from autotune.trial.tokens import IsolatedCollate, PackCollate, TokenCollate


def test_a_micro_batch_is_as_wide_as_its_longest_sample_or_as_many_rows_as_it_fills():
    assert micro_batch_shape(TokenCollate(0), [3, 10, 5]) == Shape(30, 18)
    assert micro_batch_shape(TokenCollate(0, pad_to_multiple_of=8), [3, 10, 5]) == Shape(48, 18)
    # packed: each sample and its EOS, in rows of 8: 4+11+6 = 21 tokens fill 3 rows
    assert micro_batch_shape(PackCollate(0, 1, 8), [3, 10, 5]) == Shape(24, 18)
    assert micro_batch_shape(lambda samples: samples, [3, 10]) is None  # the workload's own


def test_the_collates_make_the_shapes_computed_without_data():
    samples = [list(range(1, n + 1)) for n in (3, 10, 5)]
    collates = (
        TokenCollate(0),
        TokenCollate(0, 8),
        PackCollate(0, 99, 8),
        IsolatedCollate(0, 12),
        IsolatedCollate(0, 8),  # a sample longer than a row widens the rows
        IsolatedCollate(0, 8, flat=True),
    )
    for collate in collates:
        batch = collate(samples)
        shape = micro_batch_shape(collate, [len(s) for s in samples])
        assert batch["input_ids"].numel() == shape.positions


def test_the_epochs_steps_are_the_streams_micro_batches_in_order():
    lengths = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    # steps of 2 micro-batches of 2 samples; the 9th sample makes no full micro-batch
    shapes = epoch_shapes(iter(range(9)), lengths, TokenCollate(0), 2, 2, steps=5)
    assert shapes == [Shape(2 * 2 + 2 * 4, 1 + 2 + 3 + 4), Shape(2 * 6 + 2 * 8, 5 + 6 + 7 + 8)]
    assert epoch_shapes(iter(range(9)), lengths, lambda s: s, 2, 1, steps=2) is None


def test_the_fit_recovers_a_step_cost_and_a_position_cost_and_leaves_out_a_recompile():
    positions = [100, 200, 300, 400, 500, 600]
    times = [0.01 + 1e-4 * p for p in positions]
    times[2] = 5.0  # a recompile
    a, b = fit(times, positions)
    assert a == pytest.approx(0.01) and b == pytest.approx(1e-4)
    assert fit(times[:4], positions[:4]) is None  # three steps left: too few
    assert fit([0.1] * 6, [100, 101, 100, 102, 100, 101]) is None  # one shape: no slope
    assert fit([0.03, 0.04, 0.05, 0.06], [100, 200, 300, 400])[0] == pytest.approx(0.02)
    # a negative intercept from noise: time proportional to positions
    assert fit([0.009, 0.021, 0.03, 0.04], [100, 200, 300, 400]) == (0.0, pytest.approx(1e-4))


def test_the_epoch_scale_is_the_fitted_epoch_step_over_the_windows():
    positions = [400, 500, 600, 700]  # a window of the longest batches
    times = [0.01 + 1e-4 * p for p in positions]
    epoch = [Shape(100, 80), Shape(300, 200), Shape(550, 400)]
    scale = epoch_scale(times, positions, epoch)
    window = 0.01 + 1e-4 * 550
    assert scale.time == pytest.approx((0.01 + 1e-4 * 316.6667) / window, rel=1e-4)
    assert scale.real_per_step == pytest.approx(680 / 3) and scale.steps == 3
    assert epoch_scale(times, positions, []) is None
