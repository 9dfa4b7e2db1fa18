"""A trial's window and warm-up cover a minimum time as well as their steps (docs/window.md).

Real trials of a workload whose step sleeps 5 ms (micro-batch 4 of ``sleepy``): its 3
measured steps are far under the minimum times asked here, and its cap (100 x 3 steps)
far over them, whatever the machine's speed (the bare MLP's step was 0.4 ms on an idle
machine: the cap, not the time, ended its window). The assertions are on what the trial
recorded (its window's seconds, its steps), never on how fast it ran.
"""

from __future__ import annotations

import json

from autotune import Config, load_space
from autotune.space import SearchSettings, TrialSettings
from autotune.study.pruning import Pruner
from autotune.study.runner import run_trial
from autotune.trial_spec import MAX_STEPS_FACTOR, steps_to_run, window_steps


def _trial(write_space, tmp_path, settings: str):
    space = load_space(
        write_space(f"""
        workload: {{workloads}}:sleepy
        knobs: {{batch_size: [4]}}
        global_batch: free
        trial: {{warmup_steps: 2, measured_steps: 3, timeout_s: 120, {settings}}}
    """)
    )
    m = run_trial(space, Config(batch_size=4), tmp_path / "t0")
    assert m.ok, m.reason
    return m


def test_a_fast_step_window_lasts_the_minimum_time(write_space, tmp_path):
    m = _trial(write_space, tmp_path, "min_window_s: 0.6, min_warmup_s: 0.3")
    assert m.window_s >= 0.6, m.window_s
    assert m.measured_steps > 3  # the window went on past its steps to cover the time
    # the rates divide by what ran: every window step, over the window's seconds
    assert abs(m.samples_per_s - m.measured_steps * 4 / m.window_s) < 1e-6 * m.samples_per_s
    warmup_steps = len(m.losses) - m.measured_steps
    assert warmup_steps > 2 and m.warmup_s >= 0.3  # the warm-up too (after its first step)


def test_with_the_minimums_off_a_trial_runs_exactly_its_steps(write_space, tmp_path):
    m = _trial(write_space, tmp_path, "min_window_s: 0, min_warmup_s: 0")
    assert m.measured_steps == 3 and len(m.losses) == 2 + 3


def test_the_window_stops_at_its_cap(write_space, tmp_path):
    # 1000 s cannot be covered: the window stops at MAX_STEPS_FACTOR times its steps
    m = _trial(write_space, tmp_path, "min_window_s: 1000, min_warmup_s: 0")
    assert m.measured_steps == 3 * MAX_STEPS_FACTOR and m.window_s < 1000


def test_the_rule_extends_by_the_pace_so_far_and_stops_once_covered():
    assert steps_to_run(2, 0.1, 10, 1.5) == 10  # its steps first
    assert steps_to_run(10, 0.2, 10, 1.5) == 75  # 20 ms a step: 75 steps cover 1.5 s
    assert steps_to_run(75, 1.52, 10, 1.5) == 75  # covered: done
    assert steps_to_run(75, 1.4, 10, 1.5) == 81  # short of it: a few more
    assert steps_to_run(10, 0.0001, 10, 1.5) == 10 * MAX_STEPS_FACTOR  # the cap
    assert steps_to_run(10, 0.2, 10, 0) == 10  # off
    assert window_steps(10, 1.5, 0.02) == 75 and window_steps(10, 1.5, 1.0) == 10
    assert window_steps(10, 0, 0.02) == 10


def test_pruning_waits_for_its_share_of_the_window_in_time_and_counts_the_longer_window(
    tmp_path,
):
    # A trial of 20 ms steps whose window is 10 steps and at least 1.5 s (75 steps), at a
    # tenth of the best rate: judged only after 0.3 of the 1.5 s, and the steps it saves
    # are those of the 75-step window it would have run.
    trial = TrialSettings(warmup_steps=2, measured_steps=10, min_window_s=1.5)
    search = SearchSettings(prune_margin=0.2, prune_after=0.3)
    path = tmp_path / "progress.json"
    pruner = Pruner(path, best_value=16_000.0, trial=trial, search=search)
    base = {"samples_per_step": 32, "unit": "samples", "warmup_s": 0.1, "compile_s": 0.0}
    base |= {"warmup_steps": 2, "min_window_s": 1.5}
    path.write_text(json.dumps({**base, "steps": 10, "elapsed_s": 0.2}))
    assert pruner() is None  # 0.2 s of a 1.5 s window: too soon, though 10 steps are done
    path.write_text(json.dumps({**base, "steps": 25, "elapsed_s": 0.5}))
    reason = pruner()
    assert reason is not None and reason.startswith("pruned after 25/75 measured steps"), reason
    m = pruner.measurement(reason, wall_s=1.0)
    assert abs(m.pruned_saved_s - (75 - 25) * 0.02) < 1e-9


def test_a_compiled_run_is_stopped_only_below_half_the_best(tmp_path):
    """cpu.yaml, 2026-12-06, study 4: both compiled screening runs were stopped 24% behind
    the best under a 20% margin, after their compile was paid; the study lost compile.
    A run whose warm-up compiled is stopped only when it cannot make half the best."""
    trial = TrialSettings(warmup_steps=2, measured_steps=20, min_window_s=0.0)
    search = SearchSettings(prune_margin=0.2, prune_after=0.3)
    path = tmp_path / "progress.json"
    base = {"samples_per_step": 64, "unit": "samples", "warmup_s": 12.0, "warmup_steps": 2}
    base |= {"min_window_s": 0.0, "steps": 7}
    # 7 steps of 64 samples in 0.2614 s: ~1,714 samples/s against a best of 2,263.
    for compile_s, stopped in [(0.0, True), (11.5, False)]:
        pruner = Pruner(path, best_value=2_263.0, trial=trial, search=search)
        path.write_text(json.dumps({**base, "compile_s": compile_s, "elapsed_s": 0.2614}))
        reason = pruner()
        assert (reason is not None) is stopped, (compile_s, reason)
    # Under half the best, a compiled run is stopped too, and says by what margin.
    pruner = Pruner(path, best_value=4_000.0, trial=trial, search=search)
    path.write_text(json.dumps({**base, "compile_s": 11.5, "elapsed_s": 0.2614}))
    reason = pruner()
    assert reason is not None and reason.endswith("cannot beat the best 4,000.0 by 100%"), reason
