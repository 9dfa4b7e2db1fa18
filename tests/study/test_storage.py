"""Storage errors quote the storage with its password redacted; the storage URL reaches
neither a worker's command line nor a trial's environment."""

from __future__ import annotations

import optuna
import pytest
from conftest import TINY_SPACE

from autotune import load_space
from autotune.credentials import ENV
from autotune.errors import StorageError
from autotune.study import forks, storage
from autotune.study.sampling import make_sampler
from autotune.study.workers import worker_command

SECRET_URL = "postgresql+psycopg2://tuner:SECRET@127.0.0.1:1/autotune"


@pytest.mark.parametrize(
    "url",
    [
        SECRET_URL,  # nothing listens on port 1: the driver's error
        "post gres://tuner:SECRET@db-host/autotune",  # SQLAlchemy cannot parse it
        "postgresql+psycopg2://tuner:SECRET@db-host:port/autotune",  # nor this one
    ],
)
def test_a_storage_that_cannot_be_opened_is_named_without_its_password(url):
    with pytest.raises(StorageError, match="cannot open storage") as caught:
        storage.open_storage(url)
    assert "SECRET" not in str(caught.value)
    assert "tuner:***@" in str(caught.value)


def test_a_study_from_another_space_is_named_without_the_password(write_space, monkeypatch):
    shared = optuna.storages.InMemoryStorage()
    monkeypatch.setattr(storage, "open_storage", lambda url: shared)
    first = load_space(write_space(TINY_SPACE))
    storage.open_study(first, SECRET_URL, "s", make_sampler(first))
    other = load_space(write_space(TINY_SPACE.replace("[0, 1]", "[0, 2]"), "other.yaml"))
    with pytest.raises(StorageError, match="different space") as caught:
        storage.open_study(other, SECRET_URL, "s", make_sampler(other))
    assert "SECRET" not in str(caught.value) and "tuner:***@" in str(caught.value)
    with pytest.raises(StorageError, match="cannot load study") as caught:
        storage.load_result(first, SECRET_URL, "missing")
    assert "SECRET" not in str(caught.value)


def test_a_worker_gets_the_storage_in_its_environment_not_its_argv(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    cmd, env = worker_command(
        "space.yaml", SECRET_URL, "s", 3, "1", n_trials=4, timeout_s=None, out_dir="runs"
    )
    assert not any("SECRET" in arg or "postgresql" in arg for arg in cmd), cmd
    assert "--storage" not in cmd
    assert env[ENV] == SECRET_URL and env["CUDA_VISIBLE_DEVICES"] == "1"
    assert cmd[cmd.index("--worker-index") + 1] == "3"
    assert cmd[cmd.index("--study-name") + 1] == "s"


def test_trials_do_not_inherit_the_storage(monkeypatch):
    monkeypatch.setenv(ENV, SECRET_URL)
    assert ENV not in forks.run_env({"X": "1"})
