"""What a step under FakeTensorMode + MemTracker predicts, against a real trial's peak.

    python benchmarks/fake_memory.py            # the `wide` test workload, batch 64 and 2048

For docs/memory.md ("Before any trial"): the fake step counts tensor bytes only (weights,
gradients, activations, optimizer state), never the process's own memory or the
allocator's, so it is a lower bound of a trial's measured peak, not an estimate of it.
Prints, per batch size, MemTracker's peak tensor bytes and a real trial's peak RSS.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.mem_tracker import MemTracker

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from workloads import wide  # noqa: E402

from autotune import Config, load_space  # noqa: E402
from autotune.study.runner import run_trial  # noqa: E402

MiB = 2**20


def fake_peak(batch_size: int) -> int:
    """MemTracker's peak tensor bytes over two fake training steps at ``batch_size``."""
    workload = wide()
    with FakeTensorMode() as mode:
        model = workload.model()
        optimizer = workload.optimizer(model.parameters())
        dataset = workload.dataset()
        real = torch.utils.data.default_collate([dataset[i] for i in range(batch_size)])
        batch = [mode.from_tensor(t) for t in real]
        tracker = MemTracker()
        tracker.track_external(model, optimizer)
        with tracker:
            for _ in range(2):  # the second step holds the optimizer state
                workload.loss(model, batch).backward()
                optimizer.step()
                optimizer.zero_grad()
                tracker.reset_mod_stats()
        return tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]


def main() -> int:
    folder = Path(tempfile.mkdtemp())
    (folder / "space.yaml").write_text(
        f"workload: {ROOT / 'tests' / 'workloads.py'}:wide\n"
        "global_batch: free\ntrial: {warmup_steps: 1, measured_steps: 3}\n"
    )
    space = load_space(folder / "space.yaml")
    for batch_size in (64, 2048):
        fake = fake_peak(batch_size)
        m = run_trial(space, Config(batch_size=batch_size), folder / f"bs{batch_size}")
        rss = m.peak_mem_bytes / MiB if m.ok else float("nan")
        print(
            f"batch {batch_size}: fake step {fake / MiB:.0f} MiB of tensors; "
            f"trial peak RSS {rss:.0f} MiB"
        )
    return 0


if __name__ == "__main__":
    import docblock  # in this script's folder, first on sys.path

    sys.exit(docblock.run(main, "fake_memory.py"))
