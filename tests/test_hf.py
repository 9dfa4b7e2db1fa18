"""The Hugging Face adapter with a real transformers model (random init, no download)."""

from __future__ import annotations

import pytest

transformers = pytest.importorskip("transformers")

from workloads import Texts, gpt2  # noqa: E402

from autotune import Config, load_space  # noqa: E402
from autotune.study.runner import probe, run_trial  # noqa: E402
from autotune.trial.apply import apply_workload  # noqa: E402


def test_the_model_loss_trains_and_tokens_come_from_the_mask():
    applied = apply_workload(
        Config(batch_size=8, accumulation_steps=2), gpt2(), device="cpu", endless=True
    )
    batches = iter(applied.loader)
    losses = [float(applied.train_step(batches)) for _ in range(12)]
    assert losses[-1] < losses[0]  # outputs.loss over the labels autotune built
    assert 0 < applied.real_tokens < applied.positions


def test_gradient_checkpointing_uses_the_models_own(write_space, tmp_path):
    applied = apply_workload(Config(gradient_checkpointing=True), gpt2(), device="cpu")
    model = applied.model
    assert getattr(model, "is_activation_checkpointing", None) or model.is_gradient_checkpointing
    space = load_space(
        write_space("""
        workload: {workloads}:gpt2
        knobs: {gradient_checkpointing: [false, true], batch_size: [8]}
        trial: {warmup_steps: 1, measured_steps: 3}
    """)
    )
    caps = probe(space, tmp_path / "probe")["capabilities"]
    assert caps["workload_blocks"] == 1 and caps["tokens"] and caps["token_collate"]
    m = run_trial(space, space.config_from({"gradient_checkpointing": True}), tmp_path / "t")
    assert m.ok, m.reason
    assert m.unit == "tokens" and m.tokens_per_s and 0 < m.padding_share < 1


def test_a_tokenized_datasets_dataset_in_torch_format_is_the_dataset():
    datasets = pytest.importorskip("datasets")
    import autotune.hf

    texts = Texts([5, 17, 9, 30, 12, 8, 21, 6] * 4)
    ds = datasets.Dataset.from_dict({"input_ids": [texts[i]["input_ids"] for i in range(32)]})
    ds.set_format("torch")
    assert isinstance(ds[0]["input_ids"], __import__("torch").Tensor)
    model = gpt2().model  # the same random-init GPT-2, over the datasets.Dataset
    workload = autotune.hf.workload(model=model, dataset=lambda: ds, pad_id=0)
    applied = apply_workload(Config(batch_size=8), workload, device="cpu", endless=True)
    batches = iter(applied.loader)
    losses = [float(applied.train_step(batches)) for _ in range(4)]
    assert all(0 < loss < 10 for loss in losses)
    # 4 steps of 8 samples: the whole dataset once, each sample's real tokens counted
    assert applied.real_tokens == sum(texts.lengths)
