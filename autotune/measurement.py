"""The result of one trial, as it crosses from the trial process to the driver."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

# Statuses a trial process or its supervisor gives; the driver's verdict adds
# "over-memory" and "accuracy" (autotune.study.scoring). Only "ok" may win.
OK, FAILED, OOM, TIMEOUT, NAN = "ok", "failed", "oom", "timeout", "nan"
PRUNED = "pruned"  # stopped early: it could not beat the best so far


def compile_estimate_s(warmup_s: float, warmup_steps: int, step_s: float) -> float:
    """What warm-up cost beyond steady-state steps: compilation, autotuning, caches.

    The one estimate of ``compile_s``: the trial process computes it at the end of its
    window, the pruner from the window's first steps.
    """
    return max(0.0, warmup_s - warmup_steps * step_s)


@dataclass(frozen=True)
class Measurement:
    """What one trial measured. Times in seconds, memory in bytes.

    ``samples_per_s`` is steady-state throughput over the measured window, data loading
    included; ``warmup_s`` (compile included) is not in it and reported apart.
    """

    status: str
    reason: str = ""
    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    samples_per_step: int | None = None
    measured_steps: int = 0
    window_s: float | None = None
    step_time_median_s: float | None = None
    step_time_cv: float | None = None
    step_time_iqr_s: float | None = None
    warmup_s: float | None = None
    compile_s: float | None = None
    startup_s: float | None = None
    peak_mem_bytes: int | None = None
    mem_kind: str = ""
    peak_allocated_bytes: int | None = None
    alloc_retries: int | None = None
    skipped_steps: int = 0
    losses: list[float] = field(default_factory=list)
    wall_s: float | None = None
    pruned_saved_s: float | None = None  # measured time a pruned trial did not spend

    @property
    def ok(self) -> bool:
        return self.status == OK

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        # JSON (and Optuna's storage) cannot hold NaN/Inf: store them as strings.
        d["losses"] = [x if math.isfinite(x) else str(x) for x in self.losses]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Measurement:
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        known["losses"] = [float(x) for x in known.get("losses", [])]
        return cls(**known)

    def replace(self, **changes: Any) -> Measurement:
        return dataclasses.replace(self, **changes)
