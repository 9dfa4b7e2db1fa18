"""A framework's own training loop as a trial runs it.

A workload that came from a ``transformers.Trainer`` or a Lightning pair carries a
:class:`NativeLoop` (``Workload.native``): the trial process (``autotune.trial.native``)
hands it a config and :class:`Hooks`, and the loop trains that many optimizer steps in
the framework's own code (``Trainer.train()``, ``Trainer.fit()``), the config set through
the same mapping the export prints (:mod:`autotune.frameworks.mapping`). The hooks see
what a user's run does: each micro-batch the framework hands the model, its loss as the
framework accumulates it, and the end of each optimizer step. The trial times the steps
between those ends; the loop itself never reads a clock.

Knobs are set where a user would set them: the framework's arguments where it has a
field, the model (``channels_last``), the collator (``pad_to_multiple_of``), or the
process and a context around the run (:data:`PROCESS_KNOBS`, which the trial sets as a
script sets them at its top or around its ``train()`` call). A knob none of these can express is in
:attr:`NativeLoop.refused`, and a space that searches it is refused before any trial.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

# Set by the trial around the loop's run, as a training script sets them at its top or
# around its train() call (an sdpa_kernel context): every framework loop takes them.
PROCESS_KNOBS = (
    "num_threads",
    "interop_threads",
    "matmul_precision",
    "cudnn_benchmark",
    "sdpa_backend",
)
# A framework trial is one process: launching the framework's own distributed run
# (accelerate, torchrun, a Lightning strategy over several processes) is the user's.
DISTRIBUTED_KNOBS = (
    "world_size",
    "ddp_bucket_cap_mb",
    "ddp_gradient_as_bucket_view",
    "ddp_static_graph",
    "fsdp",
    "fsdp_reshard_after_forward",
    "fsdp_param_dtype",
    "fsdp_reduce_dtype",
    "fsdp_cpu_offload",
)


class Hooks(Protocol):
    """What a framework loop reports to the trial that times it."""

    def begin(self) -> None:
        """The framework has set itself up (accelerator, optimizer, loader): its first
        step starts now."""

    def batch(self, batch: Any) -> None:
        """A micro-batch the framework is about to hand the model."""

    def loss(self, value: Any) -> None:
        """A micro-batch's loss as the framework adds it to the step's (a detached
        tensor): a step's values sum to its loss."""

    def step_end(self) -> None:
        """An optimizer step (clipping, optimizer, scheduler, zero_grad) has finished."""

    @property
    def done(self) -> bool:
        """Whether the trial has its window: the loop stops after this step (its
        ``max_steps`` is the most the trial can take)."""

    def epoch(self, order: list[int], multiple: int) -> None:
        """One epoch's sample indices as the framework's sampler orders them, and the
        multiple its collator pads a batch's width to (before the run: the trial rates
        the window as the epoch's mean step, :mod:`autotune.trial.epoch`)."""


@dataclass(frozen=True)
class NativeLoop:
    """A framework's own loop over a user's objects.

    Attributes:
        framework: ``"transformers"`` or ``"lightning"`` (:data:`autotune.workload.FRAMEWORKS`).
        train: ``train(config, device, steps, hooks)`` trains ``steps`` optimizer steps.
        refused: knob -> why this loop cannot set a value other than the knob's default;
            ``"knob=value"`` -> why it cannot set that one value.
    """

    framework: str
    train: Callable[[Any, Any, int, Hooks], None]
    refused: Mapping[str, str] = field(default_factory=dict)

    @property
    def entry(self) -> str:
        """What the user calls to train: ``Trainer.train()`` or ``Trainer.fit()``."""
        return ENTRIES[self.framework]


# What a user calls to train, and the packages whose frames are the framework's.
ENTRIES = {"transformers": "Trainer.train()", "lightning": "Trainer.fit()"}
PACKAGES = {"transformers": ("transformers",), "lightning": ("lightning", "pytorch_lightning")}


def framework_frame(exc: BaseException, framework: str) -> str | None:
    """The innermost frame of ``framework``'s code in ``exc``'s traceback, as
    ``lightning/pytorch/core/module.py:514 in log``; ``None`` when none is."""
    import traceback

    found = None
    for frame in traceback.extract_tb(exc.__traceback__):
        parts = frame.filename.replace("\\", "/").split("/")
        for package in PACKAGES[framework]:
            if package in parts[:-1]:
                where = "/".join(parts[len(parts) - 1 - parts[::-1].index(package) :])
                found = f"{where}:{frame.lineno} in {frame.name}"
    return found


def distributed_refusals(trainer: str, launcher: str) -> dict[str, str]:
    """The distributed knobs, refused for a one-process framework trial."""
    why = (
        f"a {trainer} trial runs one process in the framework's own loop; launch several "
        f"with {launcher} yourself, or search world_size and fsdp with an autotune.Workload"
    )
    return dict.fromkeys(DISTRIBUTED_KNOBS, why)


def with_pad_multiple(collate: Any, multiple: int) -> Any:
    """``collate`` padding to ``multiple`` (1: none), as ``pad_to_multiple_of=`` on the
    user's collator would: a copy with the attribute set, the user's left as it was;
    ``collate`` itself when it needs no change or has no such attribute (the knob is then
    refused before any trial)."""
    wanted = multiple if multiple > 1 else None
    if not hasattr(collate, "pad_to_multiple_of") or collate.pad_to_multiple_of == wanted:
        return collate
    changed = copy.copy(collate)
    changed.pad_to_multiple_of = wanted
    return changed
