"""What skipping configs predicted over memory saves: a real study with and without it.

    # the figures of docs/memory.md (CPU; run it alone on the machine: RSS and time)
    python benchmarks/memory_prediction.py --trials 10 --seeds 3
    # a quick check that it runs (not figures)
    python benchmarks/memory_prediction.py --trials 3 --seeds 1 --sizes 64,256,1024

The workload (``tests/workloads.py:wide``) holds ~100 KiB of activations per sample, so
its peak RSS grows with the micro-batch. Two calibration trials (the smallest and the
largest batch, not counted) fix a ``limits.memory`` in bytes between the peaks of the
middle two batch sizes: about half the sizes exceed it. The same space (batch size x
zero_grad_set_to_none, a memory knob for the model: gradients kept or freed between
steps; bf16 autocast would be one too, but is slow on a CPU) is then searched with
``search.predict_memory`` on and off, same seed and budget, and the script prints the
trials run, those that went over the budget, the minutes they took, and the configs
skipped. A skipped config measured by the other run is checked: it must not have fit.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from autotune import Config, load_space, tune
from autotune.measurement import OOM, OVER_MEMORY, PREDICTED_OVER_MEMORY
from autotune.results import DUPLICATE, TuneResult
from autotune.study.runner import run_trial

WORKLOAD = Path(__file__).resolve().parent.parent / "tests" / "workloads.py"
SIZES = (64, 128, 256, 512, 1024, 2048)
SPACE = """\
workload: {workload}:wide
device: cpu
knobs:
  batch_size: [{sizes}]
  zero_grad_set_to_none: [true, false]
baseline: {{batch_size: {baseline}}}
global_batch: free
limits: {{memory: {budget}}}
trial: {{warmup_steps: 1, measured_steps: 3, timeout_s: 300}}
search: {{confirm_top: 0, prune: false, seed: {seed}, predict_memory: {predict}}}
budget: {{n_trials: {trials}}}
"""


def _write(folder: Path, name: str, **fields: object) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(SPACE.format(workload=WORKLOAD, **fields))
    return path


def calibrate(folder: Path, sizes: list[int]) -> int:
    """A budget in bytes between the peaks of the two middle batch sizes (a line through
    the measured peaks of the smallest and largest)."""
    space = load_space(
        _write(
            folder,
            "probe",
            sizes=", ".join(map(str, sizes)),
            baseline=sizes[0],
            budget="null",
            seed=0,
            predict="false",
            trials=1,
        )
    )
    small = run_trial(space, Config(batch_size=sizes[0]), folder / "small")
    large = run_trial(space, Config(batch_size=sizes[-1]), folder / "large")
    if not (small.ok and large.ok and small.peak_mem_bytes and large.peak_mem_bytes):
        sys.exit(
            f"calibration failed: {small.status} {small.reason} / {large.status} {large.reason}"
        )
    slope = (large.peak_mem_bytes - small.peak_mem_bytes) / (sizes[-1] - sizes[0])
    mid = len(sizes) // 2
    between = (sizes[mid - 1] + sizes[mid]) / 2
    budget = int(small.peak_mem_bytes + slope * (between - sizes[0]))
    print(
        f"calibration: bs={sizes[0]} {small.peak_mem_bytes / 2**20:.0f} MiB, "
        f"bs={sizes[-1]} {large.peak_mem_bytes / 2**20:.0f} MiB -> budget "
        f"{budget / 2**20:.0f} MiB ({budget} bytes)"
    )
    return budget


def could_not_fit(status: str) -> bool:
    return status in (OVER_MEMORY, OOM)


def figures(result: TuneResult) -> dict[str, object]:
    ran = [t for t in result.trials if t.role != DUPLICATE and t.status != PREDICTED_OVER_MEMORY]
    over = [t for t in ran if could_not_fit(t.status)]
    return {
        "ran": len(ran),
        "over": len(over),
        "over_min": sum(t.measurement.wall_s or 0.0 for t in over) / 60,
        "all_min": sum(t.measurement.wall_s or 0.0 for t in ran) / 60,
        "skipped": [t.config for t in result.trials if t.status == PREDICTED_OVER_MEMORY],
        "best": result.best.config.short() if result.best else "-",
        "statuses": {t.config.key(): t.status for t in ran},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10, help="budget.n_trials of each run")
    parser.add_argument("--seeds", type=int, default=3, help="sampler seeds 0..N-1")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="batch sizes")
    args = parser.parse_args(argv)
    sizes = sorted(int(s) for s in args.sizes.split(","))
    folder = Path(tempfile.mkdtemp(prefix="memory-prediction-"))
    budget = calibrate(folder, sizes)
    rows, false_skips = [], []
    for seed in range(args.seeds):
        runs = {}
        for predict in (True, False):
            name = f"seed{seed}-{'on' if predict else 'off'}"
            space = load_space(
                _write(
                    folder,
                    name,
                    sizes=", ".join(map(str, sizes)),
                    baseline=sizes[0],
                    budget=budget,
                    seed=seed,
                    predict=str(predict).lower(),
                    trials=args.trials,
                )
            )
            result = tune(space, storage=f"sqlite:///{folder}/{name}.db", out_dir=folder / name)
            runs[predict] = figures(result)
            rows.append((seed, predict, runs[predict]))
        measured = runs[False]["statuses"]
        for config in runs[True]["skipped"]:
            status = measured.get(config.key())
            if status is not None and not could_not_fit(status):
                false_skips.append(f"seed {seed}: {config.short()} skipped but {status}")
    print(f"\nbudget {budget / 2**20:.0f} MiB; batch sizes {sizes}; {args.trials} trials a run")
    print(
        "| seed | prediction | trials run | over the budget | minutes on them | "
        "minutes in all | skipped | best |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for seed, predict, f in rows:
        print(
            f"| {seed} | {'on' if predict else 'off'} | {f['ran']} | {f['over']} | "
            f"{f['over_min']:.2f} | {f['all_min']:.2f} | {len(f['skipped'])} | {f['best']} |"
        )
    for line in false_skips:
        print(f"FALSE SKIP: {line}")
    print(f"runs kept in {folder}")
    return 1 if false_skips else 0


if __name__ == "__main__":
    import docblock  # in this script's folder, first on sys.path

    sys.exit(docblock.run(main, "memory_prediction.py"))
