"""Each core knob really takes effect (in-process, real torch)."""

from __future__ import annotations

import pytest
import torch
from workloads import MLP, Blobs, _loss

from autotune import Config, apply
from autotune.training import StreamSampler, make_loader


def _applied(**knobs):
    torch.manual_seed(0)
    model = MLP()
    return apply(
        Config(**knobs),
        model=model,
        dataset=Blobs(),
        loss=_loss,
        blocks=list(model.blocks),
        device="cpu",
    )


def test_batch_size_and_workers_reach_the_loader():
    a = _applied(batch_size=24, num_workers=1)
    assert a.loader.batch_size == 24 and a.loader.num_workers == 1
    x, y = next(iter(a.loader))
    assert x.shape == (24, 16)


@pytest.mark.parametrize(("amp", "dtype"), [("fp32", torch.float32), ("bf16", torch.bfloat16)])
def test_amp_dtype_sets_autocast(amp, dtype):
    a = _applied(amp_dtype=amp)
    with a.autocast():
        out = a.model(torch.randn(2, 16))
    assert out.dtype == dtype


def test_fp16_uses_a_grad_scaler():
    a = _applied(amp_dtype="fp16")
    assert isinstance(a.scaler, torch.amp.GradScaler)
    loss = a.train_step(iter(a.loader))
    assert torch.isfinite(loss)


def test_accumulation_runs_that_many_micro_batches_per_step():
    a = _applied(batch_size=8, accumulation_steps=3)
    seen = []

    def counting(batches):
        for b in batches:
            seen.append(b)
            yield b

    a.train_step(counting(iter(a.loader)))
    assert len(seen) == 3


def test_gradient_checkpointing_recomputes_block_forwards():
    calls = []
    a = _applied(gradient_checkpointing=True)
    block = a.model.blocks[0]
    assert getattr(block, "_autotune_checkpointed", False)
    block[0].register_forward_hook(lambda *args: calls.append(1))
    a.train_step(iter(a.loader))
    assert len(calls) == 2  # forward once, recomputed once in backward
    plain = _applied()
    plain.model.blocks[0][0].register_forward_hook(lambda *args: calls.append(2))
    plain.train_step(iter(plain.loader))
    assert calls.count(2) == 1


def test_compile_mode_wraps_the_model():
    a = _applied(compile_mode="default")
    assert isinstance(a.model, torch._dynamo.eval_frame.OptimizedModule)
    assert not isinstance(_applied().model, torch._dynamo.eval_frame.OptimizedModule)


def test_checkpointing_without_blocks_is_a_clear_error():
    with pytest.raises(ValueError, match="needs the model's blocks"):
        apply(Config(gradient_checkpointing=True), model=MLP(), dataset=Blobs(), loss=_loss)


def test_sample_order_is_the_same_for_every_batch_size():
    small = StreamSampler(10, seed=3)
    it = iter(small)
    first = [next(it) for _ in range(25)]
    it2 = iter(StreamSampler(10, seed=3))
    assert [next(it2) for _ in range(25)] == first
    assert sorted(first[:10]) == list(range(10))  # each pass is a permutation
    xa = torch.cat(
        [x for x, _ in _take(make_loader(Blobs(), Config(batch_size=8), endless=True), 4)]
    )
    xb = torch.cat(
        [x for x, _ in _take(make_loader(Blobs(), Config(batch_size=16), endless=True), 2)]
    )
    assert torch.equal(xa, xb)


def _take(loader, n):
    it = iter(loader)
    return [next(it) for _ in range(n)]


def test_apply_builds_what_the_trial_measured(write_space, tmp_path):
    """`autotune.apply` in a user's process sets up the same loader, model and optimizer as
    the trial subprocess did (it reports them in result.json as `applied`)."""
    import json

    from workloads import tiny

    from autotune import load_space
    from autotune._child import applied_settings
    from autotune.runner import run_trial

    space = load_space(
        write_space("workload: {workloads}:tiny\ntrial: {warmup_steps: 1, measured_steps: 2}\n")
    )
    config = Config(batch_size=8, accumulation_steps=2, num_workers=1, gradient_checkpointing=True)
    assert run_trial(space, config, tmp_path / "t").ok
    in_trial = json.loads((tmp_path / "t" / "result.json").read_text())["applied"]

    def user_apply(**kwargs):
        w = tiny()
        torch.manual_seed(0)
        model = w.model()
        return apply(
            config,
            model=model,
            dataset=w.dataset(),
            loss=w.loss,
            optimizer=w.optimizer,
            blocks=list(w.blocks(model)),
            device="cpu",
            **kwargs,
        )

    assert applied_settings(user_apply(endless=True)) == in_trial
    assert in_trial["loader"]["num_workers"] == 1 and in_trial["model"]["checkpointed_blocks"] == 2
    # A plain epoch loop differs only in the sampler (shuffled epochs, not one stream).
    epochs = applied_settings(user_apply())
    assert epochs["loader"].pop("sampler") == "RandomSampler"
    assert in_trial["loader"].pop("sampler") == "StreamSampler"
    assert epochs == in_trial
