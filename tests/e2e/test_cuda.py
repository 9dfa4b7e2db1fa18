"""The CUDA code paths on a real GPU: event timing, device memory, NVML, OOM, the probe.

Every test here is ``cuda``-marked: without a GPU (CI, the CPU machines) it skips cleanly;
``benchmarks/gpu_check.sh`` runs them on a lent GPU machine together with a real study.
The memory budget and fp16 overflow tests in test_limits.py also run on CUDA there.
"""

from __future__ import annotations

import time

import pytest
import torch
from conftest import HERE

from autotune import Config, load_space
from autotune.knobs import Capabilities
from autotune.study.runner import probe, run_trial
from autotune.trial.clock import StepClock, peak_memory, reset_peak_memory

pytestmark = pytest.mark.cuda
FAULTY = HERE / "faulty.py"

CUDA_SPACE = """
    workload: {workloads}:WORKLOAD
    device: cuda
    knobs: {batch_size: [16]}
    trial: {min_window_s: 0, min_warmup_s: 0, warmup_steps: 2, measured_steps: 6, timeout_s: 300}
"""


def _space(write_space, workload="tiny"):
    return load_space(write_space(CUDA_SPACE.replace("WORKLOAD", workload)))


def test_step_clock_times_device_work_with_events():
    device = torch.device("cuda")
    a = torch.randn(2048, 2048, device=device)
    clock = StepClock(device)
    clock.start()
    for _ in range(5):
        for _ in range(10):
            a = torch.tanh(a @ a)  # milliseconds of GPU work, microseconds to launch
        clock.mark()
    clock.stop()
    times = clock.step_times_s()
    steps, elapsed = clock.progress()
    assert len(times) == 5 and all(t > 0 for t in times)
    assert steps == 5 and elapsed == pytest.approx(sum(times), rel=1e-3)
    # The events time the GPU's work, which the synchronized window contains.
    assert 0.5 * clock.window_s < sum(times) <= clock.window_s + 1e-3


def test_peak_memory_reads_the_caching_allocator():
    device = torch.device("cuda")
    reset_peak_memory(device)
    x = torch.empty(64 * 2**20, dtype=torch.uint8, device=device)
    peak = peak_memory(device)
    del x
    assert peak["mem_kind"] == "cuda_reserved"
    assert peak["peak_mem_bytes"] >= peak["peak_allocated_bytes"] >= 64 * 2**20
    assert peak["alloc_retries"] == 0 and peak["device_ooms"] == 0


def test_a_cuda_trial_is_timed_on_the_device_and_reports_its_memory(write_space, tmp_path):
    space = _space(write_space)
    m = run_trial(space, Config(batch_size=16, accumulation_steps=2), tmp_path / "t")
    assert m.ok, m.reason
    assert m.samples_per_step == 32 and m.measured_steps == 6
    assert abs(m.samples_per_s - 6 * 32 / m.window_s) < 1e-6 * m.samples_per_s
    assert m.step_time_median_s > 0 and m.step_time_cv >= 0
    assert m.mem_kind == "cuda_reserved"
    assert m.peak_mem_bytes >= m.peak_allocated_bytes > 0
    assert m.alloc_retries == 0
    assert len(m.losses) == 8 and all(x == x for x in m.losses)


def test_a_device_oom_is_a_recorded_oom_trial(write_space, tmp_path):
    # faulty.py: micro-batch 10 asks the batch's device for 32 TiB.
    space = load_space(write_space(CUDA_SPACE.replace("{workloads}:WORKLOAD", f"{FAULTY}:faulty")))
    m = run_trial(space, Config(batch_size=10), tmp_path / "oom")
    assert m.status == "oom", m.reason
    assert "out of memory" in m.reason.lower()


