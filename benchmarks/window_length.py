"""Does a short window measure a data-bound config with workers as a long one does?

    python benchmarks/window_length.py --rounds 10

Issue 27: a data-bound config with DataLoader workers, measured in a 10-step and in a
40-step window, should differ by at most 5%. A window that starts with the workers'
prefetch queue full took those batches for free (up to ~13% over a short window before
the queue accounting of ``autotune.trial.loop.window_drain``).

Each round runs three fresh trial processes, in an order rotated every round so the
machine's drift hits all alike: the config in a 10-step window, in a 40-step window, and
in a second 40-step window. Printed per round, and as median and range over the rounds:

- ``10/40``: the 10-step window's rate over the 40-step one's (the window-length effect
  plus run-to-run noise);
- ``40/40``: the two 40-step windows' ratio (run-to-run noise alone), the control;
- ``10/40 unpaced``: both windows rated over their whole time, the queue's drain left
  out (``window_drain``), as before the pacing of ``autotune.trial.loop.loader_paced``;
- ``10/40 before``: the 10-step window's rate counting every micro-batch the window took,
  as before the queue accounting.

Workload: ``tests/workloads.py:data_bound`` (an MLP whose collate sleeps 30 ms a batch),
batch 32, 2 workers, 2 warm-up steps. Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from autotune import Config, load_space
from autotune.study.runner import run_trial

ROOT = Path(__file__).resolve().parent.parent
CONFIG = Config(batch_size=32, num_workers=2)


def _space(steps: int, folder: Path):
    path = folder / f"window{steps}.yaml"
    path.write_text(
        f"workload: {ROOT / 'tests' / 'workloads.py'}:data_bound\n"
        "workload_args: {seconds: 0.03}\n"
        "knobs: {batch_size: [32], num_workers: [0, 2]}\n"
        "baseline: {batch_size: 32}\n"
        "global_batch: 32\n"
        # windows of exactly this many steps: the minimum times off (docs/window.md)
        f"trial: {{warmup_steps: 2, measured_steps: {steps}, min_window_s: 0, min_warmup_s: 0}}\n"
    )
    return load_space(path)


def _range(xs: list[float]) -> str:
    return f"median {statistics.median(xs):.3f}, range {min(xs):.3f}-{max(xs):.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp())
    spaces = {"10": _space(10, folder), "40": _space(40, folder), "40b": _space(40, folder)}
    names = list(spaces)
    short, control, unpaced, before = [], [], [], []
    for r in range(args.rounds):
        order = names[r % 3 :] + names[: r % 3]
        got = {}
        for name in order:
            m = run_trial(spaces[name], CONFIG, folder / f"r{r}-{name}")
            assert m.ok, m.reason
            samples = m.measured_steps * CONFIG.global_batch
            whole = samples / m.window_s  # every micro-batch taken, over the whole window
            made = whole * (1 - (m.queue_drained or 0) / m.measured_steps)
            got[name] = (m.samples_per_s, made, whole, m.queue_drained, m.paced_batches)
        short.append(got["10"][0] / got["40"][0])
        control.append(got["40b"][0] / got["40"][0])
        unpaced.append(got["10"][1] / got["40"][1])
        before.append(got["10"][2] / got["40"][1])
        print(
            f"round {r + 1} ({', '.join(order)}): 10-step {got['10'][0]:,.0f} samples/s "
            f"(queue drained {got['10'][3]}, paced over {got['10'][4]} batches), 40-step "
            f"{got['40'][0]:,.0f} and {got['40b'][0]:,.0f}; 10/40 {short[-1]:.3f}, "
            f"40/40 {control[-1]:.3f}, 10/40 unpaced {unpaced[-1]:.3f}, "
            f"10/40 before {before[-1]:.3f}",
            flush=True,
        )
    print(f"10/40: {_range(short)}")
    print(f"40/40 (control): {_range(control)}")
    print(f"10/40 unpaced (the queue accounting alone): {_range(unpaced)}")
    print(f"10/40 before the queue accounting: {_range(before)}")


if __name__ == "__main__":
    main()
