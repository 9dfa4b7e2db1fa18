"""The probe: what this device, this torch and this workload can do, and where we are.

Run once per study in its own trial process (mode ``probe``). Each check is a small
function that asks torch by trying (a tiny autocast, an SDPA call per backend, an
optimizer rebuild) rather than by version tables. The driver turns the answer into
:class:`~autotune.knobs.Capabilities` and drops what cannot run; :func:`environment`
records the machine a config is measured on.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import socket
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from .. import __version__
from ..config import Config
from ..host import cpu_model, system_memory_bytes
from ..knobs import MATMUL_PRECISIONS, OPTIMIZER_IMPLS, SDPA_BACKENDS
from ..measurement import OK
from ..trial_spec import TrialSpec
from ..workload import Workload
from .apply import collate_for, rebuild_optimizer, resolve_device, sdpa_backend, to_device
from .build import load
from .flops import model_flops
from .peak import peak_facts
from .telemetry import energy_unavailable
from .tokens import dataset_lengths

_ATTENTION_CALLS = {"scaled_dot_product_attention", "multi_head_attention_forward"}


def autocast_works(device: torch.device, dtype: torch.dtype) -> bool:
    try:
        with torch.autocast(device.type, dtype=dtype):
            torch.ones(2, 2, device=device) @ torch.ones(2, 2, device=device)
        return True
    except Exception:
        return False


def compile_support(device: torch.device) -> tuple[bool, str]:
    if not hasattr(torch, "compile"):
        return False, f"torch {torch.__version__} has no torch.compile"
    if device.type == "cpu" and not (shutil.which("g++") or shutil.which("c++")):
        return False, "no C++ compiler for inductor's CPU backend"
    return True, ""


class _Calls(TorchFunctionMode):
    """Records the names of the torch functions a forward calls (outermost calls only)."""

    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.names.add(getattr(func, "__name__", ""))
        return func(*args, **(kwargs or {}))


def forward_calls(model: torch.nn.Module, workload: Workload, dataset: Any, device) -> set[str]:
    """The torch functions one forward (and loss) of a 2-sample batch calls.

    Empty when that forward fails; the module scan of :func:`model_features` still
    applies then.
    """
    collate = collate_for(Config(), workload.tokens, workload.collate_fn)
    loader = torch.utils.data.DataLoader(dataset, batch_size=2, collate_fn=collate)
    try:
        batch = to_device(next(iter(loader)), device)
        with torch.no_grad(), _Calls() as calls:
            workload.loss(model, batch)
    except Exception:
        return set()
    return calls.names


def model_features(model: torch.nn.Module, calls: set[str]) -> dict[str, bool]:
    """Whether the workload runs 2-d convolutions and scaled-dot-product attention."""
    modules = list(model.modules())
    return {
        "conv2d": "conv2d" in calls or any(isinstance(m, torch.nn.Conv2d) for m in modules),
        "attention": bool(calls & _ATTENTION_CALLS)
        or any(isinstance(m, torch.nn.MultiheadAttention) for m in modules),
    }


def sdpa_backends(device: torch.device) -> list[str]:
    """The explicit SDPA backends that run a small causal attention forward and backward.

    On CUDA, a backend counts when it runs in any of fp32/fp16/bf16 (flash has no fp32).
    """
    from torch.nn.attention import sdpa_kernel

    dtypes = [torch.float32]
    if device.type == "cuda":
        dtypes += [torch.float16, torch.bfloat16]
    found = []
    for name in SDPA_BACKENDS[1:]:
        for dtype in dtypes:
            q = torch.randn(2, 4, 16, 16, device=device, dtype=dtype, requires_grad=True)
            try:
                with sdpa_kernel([sdpa_backend(name)]):
                    out = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
                out.sum().backward()
            except RuntimeError:
                continue
            found.append(name)
            break
    return found


def matmul_precisions(device: torch.device) -> list[str]:
    """The ``set_float32_matmul_precision`` values that change an fp32 matmul here.

    A value that computes the same bits as ``highest`` has no effect on this device.
    """
    g = torch.Generator().manual_seed(0)
    # Large enough for oneDNN's reduced-precision path on CPU (it skips small matmuls).
    a = torch.randn(512, 512, generator=g).to(device)
    b = torch.randn(512, 512, generator=g).to(device)
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        exact = a @ b
        found = ["highest"]
        for value in MATMUL_PRECISIONS[1:]:
            torch.set_float32_matmul_precision(value)
            if not torch.equal(a @ b, exact):
                found.append(value)
    finally:
        torch.set_float32_matmul_precision(before)
    return found


def optimizer_impls(workload: Workload, model: torch.nn.Module) -> tuple[str, list[str]]:
    """The workload optimizer's class name and the ``optimizer_impl`` values it takes here."""
    try:
        opt = workload.optimizer(model.parameters())
    except Exception:
        return "", []
    found = []
    for impl in OPTIMIZER_IMPLS[1:]:
        try:
            rebuild_optimizer(opt, impl)
        except ValueError:
            continue
        found.append(impl)
    return type(opt).__name__, found


