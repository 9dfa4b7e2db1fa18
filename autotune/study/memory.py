"""A study's memory model: will an unmeasured config fit the memory budget?

Fitted afresh from the study's finished trials each time it is asked (so a resumed study
and several workers see the same model): the peak memory per rank grows about linearly
with the micro-batch size (activations) over a fixed part (parameters, gradients,
optimizer state, workspaces), and the other knobs that change memory move both. So the
trials are grouped by their *memory knobs*, every knob but the micro-batch and those on
:data:`MEMORY_NEUTRAL` (any knob added later counts as a memory knob until it is shown
not to be), and each group has its own line.

Two rules say a config cannot fit; anything else runs:

1. **Monotone** (certain): a trial of the same group with a micro-batch no larger went
   over the budget (measured peak above it, or out of memory).
2. **Linear** (statistical): the group's line, fitted on at least two batch sizes, puts
   the *low end* of the prediction interval (``Z`` standard errors below, the noise
   estimated from the residuals of every group pooled, at least :data:`NOISE_FLOOR` of
   the group's peaks) above the budget by :data:`MARGIN`. The pooled residuals must exist
   (some group measured at three points) and show a line (:data:`NOT_LINEAR`).

A trial of the group measured to fit with a micro-batch at least as large always wins:
such a config is never skipped. A group with one point never predicts: its slope is
unknown (checkpointing can cut it tenfold), so nothing from another group stands in.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from ..config import Config
from ..knobs import KNOBS
from ..measurement import ACCURACY, NAN, OK, OOM, OVER_MEMORY, PREDICTED_OVER_MEMORY, PRUNED
from ..results import DUPLICATE, TrialRecord

# Knobs that do not change the peak memory per rank, by what the peak measures. Every
# device: the precision of fp32 matmul arithmetic stores no tensor differently. With
# device memory (CUDA), the host side as well: DataLoader processes and their queues,
# page-locked host buffers, asynchronous copies and CPU thread pools hold no device
# memory. On the CPU the peak is the trial's RSS, which holds the batches the workers
# deliver, so those count there.
MEMORY_NEUTRAL = ("matmul_precision",)
DEVICE_MEMORY_NEUTRAL = (
    "num_workers",
    "prefetch_factor",
    "persistent_workers",
    "pin_memory",
    "non_blocking",
    "num_threads",
    "interop_threads",
)
# accumulation_steps counts only as "accumulates or not": gradients of several
# micro-batches add up in the same buffers, but with accumulation they outlive the
# backward pass (one gradient-sized block more at the next forward), without they can
# be freed. Every other value behaves alike, and a fixed global batch ties it to the
# micro-batch, which would otherwise put every batch size in a group of its own.
ACCUMULATION = "accumulation_steps"

MARGIN = 0.10  # the low end of the prediction must be this far over the budget
Z = 3.0  # standard errors below the prediction: its low end
NOISE_FLOOR = 0.02  # the least noise assumed, relative to the group's mean peak
NOT_LINEAR = 0.10  # pooled residual above this share of the mean peak: no line to trust
EXACT = (OK, OVER_MEMORY, ACCURACY, NAN)  # statuses of a run whose peak is its full peak


@dataclass(frozen=True)
class Prediction:
    """What the model says about one config.

    ``peak_bytes`` is the predicted peak (for the monotone rule: the least peak a larger
    config must reach), ``low_bytes`` the low end of its interval (``None`` without a
    prediction), ``over`` whether the config cannot fit, ``basis`` the evidence in words.
    """

    over: bool
    peak_bytes: float | None = None
    low_bytes: float | None = None
    basis: str = ""
    certain: bool = False  # the monotone rule: a smaller or equal batch went over

    def reason(self, budget: int) -> str:
        """The one line a skipped trial is stored with (after its status,
        ``predicted-over-memory``)."""
        if self.peak_bytes is None:
            return f"out of memory ({self.basis})"
        peak = f">= {mib(self.peak_bytes)}" if self.certain else f"~{mib(self.peak_bytes)}"
        return f"peak {peak} > budget {mib(budget)} ({self.basis})"


def mib(n: float) -> str:
    """Bytes in MiB, as the over-memory verdict writes them (scoring)."""
    return f"{n / 2**20:.0f} MiB"


def memory_key(config: Config, device: str = "cpu") -> tuple[tuple[str, object], ...]:
    """The memory knobs of ``config``: configs with the same key differ only in the
    micro-batch and knobs that do not change the peak (see :data:`MEMORY_NEUTRAL`)."""
    neutral = {"batch_size", *MEMORY_NEUTRAL}
    if device == "cuda":
        neutral.update(DEVICE_MEMORY_NEUTRAL)
    values = config.to_dict()
    values[ACCUMULATION] = values[ACCUMULATION] > 1
    return tuple((k, v) for k, v in values.items() if k in KNOBS and k not in neutral)


@dataclass(frozen=True)
class _Point:
    number: int
    batch: int
    peak: int | None  # the measured peak (None: out of memory, unmeasured)
    exact: bool  # a full run: its peak is the config's peak, not a lower bound

    def over(self, budget: int) -> bool:
        return self.peak is None or self.peak > budget


@dataclass(frozen=True)
class _Line:
    intercept: float
    slope: float
    n: int
    mean_x: float
    sxx: float
    mean_y: float
    numbers: tuple[int, ...]

    def predict(self, x: float) -> float:
        return self.intercept + self.slope * x

    def leverage(self, x: float) -> float:
        """The standard error of a new run at ``x``, in units of the noise."""
        return math.sqrt(1 + 1 / self.n + (x - self.mean_x) ** 2 / self.sxx)


def _points(trials: Iterable[TrialRecord], device: str) -> dict[tuple, list[_Point]]:
    """The runs that say something about memory, grouped by :func:`memory_key`."""
    groups: dict[tuple, list[_Point]] = {}
    for t in trials:
        if t.role == DUPLICATE or t.status == PREDICTED_OVER_MEMORY:
            continue  # a copy, or never run
        m = t.measurement
        if m.status == OOM:
            point = _Point(t.number, t.config.batch_size, None, exact=False)
        elif m.judged_mem_bytes is not None and (t.status in EXACT or m.status == PRUNED):
            # what the limit judged (NVML's figure of the process where larger); a pruned
            # run's is a lower bound: it stopped before the end
            point = _Point(t.number, t.config.batch_size, m.judged_mem_bytes, t.status in EXACT)
        else:
            continue
        groups.setdefault(memory_key(t.config, device), []).append(point)
    return groups


def _fit(points: list[_Point]) -> tuple[_Line | None, float]:
    """The least-squares line of a group's exact points and its residual sum of squares
    (``None`` with fewer than two batch sizes)."""
    xs = [p.batch for p in points if p.exact]
    ys = [float(p.peak) for p in points if p.exact]
    if len(set(xs)) < 2:
        return None, 0.0
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    intercept = my - slope * mx
    rss = sum((y - intercept - slope * x) ** 2 for x, y in zip(xs, ys, strict=True))
    numbers = tuple(sorted(p.number for p in points if p.exact))
    return _Line(intercept, slope, n, mx, sxx, my, numbers), rss


class MemoryModel:
    """Peak memory per rank of a study's configs, fitted from its finished trials.

    Args:
        trials: the study's records (duplicates and skipped configs are ignored).
        budget_bytes: the memory budget.
        device: ``cuda`` or ``cpu`` (the capabilities' device): which knobs are neutral.
    """

    def __init__(self, trials: Iterable[TrialRecord], budget_bytes: int, device: str = "cpu"):
        self.budget = budget_bytes
        self.device = device
        self.groups = _points(trials, device)
        self.lines: dict[tuple, _Line] = {}
        rss, dof, scale = 0.0, 0, 0.0
        for key, points in self.groups.items():
            line, r = _fit(points)
            if line is not None:
                self.lines[key] = line
                rss += r
                dof += line.n - 2
                scale += line.mean_y * (line.n - 2)
        # The pooled residual noise, and its share of the peaks (None: no residuals yet).
        self.noise = math.sqrt(rss / dof) if dof else None
        self.relative_noise = self.noise / (scale / dof) if dof and scale > 0 else None

    def predict(self, config: Config) -> Prediction:
        """Whether ``config`` cannot fit the budget, and why (see the module's rules)."""
        key = memory_key(config, self.device)
        points = self.groups.get(key, [])
        x = config.batch_size
        fits = [p for p in points if p.batch >= x and p.exact and not p.over(self.budget)]
        if fits:  # measured to fit at this batch size or a larger one
            return Prediction(False, basis=f"trial {fits[0].number} fits at bs={fits[0].batch}")
        over = [p for p in points if p.batch <= x and p.over(self.budget)]
        if over:
            p = max(over, key=lambda p: (p.peak or 0, p.batch))
            went = "ran out of memory" if p.peak is None else "went over"
            return Prediction(
                True,
                peak_bytes=p.peak,
                low_bytes=p.peak,
                basis=f"trial {p.number} with the same memory knobs and bs={p.batch} {went}",
                certain=True,
            )
        return self._linear(self.lines.get(key), x)

    def _linear(self, line: _Line | None, x: int) -> Prediction:
        if line is None:
            return Prediction(False, basis="fewer than two batch sizes measured")
        peak = line.predict(x)
        trials = ", ".join(map(str, line.numbers))
        if self.noise is None:
            return Prediction(False, peak, basis=f"no residuals to judge the line of {trials}")
        if self.relative_noise is not None and self.relative_noise > NOT_LINEAR:
            return Prediction(
                False, peak, basis=f"not linear in batch size ({self.relative_noise:.0%} noise)"
            )
        noise = max(self.noise, NOISE_FLOOR * line.mean_y)
        low = peak - Z * noise * line.leverage(x)
        over = line.slope > 0 and low > (1 + MARGIN) * self.budget
        basis = f"linear in batch size from trials {trials}; at least {mib(low)}"
        return Prediction(over, peak, low, basis)
