"""The knob registry: domains, where each knob applies, and the invalid combinations."""

from __future__ import annotations

import pytest
from conftest import ROOT
from hypothesis import given, settings
from hypothesis import strategies as st

from autotune import AutotuneError, Config
from autotune.knobs import KNOB_TABLE_COMMAND, KNOBS, Capabilities, Knob, Reads, markdown


def _values(knob):
    if knob.kind == "bool":
        return st.booleans()
    if knob.kind == "int":
        return st.integers(min_value=knob.minimum, max_value=knob.minimum + 4)
    return st.sampled_from(knob.choices)


_ALL_VALUES = st.fixed_dictionaries({name: _values(knob) for name, knob in KNOBS.items()})


@settings(max_examples=200, deadline=None)
@given(_ALL_VALUES)
def test_conditions_read_only_earlier_knobs(values):
    order = list(KNOBS)
    for i, (name, knob) in enumerate(KNOBS.items()):
        reads = Reads(values)
        knob.requires(reads)
        assert set(reads.read) <= set(order[:i]), f"{name} reads {reads.read}"


def test_config_fields_are_the_registry_in_order():
    assert list(Config().to_dict()) == list(KNOBS)
    assert all(getattr(Config(), name) == knob.default for name, knob in KNOBS.items())


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"persistent_workers": True}, "persistent_workers=true needs num_workers > 0"),
        ({"prefetch_factor": 4}, r"prefetch_factor=4 needs num_workers > 0 \(num_workers is 0\)"),
        (
            {"compile_dynamic": "true"},
            r"compile_dynamic=true needs compile_mode other than off \(compile_mode is off\)",
        ),
        ({"compile_fullgraph": True}, "compile_fullgraph=true needs compile_mode other than off"),
        (
            {"jit": "script", "compile_mode": "default"},
            r"jit=script needs compile_mode off \(compile_mode is default\)",
        ),
        (
            {"jit": "trace", "gradient_checkpointing": True},
            r"jit=trace needs gradient_checkpointing false \(gradient_checkpointing is true\)",
        ),
        ({"checkpoint_every": 2}, "checkpoint_every=2 needs gradient_checkpointing true"),
    ],
)
def test_invalid_combinations_name_both_knobs(values, message):
    with pytest.raises(AutotuneError, match=message):
        Config(**values)


def test_valid_combinations_and_domains():
    c = Config(num_workers=2, persistent_workers=True, prefetch_factor=4)
    assert (c.persistent_workers, c.prefetch_factor) == (True, 4)
    c = Config(compile_mode="default", compile_dynamic=True, compile_fullgraph=True)
    assert c.compile_dynamic == "true"  # YAML reads `true` as a bool
    assert Config(gradient_checkpointing=True, checkpoint_every=3).checkpoint_every == 3
    assert Config(jit="script").jit == "script"
    for bad, message in [
        ({"prefetch_factor": 0}, "prefetch_factor must be an integer >= 1 but got 0"),
        ({"matmul_precision": "low"}, "matmul_precision must be one of highest, high, medium"),
        ({"sdpa_backend": "xformers"}, "sdpa_backend must be one of auto, math, efficient"),
        ({"optimizer_impl": "apex"}, "optimizer_impl must be one of default, foreach, fused"),
        ({"num_threads": -1}, "num_threads must be an integer >= 0 but got -1"),
        ({"jit": True}, "jit must be one of off, script, trace but got True"),
    ]:
        with pytest.raises(AutotuneError, match=message):
            Config(**bad)


def test_short_form_stays_readable():
    c = Config(
        batch_size=64,
        num_workers=2,
        pin_memory=True,
        prefetch_factor=4,
        channels_last=True,
        optimizer_impl="fused",
        zero_grad_set_to_none=False,
        num_threads=1,
    )
    assert c.short() == ("bs=64 workers=2 pin prefetch=4 nhwc opt=fused no_set_to_none threads=1")


CPU = Capabilities(device="cpu", device_name="cpu", cpu_count=2, workload_blocks=4)


