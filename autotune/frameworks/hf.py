"""Hugging Face transformers models as workloads, in three lines.

    import autotune.hf, transformers
    config = transformers.GPT2Config(n_layer=4, n_embd=256, n_head=4)
    def workload():
        return autotune.hf.workload(
            model=lambda: transformers.GPT2LMHeadModel(config),
            dataset=lambda: my_tokenized,
            pad_id=0,
        )

The loss is the model's own (``outputs.loss``, computed from the ``labels`` autotune's
collate builds: the ids, ``-100`` on padding), tokens are counted from the attention mask,
and ``gradient_checkpointing`` turns on the model's own ``gradient_checkpointing_enable()``
unless ``blocks`` are given. ``packing: isolated`` gives the model transformers'
padding-free layout (``DataCollatorWithFlattening``: one row, ``position_ids`` restarting
per sample). Nothing is downloaded: build the model from a config.

A ``transformers.Trainer`` is a workload too: a space's ``workload: train.py:make_trainer``
may name a function returning one (:func:`from_trainer`); its ``TrainingArguments`` are
the baseline, and :func:`apply` writes a found config back into them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ..errors import WorkloadError
from ..workload import Tokens, Workload
from .hf_loop import trainer_loop
from .mapping import hf_apply


def model_loss(model: Any, batch: Any) -> Any:
    """``model(**batch).loss``: what a transformers model computes from ``labels``
    (a ``packing: isolated`` batch as :func:`model_inputs` says)."""
    return model(**model_inputs(batch)).loss


def model_inputs(batch: Any) -> Any:
    """The keyword arguments of the model for ``batch``: the batch itself, or for a
    ``packing: isolated`` batch (``position_ids``, one row) the batch without its
    attention mask and with no cache: only then do transformers' masks follow the packed
    ``position_ids`` (``masking_utils.find_packed_sequence_indices``); with either, the
    samples would see each other."""
    if "position_ids" in batch:
        return {**{k: v for k, v in batch.items() if k != "attention_mask"}, "use_cache": False}
    return batch


def padding_free() -> str | None:
    """``"flat"`` where the installed transformers keeps samples packed into one row apart
    from their restarting ``position_ids`` (its masks do since ``masking_utils`` has
    ``find_packed_sequence_indices``; checked on the CPU with SDPA and eager attention,
    tests/trial/test_isolated_packing.py), else ``None``."""
    try:
        from transformers.masking_utils import find_packed_sequence_indices  # noqa: F401
    except ImportError:
        return None
    return "flat"


def enable_checkpointing(model: Any) -> None:
    """The model's own activation checkpointing (non-reentrant, as autotune's blocks):
    ``activation_checkpointing_enable`` (transformers 5), else the older name."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def workload(
    model: Callable[[], Any],
    dataset: Callable[[], Any],
    *,
    pad_id: int,
    lengths: Callable[[], Sequence[int]] | None = None,
    optimizer: Callable[[Iterable[Any]], Any] | None = None,
    blocks: Callable[[Any], Sequence[Any]] | None = None,
    key: str = "input_ids",
    name: str = "hf",
) -> Workload:
    """A :class:`~autotune.Workload` for a transformers model over a tokenized dataset.

    Args:
        model: builds the model (e.g. ``lambda: AutoModelForCausalLM.from_config(cfg)``).
        dataset: builds a map-style dataset whose samples hold token ids under ``key``
            (a tokenized ``datasets.Dataset`` with ``set_format("torch")`` works).
        pad_id: the id padding gets (GPT-2 has none: its eos id works, labels and
            attention mask cover the padding).
        lengths: optional ``lengths()``, every sample's length (saves a pass).
        optimizer: ``optimizer(params)``; AdamW(lr=1e-3) if omitted.
        blocks: modules to checkpoint instead of the model's own checkpointing.
        key: the ids' key in a sample.
        name: shown in reports.
    """
    extra: dict[str, Any] = {"optimizer": optimizer} if optimizer is not None else {}
    return Workload(
        model=model,
        dataset=dataset,
        loss=model_loss,
        blocks=blocks,
        # the model's own next-token loss; isolated packing where transformers supports it
        tokens=Tokens(
            pad_id=pad_id, lengths=lengths, key=key, causal_lm=True, isolated=padding_free()
        ),
        checkpointing=enable_checkpointing if blocks is None else None,
        name=name,
        framework="transformers",
        **extra,
    )


# --- a transformers.Trainer as the workload -------------------------------------------


