"""Property-based: whatever YAML arrives, the loader raises only SpaceError."""

from __future__ import annotations

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autotune import SpaceError, load_space
from autotune.space import Space

VALID = """\
workload: pkg.mod:build
workload_args: {width: 32}
device: auto
knobs:
  batch_size: [16, 32, 64]
  amp_dtype: [fp32, bf16]
  num_workers: [0, 1]
  compile_mode: ["off", default]
baseline: {batch_size: 32}
global_batch: 64
limits: {memory: 0.5, accuracy: {tolerance: 0.05, last_k: 3}}
trial: {warmup_steps: 2, measured_steps: 5, timeout_s: 60, memory_cap: 2GiB,
        planned_samples: 100000, cost_per_hour: 2.5, energy_price_per_kwh: 0.3,
        objective: energy}
budget: {n_trials: 4}
study: {name: x, storage: "sqlite:///x.db", heartbeat_s: 5}
search: {sampler: tpe, seed: 0, prune: true, confirm_top: 1}
"""

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True),
    st.text(max_size=12),
    st.sampled_from(["off", "free", "fp16", "default", "6GiB", "m:f"]),
)
values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.one_of(st.text(max_size=10), st.integers()), children, max_size=4),
    ),
    max_leaves=12,
)
keys = st.sampled_from(
    [
        "workload",
        "workload_args",
        "device",
        "knobs",
        "baseline",
        "global_batch",
        "limits",
        "trial",
        "budget",
        "study",
        "output_dir",
        "batch_size",
        "amp_dtype",
        "memory",
        "accuracy",
        "n_trials",
        "tolerance",
        "compile_mode",
        "planned_tokens",
        "cost_per_hour",
        "energy_price_per_kwh",
        "objective",
        "extra",
    ]
)


def _load(tmp_path, text: str) -> None:
    path = tmp_path / "fuzz.yaml"
    path.write_text(text)
    try:
        assert isinstance(load_space(path), Space)
    except SpaceError as e:
        assert str(e)  # a message, never an empty error


FUZZ = settings(
    max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@FUZZ
@given(doc=st.dictionaries(keys, values, max_size=8))
def test_random_documents(tmp_path, doc):
    _load(tmp_path, yaml.safe_dump(doc))


@FUZZ
@given(
    section=st.sampled_from(["knobs", "baseline", "limits", "trial", "budget", "study", "search"]),
    key=keys,
    value=values,
)
def test_valid_space_with_one_mutated_value(tmp_path, section, key, value):
    doc = yaml.safe_load(VALID)
    if isinstance(doc[section], dict):
        doc[section][key] = value
    else:
        doc[section] = value
    _load(tmp_path, yaml.safe_dump(doc))


@FUZZ
@given(cut=st.integers(0, len(VALID)), junk=st.text(max_size=8), drop=st.integers(0, 5))
def test_mangled_text(tmp_path, cut, junk, drop):
    _load(tmp_path, VALID[:cut] + junk + VALID[cut + drop :])


def test_the_valid_example_loads(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text(VALID)
    space = load_space(path)
    assert space.global_batch == 64 and space.trial.memory_cap == 2 * 2**30
    assert space.trial.planned_samples == 100_000 and space.trial.cost_per_hour == 2.5
    assert space.trial.energy_price_per_kwh == 0.3 and space.trial.objective == "energy"


def test_yaml_is_never_evaluated(tmp_path):
    path = tmp_path / "evil.yaml"
    path.write_text("workload: !!python/object/apply:os.system ['echo pwned']\n")
    try:
        load_space(path)
    except SpaceError as e:
        assert "not valid YAML" in str(e)
    else:
        raise AssertionError("an unsafe tag was accepted")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("workload: m:f\nworkload_args: &a {x: *a}\n", "workload_args: must be plain data"),
        ("workload: m:f\nworkload_args: {when: 2024-01-01}\n", "workload_args: must be plain"),
        ("workload: m:f\nx: 2024-13-45\n", "not valid YAML: ValueError"),
        ("[" * 5000 + "]" * 5000, "not valid YAML"),
    ],
)
def test_hostile_yaml(tmp_path, text, message):
    path = tmp_path / "h.yaml"
    path.write_text(text)
    with pytest.raises(SpaceError, match=message):
        load_space(path)
