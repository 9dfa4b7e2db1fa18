"""Does the same command give the same answer? Fresh studies of one space, judged head to head.

    python benchmarks/reproducibility.py search_spaces/cpu.yaml --studies 5 --rounds 8

Issue 41: on a noisy machine the same ``autotune run`` kept a knob whose rounds spanned
0.95-1.21x, then dropped it. This runs ``--studies`` fresh studies of SPACE, each in its
own ``python -m autotune run`` process with its own SQLite file (as a user reruns the
command), then measures every distinct recommendation and the baseline head to head: one
interleaved batch of paired rounds, each config once a round as a fresh trial process, the
order rotated every round. A round's runs go side by side, taking turns on the machine as
the confirmation's rounds do (:func:`autotune.study.runner.run_interleaved`), where their
memory peaks in the studies add up within the memory limit; ``--one-at-a-time`` runs
them one after the other, as the judges before 2026-12-07 did. The rounds are
sequential: ``--rounds`` at least, then on until
every recommendation's regret interval lies on one side of the goal (at or below it, or
wholly above it), or ``--max-rounds`` (the default: as many as ``--rounds``, a fixed
batch). A judge of 8 fixed rounds could not rank recommendations a few percent apart on a
machine whose paired rounds spread 0.82-1.21x (text.yaml, 2026-12-07): each interval
spanned 15-35 points. A sequential judge looks at its intervals after every round, and
each look is a chance to call a close call resolved by luck: ask it a higher
``--confidence`` than the study's own 87.5%. ``--rejudge`` measures the studies already
in ``--out`` again, in a new head-to-head folder, without running them anew. It prints:

- per study: its recommendation, claimed speedup, kept knobs (each contribution's
  decision), the noise floor, and the knobs it left unresolved;
- per distinct recommendation: its median ratio to the baseline in the head-to-head
  rounds and its *regret*, ``1 - its median / the best one's``, with the sign test's
  interval (:mod:`autotune.decisions`) on the regret of its paired per-round ratios to
  the best one; then the median and the max regret over the studies (a study's regret
  is its recommendation's). The goal is *met* when every recommendation's interval lies
  at or below it, *not met* when one lies wholly above it, else *unresolved* (the rounds
  cannot rank the recommendations that finely);
- per knob worth 10% or more (a contribution's median >= 1.10 in some study): in how many
  studies the recommendation keeps it;
- knobs the recommendation keeps (off the baseline's value, whatever their own decision
  said: several unresolved knobs proven worth more together stay together) whose final
  interval (the sign test's, :mod:`autotune.decisions`) reaches down to 1.0 or below, and
  whether the study called each unresolved: none should be, unless it did (a knob kept
  only together with others, :attr:`autotune.results.TuneResult.kept_together`, is
  called so: its own effect unresolved).

The issue's goals: max regret <= 3%; every knob worth >= 10% kept in every study; no
kept knob's interval across 1.0. Run it on an otherwise idle machine: nothing else heavy.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from autotune import Config, load_space
from autotune.decisions import CONFIDENCE, interval
from autotune.knobs import KNOBS
from autotune.results import TuneResult
from autotune.study.runner import run_interleaved, run_trial
from autotune.study.scoring import objective
from autotune.study.screening import ROWS
from autotune.study.storage import load_result
from autotune.study.trials import memory_together

GOAL_REGRET = 0.03
WORTH = 1.10


def run_study(space_path: Path, folder: Path, n_trials: int | None) -> TuneResult:
    """One fresh study in its own process, as a user runs it; its stored result."""
    storage = f"sqlite:///{folder / 'study.db'}"
    command = [sys.executable, "-m", "autotune", "run", str(space_path), "--storage", storage]
    command += ["--out", str(folder / "runs")]
    if n_trials is not None:
        command += ["--n-trials", str(n_trials)]
    log = folder / "run.log"
    with log.open("w") as out:
        code = subprocess.call(command, stdout=out, stderr=subprocess.STDOUT)
    if code != 0:
        raise SystemExit(f"study in {folder} failed (exit {code}); see {log}")
    _, result = load_result(load_space(space_path), storage)
    return result


def moved(config: Config, baseline: Config) -> dict[str, object]:
    """The knobs ``config`` sets off the baseline's values."""
    return {k: getattr(config, k) for k in KNOBS if getattr(config, k) != getattr(baseline, k)}


