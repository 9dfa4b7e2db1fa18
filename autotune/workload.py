"""The workload contract: what a user hands autotune, and how a reference to it is loaded.

A workload is a few factories. autotune calls them in the trial subprocess only; the
driver process never imports the user's model.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import WorkloadError


def _default_optimizer(params: Iterable[Any]) -> Any:
    import torch

    return torch.optim.AdamW(params, lr=1e-3)


def _int_at_least(where: str, value: Any, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise WorkloadError(f"{where} must be an integer >= {low} but got {value!r}")


def _function_or_none(where: str, value: Any, what: str) -> None:
    if value is not None and not callable(value):
        raise WorkloadError(f"{where} must be a function {what} but got {type(value).__name__}")


LOSS_KINDS = ("token_mean", "token_sum", "sample_mean")
ISOLATED_LAYOUTS = ("rows", "flat")
# The frameworks a workload can come from (autotune.hf, autotune.lightning): each has its
# export format (autotune.output.export.FRAMEWORK_FORMATS).
FRAMEWORKS = ("transformers", "lightning")


@dataclass(frozen=True)
class Tokens:
    """Says that a workload's samples are token sequences, so autotune owns the batch.

    Each sample is a 1-d sequence of token ids (a list or a tensor), or a dict holding one
    under ``input_ids`` (as a tokenized Hugging Face dataset yields). autotune's collate
    pads a batch (to its longest sample, or to a multiple: the ``pad_to_multiple_of``
    knob) and yields ``{"input_ids", "attention_mask", "labels"}`` (labels are the ids,
    ``-100`` on padding): what a Hugging Face causal LM takes. Throughput counts real
    (non-padding) tokens, and the layout knobs ``length_grouping`` and
    ``pad_to_multiple_of`` can be searched.

    Attributes:
        pad_id: the id padding positions get.
        lengths: optional ``lengths() -> sequence of int``, every sample's length in
            dataset order (saves the probe a pass over the dataset).
        key: the dict key of the ids in a sample.
        causal_lm: the loss is a per-token causal-LM loss over ``labels``, so samples may
            be packed together (the ``packing`` knob).
        eos_id: the separator packing puts after each sample.
        pack_length: the length of a packed row (the ``pack_length`` knob's default).
        context: the most positions the model takes, where ``model.config`` does not say
            it (a transformers model's ``max_position_embeddings`` or ``n_positions``):
            ``pack_length`` values above it are refused before any trial.
        isolated: the model keeps samples packed into one row apart, so ``packing:
            isolated`` may be searched (positions restart at each sample, attention never
            crosses samples): ``rows`` — rows of ``pack_length`` whose batch adds
            ``position_ids`` and ``seq_ids`` (each token's sample in its row, ``-1`` on
            padding), for a model that passes them to :func:`autotune.sample_mask` and
            :func:`autotune.isolated_attention`; ``flat`` — one row per micro-batch with
            ``position_ids`` restarting per sample (transformers' padding-free layout,
            ``DataCollatorWithFlattening``; :func:`autotune.hf.workload` sets it where the
            installed transformers honours it).
        loss: what the workload's loss is over a micro-batch, so that accumulation
            weighs micro-batches right (one optimizer step is the per-token mean over all
            its micro-batches and ranks, whatever the split): ``token_mean`` (the
            default: a mean over the tokens it scores; each micro-batch's loss is
            weighted by its tokens over the step's), ``token_sum`` (a sum over them;
            divided by the step's tokens) or ``sample_mean`` (a mean per sample, e.g.
            one label per sequence: micro-batches weigh equally).
        loss_tokens: ``loss_tokens(batch) -> int``, the tokens a batch's loss scores (as
            the loader yields it); by default the ``labels`` other than ``-100`` after
            each row's first position (a next-token loss shifts the labels by one; the
            Hugging Face Trainer counts the same).
    """

    pad_id: int
    lengths: Callable[[], Sequence[int]] | None = None
    key: str = "input_ids"
    causal_lm: bool = False
    eos_id: int | None = None
    pack_length: int | None = None
    isolated: str | None = None
    context: int | None = None
    loss: str = "token_mean"
    loss_tokens: Callable[[Any], int] | None = None

    def __post_init__(self) -> None:
        _int_at_least("tokens.pad_id", self.pad_id, 0)
        if self.eos_id is not None:
            _int_at_least("tokens.eos_id", self.eos_id, 0)
        if self.pack_length is not None:
            _int_at_least("tokens.pack_length", self.pack_length, 2)
        if self.context is not None:
            _int_at_least("tokens.context", self.context, 1)
        if not isinstance(self.causal_lm, bool):
            raise WorkloadError(
                f"tokens.causal_lm must be true or false but got {self.causal_lm!r}"
            )
        _function_or_none("tokens.lengths", self.lengths, "returning the lengths")
        if not isinstance(self.key, str) or not self.key:
            raise WorkloadError(f"tokens.key must be a non-empty string but got {self.key!r}")
        if self.isolated is not None and self.isolated not in ISOLATED_LAYOUTS:
            raise WorkloadError(
                f"tokens.isolated must be one of {', '.join(ISOLATED_LAYOUTS)} or None but "
                f"got {self.isolated!r}"
            )
        if self.loss not in LOSS_KINDS:
            raise WorkloadError(
                f"tokens.loss must be one of {', '.join(LOSS_KINDS)} but got {self.loss!r}"
            )
        _function_or_none(
            "tokens.loss_tokens", self.loss_tokens, "counting a batch's scored tokens"
        )


@dataclass(frozen=True)
class Workload:
    """A model, its data, and how to compute its loss.

    Attributes:
        model: builds the model (fp32, on the CPU); autotune moves it to the device.
        dataset: builds a map-style ``torch.utils.data.Dataset``. Must be deterministic:
            every trial sees the same samples in the same order.
        loss: ``loss(model, batch) -> scalar tensor``; ``batch`` is what the DataLoader
            yields, already on the device.
        optimizer: ``optimizer(params) -> torch.optim.Optimizer``; AdamW(lr=1e-3) if omitted.
        blocks: ``blocks(model) -> sequence of modules`` whose activations may be recomputed
            in backward (gradient checkpointing); omit if the model has none.
        collate_fn: passed to the DataLoader. With ``tokens``, a workload's own collate
            is kept, and the knobs that need autotune's (``pad_to_multiple_of``) are dropped.
        tokens_per_sample: for fixed-length language models, tokens in one sample;
            enables tokens/s.
        tokens: the samples are variable-length token sequences (see :class:`Tokens`):
            tokens/s counts real tokens, the loss should be a mean per token.
        count_tokens: ``count_tokens(batch) -> int``, the real tokens of a batch (as the
            loader yields it, before it moves to the device); by default the sum of its
            ``attention_mask``.
        checkpointing: ``checkpointing(model)`` turns on the model's own activation
            checkpointing (e.g. a Hugging Face model's ``gradient_checkpointing_enable``);
            used for ``gradient_checkpointing`` when no ``blocks`` are given.
        name: shown in reports.
        framework: the training framework the workload comes from (``"transformers"``,
            ``"lightning"``; set by :mod:`autotune.hf` and :mod:`autotune.lightning`):
            the study's summary suggests that framework's export format.
        baseline: knob values the user's own training setup already uses (a
            ``transformers.Trainer``'s ``TrainingArguments``, a Lightning DataModule's
            loader): the study's baseline, under what the space file's ``baseline:`` sets.
        native: the framework's own loop over the user's objects
            (:class:`autotune.frameworks.loop.NativeLoop`, set by the Trainer and
            Lightning adapters): trials and ``autotune verify`` run it instead of
            autotune's loop, so what they measure is what the user's trainer delivers.
    """

    model: Callable[[], Any]
    dataset: Callable[[], Any]
    loss: Callable[[Any, Any], Any]
    optimizer: Callable[[Iterable[Any]], Any] = field(default=_default_optimizer)
    blocks: Callable[[Any], Sequence[Any]] | None = None
    collate_fn: Callable[[list[Any]], Any] | None = None
    tokens_per_sample: int | None = None
    tokens: Tokens | None = None
    count_tokens: Callable[[Any], int] | None = None
    checkpointing: Callable[[Any], None] | None = None
    name: str = "workload"
    baseline: Mapping[str, Any] | None = None
    framework: str | None = None
    native: Any = None

    def __post_init__(self) -> None:
        self._check_modules()
        if self.baseline is not None and not isinstance(self.baseline, Mapping):
            raise WorkloadError(
                "Workload.baseline must be a mapping of knob name to value but got "
                f"{type(self.baseline).__name__}"
            )
        for name in ("model", "dataset", "loss", "optimizer"):
            value = getattr(self, name)
            if not callable(value):
                kind = type(value).__name__
                raise WorkloadError(
                    f"Workload.{name} must be a function (a factory) but got a {kind}"
                    + (
                        f"; pass a function that builds it: {name}=lambda: {kind}(...)"
                        if name == "dataset"
                        else ""
                    )
                )
        for name in ("blocks", "collate_fn", "count_tokens", "checkpointing"):
            value = getattr(self, name)
            if value is not None and not callable(value):
                raise WorkloadError(
                    f"Workload.{name} must be a function or None but got {type(value).__name__}"
                )
        if self.tokens_per_sample is not None:
            _int_at_least("Workload.tokens_per_sample", self.tokens_per_sample, 1)
        if self.framework is not None and self.framework not in FRAMEWORKS:
            raise WorkloadError(
                f"Workload.framework must be one of {', '.join(map(repr, FRAMEWORKS))} or None "
                f"but got {self.framework!r}"
            )
        if self.tokens is not None and not isinstance(self.tokens, Tokens):
            raise WorkloadError(
                f"Workload.tokens must be autotune.Tokens(pad_id=...) but got "
                f"{type(self.tokens).__name__}"
            )

    def _check_modules(self) -> None:
        """A module instance where a factory or ``loss(model, batch)`` belongs: both are
        callable, so only their type tells (torch is loaded if the caller built one)."""
        torch = sys.modules.get("torch")
        if torch is None:
            return
        if isinstance(self.model, torch.nn.Module):
            kind = type(self.model).__name__
            raise WorkloadError(
                f"Workload.model must build the model (each trial builds its own) but got a "
                f"{kind} instance; pass model={kind} or model=lambda: {kind}(...)"
            )
        if isinstance(self.loss, torch.nn.modules.loss._Loss):
            kind = type(self.loss).__name__
            raise WorkloadError(
                f"Workload.loss is a {kind} criterion but autotune calls loss(model, batch) "
                f"and expects the loss; pass e.g. loss=lambda model, batch: "
                f"{kind}()(model(batch[0]), batch[1])"
            )
        if isinstance(self.optimizer, torch.optim.Optimizer):
            raise WorkloadError(
                f"Workload.optimizer must build the optimizer over the params it is given "
                f"but got a {type(self.optimizer).__name__} instance; pass "
                f"optimizer=lambda params: torch.optim.{type(self.optimizer).__name__}(params, ...)"
            )

    @property
    def packing_undeclared(self) -> str | None:
        """Why packing the samples would be a mistake (``None`` when the workload declared
        a per-token causal-LM loss with ``Tokens(causal_lm=True, eos_id, pack_length)``)."""
        if self.tokens is None:
            return "the workload's samples are not token sequences (Workload.tokens)"
        missing = [
            name
            for name, ok in (
                ("causal_lm=True", self.tokens.causal_lm),
                ("eos_id", self.tokens.eos_id is not None),
                ("pack_length", self.tokens.pack_length is not None),
            )
            if not ok
        ]
        if missing:
            return f"packing needs Tokens({', '.join(missing)}): a per-token causal-LM loss"
        return None

    @property
    def isolated_undeclared(self) -> str | None:
        """Why ``packing: isolated`` would be a mistake (``None`` when the workload declared
        a per-token causal-LM loss and a model that keeps packed samples apart)."""
        if self.tokens is None:
            return "the workload's samples are not token sequences (Workload.tokens)"
        missing = [
            name
            for name, ok in (
                ("causal_lm=True", self.tokens.causal_lm),
                ("isolated='rows' or 'flat'", self.tokens.isolated is not None),
                (
                    "pack_length",
                    self.tokens.isolated != "rows" or self.tokens.pack_length is not None,
                ),
            )
            if not ok
        ]
        if missing:
            return (
                f"packing: isolated needs Tokens({', '.join(missing)}): a per-token causal-LM "
                "loss and a model that keeps packed samples apart (autotune.hf: a transformers "
                "whose masks follow packed position_ids)"
            )
        return None

    @property
    def owns_collate(self) -> bool:
        """Whether autotune pads and masks the batches (token samples, no own collate)."""
        return self.tokens is not None and self.collate_fn is None


def _import_target(ref: str, base_dir: Path | None) -> Any:
    """Import ``module:attr`` or ``path/to/file.py:attr`` and return the attribute."""
    if ":" not in ref:
        raise WorkloadError(
            f"workload {ref!r} must be 'module:function' or 'path/to/file.py:function'"
        )
    target, _, attr = ref.rpartition(":")
    if target.endswith(".py"):
        path = Path(target)
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        if not path.is_file():
            raise WorkloadError(f"workload {ref!r}: file {path} does not exist")
        name = f"autotune_workload_{path.stem}"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # needed for pickling by DataLoader workers
        sys.path.insert(0, str(path.parent))  # let the file import its siblings
        try:
            spec.loader.exec_module(module)
        except Exception as e:
            raise WorkloadError(
                f"workload {ref!r}: importing {path} failed: {type(e).__name__}: {e}"
            ) from e
    else:
        try:
            module = importlib.import_module(target)
        except Exception as e:
            raise WorkloadError(
                f"workload {ref!r}: cannot import module {target!r}: {type(e).__name__}: {e}"
            ) from e
    try:
        return getattr(module, attr)
    except AttributeError:
        raise WorkloadError(f"workload {ref!r}: {target} has no attribute {attr!r}") from None


def load_workload(
    ref: str,
    args: dict[str, Any] | None = None,
    base_dir: Path | None = None,
    *,
    seed: int | None = None,
    adapt: Callable[[Any], Workload | None] | None = None,
) -> Workload:
    """Load a workload from a reference and call its factory.

    Args:
        ref: ``"package.module:function"`` or ``"path/to/file.py:function"``; a relative
            file path is resolved against ``base_dir`` (the space file's folder).
        args: keyword arguments for the factory.
        base_dir: folder for relative file paths.
        seed: seeds torch after the import, before the factory runs: a factory that
            builds its model right away (``make_trainer()``) builds the same weights in
            every run.
        adapt: turns what the factory returned, when not a :class:`Workload`, into one
            (``None`` for something it does not know): :func:`autotune.frameworks.adapters.load`
            passes the Trainer and Lightning adapters.

    Raises:
        WorkloadError: the reference cannot be imported, or the factory fails or returns
            something that is not a :class:`Workload`.
    """
    factory = _import_target(ref, base_dir)
    if isinstance(factory, Workload):
        if args:
            raise WorkloadError(f"workload {ref!r} is a Workload object and takes no arguments")
        return factory
    if not callable(factory):
        raise WorkloadError(f"workload {ref!r} is neither a Workload nor a function returning one")
    if seed is not None:
        import torch  # only the trial process passes a seed

        torch.manual_seed(seed)
    try:
        workload = factory(**(args or {}))
    except Exception as e:
        raise WorkloadError(f"workload {ref!r} raised {type(e).__name__}: {e}") from e
    if isinstance(workload, Workload):
        return workload
    try:
        adapted = adapt(workload) if adapt is not None else None
    except WorkloadError as e:
        raise WorkloadError(f"workload {ref!r}: {e}") from None
    except Exception as e:
        raise WorkloadError(f"workload {ref!r}: {type(e).__name__}: {e}") from e
    if adapted is None:
        raise WorkloadError(
            f"workload {ref!r} must return autotune.Workload but returned "
            f"{type(workload).__name__} (a transformers.Trainer or a (LightningModule, "
            "LightningDataModule) pair is taken too)"
        )
    return adapted
