"""A storage URL's password is in no file or page autotune writes: best_config.yaml,
report.json, the HTML report, every export format."""

from __future__ import annotations

import json

import yaml

from autotune import Config, Measurement, TrialRecord, TuneResult
from autotune.credentials import scrub
from autotune.output.export import FORMATS, export_config, load_best
from autotune.output.html import render_html
from autotune.output.report import report_data
from autotune.results import BASELINE, SEARCH, recommendation, write_best_config

URL = "postgresql+psycopg2://tuner:SECRET@db-host:5432/autotune?sslpassword=SECRET"
SHOWN = "postgresql+psycopg2://tuner:***@db-host:5432/autotune?sslpassword=***"
# A password as a URL must write '@' and '/': percent-encoded. A driver's error text, a
# log line or a connection string shows it decoded, so neither form may show.
ENCODED_URL = "postgresql+psycopg2://tuner:p%40ss%2Fw0rd@db-host/autotune?sslpassword=t%26ken99"
ENCODED_SHOWN = "postgresql+psycopg2://tuner:***@db-host/autotune?sslpassword=***"
ENCODED_SECRETS = ("p%40ss%2Fw0rd", "p@ss/w0rd", "t%26ken99", "t&ken99")
OK = Measurement(status="ok", samples_per_s=1.0, peak_mem_bytes=100)


def _result(url: str = URL) -> TuneResult:
    trials = [
        TrialRecord(0, Config(batch_size=8), OK, 100.0, BASELINE),
        TrialRecord(1, Config(batch_size=16), OK, 150.0, SEARCH),
    ]
    return TuneResult.from_trials("s", url, trials, environment={"device": "cpu"})


def _outputs(url: str, tmp_path) -> dict[str, str]:
    """Every text autotune writes or prints that may quote the storage ``url``: the files
    and pages of a result made with it, every export of evidence that holds it, and an
    error message that quotes the URL and its secrets (as written and decoded)."""
    result = _result(url)
    raw_evidence = {**recommendation(result), "study": {"name": "s", "storage": url}}
    error = f"cannot open {url!r}: secrets {' '.join(ENCODED_SECRETS)} rejected"
    return {
        "TuneResult.storage": result.storage,
        "best_config.yaml": write_best_config(result, tmp_path / "best.yaml").read_text(),
        "report.json": json.dumps(report_data(result, {})),
        "report.html": render_html(result, {}, {}, [], "space.yaml"),
        **{
            f"export {fmt}": export_config(result.best.config, fmt, evidence=raw_evidence)
            for fmt in FORMATS
        },
        "error text": scrub(error, url),
    }


def test_a_result_keeps_only_the_redacted_storage():
    assert _result().storage == SHOWN
    assert _result(ENCODED_URL).storage == ENCODED_SHOWN


def test_a_percent_encoded_password_shows_in_no_output_encoded_or_decoded(tmp_path):
    outputs = _outputs(ENCODED_URL, tmp_path)
    for where, text in outputs.items():
        for secret in ENCODED_SECRETS:
            assert secret not in text, (where, secret)
    assert outputs["TuneResult.storage"] == ENCODED_SHOWN
    assert "tuner:***@db-host" in outputs["error text"]


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
    # evidence that still holds the raw URL (the result itself stores it redacted)
    evidence = {**recommendation(result), "study": {"name": "s", "storage": URL}}
    for fmt in FORMATS:
        out = export_config(result.best.config, fmt, evidence=evidence)
        assert "SECRET" not in out, fmt
    assert SHOWN in export_config(result.best.config, "json", evidence=evidence)
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
