"""Clocks and memory readings for one trial process.

On CUDA, step times come from CUDA events (no per-step host sync) and the window is
bracketed by ``torch.cuda.synchronize()``; on the CPU, the process's own time
(:func:`autotune.trial.baton.own_time`: ``time.perf_counter`` less the waits of an
interleaved run, none otherwise).
"""

from __future__ import annotations

import resource
import statistics
from itertools import pairwise
from pathlib import Path
from typing import Any

import torch

from .baton import own_time


class StepClock:
    """Marks step boundaries; ``step_times_s()`` gives the time between consecutive marks."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._marks: list[Any] = []
        # seconds the process waited for its turn (an interleaved run) within the step
        # that ends at mark i + 1, by i: CUDA events span them, own time does not
        self._gaps: dict[int, float] = {}
        self._start_s = 0.0
        self._end_s = 0.0

    def start(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()
        self._start_s = own_time()
        self.mark()

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self._marks.append(event)
        else:
            self._marks.append(own_time())

    def waited(self, seconds: float) -> None:
        """The process waited ``seconds`` for its turn after the last mark (the device
        idle: :meth:`autotune.trial.baton.Baton.hand_back` synchronized it)."""
        if self.cuda and seconds > 0:
            last = len(self._marks) - 1
            self._gaps[last] = self._gaps.get(last, 0.0) + seconds

    def stop(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()
        self._end_s = own_time()

    def elapsed_s(self) -> float:
        """Wall time since :meth:`start`, device work included (on CUDA a sync: for a
        decision once in a while, not for every step)."""
        if self.cuda:
            torch.cuda.synchronize()
        return own_time() - self._start_s

    def progress(self) -> tuple[int, float]:
        """Steps finished since :meth:`start` and the time they took, without a sync.

        On CUDA this is the last step whose end event the GPU has already reached.
        """
        if not self.cuda:
            return len(self._marks) - 1, self._marks[-1] - self._marks[0]
        for i in range(len(self._marks) - 1, 0, -1):
            if self._marks[i].query():
                waited = sum(s for k, s in self._gaps.items() if k < i)
                return i, self._marks[0].elapsed_time(self._marks[i]) / 1000.0 - waited
        return 0, 0.0

    @property
    def window_s(self) -> float:
        """Wall time from :meth:`start` to :meth:`stop`, device work included."""
        return self._end_s - self._start_s

    def step_times_s(self) -> list[float]:
        # The start mark opens the first step; each later mark closes one step.
        marks = self._marks
        if self.cuda:
            return [
                a.elapsed_time(b) / 1000.0 - self._gaps.get(i, 0.0)
                for i, (a, b) in enumerate(pairwise(marks))
            ]
        return [b - a for a, b in pairwise(marks)]


def spread(times: list[float]) -> dict[str, float]:
    """Median, coefficient of variation and interquartile range of step times."""
    median = statistics.median(times)
    mean = statistics.fmean(times)
    cv = statistics.pstdev(times) / mean if len(times) > 1 and mean > 0 else 0.0
    if len(times) >= 4:
        q = statistics.quantiles(times, n=4)
        iqr = q[2] - q[0]
    else:
        iqr = max(times) - min(times)
    return {"step_time_median_s": median, "step_time_cv": cv, "step_time_iqr_s": iqr}


def _read_status_kib(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def reset_peak_memory(device: torch.device) -> None:
    """Start a fresh peak-memory window."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:  # "5" resets the process's peak RSS (VmHWM) to its current RSS.
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def peak_memory(device: torch.device) -> dict[str, Any]:
    """The peak memory since :func:`reset_peak_memory`.

    ``peak_mem_bytes`` is what the memory limit judges: on CUDA the caching allocator's
    peak *reserved* bytes (what the process really holds), on the CPU the peak RSS of the
    trial process (DataLoader workers not included).
    """
    if device.type == "cuda":
        stats = torch.cuda.memory_stats(device)
        return {
            "peak_mem_bytes": int(torch.cuda.max_memory_reserved(device)),
            "peak_allocated_bytes": int(torch.cuda.max_memory_allocated(device)),
            "alloc_retries": int(stats.get("num_alloc_retries", 0)),
            "device_ooms": int(stats.get("num_ooms", 0)),
            "mem_kind": "cuda_reserved",
        }
    hwm = _read_status_kib("VmHWM")
    if hwm is None:  # not Linux: lifetime peak from getrusage (KiB on Linux, bytes on macOS)
        hwm = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"peak_mem_bytes": int(hwm) * 1024, "mem_kind": "cpu_rss"}