def from_trainer(trainer: Any) -> Workload:
    """The :class:`~autotune.Workload` a ``transformers.Trainer`` trains, and its baseline.

    What is taken from the Trainer: its ``model`` (as built: each trial process calls
    ``make_trainer()`` once, after seeding torch), its ``train_dataset`` with the unused
    columns removed as the Trainer removes them, its ``data_collator``, the loss as
    ``trainer.compute_loss(model, batch)`` computes it, and the optimizer as
    ``trainer.create_optimizer()`` builds it (class and hyper-parameters from ``optim``,
    ``learning_rate``, ``weight_decay`` ... with no weight decay on biases and norms). Samples
    holding ``input_ids`` whose collated batch has an ``attention_mask`` make a token
    workload: throughput counts the mask's real tokens. The baseline is
    :func:`trainer_baseline` of its ``TrainingArguments``.

    These are what the probe and a profile read. The trials and ``autotune verify`` run
    the Trainer's own loop (``Workload.native``, :mod:`autotune.frameworks.hf_loop`):
    ``Trainer.train()`` of a new Trainer like this one with the config's arguments, so
    its sampler, schedule, gradient clipping and callbacks run as in the user's training.

    Raises:
        WorkloadError: the Trainer has no ``train_dataset``, or an iterable one, or
            its ``optim`` builds its own parameter groups.
    """
    import torch

    args = trainer.args
    dataset = trainer.train_dataset
    if dataset is None:
        raise WorkloadError("the Trainer has no train_dataset: autotune times training steps")
    if isinstance(dataset, torch.utils.data.IterableDataset) or not hasattr(dataset, "__len__"):
        raise WorkloadError(
            f"the Trainer's train_dataset is a {type(dataset).__name__}, not a map-style "
            "dataset (autotune needs __len__ and __getitem__)"
        )
    dataset, collate = _train_data(trainer, dataset)
    model = trainer.model
    return Workload(
        model=lambda: model,
        dataset=lambda: dataset,
        loss=lambda m, batch: trainer.compute_loss(m, batch),
        optimizer=lambda params: _trainer_optimizer(trainer, params),
        collate_fn=collate,
        tokens=_tokens(dataset, collate, trainer),
        checkpointing=enable_checkpointing,
        name=f"Trainer({type(model).__name__})",
        framework="transformers",
        baseline=trainer_baseline(args),
        native=trainer_loop(trainer),
    )


def _train_data(trainer: Any, dataset: Any) -> tuple[Any, Any]:
    """The dataset and collate the Trainer's own train loader uses: a ``datasets.Dataset``
    loses the columns the model's forward does not take, any other dataset gets a collate
    that drops them (``remove_unused_columns``)."""
    collate = trainer.data_collator
    try:
        import datasets

        hf_dataset = isinstance(dataset, datasets.Dataset)
    except ImportError:
        hf_dataset = False
    if hf_dataset:
        dataset = trainer._remove_unused_columns(dataset, description="training")
    else:
        collate = trainer._get_collator_with_removed_columns(collate, description="training")
    return dataset, collate


def _tokens(dataset: Any, collate: Any, trainer: Any) -> Tokens | None:
    """Token samples (``input_ids``, batches with an ``attention_mask``), or ``None``."""
    if len(dataset) < 1:
        return None
    first = dataset[0]
    if not isinstance(first, Mapping) or "input_ids" not in first:
        return None
    batch = collate([dataset[i] for i in range(min(2, len(dataset)))])
    if not isinstance(batch, Mapping) or "attention_mask" not in batch:
        return None
    pad = getattr(trainer.processing_class, "pad_token_id", None)
    if pad is None:
        pad = getattr(getattr(trainer.model, "config", None), "pad_token_id", None)
    # The Trainer weighs micro-batches by their tokens (num_items_in_batch) only for a
    # model that takes the count and labels per token (a causal LM); a label per sample
    # (classification) is a mean per sample, each micro-batch weighing the same.
    labels = batch.get("labels")
    per_token = getattr(labels, "ndim", 1) >= 2 and getattr(
        trainer, "model_accepts_loss_kwargs", False
    )
    return Tokens(
        pad_id=pad if isinstance(pad, int) and pad >= 0 else 0,
        loss="token_mean" if per_token else "sample_mean",
    )


