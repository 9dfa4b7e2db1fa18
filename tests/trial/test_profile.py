"""The profile pass: the step's profiler ranges, the summary, a real profile in a subprocess."""

from __future__ import annotations

import json

import pytest
import torch
from workloads import MLP, Blobs, _loss

from autotune import Config, apply, load_space
from autotune.study.runner import profile_trial
from autotune.trial.apply import PHASE_PREFIX, phase
from autotune.trial.profile import Event, summarize


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
