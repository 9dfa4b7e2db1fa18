"""Does the extended knob space find a config at least as fast as the core space?

    python benchmarks/core_vs_extended.py                    # 30 trials each, 5 rounds
    python benchmarks/core_vs_extended.py --n-trials 20 --rounds 3

Runs two real studies of the built-in CNN back to back with the same seed, trial settings and
budget: the core space (``benchmarks/spaces/cpu_core.yaml``: batch split, AMP dtype, DataLoader
workers, torch.compile, checkpointing) and the extended one (``search_spaces/cpu.yaml``: the
same plus intra-op threads and channels_last). Each study's recommended config is then
re-measured side by side with the baseline, ``--rounds`` rounds, each round running the three
configs in a fresh subprocess in a rotated order so that drift of the machine hits all alike.
It prints the median samples/s of each, the ratio of the medians extended / core, and the
paired ratio: extended / core within each round (both measured minutes apart), whose median
and range cancel the drift between rounds. Run it on an otherwise idle machine: two
processes on two cores change throughput several fold.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CORE = ROOT / "benchmarks" / "spaces" / "cpu_core.yaml"
EXTENDED = ROOT / "search_spaces" / "cpu.yaml"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--core", type=Path, default=CORE)
    p.add_argument("--extended", type=Path, default=EXTENDED)
    p.add_argument("--n-trials", type=int, default=30)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    import dataclasses

    import optuna

    import autotune
    from autotune.study.runner import run_trial

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    tmp = Path(tempfile.mkdtemp(prefix="autotune-core-vs-extended-"))
    winners, spaces = {}, {}
    for name, path in (("core", args.core), ("extended", args.extended)):
        space = autotune.load_space(path)
        space = dataclasses.replace(space, search=dataclasses.replace(space.search, seed=args.seed))
        spaces[name] = space
        start = time.monotonic()
        result = autotune.tune(
            space,
            n_trials=args.n_trials,
            storage=f"sqlite:///{tmp / name}.db",
            out_dir=tmp / name,
        )
        if result.best is None:
            print(f"{name}: no feasible config")
            return 1
        winners[name] = result.best.config
        print(
            f"{name}: {len(result.trials)} configs in {time.monotonic() - start:.0f} s; best "
            f"{result.best.config.short()} {result.best.value:,.1f} samples/s "
            f"({result.speedup:.2f}x its baseline)",
            flush=True,
        )

    if winners["core"].key() == winners["extended"].key():
        print("both studies recommend the same config; measuring it side by side anyway")
    # Side by side, under the extended space's trial settings (a core config is a config of
    # the extended space with the extra knobs at their defaults).
    space = spaces["extended"]
    configs = {"baseline": space.baseline, **winners}
    runs: dict[str, list[float]] = {k: [] for k in configs}
    paired: list[float] = []  # extended / core within one round
    names = list(configs)
    for r in range(args.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        this_round = {}
        for name in order:
            m = run_trial(space, configs[name], tmp / "side-by-side" / f"{r}-{name}")
            if m.ok:
                runs[name].append(m.samples_per_s)
                this_round[name] = m.samples_per_s
            print(f"round {r}: {name:8s} {m.status:7s} {m.samples_per_s or 0:8.1f} samples/s")
        if "core" in this_round and "extended" in this_round:
            paired.append(this_round["extended"] / this_round["core"])
    med = {k: statistics.median(v) if v else float("nan") for k, v in runs.items()}
    print()
    print("| config | what | samples/s (median) | range | vs baseline |")
    print("| --- | --- | --- | --- | --- |")
    for name in names:
        v = runs[name]
        spread = f"{min(v):,.0f}-{max(v):,.0f}" if v else "-"
        print(
            f"| {name} | {configs[name].short()} | {med[name]:,.1f} | {spread} | "
            f"{med[name] / med['baseline']:.2f}x |"
        )
    print(
        f"\nextended / core: {med['extended'] / med['core']:.3f} "
        f"(median of {args.rounds} side-by-side rounds, {args.n_trials} trials per study)"
    )
    if paired:
        print(
            f"paired extended / core per round: median {statistics.median(paired):.3f}, "
            f"range {min(paired):.3f}-{max(paired):.3f}, extended >= core in "
            f"{sum(x >= 1.0 for x in paired)}/{len(paired)} rounds"
        )
    return 0


if __name__ == "__main__":
    import docblock  # in this script's folder, first on sys.path

    sys.exit(docblock.run(main, "core_vs_extended.py"))
