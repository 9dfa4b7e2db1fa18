"""Export formats: every format carries a known config's values; nothing is dropped."""

from __future__ import annotations

import inspect
import json
import os
import shlex
import subprocess
import sys

import pytest
import torch
from conftest import ROOT

from autotune import Config, config_from_env, export_config, load_config
from autotune.frameworks.mapping import hf_training_arguments, lightning_kwargs
from autotune.knobs import KNOBS
from autotune.output.export import FORMATS, load_best

KNOWN = Config(
    batch_size=64,
    accumulation_steps=2,
    amp_dtype="bf16",
    num_workers=2,
    compile_mode="max-autotune",
    gradient_checkpointing=True,
)

# transformers.TrainingArguments fields this exporter may emit, as documented in
# transformers' src/transformers/training_args.py (TrainingArguments docstring, 4.36+ and 5.x:
# "Mixed Precision Training", "Dataloader", "Compilation", "Gradient Checkpointing",
# "Optimizer" sections). The dev extras install transformers, accelerate and Lightning, so
# the tests also check the real dataclasses and build TrainingArguments and a Trainer; where
# one is missing, that check is skipped visibly (pytest.importorskip), never passed.
HF_DOCUMENTED_FIELDS = {
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "bf16",
    "fp16",
    "tf32",
    "dataloader_num_workers",
    "dataloader_pin_memory",
    "dataloader_persistent_workers",
    "dataloader_prefetch_factor",
    "torch_compile",
    "torch_compile_mode",
    "gradient_checkpointing",
    "optim",
    "use_cpu",
}
# lightning.pytorch.Trainer(...) arguments used (Lightning 2.x Trainer API reference).
LIGHTNING_TRAINER_ARGS = {"precision", "accumulate_grad_batches", "benchmark"}
LIGHTNING_PRECISIONS = {"32-true", "bf16-mixed", "16-mixed"}

# The knobs another branch is adding to Config, with one value each.
FUTURE = {
    "pin_memory": True,
    "persistent_workers": True,
    "prefetch_factor": 4,
    "non_blocking": True,
    "matmul_precision": "high",
    "channels_last": True,
    "sdpa_backend": "flash",
    "optimizer_impl": "fused",
    "zero_grad_set_to_none": True,
    "jit": "off",
    "compile_dynamic": "auto",
    "compile_fullgraph": False,
    "num_threads": 4,
    "interop_threads": 0,
    "checkpoint_every": 2,
}


# Knobs the HF mapping always expresses as TrainingArguments fields (prefetch_factor only
# with workers; the FSDP knobs only with fsdp).
HF_EXPRESSED = {
    "batch_size",
    "accumulation_steps",
    "amp_dtype",
    "num_workers",
    "pin_memory",
    "persistent_workers",
    "compile_mode",
    "matmul_precision",
    "gradient_checkpointing",
    "optimizer_impl",
    "length_grouping",
}


def _at_default(values: dict) -> set[str]:
    """The knobs of ``values`` at autotune's default value."""
    return {k for k, v in values.items() if k in KNOBS and v == KNOBS[k].default}


@pytest.mark.parametrize("fmt", ["hf", "lightning", "env"])
def test_an_export_lists_only_what_differs_from_the_defaults(fmt):
    """One knob off its default: the export's 'no equivalent' list names nothing else (a
    knob at its default needs nothing set; 25 lines of them buried the one that matters)."""
    text = export_config(Config(channels_last=True), fmt)
    listed = [ln for ln in text.splitlines() if ln.lstrip("# ").split("=")[0] in KNOBS]
    assert [ln.lstrip("# ").split("=")[0] for ln in listed] == ["channels_last"], text
    assert "nothing to set" not in text


@pytest.mark.parametrize("fmt", ["yaml", "json"])
def test_yaml_and_json_load_back_to_the_same_config(fmt, tmp_path):
    path = tmp_path / f"best.{fmt}"
    path.write_text(export_config(KNOWN, fmt, evidence={"measured": {"trial": 3}}))
    assert load_config(path) == KNOWN
    assert load_best(path)[1]["measured"]["trial"] == 3