@pytest.mark.parametrize(
    ("name", "value", "caps", "reason"),
    [
        ("pin_memory", True, CPU, "has no effect without CUDA"),
        ("non_blocking", True, CPU, "has no effect without CUDA"),
        ("channels_last", True, CPU, "the workload runs no 2-d convolutions"),
        ("sdpa_backend", "math", CPU, "the workload calls no scaled_dot_product_attention"),
        (
            "sdpa_backend",
            "flash",
            Capabilities(device="cpu", device_name="cpu", attention=True, sdpa_backends=("math",)),
            "torch has no flash attention kernel for cpu",
        ),
        ("matmul_precision", "high", CPU, "changes no fp32 matmul on cpu"),
        ("optimizer_impl", "fused", Capabilities(device="cpu", optimizer="RMSprop"), "RMSprop"),
        ("num_threads", 4, CPU, "more threads than the 2 CPUs"),
        ("interop_threads", 3, CPU, "more threads than the 2 CPUs"),
        ("checkpoint_every", 5, CPU, "the workload exposes only 4 blocks"),
    ],
)
def test_values_that_cannot_apply_here_say_why(name, value, caps, reason):
    assert reason in KNOBS[name].unsupported(caps, value)
    assert KNOBS[name].unsupported(caps, KNOBS[name].default) is None


def test_values_that_apply_here_are_kept():
    caps = Capabilities(
        device="cuda",
        conv2d=True,
        attention=True,
        sdpa_backends=("math", "flash"),
        matmul_precisions=("highest", "high", "medium"),
        optimizer="AdamW",
        optimizer_impls=("foreach", "fused", "for-loop"),
        cpu_count=8,
        workload_blocks=4,
    )
    for name, value in [
        ("pin_memory", True),
        ("channels_last", True),
        ("sdpa_backend", "flash"),
        ("matmul_precision", "high"),
        ("optimizer_impl", "fused"),
        ("num_threads", 8),
        ("checkpoint_every", 4),
    ]:
        assert KNOBS[name].unsupported(caps, value) is None, name


def test_blocker_enumerates_only_what_the_condition_reads():
    options = {name: (knob.default,) for name, knob in KNOBS.items()}
    jit = KNOBS["jit"]
    assert "needs compile_mode off" in jit.blocker({**options, "compile_mode": ("default",)})
    assert jit.blocker({**options, "compile_mode": ("default", "off")}) is None
    both = {**options, "compile_mode": ("off",), "gradient_checkpointing": (True,)}
    assert "needs gradient_checkpointing false" in jit.blocker(both)
    assert KNOBS["prefetch_factor"].blocker({**options, "num_workers": (0, 2)}) is None
    assert KNOBS["batch_size"].blocker(options) is None  # unconditional


def test_cli_lists_every_knob(capsys):
    from autotune.cli import main

    assert main(["knobs"]) == 0
    out = capsys.readouterr().out
    for name in KNOBS:
        assert f"\n{name} " in f"\n{out}"


KNOBS_MD = ROOT / "docs" / "knobs.md"


def stale_knob_table() -> str | None:
    """Why docs/knobs.md is not what the registry generates now (None when it is)."""
    if KNOBS_MD.read_text() == markdown():
        return None
    return f"docs/knobs.md is stale: regenerate it with `{KNOB_TABLE_COMMAND}`"


def test_docs_knobs_md_is_generated_from_the_registry():
    assert stale_knob_table() is None


def test_the_generated_table_has_one_row_per_knob_saying_how_it_applies():
    rows = [line for line in markdown().splitlines() if line.startswith("| `")]
    assert [row.split("`")[1] for row in rows] == list(KNOBS)
    assert [k.name for k in KNOBS.values() if not k.applied] == []


def test_a_knob_added_without_regenerating_makes_the_table_stale(monkeypatch):
    dummy = Knob("dummy_knob", "bool", False, "a knob nobody documented", applied="nothing")
    monkeypatch.setitem(KNOBS, dummy.name, dummy)
    assert stale_knob_table() == (
        f"docs/knobs.md is stale: regenerate it with `{KNOB_TABLE_COMMAND}`"
    )
    assert "| `dummy_knob` | true/false | false | a knob nobody documented |" in markdown()


def test_cli_prints_the_generated_table(capsys):
    from autotune.cli import main

    assert main(["knobs", "--markdown"]) == 0
    assert capsys.readouterr().out == markdown()
