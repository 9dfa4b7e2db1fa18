"""examples/tabular.py, the workload of the held-out grid (benchmarks/spaces/tabular_grid.yaml):
its rows are preprocessed as its docstring says and are the same wherever they are read (a
trial's DataLoader worker included), and it trains through autotune's own loader and step."""

from __future__ import annotations

import math

import torch
from conftest import ROOT

from autotune import Config
from autotune.trial.apply import apply_workload
from autotune.workload import load_workload


def _tabular(n: int = 512):
    return load_workload("examples/tabular.py:workload", {"n": n}, base_dir=ROOT)


def _equal(a, b) -> bool:
    (fa, la), (fb, lb) = a, b
    return fa.keys() == fb.keys() and all(torch.equal(fa[k], fb[k]) for k in fa) and la == lb


def test_tabular_rows_are_imputed_scaled_binned_and_hashed_the_same_every_time():
    workload = _tabular()
    table, again = workload.dataset(), workload.dataset()
    for i in (0, 7, 511):
        assert _equal(table[i], table[i]) and _equal(table[i], again[i])
    rows = [table[i] for i in range(len(table))]
    numeric = torch.stack([f["numeric"] for f, _ in rows])
    missing = torch.stack([f["missing"] for f, _ in rows])
    bins = torch.stack([f["bins"] for f, _ in rows])
    categories = torch.stack([f["categories"] for f, _ in rows])
    labels = torch.stack([label for _, label in rows])
    assert torch.isfinite(numeric).all()  # the ~3% missing values were imputed
    assert 0.01 < missing.mean() < 0.06
    assert numeric.abs().max() < 5.5  # clipped at 5 standard deviations, then noise
    assert bins.min() == 0 and bins.max() == 15  # 16 quantile bins, all used
    assert 0 < (categories == 0).float().mean() < 0.1  # a few dropped to the unknown bucket
    assert categories.max() < 1024
    assert torch.bincount(labels, minlength=4).min() > len(table) // 10


def test_a_loader_worker_yields_the_rows_the_main_process_does():
    """The augmentation is seeded by the row: a trial with workers trains on the same
    samples as one without."""
    workload = _tabular()
    batches = [
        next(iter(apply_workload(Config(batch_size=16, num_workers=w), workload).loader))
        for w in (0, 1)
    ]
    (main, main_labels), (worker, worker_labels) = batches
    assert all(torch.equal(main[k], worker[k]) for k in main)
    assert torch.equal(main_labels, worker_labels)


def test_the_tabular_mlp_learns_the_teacher_through_autotunes_step():
    """20 steps of 64 see each of the 4,096 rows at most once: the loss falls below
    chance (ln 4) by learning the teacher, not by remembering rows."""
    applied = apply_workload(
        Config(batch_size=32, accumulation_steps=2),
        _tabular(n=4096),
        device="cpu",
        endless=True,
    )
    assert len(applied.model.blocks) == 4
    batches = iter(applied.loader)
    losses = [float(applied.train_step(batches)) for _ in range(20)]
    assert sum(losses[-5:]) / 5 < 0.85 * math.log(4)


def test_the_sensor_windows_are_band_passed_as_they_load_and_the_same_every_time():
    """examples/lightning_sensors.py: each item is its raw window with the spectrum outside
    the pass band zeroed, normalised per channel; two data modules read the same items."""
    import importlib.util

    import pytest

    pytest.importorskip("lightning.pytorch")
    spec = importlib.util.spec_from_file_location("sensors", ROOT / "examples/lightning_sensors.py")
    sensors = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sensors)
    module, data = sensors.make_trainer(n=64, length=256, width=8)
    data.setup("fit")
    x, y = data.train_set[3]
    assert x.shape == (6, 256) and 0 <= int(y) < len(sensors.BANDS)
    spectrum = torch.fft.rfft(x, dim=-1).abs()
    bins = torch.fft.rfftfreq(256, 1 / sensors.RATE)
    outside = (bins < sensors.PASS[0]) | (bins > sensors.PASS[1])
    assert spectrum[:, outside].max() < 1e-3 * spectrum.max()  # filtered
    assert torch.fft.rfft(data.train_set.raw[3], dim=-1).abs()[:, outside].max() > 1.0
    assert torch.allclose(x.mean(-1), torch.zeros(6), atol=1e-4)
    assert torch.allclose(x.std(-1), torch.ones(6), atol=1e-3)
    again = sensors.make_trainer(n=64, length=256, width=8)[1]
    again.setup("fit")
    assert torch.equal(again.train_set[3][0], x)
    batch, labels = next(iter(data.train_dataloader()))
    assert module(batch).shape == (32, len(sensors.BANDS)) and labels.shape == (32,)
