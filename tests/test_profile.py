"""Bottleneck analysis: the step's profiler ranges, the summary, the advice, a real profile."""

from __future__ import annotations

import json

import pytest
import torch
from workloads import MLP, Blobs, _loss

from autotune import Config, Measurement, apply, load_space
from autotune._profile import Event, summarize
from autotune.bottleneck import Evidence, advice
from autotune.results import TrialRecord, TuneResult
from autotune.runner import profile_trial
from autotune.training import PHASE_PREFIX, phase


def _phase_events(**phases_us: float) -> list[Event]:
    """Back-to-back phase ranges filling one step of ``step_us``."""
    events, t = [], 0.0
    for name, us in phases_us.items():
        events.append(Event(PHASE_PREFIX + name, t, t + us, us))
        t += us
    return events


def test_phase_ranges_appear_only_under_a_profiler():
    torch.manual_seed(0)
    a = apply(Config(batch_size=8), model=MLP(), dataset=Blobs(), loss=_loss, device="cpu")
    assert isinstance(phase("data"), type(phase("forward")))  # the shared no-op outside
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        a.train_step(iter(a.loader))
    names = {e.name for e in prof.events()}
    for part in ("data", "to_device", "forward", "backward", "optimizer"):
        assert PHASE_PREFIX + part in names


def test_summary_shares_add_up_and_syncs_are_cut_out_of_their_phase():
    events = _phase_events(data=100, to_device=50, forward=300, backward=400, optimizer=100)
    # a 200 us host wait inside backward (e.g. an .item() on the loss)
    events.append(Event("cudaStreamSynchronize", 500, 700, 200))
    events.append(Event("aten::_local_scalar_dense", 490, 710, 10))
    events.append(Event("aten::mm", 160, 400, 240))
    events.append(Event("some_kernel", 170, 450, 280, on_device=True))
    s = summarize(events, wall_s=1000e-6, steps=1, device="cuda")
    shares = s["shares"]
    assert shares["backward"] == pytest.approx(0.2) and shares["sync"] == pytest.approx(0.2)
    assert shares["data"] == pytest.approx(0.1) and shares["other"] == pytest.approx(0.05)
    assert sum(shares.values()) == pytest.approx(1.0)
    assert s["host_reads_per_step"] == 1 and s["phases_found"]
    assert s["device_busy"] == pytest.approx(0.28)
    assert s["top_ops"][0]["name"] == "aten::mm"
    assert s["top_kernels"][0]["name"] == "some_kernel"


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


def test_a_real_profile_runs_in_a_subprocess_and_writes_a_trace(write_space, tmp_path):
    space = load_space(
        write_space("""
        workload: {workloads}:tiny
        trial: {warmup_steps: 1, measured_steps: 2}
    """)
    )
    p = profile_trial(space, Config(batch_size=16, accumulation_steps=2), tmp_path / "p", steps=2)
    assert p["status"] == "ok", p.get("reason")
    assert p["phases_found"] and p["profile_steps"] == 2 and p["step_s"] > 0
    assert sum(p["shares"].values()) == pytest.approx(1.0)
    assert p["shares"]["forward"] + p["shares"]["backward"] > 0
    assert p["config"]["accumulation_steps"] == 2
    trace = json.loads((tmp_path / "p" / "trace.json").read_text())
    assert any(e.get("name") == PHASE_PREFIX + "forward" for e in trace["traceEvents"])
    assert p["trace_path"] == str((tmp_path / "p" / "trace.json").resolve())
