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
from ..measurement import FAILED, OK, Measurement
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
            (``benchmarks/search.py repeat``) answers with its median run (see
            :func:`_medians`); without it, with its recorded run.

    Attributes:
        calls: the configs asked for, in order (each a real run in a live study).
        references: indexes into ``calls`` of the accuracy guard's reference runs.
        noisy: False: a config answers the same every time, so a replayed study measures
            no noise floor (a subclass that varies its answers sets it).
    """

    noisy = False

    def __init__(self, table: str | Path | dict[str, Any], baseline: Config | None = None) -> None:
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
        found = self.rows.get(config.key())
        if found is None:
            return Measurement(status=FAILED, reason="config not in the replay table")
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
    with its median run: of the recorded run and the repeats, the one whose throughput over
    the baseline's throughput in the same pass is the median, its throughputs scaled by
    the recorded baseline's over that pass's baseline (the machine's pace in that pass
    cancels; its wall and compile seconds stay as measured). A grid measured once per
    config has a noisy top, and its best single run is the luckiest (the winner's curse):
    a config's median of three runs is a figure that repeats, and the replay's optimum
    is then one a study can be asked to reach."""
    base_row = next(
        (
            r
            for r in table["measurements"]
            if r.get("repeats") and Config.from_dict(r["config"]).key() == baseline.key()
        ),
        None,
    )
    if base_row is None:
        return {}
    base = {"": Measurement.from_dict(base_row["measurement"]).rate}
    base.update(
        (r["pass"], Measurement.from_dict(r["measurement"]).rate) for r in base_row["repeats"]
    )
    out = {}
    for row in table["measurements"]:
        runs = [("", Measurement.from_dict(row["measurement"]))] + [
            (r["pass"], Measurement.from_dict(r["measurement"])) for r in row.get("repeats", [])
        ]
        runs = [(p, m) for p, m in runs if m.rate and base.get(p)]
        if len(runs) < 2 or row is base_row:
            continue
        runs.sort(key=lambda run: run[1].rate / base[run[0]])
        pass_, m = runs[(len(runs) - 1) // 2]
        scale = base[""] / base[pass_]
        m = dataclasses.replace(
            m,
            samples_per_s=m.samples_per_s and m.samples_per_s * scale,
            tokens_per_s=m.tokens_per_s and m.tokens_per_s * scale,
        )
        config = Config.from_dict(row["config"])
        out[config.key()] = (config, m)
    return out
