"""What the GPU and the host did during a trial's timed window, as their owner sees it.

On a GPU, NVML (the library behind ``nvidia-smi``) is read at a fixed interval by a
background thread: this process's device memory and the device's used memory (the CUDA
context, cuBLAS workspaces and NCCL buffers included, which the caching allocator's
figures leave out), SM and memory utilisation, power draw, the energy counter, the SM
clock and the clock-event (throttle) reasons. On the host, the process group's CPU time
(the trial and its DataLoader workers, from ``/proc``) and the CPU packages' energy (RAPL,
``/sys/class/powercap``) are read once at each end of the window: a ``/proc`` scan in the
thread would hold the GIL against the training loop.

The window is opened just before the step clock starts and closed just after it stops
(:func:`open_window`, :meth:`Window.close`); :meth:`Window.fields` turns what was read
into :class:`autotune.measurement.Measurement` fields. A figure that cannot be read is
left out and named in ``telemetry_missing``: no number is invented. This module imports
neither torch nor pynvml at module level: the NVML module is a parameter, so any trial
loop (ours, a framework's) can open a window, and tests drive it with a stand-in.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

from .baton import BATON, own_time

# Why an interleaved window reads no machine-wide figure.
SHARED = "interleaved with other runs (a confirmation round): the machine's figures are theirs too"

INTERVAL_S = 0.1  # NVML's utilisation and power are themselves averages over ~0.1-1 s
POWERCAP = Path("/sys/class/powercap")
PROC = Path("/proc")
# NVML's clock-event reasons that slow the SM clock below what the work asks for (bits of
# nvmlDeviceGetCurrentClocksEventReasons, formerly ...ClocksThrottleReasons). Idle, the
# application clocks a user set and the display clock are not throttling.
THROTTLE_REASONS = {
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
}
NVML_CLOCK_SM = 1  # nvmlClockType_t: NVML_CLOCK_SM
GPU_READINGS = ("proc_mem", "used_mem", "util", "power", "energy", "sm_clock", "reasons")


@dataclass(frozen=True)
class Sample:
    """One NVML reading of the trial's GPU; ``None`` where a figure could not be read."""

    t: float  # time.perf_counter()
    proc_mem_bytes: int | None = None  # this process's device memory
    used_mem_bytes: int | None = None  # the device's, all processes
    sm_util_pct: float | None = None
    mem_util_pct: float | None = None
    power_w: float | None = None
    energy_mj: int | None = None  # the device's counter (millijoules since driver load)
    sm_clock_mhz: float | None = None
    reasons: int | None = None  # clock-event reasons, a bit mask


class NvmlReader:
    """Reads one GPU through ``nvml`` (the ``pynvml`` module, or a stand-in with its
    interface). A reading this GPU does not support (``NVMLError_NotSupported``, or a
    function the bindings lack) is not asked again and is named in :attr:`missing`; any
    other NVML error leaves that figure out of that sample only.

    Args:
        nvml: the pynvml module (``nvmlInit`` already called).
        handle: the device's NVML handle.
        pid: the process whose device memory is read (this one by default).
    """

    def __init__(self, nvml: Any, handle: Any, pid: int | None = None) -> None:
        self.nvml, self.handle = nvml, handle
        self.pid = os.getpid() if pid is None else pid
        self.missing: dict[str, str] = {}
        self._reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None
        )

    def _get(self, name: str, call: Callable[[], Any] | None) -> Any:
        if name in self.missing:
            return None
        if call is None:
            self.missing[name] = "not in these NVML bindings"
            return None
        unsupported = getattr(self.nvml, "NVMLError_NotSupported", ())
        try:
            return call()
        except unsupported:
            self.missing[name] = "not supported by this GPU"
        except self.nvml.NVMLError:
            pass
        return None

    def _proc_mem(self) -> int | None:
        running = self.nvml.nvmlDeviceGetComputeRunningProcesses
        procs = self._get("proc_mem", lambda: running(self.handle))
        if procs is None:
            return None
        mine = [p.usedGpuMemory for p in procs if p.pid == self.pid]
        if not mine or any(used is None for used in mine):
            # Another PID namespace (a container) lists other numbers; some drivers give
            # no per-process figure. Not asked again.
            self.missing["proc_mem"] = f"process {self.pid} has no figure among the GPU's"
            return None
        return int(sum(mine))

    def read(self) -> Sample:
        """One reading of every figure still asked."""
        nvml, h = self.nvml, self.handle
        util = self._get("util", lambda: nvml.nvmlDeviceGetUtilizationRates(h))
        mem = self._get("used_mem", lambda: nvml.nvmlDeviceGetMemoryInfo(h))
        power = self._get("power", lambda: nvml.nvmlDeviceGetPowerUsage(h))
        energy = self._get("energy", lambda: nvml.nvmlDeviceGetTotalEnergyConsumption(h))
        clock = self._get("sm_clock", lambda: nvml.nvmlDeviceGetClockInfo(h, NVML_CLOCK_SM))
        reasons_call = (lambda: self._reasons(h)) if self._reasons else None
        reasons = self._get("reasons", reasons_call)
        return Sample(
            t=time.perf_counter(),
            proc_mem_bytes=self._proc_mem(),
            used_mem_bytes=int(mem.used) if mem is not None else None,
            sm_util_pct=float(util.gpu) if util is not None else None,
            mem_util_pct=float(util.memory) if util is not None else None,
            power_w=power / 1000.0 if power is not None else None,
            energy_mj=int(energy) if energy is not None else None,
            sm_clock_mhz=float(clock) if clock is not None else None,
            reasons=int(reasons) if reasons is not None else None,
        )


