"""The result of one trial, as it crosses from the trial process to the driver."""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

# Every status a trial can have, here and nowhere else. A trial process or its supervisor
# gives the first five; only OK may win.
OK, FAILED, OOM, TIMEOUT, NAN = "ok", "failed", "oom", "timeout", "nan"
PRUNED = "pruned"  # stopped early: it could not beat the best so far
# The driver's verdict (autotune.study.scoring) turns a finished run into one of these.
OVER_MEMORY, ACCURACY = "over-memory", "accuracy"
# A search config not run: the study's memory model (autotune.study.memory) predicts it
# over the budget. Infeasible for the sampler, never measured.
PREDICTED_OVER_MEMORY = "predicted-over-memory"
TOKENS = "tokens"  # Measurement.unit of token workloads (the default unit is "samples")


def compile_estimate_s(warmup_s: float, warmup_steps: int, step_s: float) -> float:
    """What warm-up cost beyond steady-state steps: compilation, autotuning, caches.

    The estimate of ``compile_s`` where torch has no compile counters (TorchScript), and
    the pruner's when a trial's progress does not report the counters.
    """
    return max(0.0, warmup_s - warmup_steps * step_s)


# The phase of a run side by side (a confirmation round) that is the other runs' turns.
WAITING = "waiting for turns"


