"""Purpose-built faulty workloads: each micro-batch size triggers one kind of fault.

batch 8 trains cleanly; the others raise, blow up memory, abort, segfault, hang or go NaN
in the trial process, so one study meets every fault.
"""

from __future__ import annotations

import ctypes
import os
import time

import torch
from torch.nn import functional as F
from workloads import MLP, Blobs

import autotune

_leak: list[torch.Tensor] = []


def _raise(x):
    raise ValueError("the user's loss function has a bug")


def _huge(x):
    # 32 TiB on the batch's device: the allocator (host or CUDA) refuses at once
    torch.empty(2**45, dtype=torch.uint8, device=x.device)


def _leak_memory(x):
    _leak.append(torch.ones(64 * 2**20, dtype=torch.float32))  # keep 256 MiB per step
    if len(_leak) >= 6:  # over the test's 1.5 GiB cap: stay there for the supervisor's
        time.sleep(1.0)  # polls (every 0.25 s); a step of ms could end before one sees it


def _abort(x):
    os.abort()


def _segfault(x):
    ctypes.string_at(0)


def _hang(x):
    time.sleep(10**6)


FAULTS = {9: _raise, 10: _huge, 11: _leak_memory, 12: _abort, 13: _segfault, 14: _hang}
NAN_BATCH = 15


def _loss(model, batch):
    x, y = batch
    fault = FAULTS.get(x.shape[0])
    if fault is not None:
        fault(x)
    loss = F.cross_entropy(model(x), y)
    return loss * float("nan") if x.shape[0] == NAN_BATCH else loss


def faulty() -> autotune.Workload:
    return autotune.Workload(name="faulty", model=MLP, dataset=Blobs, loss=_loss)


def _broken_toolchain_mlp():
    # Inductor's C++ codegen cannot find its compiler: torch.compile fails, eager works.
    import torch._inductor.config as inductor_config

    inductor_config.cpp.cxx = ("/nonexistent/c++",)
    return MLP()


def compile_error() -> autotune.Workload:
    return autotune.Workload(
        name="compile-error",
        model=_broken_toolchain_mlp,
        dataset=Blobs,
        loss=lambda m, b: F.cross_entropy(m(b[0]), b[1]),
    )


class HangsInWorkers(Blobs):
    """Loads fine in the trial process, hangs in a DataLoader worker process."""

    def __getitem__(self, i: int):
        if torch.utils.data.get_worker_info() is not None:
            time.sleep(10**6)
        return super().__getitem__(i)


class AbortsAtLargeBatches(MLP):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] >= 64:
            os.abort()
        return super().forward(x)


def hangs_and_aborts() -> autotune.Workload:
    """A DataLoader worker that hangs and a forward that aborts at batch 64 or more: two
    faults that leave no Python traceback, only their stacks (faulthandler)."""
    return autotune.Workload(
        name="hangs-and-aborts",
        model=AbortsAtLargeBatches,
        dataset=HangsInWorkers,
        loss=lambda m, b: F.cross_entropy(m(b[0]), b[1]),
    )
