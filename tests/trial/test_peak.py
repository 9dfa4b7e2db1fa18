"""This machine's measured peak (autotune.trial.peak): a matmul rate grown to its plateau,
for the dtypes the space can use here."""

from __future__ import annotations

import statistics
import time

import pytest
import torch

from autotune import mfu
from autotune.trial import peak
from autotune.trial.probe import usable_peak_keys

CPU = torch.device("cpu")


def _rates(monkeypatch, rates: dict[int, float]) -> list[int]:
    """``matmul_rate`` answers ``rates[n]`` (looked up at each call, so a test may change
    them); returns the list of the sizes asked for, in order."""
    tried: list[int] = []

    def rate(n, dtype, device):
        tried.append(n)
        return rates[n]

    monkeypatch.setattr(peak, "matmul_rate", rate)
    return tried


def test_the_plateau_is_the_best_rate_once_two_sizes_in_a_row_add_nothing(monkeypatch):
    rates = {256: 50e9, 512: 80e9, 1024: 82e9, 2048: 83e9}  # flat within 5% from 512
    tried = _rates(monkeypatch, rates)
    assert peak.plateau(torch.float32, CPU) == (83e9, 2048, False)
    rates.update({512: 40e9, 1024: 90e9})  # one slow size (a busy moment) does not end it
    assert peak.plateau(torch.float32, CPU) == (90e9, 1024, False)
    tried.clear()
    rates.update({512: 40e9, 1024: 45e9})  # two in a row do
    assert peak.plateau(torch.float32, CPU) == (50e9, 256, False)
    assert tried == [256, 512, 1024]


def test_a_dtype_without_a_fast_path_stops_before_a_size_too_slow_to_time(monkeypatch):
    # bf16 on a CPU without bf16 units (the AMD EPYC of 2026-12-06): ~1.3 GFLOP/s and
    # rising a little with the size, so no two sizes in a row are flat. A 1024 matmul
    # there takes 1.6 s, four of them (one untimed, one per window) 6.5 s: over SIZE_S,
    # not tried; the doubling would have gone on to 2048 (13 s a matmul) and past the
    # probe's time limit.
    tried = _rates(monkeypatch, {256: 1.20e9, 512: 1.30e9, 1024: 1.40e9, 2048: 1.50e9})
    assert peak.plateau(torch.bfloat16, CPU) == (1.30e9, 512, True)
    assert tried == [256, 512]
    found = peak.measured_peaks(["bf16"], CPU)["bf16"]
    assert found == {"flops_per_s": 1.30e9, "size": 512, "capped": True}
    assert "larger ones too slow" in mfu.peaks_text({"peak_flops": {"bf16": found}})


@pytest.fixture
def one_thread():
    """torch on one thread: a process busy on the other core of a 2-core machine then
    slows no matmul by making one of its two threads wait (rates swing up to 4x)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_the_measured_peak_is_a_real_matmul_rate(one_thread):
    """The peak is the rate of the size it names. The plateau is the fastest of up to
    fifteen windows (five sizes), so it is measured again as the fastest of fifteen at its
    size, and the bound is a factor of two either way: CI once saw a single re-measure of
    three windows at 0.66x the plateau on a busy 2-core machine. A peak in other units,
    of another size's rate, or a sum over sizes is out."""
    found = peak.measured_peaks(["fp32"], CPU)["fp32"]
    assert found["size"] in (256, 512, 1024, 2048)
    again = max(peak.matmul_rate(found["size"], torch.float32, CPU) for _ in range(5))
    assert 0.5 < found["flops_per_s"] / again < 2.0, (found, again)
    assert torch.get_float32_matmul_precision() == "highest"  # restored


def _mm_rate(n: int, windows: int = 3, window_s: float = 0.04) -> float:
    """FLOP/s of ``torch.mm`` on two n x n fp32 matrices, timed here: a matmul of two
    n x n matrices is n^3 multiply-adds, 2 n^3 FLOPs. The fastest of ``windows`` windows
    of at least ``window_s`` (as long as the probe's, so that both see the same bursts)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    best = 0.0
    for _ in range(windows):
        reps, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < window_s or not reps:
            torch.mm(a, b)
            reps += 1
        best = max(best, 2 * n**3 * reps / elapsed)
    return best


def test_the_matmul_rate_counts_two_flops_per_multiply_add(one_thread):
    """matmul_rate against torch.mm timed independently in the same process: the same
    rate within a loose two-sided bound. Each round takes the two in turns (a busy moment
    touches both); the median of five rounds is robust to a round another process
    disturbed. Counted as n^3 FLOPs (half the rate), or 4 n^3, it is out."""
    n, ratios = 256, []
    for _ in range(5):
        ours = independent = 0.0
        for _ in range(2):
            independent = max(independent, _mm_rate(n))
            ours = max(ours, peak.matmul_rate(n, torch.float32, CPU))
        ratios.append(ours / independent)
    assert 0.7 < statistics.median(ratios) < 1.4, ratios


def test_only_the_dtypes_this_device_runs_are_measured():
    caps = {"bf16": True, "fp16": False, "matmul_precisions": ["highest", "medium"]}
    keys = ["fp32", "fp32-high", "fp32-medium", "bf16", "fp16"]
    assert usable_peak_keys(keys, caps) == ["fp32", "fp32-medium", "bf16"]
