"""Each core knob really takes effect (in-process, real torch)."""

from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from workloads import MLP, Blobs, _loss

from autotune import Config, apply
from autotune.trial.apply import StreamSampler, make_loader


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


def test_accumulated_micro_batches_step_like_one_batch_of_their_size():
    """2 micro-batches of 8 (each loss divided by accumulation_steps) make the same SGD
    step as one batch of 16: the same global batch trains the same."""
    x, y = Blobs()[:16]
    steps = {}
    for bs, accum in ((8, 2), (16, 1)):
        torch.manual_seed(0)
        model = MLP()
        a = apply(
            Config(batch_size=bs, accumulation_steps=accum),
            model=model,
            dataset=Blobs(),
            loss=_loss,
            optimizer=lambda params: torch.optim.SGD(params, lr=0.5),
            device="cpu",
        )
        before = [p.detach().clone() for p in a.model.parameters()]
        a.train_step(iter([(x[i : i + bs], y[i : i + bs]) for i in range(0, 16, bs)]))
        steps[accum] = [p.detach() - b for p, b in zip(a.model.parameters(), before, strict=True)]
    assert all(s.abs().max() > 1e-4 for s in steps[1])  # the step moved every parameter
    for accumulated, single in zip(steps[2], steps[1], strict=True):
        torch.testing.assert_close(accumulated, single, rtol=1e-4, atol=1e-6)


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


def test_fsdp_needs_an_optimizer_factory():
    """Sharding replaces the parameters: an optimizer built before would step stale ones."""
    model = MLP()
    with pytest.raises(ValueError, match="fsdp needs the optimizer as a factory"):
        apply(
            Config(world_size=2, fsdp="root"),
            model=model,
            dataset=Blobs(),
            loss=_loss,
            optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        )


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
    from autotune.study.runner import run_trial
    from autotune.trial.build import applied_settings

    space = load_space(
        write_space("workload: {workloads}:tiny\ntrial: {warmup_steps: 1, measured_steps: 2}\n")
    )
    config = Config(batch_size=8, accumulation_steps=2, num_workers=1, gradient_checkpointing=True)
    assert run_trial(space, config, tmp_path / "t").ok
    in_trial = json.loads((tmp_path / "t" / "result.json").read_text())["applied"]

    def user_apply(**kwargs):
        from autotune import apply_workload

        return apply_workload(config, tiny(), device="cpu", **kwargs)

    assert applied_settings(user_apply(endless=True)) == in_trial
    assert in_trial["loader"]["num_workers"] == 1 and in_trial["model"]["checkpointed_blocks"] == 2
    # A plain epoch loop differs only in the sampler (shuffled epochs, not one stream).
    epochs = applied_settings(user_apply())
    assert epochs["loader"].pop("sampler") == "RandomSampler"
    assert in_trial["loader"].pop("sampler") == "StreamSampler"
    assert epochs == in_trial


# --- The knobs of issue #8: each one observably takes effect -------------------------


@pytest.fixture
def torch_globals():
    """Restore the process-wide settings some knobs change."""
    saved = (torch.get_num_threads(), torch.get_float32_matmul_precision())
    yield
    torch.set_num_threads(saved[0])
    torch.set_float32_matmul_precision(saved[1])


def _applied_to(workload, **knobs):
    torch.manual_seed(0)
    model = workload.model()
    return apply(
        Config(**knobs),
        model=model,
        dataset=workload.dataset(),
        loss=workload.loss,
        optimizer=workload.optimizer,
        blocks=list(workload.blocks(model)) if workload.blocks else None,
        device="cpu",
    )


