"""The Hugging Face adapter with a real transformers model (random init, no download)."""

from __future__ import annotations

import pytest

transformers = pytest.importorskip("transformers")

from workloads import gpt2  # noqa: E402

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