class GpuSampler:
    """Reads ``reader`` once at :meth:`start`, every ``interval_s`` in a daemon thread,
    and once at :meth:`stop`: the first and last samples bracket the window exactly."""

    def __init__(self, reader: NvmlReader, interval_s: float = INTERVAL_S) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be above 0 but got {interval_s}")
        self.reader, self.interval_s = reader, interval_s
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nvml-sampler", daemon=True)

    def start(self) -> None:
        self.samples.append(self.reader.read())
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.samples.append(self.reader.read())

    def stop(self) -> list[Sample]:
        self._stop.set()
        self._thread.join()
        self.samples.append(self.reader.read())
        return self.samples


def _median_max(values: list[float]) -> tuple[float, float] | None:
    return (statistics.median(values), max(values)) if values else None


def gpu_fields(samples: list[Sample], missing: dict[str, str]) -> dict[str, Any]:
    """The Measurement fields of a window's NVML samples: median and max of each series
    (the SM clock's median and min: a throttled clock is a low one), the energy (the
    counter's difference between the first and last sample, or power x time where the
    counter cannot be read), and every throttle reason seen."""
    out: dict[str, Any] = {"telemetry_samples": len(samples)}
    series = {
        "gpu_proc_mem": ("_bytes", [s.proc_mem_bytes for s in samples], int),
        "gpu_mem_used": ("_bytes", [s.used_mem_bytes for s in samples], int),
        "sm_util": ("_pct", [s.sm_util_pct for s in samples], float),
        "mem_util": ("_pct", [s.mem_util_pct for s in samples], float),
        "power": ("_w", [s.power_w for s in samples], float),
    }
    for name, (unit, values, kind) in series.items():
        found = _median_max([v for v in values if v is not None])
        if found is not None:
            out[f"{name}_median{unit}"] = kind(found[0])
            out[f"{name}_max{unit}"] = kind(found[1])
    clocks = [s.sm_clock_mhz for s in samples if s.sm_clock_mhz is not None]
    if clocks:
        out["sm_clock_median_mhz"], out["sm_clock_min_mhz"] = statistics.median(clocks), min(clocks)
    out.update(_gpu_energy(samples))
    masks = [s.reasons for s in samples if s.reasons is not None]
    if masks:
        seen = {name for mask in masks for bit, name in THROTTLE_REASONS.items() if mask & bit}
        out["throttled"] = sorted(seen)
        hit = sum(1 for mask in masks if any(mask & bit for bit in THROTTLE_REASONS))
        out["throttled_share"] = hit / len(masks)
    out["telemetry_missing"] = [f"{k}: {v}" for k, v in sorted(missing.items())]
    return out


def _gpu_energy(samples: list[Sample]) -> dict[str, Any]:
    """Joules over the samples' span: NVML's counter, else power integrated over time."""
    first, last = samples[0], samples[-1]
    span = last.t - first.t
    if span <= 0:
        return {}
    if first.energy_mj is not None and last.energy_mj is not None:
        # not reset (a driver reload) in between, and ticked: a counter that updates
        # coarsely reads 0 over a window shorter than its period
        if last.energy_mj > first.energy_mj:
            joules = (last.energy_mj - first.energy_mj) / 1000.0
            return {"energy_j": joules, "energy_s": span, "energy_source": "nvml counter"}
    powered = [s for s in samples if s.power_w is not None]
    if len(powered) < 2:
        return {}
    joules = sum((a.power_w + b.power_w) / 2 * (b.t - a.t) for a, b in pairwise(powered))
    span = powered[-1].t - powered[0].t
    return {"energy_j": joules, "energy_s": span, "energy_source": "power x time"}


