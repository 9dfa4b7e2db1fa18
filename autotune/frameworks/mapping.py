"""Map a config onto the arguments of common trainers: Hugging Face, Lightning, a shell.

Every mapping reads a plain ``Config.to_dict()`` mapping, so knobs added later map as
soon as a rule here names them (``pin_memory``, ``matmul_precision``...), and a knob that
no rule names is never dropped: it lands in :attr:`Mapped.no_equivalent` with a hint on
how to set it in plain PyTorch. Each mapping returns what it could express and what it
could not, and the exporters print both.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..knobs import KNOBS, show

HF = "transformers.TrainingArguments"
LIGHTNING = "lightning.pytorch.Trainer / torch.utils.data.DataLoader"

# How to set a knob in a plain PyTorch script, for the "no equivalent" lists. {v} is the value.
PLAIN_PYTORCH = {
    "batch_size": "DataLoader(batch_size={v})",
    "accumulation_steps": "step the optimizer every {v} micro-batches",
    "amp_dtype": "torch.autocast(device_type, dtype=...) around forward and loss",
    "num_workers": "DataLoader(num_workers={v})",
    "cudnn_benchmark": "torch.backends.cudnn.benchmark = {v}",
    "compile_mode": "model = torch.compile(model, mode=...) before training",
    "gradient_checkpointing": "torch.utils.checkpoint.checkpoint around each block "
    "(HF models: model.gradient_checkpointing_enable())",
    "pin_memory": "DataLoader(pin_memory={v})",
    "persistent_workers": "DataLoader(persistent_workers={v})",
    "prefetch_factor": "DataLoader(prefetch_factor={v})",
    "non_blocking": "batch.to(device, non_blocking={v})",
    "matmul_precision": "torch.set_float32_matmul_precision('{v}')",
    "channels_last": "model.to(memory_format=torch.channels_last) and the same for inputs",
    "sdpa_backend": "with torch.nn.attention.sdpa_kernel(...) around the step",
    "optimizer_impl": "the optimizer's foreach= / fused= constructor argument",
    "zero_grad_set_to_none": "optimizer.zero_grad(set_to_none={v})",
    "jit": "torch.jit.script(model) / torch.jit.trace(model, example)",
    "compile_dynamic": "torch.compile(model, dynamic=...)",
    "compile_fullgraph": "torch.compile(model, fullgraph={v})",
    "num_threads": "torch.set_num_threads({v}) (0: leave the default)",
    "interop_threads": "torch.set_num_interop_threads({v}) (0: leave the default)",
    "checkpoint_every": "checkpoint_every={v} in your own activation-checkpointing code",
    "length_grouping": "sort each mega-batch of your sample order by length "
    "(transformers: LengthGroupedSampler)",
    "pad_to_multiple_of": "DataCollatorWithPadding(tokenizer, pad_to_multiple_of={v}) "
    "or the same in your collate_fn",
    "packing": "packed: samples with an EOS concatenated into fixed-length rows (TRL: "
    "SFTConfig(packing=True)); isolated: samples kept apart, transformers' "
    "DataCollatorWithFlattening (TRL: SFTConfig(padding_free=True)), or position_ids "
    "restarting per sample with autotune.sample_mask",
    "pack_length": "rows of {v} tokens in your packing collate (TRL: SFTConfig(max_length={v}))",
    "world_size": "launch {v} processes: torchrun --nproc-per-node={v} train.py",
    "ddp_bucket_cap_mb": "DistributedDataParallel(model, bucket_cap_mb={v})",
    "ddp_gradient_as_bucket_view": "DistributedDataParallel(model, gradient_as_bucket_view={v})",
    "ddp_static_graph": "DistributedDataParallel(model, static_graph={v})",
    "fsdp": "fully_shard(...) as `autotune export --format torch` writes it",
    "fsdp_reshard_after_forward": "fully_shard(module, reshard_after_forward={v})",
    "fsdp_param_dtype": "fully_shard(module, mp_policy=MixedPrecisionPolicy(param_dtype=...))",
    "fsdp_reduce_dtype": "fully_shard(module, mp_policy=MixedPrecisionPolicy(reduce_dtype=...))",
    "fsdp_cpu_offload": "fully_shard(module, offload_policy=CPUOffloadPolicy())",
}
BLOCK_PLACEHOLDER = "YourBlock"  # where the study did not record the block classes


class Code(str):
    """A Python expression that an exported snippet writes as code, not as a string."""

    def __repr__(self) -> str:
        return str(self)


@dataclass(frozen=True)
class Mapped:
    """A config expressed for one target.

    Attributes:
        target: what the kwargs are for, e.g. ``transformers.TrainingArguments``.
        kwargs: section name -> keyword arguments (HF: one section; Lightning: ``Trainer``
            and ``DataLoader``).
        no_equivalent: knob -> why it has no equivalent there and how to set it yourself.
        notes: caveats about knobs that were mapped (an approximate equivalent).
    """

    target: str
    kwargs: dict[str, dict[str, Any]]
    no_equivalent: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


class _Rules:
    """Tracks which knobs a mapping has handled; the rest become "no equivalent"."""

    def __init__(self, target: str, values: Mapping[str, Any]) -> None:
        self.target = target
        self.values = dict(values)
        self.seen: set[str] = set()
        self.no_equivalent: dict[str, str] = {}
        self.notes: list[str] = []

    def __contains__(self, name: str) -> bool:
        return name in self.values

    def take(self, name: str, default: Any = None) -> Any:
        self.seen.add(name)
        return self.values.get(name, default)

    def cannot(self, name: str, why: str = "", how: str | None = None) -> None:
        """Record ``name`` as not expressible: ``why`` names where, ``how`` overrides the hint.
        A knob at its default needs nothing set, so it is not listed: the list holds only
        what the user must set by hand."""
        self.seen.add(name)
        knob, value = KNOBS.get(name), self.values.get(name)
        if knob is not None and value == knob.default:
            return
        self.no_equivalent[name] = _explain(name, value, why or self.target, how)

    def finish(self, kwargs: dict[str, dict[str, Any]]) -> Mapped:
        for name in self.values:
            if name not in self.seen:
                self.cannot(name)
        return Mapped(self.target, kwargs, self.no_equivalent, self.notes)


def _explain(name: str, value: Any, why: str, how: str | None = None) -> str:
    if how is None:
        how = PLAIN_PYTORCH.get(name, "set it in your training code, or use autotune.apply")
    return f"{value!r}: no equivalent in {why}; {how.format(v=value)}"


def _compile(rules: _Rules) -> tuple[bool, str | None]:
    mode = rules.take("compile_mode", "off")
    return mode != "off", (None if mode in ("off", "default") else mode)


def hf_training_arguments(
    values: Mapping[str, Any], device: str | None = None, block_types: Sequence[str] = ()
) -> Mapped:
    """``transformers.TrainingArguments`` keyword arguments for a config.

    Field names are those documented for ``TrainingArguments`` (transformers
    ``src/transformers/training_args.py``, 4.36 and later): ``per_device_train_batch_size``,
    ``gradient_accumulation_steps``, ``bf16``, ``fp16``, ``tf32``,
    ``dataloader_num_workers``, ``dataloader_pin_memory``,
    ``dataloader_persistent_workers``, ``dataloader_prefetch_factor``, ``torch_compile``,
    ``torch_compile_mode``, ``gradient_checkpointing``, ``optim``, ``use_cpu``.

    Args:
        values: a ``Config.to_dict()`` (or any mapping of knob name to value).
        device: where the config was measured (``cpu``/``cuda``, from its environment);
            ``cpu`` adds ``use_cpu=True``.
        block_types: class names of the workload's blocks (the study's environment), for
            ``fsdp=blocks``: what ``transformer_layer_cls_to_wrap`` names.
    """
    r = _Rules(HF, values)
    kw: dict[str, Any] = {
        "per_device_train_batch_size": r.take("batch_size", KNOBS["batch_size"].default),
        "gradient_accumulation_steps": r.take("accumulation_steps", 1),
    }
    if device == "cpu":
        # Otherwise the Trainer takes a GPU where it finds one, and refuses bf16 without.
        kw["use_cpu"] = True
        r.notes.append("measured on the CPU: use_cpu=True keeps the Trainer on the CPU")
    amp = r.take("amp_dtype", "fp32")
    kw["bf16"], kw["fp16"] = amp == "bf16", amp == "fp16"
    _hf_loader(r, kw)
    _hf_compute(r, kw, device)
    _hf_fsdp(r, kw, block_types)
    _hf_processes(r, kw)
    return r.finish({"TrainingArguments": kw})


def _hf_loader(r: _Rules, kw: dict[str, Any]) -> None:
    """The DataLoader's knobs and length grouping as ``TrainingArguments`` fields."""
    workers = r.take("num_workers", 0)
    kw["dataloader_num_workers"] = workers
    # TrainingArguments pins memory by default; autotune measured without unless told.
    kw["dataloader_pin_memory"] = bool(r.take("pin_memory", False))
    if "persistent_workers" in r:
        kw["dataloader_persistent_workers"] = bool(r.take("persistent_workers"))
    if "prefetch_factor" in r:
        if workers:
            kw["dataloader_prefetch_factor"] = r.take("prefetch_factor")
        else:
            r.cannot("prefetch_factor", f"{HF} without DataLoader workers")
    if r.take("length_grouping", "off") == "grouped":
        kw["train_sampling_strategy"] = "group_by_length"
        r.notes.append(
            "train_sampling_strategy='group_by_length' is transformers 5 (4.x: "
            "group_by_length=True); it sorts mega-batches of 50 micro-batches by length, "
            "autotune sorted 50 optimizer steps (the same idea)"
        )


