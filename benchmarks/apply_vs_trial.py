"""Does ``autotune.apply`` in a user's script train as fast as the trial that measured it?

    python benchmarks/apply_vs_trial.py                               # cpu.yaml, its baseline
    python benchmarks/apply_vs_trial.py --config autotune-runs/cpu/best_config.yaml --rounds 5

Each round runs the config twice, each in a fresh process: once as a trial
(``autotune.study.runner.run_trial``: the trial subprocess, endless stream sampler) and once as
a user would (this script in a subprocess: the workload's factories,
``autotune.load_config`` + ``autotune.apply`` with the default epoch loader, the same
warm-up and measured steps, timed with ``perf_counter``). It prints samples/s of both per
round and the median ratio apply / trial; 1.00 means the same speed. Rounds alternate so
that drift of a shared machine hits both sides alike.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def user_loop(space_path: str, config_path: str) -> dict:
    """What a user's training script does with an exported config; runs in its own process."""
    import torch

    import autotune
    from autotune.workload import load_workload

    space = autotune.load_space(space_path)
    config = autotune.load_config(config_path)
    w = load_workload(space.workload, space.workload_args, space.base_dir)
    run = autotune.apply_workload(config, w, device=space.device, seed=space.trial.seed)

    def batches():
        while True:
            yield from run.loader

    stream = batches()
    for _ in range(space.trial.warmup_steps):
        run.train_step(stream)
    if run.device.type == "cuda":
        torch.cuda.synchronize()
    steps = space.trial.measured_steps
    start = time.perf_counter()
    for _ in range(steps):
        run.train_step(stream)
    if run.device.type == "cuda":
        torch.cuda.synchronize()
    return {"samples_per_s": steps * config.global_batch / (time.perf_counter() - start)}


def _apply_in_subprocess(space: str, config: str) -> float:
    out = subprocess.run(
        [sys.executable, __file__, "--space", space, "--config", config, "--user-loop"],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])["samples_per_s"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--space", default=str(ROOT / "search_spaces" / "cpu.yaml"))
    p.add_argument("--config", help="a best_config.yaml (default: the space's baseline)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--user-loop", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.user_loop:
        print(json.dumps(user_loop(args.space, args.config)))
        return 0

    import yaml

    import autotune
    from autotune.study.runner import run_trial

    space = autotune.load_space(args.space)
    tmp = Path(tempfile.mkdtemp(prefix="autotune-apply-vs-trial-"))
    if args.config:
        config = autotune.load_config(args.config)
    else:
        config = space.baseline
    config_path = tmp / "config.yaml"
    config_path.write_text(yaml.safe_dump({"config": config.to_dict()}))
    print(f"config {config.short()} · workload {space.workload} · trial {asdict(space.trial)}")
    ratios = []
    for i in range(args.rounds):
        m = run_trial(space, config, tmp / f"trial-{i}")
        if not m.ok:
            print(f"round {i}: the trial failed: {m.status}: {m.reason}")
            return 1
        applied = _apply_in_subprocess(args.space, str(config_path))
        ratios.append(applied / m.samples_per_s)
        print(
            f"round {i}: trial {m.samples_per_s:8.1f} samples/s (cv {m.step_time_cv:.0%}) · "
            f"apply {applied:8.1f} samples/s · ratio {ratios[-1]:.3f}"
        )
    print(
        f"apply / trial throughput: median {statistics.median(ratios):.3f} "
        f"(min {min(ratios):.3f}, max {max(ratios):.3f}, {args.rounds} rounds)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
