"""Trainers as a user writes them, for the framework-loop tests: each records what its own
loop did into the JSON file ``record`` names (the trial process is another process)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))


def _recorder(record: str, max_grad_norm: float):
    import torch
    from transformers import TrainerCallback

    class Recorder(TrainerCallback):
        """Counts the Trainer's steps, reads the learning rate the scheduler set and the
        gradients' norm after clipping, and writes them when training ends."""

        def __init__(self) -> None:
            self.steps, self.lrs, self.norms = 0, [], []

        def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
            grads = [p.grad.norm() for p in model.parameters() if p.grad is not None]
            self.norms.append(float(torch.linalg.vector_norm(torch.stack(grads))))

        def on_step_end(self, args, state, control, optimizer=None, **kwargs):
            self.steps += 1
            self.lrs.append(optimizer.param_groups[0]["lr"])

        def on_train_end(self, args, state, control, **kwargs):
            data = {"steps": self.steps, "lrs": self.lrs, "norms": self.norms}
            Path(record).write_text(json.dumps(data))

    return Recorder()


def make_trainer(
    record: str = "",
    n: int = 256,
    group_by_length: bool = False,
    max_grad_norm: float = 1.0,
    fail: bool = False,
):
    """examples/hf_trainer.py's Trainer (a BERT classifier, batch 16 x 2) with a linear
    schedule, a recorder callback and, with ``fail``, a callback that raises at step 2."""
    import hf_trainer
    import transformers
    from transformers import TrainerCallback

    trainer = hf_trainer.make_trainer(n=n, hidden=32)
    args = trainer.args
    args.lr_scheduler_type = "linear"
    args.max_grad_norm = max_grad_norm
    args.train_sampling_strategy = "group_by_length" if group_by_length else "random"

    class Fails(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 2:
                raise RuntimeError("the user's callback broke")

    callbacks = [_recorder(record, max_grad_norm)] if record else []
    return transformers.Trainer(
        model=trainer.model,
        args=args,
        train_dataset=trainer.train_dataset,
        data_collator=trainer.data_collator,
        processing_class=trainer.processing_class,
        callbacks=[*callbacks, *([Fails()] if fail else [])],
    )


def make_pair(record: str = "", n: int = 512):
    """examples/lightning_module.py's pair, with a callback counting the steps of fit()."""
    import lightning.pytorch as pl
    import lightning_module

    module, data = lightning_module.make_trainer(n=n, width=64)

    class Counts(pl.Callback):
        def __init__(self) -> None:
            self.batches = 0

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.batches += 1

        def on_train_end(self, trainer, pl_module):
            data = {"steps": trainer.global_step, "batches": self.batches}
            Path(record).write_text(json.dumps(data))

    if record:  # a module's own callbacks come with it into any Trainer
        module.configure_callbacks = lambda: [Counts()]
    return module, data
