"""``autotune report``: from a stored study to a folder a person can read.

:func:`make_report` loads the study, profiles the baseline and the recommended config once
(:mod:`autotune.study.profile_store`; kept in the study, skipped with ``profile=False``), draws
the plots (:mod:`autotune.output.plots`) and writes ``<output_dir>/<study>/report/``:

- ``index.html``: summary, recommended config vs baseline, plots, bottlenecks, every trial;
- ``history.png``, ``pareto.png``, ``importances.png``, ``slice.png``;
- ``report.json``: the same facts as data.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import mfu
from ..errors import ArgumentError, make_folder
from ..measurement import OK
from ..results import DUPLICATE, TrialRecord, TuneResult, aggregation_text
from ..space import Space
from ..study import profile_store
from ..study.backend import TrialBackend
from ..study.reporter import Reporter
from ..study.storage import load_result
from . import plots
from .advice import Evidence, advice
from .html import render_html, trial_data


@dataclass(frozen=True)
class Report:
    """What :func:`make_report` produced.

    Attributes:
        result: the study's trials, baseline and recommended config.
        profiles: trial number -> profile summary (baseline and best, when profiled).
        folder: the report folder; ``html`` and ``data`` lie in it, and the plots.
        plots: plot name -> PNG file.
        notes: what could not be done (a plot without enough trials, a failed profile).
    """

    result: TuneResult
    profiles: dict[int, dict[str, Any]]
    folder: Path
    html: Path
    data: Path
    plots: dict[str, Path] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _profiled(result: TuneResult) -> list[TrialRecord]:
    """Baseline and best, when they ran far enough to have a throughput."""
    out = [result.baseline, result.best]
    return [r for r in out if r is not None and r.measurement.samples_per_s]


def make_report(
    space: Space,
    *,
    storage: str | None = None,
    study_name: str | None = None,
    out_dir: str | Path | None = None,
    profile: bool = True,
    profile_steps: int = profile_store.DEFAULT_PROFILE_STEPS,
    reprofile: bool = False,
    reporter: Reporter | None = None,
    backend: TrialBackend | None = None,
) -> Report:
    """Write the report of the stored study of ``space``; the library form of ``autotune report``.

    Args:
        space: the space the study was run from.
        storage: Optuna storage URL; defaults to the space's.
        study_name: defaults to the space's study name.
        out_dir: the run folder given to ``autotune run`` (default: the space's
            ``output_dir``); the report goes to ``<out_dir>/<study>/report/``.
        profile: profile baseline and best when the study holds no profile of them yet
            (two short subprocess runs). ``False`` uses stored profiles only.
        profile_steps: optimizer steps under the profiler.
        reprofile: profile again even when stored profiles exist.
        reporter: receives notes (e.g. "profiling trial #3").
        backend: what runs the profiles (default: real subprocesses).

    Raises:
        ArgumentError: ``profile_steps`` is below 1.
        StorageError: the study cannot be loaded.
    """
    if profile_steps < 1:
        raise ArgumentError(f"profile_steps must be at least 1 but got {profile_steps}")
    study, result = load_result(space, storage, study_name)
    runs = Path(out_dir or space.output_dir) / result.study_name
    folder = make_folder(runs / "report", "out")
    targets = _profiled(result)
    notes: list[str] = []
    if profile:
        profiles = profile_store.ensure_profiles(
            space,
            study,
            targets,
            runs,
            steps=profile_steps,
            force=reprofile,
            reporter=reporter,
            backend=backend,
        )
    else:
        stored = {r.number: profile_store.stored_profile(study, r) for r in targets}
        profiles = {n: p for n, p in stored.items() if p is not None}
    for number, p in profiles.items():
        if p.get("status") != OK:
            notes.append(f"profile of trial #{number} failed: {p.get('status')}: {p.get('reason')}")
    objective = result.objective_unit
    if result.plan is not None and not objective.endswith("/J"):
        objective += f" over {result.plan.text()} (compile included)"
    files, plot_notes = plots.write_plots(
        study,
        folder,
        objective_name=objective,
        baseline_value=result.baseline.value if result.baseline else None,
        memory_budget_bytes=result.memory_budget_bytes,
        mfu_points=mfu_points(result),
        rate_name=f"{result.unit}/s (steady state)",
    )
    notes += plot_notes
    data = folder / "report.json"
    data.write_text(json.dumps(report_data(result, profiles), indent=1, default=str))
    page = folder / "index.html"
    page.write_text(render_html(result, profiles, files, notes, space.source))
    return Report(result, profiles, folder, page, data, files, notes)


def report_data(result: TuneResult, profiles: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """The report's facts as plain data (``report.json``)."""
    best, base = result.best, result.baseline
    evidence = Evidence.from_result(result)
    return {
        "study": result.study_name,
        "storage": result.storage,
        "environment": result.environment,
        "baseline": base.number if base else None,
        "best": best.number if best else None,
        "objective_unit": result.objective_unit,  # of the values; speedup is their ratio
        "speedup": result.speedup,
        "speedup_range": list(best.ratio_range) if best and best.ratio_range else None,
        "aggregation": aggregation_text(best) if best else None,
        "winner": result.winner.number if result.winner else None,
        "contributions": [c.to_dict() for c in result.contributions],
        # kept by the recommendation, though each one's own rounds did not keep it
        "kept_together": list(result.kept_together),
        "noise_floor": result.noise_floor,
        "noise_rounds": result.noise_rounds,
        "search_floor": result.search_floor,
        "margin": result.margin,
        "least_gain": result.least_gain,
        "decisions": {
            "winner_vs_baseline": d.to_dict() if (d := result.gain_decision) else None,
            "winner_vs_runner_up": d.to_dict() if (d := result.lead_decision) else None,
        },
        "dropped_knobs": list(result.reduction.knobs)
        if result.reduction and result.best is not result.winner
        else [],
        "memory_budget_bytes": result.memory_budget_bytes,
        "memory_headroom_bytes": result.headroom_bytes,
        "loss_deviation": best.loss_deviation if best else None,
        "global_batch": result.global_batch,
        "planned_run": projection.to_dict() if (projection := result.projection) else None,
        "status_counts": result.status_counts(),
        "screening": result.screening,
        "knob_time": [c.to_dict() for c in result.knob_costs()],
        "mfu": _mfu_data(result),
        "energy_unavailable": result.environment.get("energy_unavailable") or None,
        "throttled_verdict": [
            {
                "role": role,
                "trial": r.number,
                "runs": r.runs,
                "throttled_runs": list(r.throttled_numbers),
            }
            for role, r in result.throttled_verdict()
        ],
        "trials": [trial_data(t, result) for t in result.trials if t.role != DUPLICATE],
        "profiles": {str(n): {**p, "advice": advice(p, evidence)} for n, p in profiles.items()},
    }


