"""This machine's measured peak (autotune.trial.peak): a matmul rate grown to its plateau,
for the dtypes the space can use here."""

from __future__ import annotations

import pytest
import torch

from autotune.trial import peak
from autotune.trial.probe import usable_peak_keys

CPU = torch.device("cpu")


def test_the_plateau_is_the_best_rate_once_two_sizes_in_a_row_add_nothing(monkeypatch):
    rates = {256: 50e9, 512: 80e9, 1024: 82e9, 2048: 83e9}  # flat within 5% from 512
    tried = []

    def rate(n, dtype, device):
        tried.append(n)
        return rates[n]

    monkeypatch.setattr(peak, "matmul_rate", rate)
    assert peak.plateau(torch.float32, CPU) == (83e9, 2048)
    rates.update({512: 40e9, 1024: 90e9})  # one slow size (a busy moment) does not end it
    assert peak.plateau(torch.float32, CPU) == (90e9, 1024)
    tried.clear()
    rates.update({512: 40e9, 1024: 45e9})  # two in a row do
    assert peak.plateau(torch.float32, CPU) == (50e9, 256) and tried == [256, 512, 1024]


def test_the_measured_peak_is_a_real_matmul_rate():
    found = peak.measured_peaks(["fp32"], CPU)["fp32"]
    assert found["size"] in (256, 512, 1024, 2048)
    again = peak.matmul_rate(found["size"], torch.float32, CPU)
    assert found["flops_per_s"] == pytest.approx(again, rel=0.5)  # a 2-core machine is noisy
    assert torch.get_float32_matmul_precision() == "highest"  # restored


def test_only_the_dtypes_this_device_runs_are_measured():
    caps = {"bf16": True, "fp16": False, "matmul_precisions": ["highest", "medium"]}
    keys = ["fp32", "fp32-high", "fp32-medium", "bf16", "fp16"]
    assert usable_peak_keys(keys, caps) == ["fp32", "fp32-medium", "bf16"]
