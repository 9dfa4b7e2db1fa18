"""The model FLOPs of one training step, counted by PyTorch's own counter.

Run once per study in the probe: one forward and backward of the baseline's micro-batch
under ``torch.utils.flop_counter.FlopCounterMode``, in fp32, eager, without gradient
checkpointing (its recomputation is not useful work: MFU, not HFU). The counter counts
matmuls, convolutions and attention (not elementwise ops), as nanoGPT's and the PaLM
paper's MFU do. The figure is per sample, or for token workloads per real token: each
sample of the micro-batch runs alone, unpadded, so padding is not counted as useful work.

A step the counter cannot trace gets no figure and the reason: an op without a FLOP
formula from outside torch's own libraries (a custom kernel), an error under the
counter, or nothing counted at all.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from ..config import Config
from ..errors import first_line
from ..workload import Workload
from .apply import StreamSampler, collate_for, to_device
from .tokens import count_batch

# Namespaces of torch's own ops: those without a FLOP formula move data or are
# elementwise, which MFU does not count. An op from any other namespace is a custom
# kernel whose FLOPs the counter cannot know.
_TORCH_NAMESPACES = {"aten", "prims", "prim", "_c10d_functional", "c10d", "profiler"}


class _Ops(TorchDispatchMode):
    """Records the namespaced names of the ops a step dispatches outside torch's own."""

    def __init__(self) -> None:
        super().__init__()
        self.foreign: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        namespace = getattr(func, "namespace", "aten")
        if namespace not in _TORCH_NAMESPACES:
            self.foreign.add(f"{namespace}::{func.__name__.split('.')[0]}")
        return func(*args, **(kwargs or {}))


def count_step(model: torch.nn.Module, loss_fn: Any, batch: Any) -> tuple[int, set[str]]:
    """The FLOPs of one forward, loss and backward of ``batch`` (gradients left zeroed),
    and the custom ops it ran that the counter has no formula for."""
    model.zero_grad(set_to_none=True)
    with FlopCounterMode(display=False) as counter, _Ops() as ops:
        loss_fn(model, batch).float().backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops(), ops.foreign


def _samples(dataset: Any, batch_size: int, seed: int) -> list[Any]:
    """The first micro-batch's samples, in the order a trial's loader takes them."""
    order = StreamSampler(len(dataset), seed)
    return [dataset[i] for i in itertools.islice(iter(order), batch_size)]


def _real_tokens(workload: Workload, batch: Any) -> int:
    if workload.count_tokens is not None:
        return int(workload.count_tokens(batch))
    counted = count_batch(batch)
    if counted is None:
        raise ValueError("the batch has no attention_mask and the workload no count_tokens")
    return counted[0]


def model_flops(
    workload: Workload, dataset: Any, baseline: Config, device: torch.device, seed: int = 0
) -> dict[str, Any]:
    """FLOPs per sample (``unit: samples``) or per real token (``unit: tokens``) of one
    training step of the baseline's micro-batch, as plain data.

    ``per_unit`` is ``None`` and ``reason`` says why when the counter cannot trace the
    step. For token workloads ``padded_ratio`` is the FLOPs of the micro-batch padded as
    the baseline pads it over those of its samples unpadded: what padding adds.
    """
    tokens = workload.tokens is not None
    out: dict[str, Any] = {"unit": "tokens" if tokens else "samples", "per_unit": None}
    out["counter"] = "torch.utils.flop_counter.FlopCounterMode, forward and backward, fp32"
    try:
        torch.manual_seed(seed)
        model = workload.model().to(device)
        model.train()
        samples = _samples(dataset, baseline.batch_size, seed)
        fp32 = Config(batch_size=baseline.batch_size)  # no packing: samples as they are
        collate = collate_for(fp32, workload.tokens, workload.collate_fn)
        collate = collate or torch.utils.data.default_collate
        if tokens:  # each sample alone: no padding in the count
            batches = [to_device(collate([s]), device) for s in samples]
        else:
            batches = [to_device(collate(samples), device)]
        flops, foreign, units = 0, set(), 0
        for batch in batches:
            counted, ops = count_step(model, workload.loss, batch)
            flops, foreign = flops + counted, foreign | ops
            units += _real_tokens(workload, batch) if tokens else len(samples)
        if tokens and workload.owns_collate:
            out["padded_ratio"] = _padded_ratio(workload, model, samples, baseline, device, flops)
    except Exception as exc:  # a workload the counter cannot run: no MFU, the study goes on
        out["reason"] = f"the FLOP counter failed on the step: {type(exc).__name__}: "
        out["reason"] += first_line(exc)[:200]
        return out
    if foreign:
        out["reason"] = (
            f"the step runs custom op(s) {', '.join(sorted(foreign))} that the FLOP counter "
            "has no formula for"
        )
    elif not flops:
        out["reason"] = "the FLOP counter found no matmul, convolution or attention in the step"
    elif not units:
        out["reason"] = "the micro-batch holds no real tokens"
    else:
        out.update(per_unit=flops / units, counted_units=units, step_flops=flops)
    return out


def _padded_ratio(
    workload: Workload,
    model: torch.nn.Module,
    samples: list[Any],
    baseline: Config,
    device: torch.device,
    unpadded: int,
) -> float | None:
    """The FLOPs of the baseline's micro-batch as it collates it (padded, or packed
    into rows with EOS separators) over ``unpadded``."""
    collate = collate_for(baseline, workload.tokens, workload.collate_fn)
    batch = to_device(collate(samples), device)
    padded, _ = count_step(model, workload.loss, batch)
    return padded / unpadded if unpadded else None
