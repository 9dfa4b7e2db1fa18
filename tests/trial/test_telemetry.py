"""The window's telemetry (autotune.trial.telemetry) driven by a scripted NVML: the pynvml
interface, with the readings each test chooses. The aggregation, the flags and the
limits are the code under test; /proc and a powercap tree in a temporary folder are real
files."""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from autotune.measurement import OK, Measurement
from autotune.trial import telemetry
from autotune.trial.telemetry import GpuSampler, NvmlReader, Sample, gpu_fields, open_window

GiB = 2**30
PID = 4242


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):  # noqa: N801 (pynvml's name)
    pass


class ScriptedNvml:
    """The pynvml calls the sampler makes. Each reading returns the next value of its
    script, the last one again once the script is spent; an exception in a script is
    raised. ``calls`` counts the calls of each reading."""

    NVMLError = NVMLError
    NVMLError_NotSupported = NVMLError_NotSupported

    def __init__(self, **scripts):
        defaults = {
            "procs": [[(PID, 1 * GiB)]],
            "used": [2 * GiB],
            "util": [(90, 40)],
            "power_mw": [300_000],
            "energy_mj": [1_000_000],
            "clock": [1980],
            "reasons": [0],
        }
        self.scripts = {k: list(v) for k, v in {**defaults, **scripts}.items()}
        self.calls = dict.fromkeys(self.scripts, 0)
        self.shutdowns = 0

    def _next(self, name):
        script, i = self.scripts[name], self.calls[name]
        self.calls[name] += 1
        value = script[min(i, len(script) - 1)]
        if isinstance(value, Exception):
            raise value
        return value

    def nvmlInit(self):  # noqa: N802 (the NVML interface)
        pass

    def nvmlShutdown(self):  # noqa: N802
        self.shutdowns += 1

    def nvmlDeviceGetHandleByIndex(self, index):  # noqa: N802
        return f"gpu{index}"

    def nvmlDeviceGetComputeRunningProcesses(self, handle):  # noqa: N802
        return [SimpleNamespace(pid=p, usedGpuMemory=m) for p, m in self._next("procs")]

    def nvmlDeviceGetMemoryInfo(self, handle):  # noqa: N802
        return SimpleNamespace(used=self._next("used"), total=80 * GiB)

    def nvmlDeviceGetUtilizationRates(self, handle):  # noqa: N802
        gpu, memory = self._next("util")
        return SimpleNamespace(gpu=gpu, memory=memory)

    def nvmlDeviceGetPowerUsage(self, handle):  # noqa: N802
        return self._next("power_mw")

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):  # noqa: N802
        return self._next("energy_mj")

    def nvmlDeviceGetClockInfo(self, handle, kind):  # noqa: N802
        assert kind == telemetry.NVML_CLOCK_SM
        return self._next("clock")

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle):  # noqa: N802
        return self._next("reasons")


def read_all(nvml, n):
    reader = NvmlReader(nvml, "gpu0", pid=PID)
    return [reader.read() for _ in range(n)], reader.missing


def test_memory_growing_gives_the_process_figure_its_median_and_max():
    other = (PID + 1, 10 * GiB)  # another process on the same GPU: not ours
    nvml = ScriptedNvml(
        procs=[[other, (PID, g * GiB)] for g in (1, 2, 3, 6)],
        used=[g * GiB for g in (12, 13, 14, 17)],
    )
    fields = gpu_fields(*read_all(nvml, 4))
    assert fields["gpu_proc_mem_median_bytes"] == int(2.5 * GiB)
    assert fields["gpu_proc_mem_max_bytes"] == 6 * GiB
    assert fields["gpu_mem_used_max_bytes"] == 17 * GiB
    assert fields["telemetry_samples"] == 4 and fields["telemetry_missing"] == []


def test_energy_is_the_counters_difference_and_per_sample_is_mean_power_over_rate():
    samples = [
        Sample(t=10.0, energy_mj=5_000, power_w=999.0),
        Sample(t=10.5, energy_mj=105_000, power_w=999.0),
        Sample(t=12.0, energy_mj=405_000, power_w=999.0),
    ]
    fields = gpu_fields(samples, {})
    assert fields["energy_source"] == "nvml counter"
    assert fields["energy_j"] == pytest.approx(400.0)  # not the power's 999 W x 2 s
    assert fields["energy_s"] == pytest.approx(2.0)
    window = telemetry.Window("cuda", ended=1.0, cpu=[None, None], rapl=[{}, {}])
    window.sampler = SimpleNamespace(reader=SimpleNamespace(missing={}))
    window.samples = samples
    out = window.fields(samples_per_s=50.0, tokens_per_s=5000.0)
    assert out["joules_per_sample"] == pytest.approx(200.0 / 50.0)  # 200 W over 50 samples/s
    assert out["joules_per_token"] == pytest.approx(200.0 / 5000.0)
    m = Measurement(status=OK, samples_per_s=50.0, **out)
    assert m.unit_per_joule == pytest.approx(0.25)