@dataclass(frozen=True)
class Measurement:
    """What one trial measured. Times in seconds, memory in bytes.

    ``samples_per_s`` is steady-state throughput over the measured window, data loading
    included; ``warmup_s`` (the wall time of the warm-up steps, compile included) is not in
    it and reported apart, and neither is the time torch.compile spent recompiling inside
    the window. ``compile_s`` is time spent compiling: for ``torch.compile`` torch's own
    counters (dynamo's frame and backward compile time, recompiles included), for
    TorchScript the warm-up's excess over steady-state steps, ``None`` for eager configs.
    ``compile_cache`` says whether a torch.compile trial started on an empty (``cold``) or
    a filled (``warm``) inductor cache: each config has its own cache in the study's run
    folder, so the first run of a config is cold whatever ran before it. For token
    workloads (``unit == "tokens"``), ``tokens_per_s`` counts real (non-padding) tokens
    and is what the trial is scored on; ``padding_share`` is the share of token positions
    in the window's batches that were padding.
    """

    status: str
    reason: str = ""
    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    samples_per_step: int | None = None
    unit: str = "samples"  # what the objective counts: "samples" or (real) "tokens"
    tokens_per_step: float | None = None  # real tokens per optimizer step (token workloads)
    padding_share: float | None = None
    # Share of the timed window the training step waited for its next batch (host clock:
    # the DataLoader's iterator, loading and collation when it has no workers).
    data_share: float | None = None
    # Micro-batches the window took from the DataLoader workers' queue beyond what they
    # made in it (its start's prefetched batches): left out of the rates (loop.window_drain).
    queue_drained: int | None = None
    # A data-bound window with workers is rated between its first and last micro-batch
    # that a step waited for on an empty queue: the micro-batches and seconds between them
    # (loop.loader_paced; None when the window's rate is the step's).
    paced_batches: int | None = None
    paced_s: float | None = None
    # Token workloads batched by autotune: the rates are the epoch's, the window's time
    # scaled by the fitted time of the epoch's mean step over the window's (trial/epoch.py);
    # window_rate is the window's own rate, in the unit (None when not scaled).
    epoch_scale: float | None = None
    window_rate: float | None = None
    peak_longest_bytes: int | None = None  # peak memory of a step of the longest batch
    longest_batch_tokens: int | None = None  # its length (tokens per sample, padded)
    longest_s: float | None = None  # that untimed step's wall time (between warm-up and window)
    graphs: int | None = None  # torch.compile: graphs compiled in the trial
    recompiles: int | None = None  # ... after the first step (new shapes, guards)
    recompile_s: float | None = None  # time spent compiling after the first step
    measured_steps: int = 0
    window_s: float | None = None
    step_time_median_s: float | None = None
    step_time_cv: float | None = None
    step_time_iqr_s: float | None = None
    warmup_s: float | None = None
    compile_s: float | None = None
    compile_cache: str | None = None  # "cold" or "warm" (torch.compile trials)
    startup_s: float | None = None  # from the trial's first line to its first step
    # Where a trial's time goes (see TuneResult.time_split): from the spawn to the trial's
    # first line (interpreter start), imports (torch, autotune's trial code), the device
    # (CUDA context) and the workload build; after the result: writing it and exiting.
    process_start_s: float | None = None
    import_s: float | None = None
    device_init_s: float | None = None
    build_s: float | None = None
    # A framework trial (Trainer.train(), Trainer.fit()): the framework's own set-up, from
    # the call until its first step (building the Trainer, its accelerator, optimizer and
    # loader), apart from build_s (the user's factory that made the Trainer)
    framework_setup_s: float | None = None
    exit_s: float | None = None
    launcher: str | None = None  # how the process started: "fork" (warm launcher) or "spawn"
    # An interleaved run (autotune.study.runner.run_interleaved): the turns it took on the machine
    # and the seconds it waited for them (not in any of its times); None: it ran alone
    turns: int | None = None
    waited_s: float | None = None
    # whose loop ran the steps: "transformers" (Trainer.train()), "lightning"
    # (Trainer.fit()); None: autotune's own
    loop: str | None = None
    peak_mem_bytes: int | None = None
    mem_kind: str = ""
    peak_allocated_bytes: int | None = None
    alloc_retries: int | None = None
    device_ooms: int | None = None  # CUDA: allocations the caching allocator refused
    skipped_steps: int = 0
    losses: list[float] = field(default_factory=list)
    wall_s: float | None = None
    pruned_saved_s: float | None = None  # measured time a pruned trial did not spend
    # What the GPU and the host did in the timed window (autotune.trial.telemetry,
    # docs/energy.md); None where not read. NVML, on a GPU: this process's device memory
    # (CUDA context, workspaces and NCCL buffers included) and the device's, SM and memory
    # utilisation, power: median and max over samples; the SM clock's median and min.
    gpu_proc_mem_median_bytes: int | None = None
    gpu_proc_mem_max_bytes: int | None = None
    gpu_mem_used_median_bytes: int | None = None
    gpu_mem_used_max_bytes: int | None = None
    sm_util_median_pct: float | None = None
    sm_util_max_pct: float | None = None
    mem_util_median_pct: float | None = None
    mem_util_max_pct: float | None = None
    power_median_w: float | None = None
    power_max_w: float | None = None
    sm_clock_median_mhz: float | None = None
    sm_clock_min_mhz: float | None = None
    throttled: list[str] | None = None  # throttle reasons seen ([]: none; None: not read)
    throttled_share: float | None = None  # of the samples, those with a throttle reason
    # The training device's energy over energy_s (the window, bracketed by the first and
    # last reading): "nvml counter", "power x time" or (a CPU trial) "rapl", the packages'.
    energy_j: float | None = None
    energy_s: float | None = None
    energy_source: str | None = None
    joules_per_sample: float | None = None  # the window's mean power over samples/s
    joules_per_token: float | None = None  # ... over real tokens/s
    cpu_energy_j: float | None = None  # a GPU trial's CPU packages (RAPL), where readable
    cpu_util_cores: float | None = None  # the process group's CPU time over the window
    telemetry_samples: int | None = None  # NVML readings in the window
    telemetry_missing: list[str] = field(default_factory=list)  # "figure: why not read"

    @property
    def ok(self) -> bool:
        return self.status == OK

    @property
    def rate(self) -> float | None:
        """The throughput the objective counts: real tokens/s or samples/s (see ``unit``)."""
        return self.tokens_per_s if self.unit == TOKENS else self.samples_per_s

    @property
    def judged_mem_bytes(self) -> int | None:
        """The memory the limit judges: the larger of the peak (``peak_mem_bytes``: the
        caching allocator's reserved bytes on CUDA) and NVML's figure of this process on
        the device (the CUDA context, cuBLAS workspaces and NCCL buffers included, which
        the allocator does not see), where NVML gave one. NVML's is sampled, so a peak
        between two samples can escape it: the allocator's exact peak is kept as a floor."""
        figures = [x for x in (self.peak_mem_bytes, self.gpu_proc_mem_max_bytes) if x]
        return max(figures) if figures else self.peak_mem_bytes

    @property
    def unit_per_joule(self) -> float | None:
        """Samples (real tokens for a token workload) per joule of the training device."""
        joules = self.joules_per_token if self.unit == TOKENS else self.joules_per_sample
        return 1.0 / joules if joules else None

    @property
    def per_step(self) -> float | None:
        """Units (tokens or samples) per optimizer step."""
        return self.tokens_per_step if self.unit == TOKENS else self.samples_per_step

    def time_split(self) -> tuple[dict[str, float], float] | None:
        """Where this run's time went, in seconds by phase (:data:`PHASES`), and its total
        from the driver's spawn to the process's exit; None for a run that did not
        record its phases (it failed early, or is from an older version)."""
        if self.import_s is None or self.wall_s is None or self.window_s is None:
            return None
        compile_s = self.compile_s or 0.0
        parts = {
            "process start": self.process_start_s or 0.0,
            "imports": self.import_s,
            "device": self.device_init_s or 0.0,
            "build": self.build_s or 0.0,
            **(
                {"framework set-up": self.framework_setup_s}
                if self.framework_setup_s is not None
                else {}
            ),
            "warm-up": max(0.0, (self.warmup_s or 0.0) - compile_s),
            "compile": compile_s,
            # a token workload's untimed step of its longest samples (trial.longest_batch)
            **({"longest batch": self.longest_s} if self.longest_s is not None else {}),
            "timed": self.window_s,
            "result and exit": self.exit_s or 0.0,
            # side by side in a confirmation round: the other runs' turns
            **({WAITING: self.waited_s} if self.waited_s is not None else {}),
        }
        total = (self.process_start_s or 0.0) + self.wall_s + (self.exit_s or 0.0)
        parts["other"] = max(0.0, total - sum(parts.values()))
        return parts, total

    @property
    def fixed_s(self) -> float | None:
        """The run's fixed cost: process start, imports, device, build, a framework's
        set-up, result and exit.
        Not in it: warm-up, compile, the longest-batch step, the timed window, and the
        time no phase claims (``other`` in :meth:`time_split`), so it never overstates
        the fixed cost."""
        split = self.time_split()
        if split is None:
            return None
        parts, _ = split
        measuring = ("warm-up", "compile", "longest batch", "timed", WAITING, "other")
        return sum(v for k, v in parts.items() if k not in measuring)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        # JSON (and Optuna's storage) cannot hold NaN/Inf: store them as strings.
        d["losses"] = [x if math.isfinite(x) else str(x) for x in self.losses]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Measurement:
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        known["losses"] = [float(x) for x in known.get("losses", [])]
        return cls(**known)

    def replace(self, **changes: Any) -> Measurement:
        return dataclasses.replace(self, **changes)


