"""Tune, export, then train with the exported config: the whole loop, on a CPU, in minutes.

    python examples/tune_then_train.py                      # 6 trials of the built-in CNN
    python examples/tune_then_train.py --n-trials 10 --steps 40 --out /tmp/autotune-example

1. tunes a small space over ``examples/cnn.py`` (a study in ``OUT/autotune.db``);
2. exports the recommended config (``OUT/best_config.yaml``, and Hugging Face kwargs);
3. loads the exported file back and trains the same model twice with
   :func:`autotune.apply` -- once with the baseline config, once with the tuned one --
   timing its own loop, and prints the speedup it sees next to the one the tuner measured.

Throughput on a shared machine is noisy; the example alternates the two runs and keeps
each one's best round.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
import time
from pathlib import Path

import autotune
from autotune.output.console import ConsoleReporter, print_summary

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import cnn  # noqa: E402  (the workload next to this file)

SPACE = """
    # written by examples/tune_then_train.py
    workload: {workload}
    workload_args: {{width: 32}}
    knobs:
      batch_size: [16, 32, 64, 128]
      num_workers: [0, 1]
      gradient_checkpointing: [false, true]
    # "your current settings": a small micro-batch and checkpointing, to be safe on memory
    baseline: {{batch_size: 16, gradient_checkpointing: true}}
    global_batch: 128
    trial: {{warmup_steps: 2, measured_steps: 8, timeout_s: 180}}
    budget: {{n_trials: {n_trials}}}
    study: {{name: tune-then-train, storage: "sqlite:///{out}/autotune.db"}}
    search: {{seed: 0}}
    output_dir: {out}/runs
"""


def tune(out: Path, n_trials: int) -> autotune.TuneResult:
    space_file = out / "space.yaml"
    space_file.write_text(
        textwrap.dedent(SPACE).format(
            workload=f"{HERE / 'cnn.py'}:workload", n_trials=n_trials, out=out
        )
    )
    reporter = ConsoleReporter()
    result = autotune.tune(space_file, reporter=reporter)
    print_summary(result, reporter.console)
    return result


def export(result: autotune.TuneResult, out: Path) -> Path:
    """The exported file the training below reads (best_config.yaml is already one)."""
    config, evidence = autotune.load_best(result.best_config_path)
    path = out / "best_config.yaml"
    path.write_text(autotune.export_config(config, "yaml", evidence=evidence))
    print(f"\nexported {path}; as Hugging Face TrainingArguments kwargs:\n")
    print(autotune.export_config(config, "hf", evidence=evidence))
    return path


def train(config: autotune.Config, steps: int, warmup: int = 2) -> float:
    """A plain training loop over :func:`autotune.apply`; returns samples/s of its timed part."""
    w = cnn.workload(width=32)
    run = autotune.apply_workload(config, w, device="cpu")

    def batches():
        while True:  # epochs, as a real loop has them
            yield from run.loader

    stream = batches()
    for _ in range(warmup):
        run.train_step(stream)
    start = time.perf_counter()
    for _ in range(steps):
        loss = run.train_step(stream)
    loss.item()  # wait for the last step
    return steps * config.global_batch / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n-trials", type=int, default=6)
    p.add_argument("--steps", type=int, default=30, help="timed optimizer steps per run")
    p.add_argument("--rounds", type=int, default=3, help="alternating runs of each config")
    p.add_argument("--out", default="autotune-runs/tune-then-train")
    args = p.parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)

    result = tune(out, args.n_trials)
    if result.best is None or result.baseline is None:
        print("no recommendation: nothing to train with")
        return 2
    tuned = autotune.load_config(export(result, out))
    baseline = result.baseline.config

    print(f"training {args.steps} steps per run: baseline {baseline.short()} vs {tuned.short()}")
    rates: dict[str, list[float]] = {"baseline": [], "tuned": []}
    for _ in range(args.rounds):
        rates["baseline"].append(train(baseline, args.steps))
        rates["tuned"].append(train(tuned, args.steps))
    for name, runs in rates.items():
        rounds = ", ".join(f"{r:.1f}" for r in runs)
        print(f"  {name:8}: {max(runs):8.1f} samples/s  (rounds: {rounds})")
    base, best = max(rates["baseline"]), max(rates["tuned"])
    print(f"speedup in this script's own loop: {best / base:.2f}x", end="")
    if result.speedup is not None:
        print(f" (the tuner measured {result.speedup:.2f}x)")
    else:
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