def model_context(model: Any, workload: Workload) -> int:
    """The most positions the model takes: ``Tokens.context``, else a transformers
    config's ``max_position_embeddings`` or ``n_positions``; 0 when unknown."""
    if workload.tokens is not None and workload.tokens.context is not None:
        return workload.tokens.context
    config = getattr(model, "config", None)
    for name in ("max_position_embeddings", "n_positions"):
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 0


def fsdp_available() -> bool:
    """Whether FSDP2 (``torch.distributed.fsdp.fully_shard``) can be imported."""
    if not torch.distributed.is_available():
        return False
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except ImportError:
        return False
    return True


def capabilities(device: torch.device, workload: Workload, dataset: Any) -> dict[str, Any]:
    """Everything :class:`~autotune.knobs.Capabilities` holds, as plain data."""
    bf16 = autocast_works(device, torch.bfloat16)
    if device.type == "cuda":
        bf16 = bf16 and torch.cuda.is_bf16_supported()
    compile_ok, compile_reason = compile_support(device)
    torch.manual_seed(0)
    model = workload.model().to(device)
    block_list = list(workload.blocks(model)) if workload.blocks is not None else []
    shardable = len(block_list)
    if workload.blocks is not None:
        blocks = shardable
    else:  # the model's own checkpointing counts as one block (no checkpoint_every)
        blocks = 1 if workload.checkpointing is not None else 0
    optimizer, impls = optimizer_impls(workload, model)
    return {
        "device": device.type,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "bf16": bf16,
        "fp16": autocast_works(device, torch.float16),
        "compile": compile_ok,
        "compile_reason": compile_reason,
        "cpu_count": os.cpu_count() or 1,
        "workload_blocks": blocks,
        **model_features(model, forward_calls(model, workload, dataset, device)),
        "sdpa_backends": sdpa_backends(device),
        "matmul_precisions": matmul_precisions(device),
        "optimizer": optimizer,
        "optimizer_impls": impls,
        "gpu_count": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "distributed": torch.distributed.is_available(),
        "fsdp": fsdp_available(),
        "shardable_blocks": shardable,
        "block_types": sorted({type(b).__name__ for b in block_list}),
        "tokens": workload.tokens is not None,
        "token_collate": workload.owns_collate,
        "packing_undeclared": workload.packing_undeclared or "",
        "isolated_undeclared": workload.isolated_undeclared or "",
        "context": model_context(model, workload),
        "pack_length": (workload.tokens.pack_length or 0) if workload.tokens else 0,
        # a Trainer's or Lightning pair's own loop runs the trials: what it cannot set
        "framework_refused": dict(workload.native.refused) if workload.native else {},
    }


def nvml_info(pci_bus_id: str | None = None, index: int = 0) -> dict[str, Any]:
    """Driver version and memory of one GPU from NVML; empty without a driver.

    The GPU is found by PCI bus id when given: NVML indices ignore CUDA_VISIBLE_DEVICES.
    """
    try:
        import pynvml
    except ImportError:
        return {}
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return {}
    try:
        if pci_bus_id:
            handle = pynvml.nvmlDeviceGetHandleByPciBusId(pci_bus_id)
        else:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
        driver = pynvml.nvmlSystemGetDriverVersion()
        name = pynvml.nvmlDeviceGetName(handle)
        return {
            "driver": driver.decode() if isinstance(driver, bytes) else driver,
            "nvml_total_bytes": int(mem.total),
            "nvml_name": name.decode() if isinstance(name, bytes) else name,
        }
    except pynvml.NVMLError:
        return {}
    finally:
        pynvml.nvmlShutdown()


def _pci_bus_id(props: Any) -> str | None:
    try:
        return f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
    except AttributeError:
        return None


