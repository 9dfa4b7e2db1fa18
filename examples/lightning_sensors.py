"""A Lightning pair with levers: a 1-D conv net over sensor windows, filtered as it loads.

The shape of a common Lightning job (issue 39's second workload): windows of a
6-channel sensor recording, each band-passed with an FFT in the dataset's
``__getitem__`` (the per-sample work a ``DataLoader`` worker can take off the training
process), classified by a small 1-D conv net that logs its loss with ``self.log``. The
function a space names (``workload: ../examples/lightning_sensors.py:make_trainer``)
returns ``(LightningModule, LightningDataModule)`` as you would hand them to
``Trainer.fit``; the baseline is the data module's ``train_dataloader()`` (batch 32, no
workers). The class of a window is the band (of 4) its tone lies in, a third of the
labels drawn at random (:data:`LABEL_NOISE`): the net learns the rest within a trial and
its loss levels off near 0.9 instead of falling toward 0.

    autotune run search_spaces/lightning_sensors.yaml
    autotune export autotune-runs/lightning_sensors/best_config.yaml --format lightning
"""

from __future__ import annotations

import math

import lightning.pytorch as pl
import torch
from torch import nn
from torch.nn import functional as F

RATE = 256  # samples per second of the recording
BANDS = ((4.0, 12.0), (14.0, 26.0), (28.0, 44.0), (46.0, 70.0))  # Hz: the 4 classes
PASS = (2.0, 80.0)  # the band-pass every window goes through (Hz)
LABEL_NOISE = 0.3  # the share of windows whose label is drawn at random


class Windows(torch.utils.data.Dataset):
    """``n`` windows of ``channels`` x ``length`` samples: a tone of the class's band on
    every channel (phase and gain per channel), a mains hum, drift and noise. Each item
    is band-passed (FFT, bins outside :data:`PASS` zeroed) and normalised as it is read."""

    def __init__(self, n: int, channels: int, length: int) -> None:
        g = torch.Generator().manual_seed(0)
        t = torch.arange(length) / RATE
        self.labels = torch.randint(0, len(BANDS), (n,), generator=g)
        low = torch.tensor([b[0] for b in BANDS])[self.labels]
        high = torch.tensor([b[1] for b in BANDS])[self.labels]
        freq = low + (high - low) * torch.rand(n, generator=g)
        phase = 2 * math.pi * torch.rand(n, channels, 1, generator=g)
        gain = 0.5 + torch.rand(n, channels, 1, generator=g)
        tone = gain * torch.sin(2 * math.pi * freq[:, None, None] * t + phase)
        hum = 0.8 * torch.sin(2 * math.pi * 50.0 * t + phase / 2)
        drift = torch.linspace(0, 1, length) * torch.randn(n, channels, 1, generator=g)
        noise = 0.7 * torch.randn(n, channels, length, generator=g)
        self.raw = (tone + 0.3 * hum + drift + noise).float()
        # A third of the labels mislabelled, as annotations of real recordings are: the
        # loss stays near 0.9 (what the noise leaves) instead of falling toward 0 within
        # a trial, where a fraction of a small loss would judge bf16 on noise.
        wrong = torch.rand(n, generator=g) < LABEL_NOISE
        self.labels = torch.where(
            wrong, torch.randint(0, len(BANDS), (n,), generator=g), self.labels
        )
        bins = torch.fft.rfftfreq(length, 1 / RATE)
        self.keep = ((bins >= PASS[0]) & (bins <= PASS[1])).float()

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        spectrum = torch.fft.rfft(self.raw[i], dim=-1) * self.keep
        x = torch.fft.irfft(spectrum, n=self.raw.shape[-1], dim=-1)
        x = (x - x.mean(-1, keepdim=True)) / (x.std(-1, keepdim=True) + 1e-6)
        return x, self.labels[i]


class SensorNet(pl.LightningModule):
    def __init__(self, channels: int = 6, width: int = 64, classes: int = len(BANDS)):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(
            nn.Conv1d(channels, width, 9, padding=4),
            nn.ReLU(),
            nn.Conv1d(width, 2 * width, 7, stride=2, padding=3),
            nn.ReLU(),
            nn.Conv1d(2 * width, 2 * width, 5, stride=2, padding=2),
            nn.ReLU(),
            nn.Conv1d(2 * width, 2 * width, 5, stride=2, padding=2),
            nn.ReLU(),
            nn.AdaptiveAvgPool1d(1),
            nn.Flatten(),
            nn.Linear(2 * width, classes),
        )

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=2e-3)


class Recordings(pl.LightningDataModule):
    def __init__(self, n: int = 2048, channels: int = 6, length: int = 512, batch_size: int = 32):
        super().__init__()
        self.n, self.channels, self.length, self.batch_size = n, channels, length, batch_size

    def setup(self, stage=None):
        self.train_set = Windows(self.n, self.channels, self.length)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(
            self.train_set, batch_size=self.batch_size, shuffle=True, num_workers=0
        )


def make_trainer(n: int = 2048, length: int = 512, width: int = 64):
    """The module and the data module as a user hands them to ``Trainer.fit``."""
    return SensorNet(width=width), Recordings(n=n, length=length)
