"""Workers sharing a study: claims and the baseline, with interleavings made explicit."""

from __future__ import annotations

import time

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


def test_a_stale_confirmation_round_run_is_failed_and_not_queued_again():
    """The rounds make their missing runs themselves: a queued one would hold the
    confirmation back for good (its rounds wait for an empty queue)."""
    from autotune.results import CONFIRM, SEARCH
    from autotune.study.coordination import waiting_roles
    from autotune.study.heartbeat import KEY, fail_stale_trials

    study = optuna.create_study()
    dead = {"t": time.time() - 60.0, "host": "another-host", "pid": 1}  # beat 60 s ago
    study.enqueue_trial({}, user_attrs={"role": CONFIRM, "round": 0})
    run = study.ask()
    run.set_user_attr(KEY, dead)
    assert fail_stale_trials(study, grace_s=5.0) == [run.number]
    assert study.trials[run.number].state == optuna.trial.TrialState.FAIL
    assert study.get_trials(states=(optuna.trial.TrialState.WAITING,)) == []
    # A stale search trial, by contrast, is queued once more.
    search = study.ask()
    search.set_user_attr(KEY, dead)
    assert fail_stale_trials(study, grace_s=5.0) == [search.number]
    assert waiting_roles(study) == [SEARCH]