def mfu_points(result: TuneResult) -> list[dict[str, Any]] | None:
    """The MFU plot's points: every ok config with an MFU (``None`` for a study without)."""
    if not result.mfu_shown or mfu.unavailable(result.environment):
        return None
    best, base = result.best, result.baseline
    points = []
    for t in result.trials:
        found = result.mfu(t)
        if found is None or t.role == DUPLICATE:
            continue
        points.append(
            {
                "number": t.number,
                "rate": t.measurement.rate,
                "mfu": found.mfu,
                "peak": found.peak,
                "best": best is not None and t.number == best.number,
                "baseline": base is not None and t.number == base.number,
            }
        )
    return points


def _mfu_data(result: TuneResult) -> dict[str, Any] | None:
    """The recommendation's and the baseline's MFU, what they stand on, or why none."""
    if not result.mfu_shown:
        return None
    best, base = result.mfu(result.best), result.mfu(result.baseline)
    return {
        "kind": f"{mfu.LABEL}: {mfu.MEANING}",
        "recommended": best.to_dict() if best else None,
        "baseline": base.to_dict() if base else None,
        "unavailable": mfu.unavailable(result.environment),
        "basis": mfu.describe(result.environment),
        "model_flops": mfu.model_flops(result.environment),
        "peak_flops": result.environment.get("peak_flops"),
        "datasheet_flops": result.environment.get("datasheet_flops"),
    }
