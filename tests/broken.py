"""Workloads built wrong, one mistake each, as new users make them (``validate``'s cases).

``broken(mistake)`` returns the tiny workload of ``tests/workloads.py`` with ``mistake``
made; ``broken("none")`` is right.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F
from workloads import MLP, Blobs, _loss

import autotune


class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        yield from Blobs()


def _dict_loss(model, batch):
    return F.cross_entropy(model(batch["x"]), batch["y"])


MISTAKES = {
    "none": {},
    # fields given the wrong kind of thing (caught when Workload(...) is built)
    "dataset_instance": {"dataset": Blobs()},
    "criterion": {"loss": nn.CrossEntropyLoss()},
    "model_instance": {"model": MLP()},
    "optimizer_instance": {"optimizer": torch.optim.SGD(MLP().parameters(), lr=0.1)},
    "unknown_framework": {"framework": "keras"},
    # functions with the wrong arguments
    "loss_one_argument": {"loss": lambda batch: batch[0].sum()},
    "functional_criterion": {"loss": F.cross_entropy},
    "model_with_arguments": {"model": lambda hidden: MLP(hidden=hidden)},
    # what the functions build or return
    "model_not_module": {"model": lambda: {"weights": torch.zeros(3)}},
    "blocks_not_modules": {"blocks": lambda model: ["blocks.0", "blocks.1"]},
    "blocks_of_another_model": {"blocks": lambda model: list(MLP().blocks)},
    "iterable_dataset": {"dataset": Stream},
    "tiny_dataset": {"dataset": lambda: Blobs(n=4)},
    "batch_loss_cannot_take": {"loss": _dict_loss},
    "loss_not_scalar": {"loss": lambda m, b: F.cross_entropy(m(b[0]), b[1], reduction="none")},
    "loss_detached": {"loss": lambda m, b: _loss(m, b).detach()},
    "optimizer_returns_list": {"optimizer": lambda params: list(params)},
}


def broken(mistake: str = "none") -> autotune.Workload | dict:
    if mistake == "returns_dict":
        return {"model": MLP, "dataset": Blobs, "loss": _loss}
    fields = {
        "name": f"broken-{mistake}",
        "model": MLP,
        "dataset": Blobs,
        "loss": _loss,
        "optimizer": lambda params: torch.optim.SGD(params, lr=0.1),
        "blocks": lambda model: list(model.blocks),
    }
    return autotune.Workload(**{**fields, **MISTAKES[mistake]})
