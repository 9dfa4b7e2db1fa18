"""Sampling conditional knobs, the fallback to unmeasured configs, and the fp32 reference
config (no trials run)."""

from __future__ import annotations

import random

import optuna

from autotune import Config
from autotune.space_file import parse_space
from autotune.study.sampling import encode as _encode
from autotune.study.sampling import every_config, neighbours, unmeasured
from autotune.study.sampling import sample as _sample
from autotune.study.tuner import reference_config


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


def _conditional_space():
    return parse_space(
        {
            "workload": "m:f",
            "knobs": {
                "batch_size": [8, 16, 32],
                "num_workers": [0, 1, 2],
                "prefetch_factor": [2, 4],
                "amp_dtype": ["fp32", "bf16"],
            },
            "baseline": {"batch_size": 16},
            "global_batch": 32,
        }
    )


def test_every_config_folds_inactive_knobs():
    space = _conditional_space()
    configs = every_config(space)
    # 3 batch sizes x 2 dtypes x (no workers | 2 worker counts x 2 prefetch factors)
    assert len(configs) == 3 * 2 * (1 + 2 * 2) == len({c.key() for c in configs})
    assert all(c.batch_size * c.accumulation_steps == 32 for c in configs)
    assert every_config(space, limit=10) is None  # 36 points in the product


def test_neighbours_move_one_knob_one_step():
    space = _conditional_space()
    config = Config(batch_size=16, accumulation_steps=2, num_workers=1, prefetch_factor=4)
    near = {
        (c.batch_size, c.num_workers, c.prefetch_factor, c.amp_dtype)
        for c in neighbours(space, config)
    }
    assert near == {
        (8, 1, 4, "fp32"),  # batch size down / up by one step, accumulation follows
        (32, 1, 4, "fp32"),
        (16, 0, 2, "fp32"),  # no workers: prefetch_factor is inactive, back at its default
        (16, 2, 4, "fp32"),
        (16, 1, 2, "fp32"),
        (16, 1, 4, "bf16"),
    }


def test_unmeasured_prefers_neighbours_of_the_best_then_random():
    space = _conditional_space()
    rng = random.Random(0)
    best = Config(batch_size=32, accumulation_steps=1)
    taken = {best.key()}
    config, how = unmeasured(space, [best], taken, rng)
    assert how == "neighbour" and config.key() in {c.key() for c in neighbours(space, best)}
    taken |= {c.key() for c in neighbours(space, best)}
    config, how = unmeasured(space, [best], taken, rng, every_config(space))
    assert how == "random" and config.key() not in taken
    everything = every_config(space)
    assert unmeasured(space, [best], {c.key() for c in everything}, rng, everything) is None
