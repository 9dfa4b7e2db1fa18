"""Write the recommended config for people and trainers.

``best_config.yaml`` (written by :func:`autotune.results.write_best_config`) holds the
config, the evidence and the machine it was measured on.
:func:`export_config` renders a config as ``yaml``/``json`` (lossless: both load back with
:func:`autotune.load_config`), as Hugging Face ``TrainingArguments`` or Lightning
``Trainer``/``DataLoader`` keyword arguments (a Python snippet), or as a shell fragment.
Knobs a target cannot express are listed in the output, never dropped (see
:mod:`autotune.frameworks.mapping`).
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from ..config import Config
from ..credentials import redact_url
from ..errors import AutotuneError, yaml_problem
from ..frameworks import mapping
from ..knobs import KNOBS
from ..planned import Projection
from ..results import machine_line, recommendation
from ..space_file import load_space
from ..study.storage import load_result
from ..workload import FRAMEWORKS
from .facts import speedup_text

FORMATS = ("yaml", "json", "hf", "lightning", "env", "torch")
# The format a study suggests for the framework its workload came from (the probe's
# ``workload_framework``); a plain PyTorch workload gets the training-loop snippet.
FRAMEWORK_FORMATS = dict(zip(FRAMEWORKS, ("hf", "lightning"), strict=True))


def suggested_format(environment: Mapping[str, Any]) -> str:
    """The export format for a study whose probe found ``environment``."""
    return FRAMEWORK_FORMATS.get(environment.get("workload_framework") or "", "torch")


def _header(evidence: Mapping[str, Any] | None) -> list[str]:
    """Comment lines: where the config comes from and where it is valid."""
    if not evidence:
        return ["autotune config"]
    m, env = evidence.get("measured", {}), evidence.get("environment", {})
    study = evidence.get("study", {}).get("name", "?")
    line = f"autotune: trial #{m.get('trial', '?')} of study {study}"
    if m.get("speedup") is not None:
        speedup = speedup_text(
            m["speedup"],
            m.get("baseline_objective", 0),
            m.get("objective", 0),
            m.get("objective_unit", m.get("unit", "samples")),
        )
        line += f": {speedup} over the baseline"
    lines = [
        line,
        f"measured on {machine_line(env)}; a config is only valid where it was measured",
    ]
    if evidence.get("planned_run"):
        projection = Projection.from_dict(evidence["planned_run"])
        lines.append(f"{projection.label}: {projection.text()}")
        if projection.baseline_kwh is not None:
            lines.append(f"{projection.energy_label}: {projection.energy_text()}")
    return lines


def _py_dict(name: str, d: Mapping[str, Any]) -> list[str]:
    return [f"{name} = {{", *(f"    {k!r}: {v!r}," for k, v in d.items()), "}"]


def _unmapped(mapped: mapping.Mapped, prefix: str = "# ") -> list[str]:
    lines = []
    if mapped.no_equivalent:
        lines.append(f"{prefix}No equivalent in {mapped.target} (set these in your code):")
        lines += [f"{prefix}  {k}={v}" for k, v in mapped.no_equivalent.items()]
    lines += [f"{prefix}note: {n}" for n in mapped.notes]
    return lines


def _hf(values: dict[str, Any], device: str | None = None, blocks: Sequence[str] = ()) -> list[str]:
    mapped = mapping.hf_training_arguments(values, device, blocks)
    return [
        "# Hugging Face transformers.TrainingArguments keyword arguments",
        *_py_dict("training_args_kwargs", mapped.kwargs["TrainingArguments"]),
        '# args = transformers.TrainingArguments(output_dir="out", **training_args_kwargs)',
        *_unmapped(mapped),
    ]


def _lightning(values: dict[str, Any], blocks: Sequence[str] = ()) -> list[str]:
    mapped = mapping.lightning_kwargs(values, blocks)
    strategy = next((k for k in mapped.kwargs if k.endswith("Strategy")), None)
    lines = ["# Lightning Trainer and DataLoader keyword arguments"]
    if strategy is not None:
        lines += [
            f"from lightning.pytorch.strategies import {strategy}",
            *(
                ["import torch", "from torch.distributed.fsdp import MixedPrecision"]
                if "mixed_precision" in mapped.kwargs[strategy]
                else []
            ),
            *_py_dict("strategy_kwargs", mapped.kwargs[strategy]),
        ]
    return [
        *lines,
        *_py_dict("trainer_kwargs", mapped.kwargs["Trainer"]),
        *_py_dict("dataloader_kwargs", mapped.kwargs["DataLoader"]),
        "# trainer = lightning.pytorch.Trainer(**trainer_kwargs)",
        "# loader = torch.utils.data.DataLoader(dataset, shuffle=True, **dataloader_kwargs)",
        *_unmapped(mapped),
    ]


def _env(
    values: dict[str, Any], device: str | None = None, blocks: Sequence[str] = ()
) -> list[str]:
    env, mapped = mapping.shell_fragment(values, device, blocks)
    flags = " ".join(
        shlex.quote(a) for a in mapping.hf_cli_args(mapped.kwargs["TrainingArguments"])
    )
    fsdp = mapped.kwargs["TrainingArguments"].get("fsdp_config")
    files = []
    if fsdp is not None:  # HfArgumentParser reads fsdp_config from a file
        blob = shlex.quote(json.dumps(fsdp))
        files = [f"printf '%s\\n' {blob} > {mapping.FSDP_CONFIG_FILE}"]
    return [
        "# every knob, for your own script (os.environ['AUTOTUNE_BATCH_SIZE'] ...)",
        *env,
        "# flags for a Hugging Face script (HfArgumentParser): python train.py $AUTOTUNE_HF_ARGS",
        *files,
        f"export AUTOTUNE_HF_ARGS={shlex.quote(flags)}",
        *_unmapped(mapped),
    ]


def _torch(
    values: dict[str, Any],
    device: str | None = None,
    blocks: Sequence[str] = (),
    unit: str | None = None,
) -> list[str]:
    """The config as code for a plain PyTorch loop: the process group and FSDP2 sharding
    or DDP as autotune's trials set them up, how a token workload's step weighs its
    micro-batches (``unit``: the measured one, ``None`` when unknown), then one line per
    other knob off its default."""
    config = Config.from_dict({k: v for k, v in values.items() if k in KNOBS})
    on_gpu = device != "cpu"
    lines = ["# plain PyTorch: the setup autotune measured (autotune.apply does the same)"]
    if config.world_size > 1:
        lines += [
            f"# launch: torchrun --nproc-per-node={config.world_size} train.py",
            "import os",
            "import torch",
            "import torch.distributed as dist",
            "",
            f"dist.init_process_group({'nccl' if on_gpu else 'gloo'!r})",
        ]
        if on_gpu:
            lines += [
                'device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))',
                "torch.cuda.set_device(device)",
            ]
        else:
            lines.append('device = torch.device("cpu")')
        lines.append("model = build_model().to(device)  # every rank builds it with one seed")
        if config.fsdp != "off":
            lines += _fsdp_code(config, "cuda" if on_gpu else "cpu", blocks)
            lines.append("optimizer = build_optimizer(model.parameters())  # after sharding")
        else:
            device_ids = "[device.index]" if on_gpu else "None"
            lines += [
                "optimizer = build_optimizer(model.parameters())",
                "model = torch.nn.parallel.DistributedDataParallel(",
                f"    model, device_ids={device_ids}, bucket_cap_mb={config.ddp_bucket_cap_mb},",
                f"    gradient_as_bucket_view={config.ddp_gradient_as_bucket_view}, "
                f"static_graph={config.ddp_static_graph},",
                ")",
            ]
            if config.ddp_static_graph and config.accumulation_steps > 1:
                lines.append(
                    "# with static_graph, every micro-batch all-reduces (no model.no_sync()): "
                    "no_sync fails under a static graph (pytorch/pytorch#143580)"
                )
        lines += [
            "# each rank loads its share of every step: batch_size per rank, e.g.",
            "# DataLoader(dataset, batch_size=..., sampler=DistributedSampler(dataset))",
        ]
    lines += _token_weighting(config, unit)
    skip = {"world_size", "fsdp", *mapping.FSDP_OPTIONS, *mapping.DDP_OPTIONS}
    rest = [
        f"# {k}={v!r}: {mapping.PLAIN_PYTORCH.get(k, 'see autotune.apply').format(v=v)}"
        for k, v in config.to_dict().items()
        if k not in skip and (v != KNOBS[k].default or k == "batch_size")
    ]
    return [*lines, *(["# the other knobs:"] if rest else []), *rest]


def _token_weighting(config: Config, unit: str | None) -> list[str]:
    """How a step of several micro-batches (or ranks) of a token workload weighs them, as
    ``Applied.train_step`` does: nothing when one micro-batch is the whole step or the
    workload was measured in samples."""
    if config.accumulation_steps * config.world_size == 1 or unit not in (None, "tokens"):
        return []
    return [
        "# token workloads: a step is the per-token mean over all its micro-batches and ranks.",
        "# Before the first backward count each micro-batch's scored tokens n_i (labels other",
        "# than -100 after each row's first), N = their sum (dist.all_reduce over the ranks),",
        "# then backward loss_i * n_i * world_size / N for a per-token mean loss",
        "# (loss_i * world_size / N for a per-token sum); DDP and FSDP average over the ranks.",
    ]


def _fsdp_code(config: Config, device_type: str, blocks: Sequence[str]) -> list[str]:
    from_fsdp = ["fully_shard", "MixedPrecisionPolicy"]
    if config.fsdp_cpu_offload:
        from_fsdp.append("CPUOffloadPolicy")
    dtype = {None: "None", "fp32": "torch.float32", "bf16": "torch.bfloat16"}
    param, reduce = config.fsdp_policy()
    options = "mesh=mesh, mp_policy=policy" + (
        ", offload_policy=CPUOffloadPolicy()" if config.fsdp_cpu_offload else ""
    )
    lines = [
        "from torch.distributed.device_mesh import init_device_mesh",
        f"from torch.distributed.fsdp import {', '.join(from_fsdp)}",
        "",
        f'mesh = init_device_mesh("{device_type}", (dist.get_world_size(),))',
        f"policy = MixedPrecisionPolicy(param_dtype={dtype[param]}, reduce_dtype={dtype[reduce]})",
    ]
    reshard = config.fsdp_reshard_after_forward
    if config.fsdp == "blocks":
        kinds = ", ".join(blocks) if blocks else "your model's blocks"
        lines += [
            f"for block in blocks(model):  # Workload.blocks: {kinds}",
            f"    fully_shard(block, reshard_after_forward={reshard}, {options})",
            f"fully_shard(model, {options})  # the root: the rest of the parameters",
        ]
    else:
        lines.append(f"fully_shard(model, reshard_after_forward={reshard}, {options})")
    return lines


def export_config(
    config: Config | Mapping[str, Any],
    fmt: str = "yaml",
    *,
    evidence: Mapping[str, Any] | None = None,
) -> str:
    """Render a config for a person, a file or a trainer.

    Args:
        config: a :class:`Config` or a ``Config.to_dict()``-like mapping (knobs this
            version of autotune does not know are kept: listed as "no equivalent" by the
            trainer formats, carried as-is by yaml/json).
        fmt: one of ``yaml``, ``json`` (lossless, with the evidence when given),
            ``hf`` (``TrainingArguments`` kwargs), ``lightning`` (``Trainer`` and
            ``DataLoader`` kwargs, a ``DDPStrategy``/``FSDPStrategy`` for several
            processes), ``env`` (a shell fragment), ``torch`` (code for a plain loop:
            the process group, FSDP2 sharding or DDP, a line per other knob).
        evidence: the rest of a ``best_config.yaml`` (``measured``, ``environment``,
            ``study``), used for yaml/json and for the header comment; a storage URL
            in ``study`` is written with its password redacted.

    Raises:
        AutotuneError: ``fmt`` is not one of :data:`FORMATS`.
    """
    if fmt not in FORMATS:
        raise AutotuneError(f"format must be one of {', '.join(FORMATS)} but got {fmt!r}")
    values = config.to_dict() if isinstance(config, Config) else dict(config)
    evidence = _redacted(evidence)
    header = _header(evidence)
    if fmt == "json":
        body = {"config": values, **{k: v for k, v in (evidence or {}).items() if k != "config"}}
        return json.dumps(body, indent=2) + "\n"
    if fmt == "yaml":
        body = {"config": values, **{k: v for k, v in (evidence or {}).items() if k != "config"}}
        return "".join(f"# {h}\n" for h in header) + yaml.safe_dump(body, sort_keys=False)
    environment = (evidence or {}).get("environment") or {}
    blocks = environment.get("workload_block_types") or ()
    if fmt == "lightning":
        lines = _lightning(values, blocks)
    else:  # the HF mappings depend on where the config was measured (use_cpu)
        render = {"hf": _hf, "env": _env}.get(fmt)
        if render is None:
            unit = ((evidence or {}).get("measured") or {}).get("unit")
            lines = _torch(values, environment.get("device"), blocks, unit)
        else:
            lines = render(values, environment.get("device"), blocks)
    return "\n".join([*(f"# {h}" for h in header), *lines]) + "\n"


def _redacted(evidence: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """``evidence`` with the password of its study's storage URL redacted (a
    best_config.yaml written before autotune redacted it may hold one)."""
    study = (evidence or {}).get("study")
    if not isinstance(study, Mapping) or not isinstance(study.get("storage"), str):
        return evidence
    return {**evidence, "study": {**study, "storage": redact_url(study["storage"])}}


def load_best(
    path: str | Path, *, storage: str | None = None, study_name: str | None = None
) -> tuple[Config, dict[str, Any]]:
    """The recommended config and its evidence, from a best_config.yaml or a space file.

    A file with a ``workload:`` key is a space: its stored study's best trial is read.
    A file with a ``config:`` mapping is a ``best_config.yaml`` (or an exported yaml/json).

    Raises:
        AutotuneError: the file is neither, or the study has no feasible trial.
    """
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as e:
        raise AutotuneError(f"{path}: cannot read: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        raise AutotuneError(f"{path}: cannot read: {yaml_problem(e)}") from None
    if isinstance(data, dict) and "workload" in data:
        _, result = load_result(load_space(path), storage, study_name)
        if result.best is None:
            raise AutotuneError(
                f"study {result.study_name!r} has no feasible trial: nothing to export"
            )
        return result.best.config, recommendation(result)
    if isinstance(data, dict) and isinstance(data.get("config"), dict):
        evidence = {k: v for k, v in data.items() if k != "config"}
        return Config.from_dict(data["config"]), evidence
    raise AutotuneError(
        f"{path} must be a space file (with workload:) or a best_config.yaml "
        "(with config:) but has neither"
    )


def config_from_env(environ: Mapping[str, str] | None = None) -> Config:
    """Read back the ``AUTOTUNE_<KNOB>`` variables of an ``env`` export; others take defaults.

    Raises:
        AutotuneError: a variable holds a value its knob does not allow.
    """
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for name, knob in KNOBS.items():
        raw = environ.get(f"AUTOTUNE_{name.upper()}")
        if raw is None:
            continue
        if knob.kind == "bool" and raw.lower() in ("true", "false"):
            values[name] = raw.lower() == "true"
        elif knob.kind == "int" and raw.lstrip("-").isdigit():
            values[name] = int(raw)
        else:
            values[name] = raw
    return Config.from_dict(values)