def study_lines(i: int, result: TuneResult, baseline: Config) -> list[str]:
    best = result.best
    assert best is not None
    kept = []
    for c in result.contributions:
        d = c.decision
        bounds = f"{d.interval[0]:.2f}-{d.interval[1]:.2f}" if d.interval else "-"
        state = "needed" if c.failed else d.state
        kept.append(f"{c.knob} {c.median or 0:.2f}x [{bounds}] {state}, {d.rounds} rounds")
    floor = "-" if result.noise_floor is None else f"{result.noise_floor:.1%}"
    if result.noise_rounds:  # paired: the baseline's twin in the rounds
        floor += f" paired over {result.noise_rounds} rounds"
        if result.search_floor is not None:
            floor += f" ({result.search_floor:.1%} back to back)"
    speed = f"{result.speedup:.2f}x" if result.speedup else "-"
    lines = [
        f"study {i}: {best.config.short()} at {speed} claimed; moved "
        f"{moved(best.config, baseline) or 'nothing'}; noise floor {floor}, "
        f"margin {result.margin:.1%}"
    ]
    lines += [f"  {k}" for k in kept]
    return lines


def straddling(rows: list[tuple[int, str, tuple[float, float] | None, bool]]) -> list[str]:
    """Of the knobs a recommendation keeps, ``(study, knob, interval, unresolved)``, those
    whose interval reaches 1.0, each with whether its study called it unresolved."""
    return [
        f"study {i}: {knob} ({'called unresolved' if unresolved else 'NOT called unresolved'})"
        for i, knob, bounds, unresolved in rows
        if bounds is not None and bounds[0] <= 1.0
    ]


def kept_rows(results: list[TuneResult], baseline: Config):
    """Per study (from 1), the contributions of the knobs its recommendation keeps."""
    return [
        (i, c.knob, c.decision.interval, c.unresolved or c.knob in r.kept_together)
        for i, r in enumerate(results, 1)
        for c in r.contributions
        if not c.failed and getattr(r.best.config, c.knob) != getattr(baseline, c.knob)
    ]


def rows_kept(results: list[TuneResult], baseline: Config) -> int:
    """In how many studies the recommendation keeps one of the rows layouts
    (:data:`autotune.study.screening.ROWS`): alternatives, each removes the padding of
    variable-length rows, so a study that keeps either keeps the lever. The goal still
    counts each knob on its own."""
    return sum(
        any(getattr(r.best.config, k) != getattr(baseline, k) for k in ROWS) for r in results
    )


def head_to_head(
    measure: Callable[[list[Config], int], list[float]],
    configs: list[Config],
    rounds: int,
    max_rounds: int,
    settled: Callable[[dict[str, list[float]]], bool],
) -> dict[str, list[float]]:
    """Each config once per round, in an order rotated every round: ``measure(order,
    round)`` their rates, in that order (0: the run failed); per config its per-round
    ratios to the baseline (``configs[0]``). At least ``rounds`` rounds, then on until
    ``settled(ratios)`` or ``max_rounds``."""
    ratios: dict[str, list[float]] = {c.key(): [] for c in configs}
    for r in range(max(rounds, max_rounds)):
        if r >= rounds and settled(ratios):
            break
        k = r % len(configs)
        order = configs[k:] + configs[:k]
        values = dict(zip([c.key() for c in order], measure(order, r), strict=True))
        base = values[configs[0].key()]
        for c in configs:
            if base:
                ratios[c.key()].append(values[c.key()] / base)
        print(
            f"round {r + 1}: "
            + ", ".join(f"{values[c.key()] / base:.3f}" if base else "-" for c in configs),
            flush=True,
        )
    return ratios


def printed_rounds(
    text: str, configs: list[Config], names: dict[str, str]
) -> dict[str, list[float]]:
    """The per-round ratios to the baseline an earlier run printed (its ``[i] name`` and
    ``round N: ...`` lines), per config key; ``ValueError`` when its configs are not
    ``configs`` in the same order (other studies) or a round is not a row of numbers."""
    lines = text.splitlines()
    listed = [line.split("] ", 1)[1] for line in lines if line.startswith("  [")]
    if listed != [names[c.key()] for c in configs]:
        raise ValueError(f"its configs {listed} are not these studies' ones")
    ratios: dict[str, list[float]] = {c.key(): [] for c in configs}
    for line in lines:
        if line.startswith("round "):
            values = line.split(": ", 1)[1].split(", ")
            if "-" in values:  # the baseline's run failed: no ratios that round
                continue
            if len(values) != len(configs):
                raise ValueError(f"{line!r} has {len(values)} values, not {len(configs)}")
            for c, v in zip(configs, values, strict=True):
                ratios[c.key()].append(float(v))
    return ratios


