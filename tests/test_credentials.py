"""Storage URLs and their passwords: the redaction rule, where the storage comes from, the
warning about a password written into a space file."""

from __future__ import annotations

import pytest

from autotune.credentials import ENV, has_secret, redact_url, resolve_storage, scrub
from autotune.errors import SpaceError, StorageError
from autotune.space_file import load_space

SPACE = """
    workload: {workloads}:tiny
    knobs: {batch_size: [8, 16]}
    budget: {n_trials: 2}
"""


@pytest.mark.parametrize(
    "url, shown",
    [
        # a user with a password: the password goes, the rest stays
        (
            "postgresql+psycopg2://role:SECRET@127.0.0.1:5432/db",
            "postgresql+psycopg2://role:***@127.0.0.1:5432/db",
        ),
        ("postgresql://:SECRET@host/db", "postgresql://:***@host/db"),
        # a password holding '@' or '/' is masked whole (up to the last '@')
        ("postgresql://me:SE@CR/ET@host/db", "postgresql://me:***@host/db"),
        # a malformed scheme is still redacted (the URL is quoted in error messages)
        ("post gres://me:SECRET@host/db", "post gres://me:***@host/db"),
        # no password: unchanged
        (
            "postgresql+psycopg2://tuner@db-host/autotune",
            "postgresql+psycopg2://tuner@db-host/autotune",
        ),
        ("postgresql://db-host:5432/autotune", "postgresql://db-host:5432/autotune"),
        ("postgresql://me:@host/db", "postgresql://me:@host/db"),
        # secret query parameters
        (
            "mysql+pymysql://host/db?user=me&password=SECRET&charset=utf8",
            "mysql+pymysql://host/db?user=me&password=***&charset=utf8",
        ),
        (
            "postgresql://me:SECRET@host/db?sslmode=require&sslpassword=SECRET",
            "postgresql://me:***@host/db?sslmode=require&sslpassword=***",
        ),
        ("postgresql://host/db?PassWord=SECRET", "postgresql://host/db?PassWord=***"),
        # sqlite and journal paths, even with ':' and '@' in them, are untouched
        ("sqlite:///autotune.db", "sqlite:///autotune.db"),
        ("sqlite:////abs/a:b@c.db", "sqlite:////abs/a:b@c.db"),
        ("sqlite:///C:/runs/a@b.db", "sqlite:///C:/runs/a@b.db"),
        ("journal:///shared/fs/study.log", "journal:///shared/fs/study.log"),
        ("journal:///shared/x:y@z/study.log", "journal:///shared/x:y@z/study.log"),
        ("/shared/fs/a:b@c.log", "/shared/fs/a:b@c.log"),
        ("memory", "memory"),
    ],
)
def test_redact_url_masks_passwords_and_leaves_paths(url, shown):
    assert redact_url(url) == shown
    assert has_secret(url) == (shown != url)
    assert redact_url(shown) == shown  # redacting twice changes nothing


def test_scrub_masks_the_url_and_its_password_in_free_text():
    url = "postgresql://me:hunter22@host/db"
    text = f"cannot parse {url!r}; password hunter22 rejected"
    assert scrub(text, url) == "cannot parse 'postgresql://me:***@host/db'; password *** rejected"
    # a secret too short to search for alone is still gone with its URL
    assert "xy" not in scrub(f"at {'postgresql://me:xy@host/db'}", "postgresql://me:xy@host/db")


def test_the_storage_comes_from_the_flag_then_the_environment_then_the_space(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.delenv("MY_DB", raising=False)
    assert resolve_storage(None, "sqlite:///a.db") == "sqlite:///a.db"
    monkeypatch.setenv(ENV, "sqlite:///env.db")
    assert resolve_storage(None, "sqlite:///a.db") == "sqlite:///env.db"
    assert resolve_storage("sqlite:///flag.db", "sqlite:///a.db") == "sqlite:///flag.db"
    # the space file may name a variable instead of a literal; AUTOTUNE_STORAGE still wins
    assert resolve_storage(None, "sqlite:///a.db", "MY_DB") == "sqlite:///env.db"
    monkeypatch.delenv(ENV)
    with pytest.raises(StorageError, match="MY_DB, which is not set"):
        resolve_storage(None, "sqlite:///a.db", "MY_DB", "space.yaml")
    monkeypatch.setenv("MY_DB", "postgresql://me:SECRET@host/db")
    assert resolve_storage(None, "sqlite:///a.db", "MY_DB") == "postgresql://me:SECRET@host/db"


def test_a_space_file_may_name_the_variable_that_holds_the_storage(
    write_space, monkeypatch, capsys
):
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setenv("TUNER_DB", "postgresql://me:SECRET@host/db")
    space = load_space(write_space(SPACE + "    study: {storage: {env: TUNER_DB}}\n"))
    assert space.study.storage_env == "TUNER_DB"
    assert space.storage_url() == "postgresql://me:SECRET@host/db"
    assert capsys.readouterr().err == ""  # not in the file: no warning
    fingerprint = load_space(write_space(SPACE, "plain.yaml")).fingerprint()
    assert space.fingerprint() == fingerprint  # where the study lives is not the space


@pytest.mark.parametrize(
    "storage, problem",
    [
        ("{env: ''}", "study.storage.env: must be the name of an environment variable"),
        ("{env: 3}", "study.storage.env: must be the name of an environment variable"),
        ("{url: x}", "study.storage: must be a storage URL or {env: VARIABLE}"),
    ],
)
def test_a_bad_storage_mapping_is_a_space_error(write_space, storage, problem):
    with pytest.raises(SpaceError, match="study.storage") as caught:
        load_space(write_space(SPACE + f"    study: {{storage: {storage}}}\n"))
    assert problem in str(caught.value)


def test_a_literal_password_in_the_space_file_warns_once(write_space, monkeypatch, capsys):
    monkeypatch.delenv(ENV, raising=False)
    url = "postgresql+psycopg2://me:SECRET@host/db"
    path = write_space(SPACE + f"    study: {{storage: '{url}'}}\n")
    space = load_space(path)
    assert capsys.readouterr().err == ""  # loading alone says nothing
    assert space.storage_url() == url
    assert load_space(path).storage_url() == url  # used again in the same process
    err = capsys.readouterr().err
    assert err.count("autotune: warning:") == 1, err
    assert "SECRET" not in err
    assert "PGPASSWORD" in err and ENV in err and "{env: VARIABLE}" in err
    assert str(path) in err
    # the storage given some other way: the file's password is not used, no warning
    other = load_space(write_space(SPACE + f"    study: {{storage: '{url}'}}\n", "other.yaml"))
    assert other.storage_url("sqlite:///flag.db") == "sqlite:///flag.db"
    monkeypatch.setenv(ENV, "sqlite:///env.db")
    assert other.storage_url() == "sqlite:///env.db"
    assert capsys.readouterr().err == ""