def test_hf_kwargs_carry_the_values_under_documented_names(tmp_path):
    text = export_config(KNOWN, "hf")
    ns: dict = {}
    exec(text, ns)  # the snippet is valid Python
    kw = ns["training_args_kwargs"]
    assert kw == hf_training_arguments(KNOWN.to_dict()).kwargs["TrainingArguments"]
    assert set(kw) <= HF_DOCUMENTED_FIELDS
    assert kw["per_device_train_batch_size"] == 64 and kw["gradient_accumulation_steps"] == 2
    assert kw["bf16"] is True and kw["fp16"] is False
    assert kw["dataloader_num_workers"] == 2 and kw["dataloader_pin_memory"] is False
    assert kw["torch_compile"] is True and kw["torch_compile_mode"] == "max-autotune"
    assert kw["gradient_checkpointing"] is True
    assert "cudnn_benchmark" not in text  # at its default: nothing to set, not listed
    transformers = pytest.importorskip("transformers")
    fields = {f.name for f in __import__("dataclasses").fields(transformers.TrainingArguments)}
    assert set(kw) <= fields
    # Built for real as measured here: on a GPU, or on the CPU with use_cpu (bf16 is refused
    # on a CPU without it).
    device = "cuda" if torch.cuda.is_available() else "cpu"
    kw = hf_training_arguments(KNOWN.to_dict(), device).kwargs["TrainingArguments"]
    assert set(kw) <= fields
    pytest.importorskip("accelerate")  # TrainingArguments needs it
    args = transformers.TrainingArguments(output_dir=str(tmp_path), **kw)
    assert args.per_device_train_batch_size == 64 and args.gradient_accumulation_steps == 2
    assert args.bf16 and args.torch_compile_mode == "max-autotune"
    assert args.device.type == device


def test_hf_export_of_a_cpu_measured_config_keeps_the_trainer_on_the_cpu():
    text = export_config(KNOWN, "hf", evidence={"environment": {"device": "cpu"}})
    ns: dict = {}
    exec(text, ns)
    assert ns["training_args_kwargs"]["use_cpu"] is True
    assert "measured on the CPU: use_cpu=True" in text
    gpu = export_config(KNOWN, "hf", evidence={"environment": {"device": "cuda"}})
    assert "use_cpu" not in gpu
    env = export_config(KNOWN, "env", evidence={"environment": {"device": "cpu"}})
    assert "--use_cpu True" in env


