"""The probe asks torch and the workload what can run here (in-process, real torch)."""

from __future__ import annotations

import torch
import workloads

from autotune.trial.probe import capabilities, matmul_precisions, sdpa_backends

CPU = torch.device("cpu")


def _caps(workload):
    return capabilities(CPU, workload, workload.dataset())


def test_conv_and_attention_are_detected_from_the_forward():
    cnn, lm, mlp = (
        _caps(w()) for w in (workloads.tiny_cnn, workloads.tiny_attention, workloads.tiny)
    )
    assert cnn["conv2d"] and not cnn["attention"]
    assert lm["attention"] and not lm["conv2d"]
    assert not mlp["conv2d"] and not mlp["attention"]
    assert cnn["workload_blocks"] == 4 and lm["workload_blocks"] == 0


def test_optimizer_implementations_are_tried():
    sgd = _caps(workloads.tiny())
    assert sgd["optimizer"] == "SGD" and set(sgd["optimizer_impls"]) == {
        "foreach",
        "fused",
        "for-loop",
    }
    rms = _caps(workloads.rmsprop())
    assert rms["optimizer"] == "RMSprop" and rms["optimizer_impls"] == ["foreach", "for-loop"]


def test_sdpa_backends_and_matmul_precisions_on_cpu():
    backends = sdpa_backends(CPU)
    assert "math" in backends
    assert "cudnn" not in backends  # a CUDA-only kernel
    before = torch.get_float32_matmul_precision()
    found = matmul_precisions(CPU)
    assert found[0] == "highest" and set(found) <= {"highest", "high", "medium"}
    assert torch.get_float32_matmul_precision() == before  # the probe leaves no trace


def test_blocks_to_shard_and_their_classes_are_found():
    mlp, none = _caps(workloads.tiny()), _caps(workloads.no_blocks())
    assert mlp["fsdp"] and mlp["shardable_blocks"] == 2 and mlp["block_types"] == ["Sequential"]
    assert none["shardable_blocks"] == 0 and none["block_types"] == []


def test_the_environment_says_whether_energy_can_be_read_here():
    from autotune.trial import probe, telemetry

    assert probe.environment("cpu")["energy_unavailable"] == telemetry.rapl_joules()[1]
