"""A storage URL's password is in no file or page autotune writes: best_config.yaml,
report.json, the HTML report, every export format."""

from __future__ import annotations

import json

import yaml

from autotune import Config, Measurement, TrialRecord, TuneResult
from autotune.output.export import FORMATS, export_config, load_best
from autotune.output.html import render_html
from autotune.output.report import report_data
from autotune.results import BASELINE, SEARCH, recommendation, write_best_config

URL = "postgresql+psycopg2://tuner:SECRET@db-host:5432/autotune?sslpassword=SECRET"
SHOWN = "postgresql+psycopg2://tuner:***@db-host:5432/autotune?sslpassword=***"
OK = Measurement(status="ok", samples_per_s=1.0, peak_mem_bytes=100)


def _result() -> TuneResult:
    trials = [
        TrialRecord(0, Config(batch_size=8), OK, 100.0, BASELINE),
        TrialRecord(1, Config(batch_size=16), OK, 150.0, SEARCH),
    ]
    return TuneResult.from_trials("s", URL, trials, environment={"device": "cpu"})


def test_a_result_keeps_only_the_redacted_storage():
    assert _result().storage == SHOWN


def test_best_config_report_and_html_show_the_redacted_storage(tmp_path):
    result = _result()
    text = write_best_config(result, tmp_path / "best_config.yaml").read_text()
    assert "SECRET" not in text
    assert yaml.safe_load(text)["study"] == {"name": "s", "storage": SHOWN}
    data = json.dumps(report_data(result, {}))
    assert "SECRET" not in data and SHOWN in data
    page = render_html(result, {}, {}, [], "space.yaml")
    assert "SECRET" not in page and "tuner:***@db-host" in page


def test_every_export_format_is_free_of_the_password(tmp_path):
    result = _result()
    for fmt in FORMATS:
        assert "SECRET" not in export_config(
            result.best.config, fmt, evidence=recommendation(result)
        )
    # a best_config.yaml written before autotune redacted it: its exports are redacted
    old = tmp_path / "best_config.yaml"
    old.write_text(
        yaml.safe_dump({"config": {"batch_size": 16}, "study": {"name": "s", "storage": URL}})
    )
    config, evidence = load_best(old)
    for fmt in FORMATS:
        out = export_config(config, fmt, evidence=evidence)
        assert "SECRET" not in out, fmt
    assert SHOWN in export_config(config, "json", evidence=evidence)
