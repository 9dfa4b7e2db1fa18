"""Advice from a profile: the rule that fires names the bottleneck and the knob, and a
suggestion the study already measured says how it did."""

from __future__ import annotations

from autotune import Config, Measurement
from autotune.output.advice import Evidence, advice
from autotune.results import TrialRecord, TuneResult


def _profile(device="cpu", config=None, **shares):
    base = dict.fromkeys(("data", "to_device", "forward", "backward", "optimizer", "sync"), 0.0)
    base.update(shares)
    base["other"] = max(0.0, 1 - sum(base.values()))
    return {"status": "ok", "device": device, "shares": base, "config": config or {}}


def test_advice_names_the_bottleneck_and_the_knob():
    (tip,) = advice(_profile(data=0.4, forward=0.3, backward=0.3, config={"num_workers": 0}))
    assert tip.startswith("data loading takes 40% of the step") and "num_workers" in tip
    tips = advice(_profile("cuda", data=0.3, forward=0.3, backward=0.3, config={"num_workers": 2}))
    assert "2 DataLoader worker(s)" in tips[0] and "pin_memory" in tips[0]
    tips = advice(_profile("cuda", sync=0.3, forward=0.35, backward=0.35) | {"device_busy": 0.3})
    assert any("waits for the GPU 30%" in t for t in tips)
    assert any("GPU is busy only 30%" in t for t in tips)
    tip = advice(_profile(optimizer=0.3, forward=0.35, backward=0.35))[0]
    assert "optimizer_impl" in tip
    tip = advice(_profile(forward=0.45, backward=0.45, config={"amp_dtype": "bf16"}))[0]
    assert "compute-bound (90%" in tip and "amp_dtype" not in tip and "compile_mode" in tip
    assert advice(_profile(data=0.1, forward=0.3, backward=0.3, optimizer=0.15)) == [
        "no single part dominates the step: the config is balanced"
    ]
    assert advice({"status": "failed", "reason": "boom"}) == ["no profile: failed: boom"]


def _record(number, value, status="ok", **knobs):
    config = Config(**knobs)
    m = Measurement(status="ok", samples_per_s=value)
    return TrialRecord(
        number, config, m, value, role="baseline" if number == 0 else "search", status=status
    )


def test_advice_does_not_repeat_a_suggestion_the_study_measured():
    # bf16 lost by 40%, compile won, checkpointing off was never measured.
    result = TuneResult.from_trials(
        "s",
        "memory",
        [
            _record(0, 100.0, gradient_checkpointing=True),
            _record(1, 90.0, amp_dtype="bf16", gradient_checkpointing=True),
            _record(2, 150.0, compile_mode="default", gradient_checkpointing=True),
            _record(3, 0.0, "oom", optimizer_impl="fused", gradient_checkpointing=True),
        ],
    )
    evidence = Evidence.from_result(result)
    base = {"amp_dtype": "fp32", "compile_mode": "off", "gradient_checkpointing": True}
    (tip,) = advice(_profile(forward=0.45, backward=0.45, config=base), evidence)
    assert tip.startswith("the step is compute-bound (90% in forward and backward): try ")
    assert "try gradient_checkpointing off if memory allows" in tip
    assert "bf16 autocast (amp_dtype)" in tip.split("already measured: ")[1]
    assert "(1 trial measured here, the best 40% slower than the recommended config)" in tip
    assert "torch.compile (compile_mode) to fuse kernels (the recommended config has it)" in tip
    tip = advice(_profile(optimizer=0.3, forward=0.25, backward=0.25), evidence)[0]
    assert tip.startswith("the optimizer step takes 30% of the step: already measured: ")
    assert "optimizer_impl" in tip and "every such trial was infeasible (oom)" in tip
    # Without evidence the suggestions stand as they are.
    (tip,) = advice(_profile(forward=0.45, backward=0.45, config=base))
    assert "already measured" not in tip and "bf16 autocast" in tip.split("try ")[1]


def test_padding_and_recompile_advice_fire_only_when_they_should():
    padded = _profile(forward=0.45, backward=0.45) | {"padding_share": 0.62}
    assert any(t.startswith("62% of the token positions are padding") for t in advice(padded))
    assert any("length_grouping" in t for t in advice(padded))
    little = _profile(forward=0.45, backward=0.45) | {"padding_share": 0.05}
    assert not any("padding" in t for t in advice(little))
    grouped = _profile(forward=0.45, backward=0.45, config={"length_grouping": "grouped"})
    tip = next(t for t in advice(grouped | {"padding_share": 0.3}) if "padding" in t)
    assert "length_grouping" not in tip  # already on: not suggested again
    many = _profile(forward=0.45, backward=0.45, config={"compile_mode": "default"})
    tips = advice(many | {"graphs": 9})
    assert any("built 9 graphs" in t and "compile_dynamic" in t for t in tips)
    assert not any("graphs" in t for t in advice(many | {"graphs": 2}))
