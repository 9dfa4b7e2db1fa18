"""What the confirmation measures after the search, and in which order.

The confirmation runs configs in paired rounds: in each round the baseline and every
config of the plan run once, in an order that rotates from round to round, so that the
machine's drift (thermal, other load, a cache warming up) falls on every config alike.
Each config is then judged by its per-round ratios to the baseline run of the same round
(:func:`autotune.results.summarize`). Three plans run in turn:

1. the finalists (the best ``confirm_top`` configs of the search) and, with
   ``search.ablate``, the *ablations* of the search's winner: the winner with one knob
   back at the baseline's value, per knob where they differ;
2. if the rounds crowned another finalist, the ablations of that one;
3. if some knobs' contributions are within noise, the winner *reduced* to the knobs
   that matter, against the winner (not needed when one knob is dropped: its ablation
   is the reduced config).

The study keeps what the rounds mean in its ``confirmation`` user attr: the finalists,
each winner's ablations and reduced config (config keys), and the first round of each
plan (so an interrupted confirmation resumes where it stopped).
"""

from __future__ import annotations

import hashlib
from typing import Any

from ..config import Config
from ..knobs import KNOBS
from ..space import Space
from .sampling import like


def ablations(
    space: Space, winner: Config, baseline: Config
) -> tuple[dict[str, Config], list[str]]:
    """Per knob where ``winner`` differs from ``baseline``: the winner with that knob at
    the baseline's value (a point of the space). Under a fixed global batch the
    accumulation steps follow the batch size, so they are no knob of their own.

    Returns the ablated configs by knob, and notes on knobs that cannot be ablated (fixed
    in the space, or the baseline's value is not one of the listed values).
    """
    out: dict[str, Config] = {}
    notes: list[str] = []
    for name in KNOBS:
        theirs, ours = getattr(baseline, name), getattr(winner, name)
        if theirs == ours or (name == "accumulation_steps" and space.fixed_batch):
            continue
        if name not in space.searched:
            notes.append(f"{name} not ablated: it is fixed to {ours!r} in the space")
            continue
        ablated = like(space, {**winner.to_dict(), name: theirs})
        if getattr(ablated, name) != theirs or ablated == winner:
            notes.append(
                f"{name} not ablated: the baseline's value {theirs!r} is not a listed value"
            )
            continue
        out[name] = ablated
    return out, notes


def reduced(space: Space, winner: Config, baseline: Config, knobs: list[str]) -> Config:
    """``winner`` with ``knobs`` back at the baseline's values."""
    return like(space, {**winner.to_dict(), **{k: getattr(baseline, k) for k in knobs}})


def rotated(plan: list[Config], index: int) -> list[Config]:
    """The order of round ``index``: the plan rotated by ``index`` places."""
    if not plan:
        return []
    k = index % len(plan)
    return plan[k:] + plan[:k]


def unique(plan: list[Config]) -> list[Config]:
    """``plan`` without repeated configs (an ablation may be the baseline itself)."""
    seen: set[str] = set()
    out = []
    for c in plan:
        if c.key() not in seen:
            seen.add(c.key())
            out.append(c)
    return out


def first_round(conf: dict[str, Any], plan: list[Config], rounds: int, used: int) -> int:
    """The number of the first round of ``plan``: the one it had if it ran before (an
    interrupted confirmation resumes), else the next unused one (``used``: the highest
    round number any run has, or -1). Records new plans in ``conf["plans"]``."""
    plans = conf.setdefault("plans", {})
    name = hashlib.sha256("|".join(sorted(c.key() for c in plan)).encode()).hexdigest()[:16]
    if name not in plans:
        ends = [start + n - 1 for start, n in plans.values()]
        plans[name] = [max([used, *ends]) + 1, rounds]
    return plans[name][0]
