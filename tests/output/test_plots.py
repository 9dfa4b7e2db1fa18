"""The report's plots: ok, infeasible and pruned trials in three distinct, named styles in
every plot of trials, and trial 0 (the baseline) clearly visible.

The study is stored as the tuner stores one (user attrs, Optuna constraints; a pruned
trial is infeasible for Optuna and has the status ``pruned``); the figures are drawn for
real, headless, and their artists inspected.
"""

from __future__ import annotations

import matplotlib
import optuna
import pytest
from matplotlib.colors import to_rgba
from optuna.distributions import CategoricalDistribution, IntDistribution
from optuna.trial import TrialState

from autotune.output.plots import (
    INFEASIBLE_KIND,
    KIND_LABELS,
    KIND_STYLES,
    KINDS,
    OK_KIND,
    PRUNED_KIND,
    draw_plots,
    kind,
    write_plots,
)

SIZES = [8, 16, 32, 64]
# number: (batch_size index, amp_dtype, samples/s, status, peak MiB)
TRIALS = [
    (1, "fp32", 100.0, "ok", 300),  # 0: the baseline
    (2, "fp32", 150.0, "ok", 500),
    (3, "fp32", 190.0, "over-memory", 900),
    (0, "bf16", 60.0, "pruned", 200),
    (2, "bf16", 170.0, "ok", 450),
    (3, "bf16", 0.0, "oom", None),
    (1, "bf16", 80.0, "pruned", 260),
]


def _study() -> optuna.Study:
    study = optuna.create_study(direction="maximize")
    dists = {
        "batch_size": IntDistribution(0, len(SIZES) - 1),
        "amp_dtype": CategoricalDistribution(["fp32", "bf16"]),
    }
    for number, (index, amp, value, status, mib) in enumerate(TRIALS):
        crashed = status not in ("ok", "over-memory")
        study.add_trial(
            optuna.trial.create_trial(
                value=value,
                params={"batch_size": index, "amp_dtype": amp},
                distributions=dists,
                user_attrs={
                    "role": "baseline" if number == 0 else "search",
                    "config": {"batch_size": SIZES[index], "amp_dtype": amp},
                    "status": status,
                    "measurement": {
                        "samples_per_s": value,
                        "peak_mem_bytes": mib * 2**20 if mib else None,
                    },
                },
                constraints={
                    "failed": 1.0 if crashed else 0.0,
                    "memory": 0.5 if status == "over-memory" else -0.4,
                    "accuracy": -0.01,
                },
            )
        )
    return study


@pytest.fixture
def figures():
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drawn, notes = draw_plots(_study(), baseline_value=100.0, memory_budget_bytes=1000 * 2**20)
    assert set(drawn) == {"history", "pareto", "importances", "slice"}, notes
    yield drawn
    for figure in drawn.values():
        plt.close(figure)


def _legend(figure):
    (legend,) = [a.get_legend() for a in figure.axes if a.get_legend()] or figure.legends
    return legend


def _marker_style(handle):
    return (
        handle.get_marker(),
        to_rgba(handle.get_markerfacecolor()),
        to_rgba(handle.get_markeredgecolor()),
    )


def test_the_stored_statuses_make_three_kinds():
    kinds = [kind(t) for t in _study().trials]
    assert kinds == ["ok", "ok", "infeasible", "pruned", "ok", "infeasible", "pruned"]


@pytest.mark.parametrize("name", ["history", "pareto", "slice"])
def test_every_plot_of_trials_names_three_distinct_styles(figures, name):
    legend = _legend(figures[name])
    texts = [t.get_text() for t in legend.get_texts()]
    for k in (OK_KIND, INFEASIBLE_KIND, PRUNED_KIND):
        assert any(t.startswith(KIND_LABELS[k] + ":") for t in texts), texts
    assert not any("Infeasible Trial" in t or t == "Trial" for t in texts)  # Optuna's own
    handles = legend.legend_handles[:3]
    assert len({_marker_style(h) for h in handles}) == 3
    if name == "history":  # every trial run, in the order of the kinds
        assert texts[:3] == [
            f"{KIND_LABELS[k]}: {n}" for k, n in zip(KINDS, (3, 2, 2), strict=True)
        ]
    assert "grey" not in _titles(figures[name])  # the legend says it, not a caption


