"""Finished trials as values: what each measured, how it was judged, what won and by how much.

:func:`recommendation` and :func:`write_best_config` serialise a result as
``best_config.yaml``, so the study writes it without knowing the output layer.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from .config import Config
from .measurement import OK, PRUNED, Measurement

BASELINE, SEARCH, DUPLICATE, REPEAT = "baseline", "search", "duplicate", "repeat"
FREE_BATCH_WARNING = "global batch was free: convergence may differ from the baseline"


@dataclass(frozen=True)
class TrialRecord:
    """One measured config: what it measured, the verdict and the objective value.

    After a confirmation round, ``value`` is the median over ``runs`` measurements and
    ``spread`` their relative range; a config is feasible only if every run was.
    """

    number: int
    config: Config
    measurement: Measurement
    value: float
    role: str = SEARCH
    status: str = OK
    reason: str = ""
    duplicate_of: int | None = None
    loss_deviation: float | None = None
    repeat_of: int | None = None
    runs: int = 1
    spread: float | None = None

    @property
    def feasible(self) -> bool:
        return self.status == OK


@dataclass(frozen=True)
class TuneResult:
    """The outcome of a study: every measured config, the baseline, the recommended config."""

    study_name: str
    storage: str
    trials: list[TrialRecord]
    baseline: TrialRecord | None
    best: TrialRecord | None
    environment: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    best_config_path: Path | None = None
    memory_budget_bytes: int | None = None
    global_batch: int | None = None
    runner_up: TrialRecord | None = None

    @classmethod
    def from_trials(
        cls, study_name: str, storage: str, trials: list[TrialRecord], **kwargs: Any
    ) -> TuneResult:
        """Summarise raw trial records: baseline, winner and runner-up by (median) value."""
        trials = summarize(trials)
        top = ranked(trials)
        return cls(
            study_name=study_name,
            storage=storage,
            trials=trials,
            baseline=next((t for t in trials if t.role == BASELINE), None),
            best=top[0] if top else None,
            runner_up=top[1] if len(top) > 1 else None,
            **kwargs,
        )

    @property
    def unit(self) -> str:
        """What the objective counts: ``tokens`` (real tokens, token workloads) or ``samples``."""
        units = {t.measurement.unit for t in self.trials if t.measurement.rate}
        return "tokens" if "tokens" in units else "samples"

    @property
    def speedup(self) -> float | None:
        """Best objective over the baseline's; ``None`` when either is missing."""
        if not (self.best and self.baseline and self.baseline.feasible and self.baseline.value):
            return None
        return self.best.value / self.baseline.value

    @property
    def headroom_bytes(self) -> int | None:
        """Memory budget left unused by the recommended config."""
        peak = self.best.measurement.peak_mem_bytes if self.best else None
        if peak is None or self.memory_budget_bytes is None:
            return None
        return self.memory_budget_bytes - peak

    @property
    def lead(self) -> float | None:
        """How much faster the winner is than the runner-up (0.05 = 5%)."""
        if not (self.best and self.runner_up and self.runner_up.value):
            return None
        return self.best.value / self.runner_up.value - 1

    @property
    def noise(self) -> float | None:
        """The relative measurement noise of the top two: their repeat spread, else step CV."""
        tops = [t for t in (self.best, self.runner_up) if t is not None]
        if not tops:
            return None
        return max(
            t.spread if t.spread is not None else (t.measurement.step_time_cv or 0.0) for t in tops
        )

    @property
    def within_noise(self) -> bool | None:
        """True when the winner's lead over the runner-up is not beyond measurement noise."""
        if self.lead is None or self.noise is None:
            return None
        return self.lead <= self.noise

    def status_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for t in self.trials:
            counts[t.status] = counts.get(t.status, 0) + 1
        return counts

    def pruning_saved_s(self) -> tuple[int, float]:
        """How many trials pruning stopped, and the measured seconds it saved."""
        pruned = [t for t in self.trials if t.status == PRUNED]
        return len(pruned), sum(t.measurement.pruned_saved_s or 0.0 for t in pruned)

    def overhead(self) -> tuple[float, float] | None:
        """Median per-trial fixed cost (process start, imports, build) and its share of the
        trial's wall time."""
        rows = [
            t.measurement for t in self.trials if t.measurement.startup_s and t.measurement.wall_s
        ]
        if not rows:
            return None
        startup = statistics.median(m.startup_s for m in rows)
        share = statistics.median(m.startup_s / m.wall_s for m in rows)
        return startup, share


