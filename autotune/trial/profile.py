"""The profile pass of the trial subprocess: where does one training step's time go?

``python -m autotune.trial SPEC RESULT`` with ``"mode": "profile"`` builds the trial
exactly as a measured trial does, runs the warm-up steps, then ``profile_steps`` steps
under ``torch.profiler``. ``Applied.train_step`` opens the ranges ``autotune.data``,
``autotune.to_device``, ``autotune.forward``, ``autotune.backward`` and
``autotune.optimizer`` while a profiler runs; host waits on the device (``cuda*Synchronize``)
are cut out of the range they happen in and counted apart. The result holds the share of
step time of each part, the top ops with the parts they ran in (a copy in the dataset's
``__getitem__`` runs inside ``autotune.data``: it is data loading, not compute), and the path
of a Chrome trace (``chrome://tracing`` or https://ui.perfetto.dev).

The profiler adds overhead to every op, so shares are approximate and the step time of a
profile is slower than the trial's measured one; compare shares, not absolute times.
"""

from __future__ import annotations

import os
import time
from bisect import bisect_left, bisect_right
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from ..measurement import OK
from .apply import PHASE_PREFIX
from .build import Built

PHASES = ("data", "to_device", "forward", "backward", "optimizer")
# CUDA runtime calls in which the host blocks until the device catches up.
SYNC_CALLS = frozenset(
    {"cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaMemcpy"}
)
# item(), bool(tensor), printing a loss: a read of a tensor's value on the host; one that
# waits on a SYNC_CALL inside it read a device value.
HOST_READS = frozenset({"aten::_local_scalar_dense"})
TOP_OPS = 12
# Where an event outside the five phase ranges ran (the loop between them).
OUTSIDE = "other"


@dataclass(frozen=True)
class Event:
    """One profiler event as plain data (times in microseconds)."""

    name: str
    start_us: float
    end_us: float
    self_us: float
    on_device: bool = False  # a kernel/memcpy on the GPU, not a host-side op

    @property
    def duration_us(self) -> float:
        return self.end_us - self.start_us


def _plain(e: Any) -> Event:
    device_type = str(getattr(e, "device_type", "")).rsplit(".", 1)[-1]
    on_device = device_type not in ("CPU", "")
    self_us = (
        getattr(e, "self_device_time_total", 0.0) if on_device else e.self_cpu_time_total
    ) or 0.0
    return Event(e.name, e.time_range.start, e.time_range.end, float(self_us), on_device)


class Phases:
    """Which phase a host event ran in: the phase range it started in.

    The ranges of a step follow each other in time, so the range that opened last before
    an event started is the only one that can hold it. A copy in the dataset's
    ``__getitem__`` or in a collate runs under ``autotune.data``: it is data loading, not
    compute. Backward ops on the autograd engine's thread (CUDA) run while
    ``autotune.backward`` is open, so time alone places them too. Events outside every
    range ran in :data:`OUTSIDE`.
    """

    def __init__(self, host: list[Event]) -> None:
        named = [(e.name.removeprefix(PHASE_PREFIX), e) for e in host]
        ranges = [(name, e) for name, e in named if name in PHASES and name != e.name]
        self.ranges = sorted(ranges, key=lambda r: r[1].start_us)
        self.starts = [r.start_us for _, r in self.ranges]

    def of(self, e: Event) -> str:
        """The phase ``e`` started in, else :data:`OUTSIDE`."""
        i = bisect_right(self.starts, e.start_us) - 1
        if i < 0 or e.start_us >= self.ranges[i][1].end_us:
            return OUTSIDE
        return self.ranges[i][0]


