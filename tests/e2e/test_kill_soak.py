"""A short kill soak (``benchmarks/kill_soak.py``; the full one and its figures:
docs/faults.md): the driver of one study SIGKILLed once at each kind of moment, then run
to the end. Nothing may be lost, measured twice, left running or left behind as a process,
and ``autotune show`` must agree with Optuna's trials."""

from __future__ import annotations

import importlib.util
import sys

from conftest import ROOT

_spec = importlib.util.spec_from_file_location("kill_soak", ROOT / "benchmarks" / "kill_soak.py")
kill_soak = sys.modules["kill_soak"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(kill_soak)  # registered first: its dataclass looks itself up


def test_a_driver_killed_at_each_kind_of_moment_loses_nothing(tmp_path):
    soak = kill_soak.Soak(tmp_path, seed=1, n_trials=4, confirm_top=1, rounds=2)
    figures = kill_soak.run_soak(soak, 4, ["trial", "write", "start", "confirm"])
    assert figures["problems"] == []
    assert figures["by_kind"] == {"trial": 1, "write": 1, "start": 1, "confirm": 1}
    # The trial and confirmation kills each left a RUNNING trial: failed on restart (a
    # search or baseline trial queued again, a confirmation run made again by its round).
    assert figures["kills_mid_trial"] >= 2
    assert figures["states"].get("FAIL", 0) >= figures["kills_mid_trial"]
    assert figures["configs_measured"] == 4
