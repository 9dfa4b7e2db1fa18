from __future__ import annotations

import pytest

from autotune import AutotuneError, Config, load_config
from autotune.knobs import KNOBS


def test_defaults_are_plain_pytorch():
    c = Config()
    assert (c.amp_dtype, c.compile_mode, c.num_workers, c.accumulation_steps) == (
        "fp32",
        "off",
        0,
        1,
    )
    assert c.global_batch == 32


def test_invalid_values_and_unknown_keys_are_rejected():
    with pytest.raises(AutotuneError, match="amp_dtype must be one of"):
        Config(amp_dtype="fp8")
    with pytest.raises(AutotuneError, match="batch_size must be an integer >= 1"):
        Config(batch_size=0)
    with pytest.raises(AutotuneError, match="unknown knob"):
        Config.from_dict({"batchsize": 3})


def test_round_trip_and_short_form(tmp_path):
    c = Config(batch_size=64, accumulation_steps=2, amp_dtype="bf16", gradient_checkpointing=True)
    assert Config.from_dict(c.to_dict()) == c
    assert c.short() == "bs=64 acc=2 amp=bf16 ckpt"
    assert c.key() != Config(batch_size=64).key()
    path = tmp_path / "best.yaml"
    path.write_text("config:\n  batch_size: 64\n  amp_dtype: bf16\n")
    assert load_config(path) == Config(batch_size=64, amp_dtype="bf16")


def test_a_knob_added_later_at_its_default_leaves_the_key_unchanged():
    """Stored studies claim configs by key: a knob added after a study was stored sits at
    its default in every stored config, so it must not be in the key."""
    stored = {"batch_size": 64, "accumulation_steps": 1, "num_workers": 2, "jit": "off"}
    later = {"packing": "off", "length_grouping": "off", "fsdp": "off", "fsdp_cpu_offload": False}
    assert all(later[name] == KNOBS[name].default for name in later)
    key = Config.from_dict(stored).key()
    assert Config.from_dict({**stored, **later}).key() == key
    # only the knobs off their default, so no knob at its default can ever change it
    assert key == "batch_size=64,num_workers=2"
    assert Config().key() == ""


def test_fsdp_policy_leaves_fsdp_defaults_where_nothing_is_cast():
    """One rule for the trials and the plain-loop export: fp32 params are not cast, and the
    reduce dtype is set only where bf16 is involved (else FSDP reduces in the param dtype)."""
    policy = {
        (p, r): Config(
            world_size=2, fsdp="root", fsdp_param_dtype=p, fsdp_reduce_dtype=r
        ).fsdp_policy()
        for p in ("fp32", "bf16")
        for r in ("fp32", "bf16")
    }
    assert policy == {
        ("fp32", "fp32"): (None, None),
        ("fp32", "bf16"): (None, "bf16"),
        ("bf16", "fp32"): ("bf16", "fp32"),
        ("bf16", "bf16"): ("bf16", "bf16"),
    }
