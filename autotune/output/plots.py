"""The report's plots, drawn by Optuna's matplotlib visualisation, headless.

Optuna stores ordinal knobs with unevenly spaced values (batch sizes 16, 32, 64) as an
*index* param ``<knob>_index`` into the space's value list (see
:func:`autotune.study.sampling.sample`). The plots are drawn from in-memory copies of the
study whose params hold the real values, read from each trial's ``user_attrs["config"]``,
so axes say ``batch_size = 64``, not ``2``.

Every plot that shows trials draws the three kinds of a measured trial in their own style,
named in its legend: *ok* (blue circles; in the slice plot shaded by trial number, from a
mid blue, so that trial 0, the baseline, stands out), *infeasible* (grey crosses: failed,
out of memory, over the budget or off in accuracy) and *pruned* (hollow orange triangles:
stopped early, its rate an estimate). Optuna draws the ok trials only (so only they count
as best, and only they make the Pareto front); the other two are drawn over its axes.
"""

from __future__ import annotations

import os
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.trial import FrozenTrial, TrialState

from ..knobs import KNOBS
from ..measurement import PREDICTED_OVER_MEMORY, PRUNED
from ..results import DUPLICATE
from ..study.sampling import knob_of

# Ordinal knobs spanning at least this ratio get a log axis (batch sizes 8..512).
LOG_AXIS_RATIO = 8
# The memory budget is drawn in the Pareto plot when it is at most this many times the peak.
BUDGET_LINE_RATIO = 3
DPI = 110

# The kinds of a measured trial, each drawn in its own style in every plot of trials.
OK_KIND, INFEASIBLE_KIND, PRUNED_KIND = "ok", "infeasible", "pruned"
KINDS = (OK_KIND, INFEASIBLE_KIND, PRUNED_KIND)
KIND_LABELS = {
    OK_KIND: "ok",
    INFEASIBLE_KIND: "infeasible (failed, out of memory, over budget, off in accuracy)",
    PRUNED_KIND: "pruned (stopped early, rate estimated)",
}
OK_COLOR = "tab:blue"  # Optuna's colour of a trial
# matplotlib ``scatter`` styles of the two kinds autotune draws over Optuna's axes.
KIND_STYLES: dict[str, dict[str, Any]] = {
    INFEASIBLE_KIND: {"marker": "X", "color": "#5f5f5f", "s": 50, "zorder": 3},
    PRUNED_KIND: {
        "marker": "v",
        "facecolors": "none",
        "edgecolors": "tab:orange",
        "linewidths": 1.6,
        "s": 55,
        "zorder": 3,
    },
}
# Ok trials of the slice plot are shaded by trial number from this point of "Blues" up:
# from 0 trial 0 (the baseline) would be white on the plot's grey background.
TRIAL_SHADE_FROM = 0.5


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
    """The trial's params by knob, ordinal ones as the knob values they stand for
    (``batch_size_index`` 2 -> ``batch_size`` 64, from the trial's config)."""
    config = trial.user_attrs.get("config", {})
    out = {}
    for name, value in trial.params.items():
        knob = knob_of(name)
        ordinal = _is_ordinal(knob, trial.distributions[name])
        out[knob] = config.get(knob, value) if ordinal else value
    return out


def _distributions(trials: list[FrozenTrial]) -> dict[str, BaseDistribution]:
    """One distribution per param that holds every real value seen."""
    seen: dict[str, list[Any]] = {}
    original: dict[str, BaseDistribution] = {}
    for t in trials:
        for name, dist in t.distributions.items():
            original.setdefault(knob_of(name), dist)
        for name, value in real_params(t).items():
            seen.setdefault(name, []).append(value)
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
    """A finished trial that ran: a config skipped as predicted over memory has no
    throughput or memory of its own to draw."""
    return (
        trial.state == TrialState.COMPLETE and "config" in trial.user_attrs and not _skipped(trial)
    )


def _skipped(trial: FrozenTrial) -> bool:
    return trial.user_attrs.get("status") == PREDICTED_OVER_MEMORY


