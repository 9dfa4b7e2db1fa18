"""The timed window counts what the DataLoader made in it, not the batches its workers
had prefetched before it started (issue 27: windows that represent the run)."""

from __future__ import annotations

import time

import pytest
import torch
from workloads import Blobs, _SlowCollate

from autotune import Config, load_space
from autotune.study.runner import run_trial
from autotune.trial.loop import loader_paced, ready_batches, window_drain


def _loader(workers: int) -> torch.utils.data.DataLoader:
    return torch.utils.data.DataLoader(
        torch.arange(64.0),
        batch_size=4,
        num_workers=workers,
        prefetch_factor=2 if workers else None,
    )


def test_the_ready_batches_of_a_loader_with_workers_are_counted():
    it = iter(_loader(2))
    next(it)
    time.sleep(1.0)  # two workers, two batches each: the queue is full long before
    assert ready_batches(it) == 4
    assert ready_batches(iter(_loader(0))) is None  # no workers, no queue
    del it


def test_window_drain():
    assert window_drain(4, 1, 10) == 3  # the window took 3 prefetched batches
    assert window_drain(1, 4, 10) == 0  # the queue filled up: nothing free taken
    assert window_drain(4, 0, 3) == 2  # at least one micro-batch is the loader's own
    assert window_drain(None, 2, 10) is None


def test_the_loader_pace_is_timed_between_two_waits_of_the_same_worker():
    # 2 workers, one batch each 20 ms, in step: the first of each pair waited, the second
    # was ready. The first wait is at 0.010 s (a head start), the pace is 10 ms a batch.
    arrivals = [(0.010, True), (0.011, False)]
    arrivals += [(0.010 + 0.020 * k, True) for k in range(1, 5)]
    arrivals = sorted(arrivals + [(0.011 + 0.020 * k, False) for k in range(1, 5)])
    assert loader_paced(arrivals, workers=2, micro_batches=10) == (8, pytest.approx(0.080))
    # a wait of the other worker last is not an end: its batch is not a whole round later
    odd = [*arrivals[:9], (0.101, True)]
    assert loader_paced(odd, workers=2, micro_batches=10) == (8, pytest.approx(0.080))
    assert loader_paced([(t, False) for t, _ in arrivals], 2, 10) is None  # never waited
    # two waits a quarter of the window apart: too few batches to time the loader's pace
    short = [(t, i in (2, 4)) for i, (t, _) in enumerate(arrivals)]
    assert loader_paced(short, workers=2, micro_batches=10) is None


# A batch's collation: the loader (2 workers) makes one every SECONDS / 2, several times
# a step's time even on a loaded machine (steps of 20-30 ms were seen), so the window is
# data-bound and waits on the loader whatever else runs.
SECONDS = 0.1


def _full_queue(write_space, steps: int):
    """A data-bound workload (2 workers, SECONDS a batch) whose first step sleeps 1 s; a
    warm-up of exactly its step (no minimum time), so the window opens on a full queue."""
    return load_space(
        write_space(f"""
        workload: {{workloads}}:full_queue
        workload_args: {{seconds: {SECONDS}}}
        knobs: {{batch_size: [16], num_workers: [0, 2]}}
        baseline: {{batch_size: 16}}
        global_batch: 16
        trial: {{warmup_steps: 1, measured_steps: {steps}, min_window_s: 0, min_warmup_s: 0}}
    """)
    )


def _loader_pace(batches: int = 16) -> float:
    """Samples/s of the full_queue workload's DataLoader (2 workers, SECONDS a batch of 16)
    drained by a consumer that never waits otherwise, timed here from its first batch."""
    loader = torch.utils.data.DataLoader(
        Blobs(),
        batch_size=16,
        num_workers=2,
        prefetch_factor=2,
        collate_fn=_SlowCollate(SECONDS),
        # spawned, not forked from the test process: a worker forked from a process that
        # had run many tests (threads, frameworks loaded) once died of SIGSEGV here
        multiprocessing_context="spawn",
    )
    it = iter(loader)
    next(it)  # the workers' start-up
    start = time.perf_counter()
    for _ in range(batches):
        next(it)
    elapsed = time.perf_counter() - start
    del it
    return 16 * batches / elapsed


def test_a_data_bound_window_is_rated_at_the_loaders_pace(write_space, tmp_path):
    space = _full_queue(write_space, steps=14)
    m = run_trial(space, Config(batch_size=16, num_workers=2), tmp_path / "w2")
    assert m.ok, m.reason
    # The window took the 4 prefetched batches at once, then waited for each pair of the
    # workers' SECONDS batches: rated between two of those waits, at the loader's pace.
    assert m.paced_batches is not None and m.paced_batches >= 7
    assert m.paced_batches % 2 == 0  # whole rounds of the 2 workers
    assert m.samples_per_s == pytest.approx(16 * m.paced_batches / m.paced_s)
    assert m.samples_per_s <= 1.03 * 2 * 16 / SECONDS  # the loader cannot go faster
    # ... nor is it rated far slower than the same loader drained here, timed apart
    # (its first batches may have been ready: this pace is if anything a little high)
    pace = _loader_pace()
    assert m.samples_per_s >= 0.7 * pace, (m.samples_per_s, pace)


def test_a_window_opening_on_a_full_queue_counts_only_what_the_loader_made(write_space, tmp_path):
    space = _full_queue(write_space, steps=6)
    m = run_trial(space, Config(batch_size=16, num_workers=2), tmp_path / "w2")
    assert m.ok, m.reason
    # The first step slept 1 s while 2 workers filled their 4 batches (SECONDS each); the
    # window's fast steps took them at once, then waited for the rest (how many the
    # workers had made again by the window's end varies).
    assert m.queue_drained >= 1
    assert m.paced_batches is None  # too few waits in 6 steps to time the loader's pace
    made = 6 - m.queue_drained
    assert m.samples_per_s == pytest.approx(made * 16 / m.window_s)
    eager = run_trial(space, Config(batch_size=16), tmp_path / "w0")
    assert eager.queue_drained is None and eager.samples_per_s == pytest.approx(
        6 * 16 / eager.window_s
    )