def _trainer_optimizer(trainer: Any, params: Iterable[Any]) -> Any:
    """The optimizer ``trainer.create_optimizer()`` builds, over ``params`` (the model's,
    possibly sharded): a decay and a no-decay group, the class and kwargs of ``optim``."""
    params = [p for p in params if p.requires_grad]
    model = trainer.model
    if trainer.optimizer is not None:  # Trainer(optimizers=(optimizer, scheduler))
        held = {id(p) for g in trainer.optimizer.param_groups for p in g["params"]}
        if held != {id(p) for p in params}:
            raise WorkloadError(
                "the Trainer was given a built optimizer (optimizers=(...)) over other "
                "parameters than the model's (sharded?): pass optimizer_cls_and_kwargs instead"
            )
        return trainer.optimizer
    if trainer.optimizer_cls_and_kwargs is not None:
        cls, kwargs = trainer.optimizer_cls_and_kwargs
    else:
        cls, kwargs = trainer.get_optimizer_cls_and_kwargs(trainer.args, model)
    if not isinstance(cls, type) or {"params", "model"} & set(kwargs):
        raise WorkloadError(
            f"optim={trainer.args.optim!r} builds its own parameter groups; autotune rebuilds "
            "the optimizer per trial and supports optimizers built from (params, **kwargs)"
        )
    names = {id(p): n for n, p in model.named_parameters()}
    decay = set(trainer.get_decay_parameter_names(model))
    groups = [
        {"params": [p for p in params if names.get(id(p)) in decay], "weight_decay": None},
        {"params": [p for p in params if names.get(id(p)) not in decay], "weight_decay": 0.0},
    ]
    groups[0]["weight_decay"] = trainer.args.weight_decay
    return cls([g for g in groups if g["params"]], **kwargs)


def trainer_baseline(args: Any) -> dict[str, Any]:
    """The knob values a ``transformers.TrainingArguments`` trains with: the baseline.

    ``per_device_train_batch_size`` -> ``batch_size``, ``gradient_accumulation_steps`` ->
    ``accumulation_steps``, ``bf16``/``fp16`` -> ``amp_dtype``, ``tf32`` ->
    ``matmul_precision`` (``high``/``highest``; unset: the default),
    ``dataloader_num_workers``/``_pin_memory``/``_persistent_workers``/``_prefetch_factor``,
    ``torch_compile`` and ``torch_compile_mode`` -> ``compile_mode``,
    ``gradient_checkpointing``, and ``group_by_length`` (``train_sampling_strategy`` in
    transformers 5) -> ``length_grouping``. Knobs with no such field keep their defaults.
    """
    workers = int(args.dataloader_num_workers)
    grouped = getattr(args, "group_by_length", False) or (
        getattr(args, "train_sampling_strategy", None) == "group_by_length"
    )
    values: dict[str, Any] = {
        "batch_size": int(args.per_device_train_batch_size),
        "accumulation_steps": int(args.gradient_accumulation_steps),
        "amp_dtype": "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32",
        "num_workers": workers,
        "pin_memory": bool(args.dataloader_pin_memory),
        "compile_mode": (args.torch_compile_mode or "default") if args.torch_compile else "off",
        "gradient_checkpointing": bool(args.gradient_checkpointing),
        "length_grouping": "grouped" if grouped else "off",
    }
    if args.tf32 is not None:
        values["matmul_precision"] = "high" if args.tf32 else "highest"
    if workers:
        values["persistent_workers"] = bool(args.dataloader_persistent_workers)
        if args.dataloader_prefetch_factor is not None:
            values["prefetch_factor"] = int(args.dataloader_prefetch_factor)
    return values


def apply(trainer: Any, config: Any, *, warn: bool = True) -> Any:
    """New ``TrainingArguments``: the trainer's own (or ``args`` given instead of a
    Trainer) with a found config's values set; the trainer is not changed.

    A Trainer sets itself up from its arguments when it is built (the accelerator, mixed
    precision, the batch size), so the result goes into a new Trainer::

        args = autotune.hf.apply(trainer, autotune.load_config("best_config.yaml"))
        trainer = transformers.Trainer(model=model, args=args, train_dataset=..., ...)

    The fields are those of ``autotune export --format hf``
    (:func:`autotune.frameworks.mapping.hf_training_arguments`); a knob off its default
    that no field expresses (``channels_last``, ``sdpa_backend``...) is named in one
    ``UserWarning`` with how to set it by hand (``warn=False``: silent).

    Args:
        trainer: a ``transformers.Trainer`` or ``transformers.TrainingArguments``.
        config: an :class:`autotune.Config` or a mapping of knob values.
    """
    return hf_apply(trainer, config, warn=warn, stacklevel=3)
