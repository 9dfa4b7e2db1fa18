"""Token-weighted accumulation: one optimizer step over variable-length samples computes
the same gradient whatever the micro-batch split, in one process and over gloo ranks.

The model is examples/text_lm.py's causal LM (right padding never reaches a real token);
SGD with lr=1 makes a step's parameter change the negative gradient, read exactly.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from autotune import Config
from autotune.errors import WorkloadError
from autotune.trial.apply import apply_workload
from autotune.workload import Tokens, load_workload

ROOT = Path(__file__).resolve().parents[2]


def _text_lm(**tokens):
    workload = load_workload(
        "examples/text_lm.py:workload",
        {"n": 256, "median": 32, "longest": 160, "dim": 32, "layers": 1},
        base_dir=ROOT,
    )
    return dataclasses.replace(
        workload,
        optimizer=lambda params: torch.optim.SGD(params, lr=1.0),
        tokens=dataclasses.replace(workload.tokens, **tokens),
    )


def _step(config: Config, workload) -> tuple[torch.Tensor, torch.Tensor]:
    """One optimizer step: (the negative gradient of every parameter, flat; the step's loss)."""
    applied = apply_workload(config, workload, device="cpu", endless=True)
    model = applied.model.module if hasattr(applied.model, "module") else applied.model
    before = [_full(p).clone() for p in model.parameters()]
    loss = applied.train_step(iter(applied.loader))
    after = [_full(p) for p in model.parameters()]
    return torch.cat([(b - a).flatten() for b, a in zip(before, after, strict=True)]), loss


def _full(p: torch.Tensor) -> torch.Tensor:
    p = p.detach()
    return p.full_tensor() if hasattr(p, "full_tensor") else p


SPLITS = [(8, 8), (16, 4), (64, 1)]


def test_every_micro_batch_split_of_a_step_gives_the_same_gradient():
    workload = _text_lm()
    steps = [_step(Config(batch_size=b, accumulation_steps=a), workload) for b, a in SPLITS]
    (grad, loss), rest = steps[0], steps[1:]
    assert grad.abs().sum() > 0
    for other, other_loss in rest:
        torch.testing.assert_close(other, grad, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(other_loss, loss, rtol=1e-5, atol=1e-6)


def test_a_per_token_sum_loss_is_divided_by_the_steps_tokens():
    """Tokens(loss="token_sum"): the workload's loss sums its tokens; the step's gradient
    is the same per-token mean as a mean loss gives."""
    mean = _step(Config(batch_size=16, accumulation_steps=4), _text_lm())
    summed = _text_lm(loss="token_sum")
    loss = summed.loss
    summed = dataclasses.replace(summed, loss=lambda model, batch: _summed(loss, model, batch))
    for b, a in SPLITS:
        grad, step_loss = _step(Config(batch_size=b, accumulation_steps=a), summed)
        torch.testing.assert_close(grad, mean[0], rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(step_loss, mean[1], rtol=1e-5, atol=1e-6)


def _summed(mean_loss, model, batch):
    return mean_loss(model, batch) * (batch["labels"][:, 1:] != -100).sum()


def test_a_per_sample_loss_weighs_micro_batches_equally():
    """Tokens(loss="sample_mean") keeps the plain rule: the step's loss is the mean of its
    micro-batches' losses."""
    workload = _text_lm(loss="sample_mean")
    applied = apply_workload(Config(batch_size=16, accumulation_steps=4), workload, device="cpu")
    batches = list(iter(applied.loader))[:4]
    with torch.no_grad():
        expected = torch.stack([workload.loss(applied.model, b) for b in batches]).mean()
    torch.testing.assert_close(applied.train_step(iter(batches)), expected)


def test_a_loss_kind_that_is_not_one_of_the_three_names_the_field():
    with pytest.raises(WorkloadError, match=r"tokens.loss must be one of token_mean, token_sum"):
        Tokens(pad_id=0, loss="mean")


def _ranks(rank: int, store: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    torch.set_num_threads(1)
    try:
        grads = {}
        for name, extra in (("ddp", {}), ("fsdp", {"fsdp": "root"})):
            config = Config(batch_size=8, accumulation_steps=4, world_size=2, **extra)
            grad, loss = _step(config, _text_lm())
            dist.all_reduce(loss)  # the mean over the ranks is the step's loss
            grads[name] = grad, loss / 2
        if rank == 0:
            torch.save(grads, out)
        dist.barrier()  # neither rank tears gloo down while the other still uses it
    finally:
        dist.destroy_process_group()
    # Skip the interpreter's teardown (as a trial process does): a gloo thread destroyed
    # there once ended a rank with "terminate called without an active exception"
    # (SIGABRT) after its work was done, in a full-suite run.
    os._exit(0)


def test_two_gloo_ranks_step_like_one_process_with_their_samples(tmp_path):
    """DDP and FSDP over 2 gloo ranks (8 x 4 each) against one process of 64 x 1: the
    token count is all-reduced before the first backward, so the ranks' gradients average
    to the step's per-token mean, and the mean of the ranks' losses is the step's loss."""
    single = _step(Config(batch_size=64), _text_lm())
    out = tmp_path / "grads.pt"
    mp.spawn(_ranks, args=(str(tmp_path / "store"), str(out)), nprocs=2)
    for name, (grad, loss) in torch.load(out).items():
        torch.testing.assert_close(grad, single[0], rtol=1e-4, atol=1e-6, msg=name)
        torch.testing.assert_close(loss, single[1], rtol=1e-5, atol=1e-6, msg=name)
