"""A token workload's rate over a whole epoch, from a short window and every batch's shape.

A trial times a window of a few steps, but the width of a padded batch is set by its
longest sample: a window of 15 steps under- or over-samples the length tail, and with
length grouping (mega-batches sorted longest first) it sits in one part of the sort. The
window's rate then is not the run's (``autotune verify`` saw +8.7% on
``search_spaces/text.yaml``).

So, for token workloads batched by autotune's own collate (padded or packed), the trial
fits each window step's time against its padded positions (``time = a + b x
positions``), computes the shape of every optimizer step of one epoch of the trial's own
sample stream from the samples' lengths (no data is loaded), and scales the window's
time by the fitted time of the epoch's mean step over that of the window's: the rates
are the epoch's, anchored to what the window measured. Recorded as
:attr:`~autotune.measurement.Measurement.epoch_scale`, with the window's own rate.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .tokens import IsolatedCollate, PackCollate, TokenCollate, first_fit

# The epoch's shapes are computed for at most this many optimizer steps (a larger dataset's
# first EPOCH_STEPS steps stand for its epoch).
EPOCH_STEPS = 5000


@dataclass(frozen=True)
class Shape:
    """One optimizer step's padded positions and real tokens."""

    positions: int
    real: int


def micro_batch_shape(collate: Any, lengths: Sequence[int]) -> Shape | None:
    """The shape the collate gives a micro-batch of samples of these lengths; ``None``
    for a collate this does not know (the workload's own)."""
    real = sum(lengths)
    if isinstance(collate, IsolatedCollate):
        if collate.flat:  # one row of every sample
            return Shape(real, real)
        width = max([collate.length, *lengths])
        return Shape(len(first_fit(list(lengths), width)) * width, real)
    if isinstance(collate, PackCollate):
        rows = math.ceil((real + len(lengths)) / collate.length)  # each sample + its EOS
        return Shape(rows * collate.length, real)
    if isinstance(collate, TokenCollate):
        width = math.ceil(max(lengths) / collate.multiple) * collate.multiple
        return Shape(len(lengths) * width, real)
    return None


def epoch_shapes(
    stream: Iterable[int],
    lengths: Sequence[int],
    collate: Any,
    batch_size: int,
    accumulation_steps: int,
    steps: int,
) -> list[Shape] | None:
    """The shapes of the first ``steps`` optimizer steps of ``stream`` (sample indices, as
    the loader's sampler yields them), batched as the DataLoader does (``drop_last``)."""
    indices = iter(stream)
    out = []
    for _ in range(steps):
        positions = real = 0
        for _ in range(accumulation_steps):
            batch = list(itertools.islice(indices, batch_size))
            if len(batch) < batch_size:
                return out or None
            shape = micro_batch_shape(collate, [lengths[i] for i in batch])
            if shape is None:
                return None
            positions, real = positions + shape.positions, real + shape.real
        out.append(Shape(positions, real))
    return out


def fit(times: Sequence[float], positions: Sequence[int]) -> tuple[float, float] | None:
    """``(a, b)`` of ``time = a + b x positions`` by least squares over the steps, the
    steps slower than three times the median left out (a recompile, a hiccup); with
    ``a >= 0`` and ``b >= 0`` (``a = 0``: time proportional to positions, when the free
    fit's intercept is negative). ``None`` when fewer than 4 steps remain or their
    positions hardly differ (under 5% of their mean): the window cannot tell the cost of
    a position from a step's."""
    cut = 3 * statistics.median(times)
    pairs = [(p, t) for t, p in zip(times, positions, strict=True) if t <= cut]
    if len(pairs) < 4:
        return None
    ps, ts = [float(p) for p, _ in pairs], [t for _, t in pairs]
    mean_p, mean_t = statistics.fmean(ps), statistics.fmean(ts)
    if mean_p <= 0 or statistics.pstdev(ps) < 0.05 * mean_p:
        return None
    sxx = sum((p - mean_p) ** 2 for p in ps)
    b = sum((p - mean_p) * (t - mean_t) for p, t in zip(ps, ts, strict=True)) / sxx
    a = mean_t - b * mean_p
    if b < 0:  # noise: a step's time does not fall with its size
        return mean_t, 0.0
    if a < 0:
        return 0.0, sum(ts) / sum(ps)
    return a, b


@dataclass(frozen=True)
class EpochScale:
    """How the window's figures become the epoch's: ``time`` multiplies the window's
    time, ``real_per_step`` and ``positions_per_step`` are the epoch's means."""

    time: float
    real_per_step: float
    positions_per_step: float
    steps: int


def epoch_scale(
    window_times: Sequence[float], window_positions: Sequence[int], epoch: Sequence[Shape]
) -> EpochScale | None:
    """The epoch's mean step over the window's, through :func:`fit`; ``None`` without a
    fit or an epoch."""
    found = fit(window_times, window_positions) if epoch else None
    if found is None:
        return None
    a, b = found
    window = a + b * statistics.fmean(window_positions)
    mean_positions = statistics.fmean(s.positions for s in epoch)
    if window <= 0:
        return None
    return EpochScale(
        time=(a + b * mean_positions) / window,
        real_per_step=statistics.fmean(s.real for s in epoch),
        positions_per_step=mean_positions,
        steps=len(epoch),
    )
