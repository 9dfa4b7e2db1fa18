"""A study stored by an older autotune keeps working: show, report, export, resume.

tests/fixtures/legacy_study/legacy.db was written by the code at 3f55f8d (before the
trial/ study/ output/ layout): 3 measured configs of the CNN example plus a confirmation
round (baseline and winner repeated). A change that breaks stored studies (a renamed user
attr, another fingerprint of the same space) fails here.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import optuna
import pytest
from conftest import HERE, run_cli

from autotune import Config

FIXTURE = HERE / "fixtures" / "legacy_study"
SPACE = FIXTURE / "space.yaml"


@pytest.fixture
def stored(tmp_path):
    db = tmp_path / "legacy.db"
    shutil.copy(FIXTURE / "legacy.db", db)
    return f"sqlite:///{db}"


def autotune(*args: str, cwd) -> subprocess.CompletedProcess:
    return run_cli(*args, cwd=cwd, timeout=300)


def trials_by_number(storage: str) -> dict[int, optuna.trial.FrozenTrial]:
    study = optuna.load_study(study_name="legacy", storage=storage)
    return {t.number: t for t in study.get_trials(deepcopy=False)}


def test_show_report_and_export_read_the_stored_study(stored, tmp_path):
    shown = autotune("show", str(SPACE), "--storage", stored, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "recommended (trial #3): bs=64" in shown.stdout
    # the median of the two runs of each (the confirmation round of the old code)
    assert "speedup over baseline (trial #0, bs=32 acc=2): 1.01x" in shown.stdout
    assert "configs by status: 3 ok" in shown.stdout

    out = tmp_path / "runs"
    report = autotune(
        "report", str(SPACE), "--no-profile", "--storage", stored, "--out", str(out), cwd=tmp_path
    )
    assert report.returncode == 0, report.stderr
    data = json.loads((out / "legacy" / "report" / "report.json").read_text())
    assert (data["baseline"], data["best"]) == (0, 3)
    assert {t["number"] for t in data["trials"]} == {0, 1, 3}
    assert (out / "legacy" / "report" / "index.html").is_file()

    exported = autotune("export", str(SPACE), "--storage", stored, "-f", "json", cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr
    body = json.loads(exported.stdout)
    assert body["config"]["batch_size"] == 64 and body["measured"]["trial"] == 3


def test_run_resumes_the_stored_study(stored, tmp_path):
    before = trials_by_number(stored)
    run = autotune(
        "run",
        str(SPACE),
        "--storage",
        stored,
        "--out",
        str(tmp_path),
        "--n-trials",
        "4",
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr
    assert re.search(r"^trial 4/4 #\d+ \[search\]", run.stdout, re.MULTILINE), run.stdout
    assert not re.search(r"^trial [123]/4", run.stdout, re.MULTILINE)  # nothing re-measured
    assert "running the fp32 reference" not in run.stdout  # the stored reference is reused
    after = trials_by_number(stored)
    for number, old in before.items():  # the stored trials are kept as they were
        assert after[number].state == old.state and after[number].value == old.value
    keys = {
        t.user_attrs["config_key"]
        for t in after.values()
        if t.state == optuna.trial.TrialState.COMPLETE
        and t.user_attrs.get("role") in ("baseline", "search")
    }
    assert len(keys) == 4
    # Nothing measured twice: every first measurement (the search's, or a config first
    # run in a confirmation round) is of a config no other trial measured, stored ones
    # included. Compared as configs, not by key: the stored key strings have an older form.
    firsts = [
        Config.from_dict(t.user_attrs["config"])
        for t in after.values()
        if t.state == optuna.trial.TrialState.COMPLETE
        and t.user_attrs.get("role") in ("baseline", "search", "confirm")
    ]
    assert len(firsts) == len(set(firsts)), [c.short() for c in firsts]
    # and every repeat (a confirmation round's run) points at that first measurement
    first_of = {
        Config.from_dict(t.user_attrs["config"]): n
        for n, t in after.items()
        if t.state == optuna.trial.TrialState.COMPLETE
        and t.user_attrs.get("role") in ("baseline", "search", "confirm")
    }
    for t in after.values():
        if t.state == optuna.trial.TrialState.COMPLETE and t.user_attrs.get("role") == "repeat":
            assert t.user_attrs["repeat_of"] == first_of[Config.from_dict(t.user_attrs["config"])]