def test_the_probe_finds_the_gpu_and_its_knobs(write_space, tmp_path):
    space = _space(write_space)
    result = probe(space, tmp_path / "probe")
    caps, env = result["capabilities"], result["environment"]
    assert caps["device"] == "cuda" and caps["gpu_count"] >= 1
    assert caps["fp16"] and caps["matmul_precisions"][:2] == ["highest", "high"]
    assert env["device"] == "cuda" and env["cuda"] and env["device_memory_bytes"] > 2**30
    # NVML found the same GPU by its PCI bus id: same memory size, up to what CUDA reserves.
    assert env.get("driver"), "NVML gave no driver version"
    assert env["nvml_total_bytes"] == pytest.approx(env["device_memory_bytes"], rel=0.05)
    full = load_space(
        write_space(
            """
        workload: {workloads}:tiny
        device: cuda
        knobs:
          pin_memory: [false, true]
          non_blocking: [false, true]
          cudnn_benchmark: [false, true]
          matmul_precision: [highest, high]
          compile_mode: ["off", reduce-overhead]
    """,
            "full.yaml",
        )
    )
    restricted, notes = full.restrict(Capabilities.from_dict(caps))
    for knob in ("pin_memory", "non_blocking", "cudnn_benchmark"):
        assert restricted.knobs[knob] == (False, True), notes
    assert restricted.knobs["matmul_precision"] == ("highest", "high"), notes
    if caps["compile"]:
        assert "reduce-overhead" in restricted.knobs["compile_mode"], notes


@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 GPUs"
)
def test_fsdp_over_nccl_shards_and_offloads(write_space, tmp_path):
    """FSDP2 on a GPU mesh (NCCL), with CPU offload: the CUDA-only paths of the fsdp knobs."""
    space = load_space(
        write_space("""
        workload: {workloads}:deep
        device: cuda
        global_batch: free
        trial: {warmup_steps: 2, measured_steps: 6, timeout_s: 300,
                min_window_s: 0, min_warmup_s: 0}
    """)
    )
    single = run_trial(space, Config(batch_size=16), tmp_path / "single")
    fsdp = Config(batch_size=8, world_size=2, fsdp="blocks")
    sharded = run_trial(space, fsdp, tmp_path / "fsdp")
    offload = run_trial(space, fsdp.replace(fsdp_cpu_offload=True), tmp_path / "offload")
    for m in (single, sharded, offload):
        assert m.ok, m.reason
        assert m.mem_kind == "cuda_reserved"
    assert sharded.samples_per_step == 16  # 2 ranks x 8
    # TF32 is off by default (matmul_precision highest): fp32 sums in another order only
    assert all(
        abs(a - b) < 1e-3 * abs(b) for a, b in zip(sharded.losses, single.losses, strict=True)
    )
    # offloaded shards, gradients and optimizer state live in host memory
    assert offload.peak_allocated_bytes < sharded.peak_allocated_bytes


def test_the_nvml_sampler_reads_the_real_gpu_over_a_window_of_work():
    """The real sampler through the real pynvml: its figures printed for the run's note."""
    from autotune.trial.telemetry import open_window

    device = torch.device("cuda")
    a = torch.randn(4096, 4096, device=device)
    torch.cuda.synchronize()
    window = open_window(device, interval_s=0.05)
    began = time.perf_counter()
    while time.perf_counter() - began < 2.0:
        for _ in range(20):
            a = torch.tanh(a @ a)
        torch.cuda.synchronize()
    window.close()
    fields = window.fields(samples_per_s=1000.0)
    print("nvml figures:", fields)
    assert fields["telemetry_samples"] >= 10
    assert fields["sm_util_max_pct"] > 50 and fields["power_max_w"] > 0
    assert fields["gpu_mem_used_max_bytes"] >= torch.cuda.memory_reserved(device)
    if "gpu_proc_mem_max_bytes" in fields:  # absent where the PID namespace hides it
        assert fields["gpu_proc_mem_max_bytes"] >= torch.cuda.memory_reserved(device)
    else:
        assert any(x.startswith("proc_mem:") for x in fields["telemetry_missing"])
    assert fields["energy_j"] > 0 and fields["energy_source"] in ("nvml counter", "power x time")
    assert fields["joules_per_sample"] == pytest.approx(
        fields["energy_j"] / fields["energy_s"] / 1000.0
    )
    assert isinstance(fields["throttled"], list)


def test_a_cuda_trial_carries_nvml_figures_and_is_judged_on_them(write_space, tmp_path):
    m = run_trial(_space(write_space), Config(batch_size=16), tmp_path / "t")
    assert m.ok and m.telemetry_samples >= 2 and m.energy_j is not None
    assert m.judged_mem_bytes >= m.peak_mem_bytes
    print("trial telemetry:", {k: v for k, v in m.to_dict().items() if k in TELEMETRY_KEYS})


TELEMETRY_KEYS = (
    "peak_mem_bytes",
    "gpu_proc_mem_max_bytes",
    "gpu_mem_used_max_bytes",
    "sm_util_median_pct",
    "power_median_w",
    "energy_j",
    "energy_source",
    "joules_per_sample",
    "throttled",
    "telemetry_missing",
)