def test_without_the_counter_energy_is_power_integrated_over_time():
    samples = [
        Sample(t=0.0, power_w=100.0),
        Sample(t=1.0, power_w=300.0),
        Sample(t=3.0, power_w=300.0),
    ]
    fields = gpu_fields(samples, {"energy": "not supported by this GPU"})
    assert fields["energy_source"] == "power x time"
    assert fields["energy_j"] == pytest.approx(200.0 + 600.0)  # trapezoids: 1 s, then 2 s
    assert fields["telemetry_missing"] == ["energy: not supported by this GPU"]


def test_a_counter_that_went_back_or_did_not_tick_is_not_trusted():
    samples = [
        Sample(t=0.0, energy_mj=9_000, power_w=50.0),
        Sample(t=2.0, energy_mj=10, power_w=50.0),
    ]
    fields = gpu_fields(samples, {})
    assert fields["energy_source"] == "power x time" and fields["energy_j"] == pytest.approx(100.0)
    still = [Sample(t=0.0, energy_mj=10, power_w=50.0), Sample(t=0.5, energy_mj=10, power_w=50.0)]
    assert gpu_fields(still, {})["energy_j"] == pytest.approx(25.0)  # the counter did not tick


def test_a_throttle_reason_in_any_sample_flags_the_window_and_idle_does_not():
    idle, power_cap, thermal = 0x1, 0x4, 0x40
    nvml = ScriptedNvml(reasons=[idle, power_cap | idle, 0, thermal, 0], clock=[1980, 1500, 1980])
    fields = gpu_fields(*read_all(nvml, 5))
    assert fields["throttled"] == ["hw_thermal", "sw_power_cap"]
    assert fields["throttled_share"] == pytest.approx(2 / 5)
    assert fields["sm_clock_min_mhz"] == 1500 and fields["sm_clock_median_mhz"] == 1980
    calm = gpu_fields(*read_all(ScriptedNvml(reasons=[idle, 0]), 2))
    assert calm["throttled"] == [] and calm["throttled_share"] == 0.0


def test_an_unsupported_reading_is_asked_once_named_and_the_rest_still_read():
    nvml = ScriptedNvml(energy_mj=[NVMLError_NotSupported()], power_mw=[100_000, 300_000])
    samples, missing = read_all(nvml, 3)
    assert nvml.calls["energy_mj"] == 1
    assert missing == {"energy": "not supported by this GPU"}
    assert all(s.energy_mj is None and s.sm_util_pct == 90 for s in samples)
    fields = gpu_fields(samples, missing)
    assert fields["energy_source"] == "power x time"
    assert fields["power_max_w"] == 300.0 and fields["power_median_w"] == 300.0


def test_a_passing_nvml_error_drops_that_sample_only():
    nvml = ScriptedNvml(util=[(50, 10), NVMLError("GPU is busy"), (70, 30)])
    samples, missing = read_all(nvml, 3)
    assert [s.sm_util_pct for s in samples] == [50, None, 70]
    assert missing == {}
    assert gpu_fields(samples, missing)["sm_util_median_pct"] == 60


def test_a_process_nvml_does_not_list_has_no_figure_and_the_limit_judges_the_peak():
    nvml = ScriptedNvml(procs=[[(1, 5 * GiB)]])  # a container's PID namespace: other numbers
    samples, missing = read_all(nvml, 2)
    assert nvml.calls["procs"] == 1 and "proc_mem" in missing
    fields = gpu_fields(samples, missing)
    assert "gpu_proc_mem_max_bytes" not in fields
    m = Measurement(status=OK, peak_mem_bytes=3 * GiB, **fields)
    assert m.judged_mem_bytes == 3 * GiB


def test_the_sampler_brackets_the_window_and_reads_at_its_interval():
    nvml = ScriptedNvml(energy_mj=list(range(0, 10**9, 1000)))
    sampler = GpuSampler(NvmlReader(nvml, "gpu0", pid=PID), interval_s=0.01)
    before = time.perf_counter()
    sampler.start()
    time.sleep(0.2)
    after = time.perf_counter()
    samples = sampler.stop()
    assert samples[0].t <= after and samples[-1].t >= after and samples[0].t >= before
    assert 5 <= len(samples) <= 25  # 20 intervals, give or take a busy machine
    assert not sampler._thread.is_alive()
    with pytest.raises(ValueError, match="interval_s must be above 0 but got 0"):
        GpuSampler(NvmlReader(nvml, "gpu0"), interval_s=0)


