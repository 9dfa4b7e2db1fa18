"""Replay: answer trials from a recorded table of measurements instead of running them.

Record a space's grid once (every config really measured), then replay samplers against
the table many times: the real tuner (sampling, dedupe, constraints, confirmation) runs,
only the measurement is looked up. Cheap enough for many seeds, so sampler comparisons
have statistics.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import optuna

from ..config import Config
from ..errors import AutotuneError
from ..measurement import FAILED, OK, Measurement, median_of
from ..results import DUPLICATE, REPEAT
from ..space import Space
from .reference import REFERENCE_FOLDER
from .scoring import judge, objective
from .storage import records


def record_table(study: optuna.Study, path: str | Path) -> dict[str, Any]:
    """Write every distinct measured config of ``study`` (and its probe facts) to ``path``."""
    rows = {}
    for t in records(study):
        if t.role not in (DUPLICATE, REPEAT):
            rows[t.config.key()] = {
                "config": t.config.to_dict(),
                "measurement": t.measurement.to_dict(),
            }
    table = {
        "environment": study.user_attrs.get("environment", {}),
        "capabilities": study.user_attrs.get("capabilities", {}),
        "reference": study.user_attrs.get("reference"),
        "measurements": list(rows.values()),
    }
    Path(path).write_text(json.dumps(table, indent=1))
    return table


class ReplayBackend:
    """A :class:`~autotune.study.backend.TrialBackend` that looks measurements up.

    Args:
        table: a recorded table (:func:`record_table`), or its path.
        baseline: the space's baseline: given, a config measured more than once
            (``benchmarks/search.py repeat``, the baseline included) answers with its
            median run as measured (see :func:`_medians`); without it, with its
            recorded run.
        name: what the table is called in errors (its path when ``table`` is one).

    Attributes:
        calls: the configs asked for, in order (each a real run in a live study).
        references: indexes into ``calls`` of the accuracy guard's reference runs.
        noisy: False: a config answers the same every time, so a replayed study measures
            no noise floor (a subclass that varies its answers sets it).
    """

    noisy = False

    def __init__(
        self,
        table: str | Path | dict[str, Any],
        baseline: Config | None = None,
        name: str = "",
    ) -> None:
        self.name = name or ("" if isinstance(table, dict) else str(table))
        if not isinstance(table, dict):
            table = json.loads(Path(table).read_text())
        self.table = table
        # Keys are rebuilt through Config, so a table recorded before a knob was added
        # still matches configs that leave the new knob at its default.
        self.rows = {}
        for row in table["measurements"]:
            config = Config.from_dict(row["config"])
            self.rows[config.key()] = (config, Measurement.from_dict(row["measurement"]))
        if baseline is not None:
            self.rows.update(_medians(table, baseline))
        self.calls: list[Config] = []
        # Indexes into ``calls`` of the fp32 reference runs of the accuracy guard (a new
        # layout's): real runs that cost wall time, but not trials of the study's budget.
        self.references: set[int] = set()

    def probe(self, space: Space, folder: Path) -> dict[str, Any]:
        caps = self.table.get("capabilities") or {
            "device": "cpu",
            "cpu_count": 64,
            "workload_blocks": 64,
        }
        return {
            "status": OK,
            "capabilities": caps,
            "environment": self.table.get("environment", {}),
        }

    def run_trial(
        self, space: Space, config: Config, folder: Path, best_value: float | None = None
    ) -> Measurement:
        if folder.name.startswith(REFERENCE_FOLDER):
            self.references.add(len(self.calls))
        self.calls.append(config)
        return self.measurement(config)

    def run_round(
        self, space: Space, configs: list[Config], folders: list[Path]
    ) -> list[Measurement]:
        """A replayed round: each config's row, as one at a time (a table has no drift
        to share)."""
        return [self.run_trial(space, c, f) for c, f in zip(configs, folders, strict=True)]

    def measurement(self, config: Config) -> Measurement:
        """The table's answer for ``config``; an error naming it when the table has none."""
        found = self.rows.get(config.key())
        if found is None:
            # A measurement made up here would judge the search on a run nobody made.
            table = f"the replay table {self.name}" if self.name else "the replay table"
            raise AutotuneError(
                f"{table} has no row for the config the study asks for: {config.short()} "
                f"({config.key()}); record the grid of this space again "
                "(benchmarks/search.py record)"
            )
        return found[1]

    def profile_trial(
        self, space: Space, config: Config, folder: Path, steps: int
    ) -> dict[str, Any]:
        return {"status": FAILED, "reason": "a replayed study has no profiles"}

    def optimum(self, space: Space) -> tuple[Config, float]:
        """The best feasible config of the table under ``space``'s rules."""
        reference = (self.table.get("reference") or {}).get("losses")
        feasible = [
            (config, objective(m, space.trial))
            for config, m in self.rows.values()
            if judge(m, space, reference=reference).feasible
        ]
        assert feasible, "no feasible config in the table"
        return max(feasible, key=lambda item: item[1])


def _medians(table: dict[str, Any], baseline: Config) -> dict[str, tuple[Config, Measurement]]:
    """The rows measured more than once (``benchmarks/search.py repeat``), each answered
    with its median run, as measured: of the recorded run and the repeats, the one whose
    throughput is the median (the lower middle of an even count), so the rate is one a run
    of that config really reached. Its profile shares (data wait, padding) are the medians
    of every run's, so a rule reading the baseline's profile reads its median too.

    Why raw and not over each pass's baseline: scaling a pass by the recorded baseline over
    that pass's baseline assumes the machine's drift hits every config alike. It did not
    on ``cnn_amp_grid`` (the fp32 baseline slowed 988 -> 914 -> 828 samples/s while its
    bf16 configs held), and the scaled "optimum", 1,912 samples/s, stood above every run
    ever recorded. The passes of a table are made the same day on an idle machine; what
    drift is left stays in the runs, as it would in a live study. A grid measured once
    per config has a noisy top whose best single run is the luckiest (the winner's curse):
    a config's median of three runs is a figure that repeats, and the replay's optimum is
    then one a study can be asked to reach. ``baseline`` is kept for the callers' sake
    (and the baseline's row, repeated with the top, is answered with its median too)."""
    out = {}
    for row in table["measurements"]:
        runs = [Measurement.from_dict(row["measurement"])] + [
            Measurement.from_dict(r["measurement"]) for r in row.get("repeats", [])
        ]
        runs = [m for m in runs if m.rate]
        if len(runs) < 2:
            continue
        runs.sort(key=lambda m: m.rate)
        m = dataclasses.replace(
            runs[(len(runs) - 1) // 2],
            data_share=median_of([r.data_share for r in runs]),
            padding_share=median_of([r.padding_share for r in runs]),
        )
        config = Config.from_dict(row["config"])
        out[config.key()] = (config, m)
    return out
