"""Build a trial: seed, load the workload, apply the config (as ``autotune.apply`` does)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..config import Config
from ..errors import WorkloadError
from ..frameworks import adapters
from ..trial_spec import TrialSpec
from ..workload import Workload
from .apply import Applied, apply_workload, resolve_device, set_threads
from .guard import init_distributed


def load(spec: TrialSpec) -> Workload:
    """The workload a spec names (its path relative to the space file's folder), a
    Trainer or Lightning pair adapted; torch is seeded with the run's seed before the
    function runs, so a model it builds starts from the same weights in every run."""
    base = Path(spec.base_dir) if spec.base_dir else None
    return adapters.load(spec.workload, spec.workload_args, base, seed=spec.seed)


@dataclass
class Prepared:
    """A trial's config, device and workload before the config is applied: what both
    autotune's loop (:func:`build`) and a framework's own loop (:mod:`.native`) start from."""

    config: Config
    spec: TrialSpec
    device: torch.device
    workload: Workload
    device_init_s: float = 0.0  # the device's set-up (a CUDA context)
    build_s: float = 0.0  # the workload's build: the user's factory, the adapter


@dataclass
class Built:
    """A trial's workload with the config applied, as both trial and profile modes run it."""

    config: Config
    spec: TrialSpec
    device: torch.device
    workload: Workload
    applied: Applied
    batches: Iterator[Any]
    lengths: list[int] | None = None  # every sample's length (token workloads), if known
    device_init_s: float = 0.0  # the device's set-up (a CUDA context) within the build


def prepare(spec: TrialSpec) -> Prepared:
    """Threads, device and seed as the config says, then the workload loaded."""
    config = spec.config
    if config is None:
        raise WorkloadError(f"a {spec.mode} run needs a config")
    set_threads(config)  # before the workload: the inter-op pool is sized only once
    t = time.perf_counter()
    device = init_distributed(resolve_device(spec.device))
    if device.type == "cuda":  # the context, apart from the workload's build
        torch.zeros(1, device=device)
    device_init_s = time.perf_counter() - t
    workload = load(spec)
    if config.compile_mode != "off":
        # Hitting the recompile limit fails the trial (recorded with the reason) instead
        # of silently running that frame eagerly.
        from torch._dynamo import config as dynamo_config

        dynamo_config.fail_on_recompile_limit_hit = True
    build_s = time.perf_counter() - t - device_init_s
    return Prepared(config, spec, device, workload, device_init_s, build_s)


def build(spec: TrialSpec, prepared: Prepared | None = None) -> Built:
    """Seed, build the workload and apply the config: the same code path as ``autotune.apply``."""
    p = prepared or prepare(spec)
    config, workload = p.config, p.workload
    lengths = stored_lengths(spec) if workload.tokens is not None else None
    applied = apply_workload(
        config, workload, device=p.device, seed=spec.seed, endless=True, lengths=lengths
    )
    if lengths is not None and len(lengths) != len(applied.loader.dataset):
        raise WorkloadError(
            f"the dataset has {len(applied.loader.dataset)} samples but the probe found "
            f"{len(lengths)}: it must build the same dataset every time"
        )
    lengths = lengths or getattr(applied.loader.sampler, "lengths", None)  # found for grouping
    return Built(
        config, spec, p.device, workload, applied, iter(applied.loader), lengths, p.device_init_s
    )


def stored_lengths(spec: TrialSpec) -> list[int] | None:
    """The samples' lengths the study's probe wrote, if this machine can read them."""
    path = spec.lengths_path
    try:
        return json.loads(Path(path).read_text()) if path else None
    except (OSError, ValueError):
        return None


def _fsdp_modules(model: torch.nn.Module) -> int:
    """How many modules FSDP2 sharded (each gathers its parameters as one group)."""
    if not torch.distributed.is_available():
        return 0
    from torch.distributed.fsdp import FSDPModule

    return sum(isinstance(m, FSDPModule) for m in model.modules())


def _fsdp_reduce_dtypes(model: torch.nn.Module) -> list[str] | None:
    """The dtypes FSDP2 reduce-scatters gradients in, read from each sharded module's
    state (a private attribute of torch's: None where it is not there)."""
    if not torch.distributed.is_available():
        return None
    from torch.distributed.fsdp import FSDPModule

    try:
        policies = [
            m._get_fsdp_state()._mp_policy for m in model.modules() if isinstance(m, FSDPModule)
        ]
    except AttributeError:
        return None
    return sorted({str(p.reduce_dtype or torch.float32) for p in policies}) or None


def applied_settings(applied: Applied) -> dict[str, Any]:
    """What :func:`autotune.apply` set up, read back from the objects it built.

    Written into each trial's ``result.json`` (``applied``), so a test or a user can check
    that their own ``apply`` call builds the same loader, model and optimizer as the trial.
    DataLoader attributes are read generically, so new loader knobs show up here too.
    """
    loader, model, opt = applied.loader, applied.model, applied.optimizer
    inner = getattr(model, "_orig_mod", model)
    loader_attrs = (
        "batch_size",
        "num_workers",
        "pin_memory",
        "persistent_workers",
        "prefetch_factor",
        "drop_last",
        "timeout",
    )
    group = opt.param_groups[0] if opt.param_groups else {}
    autocast = applied.autocast()
    return {
        "config": applied.config.to_dict(),
        "device": str(applied.device),
        "loader": {k: getattr(loader, k, None) for k in loader_attrs}
        | {"sampler": type(loader.sampler).__name__},
        "model": {
            "type": type(inner).__name__,
            "compiled": inner is not model,
            "training": inner.training,
            "param_dtypes": sorted({str(p.dtype) for p in inner.parameters()}),
            "param_devices": sorted({str(p.device) for p in inner.parameters()}),
            "checkpointed_blocks": sum(
                1 for m in inner.modules() if getattr(m, "_autotune_checkpointed", False)
            ),
            "ddp": type(inner).__name__ == "DistributedDataParallel",
            "fsdp_modules": _fsdp_modules(inner),
            "fsdp_reduce_dtypes": _fsdp_reduce_dtypes(inner),
        },
        "optimizer": {
            "type": type(opt).__name__,
            **{k: group.get(k) for k in ("foreach", "fused") if k in group},
        },
        "autocast": str(autocast.fast_dtype) if isinstance(autocast, torch.autocast) else None,
        "grad_scaler": applied.scaler is not None,
        "torch": {
            "cudnn_benchmark": torch.backends.cudnn.benchmark,
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "num_threads": torch.get_num_threads(),
            "interop_threads": torch.get_num_interop_threads(),
        },
    }


def native_settings(prepared: Prepared) -> dict[str, Any]:
    """What a framework trial ran: the config, the device and the framework whose own
    loop ran it (``result.json``'s ``applied``, as :func:`applied_settings` for autotune's
    loop)."""
    return {
        "config": prepared.config.to_dict(),
        "device": str(prepared.device),
        "loop": prepared.workload.native.framework,
    }