def test_lightning_kwargs_carry_the_values_and_the_dataloader_accepts_them():
    text = export_config(KNOWN, "lightning")
    ns: dict = {}
    exec(text, ns)
    trainer, loader = ns["trainer_kwargs"], ns["dataloader_kwargs"]
    assert trainer == {"precision": "bf16-mixed", "accumulate_grad_batches": 2, "benchmark": False}
    assert set(trainer) <= LIGHTNING_TRAINER_ARGS and trainer["precision"] in LIGHTNING_PRECISIONS
    assert loader == {
        "batch_size": 64,
        "num_workers": 2,
        "pin_memory": False,
        "persistent_workers": False,
        "prefetch_factor": 2,
    }
    dl = torch.utils.data.DataLoader(list(range(8)), **loader)
    assert (dl.batch_size, dl.num_workers) == (64, 2)
    # compile and checkpointing are not Trainer arguments: said so, with how to do it
    assert "compile_mode='max-autotune': no equivalent in Trainer arguments" in text
    assert "torch.compile(model, mode='max-autotune')" in text
    assert "gradient_checkpointing=True: no equivalent" in text
    Trainer = pytest.importorskip("lightning.pytorch").Trainer  # the Trainer takes them
    t = Trainer(**trainer, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    assert t.accumulate_grad_batches == 2


def test_env_fragment_reads_back_to_the_same_config():
    text = export_config(KNOWN, "env")
    env = {}
    for line in text.splitlines():
        if line.startswith("export "):
            name, _, value = line.removeprefix("export ").partition("=")
            env[name] = shlex.split(value)[0]
    assert config_from_env(env) == KNOWN
    flags = shlex.split(env["AUTOTUNE_HF_ARGS"])
    assert flags[flags.index("--per_device_train_batch_size") + 1] == "64"
    assert flags[flags.index("--bf16") + 1] == "True"


def test_future_and_unknown_knobs_are_mapped_or_listed_never_dropped():
    values = {**KNOWN.to_dict(), **FUTURE, "brand_new_knob": 7}
    for mapped in (hf_training_arguments(values), lightning_kwargs(values)):
        # a knob is expressed under a target name or listed; count each knob once
        listed = set(mapped.no_equivalent)
        assert "brand_new_knob" in listed
        assert mapped.no_equivalent["brand_new_knob"].startswith("7: no equivalent")
        assert "channels_last" in listed and "sdpa_backend" in listed
    hf = hf_training_arguments(values)
    kw = hf.kwargs["TrainingArguments"]
    assert set(kw) <= HF_DOCUMENTED_FIELDS
    assert kw["dataloader_pin_memory"] is True and kw["dataloader_persistent_workers"] is True
    assert kw["dataloader_prefetch_factor"] == 4 and kw["tf32"] is True
    assert kw["optim"] == "adamw_torch_fused"
    expressed = HF_EXPRESSED | {"prefetch_factor"}
    assert set(values) - _at_default(values) <= expressed | set(hf.no_equivalent)
    assert not set(hf.no_equivalent) & _at_default(values)
    medium = hf_training_arguments({**values, "matmul_precision": "medium"})
    assert "tf32" not in medium.kwargs["TrainingArguments"]
    assert "set_float32_matmul_precision('medium')" in medium.no_equivalent["matmul_precision"]
    lt = lightning_kwargs(values)
    assert lt.kwargs["DataLoader"]["prefetch_factor"] == 4
    torch.utils.data.DataLoader(list(range(8)), **lt.kwargs["DataLoader"])
    assert set(inspect.signature(torch.utils.data.DataLoader).parameters) >= set(
        lt.kwargs["DataLoader"]
    )


def _cli(*args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "autotune", *args],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_export_from_a_study_and_from_best_config(small_study, tmp_path):
    space, storage, runs, result = small_study
    best = result.best.config
    r = _cli("export", str(space.source), "--storage", storage, "-f", "hf", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert f"'per_device_train_batch_size': {best.batch_size}," in r.stdout
    assert f"trial #{result.best.number} of study {space.study.name}" in r.stdout
    out = tmp_path / "best.json"
    r = _cli("export", str(result.best_config_path), "-f", "json", "-o", str(out), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert load_config(out) == best
    for fmt in FORMATS:
        r = _cli("export", str(result.best_config_path), "--format", fmt, cwd=tmp_path)
        assert r.returncode == 0, (fmt, r.stderr)
        if fmt == "json":  # JSON has no comments: the evidence is data
            assert json.loads(r.stdout)["measured"]["trial"] == result.best.number
        else:
            assert r.stdout.startswith(f"# autotune: trial #{result.best.number} "), fmt


def test_cli_export_mistakes_are_one_line_and_exit_1(small_study, tmp_path):
    result = small_study[3]
    other = tmp_path / "other.yaml"
    other.write_text("just: a mapping\n")
    for args, message in [
        ((str(result.best_config_path), "-f", "toml"), "format must be one of yaml, json"),
        ((str(tmp_path / "missing.yaml"), "-f", "toml"), "format must be one of"),  # first
        ((str(other),), "must be a space file (with workload:) or a best_config.yaml"),
        ((str(tmp_path / "missing.yaml"),), "cannot read"),
    ]:
        r = _cli("export", *args, cwd=tmp_path)
        assert r.returncode == 1 and message in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1


def test_hf_export_maps_length_grouping_and_lists_the_other_layout_knobs():
    values = Config(length_grouping="grouped").to_dict()
    mapped = hf_training_arguments(values)
    assert mapped.kwargs["TrainingArguments"]["train_sampling_strategy"] == "group_by_length"
    packed = hf_training_arguments({**Config().to_dict(), "packing": "packed"})
    assert "SFTConfig(packing=True)" in packed.no_equivalent["packing"]
    padded = hf_training_arguments(Config(pad_to_multiple_of=64).to_dict())
    assert "pad_to_multiple_of=64" in padded.no_equivalent["pad_to_multiple_of"]
    transformers = pytest.importorskip("transformers")
    fields = {f.name for f in __import__("dataclasses").fields(transformers.TrainingArguments)}
    assert set(mapped.kwargs["TrainingArguments"]) <= fields


def test_sharded_configs_map_to_fsdp2_settings_and_strategies():
    fsdp = Config(
        batch_size=8,
        world_size=2,
        fsdp="blocks",
        fsdp_reshard_after_forward=False,
        fsdp_param_dtype="bf16",
        amp_dtype="bf16",
    )
    blocks = ["LlamaDecoderLayer"]
    hf = hf_training_arguments(fsdp.to_dict(), "cuda", blocks)
    kw = hf.kwargs["TrainingArguments"]
    assert kw["fsdp"] is True
    assert kw["fsdp_config"] == {
        "version": 2,
        "reshard_after_forward": False,
        "cpu_offload": False,
        "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"],
    }
    # what TrainingArguments cannot say is listed, with how to do it
    assert "MixedPrecisionPolicy(param_dtype=" in hf.no_equivalent["fsdp_param_dtype"]
    assert "torchrun --nproc-per-node=2" in hf.no_equivalent["world_size"]
    values = fsdp.to_dict()
    assert set(values) - _at_default(values) <= set(hf.no_equivalent) | HF_EXPRESSED | {
        "fsdp",
        "fsdp_reshard_after_forward",
        "fsdp_cpu_offload",
    }
    assert not set(hf.no_equivalent) & _at_default(values)
    transformers = pytest.importorskip("transformers")
    fields = {f.name for f in __import__("dataclasses").fields(transformers.TrainingArguments)}
    assert set(kw) <= fields
    root = hf_training_arguments(fsdp.replace(fsdp="root").to_dict(), "cuda")
    assert root.kwargs["TrainingArguments"]["fsdp_config"]["auto_wrap_policy"] == "NO_WRAP"

    lt = lightning_kwargs(fsdp.to_dict(), blocks)
    assert lt.kwargs["Trainer"]["devices"] == 2
    assert repr(lt.kwargs["Trainer"]["strategy"]) == "FSDPStrategy(**strategy_kwargs)"
    strategy = lt.kwargs["FSDPStrategy"]
    assert strategy["sharding_strategy"] == "SHARD_GRAD_OP"  # no reshard after forward
    assert repr(strategy["auto_wrap_policy"]) == "{LlamaDecoderLayer}"
    assert repr(strategy["mixed_precision"]) == (
        "MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)"
    )
    text = export_config(
        fsdp, "lightning", evidence={"environment": {"workload_block_types": blocks}}
    )
    assert "from lightning.pytorch.strategies import FSDPStrategy" in text
    assert "'auto_wrap_policy': {LlamaDecoderLayer}," in text
    assert "FSDPStrategy runs FSDP1" in text  # the difference is said, not hidden
    compile(text, "lightning.py", "exec")  # valid Python

    ddp = Config(batch_size=8, world_size=2, ddp_bucket_cap_mb=50, ddp_static_graph=True)
    kw = hf_training_arguments(ddp.to_dict()).kwargs["TrainingArguments"]
    assert kw["ddp_bucket_cap_mb"] == 50 and kw["ddp_static_graph"] is True
    lt = lightning_kwargs(ddp.to_dict())
    assert lt.kwargs["DDPStrategy"] == {
        "bucket_cap_mb": 50,
        "gradient_as_bucket_view": False,
        "static_graph": True,
    }
    # A trainer accumulates under no_sync, which fails with a static graph: not exported
    accumulating = Config(
        batch_size=8,
        accumulation_steps=2,
        world_size=2,
        ddp_bucket_cap_mb=50,
        ddp_static_graph=True,
    ).to_dict()
    for mapped, section in (
        (hf_training_arguments(accumulating), "TrainingArguments"),
        (lightning_kwargs(accumulating), "DDPStrategy"),
    ):
        assert "ddp_static_graph" not in mapped.kwargs[section]
        assert "static_graph" not in mapped.kwargs[section]
        assert mapped.kwargs[section].get("ddp_bucket_cap_mb", 50) == 50
        assert "no_sync fails under a static graph" in mapped.no_equivalent["ddp_static_graph"]
        assert "with gradient accumulation" in mapped.no_equivalent["ddp_static_graph"]
    torch_text = export_config(accumulating, "torch")
    assert "static_graph=True," in torch_text and "(no model.no_sync())" in torch_text
    assert "no_sync" not in export_config(ddp, "torch")  # one micro-batch: nothing to skip
    # the env export writes the FSDP config file HfArgumentParser reads
    env = export_config(fsdp, "env")
    assert "> fsdp_config.json" in env and "--fsdp_config fsdp_config.json" in env


def test_torch_export_of_a_single_process_config_names_the_batch():
    text = export_config(Config(accumulation_steps=4, compile_mode="default"), "torch")
    compile(text, "train.py", "exec")
    assert "# batch_size=32: DataLoader(batch_size=32)" in text  # the default, still said
    assert "# accumulation_steps=4: step the optimizer every 4 micro-batches" in text
    assert "torch.compile(model, mode=...)" in text
    assert "fully_shard" not in text and "init_process_group" not in text


def test_exports_say_how_a_token_step_weighs_its_micro_batches():
    """The torch export writes token-weighted accumulation (as autotune.apply does) for a
    token workload's config of several micro-batches; the hf export says the Trainer does
    it itself; a config measured in samples, or of one micro-batch, gets neither."""
    config = Config(batch_size=16, accumulation_steps=4)
    tokens = {"measured": {"unit": "tokens"}}
    text = export_config(config, "torch", evidence=tokens)
    compile(text, "train.py", "exec")
    assert "loss_i * n_i * world_size / N" in text
    assert "n_i" not in export_config(config, "torch", evidence={"measured": {"unit": "samples"}})
    assert "n_i" not in export_config(Config(batch_size=64), "torch", evidence=tokens)
    assert "num_items_in_batch" in export_config(config, "hf")
    assert "num_items_in_batch" not in export_config(Config(batch_size=64), "hf")


@pytest.mark.parametrize("fsdp", ["off", "root"])
@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_a_two_rank_step_of_one_micro_batch_each_is_token_weighted(fsdp, device):
    """Two ranks of one micro-batch each are a step of two micro-batches: DDP and FSDP
    average the ranks' gradients, so a token workload's export weighs each rank's loss by
    its share of the step's tokens (counted over the ranks), as autotune's trials did."""
    config = Config(batch_size=8, world_size=2, fsdp=fsdp)
    assert config.accumulation_steps == 1
    evidence = {"measured": {"unit": "tokens"}, "environment": {"device": device}}
    text = export_config(config, "torch", evidence=evidence)
    compile(text, "train.py", "exec")
    assert "torchrun --nproc-per-node=2" in text
    assert "N = their sum (dist.all_reduce over the ranks)" in text
    assert "loss_i * n_i * world_size / N" in text
    # the same step measured in samples: each rank's mean, as DDP/FSDP average them
    samples = {**evidence, "measured": {"unit": "samples"}}
    assert "n_i" not in export_config(config, "torch", evidence=samples)