def _hf_compute(r: _Rules, kw: dict[str, Any], device: str | None) -> None:
    """Compile, checkpointing, matmul precision and the optimizer's implementation."""
    kw["torch_compile"], mode = _compile(r)
    if mode:
        kw["torch_compile_mode"] = mode
    kw["gradient_checkpointing"] = bool(r.take("gradient_checkpointing", False))
    if kw["gradient_checkpointing"]:
        r.notes.append(
            "gradient_checkpointing: HF checkpoints the model's own layers "
            "(gradient_checkpointing_enable), which may not be the blocks autotune measured; "
            "transformers 5.x renames it activation_checkpointing: the old name works in "
            "TrainingArguments(...), not set on built arguments (autotune.hf.apply sets the "
            "new one)"
        )
    if "matmul_precision" in r:
        precision = r.values["matmul_precision"]
        if device == "cpu":  # TrainingArguments refuses tf32 without an Ampere GPU
            r.cannot("matmul_precision", f"{HF} on the CPU (tf32 needs an Ampere or newer GPU)")
        elif precision in ("high", "highest"):
            kw["tf32"] = r.take("matmul_precision") == "high"
        else:
            r.cannot("matmul_precision", f"{HF} (tf32 is on/off only)")
    if "optimizer_impl" in r and r.values["optimizer_impl"] == "fused":
        r.take("optimizer_impl")
        kw["optim"] = "adamw_torch_fused"
        r.notes.append("optimizer_impl fused -> optim='adamw_torch_fused' assumes AdamW")
    elif "optimizer_impl" in r and r.values["optimizer_impl"] != "default":
        r.cannot("optimizer_impl", f"{HF} (optim picks optimizer and implementation together)")


