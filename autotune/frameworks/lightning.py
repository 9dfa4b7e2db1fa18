"""A Lightning module and its data module as a workload.

A space's ``workload: train.py:make_trainer`` may name a function returning
``(LightningModule, LightningDataModule)``: the module's ``training_step`` is the loss,
its ``configure_optimizers`` the optimizer, and the data module's train loader gives the
dataset, the collate and the baseline (``batch_size``, ``num_workers``, ``pin_memory``,
``persistent_workers``, ``prefetch_factor``). These are what the probe and a profile
read; the trials and ``autotune verify`` run ``Trainer.fit()`` with the export's
arguments (``Workload.native``, :mod:`autotune.frameworks.lightning_loop`), so the
precision plugin, ``self.log`` and the hooks run as in the user's training.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..errors import WorkloadError
from ..workload import Tokens, Workload


def from_trainer(pair: tuple[Any, ...]) -> Workload:
    """The :class:`~autotune.Workload` of a ``(LightningModule, LightningDataModule)``.

    Raises:
        WorkloadError: not a pair, a loader with a ``batch_sampler`` (no batch size to
            tune), or an iterable dataset.
    """
    import torch

    if len(pair) != 2:
        raise WorkloadError(
            f"make_trainer() must return (LightningModule, LightningDataModule) but returned "
            f"a tuple of {len(pair)}"
        )
    module, data = pair
    for hook in ("prepare_data", "setup"):
        if not hasattr(data, hook):
            raise WorkloadError(
                f"the second item must be a LightningDataModule but is {type(data).__name__}"
            )
    data.prepare_data()
    data.setup("fit")
    loader = data.train_dataloader()
    if not isinstance(loader, torch.utils.data.DataLoader):
        raise WorkloadError(
            f"train_dataloader() must return one torch DataLoader but returned "
            f"{type(loader).__name__}"
        )
    if loader.batch_size is None:
        raise WorkloadError(
            "train_dataloader() uses a batch_sampler: autotune tunes the DataLoader's "
            "batch_size and needs it set"
        )
    dataset = loader.dataset
    if isinstance(dataset, torch.utils.data.IterableDataset):
        raise WorkloadError(
            f"train_dataloader()'s dataset is a {type(dataset).__name__}, not a map-style "
            "dataset (autotune needs __len__ and __getitem__)"
        )
    if getattr(module, "automatic_optimization", True) is False:
        raise WorkloadError(
            "the LightningModule uses manual optimization (automatic_optimization=False): "
            "autotune steps one optimizer after training_step's loss"
        )
    collate = loader.collate_fn
    if collate is torch.utils.data.default_collate:
        collate = None
    step = TrainingStep(module)
    from .lightning_loop import pair_loop

    return Workload(
        model=lambda: step,
        dataset=lambda: dataset,
        loss=lambda model, batch: model(batch),
        optimizer=lambda params: _optimizer(module, params),
        collate_fn=collate,
        tokens=_tokens(dataset, collate),
        name=f"LightningModule({type(module).__name__})",
        framework="lightning",
        baseline=loader_baseline(loader),
        native=pair_loop(module, data, loader),
    )


def TrainingStep(module: Any) -> Any:  # noqa: N802  (a torch class, made on first use)
    """``module`` wrapped so that calling it runs ``training_step(batch, 0)`` and returns
    the loss: autotune's compile, DDP and FSDP then wrap the whole step, as Lightning's
    own strategy wrapper does."""
    import torch

    class _TrainingStep(torch.nn.Module):
        def __init__(self, module: Any) -> None:
            super().__init__()
            self.module = module

        def forward(self, batch: Any) -> Any:
            out = self.module.training_step(batch, 0)
            if isinstance(out, Mapping):
                out = out.get("loss")
            if out is None:
                raise WorkloadError(
                    "training_step returned no loss (a tensor or a dict with 'loss')"
                )
            return out

    named = type(f"{type(module).__name__}.training_step", (_TrainingStep,), {})
    return named(module)  # reports name the module, not the wrapper


def _optimizer(module: Any, params: Iterable[Any]) -> Any:
    """The one optimizer ``configure_optimizers()`` returns (its schedulers are not
    stepped in a trial), built over the module's parameters."""
    out = module.configure_optimizers()
    if isinstance(out, Mapping):
        out = out.get("optimizer")
    elif isinstance(out, (list, tuple)):
        first = out[0] if out else None
        optimizers = first if isinstance(first, (list, tuple)) else out
        optimizers = [o for o in optimizers if not isinstance(o, Mapping)] or [
            o.get("optimizer") for o in optimizers
        ]
        if len(optimizers) != 1:
            raise WorkloadError(
                f"configure_optimizers() returned {len(optimizers)} optimizers: autotune "
                "tunes a step with one"
            )
        out = optimizers[0]
    if out is None or not hasattr(out, "param_groups"):
        raise WorkloadError(
            f"configure_optimizers() must return an optimizer but returned {type(out).__name__}"
        )
    wanted = {id(p) for p in params}
    held = {id(p) for g in out.param_groups for p in g["params"]}
    if not held <= wanted:
        raise WorkloadError(
            "configure_optimizers() built its optimizer over parameters autotune does not "
            "train (sharded by fsdp?): build it over self.parameters() when called"
        )
    return out


def _tokens(dataset: Any, collate: Any) -> Tokens | None:
    """Token samples (``input_ids``, batches with an ``attention_mask``), or ``None``."""
    import torch

    if len(dataset) < 1:
        return None
    first = dataset[0]
    if not isinstance(first, Mapping) or "input_ids" not in first:
        return None
    batch = (collate or torch.utils.data.default_collate)([first])
    if not isinstance(batch, Mapping) or "attention_mask" not in batch:
        return None
    # Lightning divides each micro-batch's loss by accumulate_grad_batches: equal weights.
    return Tokens(pad_id=0, loss="sample_mean")


def loader_baseline(loader: Any) -> dict[str, Any]:
    """The knob values of a train ``DataLoader``: the baseline of a Lightning workload."""
    workers = int(loader.num_workers)
    values: dict[str, Any] = {
        "batch_size": int(loader.batch_size),
        "num_workers": workers,
        "pin_memory": bool(loader.pin_memory),
    }
    if workers:
        values["persistent_workers"] = bool(loader.persistent_workers)
        if loader.prefetch_factor is not None:
            values["prefetch_factor"] = int(loader.prefetch_factor)
    return values