def kind(trial: FrozenTrial) -> str:
    """``ok``, ``infeasible`` (an Optuna constraint broken) or ``pruned`` (stopped early;
    infeasible for Optuna too, so that it never counts as best)."""
    if trial.user_attrs.get("status") == PRUNED:
        return PRUNED_KIND
    return OK_KIND if all(c <= 0 for c in trial.constraints.values()) else INFEASIBLE_KIND


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


def _ok(t: FrozenTrial) -> bool:
    return kind(t) == OK_KIND


def _feasible(t: FrozenTrial) -> bool:
    return _unique(t) and _ok(t)


def _throughput_and_memory(t: FrozenTrial) -> list[float] | None:
    m = t.user_attrs.get("measurement", {})
    if not m.get("samples_per_s") or m.get("peak_mem_bytes") is None:
        return None
    return [float(m["samples_per_s"]), m["peak_mem_bytes"] / 2**20]


def _figure(axes: Any) -> Any:
    return (axes.ravel()[0] if hasattr(axes, "ravel") else axes).figure


def _overlay(
    ax: Any, trials: list[FrozenTrial], point: Callable[[FrozenTrial], tuple[float, float] | None]
) -> None:
    """Draw the infeasible and the pruned of ``trials`` at ``point(trial)``, in their styles
    (a trial without a point is left out)."""
    for k in (INFEASIBLE_KIND, PRUNED_KIND):
        found = [xy for t in trials if kind(t) == k and (xy := point(t)) is not None]
        if found:
            ax.scatter([x for x, _ in found], [y for _, y in found], **KIND_STYLES[k])


def _kind_handles(counts: dict[str, int], ok: dict[str, Any]) -> tuple[list[Any], list[str]]:
    """Legend entries for the three kinds (``ok``: the marker style of the ok points), each
    with its count; a kind with none still says how it would look."""
    from matplotlib.lines import Line2D

    styles = {OK_KIND: ok, **KIND_STYLES}
    handles = []
    for k in KINDS:
        style = styles[k]
        handles.append(
            Line2D(
                [],
                [],
                linestyle="none",
                marker=style.get("marker", "o"),
                markersize=7,
                markerfacecolor=style.get("facecolors", style.get("color")),
                markeredgecolor=style.get("edgecolors", style.get("color")),
                markeredgewidth=style.get("linewidths", 1.0),
            )
        )
    return handles, [f"{KIND_LABELS[k]}: {counts.get(k, 0)}" for k in KINDS]


def _legend(
    ax: Any,
    trials: list[FrozenTrial],
    ok: dict[str, Any],
    drop: tuple[str, ...] = (),
    rename: dict[str, str] | None = None,
) -> tuple[list[Any], list[str]]:
    """Legend entries: the three kinds of ``trials`` first, then the axes' own labelled
    artists (best so far, baseline, budget) but those named in ``drop`` (Optuna's own name
    for its points), renamed by ``rename``."""
    counts: dict[str, int] = {}
    for t in trials:
        counts[kind(t)] = counts.get(kind(t), 0) + 1
    handles, labels = _kind_handles(counts, ok)
    for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
        if label not in drop:
            handles.append(handle)
            labels.append((rename or {}).get(label, label))
    return handles, labels


def _legend_right(ax: Any, entries: tuple[list[Any], list[str]]) -> None:
    """The legend right of the axes, off the points. The figure's layout engine (Optuna's
    tight layout) would squeeze the axes to make room; ``savefig(bbox_inches="tight")``
    widens the PNG instead."""
    ax.figure.set_layout_engine("none")
    ax.legend(*entries, loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize="small")


