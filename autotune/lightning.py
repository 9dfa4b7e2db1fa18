"""Lightning for autotune: a ``(LightningModule, LightningDataModule)`` pair as a workload
whose trials run ``Trainer.fit()`` (:func:`from_trainer`).

The public face of :mod:`autotune.frameworks.lightning`; ``import autotune`` is enough
to use it (``autotune.lightning.from_trainer(...)``).
"""

from __future__ import annotations

from .frameworks.lightning import from_trainer, loader_baseline

__all__ = ["from_trainer", "loader_baseline"]
