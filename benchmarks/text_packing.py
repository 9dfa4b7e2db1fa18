"""On variable-length text: length grouping vs packing that lets attention cross samples
vs packing that keeps samples apart.

    python benchmarks/text_packing.py --rounds 3 --doc docs/text.md

Measures, side by side in ``--rounds`` paired rounds (each config in a fresh subprocess,
in an order that rotates every round), on ``search_spaces/text.yaml``'s workload and
trial settings (global batch 64), fp32 eager:

- ``grouped``: micro-batch 16 x 4, length grouping (the text study's recommendation);
- ``packed``: micro-batch 64, samples + EOS in rows of 128 (attention crosses samples);
- ``isolated``: micro-batch 64, whole samples in rows of 128 and of 512, positions
  restarting, a block-diagonal mask (SDPA's boolean mask on the CPU).

Prints real tokens/s of each (padding and EOS not counted), its padding share, and the
paired ratio of each config to ``packed`` per round (median and range). Run it on an
otherwise idle machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SPACE = ROOT / "search_spaces" / "text.yaml"
CONFIGS = {
    "grouped": {"batch_size": 16, "length_grouping": "grouped"},
    "packed": {"batch_size": 64, "packing": "packed", "pack_length": 128},
    "isolated-128": {"batch_size": 64, "packing": "isolated", "pack_length": 128},
    "isolated-512": {"batch_size": 64, "packing": "isolated", "pack_length": 512},
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--space", type=Path, default=SPACE)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)

    import autotune
    from autotune.study.runner import run_trial

    space = autotune.load_space(args.space)
    configs = {name: space.config_from(knobs) for name, knobs in CONFIGS.items()}
    tmp = Path(tempfile.mkdtemp(prefix="autotune-text-packing-"))
    rates: dict[str, list[float]] = {k: [] for k in configs}
    padding: dict[str, list[float]] = {k: [] for k in configs}
    ratios: dict[str, list[float]] = {k: [] for k in configs}
    names = list(configs)
    for r in range(args.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        this_round = {}
        for name in order:
            m = run_trial(space, configs[name], tmp / f"{r}-{name}")
            if m.ok:
                rates[name].append(m.tokens_per_s)
                padding[name].append(m.padding_share or 0.0)
                this_round[name] = m.tokens_per_s
            print(
                f"round {r}: {name:12s} {m.status:7s} {m.tokens_per_s or 0:9,.0f} tokens/s "
                f"padding {m.padding_share or 0:.0%}",
                flush=True,
            )
        if "packed" in this_round:
            for name, rate in this_round.items():
                ratios[name].append(rate / this_round["packed"])
    print()
    print("| config | knobs | real tokens/s (median) | range | padding | vs packed (paired) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name in names:
        v, ratio = rates[name], ratios[name]
        med = f"{statistics.median(v):,.0f}" if v else "-"
        spread = f"{min(v):,.0f}-{max(v):,.0f}" if v else "-"
        pad = f"{statistics.median(padding[name]):.0%}" if padding[name] else "-"
        paired = (
            f"{statistics.median(ratio):.2f}x ({min(ratio):.2f}-{max(ratio):.2f}x)"
            if ratio
            else "-"
        )
        print(f"| {name} | `{configs[name].short()}` | {med} | {spread} | {pad} | {paired} |")
    return 0


if __name__ == "__main__":
    import docblock  # in this script's folder, first on sys.path

    sys.exit(docblock.run(main, "text_packing.py"))
