"""The report's plots, drawn by Optuna's matplotlib visualisation, headless.

Optuna stores ordinal knobs (batch size, workers...) as an *index* into the space's value
list (see :func:`autotune.study.sampling.sample`). The plots are drawn from in-memory copies of the
study whose params hold the real values, read from each trial's ``user_attrs["config"]``,
so axes say ``batch_size = 64``, not ``2``. Feasibility (Optuna constraints) is copied too:
Optuna draws infeasible trials apart (grey) and never counts them as best.
"""

from __future__ import annotations

import os
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState

from ..knobs import KNOBS
from ..results import DUPLICATE

# Ordinal knobs spanning at least this ratio get a log axis (batch sizes 8..512).
LOG_AXIS_RATIO = 8
# The memory budget is drawn in the Pareto plot when it is at most this many times the peak.
BUDGET_LINE_RATIO = 3
DPI = 110


def _matplotlib() -> Any:
    """Import matplotlib headless, keeping its cache out of the home directory."""
    os.environ.setdefault("MPLCONFIGDIR", str(Path(tempfile.gettempdir()) / "autotune-mpl"))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _is_ordinal(name: str, dist: BaseDistribution) -> bool:
    knob = KNOBS.get(name)
    return isinstance(dist, IntDistribution) and (knob is None or knob.ordinal)


def real_params(trial: FrozenTrial) -> dict[str, Any]:
    """The trial's params with ordinal indexes replaced by the knob values they stand for."""
    config = trial.user_attrs.get("config", {})
    return {
        name: config.get(name, value) if _is_ordinal(name, trial.distributions[name]) else value
        for name, value in trial.params.items()
    }


def _distributions(trials: list[FrozenTrial]) -> dict[str, BaseDistribution]:
    """One distribution per param that holds every real value seen."""
    seen: dict[str, list[Any]] = {}
    original: dict[str, BaseDistribution] = {}
    for t in trials:
        for name, value in real_params(t).items():
            seen.setdefault(name, []).append(value)
            original.setdefault(name, t.distributions[name])
    out: dict[str, BaseDistribution] = {}
    for name, values in seen.items():
        if not _is_ordinal(name, original[name]):
            out[name] = original[name]
            continue
        low, high = min(values), max(values)
        log = low >= 1 and high / low >= LOG_AXIS_RATIO
        out[name] = IntDistribution(low, max(high, low + 1), log=log)
    return out


def _finished(trial: FrozenTrial) -> bool:
    return trial.state == TrialState.COMPLETE and "config" in trial.user_attrs


def _copy(
    trials: list[FrozenTrial],
    keep: Callable[[FrozenTrial], bool],
    values: Callable[[FrozenTrial], list[float] | None],
    directions: list[str],
) -> optuna.Study:
    """An in-memory study of ``trials`` with real-valued params.

    A trial that ``keep`` rejects, or has no values, becomes a FAIL trial, so trial
    numbers stay those of the stored study.
    """
    study = optuna.create_study(directions=directions)
    dists = _distributions([t for t in trials if _finished(t)])
    for t in trials:
        v = values(t) if _finished(t) and keep(t) else None
        if v is None:
            study.add_trial(optuna.trial.create_trial(state=TrialState.FAIL))
            continue
        params = real_params(t)
        study.add_trial(
            optuna.trial.create_trial(
                values=v,
                params=params,
                distributions={k: dists[k] for k in params},
                user_attrs={k: t.user_attrs[k] for k in ("role", "status") if k in t.user_attrs},
                constraints=t.constraints or None,
            )
        )
    return study


def _unique(t: FrozenTrial) -> bool:
    return t.user_attrs.get("role") != DUPLICATE


def _feasible(t: FrozenTrial) -> bool:
    return _unique(t) and all(c <= 0 for c in t.constraints.values())


def _throughput_and_memory(t: FrozenTrial) -> list[float] | None:
    m = t.user_attrs.get("measurement", {})
    if not m.get("samples_per_s") or m.get("peak_mem_bytes") is None:
        return None
    return [float(m["samples_per_s"]), m["peak_mem_bytes"] / 2**20]


def _save(axes: Any, path: Path, plt: Any) -> Path:
    first = axes.ravel()[0] if hasattr(axes, "ravel") else axes
    fig = first.figure
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return path


