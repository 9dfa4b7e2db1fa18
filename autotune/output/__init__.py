"""What a person or a trainer reads: the terminal summary, the HTML report and its plots,
advice from profiles, and exports of the recommended config.

Imports values and :mod:`autotune.study`, never the reverse; never torch.
"""
