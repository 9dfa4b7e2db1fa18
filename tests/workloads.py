"""Tiny workloads for the tests: a trial of these takes well under a second of compute."""

from __future__ import annotations

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


def _sleepy_loss(model: nn.Module, batch) -> torch.Tensor:
    import time

    if batch[0].shape[0] == 4:  # the clearly slow config
        time.sleep(0.005)
    return _loss(model, batch)


def sleepy() -> autotune.Workload:
    """Micro-batch 4 sleeps 5 ms per step: far slower per sample than micro-batch 8."""
    return autotune.Workload(name="sleepy", model=MLP, dataset=Blobs, loss=_sleepy_loss)
