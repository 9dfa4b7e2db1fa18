"""An MLP on a synthetic tabular table whose Dataset does real work per row.

The table has numeric columns (half of them heavy-tailed, as amounts and counts are, with
~3% missing) and string-valued categorical columns (few frequent values, a long tail). A
preprocessing fitted once on the whole table (medians, log1p of the skewed columns, means
and deviations, quantile bins) is applied row by row in ``__getitem__``, as a tabular
pipeline does: impute, log1p, standardise and clip, bin, hash each category to an
embedding bucket, then augment (small noise, feature dropout, a category sometimes
replaced by the unknown bucket; seeded by the row, so every trial sees the same samples).
That is Python and small-tensor work on the CPU, no sleep: without workers the loader
takes a sizeable share of each step, and its workers compete with the training step's
threads for the cores. The label comes from a fixed random teacher over the clean
features, so the loss can fall.

Use it as a template: ``workload: path/to/tabular.py:workload`` in a space
(``benchmarks/spaces/tabular_grid.yaml``).
"""

from __future__ import annotations

import zlib

import torch
from torch import nn
from torch.nn import functional as F

import autotune

UNKNOWN = 0  # the bucket of a category dropped by augmentation (hashes avoid it)


class SyntheticTable(torch.utils.data.Dataset):
    """``n`` rows of ``numeric`` raw numeric and ``categorical`` raw string columns.

    ``__getitem__`` returns ``({"numeric", "missing", "bins", "categories"}, label)``:
    the transformed numeric features, their missing-value indicators, each numeric
    feature's quantile bin (``bins`` per column) and each category's hash bucket (in
    ``1..buckets-1``).
    """

    def __init__(
        self,
        n: int = 4096,
        numeric: int = 32,
        categorical: int = 8,
        bins: int = 16,
        buckets: int = 1024,
        classes: int = 4,
        seed: int = 0,
    ) -> None:
        g = torch.Generator().manual_seed(seed)
        self.seed, self.buckets = seed, buckets
        raw = torch.randn(n, numeric, generator=g)
        self.skewed = torch.arange(numeric) % 2 == 0  # amounts, counts: lognormal
        raw = torch.where(self.skewed, torch.exp(1.5 * raw), raw * 3.0 + 1.0)
        raw[torch.rand(n, numeric, generator=g) < 0.03] = float("nan")
        self.raw = raw
        # Category values: a few frequent ones and a long tail, as strings.
        ranks = torch.exp(2.0 * torch.rand(n, categorical, generator=g) ** 2 * 4.0).long()
        self.categories = [
            [f"v{int(r)}" for r in row] for row in ranks.tolist()
        ]  # a list of rows of Python strings, as a DataFrame's object columns
        # Fit the preprocessing on the whole table.
        self.medians = raw.nanmedian(dim=0).values
        clean = self._impute_log(raw)
        self.mean, self.std = clean.mean(0), clean.std(0).clamp_min(1e-6)
        scaled = self._scale(clean)
        qs = torch.linspace(0, 1, bins + 1)[1:-1]
        self.edges = torch.quantile(scaled, qs, dim=0).T.contiguous()  # (numeric, bins - 1)
        teacher = torch.randn(numeric, classes, generator=g)
        bucket_bias = torch.randn(buckets, classes, generator=g)
        hashed = torch.tensor([self._hash(row) for row in self.categories])
        logits = scaled @ teacher + 0.3 * bucket_bias[hashed].sum(1)
        self.labels = logits.argmax(1)

    def _impute_log(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.where(torch.isnan(x), self.medians, x)
        return torch.where(self.skewed, torch.log1p(x.clamp_min(0)), x)

    def _scale(self, x: torch.Tensor) -> torch.Tensor:
        return ((x - self.mean) / self.std).clamp(-5.0, 5.0)

    def _hash(self, row: list[str]) -> list[int]:
        """Each ``column=value`` hashed to a bucket in ``1..buckets-1``."""
        return [
            1 + zlib.crc32(f"{col}={value}".encode()) % (self.buckets - 1)
            for col, value in enumerate(row)
        ]

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        raw = self.raw[i]
        missing = torch.isnan(raw)
        x = self._scale(self._impute_log(raw))
        bins = (x.unsqueeze(1) > self.edges).sum(1)
        categories = torch.tensor(self._hash(self.categories[i]))
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        x = x + 0.05 * torch.randn(x.shape, generator=g)  # noise
        x = x * (torch.rand(x.shape, generator=g) >= 0.1)  # feature dropout
        unknown = torch.rand(categories.shape, generator=g) < 0.05
        categories = categories.masked_fill(unknown, UNKNOWN)
        features = {
            "numeric": x,
            "missing": missing.float(),
            "bins": bins,
            "categories": categories,
        }
        return features, self.labels[i]


class TabularMLP(nn.Module):
    """Embeddings of the categories and of the numeric bins, concatenated with the numeric
    features, then ``layers`` Linear + LayerNorm + ReLU blocks of ``hidden`` units."""

    def __init__(
        self,
        numeric: int = 32,
        categorical: int = 8,
        bins: int = 16,
        buckets: int = 1024,
        classes: int = 4,
        hidden: int = 512,
        layers: int = 4,
        embed: int = 16,
        bin_embed: int = 8,
    ) -> None:
        super().__init__()
        self.bins = bins
        self.categories = nn.Embedding(categorical * buckets, embed)
        self.register_buffer("cat_offsets", torch.arange(categorical) * buckets)
        self.bin_embed = nn.Embedding(numeric * bins, bin_embed)
        self.register_buffer("bin_offsets", torch.arange(numeric) * bins)
        for table in (self.categories, self.bin_embed):  # small: the numbers lead at first
            nn.init.normal_(table.weight, std=0.1)
        width = 2 * numeric + categorical * embed + numeric * bin_embed
        self.blocks = nn.ModuleList(
            [
                nn.Sequential(nn.Linear(d, hidden), nn.LayerNorm(hidden), nn.ReLU())
                for d in [width] + [hidden] * (layers - 1)
            ]
        )
        self.head = nn.Linear(hidden, classes)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        cats = self.categories(batch["categories"] + self.cat_offsets).flatten(1)
        bins = self.bin_embed(batch["bins"] + self.bin_offsets).flatten(1)
        x = torch.cat([batch["numeric"], batch["missing"], cats, bins], dim=1)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def workload(
    hidden: int = 512,
    layers: int = 4,
    numeric: int = 32,
    categorical: int = 8,
    n: int = 4096,
) -> autotune.Workload:
    """The factory a space file names: ``examples/tabular.py:workload``."""

    def loss(model: nn.Module, batch: tuple[dict[str, torch.Tensor], torch.Tensor]) -> torch.Tensor:
        features, labels = batch
        return F.cross_entropy(model(features), labels)

    return autotune.Workload(
        name=f"tabular-mlp-h{hidden}-l{layers}",
        model=lambda: TabularMLP(
            numeric=numeric, categorical=categorical, hidden=hidden, layers=layers
        ),
        dataset=lambda: SyntheticTable(n=n, numeric=numeric, categorical=categorical),
        loss=loss,
        blocks=lambda model: list(model.blocks),
    )
