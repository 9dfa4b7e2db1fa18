"""Hugging Face transformers for autotune: a model as a workload (:func:`workload`), a
``transformers.Trainer`` as a workload whose trials run ``Trainer.train()``
(:func:`from_trainer`), and a found config back into ``TrainingArguments`` (:func:`apply`).

The public face of :mod:`autotune.frameworks.hf`; ``import autotune`` is enough to use it
(``autotune.hf.apply(...)``).
"""

from __future__ import annotations

from .frameworks.hf import (
    apply,
    enable_checkpointing,
    from_trainer,
    model_inputs,
    model_loss,
    padding_free,
    trainer_baseline,
    workload,
)

__all__ = [
    "apply",
    "enable_checkpointing",
    "from_trainer",
    "model_inputs",
    "model_loss",
    "padding_free",
    "trainer_baseline",
    "workload",
]
