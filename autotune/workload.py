"""The workload contract: what a user hands autotune, and how a reference to it is loaded.

A workload is a few factories. autotune calls them in the trial subprocess only; the
driver process never imports the user's model.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import WorkloadError


def _default_optimizer(params: Iterable[Any]) -> Any:
    import torch

    return torch.optim.AdamW(params, lr=1e-3)


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
        collate_fn: passed to the DataLoader.
        tokens_per_sample: for language models, tokens in one sample; enables tokens/s.
        name: shown in reports.
    """

    model: Callable[[], Any]
    dataset: Callable[[], Any]
    loss: Callable[[Any, Any], Any]
    optimizer: Callable[[Iterable[Any]], Any] = field(default=_default_optimizer)
    blocks: Callable[[Any], Sequence[Any]] | None = None
    collate_fn: Callable[[list[Any]], Any] | None = None
    tokens_per_sample: int | None = None
    name: str = "workload"


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
    ref: str, args: dict[str, Any] | None = None, base_dir: Path | None = None
) -> Workload:
    """Load a workload from a reference and call its factory.

    Args:
        ref: ``"package.module:function"`` or ``"path/to/file.py:function"``; a relative
            file path is resolved against ``base_dir`` (the space file's folder).
        args: keyword arguments for the factory.
        base_dir: folder for relative file paths.

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
    try:
        workload = factory(**(args or {}))
    except Exception as e:
        raise WorkloadError(f"workload {ref!r} raised {type(e).__name__}: {e}") from e
    if not isinstance(workload, Workload):
        raise WorkloadError(
            f"workload {ref!r} must return autotune.Workload but returned {type(workload).__name__}"
        )
    return workload
