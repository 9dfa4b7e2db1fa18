"""A Lightning pair's own loop as a trial: ``Trainer.fit()`` for a few steps.

Each trial builds a ``lightning.pytorch.Trainer`` with the keyword arguments
``autotune export --format lightning`` prints for the config (``precision``,
``accumulate_grad_batches``, ``benchmark``), the data module's train loader rebuilt with
the export's ``DataLoader`` arguments (the user's dataset, sampler kind and collate), and
the module compiled as the export says (``torch.compile(model)`` before ``fit``). Lightning
then runs everything it runs for the user: the precision plugin, the optimizer closure,
``self.log``, the hooks and the schedulers. A trial runs no validation, writes no
checkpoint or log files and shows no progress bar.
"""

from __future__ import annotations

import functools
from typing import Any

from .loop import Hooks, NativeLoop, distributed_refusals, with_pad_multiple

_NO_ARGUMENT = "Lightning's Trainer and the DataLoader have no argument for it"
REFUSED = {
    "jit": _NO_ARGUMENT,
    "checkpoint_every": "a Lightning pair has no blocks to checkpoint",
    "zero_grad_set_to_none": "Lightning's loop zeroes the gradients itself "
    "(override optimizer_zero_grad to change it)",
    "non_blocking": "Lightning's strategy moves the batches itself",
    "length_grouping": "the data module's loader has its own sampler; group by length in "
    "train_dataloader() and tune that",
    "packing": "the data module's loader batches its own samples",
    "pack_length": "the data module's loader batches its own samples",
    "optimizer_impl": "configure_optimizers() builds the optimizer; pass foreach= or fused= there",
}


def pair_loop(module: Any, data: Any, loader: Any) -> NativeLoop:
    """The :class:`NativeLoop` of a ``(LightningModule, LightningDataModule)`` whose
    ``train_dataloader()`` returned ``loader``."""
    refused = {**REFUSED, **distributed_refusals("Lightning", "a strategy over devices")}
    if not hasattr(loader.collate_fn, "pad_to_multiple_of"):
        refused["pad_to_multiple_of"] = "the data module's loader has its own collate_fn"
    return NativeLoop("lightning", functools.partial(fit, module, data, loader), refused)


def fit(module: Any, data: Any, loader: Any, config: Any, device: Any, steps: int, hooks: Hooks):
    """``Trainer.fit()`` of the pair for ``steps`` optimizer steps with ``config``."""
    import lightning.pytorch as pl
    import torch

    from .mapping import lightning_kwargs

    mapped = lightning_kwargs(config.to_dict())
    model = module
    if config.channels_last:
        model = model.to(memory_format=torch.channels_last)
    if config.compile_mode != "off":  # what the export says to write before fit()
        model = torch.compile(model, **compile_arguments(config))
    collate = with_pad_multiple(loader.collate_fn, config.pad_to_multiple_of)
    train_loader = rebuild_loader(loader, collate, mapped.kwargs["DataLoader"])
    data.train_dataloader = lambda: train_loader  # the user edits train_dataloader()
    trainer = pl.Trainer(
        **trial_arguments(mapped.kwargs["Trainer"], device, steps),
        callbacks=[_timing_callback(hooks)],
    )
    trainer.fit(model, datamodule=data)


def trial_arguments(kwargs: dict[str, Any], device: Any, steps: int) -> dict[str, Any]:
    """The export's ``Trainer`` arguments for a trial of ``steps`` optimizer steps on
    ``device``: no validation, checkpoint, log files, progress bar or model summary."""
    return {
        **kwargs,
        "accelerator": "gpu" if device.type == "cuda" else "cpu",
        "devices": 1,
        "max_steps": steps,
        "limit_val_batches": 0,
        "num_sanity_val_steps": 0,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
    }


def compile_arguments(config: Any) -> dict[str, Any]:
    """``torch.compile`` arguments of a config (mode, dynamic, fullgraph)."""
    kwargs: dict[str, Any] = {}
    if config.compile_mode != "default":
        kwargs["mode"] = config.compile_mode
    if config.compile_dynamic != "auto":
        kwargs["dynamic"] = config.compile_dynamic == "true"
    if config.compile_fullgraph:
        kwargs["fullgraph"] = True
    return kwargs


def rebuild_loader(loader: Any, collate: Any, kwargs: dict[str, Any]) -> Any:
    """``loader`` as the export's ``DataLoader`` arguments set it, with ``collate``: the
    same dataset, sampler kind (shuffled or in order, or the user's own sampler) and
    ``drop_last``."""
    import torch

    sampler = loader.sampler
    shuffle = isinstance(sampler, torch.utils.data.RandomSampler)
    plain = shuffle or isinstance(sampler, torch.utils.data.SequentialSampler)
    workers = kwargs.get("num_workers", 0)
    return torch.utils.data.DataLoader(
        loader.dataset,
        shuffle=shuffle,
        sampler=None if plain else sampler,
        collate_fn=collate,
        drop_last=loader.drop_last,
        worker_init_fn=loader.worker_init_fn if workers else None,
        generator=loader.generator,
        **kwargs,
    )


def _timing_callback(hooks: Hooks) -> Any:
    import lightning.pytorch as pl

    class AutotuneTiming(pl.Callback):
        """Reports micro-batches, their losses and the end of each optimizer step (when
        the Trainer's ``global_step`` moves: accumulation counted)."""

        def __init__(self) -> None:
            self.step = 0

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            hooks.begin()

        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, i: int) -> None:
            hooks.batch(batch)

        def on_train_batch_end(
            self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, i: int
        ) -> None:
            loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
            if loss is not None:  # already divided by accumulate_grad_batches
                hooks.loss(loss.detach())
            if trainer.global_step != self.step:
                self.step = trainer.global_step
                hooks.step_end()
                if hooks.done:  # the window has its steps and its time
                    trainer.should_stop = True

    return AutotuneTiming()
