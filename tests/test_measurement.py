"""One trial's measurement: where its time goes."""

from __future__ import annotations

from autotune import Measurement


def test_the_time_split_counts_compile_once_and_its_parts_sum_to_the_total():
    """``warmup_s`` is the warm-up's wall time, compile included: the split's warm-up is
    what is left of it after compile, or the compile would count twice."""
    m = Measurement(
        status="ok",
        samples_per_s=1.0,
        process_start_s=0.1,
        import_s=2.0,
        device_init_s=0.0,
        build_s=0.5,
        warmup_s=4.0,
        compile_s=3.0,
        window_s=2.0,
        exit_s=0.1,
        wall_s=8.5,
    )
    parts, total = m.time_split()
    assert parts["warm-up"] == 1.0 and parts["compile"] == 3.0
    assert round(total, 9) == 8.7  # spawn to exit: process start + wall + exit
    assert round(sum(parts.values()), 9) == 8.7 and round(parts["other"], 9) == 0.0
    assert round(m.fixed_s, 9) == round(0.1 + 2.0 + 0.0 + 0.5 + 0.1, 9)


def test_the_longest_batch_step_is_its_own_phase_not_other_and_not_fixed_cost():
    """A token trial's untimed longest-batch step (between warm-up and window) is named in
    the split: before, it was part of the unattributed ``other``."""
    m = Measurement(
        status="ok",
        samples_per_s=1.0,
        process_start_s=0.1,
        import_s=0.0,
        device_init_s=0.0,
        build_s=0.5,
        warmup_s=1.0,
        longest_s=0.8,
        window_s=2.0,
        exit_s=0.1,
        wall_s=4.4,
    )
    parts, total = m.time_split()
    assert parts["longest batch"] == 0.8 and round(parts["other"], 9) == 0.1
    assert round(sum(parts.values()), 9) == round(total, 9) == 4.6
    assert round(m.fixed_s, 9) == round(0.1 + 0.5 + 0.1, 9)
