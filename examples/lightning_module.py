"""A Lightning module and data module as the workload: a small classifier on synthetic data.

The function a space names (``workload: ../examples/lightning_module.py:make_trainer``)
returns ``(LightningModule, LightningDataModule)`` as you would hand them to
``Trainer.fit``; autotune runs the module's ``training_step`` for the loss and its
``configure_optimizers`` for the optimizer, and takes the dataset, the collate and the
baseline (``batch_size`` 64, ``num_workers`` 0, ``pin_memory``) from the data module's
``train_dataloader()``. The data: 2,048 vectors of 32 features whose class (of 10) is
the largest of 10 fixed projections, a rule an MLP learns within a trial.

    autotune run search_spaces/lightning.yaml
    autotune export autotune-runs/lightning/best_config.yaml --format lightning
"""

from __future__ import annotations

import lightning.pytorch as pl
import torch
from torch import nn
from torch.nn import functional as F


class Classifier(pl.LightningModule):
    def __init__(self, features: int = 32, width: int = 256, classes: int = 10, lr: float = 1e-3):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(
            nn.Linear(features, width),
            nn.ReLU(),
            nn.Linear(width, width),
            nn.ReLU(),
            nn.Linear(width, classes),
        )

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=100)
        return {"optimizer": optimizer, "lr_scheduler": scheduler}


class Vectors(pl.LightningDataModule):
    def __init__(self, n: int = 2048, features: int = 32, classes: int = 10, batch_size: int = 64):
        super().__init__()
        self.n, self.features, self.classes, self.batch_size = n, features, classes, batch_size

    def setup(self, stage=None):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(self.n, self.features, generator=g)
        y = (x @ torch.randn(self.features, self.classes, generator=g)).argmax(1)
        self.train_set = torch.utils.data.TensorDataset(x, y)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(
            self.train_set, batch_size=self.batch_size, shuffle=True, num_workers=0
        )


def make_trainer(n: int = 2048, width: int = 256):
    """The module and the data module as a user hands them to ``Trainer.fit``."""
    return Classifier(width=width), Vectors(n=n)
