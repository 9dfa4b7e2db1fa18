"""`autotune run` on a Trainer and on a Lightning pair (the examples): the baseline trial is
the trainer's own settings, and the exported recommendation trains in the framework."""

from __future__ import annotations

import math
import sys
import textwrap
import warnings

import optuna
import pytest
import torch
from conftest import ROOT, run_cli

import autotune

EXAMPLES = ROOT / "examples"
sys.path.insert(0, str(EXAMPLES))


def _study(tmp_path, workload: str, args: str, knobs: str):
    """Run a two-trial study of ``workload`` through the CLI; the baseline trial's config,
    the recommendation's best_config.yaml and the run's output."""
    space = tmp_path / "space.yaml"
    space.write_text(
        textwrap.dedent(f"""
        workload: {EXAMPLES}/{workload}
        workload_args: {args}
        knobs: {knobs}
        trial: {{warmup_steps: 1, measured_steps: 2, timeout_s: 120, min_warmup_s: 0,
                 min_window_s: 0}}
        budget: {{n_trials: 2}}
        search: {{confirm_top: 0}}
        """)
    )
    run = run_cli("run", str(space), cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    study = optuna.load_study(study_name="space", storage=f"sqlite:///{tmp_path}/autotune.db")
    (baseline,) = [t for t in study.trials if t.user_attrs.get("role") == "baseline"]
    best = tmp_path / "autotune-runs/space/best_config.yaml"
    return baseline.user_attrs["config"], best, run.stdout


def _exported(best, fmt, tmp_path) -> dict:
    out = run_cli("export", str(best), "--format", fmt, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    namespace: dict = {}
    exec(out.stdout, namespace)  # the snippet as a user pastes it
    return namespace


def test_a_trainer_is_tuned_from_its_arguments_and_the_export_trains(tmp_path):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("datasets")
    import hf_trainer

    import autotune.hf

    baseline, best, stdout = _study(
        tmp_path, "hf_trainer.py:make_trainer", "{n: 96, hidden: 32}", "{batch_size: [16, 32]}"
    )
    trainer = hf_trainer.make_trainer(n=96, hidden=32, output_dir=str(tmp_path / "out"))
    own = autotune.hf.trainer_baseline(trainer.args)
    if not torch.cuda.is_available():
        own["pin_memory"] = False  # pinning needs CUDA: replaced, with a note
    assert {k: baseline[k] for k in own} == own
    assert (baseline["batch_size"], baseline["accumulation_steps"]) == (16, 2)  # not 32 x 1
    assert "note: baseline from the workload Trainer(BertForSequenceClassification)" in stdout
    assert "--format hf" in stdout.splitlines()[-1]  # the next step: the Trainer's export

    # The recommendation, as `autotune export --format hf` writes it, trained by the Trainer
    kwargs = _exported(best, "hf", tmp_path)["training_args_kwargs"]
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=2,
        report_to="none",
        save_strategy="no",
        **kwargs,
    )
    config = autotune.load_config(best)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every knob of this space has a field
        applied = autotune.hf.apply(trainer, config)  # and in code: the same fields
    assert {k: getattr(applied, k) for k in kwargs if k != "use_cpu"} == {
        k: getattr(args, k) for k in kwargs if k != "use_cpu"
    }
    assert args.per_device_train_batch_size == config.batch_size
    assert args.gradient_accumulation_steps == config.accumulation_steps
    run = transformers.Trainer(
        model=trainer.model,
        args=args,
        train_dataset=trainer.train_dataset,
        data_collator=trainer.data_collator,
    ).train()
    assert run.global_step == 2 and math.isfinite(run.training_loss)


def test_a_lightning_pair_is_tuned_from_its_loader_and_the_export_fits(tmp_path):
    pl = pytest.importorskip("lightning.pytorch")
    import lightning_module

    baseline, best, stdout = _study(
        tmp_path,
        "lightning_module.py:make_trainer",
        "{n: 512, width: 64}",
        "{batch_size: [32, 64]}",
    )
    # the data module's loader: batch 64 (the file's default would be 32), no workers
    assert (baseline["batch_size"], baseline["accumulation_steps"]) == (64, 1)
    assert (baseline["num_workers"], baseline["pin_memory"]) == (0, False)
    assert "note: baseline from the workload LightningModule(Classifier)" in stdout
    assert "--format lightning" in stdout.splitlines()[-1]  # the next step: Lightning's

    # The recommendation, as `autotune export --format lightning` writes it, fit by Lightning
    exported = _exported(best, "lightning", tmp_path)
    config = autotune.load_config(best)
    module, data = lightning_module.make_trainer(n=512, width=64)
    data.setup("fit")
    loader = torch.utils.data.DataLoader(
        data.train_set, shuffle=True, **exported["dataloader_kwargs"]
    )
    trainer = pl.Trainer(
        **exported["trainer_kwargs"],
        accelerator="cpu",
        max_steps=3,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, train_dataloaders=loader)
    assert trainer.global_step == 3
    assert trainer.accumulate_grad_batches == config.accumulation_steps
    assert loader.batch_size == config.batch_size
