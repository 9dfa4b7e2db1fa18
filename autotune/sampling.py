"""Between a space and Optuna: which sampler, and how a trial's params become a Config."""

from __future__ import annotations

import warnings
from typing import Any

import optuna

from .config import Config
from .errors import AutotuneError
from .knobs import KNOBS
from .space import Space


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


def sample(space: Space, trial: optuna.Trial) -> Config:
    """Ask the trial for a config, define-by-run: a knob that is inactive given the
    knobs before it (prefetch_factor without workers...) is not sampled and keeps its
    default, so equivalent configs are one point of the space, not several.

    Ordinal knobs (batch size, workers...) are searched by index so the sampler can use
    their order; NOTES-optuna-torch.md measured this beating categorical encoding.
    """
    values = space.config_from({}).to_dict()
    for name in KNOBS:  # registry order: a knob's conditions look only at earlier knobs
        knob = KNOBS[name]
        choices = space.searched.get(name)
        if knob.requires(values) is not None:
            values[name] = knob.default  # inactive, searched or not
        elif choices is None:
            continue
        elif knob.ordinal:
            values[name] = choices[trial.suggest_int(name, 0, len(choices) - 1)]
        else:
            values[name] = trial.suggest_categorical(name, choices)
    return space.config_from({name: values[name] for name in space.searched})


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
