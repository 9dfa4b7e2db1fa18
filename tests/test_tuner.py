"""Sampling conditional knobs and the fp32 reference config (no trials run)."""

from __future__ import annotations

import optuna

from autotune import Config
from autotune.sampling import encode as _encode
from autotune.sampling import sample as _sample
from autotune.space import parse_space
from autotune.tuner import reference_config


def test_sampled_configs_are_valid_and_inactive_knobs_are_not_params():
    space = parse_space(
        {
            "workload": "m:f",
            "knobs": {
                "num_workers": [0, 2],
                "prefetch_factor": [2, 4],
                "persistent_workers": [False, True],
                "compile_mode": ["off", "default"],
                "compile_fullgraph": [False, True],
                "jit": ["off", "script"],
                "gradient_checkpointing": [False, True],
                "checkpoint_every": [1, 2],
            },
            "baseline": {"num_workers": 2, "prefetch_factor": 4},
            "global_batch": "free",
        }
    )
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen = set()
    for _ in range(60):
        trial = study.ask()
        config = _sample(space, trial)  # Config validates every combination
        params = set(trial.params)
        assert ("prefetch_factor" in params) == (config.num_workers > 0)
        assert ("compile_fullgraph" in params) == (config.compile_mode != "off")
        no_ckpt = not config.gradient_checkpointing
        assert ("jit" in params) == (config.compile_mode == "off" and no_ckpt)
        assert ("checkpoint_every" in params) == config.gradient_checkpointing
        assert _encode(space, config) == trial.params  # ordinal knobs by index
        seen.add((config.num_workers, config.prefetch_factor))
        study.tell(trial, 1.0)
    # without workers the baseline's prefetch_factor goes back to PyTorch's default
    assert seen == {(0, 2), (2, 2), (2, 4)}


def test_reference_is_plain_fp32_eager():
    baseline = Config(
        amp_dtype="bf16",
        matmul_precision="high",
        compile_mode="default",
        compile_fullgraph=True,
        compile_dynamic="false",
        channels_last=True,
    )
    ref = reference_config(baseline)
    assert ref == Config(channels_last=True)
    assert reference_config(Config(jit="script")) == Config()
