"""Where a trial's time goes, for a stored study: each run's phases (process start,
imports, device, workload build, warm-up, compile, timed window, result and exit) and
the medians the summary prints.

    autotune run search_spaces/cpu.yaml               # the quick start, on an idle machine
    python benchmarks/overhead.py search_spaces/cpu.yaml [--storage URL] [--study-name N]

Every run of the study is listed (confirmation runs included), not one per config.
"""

from __future__ import annotations

import argparse
import statistics
import sys

from autotune.space_file import load_space
from autotune.study.storage import load_result, records


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("space")
    p.add_argument("--storage")
    p.add_argument("--study-name")
    args = p.parse_args()
    study, result = load_result(load_space(args.space), args.storage, args.study_name)
    rows = [(t, s) for t in records(study) if (s := t.measurement.time_split()) is not None]
    if not rows:
        print("no run of this study recorded its phases (older than the split?)")
        return 1
    names = list(rows[0][1][0])
    print("  #  " + " ".join(f"{n[:9]:>9}" for n in names) + "     total  fixed")
    for t, (parts, total) in rows:
        fixed = t.measurement.fixed_s
        cells = " ".join(f"{parts[n]:9.2f}" for n in names)
        print(f"{t.number:3d}  {cells}  {total:8.2f}  {fixed / total:5.0%}")
    print(
        "median " + " ".join(f"{statistics.median(s[0][n] for _, s in rows):9.2f}" for n in names)
    )
    share = statistics.median(t.measurement.fixed_s / s[1] for t, s in rows)
    print(f"{len(rows)} runs; fixed cost (all but warm-up, compile, timed): median {share:.0%}")
    split = result.time_split()
    if split:
        parts = " ".join(f"{k} {v:.2f}" for k, v in split[0].items())
        print(f"the summary's medians (one run per config, {split[2]} configs): {parts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