def _hf_processes(r: _Rules, kw: dict[str, Any]) -> None:
    """DDP's fields, and what the batch means with several processes or one."""
    world = r.values.get("world_size", 1)
    if world > 1 and r.values.get("fsdp", "off") == "off":
        _static_graph_with_accumulation(r, HF)
        for name in ("ddp_bucket_cap_mb", "ddp_static_graph"):  # TrainingArguments fields
            if name in r and name not in r.no_equivalent:
                kw[name] = r.take(name)
    if kw["gradient_accumulation_steps"] * world > 1:
        r.notes.append(
            "token workloads: the Trainer weighs micro-batches and processes by their tokens "
            "itself, as autotune measured (num_items_in_batch, for a model or "
            "compute_loss_func that takes it; average_tokens_across_devices=True, the default)"
        )
    if world > 1:
        r.cannot("world_size", f"{HF} (the launcher sets it)")
        r.notes.append(
            f"per_device_train_batch_size is per process: launched with {world} processes "
            "(torchrun / accelerate launch), the global batch is the one measured"
        )
    else:
        r.notes.append(
            "per_device_train_batch_size is per GPU: with N processes the global batch is N "
            "times larger than the one measured"
        )


def _hf_fsdp(r: _Rules, kw: dict[str, Any], block_types: Sequence[str]) -> None:
    """FSDP2 through ``TrainingArguments(fsdp=True, fsdp_config={...})`` (transformers 5)."""
    if r.values.get("fsdp", "off") == "off":
        return  # the FSDP options are at their defaults: nothing to set, not listed
    mode = r.take("fsdp")
    config: dict[str, Any] = {
        "version": 2,
        "reshard_after_forward": bool(r.take("fsdp_reshard_after_forward", True)),
        "cpu_offload": bool(r.take("fsdp_cpu_offload", False)),
    }
    if mode == "blocks":
        config["auto_wrap_policy"] = "TRANSFORMER_BASED_WRAP"
        config["transformer_layer_cls_to_wrap"] = list(block_types) or [BLOCK_PLACEHOLDER]
        if not block_types:
            r.notes.append(
                f"fsdp=blocks: replace {BLOCK_PLACEHOLDER} by the class of your model's "
                "blocks (the modules autotune sharded one by one)"
            )
    else:
        config["auto_wrap_policy"] = "NO_WRAP"
    if kw.get("gradient_checkpointing"):  # with FSDP, transformers refuses both
        kw["gradient_checkpointing"] = False
        config["activation_checkpointing"] = True
        r.notes.append(
            "gradient_checkpointing -> fsdp_config activation_checkpointing (transformers "
            "rejects gradient_checkpointing together with FSDP)"
        )
    kw["fsdp"] = True
    kw["fsdp_config"] = config
    if kw.get("use_cpu"):
        r.notes.append(
            "fsdp on the CPU: accelerate (1.16) shards only on GPUs; a CPU Trainer with "
            "fsdp=True trains DDP instead (the FSDP2 config is accepted, not applied)"
        )
    r.notes.append(
        "fsdp: transformers 5 (FSDP2 through accelerate); 4.x: fsdp='full_shard auto_wrap' "
        "and fsdp_config={'fsdp_version': 2, ...}"
    )
    for name in ("fsdp_param_dtype", "fsdp_reduce_dtype"):
        if name in r and r.values[name] != KNOBS[name].default:
            r.cannot(
                name,
                f"{HF} (bf16=True gives bf16 autocast, not FSDP's own dtypes)",
                "accelerate's FullyShardedDataParallelPlugin(mixed_precision_policy="
                "MixedPrecisionPolicy(param_dtype=..., reduce_dtype=...))",
            )


