"""The hf and lightning exports run by the frameworks themselves: a Trainer trains with the
exported TrainingArguments, Lightning fits with the exported kwargs on 2 gloo processes
(DDP), and accelerate builds its FSDP2 plugin from the exported fsdp_config."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from conftest import ROOT

from autotune import Config, export_config

EXAMPLES = ROOT / "examples"
sys.path.insert(0, str(EXAMPLES))
CPU = {"environment": {"device": "cpu", "workload_block_types": ["BertLayer"]}}


def _snippet(config: Config, fmt: str) -> dict:
    namespace: dict = {}
    exec(export_config(config, fmt, evidence=CPU), namespace)
    return namespace


def test_the_hf_export_trains_a_trainer_with_every_field_it_sets(tmp_path):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("datasets")
    import hf_trainer

    config = Config(
        batch_size=4,
        accumulation_steps=2,
        amp_dtype="bf16",
        num_workers=1,
        prefetch_factor=4,
        gradient_checkpointing=True,
        length_grouping="grouped",
        matmul_precision="high",
    )
    kwargs = _snippet(config, "hf")["training_args_kwargs"]
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), max_steps=2, report_to="none", save_strategy="no", **kwargs
    )
    tok = hf_trainer.tokenizer()
    model = transformers.BertForSequenceClassification(
        transformers.BertConfig(
            vocab_size=tok.vocab_size,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            num_labels=2,
        )
    )
    trainer = transformers.Trainer(
        model=model,
        args=args,
        train_dataset=hf_trainer.dataset(tok, 48),
        data_collator=transformers.DataCollatorWithPadding(tok),
    )
    assert type(trainer._get_train_sampler()).__name__ == "LengthGroupedSampler"
    loader = trainer.get_train_dataloader()
    assert (loader.num_workers, loader.prefetch_factor) == (1, 4)
    run = trainer.train()
    assert run.global_step == 2
    assert trainer.accelerator.mixed_precision == "bf16"
    assert model.is_gradient_checkpointing
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps) == (4, 2)


def test_the_hf_fsdp_export_is_an_fsdp2_plugin_accelerate_accepts(tmp_path):
    """accelerate builds the plugin the Trainer would; it shards only on GPUs (on a CPU
    Trainer the fsdp settings are accepted and DDP runs, which the export says)."""
    transformers = pytest.importorskip("transformers")
    accelerate = pytest.importorskip("accelerate")
    config = Config(batch_size=4, world_size=2, fsdp="blocks", fsdp_reshard_after_forward=False)
    text = export_config(config, "hf", evidence=CPU)
    assert "accelerate (1.16) shards only on GPUs" in text
    namespace: dict = {}
    exec(text, namespace)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), report_to="none", **namespace["training_args_kwargs"]
    )
    plugin = accelerate.utils.FullyShardedDataParallelPlugin(**args.fsdp_plugin_args)
    assert plugin.fsdp_version == 2 and plugin.reshard_after_forward is False
    assert plugin.transformer_cls_names_to_wrap == ["BertLayer"]
    assert plugin.auto_wrap_policy.__name__ == "transformer_auto_wrap_policy"
    root = Config(batch_size=4, world_size=2, fsdp="root")
    namespace = {}
    exec(export_config(root, "hf", evidence=CPU), namespace)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), report_to="none", **namespace["training_args_kwargs"]
    )
    plugin = accelerate.utils.FullyShardedDataParallelPlugin(**args.fsdp_plugin_args)
    assert plugin.fsdp_version == 2 and plugin.auto_wrap_policy is None  # NO_WRAP


DDP_SCRIPT = """
import json, pathlib, sys
sys.path.insert(0, {examples!r})
import lightning.pytorch as pl
import torch
import lightning_module

{snippet}
seen = {{}}


class Wrapped(pl.Callback):  # the model as DDP wraps it during fit (unwrapped after)
    def on_train_batch_end(self, trainer, *args):
        ddp = trainer.strategy.model
        seen.update(
            ddp=type(ddp).__name__,
            bucket_bytes=ddp.bucket_bytes_cap,
            bucket_view=ddp.gradient_as_bucket_view,
        )


pl.seed_everything(0)
module, data = lightning_module.make_trainer(n=256, width=32)
data.setup("fit")
loader = torch.utils.data.DataLoader(data.train_set, shuffle=True, **dataloader_kwargs)
trainer = pl.Trainer(
    **trainer_kwargs, accelerator="cpu", max_steps=3, logger=False,
    enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    callbacks=[Wrapped()],
)
trainer.fit(module, train_dataloaders=loader)
# One file per rank: the two ranks share the parent's stdout, where their lines can
# interleave (seen once in CI: two results on one line).
pathlib.Path(f"result-{{trainer.global_rank}}.json").write_text(json.dumps({{
    **seen,
    "rank": trainer.global_rank,
    "world": trainer.world_size,
    "steps": trainer.global_step,
    "accumulate": trainer.accumulate_grad_batches,
    "precision": trainer.precision,
    "backend": trainer.strategy._process_group_backend,
    "weights": float(sum(p.double().sum() for p in module.parameters())),
}}))
"""


def test_the_lightning_export_fits_with_ddp_on_two_gloo_processes(tmp_path):
    pytest.importorskip("lightning.pytorch")
    config = Config(
        batch_size=8,
        accumulation_steps=2,
        amp_dtype="bf16",
        world_size=2,
        ddp_bucket_cap_mb=1,
        ddp_gradient_as_bucket_view=True,
        ddp_static_graph=True,  # not exported with accumulation: its no_sync would fail
    )
    snippet = export_config(config, "lightning", evidence=CPU)
    script = tmp_path / "fit.py"
    script.write_text(textwrap.dedent(DDP_SCRIPT).format(examples=str(EXAMPLES), snippet=snippet))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MASTER_PORT": "29517"}
    run = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    results = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("result-*.json"))]
    assert sorted(r["rank"] for r in results) == [0, 1]
    for r in results:
        assert (r["world"], r["steps"], r["accumulate"]) == (2, 3, 2)
        assert (r["ddp"], r["backend"], r["precision"]) == (
            "DistributedDataParallel",
            "gloo",
            "bf16-mixed",
        )
        assert r["bucket_bytes"] == 1024 * 1024 and r["bucket_view"] is True
    assert results[0]["weights"] == results[1]["weights"]  # gradients were all-reduced
