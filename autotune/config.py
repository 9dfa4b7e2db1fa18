"""A concrete training configuration: one value for every knob."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .errors import AutotuneError, yaml_problem
from .knobs import KNOBS, show


@dataclass(frozen=True)
class Config:
    """One value per knob: what a trial measures and what :func:`autotune.apply` applies.

    ``batch_size`` is the micro-batch; one optimizer step sees
    ``batch_size * accumulation_steps`` samples (:attr:`global_batch`).
    """

    batch_size: int = KNOBS["batch_size"].default
    accumulation_steps: int = KNOBS["accumulation_steps"].default
    amp_dtype: str = KNOBS["amp_dtype"].default
    num_workers: int = KNOBS["num_workers"].default
    pin_memory: bool = KNOBS["pin_memory"].default
    persistent_workers: bool = KNOBS["persistent_workers"].default
    prefetch_factor: int = KNOBS["prefetch_factor"].default
    packing: str = KNOBS["packing"].default
    pack_length: int = KNOBS["pack_length"].default
    length_grouping: str = KNOBS["length_grouping"].default
    pad_to_multiple_of: int = KNOBS["pad_to_multiple_of"].default
    non_blocking: bool = KNOBS["non_blocking"].default
    cudnn_benchmark: bool = KNOBS["cudnn_benchmark"].default
    matmul_precision: str = KNOBS["matmul_precision"].default
    channels_last: bool = KNOBS["channels_last"].default
    sdpa_backend: str = KNOBS["sdpa_backend"].default
    compile_mode: str = KNOBS["compile_mode"].default
    compile_dynamic: str = KNOBS["compile_dynamic"].default
    compile_fullgraph: bool = KNOBS["compile_fullgraph"].default
    gradient_checkpointing: bool = KNOBS["gradient_checkpointing"].default
    world_size: int = KNOBS["world_size"].default
    fsdp: str = KNOBS["fsdp"].default
    fsdp_reshard_after_forward: bool = KNOBS["fsdp_reshard_after_forward"].default
    fsdp_param_dtype: str = KNOBS["fsdp_param_dtype"].default
    fsdp_reduce_dtype: str = KNOBS["fsdp_reduce_dtype"].default
    fsdp_cpu_offload: bool = KNOBS["fsdp_cpu_offload"].default
    ddp_bucket_cap_mb: int = KNOBS["ddp_bucket_cap_mb"].default
    ddp_gradient_as_bucket_view: bool = KNOBS["ddp_gradient_as_bucket_view"].default
    ddp_static_graph: bool = KNOBS["ddp_static_graph"].default
    checkpoint_every: int = KNOBS["checkpoint_every"].default
    jit: str = KNOBS["jit"].default
    optimizer_impl: str = KNOBS["optimizer_impl"].default
    zero_grad_set_to_none: bool = KNOBS["zero_grad_set_to_none"].default
    num_threads: int = KNOBS["num_threads"].default
    interop_threads: int = KNOBS["interop_threads"].default

    def __post_init__(self) -> None:
        for name in KNOBS:
            try:
                object.__setattr__(self, name, KNOBS[name].normalize(getattr(self, name)))
            except ValueError as e:
                raise AutotuneError(f"config: {name} {e}") from None
        values = self.to_dict()
        for name, knob in KNOBS.items():
            if values[name] != knob.default:
                reason = knob.requires(values)
                if reason:
                    shown = show(values[name])
                    raise AutotuneError(f"config: {name}={shown} {reason}")

    @property
    def global_batch(self) -> int:
        """Samples per optimizer step, over all processes (DDP or FSDP)."""
        return self.batch_size * self.accumulation_steps * self.world_size

    def fsdp_policy(self) -> tuple[str | None, str | None]:
        """The FSDP2 ``MixedPrecisionPolicy`` (param_dtype, reduce_dtype) as dtype names;
        ``None`` leaves FSDP's default (no cast; gradients reduced in the param dtype).

        The one rule for the trials (``trial.apply.shard_fsdp``) and the plain-loop export.
        """
        param, reduce = self.fsdp_param_dtype, self.fsdp_reduce_dtype
        return (
            param if param != "fp32" else None,
            reduce if "bf16" in (param, reduce) else None,
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Config:
        """Build a config from a mapping; unknown keys are an error, missing keys take defaults."""
        unknown = sorted(set(values) - set(KNOBS))
        if unknown:
            raise AutotuneError(f"config: unknown knob(s) {', '.join(unknown)}")
        return cls(**values)

    def replace(self, **changes: Any) -> Config:
        return dataclasses.replace(self, **changes)

    def key(self) -> str:
        """A stable string identifying this config (used to skip re-running it).

        Knobs at their default are left out, so a knob added to autotune later does not
        change the key of a config stored before it.
        """
        return ",".join(
            f"{k}={v}" for k, v in sorted(self.to_dict().items()) if v != KNOBS[k].default
        )

    def short(self) -> str:
        """A compact human form: the micro-batch, then every knob that is not at its default.

        A flag reads as its short name when on and ``no_<name>`` when off.
        """
        parts = [f"bs={self.batch_size}"]
        for name, value in self.to_dict().items():
            if name == "batch_size" or value == KNOBS[name].default:
                continue
            short = _SHORT.get(name, name)
            if isinstance(value, bool):
                parts.append(short if value else f"no_{short}")
            else:
                parts.append(f"{short}={value}")
        return " ".join(parts)


_SHORT = {
    "accumulation_steps": "acc",
    "amp_dtype": "amp",
    "num_workers": "workers",
    "pin_memory": "pin",
    "persistent_workers": "persist",
    "prefetch_factor": "prefetch",
    "packing": "pack",
    "pack_length": "pack_len",
    "length_grouping": "group",
    "pad_to_multiple_of": "pad_to",
    "non_blocking": "nonblock",
    "cudnn_benchmark": "cudnn_bench",
    "world_size": "ranks",
    "fsdp_reshard_after_forward": "reshard",
    "fsdp_param_dtype": "fsdp_param",
    "fsdp_reduce_dtype": "fsdp_reduce",
    "fsdp_cpu_offload": "offload",
    "ddp_bucket_cap_mb": "bucket_mb",
    "ddp_gradient_as_bucket_view": "grad_view",
    "ddp_static_graph": "static_graph",
    "matmul_precision": "matmul",
    "channels_last": "nhwc",
    "sdpa_backend": "sdpa",
    "compile_mode": "compile",
    "compile_dynamic": "dynamic",
    "compile_fullgraph": "fullgraph",
    "gradient_checkpointing": "ckpt",
    "checkpoint_every": "ckpt_every",
    "optimizer_impl": "opt",
    "zero_grad_set_to_none": "set_to_none",
    "num_threads": "threads",
    "interop_threads": "interop",
}


def resolve_inactive(values: Mapping[str, Any], keep: Collection[str] = ()) -> dict[str, Any]:
    """``values`` (every knob) with each inactive knob back at its default.

    A knob is inactive when its ``requires`` names a reason given the knobs before it
    (prefetch_factor without workers...). Knobs in ``keep`` are left as they are, so that
    :class:`Config` rejects them if they conflict: they were asked for explicitly.
    """
    out = dict(values)
    for name, knob in KNOBS.items():  # registry order: conditions look only at earlier knobs
        if name not in keep and out[name] != knob.default and knob.requires(out) is not None:
            out[name] = knob.default
    return out


def load_config(path: str) -> Config:
    """Load the ``config:`` section of a ``best_config.yaml`` (or a plain mapping file)."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as e:
        raise AutotuneError(f"{path}: cannot read config: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        raise AutotuneError(f"{path}: cannot read config: {yaml_problem(e)}") from None
    if isinstance(data, dict) and isinstance(data.get("config"), dict):
        data = data["config"]
    if not isinstance(data, dict):
        raise AutotuneError(f"{path}: must hold a mapping of knob values")
    return Config.from_dict(data)
