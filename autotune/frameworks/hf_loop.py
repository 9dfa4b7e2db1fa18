"""A ``transformers.Trainer``'s own loop as a trial: ``Trainer.train()`` for a few steps.

Each trial builds a new Trainer, of the user's class, from the user's model, dataset,
collator, ``compute_loss_func``, callbacks and optimizers, with the ``TrainingArguments``
:func:`autotune.hf.apply` writes for the config (the export's mapping), ``max_steps``
set to the most steps the trial can take (its timing callback stops the run once the
window has its steps and its time). Everything the Trainer does per step runs: its sampler
(``group_by_length``), gradient clipping (``max_grad_norm``), the scheduler, the
callbacks, ``num_items_in_batch``. What a trial turns off, because it is not training
speed and must not outlive the trial: saving checkpoints, evaluation, and reporting to
trackers (``report_to``).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping
from typing import Any

from ..errors import WorkloadError
from .loop import Hooks, NativeLoop, distributed_refusals, with_pad_multiple
from .mapping import hf_apply

_NO_FIELD = "the Trainer's loop has no setting for it (TrainingArguments has no such field)"
REFUSED = {
    "jit": _NO_FIELD,
    "compile_dynamic": _NO_FIELD + "; torch_compile_mode is the one compile setting",
    "compile_fullgraph": _NO_FIELD + "; torch_compile_mode is the one compile setting",
    "checkpoint_every": "the Trainer checkpoints every layer of the model (gradient_checkpointing)",
    "zero_grad_set_to_none": "the Trainer's loop calls model.zero_grad() itself",
    "non_blocking": "the Trainer's accelerator moves the batches itself",
    "packing": "the Trainer pads what its data_collator gives; pack in the dataset "
    "or the collator (TRL's SFTTrainer) and tune that",
    "pack_length": "the Trainer pads what its data_collator gives",
    "optimizer_impl=foreach": "TrainingArguments' optim names the optimizer and its "
    "implementation together; only adamw_torch_fused is one of its values",
    "optimizer_impl=for-loop": "TrainingArguments' optim names the optimizer and its "
    "implementation together",
}


def trainer_loop(trainer: Any) -> NativeLoop:
    """The :class:`NativeLoop` of ``trainer``: each run trains a new Trainer like it."""
    refused = {**REFUSED, **distributed_refusals("Trainer", "accelerate launch or torchrun")}
    if not hasattr(trainer.data_collator, "pad_to_multiple_of"):
        refused["pad_to_multiple_of"] = (
            f"the Trainer's data_collator ({type(trainer.data_collator).__name__}) has no "
            "pad_to_multiple_of"
        )
    if not str(trainer.args.optim).startswith("adamw_torch"):
        refused["optimizer_impl=fused"] = (
            f"the Trainer's optim={trainer.args.optim} has no fused variant in TrainingArguments "
            "(adamw_torch_fused is AdamW's)"
        )
    return NativeLoop("transformers", functools.partial(train, trainer), refused)


def train(trainer: Any, config: Any, device: Any, steps: int, hooks: Hooks) -> None:
    """``Trainer.train()`` of a new Trainer like ``trainer`` for ``steps`` optimizer steps
    with ``config``, reporting to ``hooks``."""
    args = hf_apply(trainer, config, warn=False, also=trial_arguments(device, steps))
    model = trainer.model
    if config.channels_last:
        import torch

        model = model.to(memory_format=torch.channels_last)
    collator = with_pad_multiple(trainer.data_collator, config.pad_to_multiple_of)
    run = rebuild(trainer, model, args, collator, hooks)
    order = epoch_order(run)
    if order is not None:
        hooks.epoch(order, getattr(collator, "pad_to_multiple_of", None) or 1)
    run.train()


def epoch_order(trainer: Any) -> list[int] | None:
    """One epoch's sample indices from the Trainer's own train sampler (its
    ``group_by_length`` mega-batches sorted longest first, or a random order), drawn with
    the Trainer's seed without touching the run's random state; ``None`` where the
    sampler cannot be had or yields no indices."""
    import torch

    try:
        sampler = trainer._get_train_sampler()  # private: the Trainer's exact choice
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(trainer.args.seed)
            order = list(sampler) if sampler is not None else None
    except Exception:  # noqa: BLE001  (the window's own rate is then the trial's)
        return None
    if not order or not all(isinstance(i, int) for i in order):
        return None
    return order


def trial_arguments(device: Any, steps: int) -> dict[str, Any]:
    """The ``TrainingArguments`` fields of a trial of ``steps`` optimizer steps on
    ``device``: nothing saved, evaluated or reported (not training speed, and it must
    not outlive the trial)."""
    return {
        "max_steps": steps,
        "use_cpu": device.type == "cpu",
        "save_strategy": "no",
        "eval_strategy": "no",
        "load_best_model_at_end": False,
        "push_to_hub": False,
        "report_to": "none",
    }


def rebuild(trainer: Any, model: Any, args: Any, collator: Any, hooks: Hooks) -> Any:
    """A new Trainer of ``trainer``'s class over its objects with ``args``, timed by
    ``hooks``: a callback at each step's end, ``training_step`` wrapped to see each
    micro-batch and its loss.

    Raises:
        WorkloadError: the user's Trainer class cannot be built with the Trainer's own
            keyword arguments.
    """
    cls = type(trainer)
    kwargs = {
        "model": model,
        "args": args,
        "data_collator": collator,
        "train_dataset": trainer.train_dataset,
        "processing_class": getattr(trainer, "processing_class", None),
        "compute_loss_func": getattr(trainer, "compute_loss_func", None),
        "callbacks": [*_user_callbacks(trainer), _timing_callback(hooks)],
        "optimizers": (trainer.optimizer, trainer.lr_scheduler),
        "optimizer_cls_and_kwargs": getattr(trainer, "optimizer_cls_and_kwargs", None),
    }
    accepted = inspect.signature(cls.__init__).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in accepted.values()):
        kwargs = {k: v for k, v in kwargs.items() if k in accepted}
    try:
        new = cls(**kwargs)
    except TypeError as e:
        raise WorkloadError(
            f"{cls.__name__} could not be built again with the trial's TrainingArguments "
            f"(Trainer's keyword arguments): {e}"
        ) from e
    inner = new.training_step

    def training_step(model: Any, inputs: Any, num_items_in_batch: Any = None) -> Any:
        hooks.batch(inputs)
        loss = inner(model, inputs, num_items_in_batch)
        summed = summed_means(new, inputs, num_items_in_batch)
        hooks.loss(loss / new.current_gradient_accumulation_steps if summed else loss)
        return loss

    new.training_step = training_step  # the loop calls self.training_step per micro-batch
    return new


def summed_means(trainer: Any, inputs: Any, num_items_in_batch: Any) -> bool:
    """Whether the Trainer sums its micro-batches' mean losses instead of averaging them.

    transformers (5.25) leaves a micro-batch's loss undivided by the accumulation steps
    when the model takes loss keyword arguments and ``num_items_in_batch`` is counted,
    trusting the model to divide by it. A model whose forward takes ``**kwargs`` but a
    label per sample (a sequence classifier) ignores it and returns its mean: the step's
    loss, and its gradient, are then the sum of the means (twice the mean at two
    accumulation steps). The gradient is the Trainer's, as in the user's run; the loss
    the hooks get is divided, so that trajectories of other splits compare."""
    if getattr(trainer, "loss_is_scaled_for_ga", None) is not None:
        return False  # the user said how the loss is scaled
    labels = inputs.get("labels") if isinstance(inputs, Mapping) else None  # BatchEncoding
    per_token = getattr(labels, "ndim", 0) >= 2
    return (
        bool(trainer.model_accepts_loss_kwargs)
        and num_items_in_batch is not None
        and trainer.compute_loss_func is None
        and not per_token
    )


def _user_callbacks(trainer: Any) -> list[Any]:
    """The callbacks the user added: those of transformers itself (progress, printing,
    trackers) the new Trainer adds by its arguments."""
    return [
        cb
        for cb in trainer.callback_handler.callbacks
        if not type(cb).__module__.startswith("transformers.")
    ]


def _timing_callback(hooks: Hooks) -> Any:
    from transformers import TrainerCallback

    class AutotuneTiming(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            hooks.begin()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            hooks.step_end()
            if hooks.done:  # the window has its steps and its time
                control.should_training_stop = True

    return AutotuneTiming()