def _slice_panel(
    ax: Any, name: str, dist: BaseDistribution, trials: list[FrozenTrial], shade: dict[str, Any]
) -> None:
    """One knob's panel of the slice plot: the trials that have the knob, by its value."""
    points = [(p[name], t) for t in trials if name in (p := real_params(t))]
    slots: list[Any] | None = None
    if isinstance(dist, CategoricalDistribution):
        seen = {v for v, _ in points}
        slots = [c for c in dist.choices if c in seen]
        slots += sorted(seen - set(slots), key=str)
    x = {id(t): slots.index(v) if slots is not None else v for v, t in points}
    ok = [t for _, t in points if kind(t) == OK_KIND]
    if ok:
        ax.scatter(
            [x[id(t)] for t in ok],
            [t.value for t in ok],
            c=[t.number for t in ok],
            edgecolors="#333333",
            linewidths=0.6,
            zorder=2,
            **shade,
        )
    _overlay(ax, [t for _, t in points], lambda t: (x[id(t)], t.value))
    ax.set_xlabel(name)
    if slots is not None:
        ax.set_xticks(range(len(slots)), [str(v) for v in slots])
        ax.set_xlim(-0.5, len(slots) - 0.5)
    elif isinstance(dist, (IntDistribution, FloatDistribution)):
        if dist.log:
            ax.set_xscale("log")
        if isinstance(dist, IntDistribution):  # ticks at the values (8, 16, 32)
            values = sorted({v for v, _ in points})
            ax.set_xticks(values, [str(v) for v in values])
            ax.minorticks_off()


def _slice(
    trials: list[FrozenTrial],
    dists: dict[str, BaseDistribution],
    objective_name: str,
    plt: Any,
) -> Any:
    """Every trial's objective against the value of each knob, one panel per knob.

    Ok trials are shaded by trial number, infeasible and pruned ones drawn in their
    styles; ordinal knobs get ticks at their values, categorical ones one slot per value.
    """
    import numpy as np
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import ListedColormap, Normalize

    shades = ListedColormap(plt.get_cmap("Blues")(np.linspace(TRIAL_SHADE_FROM, 1.0, 256)))
    numbers = [t.number for t in trials]
    norm = Normalize(min(numbers), max(max(numbers), min(numbers) + 1))
    names = sorted(dists)
    with plt.style.context("ggplot"):
        fig, axes = plt.subplots(
            1, len(names), sharey=True, squeeze=False, figsize=(max(6.4, 3.4 * len(names)), 4.8)
        )
        axes = axes.ravel()
        for ax, name in zip(axes, names, strict=True):
            _slice_panel(ax, name, dists[name], trials, {"cmap": shades, "norm": norm})
        axes[0].set_ylabel(objective_name)
        fig.colorbar(ScalarMappable(norm, shades), ax=list(axes), label="trial (ok trials)")
        mid = {"marker": "o", "color": shades(0.5), "edgecolors": "#333333", "linewidths": 0.6}
        fig.legend(
            *_legend(axes[0], trials, mid),
            loc="upper center",
            bbox_to_anchor=(0.5, 0.0),
            ncol=3,
            fontsize="small",
        )
        fig.suptitle("Per-knob effect: throughput by knob value (ok trials shaded by trial number)")
    return axes


def _mfu_axes(points: list[dict[str, Any]], rate_name: str, plt: Any) -> Any:
    """Throughput against MFU, one point per ok config, coloured by the peak it is
    measured against (configs of one dtype lie on one line through the origin)."""
    if not points:
        raise ValueError("no ok config has an MFU")
    fig, ax = plt.subplots(figsize=(7, 4.5))
    peaks = sorted({p["peak"] for p in points})
    palette = ("tab:blue", "tab:green", "tab:purple", "tab:brown", "tab:olive")
    colours = dict(zip(peaks, palette, strict=False))
    for peak in peaks:
        mine = [p for p in points if p["peak"] == peak]
        ax.scatter(
            [100 * p["mfu"] for p in mine],
            [p["rate"] for p in mine],
            color=colours.get(peak, "tab:gray"),
            label=f"of the measured {peak} peak",
            zorder=2,
        )
    for p in points:
        tag = f"#{p['number']}" + (" baseline" if p["baseline"] else "")
        tag += " recommended" if p["best"] else ""
        xy = (100 * p["mfu"], p["rate"])
        ax.annotate(tag, xy, fontsize="x-small", alpha=0.8)
        if p["best"]:
            ax.scatter(*xy, s=160, facecolors="none", edgecolors="red", zorder=3)
    ax.set_xlim(0, max(100.0, 105 * max(p["mfu"] for p in points)))
    ax.set_ylim(0, 1.1 * max(p["rate"] for p in points))
    ax.set_xlabel("MFU (% of this machine's measured matmul peak)")
    ax.set_ylabel(rate_name)
    ax.legend(loc="lower right", fontsize="small")
    ax.set_title("Throughput vs MFU: how far each config is from the machine's limit")
    return ax


