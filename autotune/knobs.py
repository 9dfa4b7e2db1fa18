"""The registry of knobs: what each one is, its allowed values, default, and where it applies.

How a knob is *applied* lives in :mod:`autotune.trial.apply`; this module only knows values.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

AMP_DTYPES = ("fp32", "bf16", "fp16")
COMPILE_MODES = ("off", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
COMPILE_DYNAMIC = ("auto", "true", "false")
MATMUL_PRECISIONS = ("highest", "high", "medium")
SDPA_BACKENDS = ("auto", "math", "efficient", "flash", "cudnn")
OPTIMIZER_IMPLS = ("default", "foreach", "fused", "for-loop")
JIT_MODES = ("off", "script", "trace")
LENGTH_GROUPING = ("off", "grouped")
PACKING = ("off", "packed", "isolated")
FSDP_MODES = ("off", "blocks", "root")
FSDP_DTYPES = ("fp32", "bf16")


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
    fsdp: bool = True  # torch.distributed.fsdp.fully_shard (FSDP2) importable
    shardable_blocks: int = 0  # Workload.blocks: modules fsdp=blocks shards one by one
    conv2d: bool = False  # the workload's forward runs 2-d convolutions
    attention: bool = False  # ... calls scaled_dot_product_attention
    sdpa_backends: tuple[str, ...] = ()  # explicit SDPA backends torch can run here
    matmul_precisions: tuple[str, ...] = ("highest",)  # those that change fp32 matmuls here
    optimizer: str = ""  # class name of the workload's optimizer
    optimizer_impls: tuple[str, ...] = ()  # optimizer_impl values it can be rebuilt with
    tokens: bool = False  # samples are variable-length token sequences (Workload.tokens)
    token_collate: bool = False  # ... and autotune pads them (no collate_fn of its own)
    packing_undeclared: str = "the workload's samples are not token sequences (Workload.tokens)"
    # why packing would be a mistake ("" when Tokens(causal_lm=True, eos_id, pack_length))
    isolated_undeclared: str = "the workload's samples are not token sequences (Workload.tokens)"
    # why packing: isolated would be ("" when Tokens(causal_lm=True, isolated=...))
    context: int = 0  # the model's positions (Tokens.context, a transformers config); 0: unknown
    pack_length: int = 0  # the workload's Tokens.pack_length (0: none declared)
    # A Trainer or Lightning workload runs its framework's own loop: the knobs that loop
    # cannot set (knob, or "knob=value" -> why; autotune.frameworks.loop.NativeLoop.refused)
    framework_refused: dict[str, str] = field(default_factory=dict)
    # Why the window's energy cannot be read on this machine ("" where it can: NVML on a
    # GPU, RAPL on the CPU; autotune.trial.telemetry.energy_unavailable). A probe that did
    # not say (an older version's table) cannot back trial.objective: energy.
    energy_unavailable: str = "the probe did not say whether energy can be read here"

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Capabilities:
        values = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})


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
        mistake: given the capabilities and a value, why listing that value is a mistake
            of the space or workload (``None`` when it is not): an error before any
            trial, where ``unsupported`` only drops the value with a note.
        means: given the capabilities and a value, the value it stands for (``pack_length``
            0 is the workload's own): a listed value that means another listed one is
            dropped with a note, so that one run is not measured twice.
        applied: how :func:`autotune.apply` applies it, in words (``docs/knobs.md``).
        needs: where it applies and what it needs, in words (``docs/knobs.md``); the
            checks themselves are ``unsupported``, ``requires`` and ``mistake``.
    """

    name: str
    kind: str
    default: Any
    help: str
    choices: tuple[Any, ...] = ()
    minimum: int = 0
    unsupported: Callable[[Capabilities, Any], str | None] = lambda caps, value: None
    requires: Callable[[Mapping[str, Any]], str | None] = lambda values: None
    mistake: Callable[[Capabilities, Any], str | None] = lambda caps, value: None
    means: Callable[[Capabilities, Any], Any] = lambda caps, value: value
    applied: str = ""
    needs: str = ""

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
        # YAML 1.1 reads bare `true`/`false`/`off` as booleans; accept them as those choices.
        if isinstance(value, bool) and show(value) in self.choices:
            return show(value)
        if value is False and "off" in self.choices:
            return "off"
        if value not in self.choices:
            allowed = ", ".join(map(str, self.choices))
            raise ValueError(f"must be one of {allowed} but got {value!r}")
        return value

    @property
    def domain(self) -> str:
        """The allowed values in words, as ``autotune knobs`` lists them."""
        if self.choices:
            return ", ".join(map(str, self.choices))
        return "true/false" if self.kind == "bool" else f"integer >= {self.minimum}"

    @property
    def ordinal(self) -> bool:
        """Whether the values have an order the sampler should exploit (ints do)."""
        return self.kind == "int"

    def blocker(self, options: Mapping[str, Sequence[Any]]) -> str | None:
        """Why no choice among ``options`` (knob -> candidate values, every knob) lets this
        knob take a non-default value; ``None`` when some choice does.

        Only the knobs :attr:`requires` reads are enumerated, so this is exact and cheap.
        """
        any_choice = {k: v[0] for k, v in options.items()}
        deps: list[str] = []
        first: str | None = None
        while True:
            for combo in itertools.product(*(options[d] for d in deps)):
                values = Reads({**any_choice, **dict(zip(deps, combo, strict=True))})
                reason = self.requires(values)
                if reason is None:
                    return None
                first = first or reason
                new = [k for k in values.read if k not in deps]
                if new:  # another branch of the condition: enumerate that knob too
                    deps += new
                    break
            else:
                return first


