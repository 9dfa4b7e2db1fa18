"""Advice from a profile: the rule that fires names the bottleneck and the knob, and a
suggestion the study already measured says how it did.

Each rule has a case where it must fire and one where it must not: it checks the config
(no autocast advice without autocast), the phase its ops ran in (copies inside data
loading are data) and the cap of the knob it suggests (no more workers than CPUs).
Profiles are the plain dicts :func:`autotune.trial.profile.summarize` writes.
"""

from __future__ import annotations

from autotune import Config, Measurement
from autotune.output.advice import Evidence, advice
from autotune.results import TrialRecord, TuneResult
from autotune.study import screening


def _profile(device="cpu", config=None, **shares):
    base = dict.fromkeys(("data", "to_device", "forward", "backward", "optimizer", "sync"), 0.0)
    base.update(shares)
    base["other"] = max(0.0, 1 - sum(base.values()))
    return {"status": "ok", "device": device, "shares": base, "config": config or {}}


def _op(name, **phases):
    """A top op as the profile writes it: its share of the step by the phase it ran in."""
    return {"name": name, "share": sum(phases.values()), "phases": phases}


def _tip(profile, start, evidence=None):
    """The tip that starts with ``start``, or ``None``."""
    return next((t for t in advice(profile, evidence) if t.startswith(start)), None)


def _record(number, value, status="ok", **knobs):
    config = Config(**knobs)
    m = Measurement(status="ok", samples_per_s=value)
    return TrialRecord(
        number, config, m, value, role="baseline" if number == 0 else "search", status=status
    )


def test_a_balanced_profile_and_a_failed_one():
    assert advice(_profile(data=0.1, forward=0.3, backward=0.3, optimizer=0.15)) == [
        "no single part dominates the step: the config is balanced"
    ]
    assert advice({"status": "failed", "reason": "boom"}) == ["no profile: failed: boom"]


def test_data_rule_suggests_workers_below_the_cpu_count():
    p = _profile(data=0.4, forward=0.3, backward=0.3, config={"num_workers": 0}) | {"cpu_count": 4}
    (tip,) = advice(p)
    assert tip.startswith("data loading takes 40% of the step in the training process: use ")
    assert "DataLoader workers (num_workers > 0)" in tip and "make each sample cheaper" in tip
    p = _profile("cuda", data=0.3, forward=0.35, backward=0.35, config={"num_workers": 2})
    tip = _tip(p | {"cpu_count": 8}, "the step waits 30% of its time for its 2 DataLoader")
    assert "more DataLoader workers (num_workers > 2)" in tip
    # Never a knob a trial cannot show, nor one that does not feed a starved step.
    assert "persistent_workers" not in tip and "prefetch" not in tip
    assert _tip(_profile(data=0.1, forward=0.45, backward=0.45), "data loading") is None


def test_data_rule_suggests_no_more_workers_at_the_cpu_count():
    at_cap = {"num_workers": 2, "persistent_workers": False}
    p = _profile(data=0.6, forward=0.2, backward=0.2, config=at_cap) | {"cpu_count": 2}
    (tip,) = advice(p)
    assert "more DataLoader workers" not in tip and "persistent_workers" not in tip
    assert "num_workers is already at the 2 CPUs of this machine: make each sample cheaper" in tip
    # The study's environment caps it too when the profile does not say (older profiles).
    result = TuneResult.from_trials(
        "s", "memory", [_record(0, 100.0, num_workers=2)], environment={"cpu_count": 2}
    )
    evidence = Evidence.from_result(result)
    assert evidence.cpu_count == 2
    (tip,) = advice(_profile(data=0.6, forward=0.2, backward=0.2, config=at_cap), evidence)
    assert "more DataLoader workers" not in tip and "already at the 2 CPUs" in tip


def test_transfer_rule_suggests_the_copy_knobs_that_are_off():
    p = _profile("cuda", to_device=0.2, forward=0.4, backward=0.4)
    tip = _tip(p, "host-to-device copies take 20% of the step: try ")
    assert "pin_memory" in tip and "non_blocking" in tip
    on = _profile(
        "cuda", to_device=0.2, forward=0.4, backward=0.4,
        config={"pin_memory": True, "non_blocking": True},
    )  # fmt: skip
    tip = _tip(on, "host-to-device copies")
    assert "pin_memory" not in tip and "non_blocking" not in tip and "send less" in tip
    # A CPU run copies nothing to a device.
    assert _tip(_profile(to_device=0.2, forward=0.4, backward=0.4), "host-to-device") is None


