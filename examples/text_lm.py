"""A small causal LM on a synthetic corpus of variable-length text: the built-in text workload.

Sample lengths follow a long-tailed (lognormal) distribution, as real text does: median
~48 tokens, a tail to 512. Each sequence follows a rule a small model learns within a
trial (every token is the previous one plus a per-sequence stride, modulo the vocabulary;
the stride is given by the first two tokens), so the loss falls and the accuracy guard
means something. Samples are ``{"input_ids": [...]}`` dicts, as a tokenized Hugging Face
dataset yields; ``autotune.Tokens`` lets autotune pad, mask and count them.

Use it as a template: ``workload: path/to/text_lm.py:workload`` in a space
(``search_spaces/text.yaml``).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

import autotune

PAD, VOCAB = 0, 128  # ids 1..127 are text
EOS = VOCAB  # the separator packing puts after each sample
N_IDS = VOCAB + 1


def synthetic_lengths(n: int, median: int, longest: int, seed: int = 0) -> list[int]:
    """``n`` lognormal lengths with the given median, clipped to [8, longest]."""
    g = torch.Generator().manual_seed(seed)
    raw = torch.exp(math.log(median) + 0.8 * torch.randn(n, generator=g))
    return raw.round().clamp(8, longest).long().tolist()


class SyntheticText(torch.utils.data.Dataset):
    """Token sequences ``t[i+1] = (t[i] + stride) mod (VOCAB - 1) + 1``; never the pad id."""

    def __init__(self, n: int = 4096, median: int = 48, longest: int = 512, seed: int = 0):
        self.lengths = synthetic_lengths(n, median, longest, seed)
        g = torch.Generator().manual_seed(seed + 1)
        self.starts = torch.randint(1, VOCAB, (n,), generator=g).tolist()
        self.strides = torch.randint(1, 8, (n,), generator=g).tolist()

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> dict[str, list[int]]:
        start, stride = self.starts[i], self.strides[i]
        ids = [(start - 1 + k * stride) % (VOCAB - 1) + 1 for k in range(self.lengths[i])]
        return {"input_ids": ids}


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor, mask: object = None) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if mask is None:  # right padding and a causal mask: real tokens never see padding
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # packing: isolated: each token sees its own sample only
            y = autotune.isolated_attention(q, k, v, mask)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.norm2(x))


class TinyCausalLM(nn.Module):
    def __init__(self, dim: int = 64, layers: int = 2, heads: int = 4, context: int = 512):
        super().__init__()
        self.embed = nn.Embedding(N_IDS, dim)
        self.pos = nn.Embedding(context, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, N_IDS)

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        seq_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.embed(input_ids) + self.pos(position_ids)
        # packing: isolated gives each token's sample in its row: one mask for all blocks
        mask = autotune.sample_mask(seq_ids) if seq_ids is not None else None
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.norm(x))


def causal_lm_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Next-token cross-entropy, a mean over the scored tokens (labels are -100 on padding,
    and with packing: isolated on each sample's first token)."""
    logits = model(batch["input_ids"], batch.get("position_ids"), batch.get("seq_ids"))
    return F.cross_entropy(
        logits[:, :-1].reshape(-1, N_IDS).float(),
        batch["labels"][:, 1:].reshape(-1),
        ignore_index=-100,
    )


def workload(
    n: int = 4096,
    median: int = 48,
    longest: int = 512,
    dim: int = 64,
    layers: int = 2,
    pack_length: int = 128,
) -> autotune.Workload:
    """The factory a space file names: ``examples/text_lm.py:workload``."""
    return autotune.Workload(
        name=f"text-lm-d{dim}",
        model=lambda: TinyCausalLM(dim, layers, context=longest),
        dataset=lambda: SyntheticText(n, median, longest),
        loss=causal_lm_loss,
        optimizer=lambda params: torch.optim.AdamW(params, lr=3e-3),
        blocks=lambda model: list(model.blocks),
        tokens=autotune.Tokens(
            pad_id=PAD,
            lengths=lambda: synthetic_lengths(n, median, longest),
            causal_lm=True,  # a per-token next-token loss: samples may be packed
            eos_id=EOS,
            pack_length=pack_length,
            isolated="rows",  # the model takes position_ids and seq_ids: samples kept apart
            context=longest,  # its position embeddings: packed rows may not be longer
        ),
    )
