"""A tiny decoder-only transformer LM on synthetic tokens: a built-in workload for CPU.

The tokens come from a fixed random Markov chain, so there is something to learn and the
loss falls. Reports tokens/s as well as samples/s.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

import autotune


class MarkovTokens(torch.utils.data.Dataset):
    def __init__(self, n: int = 2048, seq_len: int = 64, vocab: int = 256, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        # A sparse-ish transition table: each token has a few likely successors.
        logits = torch.randn(vocab, vocab, generator=g) * 3.0
        probs = logits.softmax(-1)
        tokens = torch.empty(n, seq_len + 1, dtype=torch.long)
        tokens[:, 0] = torch.randint(vocab, (n,), generator=g)
        for t in range(seq_len):
            tokens[:, t + 1] = torch.multinomial(probs[tokens[:, t]], 1, generator=g).squeeze(1)
        self.tokens = tokens

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.tokens[i]


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        y = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class TinyLM(nn.Module):
    def __init__(
        self, vocab: int = 256, d: int = 128, layers: int = 2, heads: int = 4, seq_len: int = 64
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.zeros(seq_len, d))
        self.blocks = nn.ModuleList([Block(d, heads) for _ in range(layers)])
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx) + self.pos[: idx.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def workload(d: int = 128, layers: int = 2, seq_len: int = 64, n: int = 2048) -> autotune.Workload:
    """The factory a space file names: ``examples/tiny_lm.py:workload``."""

    def loss(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
        logits = model(tokens[:, :-1])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))

    return autotune.Workload(
        name=f"tiny-lm-d{d}-l{layers}",
        model=lambda: TinyLM(d=d, layers=layers, seq_len=seq_len),
        dataset=lambda: MarkovTokens(n=n, seq_len=seq_len),
        loss=loss,
        blocks=lambda model: list(model.blocks),
        tokens_per_sample=seq_len,
    )
