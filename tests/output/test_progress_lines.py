"""The console's progress line names each run for what it is."""

from __future__ import annotations

import io

from rich.console import Console

from autotune import Config, Measurement, TrialRecord
from autotune.output.console import ConsoleReporter
from autotune.results import BASELINE, REPEAT


def test_a_repeat_of_the_baseline_is_a_noise_run_and_any_other_repeat_a_run_again():
    """The baseline's back-to-back repeats are the noise floor; a new best's runs and a
    screening move's second look are runs of that config again, not noise runs."""
    m = Measurement(status="ok", samples_per_s=100.0)
    base = TrialRecord(0, Config(batch_size=16), m, 100.0, BASELINE)
    packed = TrialRecord(3, Config(batch_size=16, packing="packed"), m, 90.0, move="packing=packed")
    noise = TrialRecord(1, base.config, m, 101.0, REPEAT, repeat_of=0)
    look = TrialRecord(4, packed.config, m, 95.0, REPEAT, repeat_of=3)
    out = io.StringIO()
    reporter = ConsoleReporter(Console(file=out, width=300, highlight=False))
    for record in (base, noise, packed, look):
        reporter.trial(record, base, base, 2, 8)
    lines = out.getvalue().splitlines()
    assert lines[1].startswith("noise run, again #0 #1 [repeat]"), lines[1]
    assert lines[2].startswith("trial 2/8 #3 [screen packing=packed]"), lines[2]
    assert lines[3].startswith("run again #3 #4 [repeat]"), lines[3]
    assert not any("noise" in line for line in lines[2:])
