"""The model FLOPs of a step (autotune.trial.flops): PyTorch's counter against FLOPs known
by hand, per real token for token workloads, and the reason when a step cannot be counted."""

from __future__ import annotations

import itertools

import pytest
import torch
import workloads

from autotune.config import Config
from autotune.trial.apply import StreamSampler
from autotune.trial.flops import model_flops
from autotune.trial.tokens import sample_ids

CPU = torch.device("cpu")


def linear_stack_flops(widths: tuple[int, ...], samples: int) -> int:
    """2 x weights x samples forward; backward twice that, less the first layer's input
    gradient (the input does not require one)."""
    weights = [a * b for a, b in workloads.pairs(widths)]
    forward = 2 * sum(weights) * samples
    return forward + 2 * forward - 2 * weights[0] * samples


@pytest.mark.parametrize("batch_size", [8, 32])
def test_a_linear_stack_counts_what_its_weights_say(batch_size):
    wl = workloads.linear_stack()
    found = model_flops(wl, wl.dataset(), Config(batch_size=batch_size), CPU)
    assert found.get("reason") is None
    assert found["unit"] == "samples" and found["counted_units"] == batch_size
    expected = linear_stack_flops(workloads.LINEAR_WIDTHS, batch_size)
    assert found["step_flops"] == pytest.approx(expected, rel=0.01)
    assert found["per_unit"] == pytest.approx(expected / batch_size, rel=0.01)


def test_gradient_checkpointing_recomputation_is_not_counted():
    """MFU, not HFU: a baseline with checkpointing on is counted without it."""
    wl = workloads.tiny()
    plain = model_flops(wl, wl.dataset(), Config(batch_size=16), CPU)
    checkpointed = Config(batch_size=16, gradient_checkpointing=True)
    assert model_flops(wl, wl.dataset(), checkpointed, CPU)["per_unit"] == plain["per_unit"]


def _attention_flops(t: int, d: int = 16, vocab: int = 32) -> int:
    """tests/workloads.py ExplicitAttention on one sample of ``t`` tokens, forward and
    backward: the qkv and head Linears 3 x 2 x weights per position (their inputs need
    gradients), the two (t x t) products 3 x 2 x t^2 x d each."""
    return 3 * 2 * t * (d * 3 * d + d * vocab) + 2 * 3 * 2 * t * t * d


def test_a_token_workload_counts_per_real_token_without_padding():
    wl = workloads.texts()
    dataset = wl.dataset()
    found = model_flops(wl, dataset, Config(batch_size=8), CPU)
    picked = list(itertools.islice(iter(StreamSampler(len(dataset), 0)), 8))
    lengths = [len(sample_ids(dataset[i])) for i in picked]
    assert found["unit"] == "tokens" and found["counted_units"] == sum(lengths)
    expected = sum(_attention_flops(t) for t in lengths) / sum(lengths)
    assert found["per_unit"] == pytest.approx(expected, rel=0.01)
    # The baseline pads every sample to the longest: that is extra work, not model FLOPs.
    padded = len(lengths) * _attention_flops(max(lengths))
    assert found["padded_ratio"] == pytest.approx(padded / (expected * sum(lengths)), rel=0.01)
    assert found["padded_ratio"] > 1.5


def test_a_custom_kernel_gets_no_figure_and_the_reason():
    wl = workloads.custom_kernel()
    found = model_flops(wl, wl.dataset(), Config(batch_size=8), CPU)
    assert found["per_unit"] is None
    assert "autotune_tests::opaque_scale" in found["reason"]
    assert "no formula" in found["reason"]


def test_a_step_that_fails_under_the_counter_gets_the_error_as_reason():
    wl = workloads.linear_stack()

    def broken(model, x):
        raise RuntimeError("fake tracing went wrong")

    bad = type(wl)(model=wl.model, dataset=wl.dataset, loss=broken)
    found = model_flops(bad, bad.dataset(), Config(batch_size=4), CPU)
    assert found["per_unit"] is None
    assert found["reason"].startswith("the FLOP counter failed on the step: RuntimeError")
    assert "fake tracing went wrong" in found["reason"]