# The shortest window whose CPU use is reported: /proc's CPU times count in ticks (10 ms
# on Linux), so a window of CPU_TICKS ticks reads its cores to about 1/CPU_TICKS of a core
# per process (a 3-step window of a few ms read 2.9 cores on 2 cores).
CPU_TICKS = 20


def cpu_seconds(pgid: int, proc: Path = PROC) -> float | None:
    """CPU time (user and system, reaped children included) of the processes of group
    ``pgid``: the trial and its DataLoader workers. ``None`` without a readable /proc."""
    ticks = 0
    found = False
    try:
        entries = list(proc.iterdir())
    except OSError:
        return None
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone since the listing
            continue
        # Fields after the command name (which may hold spaces and parentheses).
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 14 and int(fields[2]) == pgid:  # state is fields[0]
            found = True
            ticks += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    return ticks / os.sysconf("SC_CLK_TCK") if found else None


def rapl_joules(root: Path = POWERCAP) -> tuple[dict[str, tuple[float, float]], str]:
    """Each CPU package's RAPL energy counter and its wrap-around range, in joules, and
    why none could be read ("" when some could). Packages are the top-level zones
    (``intel-rapl:0``; AMD's kernels name theirs the same); sub-zones (``intel-rapl:0:0``,
    the cores, DRAM) are inside a package's figure. Since Linux 5.10 the counters are
    readable by root only (a side channel)."""
    if not root.is_dir():
        return {}, f"no {root} (no RAPL on this machine)"
    zones = sorted(z for z in root.iterdir() if "rapl:" in z.name and z.name.count(":") == 1)
    if not zones:
        return {}, f"no RAPL package zone under {root}"
    out = {}
    for zone in zones:
        try:
            energy = int((zone / "energy_uj").read_text()) / 1e6
            wrap = int((zone / "max_energy_range_uj").read_text()) / 1e6
        except (OSError, ValueError):
            continue
        out[zone.name] = (energy, wrap)
    if not out:
        return {}, f"{root}/*/energy_uj not readable (root only since Linux 5.10)"
    return out, ""


def rapl_delta(
    before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]
) -> float | None:
    """Joules the packages used between two readings, a counter's wrap-around undone;
    ``None`` unless every package was read both times."""
    if not before or before.keys() != after.keys():
        return None
    total = 0.0
    for zone, (start, wrap) in before.items():
        end = after[zone][0]
        total += end - start if end >= start else end + wrap - start
    return total