FSDP_OPTIONS = (
    "fsdp_reshard_after_forward",
    "fsdp_param_dtype",
    "fsdp_reduce_dtype",
    "fsdp_cpu_offload",
)


def lightning_kwargs(values: Mapping[str, Any], block_types: Sequence[str] = ()) -> Mapped:
    """Lightning ``Trainer`` and ``DataLoader`` keyword arguments for a config.

    Trainer argument names are those of ``lightning.pytorch.Trainer`` 2.x (``precision``
    ``"32-true"`` / ``"bf16-mixed"`` / ``"16-mixed"``, ``accumulate_grad_batches``,
    ``benchmark``); DataLoader names are ``torch.utils.data.DataLoader``'s.
    """
    r = _Rules(LIGHTNING, values)
    precision = {"fp32": "32-true", "bf16": "bf16-mixed", "fp16": "16-mixed"}
    trainer = {
        "precision": precision[r.take("amp_dtype", "fp32")],
        "accumulate_grad_batches": r.take("accumulation_steps", 1),
        "benchmark": bool(r.take("cudnn_benchmark", False)),
    }
    workers = r.take("num_workers", 0)
    loader: dict[str, Any] = {
        "batch_size": r.take("batch_size", KNOBS["batch_size"].default),
        "num_workers": workers,
        "pin_memory": bool(r.take("pin_memory", False)),
    }
    if "persistent_workers" in r:
        loader["persistent_workers"] = bool(r.take("persistent_workers")) and workers > 0
    if "prefetch_factor" in r:
        if workers:
            loader["prefetch_factor"] = r.take("prefetch_factor")
        else:
            r.cannot("prefetch_factor", "a DataLoader without workers")
    mode = r.values.get("compile_mode", "off")
    if mode != "off":
        arg = "" if mode == "default" else f", mode={mode!r}"
        how = f"model = torch.compile(model{arg}) before trainer.fit()"
        r.cannot("compile_mode", "Trainer arguments", how)
    sections = {"Trainer": trainer, "DataLoader": loader}
    if r.values.get("world_size", 1) > 1:
        trainer["devices"] = r.take("world_size")
        strategy = _lightning_strategy(r, block_types)
        trainer["strategy"] = Code(f"{strategy[0]}(**strategy_kwargs)")
        sections[strategy[0]] = strategy[1]
    return r.finish(sections)


