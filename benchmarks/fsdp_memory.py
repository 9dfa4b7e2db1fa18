"""Peak RSS per rank of DDP against FSDP2 on the CPU, with glibc's default allocator
settings and with a fixed mmap threshold (docs/fsdp.md, "The CPU caveat").

    python benchmarks/fsdp_memory.py

The `deep` test workload (4 blocks of 2048x2048, 16.8M parameters, AdamW), batch 8 per
rank, 2 gloo ranks, as `tests/e2e/test_fsdp.py` runs it. Each config runs as a real
trial, once with the environment as it is and once with MALLOC_MMAP_THRESHOLD_=131072
(large buffers go back to the system at once, so RSS follows live memory).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune import Config, load_space  # noqa: E402
from autotune.study.runner import run_trial  # noqa: E402

MiB = 2**20


def main() -> int:
    folder = Path(tempfile.mkdtemp())
    (folder / "space.yaml").write_text(
        f"workload: {ROOT / 'tests' / 'workloads.py'}:deep\n"
        "global_batch: free\nlimits: {accuracy: off}\n"
        "trial: {warmup_steps: 1, measured_steps: 3, timeout_s: 240}\n"
    )
    space = load_space(folder / "space.yaml")
    base = Config(batch_size=8, world_size=2)
    configs = {"ddp": base, "fsdp blocks": base.replace(fsdp="blocks")}
    os.environ.pop("MALLOC_MMAP_THRESHOLD_", None)
    for allocator, threshold in (("glibc default", None), ("mmap threshold 128 KiB", "131072")):
        if threshold:
            os.environ["MALLOC_MMAP_THRESHOLD_"] = threshold  # the trial inherits it
        for name, config in configs.items():
            m = run_trial(space, config, folder / f"{name}-{threshold}".replace(" ", "_"))
            peak = f"{m.peak_mem_bytes / MiB:.0f} MiB" if m.ok else m.reason
            print(f"{allocator}: {name}: peak RSS per rank {peak}")
    return 0


if __name__ == "__main__":
    import docblock  # in this script's folder, first on sys.path

    sys.exit(docblock.run(main, "fsdp_memory.py"))