def show(value: Any) -> str:
    """A knob value as the space file writes it: ``true``/``false`` for booleans."""
    return str(value).lower() if isinstance(value, bool) else str(value)


class Reads(Mapping[str, Any]):
    """A mapping that records which keys were read (to find what a condition depends on)."""

    def __init__(self, values: dict[str, Any]) -> None:
        self._values = values
        self.read: list[str] = []

    def __getitem__(self, key: str) -> Any:
        if key not in self.read:
            self.read.append(key)
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)


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


def _checkpoint_every_unsupported(caps: Capabilities, value: int) -> str | None:
    if caps.workload_blocks and value > caps.workload_blocks:
        return f"the workload exposes only {caps.workload_blocks} blocks"
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


def _fsdp_mistake(caps: Capabilities, value: str) -> str | None:
    if value == "blocks" and caps.shardable_blocks == 0:
        return "the workload exposes no blocks to shard one by one (Workload.blocks); use root"
    return None


def _fsdp_unsupported(caps: Capabilities, value: str) -> str | None:
    if value != "off" and not caps.fsdp:
        return "torch has no FSDP2 (torch.distributed.fsdp.fully_shard) here"
    return None


def _fsdp_dtype_unsupported(caps: Capabilities, value: str) -> str | None:
    if value == "bf16" and not caps.bf16:
        return f"bf16 is not supported on {caps.device_name or caps.device}"
    return None


def _cpu_offload_unsupported(caps: Capabilities, value: bool) -> str | None:
    if value and caps.device != "cuda":
        return "the parameters already live in host memory without CUDA"
    return None


def _threads_unsupported(caps: Capabilities, value: int) -> str | None:
    if value > caps.cpu_count:
        return f"more threads than the {caps.cpu_count} CPUs of this machine"
    return None


def _matmul_unsupported(caps: Capabilities, value: str) -> str | None:
    if value != "highest" and value not in caps.matmul_precisions:
        where = caps.device_name or caps.device
        return f"changes no fp32 matmul on {where} (no TF32/bf16 matmul units used)"
    return None


def _channels_last_unsupported(caps: Capabilities, value: bool) -> str | None:
    if value and not caps.conv2d:
        return "the workload runs no 2-d convolutions"
    return None


def _sdpa_unsupported(caps: Capabilities, value: str) -> str | None:
    if value == "auto":
        return None
    if not caps.attention:
        return "the workload calls no scaled_dot_product_attention"
    if value not in caps.sdpa_backends:
        return f"torch has no {value} attention kernel for {caps.device_name or caps.device}"
    return None