DDP_OPTIONS = ("ddp_bucket_cap_mb", "ddp_gradient_as_bucket_view", "ddp_static_graph")


def _static_graph_with_accumulation(r: _Rules, trainer: str) -> None:
    """A trainer accumulates gradients under DDP's ``no_sync``, which fails under a static
    graph in torch's reducer (pytorch/pytorch#143580; accelerate#3679): autotune's own
    loop then all-reduces every micro-batch, a trainer cannot be told to."""
    if r.values.get("ddp_static_graph") and r.values.get("accumulation_steps", 1) > 1:
        r.cannot(
            "ddp_static_graph",
            f"{trainer} with gradient accumulation",
            "its no_sync fails under a static graph in torch's reducer (pytorch/pytorch"
            "#143580); autotune measured it all-reducing every micro-batch: leave "
            "static_graph off, or write the loop yourself (autotune.apply)",
        )


def _lightning_strategy(r: _Rules, block_types: Sequence[str]) -> tuple[str, dict[str, Any]]:
    """``DDPStrategy`` kwargs (passed on to DistributedDataParallel), or ``FSDPStrategy``'s."""
    if r.values.get("fsdp", "off") == "off":
        _static_graph_with_accumulation(r, "Lightning's Trainer")
        ddp = {
            name.removeprefix("ddp_"): r.take(name)
            for name in DDP_OPTIONS
            if name in r and name not in r.no_equivalent
        }
        return "DDPStrategy", ddp
    mode = r.take("fsdp")
    reshard = r.take("fsdp_reshard_after_forward", True)
    kwargs: dict[str, Any] = {"sharding_strategy": "FULL_SHARD" if reshard else "SHARD_GRAD_OP"}
    if mode == "blocks":
        kwargs["auto_wrap_policy"] = Code("{" + ", ".join(block_types or [BLOCK_PLACEHOLDER]) + "}")
        if not block_types:
            r.notes.append(f"auto_wrap_policy: replace {BLOCK_PLACEHOLDER} by your block class")
    param, reduce = r.take("fsdp_param_dtype", "fp32"), r.take("fsdp_reduce_dtype", "fp32")
    if "bf16" in (param, reduce):
        dtype = {"fp32": "torch.float32", "bf16": "torch.bfloat16"}
        kwargs["mixed_precision"] = Code(
            f"MixedPrecision(param_dtype={dtype[param]}, reduce_dtype={dtype[reduce]})"
        )
    if r.take("fsdp_cpu_offload", False):
        kwargs["cpu_offload"] = True
    r.notes.append(
        "FSDPStrategy runs FSDP1 (FullyShardedDataParallel; MixedPrecision from "
        "torch.distributed.fsdp); autotune measured FSDP2 (fully_shard): the same sharding "
        "by another implementation. For FSDP2 itself: ModelParallelStrategy and fully_shard "
        "in configure_model, as `autotune export --format torch` writes it"
    )
    return "FSDPStrategy", kwargs