def summarize(trials: list[TrialRecord]) -> list[TrialRecord]:
    """One record per measured config: repeats folded into their original (median value,
    spread, feasible only if every run was); duplicates dropped."""
    repeats: dict[int, list[TrialRecord]] = {}
    for t in trials:
        if t.role == REPEAT and t.repeat_of is not None:
            repeats.setdefault(t.repeat_of, []).append(t)
    out = []
    for t in trials:
        if t.role in (DUPLICATE, REPEAT):
            continue
        extra = repeats.get(t.number, [])
        if not extra:
            out.append(t)
            continue
        runs = [t, *extra]
        values = [r.value for r in runs]
        median = statistics.median(values)
        bad = next((r for r in runs if not r.feasible), None)
        status, reason = (t.status, t.reason)
        if bad is not None and t.feasible:
            status, reason = bad.status, f"repeat run #{bad.number}: {bad.reason}"
        out.append(
            replace(
                t,
                value=median,
                status=status,
                reason=reason,
                runs=len(runs),
                spread=(max(values) - min(values)) / median if median else None,
            )
        )
    return out


def ranked(trials: list[TrialRecord]) -> list[TrialRecord]:
    """Feasible measured configs, fastest first."""
    return sorted((t for t in trials if t.feasible), key=lambda t: t.value, reverse=True)


def best_of(trials: list[TrialRecord]) -> TrialRecord | None:
    top = ranked(summarize(trials))
    return top[0] if top else None


def baseline_of(trials: list[TrialRecord]) -> TrialRecord | None:
    return next((t for t in summarize(trials) if t.role == BASELINE), None)


def recommendation(result: TuneResult) -> dict[str, Any]:
    """The recommended config and its evidence as plain data (``best_config.yaml``)."""
    best, base = result.best, result.baseline
    if best is None:
        raise ValueError("a result without a feasible trial has no recommendation")
    m = best.measurement
    measured: dict[str, Any] = {
        "trial": best.number,
        "objective": round(best.value, 3),
        "unit": m.unit,
        "samples_per_s": round(m.samples_per_s or 0.0, 3),
        "step_time_median_s": m.step_time_median_s,
        "step_time_cv": m.step_time_cv,
        "compile_s": m.compile_s,
        "peak_mem_bytes": m.peak_mem_bytes,
        "mem_kind": m.mem_kind,
    }
    if best.loss_deviation is not None:
        measured["loss_deviation_vs_fp32_reference"] = round(best.loss_deviation, 5)
    if result.memory_budget_bytes is not None:
        measured["memory_budget_bytes"] = result.memory_budget_bytes
        measured["memory_headroom_bytes"] = result.headroom_bytes
    if m.tokens_per_s:
        measured["tokens_per_s"] = round(m.tokens_per_s, 1)
    if m.padding_share is not None:
        measured["padding_share"] = round(m.padding_share, 4)
    if m.peak_longest_bytes is not None:
        measured["peak_longest_batch_bytes"] = m.peak_longest_bytes
        measured["longest_batch_tokens"] = m.longest_batch_tokens
    if m.recompiles is not None:
        measured["recompiles"] = m.recompiles
    if base is not None:
        measured["baseline_trial"] = base.number
        measured["baseline_objective"] = round(base.value, 3)
        if result.speedup is not None:
            measured["speedup"] = round(result.speedup, 3)
    if result.global_batch is None:
        measured["warning"] = FREE_BATCH_WARNING
    return {
        "config": best.config.to_dict(),
        "measured": measured,
        "environment": result.environment,
        "study": {"name": result.study_name, "storage": result.storage},
    }


def machine_line(environment: dict[str, Any]) -> str:
    """Where a config was measured, in one line (a config is only valid there)."""
    env = environment
    return (
        f"{env.get('device_name', '?')} · torch {env.get('torch', '?')} · "
        f"autotune {env.get('autotune', '?')} · host {env.get('hostname', '?')}"
    )


def write_best_config(result: TuneResult, path: Path) -> Path:
    """Write ``best_config.yaml``; its ``config:`` loads back with :func:`autotune.load_config`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    header = (
        "# autotune recommendation. Valid on the machine it was measured on:\n"
        f"#   {machine_line(result.environment)}\n"
    )
    body = yaml.safe_dump(recommendation(result), sort_keys=False)
    path.write_text(header + body)
    return path
