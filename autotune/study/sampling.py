"""Between a space and Optuna: which sampler, and how a trial's params become a Config."""

from __future__ import annotations

import itertools
import math
import random
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import optuna

from ..config import Config
from ..errors import AutotuneError
from ..knobs import KNOBS
from ..space import Space


def encode(space: Space, config: Config) -> dict[str, Any]:
    """Optuna params of ``config``: index for ordinal knobs, the value for the others.

    Inactive knobs (see :attr:`Knob.requires`) have no param, as in :func:`sample`.
    """
    values = config.to_dict()
    params = {}
    for name, choices in space.searched.items():
        if KNOBS[name].requires(values) is None:
            value = values[name]
            params[name] = choices.index(value) if KNOBS[name].ordinal else value
    return params


def _walk(space: Space, choose: Callable[[str, tuple[Any, ...]], Any]) -> Config:
    """A config built knob by knob in registry order (a knob's conditions look only at
    earlier knobs): ``choose(name, choices)`` picks each searched knob that is active given
    the knobs before it; an inactive knob (prefetch_factor without workers...) is not
    chosen and keeps its default, so equivalent configs are one point of the space."""
    values = space.config_from({}).to_dict()
    for name in KNOBS:
        knob = KNOBS[name]
        choices = space.searched.get(name)
        if knob.requires(values) is not None:
            values[name] = knob.default  # inactive, searched or not
        elif choices is not None:
            values[name] = choose(name, choices)
    return space.config_from({name: values[name] for name in space.searched})


def sample(space: Space, trial: optuna.Trial) -> Config:
    """Ask the trial for a config, define-by-run: inactive knobs are not sampled.

    Ordinal knobs (batch size, workers...) are searched by index so the sampler can use
    their order; NOTES-optuna-torch.md measured this beating categorical encoding.
    """

    def choose(name: str, choices: tuple[Any, ...]) -> Any:
        if KNOBS[name].ordinal:
            return choices[trial.suggest_int(name, 0, len(choices) - 1)]
        return trial.suggest_categorical(name, choices)

    return _walk(space, choose)


def _like(space: Space, values: Mapping[str, Any]) -> Config:
    """The config of ``values`` where each searched knob that must be chosen but has no
    listed value in ``values`` (it was inactive there) takes its first listed value."""

    def choose(name: str, choices: tuple[Any, ...]) -> Any:
        v = values.get(name)
        return v if v in choices else choices[0]

    return _walk(space, choose)


def neighbours(space: Space, config: Config) -> list[Config]:
    """The distinct configs one step from ``config``: one searched knob moved to the next
    value up or down (ordinal knobs) or to any other value (the others)."""
    values = config.to_dict()
    out: dict[str, Config] = {}
    for name, choices in space.searched.items():
        if values[name] not in choices:  # inactive here: moving it changes nothing
            continue
        i = choices.index(values[name])
        if KNOBS[name].ordinal:
            moves = [choices[j] for j in (i - 1, i + 1) if 0 <= j < len(choices)]
        else:
            moves = [c for c in choices if c != values[name]]
        for v in moves:
            c = _like(space, {**values, name: v})
            if c.key() != config.key():
                out.setdefault(c.key(), c)
    return list(out.values())


def every_config(space: Space, limit: int = 20_000) -> list[Config] | None:
    """The distinct configs of the space (inactive knobs folded), or ``None`` when the
    product of the searched domains is above ``limit``."""
    names = list(space.searched)
    if math.prod(len(space.searched[n]) for n in names) > limit:
        return None
    out: dict[str, Config] = {}
    for combo in itertools.product(*(space.searched[n] for n in names)):
        c = _like(space, dict(zip(names, combo, strict=True)))
        out.setdefault(c.key(), c)
    return list(out.values())


def unmeasured(
    space: Space,
    ranked_configs: list[Config],
    taken: set[str],
    rng: random.Random,
    pool: list[Config] | None = None,
) -> tuple[Config, str] | None:
    """A config not in ``taken``, for when the sampler keeps proposing measured ones.

    First the unmeasured neighbours of the best configs (``ranked_configs``, best first):
    the sampler's proposals say the optimum is near them. Then a random unmeasured config
    (from ``pool``, every config of a small space, else by rejection). ``None`` when every
    config is taken. Returns the config and how it was found (``neighbour``/``random``).
    """
    for best in ranked_configs:
        near = [c for c in neighbours(space, best) if c.key() not in taken]
        if near:
            return rng.choice(near), "neighbour"
    if pool is not None:
        rest = [c for c in pool if c.key() not in taken]
        return (rng.choice(rest), "random") if rest else None
    for _ in range(1000):
        c = _walk(space, lambda name, choices: rng.choice(choices))
        if c.key() not in taken:
            return c, "random"
    return None


def grid(space: Space) -> dict[str, list[Any]]:
    """Every param value of the space, as Optuna's GridSampler wants it."""
    return {
        name: list(range(len(choices))) if KNOBS[name].ordinal else list(choices)
        for name, choices in space.searched.items()
    }


def make_sampler(space: Space) -> optuna.samplers.BaseSampler:
    """The sampler ``search.sampler`` names, seeded."""
    s = space.search
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if s.sampler == "random":
            return optuna.samplers.RandomSampler(seed=s.seed)
        if s.sampler == "grid":
            return optuna.samplers.GridSampler(grid(space), seed=s.seed)
        if s.sampler == "tpe-independent":
            return optuna.samplers.TPESampler(
                seed=s.seed, n_startup_trials=s.n_startup_trials, constant_liar=True
            )
        if s.sampler == "gp":
            try:
                import scipy  # noqa: F401
            except ImportError:
                raise AutotuneError("search.sampler gp needs scipy: pip install scipy") from None
            return optuna.samplers.GPSampler(seed=s.seed, n_startup_trials=s.n_startup_trials)
        # Multivariate TPE models knobs jointly (batch size and workers interact); group
        # splits the conditional space into the sub-spaces that really co-occur.
        # constant_liar: with several workers, running trials count as bad guesses, so
        # workers do not all propose the same config.
        return optuna.samplers.TPESampler(
            seed=s.seed,
            multivariate=True,
            group=True,
            n_startup_trials=s.n_startup_trials,
            constant_liar=True,
        )
