"""Multi-process trials: DDP over gloo with 2 CPU processes, launched by torch.distributed.run."""

from __future__ import annotations

from test_faults import wait_no_children

from autotune import AutotuneError, Config, load_space
from autotune.study.runner import run_trial


def _tiny(write_space, steps: int):
    return load_space(
        write_space(f"""
        workload: {{workloads}}:tiny
        global_batch: free
        trial: {{warmup_steps: 1, measured_steps: {steps}, timeout_s: 180,
                 min_window_s: 0, min_warmup_s: 0}}
    """)
    )


def _same_trajectory(a, b) -> bool:
    """Losses equal step by step (to float tolerance)."""
    return all(abs(x - y) < 1e-4 for x, y in zip(a.losses, b.losses, strict=True))


def test_two_process_gloo_trial_reports_global_throughput(write_space, tmp_path):
    space = _tiny(write_space, steps=5)
    ddp = Config(batch_size=8, world_size=2, ddp_bucket_cap_mb=1, ddp_gradient_as_bucket_view=True)
    m = run_trial(space, ddp, tmp_path / "ddp")
    assert m.ok, m.reason
    assert m.samples_per_step == 16  # 2 ranks x 8: samples/s is global
    assert abs(m.samples_per_s - 5 * 16 / m.window_s) < 1e-6 * m.samples_per_s
    # The two ranks split one sample stream and DDP averages gradients: the trajectory
    # is that of one process with the whole batch.
    single = run_trial(space, Config(batch_size=16), tmp_path / "single")
    assert (m.launcher, single.launcher) == ("spawn", "fork")  # ranks: torch.distributed.run
    assert _same_trajectory(m, single)
    assert wait_no_children(tmp_path) == []


def test_a_static_graph_with_accumulation_steps_like_one_process(write_space, tmp_path):
    """DDP's no_sync fails under a static graph in torch's reducer (an internal assert;
    pytorch/pytorch#143580): with one, every micro-batch all-reduces, and the trajectory is
    still that of one process with the whole step."""
    space = _tiny(write_space, steps=3)
    static = Config(batch_size=8, accumulation_steps=2, world_size=2, ddp_static_graph=True)
    m = run_trial(space, static, tmp_path / "static")
    assert m.ok, m.reason
    single = run_trial(space, Config(batch_size=16, accumulation_steps=2), tmp_path / "single")
    assert _same_trajectory(m, single)


def test_ddp_options_need_world_size():
    try:
        Config(ddp_static_graph=True)
    except AutotuneError as e:
        assert "ddp_static_graph=true needs world_size > 1 (world_size is 1)" in str(e)
    else:
        raise AssertionError("accepted a DDP option without DDP")
