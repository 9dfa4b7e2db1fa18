"""Tiny workloads for the tests: a trial of these takes well under a second of compute."""

from __future__ import annotations

import dataclasses
import time

import torch
from torch import nn
from torch.nn import functional as F

import autotune


class Blobs(torch.utils.data.Dataset):
    def __init__(self, n: int = 512, dim: int = 16, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, dim, generator=g)
        self.y = (self.x @ torch.randn(dim, generator=g) > 0).long()

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


class MLP(nn.Module):
    def __init__(self, dim: int = 16, hidden: int = 32) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            [
                nn.Sequential(nn.Linear(dim, hidden), nn.ReLU()),
                nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU()),
            ]
        )
        self.head = nn.Linear(hidden, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _loss(model: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return F.cross_entropy(model(x), y)


def tiny(hidden: int = 32) -> autotune.Workload:
    return autotune.Workload(
        name="tiny-mlp",
        model=lambda: MLP(hidden=hidden),
        dataset=Blobs,
        loss=_loss,
        optimizer=lambda params: torch.optim.SGD(params, lr=0.1),
        blocks=lambda model: list(model.blocks),
    )


def no_blocks() -> autotune.Workload:
    return autotune.Workload(model=MLP, dataset=Blobs, loss=_loss)


def not_a_workload():
    return 42


def raises_in_factory():
    raise RuntimeError("the user's factory is broken")


class Overflow(nn.Module):
    """Activations of ~1e6 between two layers: finite in fp32/bf16, inf in fp16 (max 65504)."""

    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.up = nn.Linear(dim, 64)
        with torch.no_grad():
            self.up.weight.mul_(2e5)
        self.norm = nn.LayerNorm(64)
        self.head = nn.Linear(64, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.up(x)))


def overflow() -> autotune.Workload:
    return autotune.Workload(
        name="fp16-overflow",
        model=Overflow,
        dataset=Blobs,
        loss=_loss,
        optimizer=lambda params: torch.optim.SGD(params, lr=0.05),
    )


class Wide(nn.Module):
    def __init__(self, dim: int = 16, hidden: int = 4096) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU()
        )
        self.head = nn.Linear(hidden, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def wide() -> autotune.Workload:
    """Activation memory grows with the batch: ~100 MiB more RSS at batch 2048 than at 8."""
    return autotune.Workload(
        name="wide",
        model=Wide,
        dataset=lambda: Blobs(n=4096),
        loss=_loss,
        optimizer=lambda params: torch.optim.SGD(params, lr=0.01),
    )


def broad(hidden: int = 65536) -> autotune.Workload:
    """Small weights, large activations: one hidden layer of ``hidden`` units, so each
    sample holds ~1 MiB through the step and the peak grows clearly linearly with the
    micro-batch, far above the RSS noise (what the memory model's line needs)."""
    return autotune.Workload(
        name="broad",
        model=lambda: nn.Sequential(nn.Linear(16, hidden), nn.ReLU(), nn.Linear(hidden, 2)),
        dataset=Blobs,
        loss=_loss,
        optimizer=lambda params: torch.optim.SGD(params, lr=0.01),
    )


def _sleepy_loss(model: nn.Module, batch) -> torch.Tensor:
    import time

    if batch[0].shape[0] == 4:  # the clearly slow config
        time.sleep(0.005)
    return _loss(model, batch)


def sleepy() -> autotune.Workload:
    """Micro-batch 4 sleeps 5 ms per step: far slower per sample than micro-batch 8."""
    return autotune.Workload(name="sleepy", model=MLP, dataset=Blobs, loss=_sleepy_loss)


class Images(torch.utils.data.Dataset):
    def __init__(self, n: int = 64, size: int = 8, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 3, size, size, generator=g)
        self.y = (self.x.mean(dim=(1, 2, 3)) > 0).long()

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


class TinyCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            [nn.Sequential(nn.Conv2d(c, 8, 3, padding=1), nn.ReLU()) for c in (3, 8, 8, 8)]
        )
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x.mean(dim=(2, 3)))


def tiny_cnn() -> autotune.Workload:
    return autotune.Workload(
        name="tiny-cnn",
        model=TinyCNN,
        dataset=Images,
        loss=_loss,
        optimizer=lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
        blocks=lambda model: list(model.blocks),
    )


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int = 64, seq_len: int = 8, vocab: int = 16) -> None:
        g = torch.Generator().manual_seed(0)
        self.tokens = torch.randint(vocab, (n, seq_len + 1), generator=g)

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.tokens[i]


