"""Does a longer window make a paired round's ratio less noisy?

    python benchmarks/window_noise.py --rounds 12 --windows 1.5,5

Issue 41: on the 2-core development VM a knob's per-round ratio spread 0.64-1.24x over 8
rounds (cpu.yaml's compile, 2026-12-06). If the spread came from short bursts of other
load inside a 1.5 s window, a longer window would average it away, and the confirmation
should time its rounds longer; if it comes from each run's own luck (which core, which
pages, the other tenants of the hour), only more rounds narrow the interval.

Each round runs, in a rotated order, fresh trial processes of ``search_spaces/cpu.yaml``'s
CNN: ``A`` (bs=32 acc=4 bf16) and ``B`` (the same compiled), once per window length
(``trial.min_window_s``). Printed per round, ``B/A`` for each length (its two runs in the
same round), and over the rounds the median, range and standard deviation of
``log(B/A)``: the per-round noise a paired decision sees. A first untimed round fills the
compile cache. Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
from dataclasses import replace
from pathlib import Path

from autotune import load_space
from autotune.study.runner import run_trial
from autotune.study.scoring import objective

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--windows", default="1.5,5", help="window lengths, s (min_window_s)")
    args = parser.parse_args()
    lengths = [float(w) for w in args.windows.split(",")]
    space = load_space(ROOT / "search_spaces" / "cpu.yaml")
    a = replace(space.baseline, batch_size=32, accumulation_steps=4, amp_dtype="bf16")
    b = replace(a, compile_mode="default")
    runs = [(w, name, c) for w in lengths for name, c in (("A", a), ("B", b))]
    folder = Path(tempfile.mkdtemp())
    ratios: dict[float, list[float]] = {w: [] for w in lengths}
    for r in range(-1, args.rounds):  # round -1: the compile cache fills, untimed
        k = r % len(runs)
        got: dict[tuple[float, str], tuple[float, float, int]] = {}
        for w, name, config in runs[k:] + runs[:k]:
            timed = replace(space, trial=replace(space.trial, min_window_s=w))
            m = run_trial(timed, config, folder / f"r{r}-{name}-{w}")
            assert m.ok, m.reason
            got[(w, name)] = (objective(m, timed.trial), m.window_s or 0.0, m.measured_steps)
        if r < 0:
            continue
        parts = []
        for w in lengths:
            (ra, sa, na), (rb, _, _) = got[(w, "A")], got[(w, "B")]
            ratios[w].append(rb / ra)
            parts.append(f"{w:g} s: B/A {rb / ra:.3f} (A {ra:,.0f}/s over {sa:.1f} s, {na} steps)")
        print(f"round {r + 1}: " + "; ".join(parts), flush=True)
    for w in lengths:
        print(spread_line(f"window {w:g} s", ratios[w]))


def spread_line(label: str, ratios: list[float]) -> str:
    """``label: B/A median ..., range ..., sd of log ... (N rounds)``: the per-round
    noise a paired decision sees (this script's and ``interleave_noise.py``'s)."""
    xs = ratios
    sd = statistics.stdev(math.log(x) for x in xs) if len(xs) > 1 else float("nan")
    return (
        f"{label}: B/A median {statistics.median(xs):.3f}, "
        f"range {min(xs):.3f}-{max(xs):.3f}, sd of log {sd:.3f} ({len(xs)} rounds)"
    )


if __name__ == "__main__":
    main()
