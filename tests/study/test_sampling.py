"""Sampling conditional knobs, the fallback to unmeasured configs, and the fp32 reference
config (no trials run)."""

from __future__ import annotations

import csv
import io
import json
import random
import shutil
import wsgiref.util

import optuna
import pytest
from conftest import HERE
from optuna.distributions import CategoricalDistribution, IntDistribution

from autotune import Config
from autotune.space_file import load_space, parse_space
from autotune.study.reference import reference_config
from autotune.study.sampling import (
    ENCODING,
    INDEXES,
    VALUES,
    every_config,
    knob_of,
    make_sampler,
    neighbours,
    param,
    unmeasured,
)
from autotune.study.sampling import encode as _encode
from autotune.study.sampling import sample as _sample
from autotune.study.storage import open_study


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
        assert trial.params.items() <= _encode(space, config).items()
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
    # A sharded baseline is judged against one process with the same global batch.
    sharded = Config(batch_size=8, accumulation_steps=2, world_size=2, fsdp="blocks")
    assert reference_config(sharded) == Config(batch_size=8, accumulation_steps=4)
    assert reference_config(sharded, single=False) == sharded


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


def _encoding_space(sampler="tpe"):
    return parse_space(
        {
            "workload": "m:f",
            "knobs": {
                "batch_size": [16, 32, 64],  # not evenly spaced: searched by index
                "num_workers": [0, 2, 4],  # evenly spaced: searched as values
                "prefetch_factor": [2, 4],
                "amp_dtype": ["fp32", "bf16"],
            },
            "baseline": {"batch_size": 32},
            "global_batch": 64,
            "search": {"sampler": sampler, "seed": 0},
        }
    )


WANTED = Config(batch_size=64, num_workers=4, prefetch_factor=4)


def test_ordinal_params_keep_their_order_and_show_values_where_optuna_can():
    assert param("batch_size", (16, 32, 64)) == ("batch_size_index", IntDistribution(0, 2))
    assert param("num_workers", (0, 2, 4)) == ("num_workers", IntDistribution(0, 4, step=2))
    assert param("batch_size", (32, 64)) == ("batch_size", IntDistribution(32, 64, step=32))
    assert param("amp_dtype", ("fp32", "bf16")) == (
        "amp_dtype",
        CategoricalDistribution(("fp32", "bf16")),
    )
    # a study of an older autotune: a knob's name stays an index (0..n-1 are their own)
    assert param("batch_size", (32, 64), indexes=True)[0] == "batch_size_index"
    assert param("num_workers", (0, 1, 2), indexes=True)[0] == "num_workers"
    assert [knob_of(n) for n in ("batch_size_index", "num_workers", "x_index")] == [
        "batch_size",
        "num_workers",
        "x_index",
    ]


@pytest.mark.parametrize("encoding", [VALUES, INDEXES])
def test_enqueued_configs_come_back_in_either_encoding(encoding):
    space = _encoding_space()
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    study.set_user_attr(ENCODING, encoding)
    for config in every_config(space):
        study.enqueue_trial(_encode(space, config))
        trial = study.ask()
        assert _sample(space, trial).key() == config.key()
        assert trial.user_attrs["batch_size"] == config.batch_size
        assert ("num_workers" in trial.params) == (encoding == VALUES)
        study.tell(trial, 1.0)


def _ask_and_tell(space, study, n):
    configs = []
    for _ in range(n):
        trial = study.ask()
        configs.append(_sample(space, trial))
        study.tell(trial, 1.0)
    return configs


def _get(app, path):
    environ = {}
    wsgiref.util.setup_testing_defaults(environ)
    environ["PATH_INFO"] = path
    status = []
    body = b"".join(app(environ, lambda s, headers, exc_info=None: status.append(s)))
    assert status[0].startswith("200"), (status, body[:300])
    return body.decode()