def round_measure(
    space_path: Path, folder: Path, together: bool
) -> Callable[[list[Config], int], list[float]]:
    """A round of fresh trial processes in ``folder``, one per config: their objectives,
    0 for a run that failed. Side by side, taking turns on the machine
    (:func:`autotune.study.runner.run_interleaved`), when ``together``; else one after
    the other (:func:`autotune.study.runner.run_trial`)."""
    space = load_space(space_path)

    def measure(configs: list[Config], r: int) -> list[float]:
        folders = [folder / f"r{r}-{run_name(c)}" for c in configs]
        if together:
            runs = run_interleaved(space, configs, folders)
        else:
            runs = [run_trial(space, c, f) for c, f in zip(configs, folders, strict=True)]
        return [objective(m, space.trial) if m.ok else 0.0 for m in runs]

    return measure


def run_name(config: Config) -> str:
    """A config's folder name in a round: a digest of its key. The key's first characters
    (the judges before 2026-12-07 used 12) are alike for many configs ("batch_size=6"):
    one after the other, a run then took over another's folder; side by side, two runs
    cannot share one."""
    return hashlib.sha256(config.key().encode()).hexdigest()[:12]


def fits_together(results: list[TuneResult], configs: list[Config]) -> str:
    """Why a round of ``configs`` cannot run side by side, "" when it can: their memory
    peaks in the studies (each config's largest; one never measured counts as the
    largest of the others) must add up within the studies' memory limit."""
    need = memory_together((t for result in results for t in result.trials), configs)
    budget = results[0].memory_budget_bytes
    if budget is not None and need > budget:
        return f"their peaks add up to {need / 2**30:.1f} GiB, over {budget / 2**30:.1f} GiB"
    return ""


def regret_interval(
    best: list[float], ours: list[float], confidence: float = CONFIDENCE
) -> tuple[float, float] | None:
    """The sign test's interval on a config's regret against ``best``, from their ratios
    to the baseline in the same rounds: ``1 - 1/x`` of the interval on the median of
    best/ours per round, each bound at one-sided ``confidence``; ``None`` with too few
    rounds (or a failed run)."""
    paired = [b / o for b, o in zip(best, ours, strict=True) if o > 0]
    bounds = interval(paired, confidence) if len(paired) == len(best) else None
    if bounds is None:
        return None
    return 1 - 1 / bounds[0], 1 - 1 / bounds[1]


def paired_regret(best: list[float], ours: list[float]) -> float:
    """A config's regret against ``best`` as its interval reads it (:func:`regret_interval`):
    ``1 - 1/m``, ``m`` the median of best/ours over the rounds both ran in (0 when there
    are none). Not the ratio of the two medians, which can lie outside it."""
    return 1 - 1 / paired_median(best, ours)


def best_paired(ratios: dict[str, list[float]]) -> str:
    """The config that loses least to any other, paired: the highest of each config's
    least median of ours/theirs per round over the others (one that beats every other
    in their rounds is it). Not the top median ratio to the baseline: on cpu.yaml
    (2026-12-07, 40 rounds) that config was 6-8% behind two others in their own rounds,
    and its regrets against it read below zero."""

    def least(k: str) -> float:
        rest = [paired_median(ratios[k], ratios[o]) for o in ratios if o != k]
        return min(rest, default=1.0)

    return max(ratios, key=least)


def paired_median(ours: list[float], theirs: list[float]) -> float:
    """The median of ours/theirs over the rounds both ran in (1.0 when there are none)."""
    paired = [o / t for o, t in zip(ours, theirs, strict=True) if o > 0 and t > 0]
    return statistics.median(paired) if paired else 1.0


def regrets(ratios: dict[str, list[float]], confidence: float = CONFIDENCE):
    """From the head-to-head's ratios: the best config's key (:func:`best_paired`), each
    config's median ratio to the baseline, and each one's regret interval against the best."""
    medians = {k: statistics.median(v) for k, v in ratios.items() if v}
    best = best_paired({k: ratios[k] for k in medians})
    bounds = {k: regret_interval(ratios[best], ratios[k], confidence) for k in medians}
    return best, medians, bounds


