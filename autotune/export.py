"""Write the recommended config, with the evidence and the machine it was measured on."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    from .tuner import TuneResult


def recommendation(result: TuneResult) -> dict[str, Any]:
    """The best config and its evidence as plain data."""
    best, base = result.best, result.baseline
    assert best is not None
    m = best.measurement
    measured: dict[str, Any] = {
        "trial": best.number,
        "objective": round(best.value, 3),
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
    if base is not None:
        measured["baseline_trial"] = base.number
        measured["baseline_objective"] = round(base.value, 3)
        if result.speedup is not None:
            measured["speedup"] = round(result.speedup, 3)
    if result.global_batch is None:
        measured["warning"] = "global batch was free: convergence may differ from the baseline"
    return {
        "config": best.config.to_dict(),
        "measured": measured,
        "environment": result.environment,
        "study": {"name": result.study_name, "storage": result.storage},
    }


def write_best_config(result: TuneResult, path: Path) -> Path:
    """Write ``best_config.yaml``; ``config:`` loads back with ``Config.from_dict``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    env = result.environment
    header = (
        "# autotune recommendation. Valid on the machine it was measured on:\n"
        f"#   {env.get('device_name', '?')} · torch {env.get('torch', '?')} · "
        f"autotune {env.get('autotune', '?')} · host {env.get('hostname', '?')}\n"
    )
    body = yaml.safe_dump(recommendation(result), sort_keys=False)
    path.write_text(header + body)
    return path
