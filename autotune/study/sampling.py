"""Between a space and Optuna: which sampler, and how a trial's params become a Config."""

from __future__ import annotations

import itertools
import math
import random
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution

from ..config import Config
from ..errors import AutotuneError
from ..knobs import KNOBS
from ..space import Space

# The study user attr that says how the study's params stand for ordinal knobs (see
# :func:`param`). VALUES: every study made since it exists. INDEXES: a study made by an
# older autotune, whose params named after an ordinal knob are indexes into its values;
# storage.open_study marks it so when it resumes one.
ENCODING = "param_encoding"
VALUES = "values"
INDEXES = "indexes"
# The suffix of a param that is an index into a knob's values (``batch_size_index``).
INDEX = "_index"


def param(
    name: str, choices: tuple[Any, ...], indexes: bool = False
) -> tuple[str, BaseDistribution]:
    """The Optuna param that searches knob ``name`` over ``choices``: its name, distribution.

    Ordinal knobs keep their order for the sampler (NOTES-optuna-torch.md measured it
    beating categorical encoding). Optuna has no ordered distribution over arbitrary
    values (``log=True`` admits every integer between), so evenly spaced values (0, 2, 4;
    any two) are searched as themselves, ``IntDistribution(0, 4, step=2)``, and Optuna's
    tools (optuna-dashboard, ``trials_dataframe()``) show them; others (batch sizes 16,
    32, 64) by index under ``<knob>_index``, the value in the trial's user attr ``<knob>``.
    With ``indexes`` (a study of an older autotune, see :data:`ENCODING`) only values 0 to
    n-1, which are their own indexes, are searched under the knob's name.
    """
    if not KNOBS[name].ordinal:
        return name, CategoricalDistribution(choices)
    steps = {b - a for a, b in itertools.pairwise(choices)}
    low, high = choices[0], choices[-1]
    if len(steps) == 1 and (not indexes or (low, steps) == (0, {1})):
        return name, IntDistribution(low, high, step=steps.pop())
    return name + INDEX, IntDistribution(0, len(choices) - 1)


def knob_of(param_name: str) -> str:
    """The knob a param stands for: ``batch_size_index`` -> ``batch_size``."""
    name = param_name.removesuffix(INDEX)
    return name if name in KNOBS else param_name


def encode(space: Space, config: Config) -> dict[str, Any]:
    """Optuna params of ``config`` as :func:`sample` asks for them (for ``enqueue_trial``).

    An evenly spaced ordinal knob is given as its value and as ``<knob>_index``, which a
    study of an older autotune asks for instead (Optuna ignores a param it is not asked
    for). Inactive knobs (see :attr:`Knob.requires`) have no param, as in :func:`sample`.
    """
    values = config.to_dict()
    params = {}
    for name, choices in space.searched.items():
        if KNOBS[name].requires(values) is None:
            for indexes in (False, True):
                key, _ = param(name, choices, indexes)
                params[key] = values[name] if key == name else choices.index(values[name])
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

    Each knob is the param :func:`param` names, in the study's :data:`ENCODING`; a knob
    searched by index also gets its value as the trial's user attr ``<knob>``.
    """
    indexes = trial.study.user_attrs.get(ENCODING) == INDEXES
    if isinstance(trial.study.sampler, ConfigGrid):
        trial.study.sampler.choose(space, trial)

    def choose(name: str, choices: tuple[Any, ...]) -> Any:
        key, dist = param(name, choices, indexes)
        if isinstance(dist, CategoricalDistribution):
            return trial.suggest_categorical(key, choices)
        value = trial.suggest_int(key, dist.low, dist.high, step=dist.step)
        if key == name:
            return value
        trial.set_user_attr(name, choices[value])
        return choices[value]

    return _walk(space, choose)


def like(space: Space, values: Mapping[str, Any]) -> Config:
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
            c = like(space, {**values, name: v})
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
        c = like(space, dict(zip(names, combo, strict=True)))
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


class ConfigGrid(optuna.samplers.BaseSampler):
    """``search.sampler: grid``: every config of the space the trials see, exactly once.

    Optuna's GridSampler walks the product of the params' values. A conditional knob
    (``persistent_workers`` means nothing without workers) then makes several grid points
    one config (the tuner answers the repeats from storage and they spend the budget),
    and the grid is fixed when the sampler is made, before the device restriction drops
    values (``num_workers: 3`` on 2 CPUs), so it ran dropped values. This sampler chooses
    whole configs instead: :func:`sample` hands it the (restricted) space of each trial and
    it picks, in an order shuffled by ``seed``, the first config of :func:`every_config`
    that no running or finished trial of the study measures (another worker's included);
    the trial's params are then that config's. A queued trial (the baseline, a retry)
    keeps its own params. When every config is taken it repeats the first (the tuner
    counts the space as covered and stops).
    """

    def __init__(self, seed: int | None = None) -> None:
        self._seed = seed
        self._order: tuple[Space, list[Config] | None] | None = None
        self._params: dict[int, dict[str, Any]] = {}
        self._fallback = optuna.samplers.RandomSampler(seed=seed)

    def infer_relative_search_space(self, study, trial) -> dict[str, BaseDistribution]:
        return {}

    def sample_relative(self, study, trial, search_space) -> dict[str, Any]:
        return {}

    def sample_independent(self, study, trial, param_name, param_distribution) -> Any:
        params = self._params.get(trial.number, {})
        if param_name in params:
            return params[param_name]
        return self._fallback.sample_independent(study, trial, param_name, param_distribution)

    def after_trial(self, study, trial, state, values) -> None:
        self._params.pop(trial.number, None)

    def choose(self, space: Space, trial: optuna.Trial) -> None:
        """Pick the config ``trial`` measures: the next one of ``space`` not yet taken."""
        if self._order is None or self._order[0] is not space:
            configs = every_config(space)
            if configs is not None:
                random.Random(self._seed).shuffle(configs)
            self._order = (space, configs)
        configs = self._order[1]
        taken = _taken(trial.study)
        if configs is None:  # too many to list: an untaken config by rejection
            rng = random.Random(f"{self._seed}-{trial.number}")
            found = unmeasured(space, [], taken, rng)
            config = found[0] if found else _walk(space, lambda name, choices: choices[0])
        else:
            config = next((c for c in configs if c.key() not in taken), configs[0])
        self._params[trial.number] = encode(space, config)


def _taken(study: optuna.Study) -> set[str]:
    """The configs a running or finished trial of ``study`` measures (its stored config,
    else the key it claimed; see :mod:`autotune.study.coordination`)."""
    states = (optuna.trial.TrialState.RUNNING, optuna.trial.TrialState.COMPLETE)
    keys = set()
    for t in study.get_trials(deepcopy=False, states=states):
        config = t.user_attrs.get("config")
        key = (
            Config.from_dict(config).key() if config is not None else t.user_attrs.get("config_key")
        )
        if key is not None:
            keys.add(key)
    return keys


def make_sampler(space: Space, indexes: bool = False) -> optuna.samplers.BaseSampler:
    """The sampler ``search.sampler`` names, seeded (``indexes``: the params of a study of
    an older autotune, see :func:`param`; the grid gives both encodings)."""
    s = space.search
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if s.sampler == "random":
            return optuna.samplers.RandomSampler(seed=s.seed)
        if s.sampler == "grid":
            return ConfigGrid(seed=s.seed)
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
