"""The registry of knobs: what each one is, its allowed values, default, and where it applies.

How a knob is *applied* lives in :mod:`autotune.training`; this module only knows values.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

AMP_DTYPES = ("fp32", "bf16", "fp16")
COMPILE_MODES = ("off", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


@dataclass(frozen=True)
class Capabilities:
    """What the trial machine and the workload can do; measured by the probe subprocess."""

    device: str  # "cpu" or "cuda"
    device_name: str = ""
    bf16: bool = True
    fp16: bool = True
    compile: bool = True
    compile_reason: str = ""
    cpu_count: int = 1
    workload_blocks: int = 0  # how many checkpointable blocks the workload exposes
    gpu_count: int = 0  # CUDA devices visible to a trial
    distributed: bool = True  # torch.distributed with a backend for this device

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Capabilities:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


@dataclass(frozen=True)
class Knob:
    """One tunable setting.

    Attributes:
        name: key in the space file and in :class:`~autotune.config.Config`.
        kind: ``"int"``, ``"bool"`` or ``"choice"``.
        default: the value PyTorch (or a plain training loop) uses when nobody tunes it.
        help: what the knob trades, shown by ``autotune knobs``.
        choices: the allowed values of a ``"choice"`` knob.
        minimum: the smallest allowed value of an ``"int"`` knob.
        unsupported: given the capabilities and a value, why that value cannot run here
            (``None`` when it can). Values that cannot run are dropped with a note.
        requires: given all knob values of a config, why this knob cannot take a
            non-default value there (``None`` when it can), naming the other knob, e.g.
            ``"needs num_workers > 0 (num_workers is 0)"``. Such a knob is *inactive*: it
            keeps its default and is not sampled, and a config setting it is rejected.
            It may only look at knobs defined before it in :data:`KNOBS`.
    """

    name: str
    kind: str
    default: Any
    help: str
    choices: tuple[Any, ...] = ()
    minimum: int = 0
    unsupported: Callable[[Capabilities, Any], str | None] = lambda caps, value: None
    requires: Callable[[Mapping[str, Any]], str | None] = lambda values: None

    def normalize(self, value: Any) -> Any:
        """Return ``value`` in canonical form, or raise ``ValueError`` saying what is allowed."""
        if self.kind == "bool":
            if isinstance(value, bool):
                return value
            raise ValueError(f"must be true or false but got {value!r}")
        if self.kind == "int":
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"must be an integer >= {self.minimum} but got {value!r}")
            if value < self.minimum:
                raise ValueError(f"must be an integer >= {self.minimum} but got {value}")
            return value
        # YAML 1.1 reads a bare `off` as False; accept it as the "off" choice.
        if value is False and "off" in self.choices:
            return "off"
        if value not in self.choices:
            allowed = ", ".join(map(str, self.choices))
            raise ValueError(f"must be one of {allowed} but got {value!r}")
        return value

    @property
    def ordinal(self) -> bool:
        """Whether the values have an order the sampler should exploit (ints do)."""
        return self.kind == "int"


def _amp_unsupported(caps: Capabilities, value: str) -> str | None:
    if value == "bf16" and not caps.bf16:
        return f"bf16 autocast is not supported on {caps.device_name or caps.device}"
    if value == "fp16" and not caps.fp16:
        return f"fp16 autocast is not supported on {caps.device_name or caps.device}"
    return None


def _cuda_only(caps: Capabilities, value: Any) -> str | None:
    if caps.device != "cuda" and value:
        return "has no effect without CUDA"
    return None


def _compile_unsupported(caps: Capabilities, value: str) -> str | None:
    if value == "off":
        return None
    if not caps.compile:
        return f"torch.compile is unavailable here ({caps.compile_reason})"
    if value == "reduce-overhead" and caps.device != "cuda":
        return "reduce-overhead means CUDA graphs, which need CUDA"
    return None


def _checkpoint_unsupported(caps: Capabilities, value: bool) -> str | None:
    if value and caps.workload_blocks == 0:
        return "the workload exposes no blocks to checkpoint (Workload.blocks)"
    return None


def _workers_unsupported(caps: Capabilities, value: int) -> str | None:
    if value > caps.cpu_count:
        return f"more DataLoader workers than the {caps.cpu_count} CPUs of this machine"
    return None


def _world_size_unsupported(caps: Capabilities, value: int) -> str | None:
    if value == 1:
        return None
    if not caps.distributed:
        return "torch.distributed is not available in this torch build"
    if caps.device == "cuda" and value > caps.gpu_count:
        return f"needs {value} GPUs but {caps.gpu_count} are visible"
    if caps.device != "cuda" and value > caps.cpu_count:
        return f"more gloo processes than the {caps.cpu_count} CPUs of this machine"
    return None


def _needs_ddp(values: Mapping[str, Any]) -> str | None:
    if values.get("world_size", 1) > 1:
        return None
    return f"needs world_size > 1 (world_size is {values.get('world_size', 1)})"


KNOBS: dict[str, Knob] = {
    k.name: k
    for k in (
        Knob(
            "batch_size",
            "int",
            32,
            "samples per forward/backward (micro-batch); larger is faster until memory runs out",
            minimum=1,
        ),
        Knob(
            "accumulation_steps",
            "int",
            1,
            "micro-batches per optimizer step; lets a small micro-batch reach a large global batch",
            minimum=1,
        ),
        Knob(
            "amp_dtype",
            "choice",
            "fp32",
            "autocast dtype; bf16/fp16 are faster on tensor cores but change the numerics",
            choices=AMP_DTYPES,
            unsupported=_amp_unsupported,
        ),
        Knob(
            "num_workers",
            "int",
            0,
            "DataLoader worker processes; hide data loading behind compute, cost CPU and memory",
            minimum=0,
            unsupported=_workers_unsupported,
        ),
        Knob(
            "cudnn_benchmark",
            "bool",
            False,
            "let cuDNN time its convolution algorithms; faster for fixed input shapes",
            unsupported=_cuda_only,
        ),
        Knob(
            "compile_mode",
            "choice",
            "off",
            "torch.compile mode; faster steps for a one-off compile time",
            choices=COMPILE_MODES,
            unsupported=_compile_unsupported,
        ),
        Knob(
            "gradient_checkpointing",
            "bool",
            False,
            "recompute block activations in backward; less memory for more compute",
            unsupported=_checkpoint_unsupported,
        ),
        Knob(
            "world_size",
            "int",
            1,
            "DDP processes per trial (one per GPU; gloo on CPU); global samples/s is scored",
            minimum=1,
            unsupported=_world_size_unsupported,
        ),
        Knob(
            "ddp_bucket_cap_mb",
            "int",
            25,
            "DDP gradient bucket size; bigger buckets mean fewer, larger all-reduces",
            minimum=1,
            requires=_needs_ddp,
        ),
        Knob(
            "ddp_gradient_as_bucket_view",
            "bool",
            False,
            "gradients alias DDP's buckets: saves a copy and the memory of one gradient",
            requires=_needs_ddp,
        ),
        Knob(
            "ddp_static_graph",
            "bool",
            False,
            "promise DDP the graph never changes: enables its static-graph optimisations",
            requires=_needs_ddp,
        ),
    )
}


def get_knob(name: str) -> Knob:
    """Return the knob called ``name`` or raise ``KeyError``."""
    return KNOBS[name]