def environment(device_type: str) -> dict[str, Any]:
    """Describe this machine: torch, CPU, memory and, on CUDA, the GPU and its driver."""
    env: dict[str, Any] = {
        "device": device_type,
        "torch": torch.__version__,
        "autotune": __version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "hostname": socket.gethostname(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "system_memory_bytes": system_memory_bytes(),
        "torch_threads": torch.get_num_threads(),
    }
    if device_type == "cuda":
        props = torch.cuda.get_device_properties(0)
        env.update(
            device_name=props.name,
            device_memory_bytes=int(props.total_memory),
            cuda=torch.version.cuda,
            cudnn=torch.backends.cudnn.version(),
            capability=f"{props.major}.{props.minor}",
            **nvml_info(_pci_bus_id(props)),
        )
    else:
        env.update(device_name=env["cpu"], device_memory_bytes=env["system_memory_bytes"])
    env["energy_unavailable"] = energy_unavailable(device_type)  # "" where it can be read
    return env


def probe(spec: TrialSpec) -> dict[str, Any]:
    """Check that the workload loads and tell the driver what this machine can do."""
    device = resolve_device(spec.device)
    workload = load(spec)
    dataset = workload.dataset()
    facts: dict[str, Any] = {
        "name": workload.name,
        "dataset_len": len(dataset),
        "tokens_per_sample": workload.tokens_per_sample,
    }
    if workload.baseline:  # a Trainer's own settings: the driver makes them the baseline
        facts["baseline"] = dict(workload.baseline)
    if workload.tokens is not None:  # checks tokens.lengths against the dataset
        found = dataset_lengths(dataset, workload.tokens)
        if spec.lengths_path:  # for the trials of the study
            Path(spec.lengths_path).write_text(json.dumps(found))
        lengths = sorted(found)
        facts["lengths"] = {
            "min": lengths[0],
            "median": lengths[len(lengths) // 2],
            "max": lengths[-1],
            "mean": sum(lengths) / len(lengths),
        }
    caps = capabilities(device, workload, dataset)
    # why no energy can be read here ("" where it can): trial.objective: energy needs it
    caps["energy_unavailable"] = energy_unavailable(device.type)
    # what the exports name for per-block wrapping (FSDP auto-wrap classes)
    block_types = caps.pop("block_types")
    env = {
        **environment(device.type),
        "workload_block_types": block_types,
        "workload_framework": workload.framework,
    }
    if spec.vec_isa and device.type == "cpu" and caps["compile"]:
        env["cpu_vec_isa"] = vec_isa()
    if spec.baseline is not None:  # the study's probe: what MFU needs
        env["model_flops"] = model_flops(workload, dataset, spec.baseline, device, spec.seed)
        keys = [*spec.peak_keys, *_own_peak_keys(workload.baseline)]
        keys = usable_peak_keys(list(dict.fromkeys(keys)), caps)
        env.update(peak_facts(keys, device, env.get("nvml_name") or env.get("device_name")))
    return {"status": OK, "capabilities": caps, "environment": env, "workload": facts}


def _own_peak_keys(values: Any) -> list[str]:
    """The peak a workload's own baseline (a Trainer's bf16, tf32) computes at: the space
    file's baseline, which the probe was given, does not know it yet."""
    if not values:
        return []
    amp = values.get("amp_dtype", "fp32")
    if amp != "fp32":
        return [amp]
    precision = values.get("matmul_precision", "highest")
    return ["fp32" if precision == "highest" else f"fp32-{precision}"]


def usable_peak_keys(keys: list[str], caps: dict[str, Any]) -> list[str]:
    """The peak keys (:func:`autotune.mfu.peak_keys`) a config can compute in here: bf16
    and fp16 where autocast runs them, an fp32 matmul precision where it changes the
    matmul (:func:`matmul_precisions`)."""
    usable = []
    for key in keys:
        dtype, _, precision = key.partition("-")
        if dtype in ("bf16", "fp16") and not caps.get(dtype):
            continue
        if precision and precision not in caps.get("matmul_precisions", ()):
            continue
        usable.append(key)
    return usable


def vec_isa() -> str:
    """The vector ISA inductor compiles CPU kernels for, found as inductor finds it: by
    building a test library for each ISA it knows in its cache folder
    (``TORCHINDUCTOR_CACHE_DIR``, which every config's cache then starts from)."""
    try:
        from torch._inductor.cpu_vec_isa import pick_vec_isa

        return str(pick_vec_isa()) or "none"
    except Exception as exc:  # the trials find it themselves, as before
        return f"unknown ({type(exc).__name__}: {exc})"[:200]