def test_sync_rule_names_only_the_causes_the_profile_shows():
    p = _profile("cuda", sync=0.3, forward=0.35, backward=0.35) | {"host_reads_per_step": 3.0}
    tip = _tip(p, "the host waits for the GPU 30% of the step: ")
    assert "3 device-value reads per step" in tip and "GradScaler" not in tip
    fp16 = _profile("cuda", sync=0.3, forward=0.35, backward=0.35, config={"amp_dtype": "fp16"})
    tip = _tip(fp16, "the host waits for the GPU")
    assert "fp16 GradScaler" in tip and "reads per step" not in tip
    copy = p | {"host_reads_per_step": 0.0, "sync_shares": {"to_device": 0.25, "other": 0.05}}
    tip = _tip(copy, "the host waits for the GPU")
    assert "the batch copy blocks 25%" in tip and "non_blocking" in tip
    # No reads, no scaler, no blocking copy: the host waits on a busy GPU, nothing to fix.
    assert _tip(_profile("cuda", sync=0.3, forward=0.35, backward=0.35), "the host waits") is None


def test_launch_rule_leaves_an_idle_gpu_during_data_loading_to_the_data_rule():
    p = _profile("cuda", forward=0.45, backward=0.45, config={"batch_size": 32})
    tip = _tip(p | {"device_busy": 0.3}, "the GPU is busy only 30% of the step (waiting")
    assert "a larger batch_size" in tip and "compile_mode" in tip
    data_bound = _profile("cuda", data=0.6, forward=0.2, backward=0.2) | {"device_busy": 0.3}
    assert _tip(data_bound, "the GPU is busy") is None
    assert _tip(data_bound, "data loading takes 60%") is not None
    # A fixed global batch in one micro-batch: no larger batch_size.
    result = TuneResult.from_trials(
        "s", "memory", [_record(0, 100.0, batch_size=32)], global_batch=32
    )
    tip = _tip(p | {"device_busy": 0.3}, "the GPU is busy", Evidence.from_result(result))
    assert "batch_size" not in tip and "compile_mode" in tip


def test_optimizer_rule_suggests_only_an_implementation_not_in_use():
    tip = _tip(_profile(optimizer=0.3, forward=0.35, backward=0.35), "the optimizer step takes")
    assert "a foreach or fused implementation (optimizer_impl)" in tip
    fused = _profile(optimizer=0.3, forward=0.35, backward=0.35, config={"optimizer_impl": "fused"})
    assert _tip(fused, "the optimizer step").endswith(": the knobs here are used up")
    slow_zero = {"optimizer_impl": "foreach", "zero_grad_set_to_none": False}
    tip = _tip(_profile(optimizer=0.3, forward=0.35, backward=0.35, config=slow_zero), "the opt")
    assert "the fused implementation" in tip and "zero_grad_set_to_none: true" in tip
    assert _tip(_profile(optimizer=0.1, forward=0.45, backward=0.45), "the optimizer") is None


def test_compute_rule_suggests_no_knob_already_on():
    (tip,) = advice(_profile(forward=0.45, backward=0.45))
    assert "compute-bound (90%" in tip and "bf16 autocast (amp_dtype)" in tip
    tip = advice(_profile(forward=0.45, backward=0.45, config={"amp_dtype": "bf16"}))[0]
    assert "compute-bound (90%" in tip and "amp_dtype" not in tip and "compile_mode" in tip
    assert _tip(_profile(forward=0.3, backward=0.3, optimizer=0.15), "the step is") is None


def test_conversion_rule_counts_copies_in_data_loading_as_data():
    # The case: an fp32 data-bound baseline whose copies ran in __getitem__.
    p = _profile(data=0.97, forward=0.01, backward=0.01, config={"amp_dtype": "fp32"})
    p["top_ops"] = [_op("aten::copy_", data=0.3), _op("aten::_to_copy", data=0.07)]
    tips = advice(p)
    assert not any("conversion" in t or "autocast" in t for t in tips)
    assert tips[0].startswith("data loading takes 97%")
    # A profile that does not say where its ops ran (older) gets no conversion advice.
    old = p | {"top_ops": [{"name": "aten::copy_", "share": 0.37}]}
    assert not any("conversion" in t for t in advice(old))


