"""``python -m autotune.trial.verify SPEC.json RESULT.json``: one run of ``autotune verify``.

A long run of one config, built the way a user's training script builds it: the
workload's factories through the public :func:`autotune.apply_workload`, the shuffled
epoch loader (a new epoch when one ends; ``endless`` in the spec streams the trials'
seeded permutations instead). ``warmup_steps`` optimizer steps run untimed (compile
happens there), then ``steps`` are timed by the wall clock, data loading included; on
CUDA the device is synchronised before each clock reading (:class:`~.clock.StepClock`).

Started by :mod:`autotune.study.verify`, never imported by the driver. Like a trial, a
failure of the workload is data: the result file then holds its status and a one-line
reason. Exit code 0 means the result file was written.
"""

from __future__ import annotations

import time

T0 = time.perf_counter()  # before torch is imported: the process's start-up cost counts

from .guard import die_with_driver  # noqa: E402

if __name__ == "__main__":
    die_with_driver()

import math  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

import autotune  # noqa: E402

from ..config import Config  # noqa: E402
from ..errors import WorkloadError  # noqa: E402
from ..measurement import FAILED, NAN, OK, OOM, TOKENS  # noqa: E402
from ..trial_spec import TrialSpec  # noqa: E402
from .build import load, stored_lengths  # noqa: E402
from .clock import StepClock, spread  # noqa: E402
from .loop import counts_tokens, run_phase, run_warm_up, window_rates, write_json  # noqa: E402
from .main import failure_reason, is_oom  # noqa: E402


class Epochs:
    """The loader's batches epoch after epoch, as a loop over epochs takes them: a new
    iterator (a new shuffle, worker start-up unless persistent) when one is exhausted.

    Attributes:
        started: epochs begun so far.
    """

    def __init__(self, loader: DataLoader) -> None:
        if len(loader) == 0:
            raise WorkloadError(
                f"the dataset ({len(loader.dataset)} samples) holds no full batch of "
                f"{loader.batch_size}"
            )
        self.loader = loader
        self.started = 0
        self._batches: Iterator[Any] | None = None

    def __iter__(self) -> Epochs:
        return self

    def __next__(self) -> Any:
        while True:
            if self._batches is None:
                self._batches = iter(self.loader)
                self.started += 1
            try:
                return next(self._batches)
            except StopIteration:
                self._batches = None


def run(spec: TrialSpec, started: float) -> dict[str, Any]:
    """Build through ``autotune.apply_workload``, warm up, time the spec's
    ``measured_steps`` steps.

    Returns the payload of the result file; exceptions propagate.
    """
    config = spec.config
    if config is None:
        raise WorkloadError("a verify run needs a config")
    workload = load(spec)
    if workload.native is not None:  # a Trainer's or Lightning pair's own loop
        return run_native(spec, started, config, workload)
    endless = spec.endless
    applied = autotune.apply_workload(
        config,
        workload,
        device=spec.device,
        seed=spec.seed,
        endless=endless,
        lengths=stored_lengths(spec) if workload.tokens is not None else None,
    )
    batches: Iterator[Any] = iter(applied.loader) if endless else Epochs(applied.loader)
    startup_s = time.perf_counter() - started
    losses: list[torch.Tensor] = []
    device = applied.device

    def step() -> None:
        losses.append(applied.train_step(batches))

    warmup = StepClock(device)
    warmup.start()
    warmup_steps = run_warm_up(step, spec, device)
    warmup.stop()

    tokens_before = applied.real_tokens
    clock = StepClock(device)

    def timed_step() -> None:
        step()
        clock.mark()

    clock.start()
    steps = run_phase(timed_step, spec.measured_steps, spec.min_window_s, clock.elapsed_s, device)
    clock.stop()

    window_s = clock.window_s
    counted = counts_tokens(workload)
    real = applied.real_tokens - tokens_before
    samples_per_s, tokens_per_s = window_rates(
        workload, steps * config.global_batch, real, window_s
    )
    values = [float(x) for x in torch.stack(losses).cpu().tolist()] if losses else []
    payload = {
        "status": OK,
        "reason": "",
        "unit": TOKENS if workload.tokens is not None else "samples",
        "samples_per_s": samples_per_s,
        "tokens_per_s": tokens_per_s,
        "samples_per_step": config.global_batch,
        "tokens_per_step": real / steps if counted else None,
        "steps": steps,
        "window_s": window_s,
        "warmup_steps": warmup_steps,
        "warmup_s": warmup.window_s,
        "startup_s": startup_s,
        "epochs": None if endless else batches.started,
        "device": str(applied.device),
        "final_loss": values[-1] if values else None,
        **spread(clock.step_times_s()),
    }
    bad = next((i for i, x in enumerate(values) if not math.isfinite(x)), None)
    if bad is not None:
        payload.update(status=NAN, reason=f"loss is {values[bad]} at step {bad}")
    return payload


def run_native(spec: TrialSpec, started: float, config: Config, workload: Any) -> dict[str, Any]:
    """The verify run of a workload from a Trainer or a Lightning pair: the framework's
    own loop (``Trainer.train()``, ``Trainer.fit()``), its sampler and epochs included,
    timed as a trial is (:func:`autotune.trial.native.measure_native`)."""
    from .apply import resolve_device, set_threads
    from .build import Prepared
    from .native import measure_native

    set_threads(config)
    device = resolve_device(spec.device)
    warmup_steps, steps = spec.warmup_steps, spec.measured_steps
    lengths = stored_lengths(spec) if workload.tokens is not None else None
    m = measure_native(Prepared(config, spec, device, workload), started=started, lengths=lengths)
    return {
        "status": m.status,
        "reason": m.reason,
        "unit": m.unit,
        "samples_per_s": m.samples_per_s,
        "tokens_per_s": m.tokens_per_s,
        "samples_per_step": m.samples_per_step,
        "tokens_per_step": m.tokens_per_step,
        "steps": steps,
        "window_s": m.window_s,
        "warmup_steps": warmup_steps,
        "warmup_s": m.warmup_s,
        "startup_s": m.startup_s,
        "epochs": None,
        "device": str(device),
        "loop": m.loop,
        "final_loss": m.losses[-1] if m.losses else None,
        "step_time_median_s": m.step_time_median_s,
        "step_time_cv": m.step_time_cv,
        "step_time_iqr_s": m.step_time_iqr_s,
    }


def main(argv: list[str], *, started: float) -> None:
    """Run the spec at ``argv[0]``, write the result to ``argv[1]``, exit the process."""
    spec_path, result_path = Path(argv[0]), Path(argv[1])
    spec = TrialSpec.read(spec_path)  # the one reading of the spec
    try:
        payload = run(spec, started)
    except Exception as exc:  # the run's failure is data, reported to the driver
        traceback.print_exc()
        payload = {
            "status": OOM if is_oom(exc) else FAILED,
            "reason": failure_reason(exc, spec)[:500],
        }
    payload["wall_s"] = time.perf_counter() - started
    write_json(result_path, payload)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip interpreter teardown: DataLoader workers can make it slow


if __name__ == "__main__":
    main(sys.argv[1:], started=T0)