def resolved(bounds: tuple[float, float] | None) -> bool:
    """Whether a regret interval lies on one side of the goal: at or below it, or above."""
    return bounds is not None and (bounds[1] <= GOAL_REGRET or bounds[0] > GOAL_REGRET)


def settled_for(
    recommended: list[str], confidence: float = CONFIDENCE
) -> Callable[[dict[str, list[float]]], bool]:
    """The head-to-head's stopping rule: every recommendation's regret interval is
    :func:`resolved` (a failed run leaves its interval ``None``: never settled)."""

    def settled(ratios: dict[str, list[float]]) -> bool:
        if not all(ratios.values()):
            return False
        _, _, bounds = regrets(ratios, confidence)
        return all(resolved(bounds.get(k)) for k in recommended)

    return settled


def verdict(bounds: list[tuple[float, float] | None]) -> str:
    """``met`` when every regret interval lies at or below the goal, ``NOT met`` when one
    lies wholly above it, else ``unresolved``: a median regret at the edge, or rounds too
    wide to rank the recommendations, decides nothing."""
    if any(b is not None and b[0] > GOAL_REGRET for b in bounds):
        return "NOT met"
    if all(b is not None and b[1] <= GOAL_REGRET for b in bounds):
        return "met"
    return "unresolved"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("space", type=Path)
    parser.add_argument("--studies", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=8, help="head-to-head rounds, at least")
    parser.add_argument(
        "--max-rounds",
        type=int,
        default=None,
        help="rounds at most: past --rounds, on until every regret interval lies on one side "
        "of the goal (default: --rounds, a fixed batch)",
    )
    parser.add_argument(
        "--confidence",
        type=float,
        default=CONFIDENCE,
        help="one-sided confidence of each bound of a regret interval (default: the "
        "study's own, %(default)s); a sequential judge looks after every round, so ask more",
    )
    parser.add_argument(
        "--rounds-from",
        type=Path,
        default=None,
        help="with --rejudge: read the rounds from an earlier run's output instead of "
        "measuring them (a judge's figures computed again by this code)",
    )
    parser.add_argument(
        "--rejudge",
        action="store_true",
        help="judge the studies already in --out again (a new head-to-head), running none",
    )
    parser.add_argument(
        "--one-at-a-time",
        action="store_true",
        help="run each round's configs one after the other, not side by side taking turns "
        "(the judges before 2026-12-07)",
    )
    parser.add_argument("--n-trials", type=int, default=None, help="default: the space's")
    parser.add_argument("--out", type=Path, default=None, help="default: a temporary folder")
    parser.add_argument("--doc", type=Path, default=None)
    args = parser.parse_args()
    max_rounds = args.rounds if args.max_rounds is None else args.max_rounds
    if args.studies < 2 or args.rounds < 1 or max_rounds < args.rounds:
        parser.error(
            "--studies must be at least 2, --rounds at least 1, --max-rounds at least --rounds"
        )
    if not 0.5 < args.confidence < 1:
        parser.error("--confidence must lie between 0.5 and 1")
    if args.rounds_from is not None and not args.rejudge:
        parser.error("--rounds-from needs --rejudge: the studies whose rounds they are")
    if args.rejudge and args.out is None:
        parser.error("--rejudge needs --out: the folder of the studies to judge again")
    space = load_space(args.space)
    root = args.out or Path(tempfile.mkdtemp(prefix="reproducibility-"))
    start = time.monotonic()
    results = []
    for i in range(1, args.studies + 1):
        folder = root / f"study{i}"
        t0 = time.monotonic()
        if args.rejudge:
            if not (folder / "study.db").exists():
                parser.error(f"--rejudge: no study in {folder}")
            result = load_result(space, f"sqlite:///{folder / 'study.db'}")[1]
        else:
            folder.mkdir(parents=True, exist_ok=True)
            result = run_study(args.space.resolve(), folder, args.n_trials)
        results.append(result)
        for line in study_lines(i, result, space.baseline):
            print(line, flush=True)
        if not args.rejudge:
            print(f"  ({time.monotonic() - t0:.0f} s)", flush=True)
    baseline = results[0].baseline.config
    distinct: dict[str, Config] = {baseline.key(): baseline}
    for r in results:
        distinct.setdefault(r.best.config.key(), r.best.config)
    configs = list(distinct.values())
    names = {c.key(): ("baseline" if c == baseline else c.short()) for c in configs}
    rounds = f"{args.rounds}" if max_rounds == args.rounds else f"{args.rounds}-{max_rounds}"
    apart = "--one-at-a-time" if args.one_at_a_time else fits_together(results, configs)
    how = f"one after the other ({apart})" if apart else "side by side, taking turns"
    if args.rounds_from is not None:  # measured by an earlier run, whichever way it ran
        how = f"as {args.rounds_from} printed them"
    print(
        f"head to head: {len(configs)} configs x {rounds} rounds (ratios to the baseline; "
        f"each round's runs {how})"
    )
    for n, c in enumerate(configs):
        print(f"  [{n}] {names[c.key()]}")
    recommended = [r.best.config.key() for r in results]
    settled = settled_for(recommended, args.confidence)
    if args.rounds_from is not None:  # the rounds an earlier run printed, read again
        try:
            ratios = printed_rounds(args.rounds_from.read_text(), configs, names)
        except (OSError, ValueError) as e:
            parser.error(f"--rounds-from {args.rounds_from}: {e}")
    else:
        folder = root / "head_to_head"
        for n in range(2, 100):
            if not folder.exists():
                break
            folder = root / f"head_to_head_{n}"  # --rejudge: the earlier ones stay as they were
        measure = round_measure(args.space.resolve(), folder, together=not apart)
        ratios = head_to_head(measure, configs, args.rounds, max_rounds, settled)
    ran = len(ratios[baseline.key()])
    best, medians, bounds = regrets(ratios, args.confidence)
    regret_of = {k: paired_regret(ratios[best], ratios[k]) for k in medians}
    if max_rounds > args.rounds:
        state = "settled" if settled(ratios) else "unresolved, at the cap"
        print(f"after {ran} paired rounds: {state} (each regret interval on one side of the goal?)")
    regret = [regret_of[k] for k in recommended]
    for c in configs:
        k = c.key()
        if k in medians:
            v = ratios[k]
            low, high = bounds[k] or (None, None)
            within = "-" if low is None else f"{low:.1%} to {high:.1%}"
            print(
                f"{names[k]}: {medians[k]:.3f}x (rounds {min(v):.3f}-{max(v):.3f}), "
                f"regret {regret_of[k]:.1%} (interval {within}), recommended by "
                f"{sum(r.best.config.key() == k for r in results)}/{len(results)} studies"
            )
    print(
        f"regret over {len(results)} studies: median {statistics.median(regret):.1%}, "
        f"max {max(regret):.1%} (goal <= {GOAL_REGRET:.0%}: "
        f"{verdict([bounds[k] for k in recommended])}; intervals {args.confidence:.1%} "
        "one-sided per bound)"
    )
    worth: dict[str, list[float]] = {}
    for r in results:
        for c in r.contributions:
            if c.median is not None:
                worth.setdefault(c.knob, []).append(c.median)
    big = sorted(k for k, v in worth.items() if max(v) >= WORTH)
    agree = True
    for knob in big:
        values = {getattr(r.best.config, knob) for r in results}
        kept = sum(getattr(r.best.config, knob) != getattr(baseline, knob) for r in results)
        agree &= kept == len(results) and len(values) == 1
        print(
            f"knob worth >= {WORTH - 1:.0%} ({knob}, contributions "
            f"{min(worth[knob]):.2f}-{max(worth[knob]):.2f}x): kept in {kept}/{len(results)} "
            f"studies, values {sorted(map(str, values))}"
        )
    print(f"knobs worth >= {WORTH - 1:.0%} kept alike in every study: {'yes' if agree else 'NO'}")
    if any(k in big for k in ROWS):
        print(
            f"rows without their padding ({' or '.join(sorted(ROWS))}, alternatives): kept in "
            f"{rows_kept(results, baseline)}/{len(results)} studies"
        )
    straddle = straddling(kept_rows(results, baseline))
    print(f"kept knobs whose interval reaches 1.0: {', '.join(straddle) or 'none'}")
    print(f"wall time: {(time.monotonic() - start) / 60:.1f} min; folders: {root}")


if __name__ == "__main__":
    if "--doc" in sys.argv:
        sys.path.insert(0, str(Path(__file__).parent))
        import docblock  # in this script's folder, first on sys.path

        sys.exit(docblock.run(main, "reproducibility.py"))
    main()