def draw_plots(
    study: optuna.Study,
    *,
    objective_name: str = "samples/s",
    baseline_value: float | None = None,
    memory_budget_bytes: int | None = None,
    mfu_points: list[dict[str, Any]] | None = None,
    rate_name: str = "samples/s",
) -> tuple[dict[str, Any], list[str]]:
    """Draw the report's figures (matplotlib, headless); the caller saves and closes them.

    ``mfu_points``: per ok config ``number``, ``rate`` (steady state, ``rate_name``),
    ``mfu``, ``peak``, ``best``, ``baseline``; ``None`` for a study without MFU.

    Returns:
        Plot name -> figure (``history``, ``pareto``, ``importances``, ``slice``,
        ``mfu``), and notes on the plots that could not be drawn and why.
    """
    plt = _matplotlib()
    from optuna.visualization import matplotlib as ovm

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    trials = study.get_trials(deepcopy=False)
    finished = [t for t in trials if _finished(t)]
    measured = [t for t in finished if _unique(t)]

    def objective(t: FrozenTrial) -> list[float] | None:
        return [float(t.value)] if t.value is not None else None

    # Optuna draws the ok trials; the infeasible and pruned ones are drawn over its axes.
    every = _copy(trials, _ok, objective, ["maximize"])
    feasible = _copy(trials, _feasible, objective, ["maximize"])
    pareto = _copy(trials, _feasible, _throughput_and_memory, ["maximize", "minimize"])
    board = _Board(plt)
    skipped = sum(1 for t in trials if _skipped(t) and _unique(t))
    if skipped:
        board.notes.append(
            f"{skipped} config(s) skipped as predicted over the memory budget are not drawn "
            "(never run)"
        )
    board.draw(
        "history",
        lambda: ovm.plot_optimization_history(every, target_name=objective_name),
        lambda ax: _decorate_history(ax, finished, baseline_value, objective_name),
    )
    board.draw(
        "pareto",
        lambda: ovm.plot_pareto_front(pareto, target_names=[objective_name, "peak memory (MiB)"]),
        lambda ax: _decorate_pareto(ax, measured, memory_budget_bytes),
    )
    if _n_params(feasible) and _n_complete(feasible) >= 2:
        board.draw(
            "importances",
            lambda: ovm.plot_param_importances(feasible, target_name=objective_name),
            lambda ax: ax.set_title("Knob importance for throughput (feasible trials)", loc="left"),
        )
    else:
        board.notes.append(
            "importances plot not drawn: needs 2 feasible trials with searched knobs"
        )
    valued = [t for t in measured if t.value is not None]
    dists = _distributions(valued)
    if dists:
        board.draw("slice", lambda: _slice(valued, dists, objective_name, plt))
    else:
        board.notes.append("slice plot not drawn: no searched knobs")
    if mfu_points is not None:
        board.draw("mfu", lambda: _mfu_axes(mfu_points, rate_name, plt))
    return board.figures, board.notes


class _Board:
    """The figures drawn so far, and a note for each plot that could not be drawn."""

    def __init__(self, plt: Any) -> None:
        self.plt = plt
        self.figures: dict[str, Any] = {}
        self.notes: list[str] = []

    def draw(
        self, name: str, make: Callable[[], Any], decorate: Callable[[Any], None] = None
    ) -> None:
        """Draw one plot; a plot that fails is a note, its half-drawn figures closed."""
        before = set(self.plt.get_fignums())
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # ExperimentalWarning, empty-study warnings
                axes = make()
                if decorate is not None:
                    decorate(axes)
            self.figures[name] = _figure(axes)
        except (ValueError, RuntimeError, ZeroDivisionError) as e:
            self.notes.append(f"{name} plot not drawn: {e}")
            for number in set(self.plt.get_fignums()) - before:
                self.plt.close(number)


