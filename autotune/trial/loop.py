"""The measured run of a trial: warm-up steps untimed, then the timed window.

Throughput is steady-state: data loading included, warm-up (and compile) excluded and
reported apart. During the window the process reports its progress to a file the driver
reads, so a hopeless trial can be stopped (pruned) without waiting for the end.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..config import Config
from ..measurement import NAN, OK, TOKENS, Measurement, compile_estimate_s
from ..trial_spec import TrialSpec, steps_to_run
from ..workload import Workload
from .apply import StreamSampler
from .baton import BATON, own_time
from .build import Built
from .clock import StepClock, peak_memory, reset_peak_memory, spread
from .epoch import EPOCH_STEPS, EpochScale, epoch_scale, epoch_shapes
from .guard import RANK, WORLD
from .telemetry import open_window
from .tokens import dataset_lengths, longest_indices


def measure(built: Built, progress_path: str | None = None, *, started: float) -> Measurement:
    """Warm-up steps untimed, then the timed window (progress reported to ``progress_path``).

    ``started`` is the ``time.perf_counter()`` reading at process start: the fixed cost
    of the trial (imports, build) is reported as ``startup_s``. For a token workload one
    untimed forward and backward of the dataset's longest samples runs between warm-up
    and window (``trial.longest_batch``), so the peak memory covers the longest batch.
    """
    startup_s = own_time() - started  # not an interleaved run's wait for its first turn
    compiles = Compiles(built.config.compile_mode != "off")
    losses: list[torch.Tensor] = []
    warm = _warm_up(built, compiles, losses)
    window = _time_window(built, compiles, warm, losses, progress_path)
    m = _measurement(built, compiles, warm, window, torch.stack(losses), startup_s)
    return with_finite_losses(m)


@dataclass
class _WarmUp:
    """The untimed steps before the window: their clock and count, the memory peaks
    (after the warm-up; after the longest batch's step, when one ran), and the longest
    batch's length and seconds."""

    clock: StepClock
    steps: int
    peaks: list[dict[str, Any]]
    longest: int | None = None
    longest_s: float | None = None


def run_phase(
    step: Callable[[], None],
    min_steps: int,
    min_s: float,
    elapsed_s: Callable[[], float],
    device: torch.device,
) -> int:
    """Run ``step`` ``min_steps`` times and, with ``min_s``, on until ``elapsed_s()`` is at
    least ``min_s`` (at most ``MAX_STEPS_FACTOR`` times the steps:
    :func:`autotune.trial_spec.steps_to_run`); the steps it ran. The time is asked only
    when the steps are done and at each extension's end, and under DDP the ranks take the
    largest extension, so that every rank runs the same steps."""
    done, target = 0, min_steps
    while True:
        while done < target:
            step()
            done += 1
        if min_s <= 0:
            return done
        target = _agreed(steps_to_run(done, elapsed_s(), min_steps, min_s), device)
        if target <= done:
            return done


def run_warm_up(step: Callable[[], None], spec: TrialSpec, device: torch.device) -> int:
    """The warm-up's steps: ``warmup_steps``, on past them until the steps after the first
    (which holds compile and start-up) took ``min_warmup_s``; the steps it ran. The time
    extends a warm-up, never makes one: none with ``warmup_steps: 0``."""
    if spec.warmup_steps <= 0:
        return 0
    step()
    after_first = StepClock(device)
    after_first.start()
    rest = spec.warmup_steps - 1
    return 1 + run_phase(step, rest, spec.min_warmup_s, after_first.elapsed_s, device)


def _agreed(steps: int, device: torch.device) -> int:
    """The most steps any rank asks for (the ranks' collectives need the same count)."""
    if WORLD == 1:
        return steps
    import torch.distributed as dist

    most = torch.tensor([steps], dtype=torch.int64, device=device)
    dist.all_reduce(most, op=dist.ReduceOp.MAX)
    return int(most.item())


def _warm_up(built: Built, compiles: Compiles, losses: list[torch.Tensor]) -> _WarmUp:
    """The warm-up steps, untimed (compile happens there), on past them until the steps
    after the first (which holds compile and start-up) took ``min_warmup_s``; then for a
    token workload one step of the dataset's longest samples (``longest_batch``); the
    peak memory is reset for the window."""
    spec, device, applied = built.spec, built.device, built.applied
    reset_peak_memory(device)
    clock = StepClock(device)

    def step() -> None:
        losses.append(applied.train_step(built.batches))
        compiles.first_step_done()  # noted after the first step only

    clock.start()
    steps = run_warm_up(step, built.spec, device)
    clock.stop()
    warm = _WarmUp(clock, steps, [peak_memory(device)])
    if built.workload.tokens is not None and spec.longest_batch:
        reset_peak_memory(device)
        began = time.perf_counter()
        warm.longest = _longest_batch_step(built)
        warm.peaks.append(peak_memory(device))
        if device.type == "cuda":  # its kernels are queued: its time is until they finish
            torch.cuda.synchronize(device)
        warm.longest_s = time.perf_counter() - began
    if warm.steps == 0:
        compiles.first_step_done()
    reset_peak_memory(device)
    return warm


@dataclass(frozen=True)
class _Counts:
    """The running counts of an :class:`Applied` that a window takes the difference of."""

    real: float  # real tokens
    positions: int  # token positions, padding included
    padding: int
    waited_s: float  # the step's wait on the loader

    @classmethod
    def of(cls, applied: Any) -> _Counts:
        return cls(applied.real_tokens, applied.positions, applied.padding, applied.data_wait_s)

    def since(self, before: _Counts) -> _Counts:
        return _Counts(
            self.real - before.real,
            self.positions - before.positions,
            self.padding - before.padding,
            self.waited_s - before.waited_s,
        )


@dataclass
class _Window:
    """The timed window: its clock and steps, each step's cumulative padded positions,
    the batches' arrivals and the loader's queue at both ends, the counts taken over it,
    the recompiles' seconds inside it, its telemetry and its memory peak."""

    clock: StepClock
    steps: int
    step_positions: list[int]
    arrivals: _Arrivals
    queued: tuple[int | None, int | None]
    counts: _Counts
    recompile_s: float
    telemetry: Any
    peak: dict[str, Any]


def _time_window(
    built: Built,
    compiles: Compiles,
    warm: _WarmUp,
    losses: list[torch.Tensor],
    progress_path: str | None,
) -> _Window:
    """The measured steps, timed, their progress written for the pruner."""
    applied, batches, device = built.applied, built.batches, built.device
    before = _Counts.of(applied)
    compiled_before = compiles.spent_s()
    progress = _progress(built, compiles, warm, progress_path, before.real, compiled_before)
    queued_before = ready_batches(batches)
    arrivals = _Arrivals(batches, counted=queued_before is not None)
    step_positions = [applied.positions]
    clock = StepClock(device)

    def step() -> None:
        if BATON.due():  # an interleaved run: the next process's turn, then ours again
            BATON.hand_back(device)
            before_s = BATON.waited_s
            BATON.take()
            clock.waited(BATON.waited_s - before_s)
        losses.append(applied.train_step(arrivals))
        clock.mark()
        step_positions.append(applied.positions)
        progress.update(clock)

    def elapsed_s() -> float:  # a recompile's time is taken out of the window: not counted
        return clock.elapsed_s() - (compiles.spent_s() - compiled_before)

    spec = built.spec
    telemetry = open_window(device)  # NVML, /proc and RAPL over the window: docs/energy.md
    clock.start()
    steps = run_phase(step, spec.measured_steps, spec.min_window_s, elapsed_s, device)
    clock.stop()
    telemetry.close()
    queued = (queued_before, ready_batches(batches))
    # A recompile in the window (a new batch length) is a one-off cost like the first
    # compile: taken out of the steady-state window, added to compile_s.
    recompile_s = compiles.spent_s() - compiled_before
    if recompile_s >= clock.window_s:  # cannot be: keep the window as measured
        recompile_s = 0.0
    counts = _Counts.of(applied).since(before)
    peak = peak_memory(device)
    return _Window(
        clock, steps, step_positions, arrivals, queued, counts, recompile_s, telemetry, peak
    )


def _progress(
    built: Built,
    compiles: Compiles,
    warm: _WarmUp,
    progress_path: str | None,
    tokens_before: float,
    compiled_before: float,
) -> Progress:
    """The window's progress report (rank 0's): the warm-up's seconds, the compile's
    (``None`` for TorchScript: the pruner estimates it from the warm-up), tokens so far."""
    applied, config = built.applied, built.config
    compile_s: float | None = 0.0
    if compiles.enabled:
        compile_s = compiled_before
    elif config.jit != "off":
        compile_s = None
    counted = counts_tokens(built.workload)
    return Progress(
        progress_path if RANK == 0 else None,
        warm.clock.window_s,
        compile_s,
        config.global_batch,
        (lambda: applied.real_tokens - tokens_before) if counted else None,
        (lambda: compiles.spent_s() - compiled_before) if compiles.enabled else None,
        warmup_steps=warm.steps,
        min_window_s=built.spec.min_window_s,
    )


@dataclass(frozen=True)
class _Pace:
    """What the loader made in the window (:func:`window_drain`, :func:`loader_paced`):
    the share of the window's micro-batches it produced, the seconds the rates divide by."""

    produced: float
    rated_s: float
    drained: int | None
    paced: tuple[int, float] | None


def _pace(built: Built, window: _Window, window_s: float) -> _Pace:
    micro = window.steps * built.config.accumulation_steps
    drained = window_drain(*window.queued, micro)
    produced = (micro - (drained or 0)) / micro  # of the window's micro-batches
    paced = None
    if window.recompile_s == 0.0:
        paced = loader_paced(window.arrivals.times, built.applied.loader.num_workers, micro)
    if paced is not None:  # the loader's pace between two waits on its empty queue
        return _Pace(1.0, micro * paced[1] / paced[0], drained, paced)
    return _Pace(produced, window_s, drained, None)


def _peaks(peaks: list[dict[str, Any]]) -> dict[str, Any]:
    """Peaks are the largest of the phases; counters (allocator retries) are cumulative."""
    memory = dict(peaks[-1])
    for key in ("peak_mem_bytes", "peak_allocated_bytes"):
        if key in memory:
            memory[key] = max(p[key] for p in peaks)
    return memory


def _measurement(
    built: Built,
    compiles: Compiles,
    warm: _WarmUp,
    window: _Window,
    losses: torch.Tensor,
    startup_s: float,
) -> Measurement:
    """The trial's measurement from its warm-up and window: rates over the loader's
    pace and, for a token workload, scaled to the epoch's mean step; under DDP the
    global view (mean loss, slowest rank's window, largest memory peak)."""
    config, workload, steps = built.config, built.workload, window.steps
    window_s, warmup_s = window.clock.window_s - window.recompile_s, warm.clock.window_s
    memory = _peaks([*warm.peaks, window.peak])
    pace = _pace(built, window, window_s)
    rated_s, c = pace.rated_s, window.counts
    counts = [c.real * pace.produced, c.positions, c.padding]
    if WORLD > 1:
        losses, (window_s, rated_s, warmup_s), memory["peak_mem_bytes"], counts = _reduce_ranks(
            losses, [window_s, rated_s, warmup_s], memory["peak_mem_bytes"], counts, built.device
        )
    real, positions, padding = counts
    samples = steps * config.global_batch * pace.produced  # of all ranks
    samples_per_s, tokens_per_s = window_rates(workload, samples, real, rated_s)
    scale = _epoch_scale(built, window.clock.step_times_s(), window.step_positions)
    window_rate = None
    if scale is not None:  # the epoch's mean step, anchored to the window's time
        window_rate = tokens_per_s
        real = steps * scale.real_per_step * pace.produced * WORLD
        samples_per_s, tokens_per_s = window_rates(workload, samples, real, rated_s * scale.time)
    clock_s = window.clock.window_s
    return Measurement(
        status=OK,
        samples_per_s=samples_per_s,
        tokens_per_s=tokens_per_s,
        samples_per_step=config.global_batch,
        unit=TOKENS if workload.tokens is not None else "samples",
        tokens_per_step=real / (steps * pace.produced) if counts_tokens(workload) else None,
        padding_share=padding / positions if positions else None,
        data_share=min(1.0, c.waited_s / clock_s) if clock_s > 0 else None,
        queue_drained=pace.drained,
        paced_batches=pace.paced[0] if pace.paced is not None else None,
        paced_s=pace.paced[1] if pace.paced is not None else None,
        epoch_scale=scale.time if scale is not None else None,
        window_rate=window_rate,
        peak_longest_bytes=warm.peaks[1]["peak_mem_bytes"] if warm.longest is not None else None,
        longest_batch_tokens=warm.longest,
        longest_s=warm.longest_s,
        measured_steps=steps,
        window_s=window_s,
        warmup_s=warmup_s,
        compile_s=compile_seconds(compiles, config, warmup_s, warm.steps, window_s / steps),
        startup_s=startup_s,
        skipped_steps=built.applied.skipped_steps,
        losses=[float(x) for x in losses.cpu().tolist()],
        **compiles.summary(),
        **spread(window.clock.step_times_s()),
        **memory,
        **window.telemetry.fields(samples_per_s, tokens_per_s, WORLD),
    )


def with_finite_losses(m: Measurement) -> Measurement:
    """``m``, or ``m`` with status ``nan`` and the first step whose loss is NaN or Inf."""
    bad = next((i for i, x in enumerate(m.losses) if not math.isfinite(x)), None)
    if bad is None:
        return m
    return m.replace(status=NAN, reason=f"loss is {m.losses[bad]} at step {bad}")


def _epoch_scale(built: Built, times: list[float], cumulative: list[int]) -> EpochScale | None:
    """The epoch's mean step over the window's (:mod:`autotune.trial.epoch`), for a token
    workload batched by autotune's collate from the trial's stream of samples."""
    applied, lengths = built.applied, built.lengths
    sampler = applied.loader.sampler
    if built.workload.tokens is None or not lengths or not isinstance(sampler, StreamSampler):
        return None
    config = built.config
    steps = min(EPOCH_STEPS, len(lengths) // config.global_batch)
    shapes = epoch_shapes(
        iter(sampler),
        lengths,
        applied.loader.collate_fn,
        config.batch_size,
        config.accumulation_steps,
        steps,
    )
    positions = [b - a for a, b in itertools.pairwise(cumulative)]
    return epoch_scale(times, positions, shapes) if shapes else None


def ready_batches(batches: Any) -> int | None:
    """Micro-batches the DataLoader's workers have finished that the step has not taken
    yet: its results queue, the pinning thread's queue and results that came back out of
    order. ``None`` for a loader without workers, or where a queue cannot be counted."""
    results = getattr(batches, "_worker_result_queue", None)
    if results is None:
        return None
    queues = {id(q): q for q in (results, getattr(batches, "_data_queue", None)) if q is not None}
    try:
        ready = sum(q.qsize() for q in queues.values())
    except (NotImplementedError, OSError):  # macOS cannot count a multiprocessing queue
        return None
    info = getattr(batches, "_task_info", {})
    return ready + sum(1 for v in info.values() if len(v) == 2)


def window_drain(before: int | None, after: int | None, micro_batches: int) -> int | None:
    """Micro-batches the window took from the workers' queue beyond what they made in it.

    A loader with workers starts the window with its queue holding up to ``num_workers x
    prefetch_factor`` finished batches. A step faster than the loader takes them for free
    and the window's rate overstates the loader's (up to ~13% over a short window, more
    with many workers). Counting only what the loader made during the window, the taken
    batches less the queue's net drain, is the steady rate whatever the window's length:
    the consumer's when it keeps up, the loader's when it does not. ``None`` when the queue
    cannot be read (no workers)."""
    if before is None or after is None:
        return None
    return min(max(0, before - after), micro_batches - 1)


class _Arrivals:
    """The window's batch iterator: notes, for each micro-batch, when it came and whether
    the loader's queue was empty when the step asked for it (the step waited for a
    worker). Without workers nothing is noted."""

    def __init__(self, batches: Any, counted: bool) -> None:
        self.batches = batches
        self.counted = counted  # the queue can be read (:func:`ready_batches`)
        self.times: list[tuple[float, bool]] = []

    def __iter__(self) -> _Arrivals:
        return self

    def __next__(self) -> Any:
        if not self.counted:
            return next(self.batches)
        empty = ready_batches(self.batches) == 0
        batch = next(self.batches)
        self.times.append((own_time(), empty))
        return batch


def loader_paced(
    arrivals: list[tuple[float, bool]], workers: int, micro_batches: int
) -> tuple[int, float] | None:
    """Micro-batches, and seconds, between the window's first and last batch that a step
    waited for on an empty queue, when they span at least half the window.

    A data-bound window opens with the workers' next batches part-made (the slow warm-up
    step gave them a head start): its first batches come sooner than the loader's pace,
    and a short window overstates the rate (a median 2-4% over 10 steps against 40 in
    ``benchmarks/window_length.py``, single rounds up to 13%). Between two
    batches that arrived on an empty queue, each the moment a worker finished it, the
    loader made exactly the batches taken in between: the queue is empty at both ends.
    The last one is of the same worker as the first (a multiple of ``workers`` later:
    the DataLoader hands batches out in turn), so the other workers are as far into
    theirs as at the start. ``None`` when the window was not data-bound enough to have
    two such batches half a window apart: its rate is then the step's, counted with the
    queue's drain (:func:`window_drain`)."""
    waited = [i for i, (_, empty) in enumerate(arrivals) if empty]
    if not waited:
        return None
    first = waited[0]
    last = max(i for i in waited if (i - first) % max(workers, 1) == 0)
    if last - first < max(1, micro_batches // 2):
        return None
    return last - first, arrivals[last][0] - arrivals[first][0]


def counts_tokens(workload: Workload) -> bool:
    """Whether a workload's real tokens are counted batch by batch (token workloads, or a
    ``count_tokens``)."""
    return workload.tokens is not None or workload.count_tokens is not None


def window_rates(
    workload: Workload, samples: int, real_tokens: int, window_s: float
) -> tuple[float, float | None]:
    """samples/s and tokens/s of a timed window: real tokens where they are counted, else
    ``tokens_per_sample`` times samples/s for a fixed-length LM, else no tokens/s."""
    samples_per_s = samples / window_s
    if counts_tokens(workload):
        return samples_per_s, real_tokens / window_s
    if workload.tokens_per_sample:
        return samples_per_s, samples_per_s * workload.tokens_per_sample
    return samples_per_s, None


def compile_seconds(
    compiles: Compiles, config: Config, warmup_s: float, warmup_steps: int, step_s: float
) -> float | None:
    """Seconds spent compiling: torch.compile's own counters (every compile of the trial,
    recompiles in the window included); for TorchScript the warm-up's excess over
    steady-state steps; ``None`` for an eager config."""
    if compiles.enabled:
        return compiles.spent_s()
    if config.jit != "off":
        return compile_estimate_s(warmup_s, warmup_steps, step_s)
    return None


def _longest_batch_step(built: Built) -> int:
    """One forward and backward (no optimizer step, RNG state kept) of a micro-batch of
    the dataset's longest samples, collated as the loader does; returns its length."""
    applied, tokens = built.applied, built.workload.tokens
    loader = applied.loader
    lengths = built.lengths or dataset_lengths(loader.dataset, tokens)
    indices = longest_indices(lengths, built.config.batch_size)
    batch = loader.collate_fn([loader.dataset[i] for i in indices])
    devices = [built.device] if built.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        applied.forward_backward(batch)
    ids = batch.get("input_ids") if isinstance(batch, dict) else None
    return int(ids.shape[-1]) if isinstance(ids, torch.Tensor) else max(lengths[i] for i in indices)


class Compiles:
    """Graphs torch.compile built, and those (and the time) after the first step:
    recompiles for new shapes, read from dynamo's own counters."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.after_first: tuple[int, float] | None = None

    @staticmethod
    def _read() -> tuple[int, float]:
        from torch._dynamo import utils

        graphs = int(utils.counters["stats"].get("unique_graphs", 0))
        spent = utils.calculate_time_spent().get("total_wall_time", 0.0)
        return graphs, float(spent)

    def spent_s(self) -> float:
        """Seconds dynamo has spent compiling in this process so far (0 without compile)."""
        return self._read()[1] if self.enabled else 0.0

    def first_step_done(self) -> None:
        if self.enabled and self.after_first is None:
            self.after_first = self._read()

    def summary(self) -> dict[str, float | int | None]:
        if not self.enabled or self.after_first is None:
            return {}
        graphs, spent = self._read()
        return {
            "graphs": graphs,
            "recompiles": graphs - self.after_first[0],
            "recompile_s": max(0.0, spent - self.after_first[1]),
        }


def _reduce_ranks(
    losses: torch.Tensor,
    times: list[float],
    peak: int,
    counts: list[int],
    device: torch.device,
) -> tuple[torch.Tensor, list[float], int, list[int]]:
    """The mean loss, the slowest rank's ``times``, the largest peak and the summed counts."""
    import torch.distributed as dist

    losses = losses.clone()
    dist.all_reduce(losses)
    losses /= WORLD
    worst = torch.tensor([*times, float(peak)], dtype=torch.float64, device=device)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    *times, peak_f = worst.tolist()
    summed = torch.tensor(counts, dtype=torch.float64, device=device)
    dist.all_reduce(summed)  # token counts of all ranks
    return losses, times, int(peak_f), [int(x) for x in summed.tolist()]


def write_json(path: Path, payload: dict) -> None:
    """Write ``payload`` so that a reader never sees half a file (write, then rename)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(payload, indent=1))
    os.replace(tmp, path)


class Progress:
    """Tells the driver how the measured window is going, so it can stop a hopeless trial.

    Written at most every ``every_s`` seconds; never forces a device sync.
    """

    def __init__(
        self,
        path: str | None,
        warmup_s: float,
        compile_s: float | None,
        samples_per_step: int,
        tokens_so_far: Callable[[], int] | None = None,
        compiling_s: Callable[[], float] | None = None,
        every_s: float = 0.2,
        *,
        warmup_steps: int,
        min_window_s: float,
    ) -> None:
        self.path = Path(path) if path else None
        self.base = {
            "warmup_s": warmup_s,
            "warmup_steps": warmup_steps,  # run: the warm-up may go on past its steps
            "min_window_s": min_window_s,  # the window's length in time, when it goes on
            "compile_s": compile_s,  # None: the pruner estimates it from the warm-up
            "samples_per_step": samples_per_step,
            "unit": TOKENS if tokens_so_far else "samples",
        }
        self.tokens_so_far = tokens_so_far
        self.compiling_s = compiling_s
        self.every_s = every_s
        self.last = 0.0
        self.marks = 0

    def update(self, clock: StepClock) -> None:
        self.marks += 1
        now = time.perf_counter()
        if self.path is None or now - self.last < self.every_s:
            return
        self.last = now
        steps, elapsed_s = clock.progress()
        if self.compiling_s is not None:  # recompiles are not judged, like the first compile
            elapsed_s -= self.compiling_s()
        payload = {**self.base, "steps": steps, "elapsed_s": elapsed_s}
        if self.tokens_so_far is not None:  # counted on the host for the marked steps
            payload["per_step"] = self.tokens_so_far() / self.marks
        write_json(self.path, payload)
