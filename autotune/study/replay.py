"""Replay: answer trials from a recorded table of measurements instead of running them.

Record a space's grid once (every config really measured), then replay samplers against
the table many times: the real tuner (sampling, dedupe, constraints, confirmation) runs,
only the measurement is looked up. Cheap enough for many seeds, so sampler comparisons
have statistics.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import optuna

from ..config import Config
from ..measurement import FAILED, Measurement
from ..results import DUPLICATE, REPEAT
from ..space import Space
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

    Attributes:
        calls: the configs asked for, in order (each a real trial in a live run).
    """

    def __init__(self, table: str | Path | dict[str, Any]) -> None:
        if not isinstance(table, dict):
            table = json.loads(Path(table).read_text())
        self.table = table
        # Keys are rebuilt through Config, so a table recorded before a knob was added
        # still matches configs that leave the new knob at its default.
        self.rows = {}
        for row in table["measurements"]:
            config = Config.from_dict(row["config"])
            self.rows[config.key()] = (config, Measurement.from_dict(row["measurement"]))
        self.calls: list[Config] = []

    def probe(self, space: Space, folder: Path) -> dict[str, Any]:
        caps = self.table.get("capabilities") or {
            "device": "cpu",
            "cpu_count": 64,
            "workload_blocks": 64,
        }
        return {
            "status": "ok",
            "capabilities": caps,
            "environment": self.table.get("environment", {}),
        }

    def run_trial(
        self, space: Space, config: Config, folder: Path, best_value: float | None = None
    ) -> Measurement:
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