def median_of(values: Iterable[float | None]) -> float | None:
    """The median of a figure over the runs that measured it (``None``: a run that did
    not), ``None`` when none did. The one median of a share (data wait, padding) over a
    config's runs: the replay's repeated rows and the screening's baseline use it."""
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def fixed_cost(measurements: Iterable[Measurement]) -> tuple[float, float] | None:
    """The median fixed cost of these runs (:attr:`Measurement.fixed_s`: process start,
    imports, device, build, result and exit) and its median share of a run's wall time
    (spawn to exit, less the other runs' turns of a run side by side); None when no run
    recorded it. Runs of versions before the split:
    start-up (imports, build) over the process's own time.

    The one aggregation behind the summary's "per-trial fixed cost" and the benchmarks'.
    """
    measurements = list(measurements)
    rows = [
        (m.fixed_s, s[1] - s[0].get(WAITING, 0.0))
        for m in measurements
        if (s := m.time_split()) is not None
    ]
    if not rows:  # recorded before the phases were
        rows = [(m.startup_s, m.wall_s) for m in measurements if m.startup_s and m.wall_s]
    rows = [(fixed, total) for fixed, total in rows if fixed is not None and total]
    if not rows:
        return None
    return statistics.median(f for f, _ in rows), statistics.median(f / t for f, t in rows)
