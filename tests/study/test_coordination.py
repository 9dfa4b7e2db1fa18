"""Workers sharing a study: claims and the baseline, with interleavings made explicit."""

from __future__ import annotations

import optuna
from test_workers import SPACE


def test_of_two_workers_claiming_one_config_at_most_one_measures_it():
    from autotune.study.coordination import claim

    study = optuna.create_study()
    a, b = study.ask(), study.ask()
    # b writes and looks before a has written: b sees no rival; a, looking later, sees b.
    # (Comparing trial numbers alone would let both run: a is the earlier trial.)
    assert claim(study, b, "K") is True
    assert claim(study, a, "K") is False
    # Both write before either looks: both back off, and the config stays free.
    c, d = study.ask(), study.ask()
    c.set_user_attr("config_key", "L")
    assert claim(study, d, "L") is False and claim(study, c, "L") is False
    study.tell(c, state=optuna.trial.TrialState.FAIL)
    study.tell(d, state=optuna.trial.TrialState.FAIL)
    assert claim(study, study.ask(), "L") is True


def test_the_baseline_is_not_queued_again_while_a_worker_measures_it(write_space):
    from autotune import load_space
    from autotune.results import BASELINE
    from autotune.study.coordination import queue_baseline, waiting_roles

    space = load_space(write_space(SPACE))
    study = optuna.create_study()
    queue_baseline(study, space, [])
    assert waiting_roles(study) == [BASELINE]
    study.ask()  # a worker took it and measures it now
    queue_baseline(study, space, [])
    assert waiting_roles(study) == []