def _grouping_unsupported(caps: Capabilities, value: str) -> str | None:
    if value != "off" and not caps.tokens:
        return "the workload's samples are not token sequences (Workload.tokens)"
    return None


def _pad_multiple_unsupported(caps: Capabilities, value: int) -> str | None:
    if value == 1:
        return None
    if not caps.tokens:
        return "the workload's samples are not token sequences (Workload.tokens)"
    if not caps.token_collate:
        return "the workload pads its batches itself (Workload.collate_fn)"
    return None


def _packing_mistake(caps: Capabilities, value: str) -> str | None:
    if value == "isolated":
        return caps.isolated_undeclared or None
    return caps.packing_undeclared or None if value == "packed" else None


def _packing_unsupported(caps: Capabilities, value: str) -> str | None:
    if value != "off" and caps.tokens and not caps.token_collate:
        return "the workload pads its batches itself (Workload.collate_fn)"
    return None


def _pack_length_mistake(caps: Capabilities, value: int) -> str | None:
    if caps.context and value > caps.context:
        return (
            f"a row longer than the model's context of {caps.context} positions (packed rows "
            "number positions across the row)"
        )
    return None


def _optimizer_impl_unsupported(caps: Capabilities, value: str) -> str | None:
    if value != "default" and value not in caps.optimizer_impls:
        optimizer = caps.optimizer or "the workload's optimizer"
        return f"{optimizer} has no {value} implementation here"
    return None


def _needs(knob: str, ok: Callable[[Any], bool], wanted: str) -> Callable[..., str | None]:
    """A ``requires`` condition on one earlier knob, e.g. ``needs num_workers > 0``."""

    def requires(values: Mapping[str, Any]) -> str | None:
        if ok(values[knob]):
            return None
        return f"needs {knob} {wanted} ({knob} is {show(values[knob])})"

    return requires


def _all(*conditions: Callable[..., str | None]) -> Callable[..., str | None]:
    def requires(values: Mapping[str, Any]) -> str | None:
        return next((r for c in conditions if (r := c(values)) is not None), None)

    return requires


_with_workers = _needs("num_workers", lambda v: v > 0, "> 0")
_with_compile = _needs("compile_mode", lambda v: v != "off", "other than off")
_with_fsdp = _needs("fsdp", lambda v: v != "off", "other than off")
# Where the DDP knobs apply (docs/knobs.md's "applied" column), the same for each.
_DDP_APPLIED = (
    "`DistributedDataParallel(...)` arguments; with a static graph every "
    "micro-batch all-reduces (DDP's `no_sync` fails under one: "
    "pytorch/pytorch#143580), and the hf and lightning exports leave it out "
    "when the config accumulates"
)
_with_ddp = _all(
    _needs("world_size", lambda v: v > 1, "> 1"), _needs("fsdp", lambda v: v == "off", "off")
)


