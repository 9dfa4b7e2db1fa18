"""The summary's facts (output/facts.py): every part of a study's summary, in reading order."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from autotune import Config, Measurement, TrialRecord, TuneResult
from autotune.output.facts import summary_facts
from autotune.results import BASELINE


def _study(tmp_path: Path) -> TuneResult:
    m = Measurement(status="ok", samples_per_s=1.0, peak_mem_bytes=2**20, compile_s=12.5)
    base = TrialRecord(0, Config(batch_size=8), replace(m, compile_s=None), 100.0, BASELINE)
    best = TrialRecord(1, Config(batch_size=16), m, 150.0, loss_deviation=0.012)
    result = TuneResult.from_trials("s", "m", [base, best])
    return replace(result, best_config_path=tmp_path / "best_config.yaml")


def test_the_summary_says_each_part_once_in_reading_order(tmp_path):
    facts = summary_facts(_study(tmp_path))
    keys = [f.key for f in facts]
    wanted = ["status_counts", "recommended", "speedup", "memory", "accuracy", "compile"]
    assert [k for k in keys if k in wanted + ["best_config"]] == [*wanted, "best_config"]
    text = {f.key: f.text for f in facts}
    assert text["recommended"] == Config(batch_size=16).short()
    assert text["accuracy"] == "final losses within 1.20% of the fp32 reference run"
    assert text["compile"].startswith("12.5")
    assert text["best_config"] == str(tmp_path / "best_config.yaml")


def test_without_a_feasible_trial_the_summary_recommends_nothing(tmp_path):
    result = _study(tmp_path)
    result = replace(result, best=None)
    facts = summary_facts(result)
    assert facts[-1].key == "recommended"
    assert facts[-1].text == "no feasible trial: nothing to recommend"
    assert "accuracy" not in {f.key for f in facts}
