"""A small CNN on synthetic 32x32 images: a built-in workload that runs on CPU in seconds.

Use it as a template for your own: ``workload: path/to/this_file.py:workload`` in a space.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

import autotune


class SyntheticImages(torch.utils.data.Dataset):
    """Random images labelled by a fixed random linear teacher, so the loss can fall.

    ``augment`` adds a per-sample flip and noise (deterministic per index), which gives
    the DataLoader real per-sample work, as image pipelines have.
    """

    def __init__(
        self, n: int = 4096, size: int = 32, classes: int = 10, augment: bool = True, seed: int = 0
    ) -> None:
        g = torch.Generator().manual_seed(seed)
        self.images = torch.randn(n, 3, size, size, generator=g)
        teacher = torch.randn(3 * size * size, classes, generator=g)
        self.labels = (self.images.flatten(1) @ teacher).argmax(1)
        self.augment = augment

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        image = self.images[i]
        if self.augment:
            g = torch.Generator().manual_seed(i)
            if torch.rand((), generator=g) < 0.5:
                image = image.flip(-1)
            image = image + 0.05 * torch.randn(image.shape, generator=g)
        return image, self.labels[i]


def conv_block(c_in: int, c_out: int, stride: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False),
        nn.BatchNorm2d(c_out),
        nn.ReLU(inplace=True),
    )


class SmallCNN(nn.Module):
    def __init__(self, width: int = 32, classes: int = 10) -> None:
        super().__init__()
        w = width
        self.blocks = nn.ModuleList(
            [
                conv_block(3, w, 1),
                conv_block(w, 2 * w, 2),
                conv_block(2 * w, 2 * w, 1),
                conv_block(2 * w, 4 * w, 2),
            ]
        )
        self.head = nn.Linear(4 * w, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x.mean(dim=(2, 3)))


def workload(width: int = 32, n: int = 4096, augment: bool = True) -> autotune.Workload:
    """The factory a space file names: ``examples/cnn.py:workload``."""

    def loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        images, labels = batch
        return F.cross_entropy(model(images), labels)

    return autotune.Workload(
        name=f"cnn-w{width}",
        model=lambda: SmallCNN(width),
        dataset=lambda: SyntheticImages(n=n, augment=augment),
        loss=loss,
        optimizer=lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9),
        blocks=lambda model: list(model.blocks),
    )