def _decorate_history(
    ax: Any, finished: list[FrozenTrial], baseline_value: float | None, objective_name: str
) -> None:
    """The history plot: the infeasible and pruned trials, the baseline line, the legend."""
    _overlay(ax, finished, lambda t: (t.number, t.value) if t.value is not None else None)
    if baseline_value:
        ax.axhline(baseline_value, ls="--", color="grey", lw=1, label="baseline")
    entries = _legend(
        ax,
        finished,
        {"marker": "o", "color": OK_COLOR},
        drop=(objective_name,),
        rename={"Best Value": "best ok trial so far"},
    )
    _legend_right(ax, entries)
    ax.set_title("Optimization history: each trial, and the best so far")


def _memory_point(t: FrozenTrial) -> tuple[float, float] | None:
    """A trial's (throughput, peak memory in MiB), if it has both."""
    values = _throughput_and_memory(t)
    return (values[0], values[1]) if values else None


def _decorate_pareto(ax: Any, measured: list[FrozenTrial], memory_budget_bytes: int | None) -> None:
    """The Pareto plot: every measured trial numbered, the memory budget, the legend."""
    _overlay(ax, measured, _memory_point)
    drawn = [(t.number, xy) for t in measured if (xy := _memory_point(t)) is not None]
    for number, xy in drawn:
        ax.annotate(f"#{number}", xy, fontsize="x-small", alpha=0.8)
    title = "Throughput vs peak memory (red: Pareto front of the ok trials)"
    if memory_budget_bytes:
        budget_mib = memory_budget_bytes / 2**20
        peak_mib = max((xy[1] for _, xy in drawn), default=0.0)
        if budget_mib <= BUDGET_LINE_RATIO * peak_mib:
            ax.axhline(budget_mib, ls=":", color="red", lw=1, label="memory budget")
        else:  # a line far above the points would squash them into one row
            title += f"\nmemory budget {budget_mib:,.0f} MiB, off the scale"
    entries = _legend(
        ax,
        [t for t in measured if _memory_point(t) is not None],
        {"marker": "o", "color": OK_COLOR},
        drop=("Trial", "Feasible Trial", "Infeasible Trial"),
        rename={"Best Trial": "ok, on the Pareto front"},
    )
    _legend_right(ax, entries)
    ax.set_title(title)


def write_plots(
    study: optuna.Study,
    folder: Path,
    *,
    objective_name: str = "samples/s",
    baseline_value: float | None = None,
    memory_budget_bytes: int | None = None,
    mfu_points: list[dict[str, Any]] | None = None,
    rate_name: str = "samples/s",
) -> tuple[dict[str, Path], list[str]]:
    """Draw the report's PNGs into ``folder`` (see :func:`draw_plots`).

    Returns:
        Plot name -> file (``history``, ``pareto``, ``importances``, ``slice``, ``mfu``),
        and notes on the plots that could not be drawn and why.
    """
    plt = _matplotlib()
    figures, notes = draw_plots(
        study,
        objective_name=objective_name,
        baseline_value=baseline_value,
        memory_budget_bytes=memory_budget_bytes,
        mfu_points=mfu_points,
        rate_name=rate_name,
    )
    folder.mkdir(parents=True, exist_ok=True)
    files: dict[str, Path] = {}
    for name, figure in figures.items():
        files[name] = folder / f"{name}.png"
        figure.savefig(files[name], dpi=DPI, bbox_inches="tight")
        plt.close(figure)
    return files, notes


def _n_complete(study: optuna.Study) -> int:
    return len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))


def _n_params(study: optuna.Study) -> int:
    names = set()
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        names.update(t.params)
    return len(names)
