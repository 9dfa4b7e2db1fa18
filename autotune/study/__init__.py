"""The driver: Optuna studies over a space, never torch.

:mod:`~autotune.study.tuner` runs a study (baseline, search, confirmation) and holds the
``tune()`` facade; the fp32 references of the accuracy guard are in
:mod:`~autotune.study.reference`, the confirmation's rounds in :mod:`~autotune.study.confirm`.
Trials run through a :class:`~autotune.study.backend.TrialBackend` (real subprocesses by
default, a recorded table in :mod:`~autotune.study.replay`).
"""
