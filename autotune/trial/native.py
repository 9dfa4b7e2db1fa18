"""A trial in the framework's own loop: ``Trainer.train()`` or ``Trainer.fit()``, timed.

A workload from a ``transformers.Trainer`` or a Lightning pair carries its framework's
loop (:class:`autotune.frameworks.loop.NativeLoop`). The trial sets the process-wide
knobs as a training script would, runs the loop through the warm-up and the measured
steps, and times it from the hooks: the window runs from the end of the last warm-up step
to the end of the last measured step, so it holds everything the framework does per step
(its sampler, collation, clipping, scheduler, callbacks, logging). Samples and real
tokens are counted in the batches the framework hands the model; the step's loss is the
framework's own sum of its micro-batches' losses. Memory, the accuracy guard, pruning on
progress and compile counters work as in autotune's loop (:mod:`.loop`).

The warm-up and the window each cover their least steps and their least time
(``min_warmup_s``, ``min_window_s``), as in autotune's loop (:func:`.loop.run_phase`,
:func:`autotune.trial_spec.steps_to_run`): the framework's ``max_steps`` is the most
the two can take (:func:`most_steps`), and the hooks tell it to stop (:attr:`Window.done`)
once the window has both. A Lightning pair at 20 ms a step was timed over 0.22 s (10
steps) before (issue 41).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from typing import Any

import torch

from ..errors import WorkloadError
from ..frameworks.loop import framework_frame
from ..measurement import OK, TOKENS, Measurement
from ..trial_spec import MAX_STEPS_FACTOR, steps_to_run
from .apply import sdpa_backend
from .build import Prepared
from .clock import StepClock, peak_memory, reset_peak_memory, spread
from .epoch import EPOCH_STEPS, EpochScale, epoch_scale, epoch_shapes
from .loop import (
    Compiles,
    Progress,
    compile_seconds,
    counts_tokens,
    window_rates,
    with_finite_losses,
)
from .telemetry import open_window
from .tokens import TokenCollate, count_batch

WARMUP, TIMED, DONE = "warm-up", "window", "done"


def most_steps(spec: Any) -> int:
    """The most optimizer steps a framework trial of ``spec`` can take: its warm-up and
    window each extended to their least time, at most ``MAX_STEPS_FACTOR`` times their
    steps (:func:`autotune.trial_spec.steps_to_run`); the framework's ``max_steps``."""
    warmup = spec.warmup_steps
    if warmup and spec.min_warmup_s > 0:
        warmup = 1 + max(warmup - 1, 1) * MAX_STEPS_FACTOR
    window = spec.measured_steps
    if spec.min_window_s > 0:
        window = max(window, 1) * MAX_STEPS_FACTOR
    return warmup + window


def process_settings(config: Any, device: torch.device) -> contextlib.AbstractContextManager:
    """The knobs a script sets for its whole run (threads were set before the workload
    was built): the fp32 matmul precision, cuDNN's autotuner, and the SDPA kernel as a
    context around the run."""
    torch.set_float32_matmul_precision(config.matmul_precision)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = config.cudnn_benchmark
    if config.sdpa_backend == "auto":
        return contextlib.nullcontext()
    from torch.nn.attention import sdpa_kernel

    return sdpa_kernel(sdpa_backend(config.sdpa_backend))


