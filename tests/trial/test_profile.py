"""The profile pass: the step's profiler ranges, the summary, a real profile in a subprocess."""

from __future__ import annotations

import json

import pytest
import torch
from workloads import MLP, Blobs, _loss

from autotune import Config, apply, load_space
from autotune.study.runner import profile_trial
from autotune.trial.apply import PHASE_PREFIX, phase
from autotune.trial.profile import Event, _plain, summarize


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


def test_ops_are_placed_in_the_phase_they_ran_in():
    events = _phase_events(data=400, to_device=50, forward=250, backward=200, optimizer=100)
    events += [
        Event("aten::copy_", 10, 310, 300),  # in the dataset's __getitem__
        Event("aten::copy_", 460, 520, 60),  # an autocast cast in forward
        Event("aten::copy_", 1005, 1010, 5),  # between two steps
        Event("aten::_local_scalar_dense", 20, 30, 10),  # int(label) of a host tensor
        Event("aten::_local_scalar_dense", 800, 860, 5),  # loss.item() that waits on the GPU
        Event("cudaStreamSynchronize", 805, 855, 50),
        Event("cudaStreamSynchronize", 420, 440, 20),  # a blocking batch copy
        Event("gemm_kernel", 470, 600, 130, on_device=True),
    ]
    s = summarize(events, wall_s=1100e-6, steps=1, device="cuda")
    (copy,) = [op for op in s["top_ops"] if op["name"] == "aten::copy_"]
    assert copy["share"] == pytest.approx(365 / 1100)
    assert copy["phases"] == pytest.approx(
        {"data": 300 / 1100, "forward": 60 / 1100, "other": 5 / 1100}
    )
    assert s["host_reads_per_step"] == 1  # only the read that waited for the device
    assert s["sync_shares"] == pytest.approx({"backward": 50 / 1100, "to_device": 20 / 1100})
    assert s["shares"]["to_device"] == pytest.approx(30 / 1100)
    assert "phases" not in s["top_kernels"][0]  # a kernel runs after its phase, not in it


class _Converting(Blobs):
    """A dataset whose __getitem__ converts dtypes and reads a label: data-loading work."""

    def __getitem__(self, i: int):
        x = self.x[i].double()
        for _ in range(50):
            x = x.float().double()
        return x.float(), int(self.y[i].item())


def test_copies_in_the_datasets_getitem_count_as_data_loading():
    torch.manual_seed(0)
    a = apply(Config(batch_size=16), model=MLP(), dataset=_Converting(), loss=_loss, device="cpu")
    batches = iter(a.loader)
    a.train_step(batches)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        a.train_step(batches)
    s = summarize([_plain(e) for e in prof.events()], wall_s=1.0, steps=1, device="cpu")
    conversions = [op for op in s["top_ops"] if op["name"] in ("aten::copy_", "aten::_to_copy")]
    assert conversions
    for op in conversions:
        assert op["phases"].get("data", 0.0) > 0.75 * op["share"], op
    assert s["host_reads_per_step"] == 0  # 16 label reads of host tensors wait for nothing


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
    assert p["cpu_count"] >= 1 and all("phases" in op for op in p["top_ops"])
    trace = json.loads((tmp_path / "p" / "trace.json").read_text())
    assert any(e.get("name") == PHASE_PREFIX + "forward" for e in trace["traceEvents"])
    assert p["trace_path"] == str((tmp_path / "p" / "trace.json").resolve())
