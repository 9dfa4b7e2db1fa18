"""This machine's peak FLOP rate, measured: a matmul microbenchmark per compute dtype.

Run in the probe for the dtypes the space can use (:func:`autotune.mfu.peak_keys`), so
that a config's MFU is against what this machine reaches, not a datasheet. Square
matmuls grow (doubling) until the rate stops rising: the plateau. On CUDA the
datasheet peak of a GPU NVML names is recorded beside it (:data:`autotune.mfu.DATASHEET`).
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

import torch

from ..mfu import DTYPE_OF, datasheet_peaks

# Square sizes tried, smallest first, until two in a row raise the best rate by less than
# PLATEAU_GAIN.
# How the plateau was found: on the 2-core AMD EPYC (avx512_bf16, torch 2.13 CPU) the
# rate at sizes 128, 256, 512, 1024, 2048 was, in GFLOP/s, fp32 152, 191, 201, 186, 192
# and bf16 157, 354, 424, 441, 426: flat (within the ~5% noise of a 0.08 s timing) from
# 256 for fp32 and from 512-1024 for bf16, where the doubling from 256 stops (about a
# second for both dtypes). A GPU needs larger matmuls (H100/H200: ~8192 for bf16).
START = {"cpu": 256, "cuda": 2048}
LARGEST = {"cpu": 2048, "cuda": 16384}
PLATEAU_GAIN = 0.05
# Each size is timed in WINDOWS windows of at least WINDOW_S (after one untimed matmul);
# the fastest counts: the peak is a ceiling, and a window another process disturbed is
# slower, never faster.
WINDOWS = 3
WINDOW_S = 0.04
# A size whose matmuls would take longer than this (its untimed one and one per window,
# at the best rate so far) is not tried: the plateau is then the largest size within it,
# recorded as ``capped``. Why: where a dtype has no hardware path the rate is a hundredth
# of fp32's (bf16 on the 2-core AMD EPYC without bf16 units: 1.3 GFLOP/s, a 1024 matmul
# 1.6 s, a 2048 one 13 s), and the doubling ran the probe past its 120 s limit on CI
# (2026-12-06); such a dtype is no lever, so the last doublings would tell nothing.
SIZE_S = 1.0


class Plateau(NamedTuple):
    """A dtype's measured peak: the best rate (FLOP/s), the square size that reached
    it, and whether the doubling stopped on :data:`SIZE_S` rather than on a plateau."""

    rate: float
    size: int
    capped: bool = False


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_rate(n: int, dtype: torch.dtype, device: torch.device) -> float:
    """FLOP/s of ``n x n @ n x n`` matmuls in ``dtype`` (``2 n^3`` FLOPs each): the
    fastest of :data:`WINDOWS` timed windows."""
    g = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, generator=g, device=device).to(dtype)
    b = torch.randn(n, n, generator=g, device=device).to(dtype)
    a @ b  # untimed: the library's first-call set-up
    _sync(device)
    best = 0.0
    for _ in range(WINDOWS):
        reps, start = 0, time.perf_counter()
        while True:
            a @ b
            reps += 1
            _sync(device)
            elapsed = time.perf_counter() - start
            if elapsed >= WINDOW_S:
                break
        best = max(best, 2 * n**3 * reps / elapsed)
    return best


def plateau(dtype: torch.dtype, device: torch.device) -> Plateau:
    """The highest matmul rate (FLOP/s) and the size that reached it, doubling the size
    until two sizes in a row do not raise the best rate by :data:`PLATEAU_GAIN` (one
    slow size, a moment another process took a core, does not end the search), or until
    the next size would take longer than :data:`SIZE_S`."""
    n, best, size, flat = START[device.type], 0.0, 0, 0
    while n <= LARGEST[device.type] and flat < 2:
        if best and (WINDOWS + 1) * 2 * n**3 / best > SIZE_S:
            return Plateau(best, size, capped=True)
        rate = matmul_rate(n, dtype, device)
        flat = flat + 1 if rate <= best * (1 + PLATEAU_GAIN) else 0
        if rate > best:
            best, size = rate, n
        n *= 2
    return Plateau(best, size)


def measured_peaks(keys: list[str], device: torch.device) -> dict[str, Any]:
    """Each key's measured peak: ``{key: {"flops_per_s", "size"}}`` (and ``"capped"``
    where :data:`SIZE_S` stopped the doubling), or ``{"error"}``
    for one that cannot run here. ``fp32-high``/``fp32-medium`` run fp32 matmuls under
    that ``set_float32_matmul_precision``."""
    out: dict[str, Any] = {}
    before = torch.get_float32_matmul_precision()
    try:
        for key in keys:
            dtype_name, _, precision = key.partition("-")
            torch.set_float32_matmul_precision(precision or "highest")
            try:
                found = plateau(getattr(torch, DTYPE_OF[dtype_name]), device)
            except RuntimeError as exc:  # e.g. no fp16 matmul on this CPU
                out[key] = {"error": str(exc).splitlines()[0][:200]}
                continue
            out[key] = {"flops_per_s": found.rate, "size": found.size}
            if found.capped:
                out[key]["capped"] = True
    finally:
        torch.set_float32_matmul_precision(before)
    return out


def peak_facts(keys: list[str], device: torch.device, gpu_name: str | None) -> dict[str, Any]:
    """What the environment records: the measured peaks and, for a GPU NVML names that
    :data:`autotune.mfu.DATASHEET` knows, its datasheet peaks."""
    facts: dict[str, Any] = {"peak_flops": measured_peaks(keys, device)}
    if device.type == "cuda" and gpu_name:
        sheet = datasheet_peaks(gpu_name)
        if sheet is not None:
            facts["datasheet_flops"] = sheet
    return facts
