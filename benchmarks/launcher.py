"""The warm launcher against plain spawn: the quick start run back to back both ways.

    python benchmarks/launcher.py search_spaces/cpu.yaml --rounds 2   # on an idle machine
    python benchmarks/launcher.py search_spaces/cpu.yaml --rounds 4 \
        --trials batch_size=32,accumulation_steps=4 batch_size=128,amp_dtype=bf16

Each round runs ``autotune run`` (the CLI, in its own process, as a user runs it) on a
copy of the space with ``trial.launcher: fork`` and on one with ``spawn``, each in a
fresh folder and study, the order rotated round by round (spawn first in odd rounds).
It prints, per run, the wall time of the whole command, the runs it made (trials,
confirmation runs and the probe), the compiles on a cold cache, and the median share
of a trial's wall time spent on fixed cost (``Measurement.fixed_s``: process start,
imports, device, build, result and exit, over every run of the study:
``autotune.measurement.fixed_cost``); then the ratio fork/spawn of each round's wall
times and their median, the ratio of every fork and spawn run that made the same runs
(the same configs in the same order: the same ``path`` digest), and the ratio of the
wall times of all rounds, in all and per run.

The search is the same both ways (same seed) but not the same trials: it follows the
measured throughputs, so the two runs can take other configs, and another count of
compiles, which dominate the quick start's time. Each line says how many each made.

``--trials CONFIG ...`` compares single trials instead: each config's trial forked and
spawned side by side in rotated rounds, each run in a fresh folder (a compiled config
compiles cold each time); it prints the fork/spawn ratios of throughput and cold compile
time and the difference of peak memory.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from autotune import Config
from autotune.measurement import fixed_cost
from autotune.space import LAUNCHERS
from autotune.space_file import load_space
from autotune.study.runner import run_trial
from autotune.study.storage import load_result, records


def _space_copy(space: Path, how: str, folder: Path) -> Path:
    """The space with ``trial.launcher: how``, its workload path made absolute and its
    study stored in ``folder``."""
    data = yaml.safe_load(space.read_text())
    target = str(data["workload"])
    path, sep, attr = target.rpartition(":")
    if sep and (path.endswith(".py") or "/" in path):
        data["workload"] = f"{(space.parent / path).resolve()}:{attr}"
    data.setdefault("trial", {})["launcher"] = how
    data.setdefault("study", {})["storage"] = f"sqlite:///{folder / 'study.db'}"
    copy = folder / space.name
    copy.write_text(yaml.safe_dump(data, sort_keys=False))
    return copy


def one_run(space: Path, how: str) -> dict:
    folder = Path(tempfile.mkdtemp(prefix=f"launcher-{how}-"))
    copy = _space_copy(space, how, folder)
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "autotune", "run", str(copy)],
        cwd=folder,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    wall = time.monotonic() - start
    if done.returncode != 0:
        raise SystemExit(f"autotune run failed ({how}): {done.stderr.strip()[-2000:]}")
    loaded = load_space(copy)
    study, _ = load_result(loaded, None, None)
    ms = [t.measurement for t in records(study)]
    overhead = fixed_cost(ms)
    specs = sorted((folder / "autotune-runs").glob("*/*/spec.json"))
    configs = [json.dumps(json.loads(p.read_text()).get("config"), sort_keys=True) for p in specs]
    return {
        "how": how,
        "wall_s": wall,
        "runs": len(specs),
        # the same digest: the same runs of the same configs in the same order
        "path": hashlib.sha256("\n".join(configs).encode()).hexdigest()[:6],
        "cold": sum(1 for m in ms if m.compile_cache == "cold"),
        "fixed_share": overhead[1] if overhead else float("nan"),
        "launchers": sorted({m.launcher for m in ms if m.launcher}),
        "folder": str(folder),
    }


def _config(text: str) -> Config:
    """``batch_size=128,amp_dtype=bf16`` as a config."""
    pairs = (item.split("=", 1) for item in text.split(",") if item)
    return Config.from_dict({k: yaml.safe_load(v) for k, v in pairs})


def paired_trials(space_path: Path, configs: list[str], rounds: int) -> None:
    """Each config's trial forked and spawned, side by side in rotated rounds (each run
    in a fresh folder: a compiled config compiles cold every time); the ratios."""
    space = load_space(space_path)
    for text in configs:
        config = _config(text)
        rates, compiles, memory = [], [], []
        for r in range(rounds):
            got = {}
            for how in LAUNCHERS[::-1] if r % 2 == 0 else LAUNCHERS:
                folder = Path(tempfile.mkdtemp(prefix=f"trial-{how}-")) / "trial-0000"
                trial = dataclasses.replace(space.trial, launcher=how)
                m = run_trial(dataclasses.replace(space, trial=trial), config, folder)
                if not m.ok or m.launcher != how:
                    raise SystemExit(f"{config.short()} ({how}): {m.status} {m.reason}")
                got[how] = m
            fork, spawn = got["fork"], got["spawn"]
            rates.append(fork.rate / spawn.rate)
            if fork.compile_s and spawn.compile_s:
                compiles.append(fork.compile_s / spawn.compile_s)
            memory.append((fork.peak_mem_bytes - spawn.peak_mem_bytes) / 2**20)
        print(
            f"{config.short()}: fork/spawn throughput median {statistics.median(rates):.2f} "
            f"({', '.join(f'{x:.2f}' for x in rates)})"
            + (
                f"; cold compile median {statistics.median(compiles):.2f} "
                f"({', '.join(f'{x:.2f}' for x in compiles)})"
                if compiles
                else ""
            )
            + f"; peak RSS fork - spawn {min(memory):+.0f} to {max(memory):+.0f} MiB",
            flush=True,
        )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("space", type=Path)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument(
        "--trials",
        nargs="+",
        metavar="CONFIG",
        help="compare single trials of these configs instead of whole studies "
        "(e.g. batch_size=128,amp_dtype=bf16)",
    )
    args = p.parse_args()
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    if args.trials:
        paired_trials(args.space, args.trials, args.rounds)
        return 0
    rows, ratios = [], []
    for r in range(args.rounds):
        order = LAUNCHERS[::-1] if r % 2 == 0 else LAUNCHERS
        walls = {}
        for how in order:
            row = one_run(args.space, how)
            rows.append(row)
            walls[how] = row["wall_s"]
            print(
                f"round {r + 1} {how:5s}: {row['wall_s']:6.1f} s, {row['runs']} runs "
                f"(path {row['path']}), "
                f"{row['cold']} cold compiles, fixed cost median {row['fixed_share']:.0%} "
                f"of a trial ({'/'.join(row['launchers'])}; {row['folder']})",
                flush=True,
            )
        ratios.append(walls["fork"] / walls["spawn"])
        print(f"round {r + 1}: fork/spawn wall time {ratios[-1]:.2f}", flush=True)
    same = [
        (f["wall_s"] / s["wall_s"], f["path"])
        for f in rows
        if f["how"] == "fork"
        for s in rows
        if s["how"] == "spawn" and s["path"] == f["path"]
    ]
    for ratio, path in same:
        print(f"fork/spawn wall time on the same runs (path {path}): {ratio:.2f}")
    print(
        f"median fork/spawn wall time over {len(ratios)} round(s): "
        f"{statistics.median(ratios):.2f} ({1 - statistics.median(ratios):.0%} less)"
    )
    # Two runs of a round can make other searches (31-55 runs): the whole wall time of
    # every round each way estimates what a quick start costs on average, and the wall
    # time per run compares launchers on whatever runs each made.
    total = {h: sum(r["wall_s"] for r in rows if r["how"] == h) for h in LAUNCHERS}
    runs = {h: sum(r["runs"] for r in rows if r["how"] == h) for h in LAUNCHERS}
    pooled = total["fork"] / total["spawn"]
    per_run = (total["fork"] / runs["fork"]) / (total["spawn"] / runs["spawn"])
    print(
        f"all rounds: fork {total['fork']:.1f} s ({runs['fork']} runs), spawn "
        f"{total['spawn']:.1f} s ({runs['spawn']} runs): fork/spawn {pooled:.2f} "
        f"({1 - pooled:.0%} less); per run {per_run:.2f}"
    )
    for how in LAUNCHERS:
        shares = [row["fixed_share"] for row in rows if row["how"] == how]
        print(f"{how}: fixed cost median {statistics.median(shares):.0%} of a trial's wall time")
    return 0


if __name__ == "__main__":
    import docblock  # in this script's folder, first on sys.path

    sys.exit(docblock.run(main, "launcher.py"))
