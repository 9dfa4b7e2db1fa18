"""Hugging Face transformers models as workloads, in three lines.

    import autotune.hf, transformers
    config = transformers.GPT2Config(n_layer=4, n_embd=256, n_head=4)
    def workload():
        return autotune.hf.workload(
            model=lambda: transformers.GPT2LMHeadModel(config), dataset=my_tokenized, pad_id=0
        )

The loss is the model's own (``outputs.loss``, computed from the ``labels`` autotune's
collate builds: the ids, ``-100`` on padding), tokens are counted from the attention mask,
and ``gradient_checkpointing`` turns on the model's own ``gradient_checkpointing_enable()``
unless ``blocks`` are given. Nothing is downloaded: build the model from a config.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from .workload import Tokens, Workload


def model_loss(model: Any, batch: Any) -> Any:
    """``model(**batch).loss``: what a transformers model computes from ``labels``."""
    return model(**batch).loss


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
        tokens=Tokens(pad_id=pad_id, lengths=lengths, key=key),
        checkpointing=enable_checkpointing if blocks is None else None,
        name=name,
        **extra,
    )
