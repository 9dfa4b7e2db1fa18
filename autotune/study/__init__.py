"""The driver: Optuna studies over a space, never torch.

:mod:`~autotune.study.tuner` runs a study (baseline, search, confirmation) and holds the
``tune()`` facade; trials run through a :class:`~autotune.study.backend.TrialBackend`
(real subprocesses by default, a recorded table in :mod:`~autotune.study.replay`).
"""