class _Ops(TorchDispatchMode):
    """Records the aten ops that actually run (after SDPA and optimizer dispatch)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))

    def any(self, text: str) -> bool:
        return any(text in op for op in self.ops)


def test_dataloader_knobs_reach_the_loader():
    a = _applied(num_workers=1, pin_memory=True, persistent_workers=True, prefetch_factor=4)
    assert a.loader.pin_memory and a.loader.persistent_workers and a.loader.prefetch_factor == 4
    plain = _applied()
    assert not plain.loader.pin_memory and not plain.loader.persistent_workers
    assert plain.loader.prefetch_factor is None  # no workers: DataLoader takes none


@pytest.mark.cuda
def test_pin_memory_and_non_blocking_copy_on_cuda():
    torch.manual_seed(0)
    a = apply(
        Config(num_workers=1, pin_memory=True, non_blocking=True),
        model=MLP(),
        dataset=Blobs(),
        loss=_loss,
        device="cuda",
    )
    x, _ = next(iter(a.loader))
    assert x.is_pinned()
    assert a.to_device((x, x))[0].device.type == "cuda"
    assert torch.isfinite(a.train_step(iter(a.loader)))


def test_non_blocking_reaches_the_host_to_device_copy():
    seen = []

    class Copies(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if getattr(func, "__name__", "") == "to":
                seen.append((kwargs or {}).get("non_blocking"))
            return func(*args, **(kwargs or {}))

    for flag in (True, False):
        seen.clear()
        a = _applied(non_blocking=flag)
        with Copies():
            a.train_step(iter(a.loader))
        assert seen and set(seen) == {flag}


def test_matmul_precision_sets_the_process_flag(torch_globals):
    _applied(matmul_precision="high")
    assert torch.get_float32_matmul_precision() == "high"
    _applied()
    assert torch.get_float32_matmul_precision() == "highest"


@pytest.mark.cuda
def test_matmul_precision_high_is_tf32_on_cuda(torch_globals):
    _applied(matmul_precision="high")
    assert torch.backends.cuda.matmul.allow_tf32


def test_channels_last_puts_weights_inputs_and_activations_in_nhwc():
    from workloads import tiny_cnn

    a = _applied_to(tiny_cnn(), channels_last=True)
    conv = a.model.blocks[0][0]
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)
    layouts = []
    conv.register_forward_hook(
        lambda m, inputs, out: layouts.append(
            (
                inputs[0].is_contiguous(memory_format=torch.channels_last),
                out.is_contiguous(memory_format=torch.channels_last),
            )
        )
    )
    a.train_step(iter(a.loader))
    assert layouts == [(True, True)]
    plain = _applied_to(tiny_cnn())
    assert not plain.model.blocks[0][0].weight.is_contiguous(memory_format=torch.channels_last)
    x, y = plain.to_device(next(iter(plain.loader)))
    assert not x.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize(("backend", "flash"), [("auto", True), ("flash", True), ("math", False)])
def test_sdpa_backend_is_in_force_in_the_training_step(backend, flash):
    from workloads import tiny_attention

    a = _applied_to(tiny_attention(), sdpa_backend=backend)
    with _Ops() as ops:
        loss = a.train_step(iter(a.loader))
    assert torch.isfinite(loss)
    # On CPU, torch picks its flash kernel unless told otherwise; math is plain softmax.
    assert ops.any("_scaled_dot_product_flash_attention_for_cpu") == flash
    assert ops.any("_safe_softmax") != flash


def test_sdpa_backend_without_a_kernel_fails_clearly():
    from workloads import tiny_attention

    a = _applied_to(tiny_attention(), sdpa_backend="efficient")
    with pytest.raises(RuntimeError, match="No viable backend"):
        a.train_step(iter(a.loader))


@pytest.mark.parametrize(
    ("impl", "fused", "foreach"),
    [("fused", True, False), ("foreach", False, True), ("for-loop", False, False)],
)
def test_optimizer_impl_rebuilds_the_workloads_optimizer(impl, fused, foreach):
    from workloads import tiny

    a = _applied_to(tiny(), optimizer_impl=impl)
    assert type(a.optimizer) is torch.optim.SGD and a.optimizer.defaults["lr"] == 0.1
    assert {p for g in a.optimizer.param_groups for p in g["params"]} == set(a.model.parameters())
    assert torch.isfinite(a.train_step(iter(a.loader)))
    a.loss_fn(a.model, next(iter(a.loader))).backward()
    with _Ops() as ops:
        a.optimizer.step()
    assert ops.any("_fused_sgd") == fused
    assert ops.any("_foreach_") == foreach


def test_optimizer_impl_keeps_hyper_parameters_and_groups():
    from autotune.trial.apply import rebuild_optimizer

    model = MLP()
    opt = torch.optim.AdamW(
        [{"params": model.blocks.parameters(), "lr": 1e-2}, {"params": model.head.parameters()}],
        lr=1e-3,
        weight_decay=0.1,
        betas=(0.8, 0.9),
    )
    fused = rebuild_optimizer(opt, "fused")
    assert [g["lr"] for g in fused.param_groups] == [1e-2, 1e-3]
    assert fused.defaults["fused"] and fused.defaults["betas"] == (0.8, 0.9)
    assert all(g["weight_decay"] == 0.1 and g["fused"] for g in fused.param_groups)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    with _Ops() as ops:
        fused.step()
    assert ops.any("_fused_adamw")
    with pytest.raises(ValueError, match="optimizer_impl=fused: RMSprop takes no fused argument"):
        rebuild_optimizer(torch.optim.RMSprop(model.parameters()), "fused")
    with pytest.raises(ValueError, match="LBFGS takes no foreach argument"):
        rebuild_optimizer(torch.optim.LBFGS(model.parameters()), "foreach")


@pytest.mark.parametrize("set_to_none", [True, False])
def test_zero_grad_set_to_none(set_to_none):
    a = _applied(zero_grad_set_to_none=set_to_none)
    a.train_step(iter(a.loader))
    grads = [p.grad for p in a.model.parameters()]
    if set_to_none:
        assert all(g is None for g in grads)
    else:
        assert all(g is not None and not g.any() for g in grads)


@pytest.mark.parametrize(("dynamic", "graphs"), [("true", 1), ("false", 3), ("auto", 2)])
def test_compile_dynamic_decides_recompiles(eager_inductor, dynamic, graphs):
    a = _applied(compile_mode="default", compile_dynamic=dynamic)
    for n in (8, 16, 24):
        a.model(torch.randn(n, 16))
    # true: one symbolic-shape graph; false: one per batch size; auto: static, then dynamic.
    assert len(eager_inductor) == graphs


def test_compile_fullgraph_turns_a_graph_break_into_an_error(eager_inductor):
    from torch._dynamo.exc import Unsupported
    from workloads import GraphBreak

    from autotune.trial.compile import describe_compile_failure

    def run(**knobs):
        torch._dynamo.reset()  # a trial is a fresh process: no frames compiled before
        torch.manual_seed(0)
        config = Config(compile_mode="default", **knobs)
        a = apply(config, model=GraphBreak(), dataset=Blobs(), loss=_loss, device="cpu")
        return a.train_step(iter(a.loader))

    assert torch.isfinite(run())  # a graph break is fine without fullgraph
    with pytest.raises(Unsupported) as info:
        run(compile_fullgraph=True)
    reason = describe_compile_failure(
        info.value, Config(compile_mode="default", compile_fullgraph=True)
    )
    assert reason.startswith("torch.compile (compile_mode=default compile_fullgraph=true) failed")
    assert "graph_break" in reason


def test_jit_script_trains_the_same_parameters():
    a = _applied(jit="script")
    assert isinstance(a.model, torch.jit.ScriptModule)
    before = [p.detach().clone() for p in a.model.parameters()]
    losses = [float(a.train_step(iter(a.loader))) for _ in range(3)]
    assert all(torch.isfinite(torch.tensor(losses)))
    assert any(not torch.equal(b, p) for b, p in zip(before, a.model.parameters(), strict=True))


def test_jit_trace_traces_the_first_batch():
    from autotune.trial.compile import TraceOnFirstCall

    a = _applied(jit="trace")
    assert isinstance(a.model, TraceOnFirstCall) and a.model.traced is None
    first = a.model.module.head.weight.detach().clone()
    a.train_step(iter(a.loader))
    assert isinstance(a.model.traced, torch.jit.ScriptModule)
    assert not torch.equal(first, a.model.module.head.weight)  # the optimizer saw its grads


def test_jit_failure_is_a_clear_error():
    from workloads import Unscriptable

    from autotune.trial.compile import GraphError

    with pytest.raises(GraphError, match="jit=script: torch.jit.script failed: "):
        apply(Config(jit="script"), model=Unscriptable(), dataset=Blobs(), loss=_loss)


def test_checkpoint_every_checkpoints_every_kth_block():
    from workloads import tiny_cnn

    a = _applied_to(tiny_cnn(), gradient_checkpointing=True, checkpoint_every=2)
    flags = [getattr(b, "_autotune_checkpointed", False) for b in a.model.blocks]
    assert flags == [True, False, True, False]
    calls = {i: 0 for i in range(4)}
    for i, block in enumerate(a.model.blocks):
        block[0].register_forward_hook(lambda *args, i=i: calls.__setitem__(i, calls[i] + 1))
    a.train_step(iter(a.loader))
    assert calls == {0: 2, 1: 1, 2: 2, 3: 1}  # checkpointed blocks run again in backward


def test_num_threads_sets_torch_threads(torch_globals):
    _applied(num_threads=1)
    assert torch.get_num_threads() == 1


def test_a_trial_measures_the_share_of_its_window_spent_waiting_for_data(write_space, tmp_path):
    """``data_share`` (the screening's data rule reads it): a loader that sleeps 30 ms per
    batch holds the step most of the window; a compute-heavy step waits little."""
    from autotune import load_space
    from autotune.study.runner import run_trial

    def measure(text: str, name: str):
        space = load_space(write_space(text, f"{name}.yaml"))
        m = run_trial(space, Config(batch_size=32), tmp_path / name)
        assert m.ok, m.reason
        return m.data_share

    slow = measure(
        "workload: {workloads}:data_bound\nworkload_args: {seconds: 0.03}\n"
        "trial: {warmup_steps: 1, measured_steps: 4}\n",
        "slow",
    )
    busy = measure(
        "workload: {workloads}:wide\ntrial: {warmup_steps: 1, measured_steps: 4}\n", "busy"
    )
    assert slow > 0.6
    assert busy < 0.2