@dataclass
class Window:
    """The telemetry of one timed window, from :func:`open_window` to :meth:`close`."""

    device_type: str
    sampler: GpuSampler | None = None
    gpu_note: str = ""  # why the GPU is not read ("" when it is, or on the CPU)
    nvml: Any = None
    pgid: int | None = None
    proc: Path = PROC
    powercap: Path = POWERCAP
    started: float = 0.0
    ended: float | None = None
    # interleaved with other runs (autotune.trial.baton): the machine's energy and the
    # GPU's samples are theirs too, and are not read
    shared: bool = False
    cpu: list[float | None] = field(default_factory=list)
    rapl: list[dict[str, tuple[float, float]]] = field(default_factory=list)
    rapl_note: str = ""
    samples: list[Sample] = field(default_factory=list)

    def _read_host(self) -> None:
        self.cpu.append(cpu_seconds(self.pgid, self.proc) if self.pgid is not None else None)
        joules, self.rapl_note = rapl_joules(self.powercap)
        self.rapl.append(joules)

    def close(self) -> None:
        """Stop reading (the window's clock has stopped); a second call does nothing."""
        if self.ended is not None:
            return
        if self.sampler is not None:
            self.samples = self.sampler.stop()
            try:
                self.nvml.nvmlShutdown()
            except self.nvml.NVMLError:
                pass
        self._read_host()
        self.ended = own_time()

    def fields(
        self, samples_per_s: float | None, tokens_per_s: float | None = None, ranks: int = 1
    ) -> dict[str, Any]:
        """The Measurement fields of the window (it is closed first): the GPU's figures
        (:func:`gpu_fields`), the process group's busy CPU cores, the energy (the GPU's,
        or on the CPU the packages' RAPL figure; a GPU trial's RAPL figure is
        ``cpu_energy_j``), and joules per sample (per real token where tokens are
        counted): the window's mean power over the rate."""
        self.close()
        out: dict[str, Any] = {}
        missing: list[str] = []
        if self.sampler is not None:
            out.update(gpu_fields(self.samples, self.sampler.reader.missing))
            missing += out.pop("telemetry_missing")
        elif self.device_type == "cuda":
            missing.append(f"nvml: {SHARED if self.shared else self.gpu_note}")
        span = self.ended - self.started
        tick_s = 1 / os.sysconf("SC_CLK_TCK")
        # /proc counts CPU time in ticks (10 ms): over a window of a few ms one tick more
        # or less reads as cores more or less, so such a window reports none
        if None not in self.cpu and span >= CPU_TICKS * tick_s:
            out["cpu_util_cores"] = (self.cpu[1] - self.cpu[0]) / span
        rapl = None if self.shared else rapl_delta(self.rapl[0], self.rapl[1])
        if rapl is not None and self.device_type == "cuda":
            out["cpu_energy_j"] = rapl
        elif rapl is not None:
            out.update(energy_j=rapl, energy_s=span, energy_source="rapl")
        if "energy_j" not in out:
            if self.shared:
                why = SHARED
            elif self.sampler is not None:
                why = "the GPU gave neither its energy counter nor its power"
            else:
                why = self.gpu_note or self.rapl_note
            missing.append(f"energy: {why}")
        elif ranks > 1:  # the other ranks' GPUs are not read: no per-sample figure
            missing.append(f"energy per sample: rank 0's device only of {ranks} ranks")
        elif out["energy_s"] > 0:
            watts = out["energy_j"] / out["energy_s"]
            if samples_per_s:
                out["joules_per_sample"] = watts / samples_per_s
            if tokens_per_s:
                out["joules_per_token"] = watts / tokens_per_s
        out["telemetry_missing"] = missing
        return out


def open_window(
    device: Any,
    *,
    nvml: Any = None,
    interval_s: float = INTERVAL_S,
    powercap: Path = POWERCAP,
    proc: Path = PROC,
) -> Window:
    """Start reading the device (a ``torch.device``: its ``type`` and ``index``) and the
    host; call just before the window's clock starts. ``nvml`` is the pynvml module
    (imported here when not given)."""
    window = Window(device.type, proc=proc, powercap=powercap, shared=BATON.active)
    try:
        window.pgid = os.getpgid(0)
    except OSError:
        pass
    if device.type == "cuda" and not window.shared:
        window.nvml, handle, window.gpu_note = _nvml_handle(device, nvml)
        if handle is not None:
            window.sampler = GpuSampler(NvmlReader(window.nvml, handle), interval_s)
    window._read_host()
    window.started = own_time()
    if window.sampler is not None:
        window.sampler.start()
    return window


def _nvml_handle(device: Any, nvml: Any) -> tuple[Any, Any, str]:
    """The NVML module (initialised) and the device's handle, or why there is none. The GPU
    is found by PCI bus id: NVML's indices ignore CUDA_VISIBLE_DEVICES."""
    if nvml is None:
        try:
            import pynvml as nvml
        except ImportError:
            return None, None, "pynvml (nvidia-ml-py) is not installed"
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as e:
        return nvml, None, f"NVML cannot start: {e}"
    try:
        bus_id = _pci_bus_id(device)
        if bus_id is not None:
            return nvml, nvml.nvmlDeviceGetHandleByPciBusId(bus_id), ""
        return nvml, nvml.nvmlDeviceGetHandleByIndex(device.index or 0), ""
    except nvml.NVMLError as e:
        nvml.nvmlShutdown()
        return nvml, None, f"NVML has no handle for {device}: {e}"


def _pci_bus_id(device: Any) -> str | None:
    """The PCI bus id of a CUDA device, as NVML names it (``None`` where torch says none)."""
    import torch

    try:
        props = torch.cuda.get_device_properties(device.index or 0)
        return f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
    except (AssertionError, RuntimeError, AttributeError):  # no CUDA here, an old torch
        return None


def energy_unavailable(device_type: str, powercap: Path = POWERCAP) -> str:
    """Why no energy figure can be read for trials on ``device_type`` ("" when one can):
    the probe's answer, kept in the study's environment and said once in the summary."""
    if device_type == "cuda":
        _, handle, why = _nvml_handle(_CudaZero(), None)
        if handle is not None:
            import pynvml

            pynvml.nvmlShutdown()
        return why
    return rapl_joules(powercap)[1]


class _CudaZero:
    type, index = "cuda", 0
