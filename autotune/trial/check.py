"""``autotune validate``'s build check, run in the trial process (mode ``check``).

Loads the workload, checks each field (a function taking the right arguments), builds
the model, the dataset and one batch at the smallest batch size of the space, and runs
one forward, loss and backward in fp32 on the CPU, as a trial would. Each mistake is one
line naming the field and what was expected; a step that needs what an earlier one
failed to build is skipped (the first mistake hides the ones behind it).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import Any

import torch

from ..config import Config
from ..errors import first_line
from ..measurement import OK
from ..trial_spec import TrialSpec
from ..workload import Workload
from .apply import apply
from .build import load

# What autotune passes each function of a Workload (the names shown in the messages).
ARGUMENTS = {
    "model": (),
    "dataset": (),
    "loss": ("model", "batch"),
    "optimizer": ("params",),
    "blocks": ("model",),
    "collate_fn": ("samples",),
    "count_tokens": ("batch",),
    "checkpointing": ("model",),
}


def _raised(what: str, exc: BaseException) -> str:
    return f"{what} raised {type(exc).__name__}: {first_line(exc)}"


def arity_problem(name: str, fn: Callable[..., Any]) -> str | None:
    """Why ``fn`` cannot be called as ``Workload.<name>`` is (None if it can, or if its
    signature cannot be read, as for some builtins)."""
    args = ARGUMENTS[name]
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    try:
        signature.bind(*args)
    except TypeError:
        called = f"Workload.{name}({', '.join(args)})"
        return f"{called}: autotune calls it so, but it takes {signature}"
    return None


def describe(batch: Any, depth: int = 0) -> str:
    """A batch's structure in a few words: ``a tuple of (tensor [8, 16] float32, ...)``."""
    if isinstance(batch, torch.Tensor):
        return f"tensor {list(batch.shape)} {str(batch.dtype).removeprefix('torch.')}"
    if depth > 1:
        return type(batch).__name__
    if isinstance(batch, dict):
        inner = ", ".join(f"{k}: {describe(v, depth + 1)}" for k, v in list(batch.items())[:4])
        return f"a dict of ({inner})"
    if isinstance(batch, (list, tuple)):
        inner = ", ".join(describe(v, depth + 1) for v in batch[:4])
        more = ", ..." if len(batch) > 4 else ""
        return f"a {type(batch).__name__} of ({inner}{more})"
    return f"a {type(batch).__name__}"


class Check:
    """The problems found so far, and the facts of what was built."""

    def __init__(self) -> None:
        self.problems: list[str] = []
        self.facts: dict[str, Any] = {}

    def __call__(self, problem: str) -> None:
        self.problems.append(problem)

    def call(self, what: str, fn: Callable[..., Any], *args: Any) -> tuple[bool, Any]:
        """``fn(*args)``, a problem naming ``what`` if it raises."""
        try:
            return True, fn(*args)
        except Exception as exc:
            self(_raised(what, exc))
            return False, None


def _criterion_hint(loss: Any, model: torch.nn.Module, error: str = "") -> str:
    """A hint when ``loss`` looks like a criterion (``loss(output, target)``): a module,
    or a function that complained of getting the model where it wanted a tensor."""
    if isinstance(loss, torch.nn.Module) or f"not {type(model).__name__}" in error:
        return (
            " (a criterion? autotune calls loss(model, batch) and expects the loss: wrap "
            "it, e.g. loss=lambda model, batch: criterion(model(batch[0]), batch[1]))"
        )
    return ""


def check_model(check: Check, workload: Workload) -> torch.nn.Module | None:
    ok, model = check.call("Workload.model()", workload.model)
    if ok and not isinstance(model, torch.nn.Module):
        check(f"Workload.model() returned {type(model).__name__}; expected a torch.nn.Module")
        return None
    if ok:
        check.facts["model"] = type(model).__name__
        check.facts["parameters"] = sum(p.numel() for p in model.parameters())
        if check.facts["parameters"] == 0:
            check(f"Workload.model() built a {type(model).__name__} with no parameters")
    return model if ok else None


def check_dataset(check: Check, workload: Workload, batch_size: int) -> Any:
    ok, dataset = check.call("Workload.dataset()", workload.dataset)
    if not ok:
        return None
    kind = type(dataset).__name__
    if isinstance(dataset, torch.utils.data.IterableDataset) or not (
        hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")
    ):
        check(
            f"Workload.dataset() returned {kind}, not a map-style dataset: autotune needs "
            "__len__ and __getitem__ (it samples and reorders by index)"
        )
        return None
    ok, size = check.call(f"len(Workload.dataset()) ({kind})", len, dataset)
    if not ok:
        return None
    check.facts["dataset"] = kind
    check.facts["samples"] = size
    if size < batch_size:
        check(
            f"Workload.dataset() has {size} samples, fewer than the smallest batch_size of "
            f"the space ({batch_size})"
        )
        return None
    ok, _ = check.call(f"Workload.dataset()[0] ({kind}.__getitem__)", dataset.__getitem__, 0)
    return dataset if ok else None


