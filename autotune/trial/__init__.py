"""Everything that runs inside a trial subprocess (``python -m autotune.trial``).

The only layer that imports torch at module level. The driver never imports it: it
starts trials by module name (:mod:`autotune.study.runner`). ``autotune.apply`` (in
:mod:`autotune.trial.apply`) is the same code, for a user's own training loop.
"""