KNOBS: dict[str, Knob] = {
    k.name: k
    for k in (
        Knob(
            "batch_size",
            "int",
            32,
            "samples per forward/backward (micro-batch); larger is faster until memory runs out",
            minimum=1,
            applied="DataLoader `batch_size` (the micro-batch)",
        ),
        Knob(
            "accumulation_steps",
            "int",
            1,
            "micro-batches per optimizer step; lets a small micro-batch reach a large global batch",
            minimum=1,
            applied="micro-batches per optimizer step",
            needs="derived when `global_batch` is fixed",
        ),
        Knob(
            "amp_dtype",
            "choice",
            "fp32",
            "autocast dtype; bf16/fp16 are faster on tensor cores but change the numerics",
            choices=AMP_DTYPES,
            unsupported=_amp_unsupported,
            applied="`torch.autocast`; fp16 adds a `GradScaler`",
            needs="dtypes the device autocasts",
        ),
        Knob(
            "num_workers",
            "int",
            0,
            "DataLoader worker processes; hide data loading behind compute, cost CPU and memory",
            minimum=0,
            unsupported=_workers_unsupported,
            applied="DataLoader `num_workers`",
            needs="at most the CPU count",
        ),
        Knob(
            "pin_memory",
            "bool",
            False,
            "DataLoader returns page-locked batches: faster, async host-to-GPU copies (CUDA)",
            unsupported=_cuda_only,
            applied="DataLoader `pin_memory`",
            needs="CUDA",
        ),
        Knob(
            "persistent_workers",
            "bool",
            False,
            "keep DataLoader workers across epochs (needs num_workers > 0); saves the "
            "re-spawn at each epoch, which a trial (one endless epoch) cannot see",
            requires=_with_workers,
            applied="DataLoader `persistent_workers`",
            needs=(
                "needs `num_workers > 0`; saves the worker re-spawn at each epoch, which a "
                "trial (one endless epoch) cannot see: set it, do not search it"
            ),
        ),
        Knob(
            "prefetch_factor",
            "int",
            2,
            "batches each worker loads ahead (needs num_workers > 0); more smooths stalls, "
            "costs memory",
            minimum=1,
            requires=_with_workers,
            applied="DataLoader `prefetch_factor`",
            needs="needs `num_workers > 0`",
        ),
        Knob(
            "packing",
            "choice",
            "off",
            "concatenate samples into rows of Tokens.pack_length: little padding, the same "
            "samples per step; packed: an EOS after each, attention may cross samples in a "
            "row; isolated: whole samples, positions restart and attention stays within "
            "each sample (causal-LM token workloads; isolated: Tokens(isolated=...))",
            choices=PACKING,
            unsupported=_packing_unsupported,
            mistake=_packing_mistake,
            applied=(
                "packed: samples + EOS concatenated into rows of `pack_length`; only the "
                "last row of a micro-batch padded; isolated: whole samples in rows (first "
                "fit), positions restart and attention stays within each sample"
            ),
            needs=(
                "token workloads with `Tokens(causal_lm=True, eos_id, pack_length)` for "
                "packed, `Tokens(causal_lm=True, isolated=...)` for isolated (else an error)"
            ),
        ),
        Knob(
            "pack_length",
            "int",
            0,
            "tokens in a packed row (needs packing; 0 = the workload's Tokens.pack_length): "
            "longer rows pad less at their ends, and cost more attention with packed",
            minimum=0,
            requires=_needs("packing", lambda v: v != "off", "other than off"),
            mistake=_pack_length_mistake,
            means=lambda caps, value: value or caps.pack_length,
            applied=(
                "tokens in a packed row; 0 is the workload's `Tokens.pack_length`; a value"
                " above the model's context (`Tokens.context`, a transformers config's "
                "`max_position_embeddings`) is an error"
            ),
            needs=(
                "needs `packing` other than off; ignored by `isolated='flat'` (one row per "
                "micro-batch)"
            ),
        ),
        Knob(
            "length_grouping",
            "choice",
            "off",
            "batch samples of similar length (sorted within shuffled mega-batches of 50 "
            "optimizer steps, like HF's group_by_length): less padding, a less random order "
            "(token workloads)",
            choices=LENGTH_GROUPING,
            unsupported=_grouping_unsupported,
            requires=_needs("packing", lambda v: v == "off", "off"),
            applied=(
                "each mega-batch of 50 optimizer steps of the seeded stream sorted by "
                "length (HF's `group_by_length`): batches of similar length, little "
                "padding; every micro-batch size sees the same samples per step"
            ),
            needs="token workloads (`Workload.tokens`); needs `packing: off`",
        ),
        Knob(
            "pad_to_multiple_of",
            "int",
            1,
            "pad each batch's length up to a multiple of this (8/64: tensor-core and "
            "compile-shape friendly, fewer recompiles) at the cost of padded positions",
            minimum=1,
            unsupported=_pad_multiple_unsupported,
            requires=_needs("packing", lambda v: v == "off", "off"),
            applied=(
                "autotune's collate pads the batch length up to a multiple (8/64: tensor "
                "cores, fewer compile shapes)"
            ),
            needs="token workloads without their own `collate_fn`; needs `packing: off`",
        ),
        Knob(
            "non_blocking",
            "bool",
            False,
            "copy batches to the GPU asynchronously (pays off with pin_memory; CUDA)",
            unsupported=_cuda_only,
            applied="`tensor.to(device, non_blocking=True)` for each batch",
            needs="CUDA",
        ),
        Knob(
            "cudnn_benchmark",
            "bool",
            False,
            "let cuDNN time its convolution algorithms; faster for fixed input shapes",
            unsupported=_cuda_only,
            applied="`torch.backends.cudnn.benchmark` (process-wide)",
            needs="CUDA",
        ),
        Knob(
            "matmul_precision",
            "choice",
            "highest",
            "torch.set_float32_matmul_precision: high = TF32 on CUDA, medium may use bf16; "
            "faster fp32 matmuls for fewer mantissa bits",
            choices=MATMUL_PRECISIONS,
            unsupported=_matmul_unsupported,
            applied="`torch.set_float32_matmul_precision` (process-wide); high = TF32 on CUDA",
            needs="values that change an fp32 matmul on this device",
        ),
        Knob(
            "channels_last",
            "bool",
            False,
            "NHWC memory format for the model and 4-d inputs; faster convolutions on tensor "
            "cores and oneDNN (conv workloads only)",
            unsupported=_channels_last_unsupported,
            applied="model and 4-d float inputs in `torch.channels_last`",
            needs="workloads that run 2-d convolutions",
        ),
        Knob(
            "sdpa_backend",
            "choice",
            "auto",
            "scaled_dot_product_attention kernel: auto lets torch choose; math is the "
            "reference; flash/efficient/cudnn are fused kernels (attention workloads only)",
            choices=SDPA_BACKENDS,
            unsupported=_sdpa_unsupported,
            applied="forward and loss under `torch.nn.attention.sdpa_kernel`",
            needs=(
                "workloads that call `scaled_dot_product_attention`; backends torch can run here"
            ),
        ),
        Knob(
            "compile_mode",
            "choice",
            "off",
            "torch.compile mode; faster steps for a one-off compile time",
            choices=COMPILE_MODES,
            unsupported=_compile_unsupported,
            applied="`torch.compile(mode=...)`",
            needs="a C++ compiler on CPU; reduce-overhead needs CUDA",
        ),
        Knob(
            "compile_dynamic",
            "choice",
            "auto",
            "torch.compile dynamic shapes (needs compile_mode): true compiles once for all "
            "shapes, false specialises (faster kernels, recompiles), auto = after a change",
            choices=COMPILE_DYNAMIC,
            requires=_with_compile,
            applied="`torch.compile(dynamic=None/True/False)`",
            needs="needs `compile_mode` other than off",
        ),
        Knob(
            "compile_fullgraph",
            "bool",
            False,
            "torch.compile fullgraph (needs compile_mode): one graph or fail; a graph break "
            "becomes a recorded failure instead of a slow fallback",
            requires=_with_compile,
            applied="`torch.compile(fullgraph=True)`: a graph break is a recorded failure",
            needs="needs `compile_mode` other than off",
        ),
        Knob(
            "gradient_checkpointing",
            "bool",
            False,
            "recompute block activations in backward; less memory for more compute",
            unsupported=_checkpoint_unsupported,
            applied="`torch.utils.checkpoint` around the workload's `blocks`",
            needs="workloads with `blocks`",
        ),
        Knob(
            "world_size",
            "int",
            1,
            "processes per trial (one per GPU; gloo on CPU), data parallel: DDP, or FSDP2 with "
            "fsdp; global samples/s is scored",
            minimum=1,
            unsupported=_world_size_unsupported,
            applied=(
                "processes per trial (`torch.distributed.run`; one per GPU, gloo on the "
                "CPU); each takes every N-th sample of the one stream; global samples/s is"
                " scored, the peak memory judged is the largest of the ranks'"
            ),
            needs="GPUs visible (CUDA) or CPU count",
        ),
        Knob(
            "fsdp",
            "choice",
            "off",
            "FSDP2 (fully_shard) instead of DDP (needs world_size > 1): parameters, "
            "gradients and optimizer state sharded over the processes; blocks shards each "
            "of the workload's blocks then the root (gathers one block at a time), root "
            "only the whole model (gathers it all)",
            choices=FSDP_MODES,
            unsupported=_fsdp_unsupported,
            requires=_needs("world_size", lambda v: v > 1, "> 1"),
            mistake=_fsdp_mistake,
            applied=(
                "FSDP2 `fully_shard` instead of DDP: `blocks` shards each of the "
                "workload's `blocks`, then the root; `root` the whole model as one group; "
                "the optimizer is built after sharding"
            ),
            needs="needs `world_size > 1`; `blocks` needs `Workload.blocks` (else an error)",
        ),
        Knob(
            "fsdp_reshard_after_forward",
            "bool",
            True,
            "free the gathered parameters after forward and gather them again in backward "
            "(needs fsdp): less memory for one more all-gather per step",
            requires=_with_fsdp,
            applied=(
                "`fully_shard(reshard_after_forward=...)`: false keeps gathered weights "
                "until backward (more memory, one all-gather less)"
            ),
            needs="needs `fsdp`",
        ),
        Knob(
            "fsdp_param_dtype",
            "choice",
            "fp32",
            "FSDP2 MixedPrecisionPolicy param_dtype (needs fsdp; not with amp_dtype fp16): "
            "bf16 gathers and computes in bf16 (half the all-gather), the sharded master "
            "weights stay fp32",
            choices=FSDP_DTYPES,
            unsupported=_fsdp_dtype_unsupported,
            requires=_all(
                _with_fsdp, _needs("amp_dtype", lambda v: v != "fp16", "other than fp16")
            ),
            applied=(
                "`MixedPrecisionPolicy(param_dtype=..., reduce_dtype=...)`: bf16 "
                "all-gathers/computes or reduce-scatters in bf16, the sharded weights stay"
                " fp32"
            ),
            needs="need `fsdp`; `fsdp_param_dtype: bf16` not with `amp_dtype: fp16`",
        ),
        Knob(
            "fsdp_reduce_dtype",
            "choice",
            "fp32",
            "FSDP2 MixedPrecisionPolicy reduce_dtype (needs fsdp): bf16 halves the gradient "
            "reduce-scatter at some precision of the summed gradients",
            choices=FSDP_DTYPES,
            unsupported=_fsdp_dtype_unsupported,
            requires=_with_fsdp,
            applied=(
                "`MixedPrecisionPolicy(param_dtype=..., reduce_dtype=...)`: bf16 "
                "all-gathers/computes or reduce-scatters in bf16, the sharded weights stay"
                " fp32"
            ),
            needs="need `fsdp`; `fsdp_param_dtype: bf16` not with `amp_dtype: fp16`",
        ),
        Knob(
            "fsdp_cpu_offload",
            "bool",
            False,
            "FSDP2 CPUOffloadPolicy (needs fsdp; CUDA): sharded parameters, gradients and "
            "optimizer state live in pinned host memory, the optimizer steps on the CPU",
            unsupported=_cpu_offload_unsupported,
            requires=_with_fsdp,
            applied=(
                "`CPUOffloadPolicy()`: shards, gradients and optimizer state in pinned host memory"
            ),
            needs="needs `fsdp`; CUDA",
        ),
        Knob(
            "ddp_bucket_cap_mb",
            "int",
            25,
            "DDP gradient bucket size; bigger buckets mean fewer, larger all-reduces",
            minimum=1,
            requires=_with_ddp,
            applied=_DDP_APPLIED,
            needs="need `world_size > 1` and `fsdp: off`",
        ),
        Knob(
            "ddp_gradient_as_bucket_view",
            "bool",
            False,
            "gradients alias DDP's buckets: saves a copy and the memory of one gradient",
            requires=_with_ddp,
            applied=_DDP_APPLIED,
            needs="need `world_size > 1` and `fsdp: off`",
        ),
        Knob(
            "ddp_static_graph",
            "bool",
            False,
            "promise DDP the graph never changes: enables its static-graph optimisations",
            requires=_with_ddp,
            applied=_DDP_APPLIED,
            needs="need `world_size > 1` and `fsdp: off`",
        ),
        Knob(
            "checkpoint_every",
            "int",
            1,
            "checkpoint every k-th block (needs gradient_checkpointing); larger k recomputes "
            "less and keeps more activations",
            minimum=1,
            unsupported=_checkpoint_every_unsupported,
            requires=_needs("gradient_checkpointing", bool, "true"),
            applied="checkpoint blocks 0, k, 2k, ...",
            needs="needs `gradient_checkpointing`; k at most the block count",
        ),
        Knob(
            "jit",
            "choice",
            "off",
            "TorchScript instead of torch.compile (needs compile_mode off, no "
            "checkpointing, no fsdp): script compiles the code, trace records the first batch",
            choices=JIT_MODES,
            requires=_all(
                _needs("compile_mode", lambda v: v == "off", "off"),
                _needs("gradient_checkpointing", lambda v: not v, "false"),
                _needs("fsdp", lambda v: v == "off", "off"),
            ),
            applied="`torch.jit.script`, or `torch.jit.trace` on the first batch",
            needs="needs `compile_mode: off` and no checkpointing; deprecated in recent torch",
        ),
        Knob(
            "optimizer_impl",
            "choice",
            "default",
            "the optimizer's implementation: foreach batches parameters into few kernels, "
            "fused runs one kernel per step, for-loop is one parameter at a time",
            choices=OPTIMIZER_IMPLS,
            unsupported=_optimizer_impl_unsupported,
            applied=(
                "the workload's optimizer rebuilt with `foreach=`/`fused=` (same class, "
                "groups, hyper-parameters)"
            ),
            needs="what the optimizer class accepts on this device",
        ),
        Knob(
            "zero_grad_set_to_none",
            "bool",
            True,
            "zero_grad frees gradients (true) instead of filling them with zeros; less memory "
            "traffic",
            applied="`optimizer.zero_grad(set_to_none=...)`",
        ),
        Knob(
            "num_threads",
            "int",
            0,
            "torch.set_num_threads for CPU ops, 0 = torch's default; fewer leaves cores to "
            "DataLoader workers",
            minimum=0,
            unsupported=_threads_unsupported,
            applied="`torch.set_num_threads` in the trial process",
            needs="at most the CPU count",
        ),
        Knob(
            "interop_threads",
            "int",
            0,
            "torch.set_num_interop_threads (inter-op pool, set once per process), 0 = default",
            minimum=0,
            unsupported=_threads_unsupported,
            applied="`torch.set_num_interop_threads`, before the workload is built",
            needs="at most the CPU count; once per process",
        ),
    )
}


