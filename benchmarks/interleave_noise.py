"""Does running a pair side by side, taking turns, make its ratio less noisy than one
run after the other?

    python benchmarks/interleave_noise.py --rounds 12 --pair compile

Issue 41: on the 2-core development VM a paired round's ratio of two configs spread
0.67-1.42x (sd of its log 0.16-0.20), while the same pair's runs, each alone, moved
together: the machine's speed drifts over seconds (a matmul loop's one-second rates
0.87-1.06x of their median, 2026-12-07), and runs 5-10 s apart see different stretches
of it. :func:`autotune.study.runner.run_interleaved` starts both runs at once and hands
the machine to one at a time, a quarter second each (``--turn-s``), so both windows see
the same stretch.

Each round measures the pair both ways, in fresh trial processes of
``search_spaces/cpu.yaml``'s CNN: one after the other (:func:`run_trial`, the order
rotated by round), and interleaved (who takes the first turn rotated too); which way
goes first alternates by round. Pairs (``--pair``): ``compile`` (A: bs=32 acc=4 bf16; B:
the same compiled), ``batch`` (A: bs=32 acc=4 bf16; B: bs=64 acc=2 bf16), ``workers``
(A: bs=32 acc=4 bf16; B: the same with one DataLoader worker), ``same`` (A against A:
both ways should centre on 1.0), ``compiled-batch`` (A: bs=32 acc=4 bf16 compiled; B:
bs=64 acc=2 bf16 compiled: the batch-size call cpu.yaml's study 2 of ba2736b dropped as
within noise, 0.96-1.00x, and the judge measured at 1.06x) and ``compiled-128`` (A:
bs=64 acc=2 bf16 compiled; B: bs=128 acc=1 bf16 compiled: the pair whose two ways
differed by 7% in that judge, 0.959 side by side and 1.029 one after the other).
Printed per round, B/A each way; over the rounds the median, range and standard
deviation of ``log(B/A)``: the per-round noise a paired decision sees, and whether the
two ways agree on the median (interleaving must not move it). A first untimed round
fills the compile cache. Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import tempfile
from dataclasses import replace
from pathlib import Path

from window_noise import spread_line  # benchmarks/, the script's own folder

from autotune import load_space
from autotune.study.runner import TURN_S, run_interleaved, run_trial
from autotune.study.scoring import objective

ROOT = Path(__file__).resolve().parent.parent
WAYS = ("one after the other", "interleaved")


def pair(space, name: str):  # noqa: ANN001, ANN201
    a = replace(space.baseline, batch_size=32, accumulation_steps=4, amp_dtype="bf16")
    compiled = replace(a, compile_mode="default")
    wide = replace(compiled, batch_size=64, accumulation_steps=2)
    return {
        "compile": (a, compiled),
        "batch": (a, replace(a, batch_size=64, accumulation_steps=2)),
        "workers": (a, replace(a, num_workers=1)),
        "same": (a, a),
        "compiled-batch": (compiled, wide),
        "compiled-128": (wide, replace(wide, batch_size=128, accumulation_steps=1)),
    }[name]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument(
        "--pair",
        choices=("compile", "batch", "workers", "same", "compiled-batch", "compiled-128"),
        default="compile",
    )
    parser.add_argument("--turn-s", type=float, default=TURN_S)
    args = parser.parse_args()
    space = load_space(ROOT / "search_spaces" / "cpu.yaml")
    a, b = pair(space, args.pair)
    folder = Path(tempfile.mkdtemp())
    ratios: dict[str, list[float]] = {w: [] for w in WAYS}
    for r in range(-1, args.rounds):  # round -1: the compile cache fills, untimed
        got: dict[str, float] = {}
        for way in WAYS if r % 2 == 0 else WAYS[::-1]:
            runs = [("A", a), ("B", b)] if r % 2 == 0 else [("B", b), ("A", a)]
            where = [folder / f"r{r}-{way[0]}-{n}" for n, _ in runs]
            if way == WAYS[1]:
                ms = run_interleaved(space, [c for _, c in runs], where, args.turn_s)
            else:
                ms = [run_trial(space, c, f) for (_, c), f in zip(runs, where, strict=True)]
            for (n, _), m in zip(runs, ms, strict=True):
                assert m.ok, m.reason
                got[f"{way}:{n}"] = objective(m, space.trial)
        if r < 0:
            continue
        parts = []
        for way in WAYS:
            ra, rb = got[f"{way}:A"], got[f"{way}:B"]
            ratios[way].append(rb / ra)
            parts.append(f"{way}: B/A {rb / ra:.3f} (A {ra:,.0f}/s)")
        print(f"round {r + 1}: " + "; ".join(parts), flush=True)
    for way in WAYS:
        print(spread_line(way, ratios[way]))


if __name__ == "__main__":
    main()