def _titles(figure):
    return " ".join(a.get_title() for a in figure.axes) + " " + figure.get_suptitle()


def _drawn_in(figure, style):
    """The points of the scatters drawn in one of KIND_STYLES, over all axes."""
    edge = to_rgba(style.get("edgecolors", style.get("color")))
    points = set()
    for ax in figure.axes:
        for c in ax.collections:
            edges = c.get_edgecolor()
            if len(c.get_offsets()) and len(edges) and tuple(edges[0]) == edge:
                points |= {tuple(p) for p in c.get_offsets().tolist()}
    return points


def test_pruned_and_infeasible_trials_are_drawn_in_their_own_styles(figures):
    history = figures["history"]
    assert _drawn_in(history, KIND_STYLES[PRUNED_KIND]) == {(3.0, 60.0), (6.0, 80.0)}
    assert _drawn_in(history, KIND_STYLES[INFEASIBLE_KIND]) == {(2.0, 190.0), (5.0, 0.0)}
    # The Pareto plot has no memory for the OOM trial; the over-memory one is infeasible.
    pareto = figures["pareto"]
    assert _drawn_in(pareto, KIND_STYLES[INFEASIBLE_KIND]) == {(190.0, 900.0)}
    assert _drawn_in(pareto, KIND_STYLES[PRUNED_KIND]) == {(60.0, 200.0), (80.0, 260.0)}
    # The slice plot: batch_size by its real value, amp_dtype by its slot (fp32 0, bf16 1).
    pruned = _drawn_in(figures["slice"], KIND_STYLES[PRUNED_KIND])
    assert pruned == {(8.0, 60.0), (16.0, 80.0), (1.0, 60.0), (1.0, 80.0)}


def test_trial_0_is_clearly_visible_in_the_slice_plot(figures):
    figure = figures["slice"]
    ax = figure.axes[0]
    (ok,) = [c for c in ax.collections if c.get_array() is not None and len(c.get_array())]
    numbers = list(ok.get_array())
    colour = ok.to_rgba(numbers[numbers.index(0)])
    luminance = 0.2126 * colour[0] + 0.7152 * colour[1] + 0.0722 * colour[2]
    background = to_rgba(ax.get_facecolor())
    assert luminance < 0.75  # not near-white
    assert max(abs(a - b) for a, b in zip(colour[:3], background[:3], strict=True)) > 0.25


def test_write_plots_saves_every_figure(tmp_path):
    files, notes = write_plots(_study(), tmp_path, baseline_value=100.0)
    assert set(files) == {"history", "pareto", "importances", "slice"}, notes
    for png in files.values():
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_real_studys_plots_name_the_three_kinds(small_study):
    space, storage, _, result = small_study
    study = optuna.load_study(study_name=space.study.name, storage=storage)
    drawn, notes = draw_plots(study, baseline_value=result.baseline.value)
    try:
        assert {"history", "pareto", "slice"} <= set(drawn), notes
        texts = [t.get_text() for t in _legend(drawn["history"]).get_texts()]
        counts = [int(text.rsplit(": ", 1)[1]) for text in texts[:3]]
        assert [text.rsplit(": ", 1)[0] for text in texts[:3]] == [KIND_LABELS[k] for k in KINDS]
        assert sum(counts) == len(study.get_trials(states=(TrialState.COMPLETE,)))  # every run
        for name in ("pareto", "slice"):
            texts = [t.get_text() for t in _legend(drawn[name]).get_texts()]
            assert [text.rsplit(": ", 1)[0] for text in texts[:3]] == [
                KIND_LABELS[k] for k in KINDS
            ]
    finally:
        import matplotlib.pyplot as plt

        for figure in drawn.values():
            plt.close(figure)