def write_plots(
    study: optuna.Study,
    folder: Path,
    *,
    objective_name: str = "samples/s",
    baseline_value: float | None = None,
    memory_budget_bytes: int | None = None,
) -> tuple[dict[str, Path], list[str]]:
    """Draw the report's PNGs into ``folder``.

    Returns:
        Plot name -> file (``history``, ``pareto``, ``importances``, ``slice``), and
        notes on the plots that could not be drawn and why.
    """
    plt = _matplotlib()
    from optuna.visualization import matplotlib as ovm

    folder.mkdir(parents=True, exist_ok=True)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    trials = study.get_trials(deepcopy=False)

    def objective(t: FrozenTrial) -> list[float] | None:
        return [float(t.value)] if t.value is not None else None

    every = _copy(trials, lambda t: True, objective, ["maximize"])
    unique = _copy(trials, _unique, objective, ["maximize"])
    feasible = _copy(trials, _feasible, objective, ["maximize"])
    pareto = _copy(trials, _unique, _throughput_and_memory, ["maximize", "minimize"])
    unique_dists = {
        name: dist
        for t in unique.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        for name, dist in t.distributions.items()
    }
    files: dict[str, Path] = {}
    notes: list[str] = []

    def draw(name: str, make: Callable[[], Any], decorate: Callable[[Any], None] = None) -> None:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # ExperimentalWarning, empty-study warnings
                axes = make()
            if decorate is not None:
                decorate(axes)
            files[name] = _save(axes, folder / f"{name}.png", plt)
        except (ValueError, RuntimeError, ZeroDivisionError) as e:
            notes.append(f"{name} plot not drawn: {e}")
            plt.close("all")

    def mark_baseline(ax: Any) -> None:
        if baseline_value:
            ax.axhline(baseline_value, ls="--", color="grey", lw=1, label="baseline")
            ax.legend(loc="best", fontsize="small")
        ax.set_title("Optimization history: each trial, and the best so far")

    def label_points(ax: Any) -> None:
        done = pareto.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        for t in done:
            ax.annotate(f"#{t.number}", t.values, fontsize="x-small", alpha=0.8)
        title = "Throughput vs peak memory (red: Pareto front)"
        if memory_budget_bytes:
            budget_mib = memory_budget_bytes / 2**20
            peak_mib = max((t.values[1] for t in done), default=0.0)
            if budget_mib <= BUDGET_LINE_RATIO * peak_mib:
                ax.axhline(budget_mib, ls=":", color="red", lw=1, label="memory budget")
                ax.legend(loc="best", fontsize="small")
            else:  # a line far above the points would squash them into one row
                title += f"\nmemory budget {budget_mib:,.0f} MiB, off the scale"
        ax.set_title(title)

    def knob_ticks(axes: Any) -> None:
        """Ticks at the values of ordinal knobs (batch sizes 8, 16, 32), not 0.5 steps."""
        many = hasattr(axes, "ravel")
        for ax in axes.ravel() if many else [axes]:
            dist = unique_dists.get(ax.get_xlabel())
            if isinstance(dist, IntDistribution):
                name = ax.get_xlabel()  # a conditional knob is a param of some trials only
                values = sorted({t.params[name] for t in unique.trials if name in t.params})
                ax.set_xticks(values, [str(v) for v in values])
                ax.minorticks_off()
        title = "Per-knob effect: throughput by knob value (colour: trial number; grey: infeasible)"
        (axes.ravel()[0].figure.suptitle if many else axes.set_title)(title)

    draw(
        "history",
        lambda: ovm.plot_optimization_history(every, target_name=objective_name),
        mark_baseline,
    )
    draw(
        "pareto",
        lambda: ovm.plot_pareto_front(pareto, target_names=[objective_name, "peak memory (MiB)"]),
        label_points,
    )
    if _n_params(feasible) and _n_complete(feasible) >= 2:
        draw(
            "importances",
            lambda: ovm.plot_param_importances(feasible, target_name=objective_name),
            lambda ax: ax.set_title("Knob importance for throughput (feasible trials)", loc="left"),
        )
    else:
        notes.append("importances plot not drawn: needs 2 feasible trials with searched knobs")
    if _n_params(unique):
        draw("slice", lambda: ovm.plot_slice(unique, target_name=objective_name), knob_ticks)
    else:
        notes.append("slice plot not drawn: no searched knobs")
    return files, notes


def _n_complete(study: optuna.Study) -> int:
    return len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))


def _n_params(study: optuna.Study) -> int:
    names = set()
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        names.update(t.params)
    return len(names)