def shell_fragment(
    values: Mapping[str, Any], device: str | None = None, block_types: Sequence[str] = ()
) -> tuple[list[str], Mapped]:
    """Environment lines (every knob as ``AUTOTUNE_<KNOB>``, plus variables torch reads)
    and the Hugging Face mapping for a ``HfArgumentParser`` command line (``device`` as
    for :func:`hf_training_arguments`)."""
    lines = [f"export AUTOTUNE_{k.upper()}={shlex.quote(show(v))}" for k, v in values.items()]
    threads = values.get("num_threads")
    if threads:  # 0 means "leave torch's default"
        lines.append(f"export OMP_NUM_THREADS={int(threads)}  # num_threads")
    return lines, hf_training_arguments(values, device, block_types)


FSDP_CONFIG_FILE = "fsdp_config.json"


def hf_cli_args(kwargs: Mapping[str, Any]) -> list[str]:
    """``--name value`` flags as ``HfArgumentParser`` reads them (bools as True/False).

    ``fsdp_config`` is read from a file on the command line: the flag names
    :data:`FSDP_CONFIG_FILE`, which the caller writes.
    """
    out: list[str] = []
    for name, value in kwargs.items():
        out += [f"--{name}", FSDP_CONFIG_FILE if name == "fsdp_config" else str(value)]
    return out


def hf_apply(
    trainer: Any,
    config: Any,
    *,
    warn: bool = True,
    stacklevel: int = 2,
    also: Mapping[str, Any] | None = None,
) -> Any:
    """New ``TrainingArguments``: ``trainer``'s (or the ``TrainingArguments`` given) with
    ``config``'s values set (:func:`autotune.hf.apply`, and each Trainer trial's), and the
    fields ``also`` names (in the same step: the arguments check themselves when built,
    so ``bf16=True`` on the CPU needs ``use_cpu=True`` with it)."""
    import dataclasses
    import warnings

    from ..config import Config

    args = getattr(trainer, "args", trainer)
    values = config.to_dict() if isinstance(config, Config) else dict(config)
    mapped = hf_training_arguments(values, args.device.type)  # no tf32 on a CPU
    kwargs = dict(mapped.kwargs["TrainingArguments"])
    kwargs.pop("use_cpu", None)  # where the trainer runs stays the user's choice
    if kwargs.get("torch_compile") and "torch_compile_mode" not in kwargs:
        kwargs["torch_compile_mode"] = None  # the default mode, not the one args had
    if not kwargs["dataloader_num_workers"]:  # refused without workers
        kwargs.update(dataloader_prefetch_factor=None, dataloader_persistent_workers=False)
    if values.get("length_grouping", "off") == "off" and hasattr(args, "train_sampling_strategy"):
        if args.train_sampling_strategy == "group_by_length":
            kwargs["train_sampling_strategy"] = "random"
    if hasattr(args, "group_by_length") and "train_sampling_strategy" in kwargs:
        kwargs["group_by_length"] = kwargs.pop("train_sampling_strategy") == "group_by_length"
    if hasattr(args, "activation_checkpointing"):  # transformers 5: the old name is an
        # alias read only while the new one is unset, which built arguments never are
        kwargs["activation_checkpointing"] = kwargs.pop("gradient_checkpointing")
    if mapped.no_equivalent and warn:
        listed = "; ".join(f"{k}={v}" for k, v in mapped.no_equivalent.items())
        warnings.warn(
            f"autotune.hf.apply: set by hand: {listed}", UserWarning, stacklevel=stacklevel
        )
    kwargs.update(also or {})
    return dataclasses.replace(args, **{k: v for k, v in kwargs.items() if hasattr(args, k)})