class TinyAttention(nn.Module):
    """One causal self-attention layer over embeddings, through F.scaled_dot_product_attention."""

    def __init__(self, vocab: int = 16, d: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.embed = nn.Embedding(vocab, d)
        self.qkv = nn.Linear(d, 3 * d)
        self.head = nn.Linear(d, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        y = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        return self.head(y.transpose(1, 2).reshape(b, t, d))


def _lm_loss(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


def tiny_attention() -> autotune.Workload:
    return autotune.Workload(
        name="tiny-attention",
        model=TinyAttention,
        dataset=Tokens,
        loss=_lm_loss,
        optimizer=lambda params: torch.optim.AdamW(params, lr=1e-2),
    )


class GraphBreak(MLP):
    """An MLP whose forward has a graph break: fine for torch.compile, fatal for fullgraph."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks[0](x)
        torch._dynamo.graph_break()
        return self.head(self.blocks[1](x))


def graph_break() -> autotune.Workload:
    return autotune.Workload(model=GraphBreak, dataset=Blobs, loss=_loss)


class Unscriptable(MLP):
    """Variadic arguments: torch.jit.script cannot compile this forward."""

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return super().forward(inputs[0])


def unscriptable() -> autotune.Workload:
    return autotune.Workload(model=Unscriptable, dataset=Blobs, loss=_loss)


def expects_threads(threads: int, interop: int) -> autotune.Workload:
    """Fails at model build unless the trial process already runs with these thread counts."""

    def model() -> nn.Module:
        seen = (torch.get_num_threads(), torch.get_num_interop_threads())
        if seen != (threads, interop):
            raise RuntimeError(f"threads/interop are {seen}, expected {(threads, interop)}")
        return MLP()

    return autotune.Workload(model=model, dataset=Blobs, loss=_loss)


def rmsprop() -> autotune.Workload:
    return autotune.Workload(
        model=MLP,
        dataset=Blobs,
        loss=_loss,
        optimizer=lambda params: torch.optim.RMSprop(params, lr=1e-3),
    )


class Texts(torch.utils.data.Dataset):
    """Token sequences of the given lengths; ids count up from a per-sample start (never 0)."""

    def __init__(self, lengths: list[int]) -> None:
        self.lengths = lengths

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> dict[str, list[int]]:
        return {"input_ids": [(i + k) % 31 + 1 for k in range(self.lengths[i])]}


class ExplicitAttention(nn.Module):
    """One attention layer that materialises the (length x length) scores: its activation
    memory grows with the square of the batch's length."""

    def __init__(self, dim: int = 16, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.embed = nn.Embedding(32, dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.head = nn.Linear(dim, 32)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        b, t = ids.shape
        q, k, v = self.qkv(self.embed(ids)).view(b, t, 3, self.heads, -1).unbind(2)
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))
        scores = (q @ k.transpose(-1, -2)).softmax(-1)
        return self.head((scores @ v).transpose(1, 2).reshape(b, t, -1))


def _token_loss(model: nn.Module, batch: dict) -> torch.Tensor:
    logits = model(batch["input_ids"])
    return F.cross_entropy(
        logits[:, :-1].reshape(-1, 32), batch["labels"][:, 1:].reshape(-1), ignore_index=-100
    )


def texts(n: int = 256, seed: int = 0, causal_lm: bool = False) -> autotune.Workload:
    """Variable-length token samples (8 to 96 tokens, long-tailed); with ``causal_lm``
    they may be packed (EOS id 0, rows of 64)."""
    g = torch.Generator().manual_seed(seed)
    lengths = (8 + torch.rand(n, generator=g) ** 3 * 88).long().tolist()
    packing = {"causal_lm": True, "eos_id": 0, "pack_length": 64} if causal_lm else {}
    return autotune.Workload(
        name="texts",
        model=ExplicitAttention,
        dataset=lambda: Texts(lengths),
        loss=_token_loss,
        tokens=autotune.Tokens(pad_id=0, lengths=lambda: lengths, **packing),
    )


def long_tail(n: int = 1000, typical: int = 48, longest: int = 1280) -> autotune.Workload:
    """1 sample in 500 is over 20x longer than the rest: a short window rarely draws one."""
    lengths = [longest if i % 500 == 499 else typical for i in range(n)]
    return autotune.Workload(
        name="long-tail",
        model=ExplicitAttention,
        dataset=lambda: Texts(lengths),
        loss=_token_loss,
        tokens=autotune.Tokens(pad_id=0, lengths=lambda: lengths),
    )


def wrong_lengths() -> autotune.Workload:
    """tokens.lengths disagrees with the dataset."""
    lengths = [10] * 64
    return autotune.Workload(
        model=ExplicitAttention,
        dataset=lambda: Texts(lengths),
        loss=_token_loss,
        tokens=autotune.Tokens(pad_id=0, lengths=lambda: [11] * 64),
    )


def gpt2(n: int = 128) -> autotune.Workload:
    """A random-init 2-layer GPT-2 (transformers, no download) over variable-length texts."""
    import autotune.hf

    def model():
        import transformers

        config = transformers.GPT2Config(
            n_layer=2,
            n_embd=32,
            n_head=2,
            vocab_size=40,
            n_positions=128,
            bos_token_id=1,
            eos_token_id=1,
        )
        return transformers.GPT2LMHeadModel(config)

    g = torch.Generator().manual_seed(0)
    lengths = (8 + torch.rand(n, generator=g) ** 3 * 88).long().tolist()
    return autotune.hf.workload(model=model, dataset=lambda: Texts(lengths), pad_id=0)


class _SlowCollate:
    """Collates a batch after ``seconds`` of sleep: a per-batch data cost that DataLoader
    workers overlap without taking a core from the training step."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __call__(self, samples):
        time.sleep(self.seconds)
        return torch.utils.data.default_collate(samples)


def data_bound(seconds: float = 0.03) -> autotune.Workload:
    """Data-bound by a per-batch cost: larger batches (fewer of them per sample) and workers
    each speed it up several-fold; knobs of the training step do next to nothing."""
    return autotune.Workload(
        name="data-bound",
        model=MLP,
        dataset=Blobs,
        loss=_loss,
        optimizer=lambda params: torch.optim.SGD(params, lr=0.1),
        collate_fn=_SlowCollate(seconds),
    )


class _SlowFirstForward(MLP):
    """An MLP whose first forward sleeps a second: the DataLoader's workers fill their
    queue meanwhile, so the timed window starts on a full prefetch queue."""

    slept = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.slept:
            self.slept = True
            time.sleep(1.0)
        return super().forward(x)


def full_queue(seconds: float = 0.05) -> autotune.Workload:
    """Data-bound (``seconds`` of collation a batch) after a slow first step: the window
    opens with every prefetched batch ready, which a step takes at once."""
    return dataclasses.replace(data_bound(seconds), name="full-queue", model=_SlowFirstForward)


class Deep(nn.Module):
    """``depth`` square blocks of ``hidden`` units: weights that dominate the memory."""

    def __init__(self, dim: int = 16, hidden: int = 2048, depth: int = 4) -> None:
        super().__init__()
        self.inp = nn.Linear(dim, hidden)
        self.blocks = nn.ModuleList(
            [nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU()) for _ in range(depth)]
        )
        self.head = nn.Linear(hidden, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def deep(hidden: int = 2048, depth: int = 4) -> autotune.Workload:
    """Weights, gradients and AdamW state of ~17M parameters (~270 MiB): what sharding
    splits over the processes, while activations at a small batch are negligible."""
    return autotune.Workload(
        name="deep-mlp",
        model=lambda: Deep(hidden=hidden, depth=depth),
        dataset=Blobs,
        loss=_loss,
        optimizer=lambda params: torch.optim.AdamW(params, lr=1e-4),
        blocks=lambda model: list(model.blocks),
    )


# A stack of Linear layers without bias: its FLOPs are known (tests/trial/test_flops.py).
LINEAR_WIDTHS = (64, 128, 96, 10)


class Vectors(torch.utils.data.Dataset):
    def __init__(self, n: int = 256, dim: int = LINEAR_WIDTHS[0], seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, dim, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i]


def linear_stack(widths: tuple[int, ...] = LINEAR_WIDTHS) -> autotune.Workload:
    """Linear layers without bias (and no activation): one step of a batch of B samples
    is 2 x weights x B FLOPs forward, twice that backward, less the first layer's input
    gradient (the input needs none)."""
    return autotune.Workload(
        name="linear-stack",
        model=lambda: nn.Sequential(*[nn.Linear(a, b, bias=False) for a, b in pairs(widths)]),
        dataset=Vectors,
        loss=lambda model, x: model(x).pow(2).mean(),
        optimizer=lambda params: torch.optim.SGD(params, lr=0.01),
    )


def pairs(widths: tuple[int, ...]) -> list[tuple[int, int]]:
    return list(zip(widths, widths[1:], strict=False))


@torch.library.custom_op("autotune_tests::opaque_scale", mutates_args=())
def opaque_scale(x: torch.Tensor) -> torch.Tensor:
    """A custom kernel: the FLOP counter has no formula for it."""
    return x * 2


@opaque_scale.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


class OpaqueFirst(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(LINEAR_WIDTHS[0], 10, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(opaque_scale(x))


def custom_kernel() -> autotune.Workload:
    """A model that runs a custom op before its Linear: its step cannot be counted."""
    return autotune.Workload(
        name="custom-kernel",
        model=OpaqueFirst,
        dataset=Vectors,
        loss=lambda model, x: model(x).pow(2).mean(),
        optimizer=lambda params: torch.optim.SGD(params, lr=0.01),
    )