def test_a_cuda_window_through_a_scripted_nvml(tmp_path):
    nvml = ScriptedNvml(
        procs=[[(os.getpid(), GiB)]],
        energy_mj=[0, *range(10_000, 10**9, 10_000)],
        reasons=[0, 0x4],
    )
    device = SimpleNamespace(type="cuda", index=0)
    window = open_window(device, nvml=nvml, interval_s=0.01, powercap=tmp_path / "none")
    time.sleep(0.25)  # longer than telemetry.CPU_TICKS of /proc's ticks: CPU use is read
    window.close()
    fields = window.fields(samples_per_s=100.0)
    assert nvml.shutdowns == 1
    assert fields["gpu_proc_mem_max_bytes"] == GiB
    assert fields["energy_source"] == "nvml counter" and fields["energy_j"] > 0
    watts = fields["energy_j"] / fields["energy_s"]
    assert fields["joules_per_sample"] == pytest.approx(watts / 100.0)
    assert fields["throttled"] == ["sw_power_cap"]
    assert fields["cpu_util_cores"] >= 0
    assert "cpu_energy_j" not in fields  # no RAPL in the temporary folder
    assert Measurement(status=OK, **fields).to_dict()["throttled"] == ["sw_power_cap"]


def test_a_cuda_window_without_nvml_says_why_and_invents_nothing(tmp_path):
    class Broken(ScriptedNvml):
        def nvmlInit(self):  # noqa: N802
            raise NVMLError("Driver Not Loaded")

    window = open_window(SimpleNamespace(type="cuda", index=0), nvml=Broken(), powercap=tmp_path)
    fields = window.fields(samples_per_s=100.0)
    assert "energy_j" not in fields and "joules_per_sample" not in fields
    assert fields["telemetry_missing"][0] == "nvml: NVML cannot start: Driver Not Loaded"


def write_rapl(root: Path, joules: dict[str, float], wrap_j: float = 1000.0) -> None:
    for zone, value in joules.items():
        (root / zone).mkdir(parents=True, exist_ok=True)
        (root / zone / "energy_uj").write_text(f"{int(value * 1e6)}\n")
        (root / zone / "max_energy_range_uj").write_text(f"{int(wrap_j * 1e6)}\n")


def test_a_cpu_window_reads_rapl_packages_and_undoes_a_wrap(tmp_path):
    write_rapl(tmp_path, {"intel-rapl:0": 990.0, "intel-rapl:1": 10.0, "intel-rapl:0:0": 500.0})
    window = open_window(SimpleNamespace(type="cpu", index=None), powercap=tmp_path)
    write_rapl(tmp_path, {"intel-rapl:0": 5.0, "intel-rapl:1": 30.0, "intel-rapl:0:0": 900.0})
    fields = window.fields(samples_per_s=10.0)
    assert fields["energy_source"] == "rapl"
    assert fields["energy_j"] == pytest.approx(15.0 + 20.0)  # 990 -> 1000 -> 5, and 10 -> 30
    assert fields["joules_per_sample"] == pytest.approx(35.0 / fields["energy_s"] / 10.0)
    assert fields["telemetry_missing"] == []


def test_a_cpu_window_without_rapl_says_energy_is_not_available(tmp_path):
    window = open_window(SimpleNamespace(type="cpu", index=None), powercap=tmp_path / "powercap")
    fields = window.fields(samples_per_s=10.0)
    assert not {"energy_j", "joules_per_sample", "throttled"} & fields.keys()
    assert fields["telemetry_missing"] == [
        f"energy: no {tmp_path / 'powercap'} (no RAPL on this machine)"
    ]
    unreadable = tmp_path / "locked"
    (unreadable / "intel-rapl:0").mkdir(parents=True)  # the counter file cannot be read
    assert "not readable" in telemetry.energy_unavailable("cpu", unreadable)


def test_the_process_groups_cpu_time_counts_a_busy_process():
    pgid = os.getpgid(0)
    before = telemetry.cpu_seconds(pgid)
    end = time.process_time() + 0.3
    while time.process_time() < end:
        pass
    assert telemetry.cpu_seconds(pgid) - before >= 0.25
    assert telemetry.cpu_seconds(-7) is None  # no such group


def test_a_cpu_trial_reports_its_cpu_use_and_on_this_machine_why_no_energy(write_space, tmp_path):
    from autotune import Config, load_space
    from autotune.study.runner import run_trial

    space = load_space(
        write_space("workload: {workloads}:tiny\ntrial: {warmup_steps: 1, measured_steps: 3}\n")
    )
    m = run_trial(space, Config(batch_size=8, num_workers=1), tmp_path / "t")
    assert m.ok and m.telemetry_samples is None  # no GPU: no NVML sampling
    if m.window_s >= telemetry.CPU_TICKS / os.sysconf("SC_CLK_TCK"):
        assert 0 < m.cpu_util_cores <= os.cpu_count() + 0.5  # the trial and its worker
    else:  # too few of /proc's ticks in the window to tell its cores
        assert m.cpu_util_cores is None
    if telemetry.rapl_joules()[0]:  # a machine whose RAPL counters this user can read
        assert m.energy_source == "rapl" and m.joules_per_sample > 0
    else:
        assert m.energy_j is None and m.joules_per_sample is None and m.throttled is None
        energy = [x for x in m.telemetry_missing if x.startswith("energy:")]
        assert energy == [f"energy: {telemetry.rapl_joules()[1]}"]
