"""On variable-length text: baseline vs a practitioner's heuristic vs the tuner's pick.

    python benchmarks/text_layout.py --storage sqlite:///text.db   # a study of text.yaml
    python benchmarks/text_layout.py --recommended "batch_size=16,length_grouping=grouped"

Measures, side by side in ``--rounds`` paired rounds (the three configs in a fresh
subprocess each, in an order that rotates every round so the machine's drift hits all
alike), on ``search_spaces/text.yaml``'s workload and trial settings:

- the baseline (the space's: micro-batch 16 x 4, fp32, naive padding);
- a practitioner heuristic: the largest micro-batch of the space, bf16, torch.compile,
  naive padding (what "make it fast" usually means without measuring);
- the recommended config: ``best_config.yaml``'s, read from the stored study of the space
  (``--storage``), or given as ``--recommended knob=value,...``.

Prints real tokens/s (padding not counted) of each, the paired ratio recommended /
heuristic per round (median and range), and each config's peak memory at the longest
batch against the space's memory budget. Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SPACE = ROOT / "search_spaces" / "text.yaml"


def _parse(text: str) -> dict:
    out = {}
    for part in filter(None, text.split(",")):
        key, _, value = part.partition("=")
        out[key.strip()] = yaml.safe_load(value.strip())
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--space", type=Path, default=SPACE)
    p.add_argument("--storage", help="the stored study of the space (its best config)")
    p.add_argument("--recommended", help="knob=value,... instead of a stored study")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)

    import autotune
    from autotune.host import system_memory_bytes
    from autotune.study.runner import run_trial
    from autotune.study.storage import load_result

    space = autotune.load_space(args.space)
    if args.recommended:
        recommended = space.config_from(_parse(args.recommended))
    else:
        _, result = load_result(space, args.storage)
        if result.best is None:
            print("the study has no feasible config")
            return 1
        recommended = result.best.config
    largest = max(space.knobs.get("batch_size", (space.baseline.batch_size,)))
    heuristic = space.config_from(
        {"batch_size": largest, "amp_dtype": "bf16", "compile_mode": "default"}
    )
    configs = {"baseline": space.baseline, "heuristic": heuristic, "recommended": recommended}
    budget = space.limits.memory_bytes(system_memory_bytes())
    tmp = Path(tempfile.mkdtemp(prefix="autotune-text-layout-"))
    rates: dict[str, list[float]] = {k: [] for k in configs}
    longest: dict[str, list[int]] = {k: [] for k in configs}
    paired = []
    names = list(configs)
    for r in range(args.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        this_round = {}
        for name in order:
            m = run_trial(space, configs[name], tmp / f"{r}-{name}")
            if m.ok:
                rates[name].append(m.tokens_per_s)
                this_round[name] = m.tokens_per_s
                longest[name].append(m.peak_longest_bytes or 0)
            print(
                f"round {r}: {name:11s} {m.status:7s} {m.tokens_per_s or 0:9,.0f} tokens/s "
                f"padding {m.padding_share or 0:.0%}",
                flush=True,
            )
        if "recommended" in this_round and "heuristic" in this_round:
            paired.append(this_round["recommended"] / this_round["heuristic"])
    print()
    print(
        "| config | knobs | real tokens/s (median) | range | vs baseline | peak at longest batch |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    base = statistics.median(rates["baseline"]) if rates["baseline"] else float("nan")
    for name in names:
        v = rates[name]
        med = statistics.median(v) if v else float("nan")
        spread = f"{min(v):,.0f}-{max(v):,.0f}" if v else "-"
        peak = max(longest[name]) / 2**20 if longest[name] else float("nan")
        print(
            f"| {name} | `{configs[name].short()}` | {med:,.0f} | {spread} | {med / base:.2f}x | "
            f"{peak:,.0f} MiB |"
        )
    if budget:
        print(f"\nmemory budget: {budget / 2**20:,.0f} MiB")
    if paired:
        print(
            f"recommended / heuristic per round: median {statistics.median(paired):.2f}, "
            f"range {min(paired):.2f}-{max(paired):.2f} ({len(paired)} rounds)"
        )
    return 0


if __name__ == "__main__":
    import docblock  # in this script's folder, first on sys.path

    sys.exit(docblock.run(main, "text_layout.py"))
