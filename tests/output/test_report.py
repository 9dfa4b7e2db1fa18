"""`autotune report` from a real small study: files, contents, stored profiles, plots."""

from __future__ import annotations

import json

import optuna
import pytest
from conftest import run_cli

from autotune import make_report
from autotune.output.plots import real_params, write_plots
from autotune.results import DUPLICATE


@pytest.fixture(scope="module")
def report(small_study):
    space, storage, runs, _ = small_study
    return make_report(space, storage=storage, out_dir=runs, profile_steps=2)


def test_report_files_exist_and_hold_every_trial(report, small_study):
    result = small_study[3]
    assert report.folder.name == "report" and report.html.exists() and report.data.exists()
    plots = {"history", "pareto", "importances", "slice", "mfu"}
    assert set(report.plots) == plots, report.notes
    for png in report.plots.values():
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    page = report.html.read_text()
    data = json.loads(report.data.read_text())
    measured = [t for t in result.trials if t.role != DUPLICATE]
    assert len(data["trials"]) == len(measured) >= 4
    for t in measured:
        assert t.config.short() in page
        assert any(
            d["number"] == t.number and d["config"] == t.config.to_dict() for d in data["trials"]
        )
    for png in report.plots.values():
        assert f"src='{png.name}'" in page
    assert data["best"] == result.best.number and data["baseline"] == result.baseline.number
    # a real study's probe counted the FLOPs and measured the peak: every ok trial has MFU
    assert data["mfu"]["unavailable"] is None and data["mfu"]["recommended"]["mfu"] > 0
    assert all(d["mfu"] for d in data["trials"] if d["status"] == "ok")
    assert data["speedup"] == pytest.approx(result.speedup)
    assert data["status_counts"] == result.status_counts()
    assert "Where the step time goes" in page and "Chrome trace" in page


def test_baseline_and_best_are_profiled_once_and_stored(report, small_study):
    space, storage, runs, result = small_study
    numbers = {result.baseline.number, result.best.number}
    assert set(report.profiles) == numbers
    for n in numbers:
        p = report.profiles[n]
        assert p["status"] == "ok" and p["phases_found"]
        assert (runs / space.study.name / f"trial-{n:04d}" / "profile" / "trace.json").exists()
    study = optuna.load_study(study_name=space.study.name, storage=storage)
    assert study.user_attrs[f"profile:{result.baseline.number}"]["shares"]
    data = json.loads(report.data.read_text())
    assert all(data["profiles"][str(n)]["advice"] for n in numbers)

    class Recorder:
        notes: list[str] = []

        def note(self, message):
            self.notes.append(message)

    again = make_report(space, storage=storage, out_dir=runs, reporter=Recorder())
    assert not Recorder.notes  # nothing profiled again: the stored profiles are reused
    assert again.profiles == report.profiles


def _fake_study():
    """Ordinal batch_size stored as an index; one duplicate, one infeasible, one failed."""
    from optuna.distributions import CategoricalDistribution, IntDistribution

    study = optuna.create_study(direction="maximize")
    dists = {
        "batch_size": IntDistribution(0, 2),
        "amp_dtype": CategoricalDistribution(["fp32", "bf16"]),
    }
    sizes = [8, 16, 32]
    rows = [  # (index, amp, value, role, memory constraint, peak MiB)
        (1, "fp32", 100.0, "baseline", -0.5, 300),
        (1, "fp32", 100.0, DUPLICATE, -0.5, 300),
        (2, "fp32", 180.0, "search", 0.3, 900),  # over the memory budget
        (0, "bf16", 40.0, "search", -0.6, 250),
        (2, "bf16", 60.0, "search", -0.1, 500),
    ]
    for index, amp, value, role, memory, mib in rows:
        study.add_trial(
            optuna.trial.create_trial(
                value=value,
                params={"batch_size": index, "amp_dtype": amp},
                distributions=dists,
                user_attrs={
                    "config": {"batch_size": sizes[index], "amp_dtype": amp},
                    "role": role,
                    "measurement": {"samples_per_s": value, "peak_mem_bytes": mib * 2**20},
                },
                constraints={"memory": memory},
            )
        )
    study.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.FAIL))
    return study


def test_plots_label_ordinal_knobs_with_real_values(tmp_path):
    study = _fake_study()
    assert real_params(study.trials[2]) == {"batch_size": 32, "amp_dtype": "fp32"}
    files, notes = write_plots(
        study, tmp_path, baseline_value=100.0, memory_budget_bytes=700 * 2**20
    )
    assert set(files) == {"history", "pareto", "importances", "slice"}, notes
    assert all(f.stat().st_size > 5000 for f in files.values())


def test_plots_draw_a_conditional_ordinal_knob(tmp_path):
    """pad_to_multiple_of is a param only of unpacked trials (it needs packing off)."""
    from optuna.distributions import CategoricalDistribution, IntDistribution

    study = optuna.create_study(direction="maximize")
    rows = [("off", 0, 100.0), ("off", 1, 120.0), ("packed", None, 150.0), ("off", 0, 90.0)]
    for packing, pad_index, value in rows:
        params = {"packing": packing}
        dists = {"packing": CategoricalDistribution(["off", "packed"])}
        config = {"packing": packing, "pad_to_multiple_of": 1}
        if pad_index is not None:
            params["pad_to_multiple_of"] = pad_index
            dists["pad_to_multiple_of"] = IntDistribution(0, 1)
            config["pad_to_multiple_of"] = [1, 64][pad_index]
        study.add_trial(
            optuna.trial.create_trial(
                value=value,
                params=params,
                distributions=dists,
                user_attrs={"config": config, "role": "search", "measurement": {}},
                constraints={"memory": -0.5},
            )
        )
    files, notes = write_plots(study, tmp_path)
    assert "slice" in files, notes


def test_report_of_a_missing_study_is_one_line_and_exit_1(small_study, tmp_path):
    space = small_study[0]
    r = run_cli(
        "report",
        str(space.source),
        "--storage",
        f"sqlite:///{tmp_path}/nothing.db",
        cwd=tmp_path,
        timeout=120,
    )
    assert r.returncode == 1 and "does not exist" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "nothing.db").exists()


def test_cli_report_prints_the_summary_and_where_the_files_are(small_study, report):
    space, storage, runs, result = small_study
    r = run_cli(
        "report",
        str(space.source),
        "--storage",
        storage,
        "--out",
        str(runs),
        "--no-profile",
        cwd=runs,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "speedup over baseline" in out and "configs by status" in out
    assert f"bottleneck of the baseline (trial #{result.baseline.number}" in out
    assert "advice:" in out and "report written to" in out and "index.html" in out