def test_optuna_dashboard_shows_knob_values(tmp_path):
    dashboard = pytest.importorskip("optuna_dashboard")
    space = _encoding_space()
    storage = f"sqlite:///{tmp_path}/s.db"
    study = open_study(space, storage, "s", make_sampler(space))
    study.enqueue_trial(_encode(space, WANTED))
    _ask_and_tell(space, study, 5)

    app = dashboard.wsgi(storage)
    (listed,) = json.loads(_get(app, "/api/studies"))["study_summaries"]
    detail = json.loads(_get(app, f"/api/studies/{listed['study_id']}"))
    first = detail["trials"][0]
    params = {p["name"]: p["param_external_value"] for p in first["params"]}
    assert params == {
        "batch_size_index": "2",  # the name says it is an index...
        "num_workers": "4",  # ...evenly spaced values are themselves
        "prefetch_factor": "4",
        "amp_dtype": "fp32",
    }
    attrs = {a["key"]: a["value"] for a in first["user_attrs"]}
    assert attrs["batch_size"] == "64"  # ...and the value is next to it
    # a numeric user attr is a sortable column of the dashboard's trial table
    assert {"key": "batch_size", "sortable": True} in detail["union_user_attrs"]

    rows = list(csv.DictReader(io.StringIO(_get(app, f"/csv/{listed['study_id']}"))))
    assert "Param batch_size" not in rows[0]
    assert (rows[0]["Param num_workers"], rows[0]["UserAttribute batch_size"]) == ("4", "64")


def test_trials_dataframe_shows_knob_values(tmp_path):
    pytest.importorskip("pandas")
    space = _encoding_space()
    study = open_study(space, f"sqlite:///{tmp_path}/s.db", "s", make_sampler(space))
    study.enqueue_trial(_encode(space, WANTED))
    configs = _ask_and_tell(space, study, 6)
    df = study.trials_dataframe()
    assert "params_batch_size" not in df
    first = df.iloc[0]
    assert (first["params_batch_size_index"], first["user_attrs_batch_size"]) == (2, 64)
    assert (first["params_num_workers"], first["params_prefetch_factor"]) == (4, 4)
    assert list(df["user_attrs_batch_size"]) == [c.batch_size for c in configs]
    assert list(df["params_num_workers"]) == [c.num_workers for c in configs]
    # reopened (a resumed run): still the values encoding
    again = open_study(space, f"sqlite:///{tmp_path}/s.db", "s", make_sampler(space))
    assert again.user_attrs[ENCODING] == VALUES


def _distributions_by_name(study):
    seen = {}
    for t in study.get_trials(deepcopy=False):
        for name, dist in t.distributions.items():
            seen.setdefault(name, set()).add(repr(dist))
    return seen


@pytest.mark.parametrize("sampler", ["tpe", "grid"])
def test_a_study_of_an_older_autotune_keeps_indexes_under_knob_names(tmp_path, sampler):
    """Such a study stored every ordinal knob's index under the knob's own name: resumed,
    num_workers (0, 2, 4) is searched as num_workers_index, not as values under the
    name whose stored params are indexes."""
    space = _encoding_space(sampler)
    storage = f"sqlite:///{tmp_path}/old.db"
    old = optuna.create_study(study_name="old", storage=storage, direction="maximize")
    old.set_user_attr("space_fingerprint", space.fingerprint())
    old.add_trial(
        optuna.trial.create_trial(
            value=1.0,
            params={"batch_size": 1, "num_workers": 2, "prefetch_factor": 1, "amp_dtype": "fp32"},
            distributions={
                "batch_size": IntDistribution(0, 2),
                "num_workers": IntDistribution(0, 2),
                "prefetch_factor": IntDistribution(0, 1),
                "amp_dtype": CategoricalDistribution(("fp32", "bf16")),
            },
        )
    )
    study = open_study(space, storage, "old", make_sampler(space))
    assert study.user_attrs[ENCODING] == INDEXES
    study.enqueue_trial(_encode(space, WANTED))
    trial = study.ask()
    assert _sample(space, trial).key() == WANTED.key()
    assert set(trial.params) == {
        "batch_size_index",
        "num_workers_index",
        "prefetch_factor_index",
        "amp_dtype",
    }
    study.tell(trial, 1.0)
    _ask_and_tell(space, study, 4)  # the grid sampler's configs have the same names
    assert all(len(d) == 1 for d in _distributions_by_name(study).values())


def test_the_first_release_study_resumes_without_renaming_its_params(tmp_path):
    fixture = HERE / "fixtures" / "legacy_study"
    shutil.copy(fixture / "legacy.db", tmp_path / "legacy.db")
    space = load_space(fixture / "space.yaml")
    storage = f"sqlite:///{tmp_path}/legacy.db"
    study = open_study(space, storage, "legacy", make_sampler(space))
    assert study.user_attrs[ENCODING] == INDEXES
    trial = study.ask()
    config = _sample(space, trial)
    # batch_size (16, 32, 64) by index under a new name; num_workers (0, 1) as before
    assert set(trial.params) == {"batch_size_index", "num_workers"}
    assert trial.user_attrs["batch_size"] == config.batch_size
    assert all(len(d) == 1 for d in _distributions_by_name(study).values())