def _union_us(intervals: Iterable[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def _holds(intervals: list[tuple[float, float]], e: Event) -> bool:
    """Whether one of the sorted ``intervals`` lies inside ``e``."""
    i = bisect_left(intervals, (e.start_us, float("-inf")))
    while i < len(intervals) and intervals[i][0] <= e.end_us:
        if intervals[i][1] <= e.end_us:
            return True
        i += 1
    return False


def _top(
    events: list[Event], steps: int, wall_us: float, phases: Phases | None = None
) -> list[dict]:
    """The ops of most self time, per step; with ``phases`` (host ops), each op's ``phases``:
    its share of the step by the phase it ran in (kernels run when the device gets to
    them, after their phase: they have none)."""
    by_name: dict[str, list[Any]] = {}
    for e in events:
        if e.name.startswith(PHASE_PREFIX) or e.name.startswith("ProfilerStep"):
            continue
        acc = by_name.setdefault(e.name, [0.0, 0, {}])
        acc[0] += e.self_us
        acc[1] += 1
        if phases is not None:
            where = phases.of(e)
            acc[2][where] = acc[2].get(where, 0.0) + e.self_us
    ranked = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:TOP_OPS]
    out = []
    for name, (self_us, calls, by_phase) in ranked:
        op = {
            "name": name,
            "calls_per_step": calls / steps,
            "self_ms_per_step": self_us / steps / 1000.0,
            "share": self_us / wall_us if wall_us else 0.0,
        }
        if phases is not None:
            op["phases"] = {k: v / wall_us if wall_us else 0.0 for k, v in by_phase.items()}
        out.append(op)
    return out


def summarize(events: list[Event], wall_s: float, steps: int, device: str) -> dict[str, Any]:
    """Split ``steps`` profiled steps of ``wall_s`` seconds into shares; pure, testable.

    Returns:
        ``step_s`` (profiled, so slower than measured), ``shares`` of each phase plus
        ``sync`` and ``other`` (they add up to 1), ``sync_shares`` (the ``sync`` share by
        the phase the host waited in), ``top_ops`` (host self time, each with its
        ``phases``) and, on CUDA, ``top_kernels`` and ``device_busy`` (the share of wall
        time the GPU runs anything). ``host_reads_per_step`` counts ``item()``-like reads
        that waited for the device (a dataset's or an optimizer's read of a host tensor
        waits for nothing).
    """
    wall_us = wall_s * 1e6
    host = [e for e in events if not e.on_device]
    where = Phases(host)
    ranges = {name: [e for e in host if e.name == PHASE_PREFIX + name] for name in PHASES}
    spent = {name: sum(e.duration_us for e in found) for name, found in ranges.items()}
    waits: dict[str, float] = {}
    syncs = [e for e in host if e.name in SYNC_CALLS]
    for s in syncs:
        phase = where.of(s)
        if phase != OUTSIDE:  # a wait inside forward is a wait, not forward compute
            spent[phase] -= s.duration_us
        waits[phase] = waits.get(phase, 0.0) + s.duration_us
    spent["sync"] = sum(waits.values())
    known = sum(spent.values())
    spent["other"] = max(0.0, wall_us - known)
    total = max(wall_us, known) or 1.0
    waited = sorted((s.start_us, s.end_us) for s in syncs)
    reads = [r for r in host if r.name in HOST_READS and _holds(waited, r)]
    out: dict[str, Any] = {
        "device": device,
        "profile_steps": steps,
        "step_s": wall_s / steps,
        "shares": {k: max(0.0, v) / total for k, v in spent.items()},
        "sync_shares": {k: v / total for k, v in waits.items()},
        "top_ops": _top(host, steps, wall_us, where),
        "host_reads_per_step": len(reads) / steps,
        "phases_found": all(ranges[name] for name in ("data", "forward", "backward")),
    }
    device_events = [e for e in events if e.on_device]
    if device == "cuda":
        busy = _union_us((e.start_us, e.end_us) for e in device_events)
        out["device_busy"] = min(1.0, busy / wall_us) if wall_us else 0.0
        out["top_kernels"] = _top(device_events, steps, wall_us)
    return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _graphs(built: Built) -> int | None:
    """The graphs torch.compile has built in this process so far; ``None`` uncompiled."""
    if built.config.compile_mode == "off":
        return None
    from torch._dynamo import utils

    return int(utils.counters["stats"].get("unique_graphs", 0))


def profile(built: Built) -> dict[str, Any]:
    """Warm up, profile the spec's ``profile_steps`` steps, write the Chrome trace, summarise.

    Besides :func:`summarize`'s keys: ``cpu_count`` (the cap of ``num_workers``), for token
    workloads ``padding_share``, and for a compiled model ``graphs`` (built so far) and
    ``recompiles`` (built during the profiled steps: after warm-up, a new graph means a
    guard failed, most often on a new input shape).
    """
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    applied, batches, device = built.applied, built.batches, built.device
    spec = built.spec
    steps = spec.profile_steps
    # At least one untimed step: compile, cudnn autotuning and allocator warm-up.
    for _ in range(max(1, spec.warmup_steps)):
        applied.train_step(batches)
    _sync(device)
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    # One step of profiler warm-up (recorded, then discarded): the profiler's own start-up
    # cost lands there instead of in the first profiled step.
    padding_before, positions_before = applied.padding, applied.positions
    schedule = torch.profiler.schedule(wait=0, warmup=1, active=steps, repeat=1)
    with torch_profile(activities=activities, schedule=schedule) as prof:
        applied.train_step(batches)
        _sync(device)
        prof.step()
        graphs_before = _graphs(built)
        start = time.perf_counter()
        for i in range(steps):
            applied.train_step(batches)
            if i == steps - 1:  # stop the clock before the last step() collects the trace
                _sync(device)
                wall_s = time.perf_counter() - start
            prof.step()
    trace = spec.trace_path
    if trace:
        prof.export_chrome_trace(str(trace))
    summary = summarize([_plain(e) for e in prof.events()], wall_s, steps, device.type)
    positions = applied.positions - positions_before
    if positions:  # token workloads: the share of padded positions in the profiled batches
        summary["padding_share"] = (applied.padding - padding_before) / positions
    graphs = _graphs(built)
    if graphs is not None and graphs_before is not None:
        summary["graphs"] = graphs
        summary["recompiles"] = graphs - graphs_before
    return {
        "status": OK,
        "config": built.config.to_dict(),
        "trace_path": str(trace) if trace else None,
        "cpu_count": os.cpu_count() or 1,
        **summary,
    }