def test_conversion_rule_blames_autocast_only_for_a_config_that_autocasts():
    ops = [_op("aten::copy_", forward=0.12, backward=0.04, data=0.2), _op("aten::to", forward=0.02)]
    bf16 = _profile(forward=0.4, backward=0.4, config={"amp_dtype": "bf16"}) | {"top_ops": ops}
    tip = _tip(bf16, "copies and dtype conversions")
    assert "take 18% of the step in forward and backward: bf16 autocast casts" in tip
    assert "fp32 (amp_dtype: fp32)" in tip
    fp32 = _profile(forward=0.4, backward=0.4, config={"amp_dtype": "fp32"}) | {"top_ops": ops}
    tip = _tip(fp32, "copies and dtype conversions")
    assert "autocast casts" not in tip and "amp_dtype" not in tip and "no knob removes" in tip
    nhwc = fp32 | {"config": {"amp_dtype": "fp32", "channels_last": True}}
    assert "channels_last: false" in _tip(nhwc, "copies and dtype conversions")
    little = [_op("aten::copy_", forward=0.05, data=0.3)]
    assert _tip(bf16 | {"top_ops": little}, "copies and dtype") is None


def test_other_rule_blames_no_user_loop_code():
    p = _profile(forward=0.3, backward=0.3, optimizer=0.1)  # 30% other
    tip = _tip(p, "30% of the step ran outside data loading")
    assert "logging" not in tip and "callbacks" not in tip and "approximate" in tip
    tip = _tip(p | {"top_ops": [_op("aten::add_", other=0.2, forward=0.01)]}, "30% of the step")
    assert "the largest ops there are aten::add_ 20%" in tip
    assert _tip(_profile(forward=0.45, backward=0.45), "10% of the step") is None


def test_padding_rule_suggests_only_what_the_config_can_still_take():
    padded = _profile(forward=0.45, backward=0.45) | {"padding_share": 0.62}
    tip = _tip(padded, "62% of the token positions are padding")
    assert "length_grouping" in tip and "packing" in tip
    little = _profile(forward=0.45, backward=0.45) | {"padding_share": 0.05}
    assert not any("padding" in t for t in advice(little))
    grouped = _profile(forward=0.45, backward=0.45, config={"length_grouping": "grouped"})
    tip = _tip(grouped | {"padding_share": 0.3}, "30% of the token positions")
    assert "length_grouping" not in tip  # already on: not suggested again
    packed = _profile(forward=0.45, backward=0.45, config={"packing": "packed"})
    tip = _tip(packed | {"padding_share": 0.3}, "30% of the token positions")
    assert "length_grouping" not in tip and "packing (" not in tip  # it needs packing off


def test_the_advice_speaks_of_padding_and_data_where_the_screening_moves_them_first():
    """One threshold each: a baseline whose padding or data wait makes the screening move
    the layout or DataLoader knobs first gets the advice to try them, and one just below
    gets neither (at 0.22 padding the advice spoke while the screening did not, when the
    two kept their own thresholds)."""
    for share in (0.19, 0.2, 0.22, 0.3):
        moved = screening.padding_first(screening.Shares(padding_share=share)) is not None
        padded = _profile(forward=0.45, backward=0.45) | {"padding_share": share}
        assert moved == (share >= 0.2)
        assert (_tip(padded, f"{share:.0%} of the token positions") is not None) == moved
        moved = screening.data_first(screening.Shares(data_share=share)) is not None
        waits = _profile(data=share, forward=0.3, config={"num_workers": 0}) | {"cpu_count": 4}
        assert moved == (share >= 0.2)
        assert (_tip(waits, f"data loading takes {share:.0%}") is not None) == moved


def test_recompile_rule_fires_on_graphs_built_after_warm_up_only():
    compiled = _profile(forward=0.45, backward=0.45, config={"compile_mode": "default"})
    tip = _tip(compiled | {"recompiles": 2, "profile_steps": 5}, "torch.compile built 2 new")
    assert "in the 5 profiled steps" in tip and "compile_dynamic: true" in tip
    # Many graphs built once (graph breaks) and none since warm-up: no recompiling.
    assert _tip(compiled | {"graphs": 9, "recompiles": 0}, "torch.compile") is None
    assert _tip(compiled | {"graphs": 9}, "torch.compile") is None  # an older profile
    dynamic = compiled | {"config": {"compile_mode": "default", "compile_dynamic": "true"}}
    tip = _tip(dynamic | {"recompiles": 1, "profile_steps": 5}, "torch.compile built 1")
    assert "compile_dynamic" not in tip and "TORCH_LOGS=recompiles" in tip


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
