"""Storage errors quote the storage with its password redacted."""

from __future__ import annotations

import optuna
import pytest
from conftest import TINY_SPACE

from autotune import load_space
from autotune.errors import StorageError
from autotune.study import storage
from autotune.study.sampling import make_sampler

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