def batch_samples(batch: Any) -> int:
    """The samples in a batch: the first dimension of its first tensor."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    values = batch.values() if isinstance(batch, Mapping) else batch
    if isinstance(values, (list, tuple)) or isinstance(batch, Mapping):
        for value in values:
            if isinstance(value, torch.Tensor) and value.dim():
                return int(value.shape[0])
            if isinstance(value, (list, tuple, Mapping)):
                return batch_samples(value)
    raise WorkloadError(f"cannot count the samples of a {type(batch).__name__} batch")


class Window:
    """The :class:`~autotune.frameworks.loop.Hooks` a framework loop reports to: warm-up,
    then the timed window, with the counts, losses and memory of the window's steps.

    ``warmup_steps`` and ``measured_steps`` start as the spec's least steps and end as
    the steps each phase ran (extended to cover ``min_warmup_s`` and ``min_window_s``)."""

    def __init__(self, prepared: Prepared, progress_path: str | None, counted: bool) -> None:
        self.config, self.device = prepared.config, prepared.device
        self.count_tokens = prepared.workload.count_tokens
        spec = prepared.spec
        self.warmup_steps, self.least_warmup = spec.warmup_steps, spec.warmup_steps
        self.measured_steps, self.least_window = spec.measured_steps, spec.measured_steps
        self.min_warmup_s, self.min_window_s = spec.min_warmup_s, spec.min_window_s
        self.phase = WARMUP
        self.after_first = StepClock(self.device)  # the warm-up's steps after its first
        # The steps (after the warm-up's first; of the window) at which a phase next asks
        # its clock whether it has its time: a CUDA clock syncs when asked, so not at
        # every step (as run_phase asks only where steps_to_run's estimate ends).
        self.warmup_target = max(spec.warmup_steps - 1, 0)
        self.window_target = spec.measured_steps
        self.counted = counted
        self.progress_path = progress_path
        self.compiles = Compiles(self.config.compile_mode != "off")
        self.called = time.perf_counter()
        self.begun: float | None = None
        self.warmup = StepClock(self.device)
        self.clock = StepClock(self.device)
        self.progress: Progress | None = None
        self.steps = 0
        self.step_losses: list[Any] = []
        self.losses: list[torch.Tensor] = []
        self.samples = self.real = self.positions = 0
        self.waited_s = 0.0
        self.last_event = 0.0
        self.compile_before_window = 0.0
        self.peak: dict[str, Any] = {}
        self.telemetry: Any = None
        self.step_positions: list[int] = []  # each window step's padded positions
        self.order: list[int] | None = None  # one epoch of the framework's sampler
        self.multiple = 1

    @property
    def timing(self) -> bool:
        """Whether the window is open: after the warm-up, before the last measured step."""
        return self.phase == TIMED

    @property
    def done(self) -> bool:
        """Whether the window has closed: the framework may stop."""
        return self.phase == DONE

    def begin(self) -> None:
        self.begun = time.perf_counter()
        self.warmup.start()
        if self.warmup_steps == 0:
            self._open()

    def batch(self, batch: Any) -> None:
        now = time.perf_counter()
        if not self.timing:
            return
        self.waited_s += now - self.last_event  # loading, collation and the loop's own work
        self.samples += batch_samples(batch)
        if self.counted:
            self._count(batch)

    def _count(self, batch: Any) -> None:
        counted = count_batch(batch)
        before = self.positions
        if self.count_tokens is not None:
            real = int(self.count_tokens(batch))
            self.real += real
            self.positions += counted[1] if counted else real
        elif counted is not None:
            self.real += counted[0]
            self.positions += counted[1]
        if len(self.step_positions) <= self.steps - self.warmup_steps:
            self.step_positions.append(0)
        self.step_positions[-1] += self.positions - before

    def epoch(self, order: list[int], multiple: int) -> None:
        self.order, self.multiple = order, multiple

    def loss(self, value: Any) -> None:
        self.step_losses.append(value.detach().float().reshape(()))
        self.last_event = time.perf_counter()

    def step_end(self) -> None:
        if self.step_losses:
            self.losses.append(torch.stack(self.step_losses).sum())
        self.step_losses = []
        self.steps += 1
        if self.steps == 1:
            self.compiles.first_step_done()
            self.after_first.start()
        if self.phase == WARMUP and self._warmup_over():
            self.warmup_steps = self.steps
            self.warmup.stop()
            self._open()
        elif self.phase == TIMED and self.progress is not None:
            self.clock.mark()
            self.progress.update(self.clock)
            if self._window_over():
                self.measured_steps = self.steps - self.warmup_steps
                self.phase = DONE
                self.clock.stop()
                self.telemetry.close()
                self.peak = peak_memory(self.device)
        self.last_event = time.perf_counter()

    def _warmup_over(self) -> bool:
        """The warm-up's least steps are done and the steps after its first (which holds
        compile and start-up) took ``min_warmup_s`` (:func:`.loop.run_warm_up`'s rule)."""
        rest = self.steps - 1
        if rest < self.warmup_target:
            return False
        if self.min_warmup_s <= 0:
            return True
        least, elapsed = self.least_warmup - 1, self.after_first.elapsed_s()
        self.warmup_target = steps_to_run(rest, elapsed, least, self.min_warmup_s)
        return self.warmup_target <= rest

    def _window_over(self) -> bool:
        """The window's least steps are done and they took ``min_window_s``."""
        n = self.steps - self.warmup_steps
        if n < self.window_target:
            return False
        if self.min_window_s <= 0:
            return True
        elapsed = self.clock.elapsed_s()
        self.window_target = steps_to_run(n, elapsed, self.least_window, self.min_window_s)
        return self.window_target <= n

    def _open(self) -> None:
        """Open the timed window."""
        if self.warmup_steps == 0:
            self.warmup.stop()
        self.phase = TIMED
        reset_peak_memory(self.device)
        self.compile_before_window = self.compiles.spent_s()
        enabled = self.compiles.enabled
        self.progress = Progress(
            self.progress_path,
            self.warmup.window_s,
            self.compile_before_window if enabled else 0.0,
            self.config.global_batch,
            (lambda: self.real) if self.counted else None,
            (lambda: self.compiles.spent_s() - self.compile_before_window) if enabled else None,
            warmup_steps=self.warmup_steps,
            min_window_s=self.min_window_s,
        )
        self.telemetry = open_window(self.device)  # NVML, /proc, RAPL: docs/energy.md
        self.clock.start()
        self.last_event = time.perf_counter()


def native_epoch_scale(window: Window, lengths: list[int] | None, config: Any) -> EpochScale | None:
    """The epoch's mean step over the window's (:mod:`.epoch`), for a token workload
    whose framework told its epoch's order: each micro-batch padded to its longest
    sample (rounded up to the collator's multiple), as the frameworks' collators do."""
    if not lengths or window.order is None or len(window.step_positions) != window.measured_steps:
        return None
    if max(window.order) >= len(lengths):
        return None  # not the dataset the probe measured
    steps = min(EPOCH_STEPS, len(window.order) // config.global_batch)
    shapes = epoch_shapes(
        iter(window.order),
        lengths,
        TokenCollate(0, window.multiple, "input_ids"),
        config.batch_size,
        config.accumulation_steps,
        steps,
    )
    if not shapes:
        return None
    return epoch_scale(window.clock.step_times_s(), window.step_positions, shapes)


def measure_native(
    prepared: Prepared,
    progress_path: str | None = None,
    *,
    started: float,
    lengths: list[int] | None = None,
) -> Measurement:
    """Run the workload's framework loop for the trial's steps and measure its window.

    With ``lengths`` (every sample's, from the probe) and the epoch's order from the
    framework's sampler, a token workload's rates are the epoch's: a sorted
    ``group_by_length`` epoch's first steps are its longest (``epoch_scale``)."""
    workload, config, device = prepared.workload, prepared.config, prepared.device
    loop = workload.native
    counted = counts_tokens(workload)
    window = Window(prepared, progress_path, counted)
    startup_s = time.perf_counter() - started
    try:
        with process_settings(config, device):
            loop.train(config, device, most_steps(prepared.spec), window)
    except Exception as exc:  # the reason names where in the framework it failed
        frame = framework_frame(exc, loop.framework)
        exc.autotune_where = f"{loop.entry}, {frame}" if frame else loop.entry  # type: ignore[attr-defined]
        raise
    if not window.done or window.begun is None:
        least = window.least_warmup + window.least_window
        raise WorkloadError(
            f"the {loop.framework} loop stopped after {window.steps} steps, before the "
            f"trial's window closed (at least {least}; too few batches for the trial's steps?)"
        )
    steps, window_s = window.measured_steps, window.clock.window_s
    recompile_s = window.compiles.spent_s() - window.compile_before_window
    if 0.0 < recompile_s < window_s:  # a new shape's compile: a one-off, like the first
        window_s -= recompile_s
    samples_per_s, tokens_per_s = window_rates(workload, window.samples, window.real, window_s)
    real, window_rate = window.real, None
    scale = native_epoch_scale(window, lengths, config) if counted else None
    if scale is not None:  # the epoch's mean step, anchored to the window's time
        window_rate = tokens_per_s if tokens_per_s is not None else samples_per_s
        real = window.measured_steps * scale.real_per_step
        samples_per_s, tokens_per_s = window_rates(
            workload, window.samples, real, window_s * scale.time
        )
    values = [float(x) for x in torch.stack(window.losses).tolist()] if window.losses else []
    step_s = window_s / steps if steps else 0.0
    m = Measurement(
        status=OK,
        samples_per_s=samples_per_s,
        tokens_per_s=tokens_per_s,
        samples_per_step=config.global_batch,
        unit=TOKENS if workload.tokens is not None else "samples",
        tokens_per_step=real / steps if counted and steps else None,
        padding_share=1 - window.real / window.positions if window.positions else None,
        data_share=min(1.0, window.waited_s / window_s) if window_s > 0 else None,
        epoch_scale=scale.time if scale is not None else None,
        window_rate=window_rate,
        measured_steps=steps,
        window_s=window_s,
        warmup_s=window.warmup.window_s,
        compile_s=compile_seconds(
            window.compiles, config, window.warmup.window_s, window.warmup_steps, step_s
        ),
        startup_s=startup_s,
        device_init_s=prepared.device_init_s,
        build_s=prepared.build_s,
        framework_setup_s=window.begun - window.called,
        loop=loop.framework,
        losses=values,
        **window.compiles.summary(),
        **(spread(window.clock.step_times_s()) if steps else {}),
        **window.telemetry.fields(samples_per_s, tokens_per_s),
        **window.peak,
    )
    return with_finite_losses(m)