KNOB_TABLE_COMMAND = "autotune knobs --markdown > docs/knobs.md"


def markdown() -> str:
    """``docs/knobs.md``: a table of every knob of :data:`KNOBS`, generated (never edit the
    file by hand: ``tests/test_knobs.py`` fails when it differs from this)."""
    cell = lambda text: text.replace("|", "\\|")  # noqa: E731
    rows = [
        f"| `{k.name}` | {cell(k.domain)} | {cell(show(k.default))} | {cell(k.help)} "
        f"| {cell(k.applied)} | {cell(k.needs)} |"
        for k in KNOBS.values()
    ]
    return "\n".join(
        [
            "# Knobs",
            "",
            f"<!-- generated from autotune.knobs.KNOBS by `{KNOB_TABLE_COMMAND}`: "
            "do not edit by hand -->",
            "",
            f"Generated from `autotune.knobs.KNOBS` by `{KNOB_TABLE_COMMAND}`; "
            "`tests/test_knobs.py` fails when this file is stale. "
            f"{len(KNOBS)} knobs. `autotune knobs` prints the same list in the terminal.",
            "",
            "Every knob is applied by `autotune.apply`, the code the trials ran; a value that "
            "cannot take effect on the trial device or workload (found by the probe trial, "
            "which asks torch by trying) is dropped with a note instead of being searched. "
            "Knobs that need another knob are searched only where their condition holds and "
            "keep their default elsewhere.",
            "",
            "| knob | values | default | what it trades | applied as | only where / needs |",
            "| --- | --- | --- | --- | --- | --- |",
            *rows,
            "",
        ]
    )
