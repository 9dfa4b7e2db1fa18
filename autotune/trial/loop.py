"""The measured run of a trial: warm-up steps untimed, then the timed window.

Throughput is steady-state: data loading included, warm-up (and compile) excluded and
reported apart. During the window the process reports its progress to a file the driver
reads, so a hopeless trial can be stopped (pruned) without waiting for the end.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import torch

from ..measurement import NAN, OK, Measurement, compile_estimate_s
from .build import Built
from .clock import StepClock, peak_memory, reset_peak_memory, spread
from .guard import RANK, WORLD


def measure(built: Built, progress_path: str | None = None, *, started: float) -> Measurement:
    """Warm-up steps untimed, then the timed window (progress reported to ``progress_path``).

    ``started`` is the ``time.perf_counter()`` reading at process start: the fixed cost
    of the trial (imports, build) is reported as ``startup_s``.
    """
    config, trial, device = built.config, built.trial, built.device
    workload, applied, batches = built.workload, built.applied, built.batches
    startup_s = time.perf_counter() - started
    reset_peak_memory(device)

    losses: list[torch.Tensor] = []
    warmup = StepClock(device)
    warmup.start()
    for _ in range(int(trial["warmup_steps"])):
        losses.append(applied.train_step(batches))
    warmup.stop()

    progress = _Progress(progress_path if RANK == 0 else None, warmup.window_s, config.global_batch)
    clock = StepClock(device)
    clock.start()
    for _ in range(int(trial["measured_steps"])):
        losses.append(applied.train_step(batches))
        clock.mark()
        progress.update(clock)
    clock.stop()

    stacked = torch.stack(losses)
    window_s, warmup_s = clock.window_s, warmup.window_s
    memory = peak_memory(device)
    if WORLD > 1:  # global view: mean loss, slowest rank's window, largest memory peak
        stacked, window_s, warmup_s, memory["peak_mem_bytes"] = _reduce_ranks(
            stacked, window_s, warmup_s, memory["peak_mem_bytes"], device
        )
    values = [float(x) for x in stacked.cpu().tolist()]
    per_step = config.global_batch  # samples of all ranks
    steps = int(trial["measured_steps"])
    samples_per_s = steps * per_step / window_s
    m = Measurement(
        status=OK,
        samples_per_s=samples_per_s,
        tokens_per_s=samples_per_s * workload.tokens_per_sample
        if workload.tokens_per_sample
        else None,
        samples_per_step=per_step,
        measured_steps=steps,
        window_s=window_s,
        warmup_s=warmup_s,
        compile_s=compile_estimate_s(warmup_s, int(trial["warmup_steps"]), window_s / steps),
        startup_s=startup_s,
        skipped_steps=applied.skipped_steps,
        losses=values,
        **spread(clock.step_times_s()),
        **memory,
    )
    if not all(math.isfinite(x) for x in values):
        first = next(i for i, x in enumerate(values) if not math.isfinite(x))
        return m.replace(status=NAN, reason=f"loss is {values[first]} at step {first}")
    return m


def _reduce_ranks(
    losses: torch.Tensor, window_s: float, warmup_s: float, peak: int, device: torch.device
) -> tuple[torch.Tensor, float, float, int]:
    import torch.distributed as dist

    losses = losses.clone()
    dist.all_reduce(losses)
    losses /= WORLD
    worst = torch.tensor([window_s, warmup_s, float(peak)], dtype=torch.float64, device=device)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    window_s, warmup_s, peak_f = worst.tolist()
    return losses, window_s, warmup_s, int(peak_f)


def write_json(path: Path, payload: dict) -> None:
    """Write ``payload`` so that a reader never sees half a file (write, then rename)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(payload, indent=1))
    os.replace(tmp, path)


class _Progress:
    """Tells the driver how the measured window is going, so it can stop a hopeless trial.

    Written at most every ``every_s`` seconds; never forces a device sync.
    """

    def __init__(
        self, path: str | None, warmup_s: float, samples_per_step: int, every_s: float = 0.2
    ) -> None:
        self.path = Path(path) if path else None
        self.base = {"warmup_s": warmup_s, "samples_per_step": samples_per_step}
        self.every_s = every_s
        self.last = 0.0

    def update(self, clock: StepClock) -> None:
        now = time.perf_counter()
        if self.path is None or now - self.last < self.every_s:
            return
        self.last = now
        steps, elapsed_s = clock.progress()
        write_json(self.path, {**self.base, "steps": steps, "elapsed_s": elapsed_s})