def check_blocks(check: Check, workload: Workload, model: torch.nn.Module) -> list[Any] | None:
    if workload.blocks is None:
        return None
    ok, blocks = check.call("Workload.blocks(model)", workload.blocks, model)
    if not ok:
        return None
    try:
        blocks = list(blocks)
    except TypeError:
        check(
            f"Workload.blocks(model) returned {type(blocks).__name__}; expected a list of modules"
        )
        return None
    ours = {id(m) for m in model.modules()}
    for i, block in enumerate(blocks):
        if not isinstance(block, torch.nn.Module):
            check(
                f"Workload.blocks(model)[{i}] is a {type(block).__name__}; expected a "
                "torch.nn.Module of the model"
            )
            return None
        if id(block) not in ours:
            check(
                f"Workload.blocks(model)[{i}] ({type(block).__name__}) is not a module of "
                "the model it was given (blocks must return modules of that model)"
            )
            return None
    check.facts["blocks"] = len(blocks)
    return blocks


def check_optimizer(check: Check, workload: Workload, model: torch.nn.Module) -> bool:
    ok, opt = check.call("Workload.optimizer(params)", workload.optimizer, model.parameters())
    if ok and not isinstance(opt, torch.optim.Optimizer):
        check(
            f"Workload.optimizer(params) returned {type(opt).__name__}; expected a "
            "torch.optim.Optimizer"
        )
        return False
    return ok


def check_step(
    check: Check, workload: Workload, model: torch.nn.Module, dataset: Any, batch_size: int
) -> None:
    """One batch, forward, loss and backward in fp32 on the CPU, as a trial runs them."""
    config = Config(batch_size=batch_size)
    try:
        applied = apply(
            config,
            model=model,
            dataset=dataset,
            loss=workload.loss,
            optimizer=workload.optimizer,
            collate_fn=workload.collate_fn,
            device="cpu",
            tokens=workload.tokens,
            count_tokens=workload.count_tokens,
        )
        batch = next(iter(applied.loader))
    except Exception as exc:
        who = (
            "Workload.collate_fn"
            if workload.collate_fn is not None
            else "autotune's padding of token samples (Workload.tokens)"
            if workload.owns_collate
            else "the DataLoader's default collate (give Workload.collate_fn to batch "
            "these samples)"
        )
        check(_raised(f"a batch of {batch_size} samples from {who}", exc))
        return
    check.facts["batch"] = describe(batch)
    if workload.count_tokens is not None:
        ok, n = check.call("Workload.count_tokens(batch)", workload.count_tokens, batch)
        if ok and (isinstance(n, bool) or not isinstance(n, (int, torch.Tensor))):
            check(f"Workload.count_tokens(batch) returned {type(n).__name__}; expected an int")
    batch = applied.to_device(batch)
    try:
        loss = workload.loss(applied.model, batch)
    except Exception as exc:
        check(
            _raised("Workload.loss(model, batch)", exc)
            + f"; the batch was {describe(batch)}"
            + _criterion_hint(workload.loss, applied.model, first_line(exc))
        )
        return
    if not isinstance(loss, torch.Tensor):
        check(
            f"Workload.loss(model, batch) returned {type(loss).__name__}; expected a scalar "
            f"tensor{_criterion_hint(workload.loss, applied.model)}"
        )
        return
    if loss.numel() != 1:
        check(
            f"Workload.loss(model, batch) returned a tensor of shape {list(loss.shape)}; "
            "expected a scalar (reduce it, e.g. with .mean())"
        )
        return
    if loss.grad_fn is None:
        check(
            "Workload.loss(model, batch) returned a tensor with no gradient: it does not "
            "depend on the model's parameters (detached, or computed under no_grad)"
        )
        return
    value = float(loss.detach())
    check.facts["loss"] = value
    if not math.isfinite(value):
        check(f"Workload.loss(model, batch) is {value} on the first batch, in fp32")
        return
    try:
        loss.backward()
    except Exception as exc:
        check(_raised("backward of Workload.loss(model, batch)", exc))
        return
    if not any(p.grad is not None for p in applied.model.parameters()):
        check("Workload.loss(model, batch): backward gave no parameter of the model a gradient")


def check(spec: TrialSpec) -> dict[str, Any]:
    """The payload of mode ``check``: ``problems`` (one line each) and ``facts``."""
    torch.manual_seed(0)
    batch_size = spec.batch_size
    workload = load(spec)  # a WorkloadError is the trial's failure reason: one line
    found = Check()
    if workload.native is not None:  # what the framework's own loop cannot set
        found.facts["framework_refused"] = dict(workload.native.refused)
    for name in ARGUMENTS:
        fn = getattr(workload, name)
        problem = arity_problem(name, fn) if fn is not None else None
        if problem:
            found(problem)
    if found.problems:
        return {"status": OK, "problems": found.problems, "facts": found.facts}
    model = check_model(found, workload)
    dataset = check_dataset(found, workload, batch_size)
    if model is not None:
        check_blocks(found, workload, model)
        ok = check_optimizer(found, workload, model)
        if workload.checkpointing is not None and workload.blocks is None:
            found.call("Workload.checkpointing(model)", workload.checkpointing, model)
        if ok and dataset is not None and not found.problems:
            fresh = check_model(Check(), workload)  # checkpointing may have changed it
            check_step(found, workload, fresh if fresh is not None else model, dataset, batch_size)
    return {"status": OK, "problems": found.problems, "facts": found.facts}
