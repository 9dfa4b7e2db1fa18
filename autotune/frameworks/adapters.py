"""Workloads from the trainers people already have: a ``transformers.Trainer`` or a
``(LightningModule, LightningDataModule)`` pair returned by the function a space names.

:func:`load` is :func:`autotune.workload.load_workload` with these adapters; the trial
process loads every workload through it. Each adapter imports its framework only when
the function returned one of its objects.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..workload import Workload, load_workload

LIGHTNING_MODULES = {
    "lightning.pytorch.core.module.LightningModule",
    "pytorch_lightning.core.module.LightningModule",
}


def _classes(value: Any) -> set[str]:
    """The qualified names of ``value``'s classes, without importing their packages."""
    return {f"{c.__module__}.{c.__qualname__}" for c in type(value).__mro__}


def from_trainer(value: Any) -> Workload | None:
    """The workload of a ``transformers.Trainer`` (:func:`autotune.hf.from_trainer`) or of
    a ``(LightningModule, LightningDataModule)`` pair (:func:`autotune.lightning.from_trainer`);
    ``None`` for anything else."""
    if "transformers.trainer.Trainer" in _classes(value):
        from . import hf

        return hf.from_trainer(value)
    if isinstance(value, tuple) and value and _classes(value[0]) & LIGHTNING_MODULES:
        from . import lightning

        return lightning.from_trainer(value)
    return None


def load(
    ref: str,
    args: dict[str, Any] | None = None,
    base_dir: Path | None = None,
    *,
    seed: int | None = None,
) -> Workload:
    """:func:`~autotune.workload.load_workload` that also takes a Trainer or a Lightning
    pair from the function ``ref`` names.

    Raises:
        WorkloadError: as :func:`~autotune.workload.load_workload`; an adapter's refusal
            is one line naming the workload.
    """
    return load_workload(ref, args, base_dir, seed=seed, adapt=from_trainer)
