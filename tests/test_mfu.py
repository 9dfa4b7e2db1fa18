"""MFU as a value (autotune.mfu): which peak a config is measured against, and the one
computation every view uses."""

from __future__ import annotations

import pytest

from autotune import Config, Measurement
from autotune.mfu import datasheet_peaks, describe, mfu_of, peak_key, peak_keys, unavailable

ENV = {
    "device": "cpu",
    "model_flops": {"unit": "samples", "per_unit": 3.0e6},
    "peak_flops": {
        "fp32": {"flops_per_s": 100e9, "size": 1024},
        "bf16": {"flops_per_s": 200e9, "size": 1024},
    },
}


def _ok(samples_per_s: float, **fields) -> Measurement:
    return Measurement(status="ok", samples_per_s=samples_per_s, **fields)


def test_a_config_is_measured_against_the_peak_of_the_dtype_it_computes_in():
    assert peak_key(Config()) == "fp32"
    assert peak_key(Config(amp_dtype="bf16")) == "bf16"
    assert peak_key(Config(amp_dtype="fp16")) == "fp16"
    assert peak_key(Config(matmul_precision="high")) == "fp32-high"
    assert peak_keys({"amp_dtype": ("fp32", "bf16")}, Config()) == ["fp32", "bf16"]
    knobs = {"matmul_precision": ("highest", "medium"), "amp_dtype": ("fp16",)}
    assert peak_keys(knobs, Config()) == ["fp32", "fp32-medium", "fp16"]


def test_mfu_is_model_flops_per_second_over_the_measured_peak():
    found = mfu_of(_ok(10_000.0), Config(), ENV)
    assert found.flops_per_s == pytest.approx(3.0e6 * 10_000)
    assert found.mfu == pytest.approx(3.0e10 / 100e9)
    assert found.text() == "30% fp32"
    bf16 = mfu_of(_ok(10_000.0), Config(amp_dtype="bf16"), ENV)
    assert bf16.mfu == pytest.approx(3.0e10 / 200e9) and bf16.peak == "bf16"
    # A precision not measured (it changes nothing here) is plain fp32.
    assert mfu_of(_ok(10_000.0), Config(matmul_precision="high"), ENV).mfu == found.mfu


def test_token_workloads_count_real_tokens_and_units_must_agree():
    env = {**ENV, "model_flops": {"unit": "tokens", "per_unit": 1.0e6}}
    m = _ok(100.0, tokens_per_s=20_000.0, unit="tokens")
    assert mfu_of(m, Config(), env).mfu == pytest.approx(1.0e6 * 20_000 / 100e9)
    assert mfu_of(_ok(100.0), Config(), env) is None  # counted per token, measured per sample


def test_no_mfu_without_an_ok_rate_the_flops_or_the_peak():
    assert mfu_of(Measurement(status="oom"), Config(), ENV) is None
    assert mfu_of(_ok(10.0), Config(amp_dtype="fp16"), ENV) is None  # fp16 not measured
    assert mfu_of(_ok(10.0), Config(), {}) is None  # a study probed before MFU existed
    assert unavailable({}) is None and describe({}) is None
    untraced = {**ENV, "model_flops": {"unit": "samples", "per_unit": None, "reason": "why"}}
    assert mfu_of(_ok(10.0), Config(), untraced) is None
    assert unavailable(untraced) == "why" and describe(untraced) is None


def test_a_multi_gpu_config_is_measured_against_all_its_devices():
    env = {**ENV, "device": "cuda", "datasheet_flops": {"fp32": 400e9}}
    found = mfu_of(_ok(10_000.0), Config(world_size=2), env)
    assert found.mfu == pytest.approx(3.0e10 / (2 * 100e9))
    assert found.datasheet == pytest.approx(3.0e10 / (2 * 400e9))


def test_the_datasheet_knows_gpus_by_the_name_nvml_gives():
    assert datasheet_peaks("NVIDIA H100 80GB HBM3")["bf16"] == 989e12
    assert datasheet_peaks("NVIDIA H100 PCIe")["bf16"] == 756e12
    assert datasheet_peaks("NVIDIA A100-SXM4-40GB")["fp32-high"] == 156e12
    assert datasheet_peaks("Some Future GPU") is None


def test_an_fsdp_config_with_bf16_parameters_is_measured_against_the_bf16_peak():
    """FSDP's MixedPrecisionPolicy(param_dtype=bf16) computes in bf16 without autocast:
    its MFU is over the bf16 peak (the fp32 one would double it), and a space that can
    choose it has the probe measure that peak."""
    env = {**ENV, "device": "cuda", "datasheet_flops": {"fp32": 400e9, "bf16": 800e9}}
    config = Config(world_size=2, fsdp="root", fsdp_param_dtype="bf16")
    found = mfu_of(_ok(10_000.0), config, env)
    assert found.peak == "bf16" and found.text() == "8% bf16"
    assert found.mfu == pytest.approx(3.0e10 / (2 * 200e9))
    assert found.datasheet == pytest.approx(3.0e10 / (2 * 800e9))
    # bf16 parameters with fp32 gradient reduction still compute in bf16
    mixed = config.replace(fsdp_reduce_dtype="fp32")
    assert mfu_of(_ok(10_000.0), mixed, env).peak == "bf16"
    # fp32 parameters under FSDP: the fp32 peak
    fp32 = mfu_of(_ok(10_000.0), config.replace(fsdp_param_dtype="fp32"), env)
    assert fp32.peak == "fp32" and fp32.mfu == pytest.approx(3.0e10 / (2 * 100e9))
    assert peak_keys({"fsdp_param_dtype": ("fp32", "bf16")}, Config()) == ["fp32", "bf16"]
    assert peak_keys({"world_size": (1, 2)}, config) == ["fp32", "bf16"]  # the baseline's
