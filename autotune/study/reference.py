"""The fp32 references: the loss trajectories the accuracy guard judges trials against.

A trial's losses are compared with those of the baseline run with plain fp32 eager
numerics (:func:`reference_config`), so that reduced precision or a compiler that changes
what the model learns is caught (:func:`autotune.study.scoring.judge`). The reference runs
once per study and is kept in the study's ``reference`` user attr; when the baseline is
itself fp32 without compile, the baseline trial is the reference. A config with another
data layout (:data:`LAYOUT_KNOBS`) is judged against an fp32 run of that layout, also run
once and kept (``reference:<layout>``).
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import optuna

from ..config import Config, resolve_inactive
from ..errors import WorkloadError
from ..measurement import NAN, OOM, TIMEOUT, Measurement
from ..results import BASELINE, TrialRecord, baseline_of, best_of
from ..space import Space
from . import coordination, heartbeat
from .backend import TrialBackend
from .coordination import claim, held, running_roles, waiting_roles
from .reporter import Reporter
from .sampling import sample
from .storage import records
from .trials import Trials

# Knobs that change which samples share an optimizer step (or, packed, a row's
# attention): a trial that sets one is judged against an fp32 reference of the same layout.
LAYOUT_KNOBS = ("packing", "pack_length", "length_grouping")
# The folders of reference runs (under the study's output folder) start with this name.
REFERENCE_FOLDER = "reference"


def reference_config(
    baseline: Config, layout: dict[str, Any] | None = None, single: bool = True
) -> Config:
    """The baseline with plain fp32 eager numerics: the accuracy guard's yardstick.

    Reduced-precision matmuls and compilers are off; knobs that only apply with them
    (compile_fullgraph...) go back to their defaults. ``layout`` sets data-layout knobs
    (:data:`LAYOUT_KNOBS`) of the trial to compare. With ``single``, a multi-process
    (DDP/FSDP) baseline becomes one process accumulating the same global batch: its ranks
    split one sample stream, so the one process sees the same samples per step.
    """
    plain = {
        "amp_dtype": "fp32",
        "matmul_precision": "highest",
        "compile_mode": "off",
        "jit": "off",
    }
    if single and baseline.world_size > 1:
        plain["world_size"] = 1
        plain["accumulation_steps"] = baseline.accumulation_steps * baseline.world_size
    return Config(**resolve_inactive({**baseline.to_dict(), **plain, **(layout or {})}))


def layout_of(config: Config, baseline: Config) -> dict[str, Any]:
    """The data-layout knobs where ``config`` differs from the baseline."""
    return {
        k: getattr(config, k) for k in LAYOUT_KNOBS if getattr(config, k) != getattr(baseline, k)
    }


def reference_failure(config: Config, m: Measurement) -> str:
    """Why the study cannot start when its fp32 reference run failed, and the fix: only
    a numerics problem of fp32 itself is one that turning the accuracy guard off answers."""
    what = f"the fp32 reference run ({config.short()})"
    if m.status == NAN:
        return (
            f"{what} went non-finite ({m.reason}): the workload diverges in fp32 itself "
            "(its learning rate, its loss); fix it, or set limits.accuracy: off to search "
            "without the accuracy guard"
        )
    if m.status == OOM:
        return (
            f"{what} ran out of memory ({m.reason}): the accuracy guard needs one fp32 run "
            "of the baseline; give the baseline a smaller batch_size, or set "
            "limits.accuracy: off"
        )
    if m.status == TIMEOUT:
        return (
            f"{what} did not finish: {m.reason}; fix the workload where it hangs, or raise "
            "trial.timeout_s if it is only slow"
        )
    return (
        f"{what} failed: {m.reason}; the workload does not train (a bug in it, not a "
        "numerics problem): fix it (`autotune validate SPACE` runs one step of it and "
        "names the field at fault)"
    )


class References:
    """The fp32 references of one study: the study's (:meth:`study_reference`, once
    before the search) and the one each trial is judged against (:meth:`for_config`).

    ``trials`` runs and tells the baseline when it is the reference (a trial of the
    study, :class:`~autotune.study.trials.Trials`); the other reference runs go through
    ``backend`` into ``out_dir``. ``n_trials``, the budget, is for the baseline's progress line.
    """

    def __init__(
        self,
        space: Space,
        backend: TrialBackend,
        out_dir: Path,
        reporter: Reporter,
        *,
        worker_index: int,
        n_trials: int | None,
        trials: Trials,
    ) -> None:
        self.space = space
        self.backend = backend
        self.out_dir = out_dir
        self.reporter = reporter
        self.worker_index = worker_index
        self.n_trials = n_trials
        self.trials = trials
        self.losses: list[float] | None = None  # the study's, once study_reference found it

    def study_reference(self, study: optuna.Study, trials: list[TrialRecord]) -> list[float] | None:
        """The study's reference trajectory (``None`` with the accuracy guard off), kept
        as :attr:`losses` for :meth:`for_config`."""
        self.losses = self._reference(study, trials)
        return self.losses

    def _reference(self, study: optuna.Study, trials: list[TrialRecord]) -> list[float] | None:
        """The fp32, no-compile loss trajectory trials are compared against.

        Run once per study and kept in its user attrs, so a resumed study reuses it. When
        the baseline itself is fp32 without compile, the baseline trial is the reference.
        """
        if not self.space.limits.accuracy.enabled:
            return None
        stored = study.user_attrs.get("reference")
        if stored is not None:
            return [float(x) for x in stored["losses"]]
        config = reference_config(self.space.baseline)
        if config == self.space.baseline and BASELINE in running_roles(study):
            # another worker runs the baseline
            stored = coordination.wait_for_reference(
                study,
                timeout_s=self.space.trial.timeout_s + 30,
                grace_s=heartbeat.grace_s(self.space.study.heartbeat_s),
                note=self.reporter.note,
            )
            if stored is not None:
                return stored
        baseline = baseline_of(trials)
        if config == self.space.baseline and baseline is not None:
            m = baseline.measurement
        elif config == self.space.baseline and waiting_roles(study)[:1] == [BASELINE]:
            # Run the enqueued baseline trial now; it is judged against its own losses.
            trial = study.ask()
            if trial.user_attrs.get("role") != BASELINE:  # another worker took it first
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
                return self._reference(study, records(study))
            sample(self.space, trial)  # takes the enqueued baseline params
            if not claim(study, trial, config.key()):  # a second queued baseline: drop it
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
                # Both claimants may have backed off: after a random pause (so that two
                # workers fall out of step), queue it again if nobody measures it.
                time.sleep(random.uniform(0.1, 1.0))
                trials = records(study)
                if not held(study, config.key()):
                    coordination.queue_baseline(study, self.space, trials)
                return self._reference(study, trials)
            m = self.trials.run(study, trial, config)
            record = self.trials.tell(
                study, trial, config, m, BASELINE, reference=m.losses if m.ok else None
            )
            trials.append(record)
            self.reporter.trial(record, best_of(trials), record, 1, self.n_trials)
        else:
            self.reporter.note(
                f"running the fp32 reference ({config.short()}) for the accuracy guard"
            )
            folder = REFERENCE_FOLDER + (f"-{self.worker_index}" if self.worker_index else "")
            m = self.backend.run_trial(self.space, config, self.out_dir / folder)
            ranks = reference_config(self.space.baseline, single=False)
            if m.status == OOM and ranks != config:  # one process cannot hold the model
                self.reporter.note(
                    f"the single-process fp32 reference ran out of memory ({m.reason}); "
                    f"the reference is the baseline's processes in fp32 ({ranks.short()})"
                )
                config = ranks
                m = self.backend.run_trial(self.space, config, self.out_dir / f"{folder}-ranks")
        if not m.ok:
            raise WorkloadError(reference_failure(config, m))
        study.set_user_attr("reference", {"config": config.to_dict(), "losses": m.losses})
        return m.losses

    def for_config(
        self, study: optuna.Study, config: Config, m: Measurement | None = None
    ) -> list[float] | None:
        """The reference trajectory ``config`` is judged against: the study's, or for a
        config with another data layout (``length_grouping``) an fp32 run of that layout,
        run once and kept in the study (``reference:<layout>``). A complete run ``m`` of
        ``config`` that is itself that fp32 run (the layout moved alone from an fp32
        baseline, as the screening moves it) is the layout's reference: its losses are
        kept, and the same config is not run a second time."""
        layout = layout_of(config, self.space.baseline)
        if not layout or not self.space.limits.accuracy.enabled:
            return self.losses
        name = ",".join(f"{k}={v}" for k, v in sorted(layout.items()))
        stored = study.user_attrs.get(f"reference:{name}")
        if stored is not None:
            return [float(x) for x in stored["losses"]]
        ref = reference_config(self.space.baseline, layout)
        if m is None or not (m.ok and m.losses) or ref.key() != config.key():
            self.reporter.note(f"running the fp32 reference of layout {name} ({ref.short()})")
            folder = self.out_dir / f"{REFERENCE_FOLDER}-{name.replace('=', '-').replace(',', '_')}"
            m = self.backend.run_trial(self.space, ref, folder)
            if not m.ok:
                self.reporter.note(
                    f"the fp32 reference of layout {name} did not train cleanly ({m.status}: "
                    f"{m.reason}); trials of that layout are judged against the study's "
                    "reference"
                )
                return self.losses
        study.set_user_attr(f"reference:{name}", {"config": ref.to_dict(), "losses": m.losses})
        return m.losses
