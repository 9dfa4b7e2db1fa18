"""The profile pass of the trial subprocess: where does one training step's time go?

``python -m autotune.trial SPEC RESULT`` with ``"mode": "profile"`` builds the trial
exactly as a measured trial does, runs the warm-up steps, then ``profile_steps`` steps
under ``torch.profiler``. ``Applied.train_step`` opens the ranges ``autotune.data``,
``autotune.to_device``, ``autotune.forward``, ``autotune.backward`` and
``autotune.optimizer`` while a profiler runs; host waits on the device (``cuda*Synchronize``)
are cut out of the range they happen in and counted apart. The result holds the share of
step time of each part, the top ops, and the path of a Chrome trace
(``chrome://tracing`` or https://ui.perfetto.dev).

The profiler adds overhead to every op, so shares are approximate and the step time of a
profile is slower than the trial's measured one; compare shares, not absolute times.
"""

from __future__ import annotations

import time
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
# item(), bool(tensor), printing a loss: each reads a device value on the host.
HOST_READS = frozenset({"aten::_local_scalar_dense"})
TOP_OPS = 12


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


def _union_us(intervals: Iterable[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def _top(events: list[Event], steps: int, wall_us: float, on_device: bool) -> list[dict]:
    by_name: dict[str, list[float]] = {}
    for e in events:
        if e.on_device != on_device or e.name.startswith(PHASE_PREFIX):
            continue
        if e.name.startswith("ProfilerStep"):
            continue
        acc = by_name.setdefault(e.name, [0.0, 0])
        acc[0] += e.self_us
        acc[1] += 1
    ranked = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:TOP_OPS]
    return [
        {
            "name": name,
            "calls_per_step": calls / steps,
            "self_ms_per_step": self_us / steps / 1000.0,
            "share": self_us / wall_us if wall_us else 0.0,
        }
        for name, (self_us, calls) in ranked
    ]


def summarize(events: list[Event], wall_s: float, steps: int, device: str) -> dict[str, Any]:
    """Split ``steps`` profiled steps of ``wall_s`` seconds into shares; pure, testable.

    Returns:
        ``step_s`` (profiled, so slower than measured), ``shares`` of each phase plus
        ``sync`` and ``other`` (they add up to 1), ``top_ops`` (host self time) and, on
        CUDA, ``top_kernels`` and ``device_busy`` (the share of wall time the GPU runs
        anything). ``host_reads_per_step`` counts ``item()``-like device reads.
    """
    wall_us = wall_s * 1e6
    phases = {
        name: [e for e in events if e.name == PHASE_PREFIX + name and not e.on_device]
        for name in PHASES
    }
    syncs = [e for e in events if e.name in SYNC_CALLS and not e.on_device]
    spent = {name: sum(e.duration_us for e in ranges) for name, ranges in phases.items()}
    for s in syncs:  # a wait inside forward is a wait, not forward compute
        for name, ranges in phases.items():
            if any(r.start_us <= s.start_us and s.end_us <= r.end_us for r in ranges):
                spent[name] -= s.duration_us
                break
    spent["sync"] = sum(s.duration_us for s in syncs)
    known = sum(spent.values())
    spent["other"] = max(0.0, wall_us - known)
    total = max(wall_us, known) or 1.0
    out: dict[str, Any] = {
        "device": device,
        "profile_steps": steps,
        "step_s": wall_s / steps,
        "shares": {k: max(0.0, v) / total for k, v in spent.items()},
        "top_ops": _top(events, steps, wall_us, on_device=False),
        "host_reads_per_step": sum(1 for e in events if e.name in HOST_READS) / steps,
        "phases_found": all(phases[name] for name in ("data", "forward", "backward")),
    }
    device_events = [e for e in events if e.on_device]
    if device == "cuda":
        busy = _union_us((e.start_us, e.end_us) for e in device_events)
        out["device_busy"] = min(1.0, busy / wall_us) if wall_us else 0.0
        out["top_kernels"] = _top(events, steps, wall_us, on_device=True)
    return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def profile(built: Built, spec: dict[str, Any]) -> dict[str, Any]:
    """Warm up, profile ``spec["profile_steps"]`` steps, write the Chrome trace, summarise."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    applied, batches, device = built.applied, built.batches, built.device
    steps = int(spec.get("profile_steps", 5))
    # At least one untimed step: compile, cudnn autotuning and allocator warm-up.
    for _ in range(max(1, int(built.trial.get("warmup_steps", 1)))):
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
        start = time.perf_counter()
        for i in range(steps):
            applied.train_step(batches)
            if i == steps - 1:  # stop the clock before the last step() collects the trace
                _sync(device)
                wall_s = time.perf_counter() - start
            prof.step()
    trace = spec.get("trace_path")
    if trace:
        prof.export_chrome_trace(str(trace))
    summary = summarize([_plain(e) for e in prof.events()], wall_s, steps, device.type)
    positions = applied.positions - positions_before
    if positions:  # token workloads: the share of padded positions in the profiled batches
        summary["padding_share"] = (applied.padding - padding_before) / positions
    if built.config.compile_mode != "off":
        from torch._dynamo import utils

        summary["graphs"] = int(utils.counters["stats"].get("unique_graphs", 0))
    return {
        "status": OK,
        "config": built.config.to_dict(),
        "trace_path": str(trace) if trace else None,
        **summary,
    }
