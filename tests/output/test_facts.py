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


def test_a_decision_names_the_bar_its_interval_lies_on_either_side_of():
    """Proven above the margin, within noise below the least gain, and between them
    unresolved: each text names the bar the interval actually lies below or across (a
    gain below a 10% margin and above the 3% least gain is not "across 1.10x")."""
    from autotune.decisions import Decision
    from autotune.output.facts import contribution_text, decision_text
    from autotune.results import Contribution

    assert decision_text(Decision((1.12, 1.13, 1.14), 1.10, 1.03)) == (
        "kept (interval 1.12-1.14x above 1.10x, 3 rounds)"
    )
    assert decision_text(Decision((0.97, 1.01, 1.02), 1.10, 1.03)) == (
        "within noise (interval 0.97-1.02x below the least gain 1.03x, 3 rounds): dropped"
    )
    assert decision_text(Decision((1.05, 1.06, 1.07), 1.10, 1.03)) == (
        "unresolved after 3 rounds (interval 1.05-1.07x below 1.10x), above the least gain "
        "1.03x: kept"
    )
    assert decision_text(Decision((0.97, 1.03, 1.09), 1.10, 1.03)) == (
        "unresolved after 3 rounds (interval 0.97-1.09x below 1.10x, across the least gain "
        "1.03x): dropped, the simpler config"
    )
    assert decision_text(Decision((0.97, 1.08, 1.15), 1.10, 1.03)) == (
        "unresolved after 3 rounds (interval 0.97-1.15x across 1.10x): dropped, the simpler config"
    )
    together = Contribution("channels_last", True, False, (0.57, 0.80, 1.03), min_gain=0.10)
    text = contribution_text(together, ("channels_last", "batch_size"))
    assert "not proven alone (interval 0.57-1.03x below 1.10x, across 1.03x, 3 rounds)" in text
