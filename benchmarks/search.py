"""Search-efficiency benchmark: how close does each sampler get to the true optimum, how fast.

    # 1. measure every config of a moderate space once (real trials; minutes)
    python benchmarks/search.py record benchmarks/spaces/cnn_grid.yaml
    # 1b. measure every config within 15% of its best again: is the optimum repeatable?
    python benchmarks/search.py repeat benchmarks/tables/cnn_grid.json --within 0.15 --repeats 2
    # 2. replay samplers against the recorded tables, many seeds (cheap)
    python benchmarks/search.py replay benchmarks/tables/*.json --seeds 30 --out docs/benchmarks.md

Replay runs the real tuner (sampling, dedupe, constraints) and only looks measurements up,
so a sampler's trajectory is what it would have been live, with the table's noise frozen.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import optuna
from docblock import machine_text, markers, spliced

from autotune import load_space, tune
from autotune.config import Config
from autotune.errors import ArgumentError, AutotuneError
from autotune.measurement import Measurement, fixed_cost
from autotune.space import LAUNCHERS
from autotune.study import screening
from autotune.study.replay import ReplayBackend, record_table
from autotune.study.sampling import encode, make_sampler
from autotune.study.scoring import judge, objective
from autotune.study.storage import open_study

# "tpe" is the sampler alone (as before the screening); "screen+tpe" the default search:
# the screening start (autotune.study.screening), then TPE.
SAMPLERS = ("tpe", "screen+tpe", "gp", "random")
SCREEN = "screen+tpe"
BUDGETS = (5, 8, 10, 20)


def record(space_path: Path, out: Path, launcher: str | None = None) -> None:
    space = load_space(space_path)
    if launcher is not None:  # trial.launcher, to compare fork with spawn
        space = dataclasses.replace(
            space, trial=dataclasses.replace(space.trial, launcher=launcher)
        )
    storage = f"sqlite:///{out.with_suffix('.db')}"
    start = time.monotonic()
    result = tune(space, storage=storage, out_dir=Path(tempfile.mkdtemp()) / "runs")
    study = optuna.load_study(study_name=space.study.name, storage=storage)
    table = record_table(study, out)
    table["space"] = str(space_path)
    table["record_wall_s"] = time.monotonic() - start
    table["recorded"] = {
        "command": f"python benchmarks/search.py record {space_path}",
        "date": _today(),
        "machine": machine_text(),
        "rules_commit": rules_commit(),
    }
    out.write_text(json.dumps(table, indent=1))
    print(
        f"{out}: {len(table['measurements'])} configs in {table['record_wall_s']:.0f} s "
        f"(trial.launcher: {space.trial.launcher}); best {result.best.config.short()} "
        f"{result.speedup:.2f}x over baseline; "
        f"{_fixed_text([Measurement.from_dict(r['measurement']) for r in table['measurements']])}"
    )
    print(
        f"next, the configs within 15% of the top, again: python benchmarks/search.py repeat "
        f"{out} --within 0.15 --repeats 2"
    )


def _measure(space, configs: list[Config]) -> dict[str, dict[str, Any]]:
    """Rows (config and measurement) of ``configs``, each measured once in one fresh study
    on this (idle) machine, in the order given."""
    folder = Path(tempfile.mkdtemp())
    storage = f"sqlite:///{folder / 'remeasure.db'}"
    study = open_study(space, storage, space.study.name, make_sampler(space))
    again: dict[str, Any] = {}
    for _ in range(3):  # a queued config the budget did not reach goes to the next pass
        missing = [c for c in configs if c.key() not in again]
        if not missing:
            break
        for config in missing:
            study.enqueue_trial(encode(space, config))
        roles = ("baseline", "search")
        done = len(
            {t.user_attrs["config_key"] for t in study.trials if t.user_attrs.get("role") in roles}
        )
        tune(space, storage=storage, out_dir=folder / "runs", n_trials=done + len(missing) + 1)
        fresh = record_table(study, folder / "table.json")
        again = {Config.from_dict(r["config"]).key(): r for r in fresh["measurements"]}
    return {c.key(): again[c.key()] for c in configs if c.key() in again}


def _value(measurement: dict[str, Any], space) -> float:
    """A stored run's objective value (0 for a run that was not ok), as a study scores it."""
    m = Measurement.from_dict(measurement)
    return objective(m, space.trial) if m.ok else 0.0


def _today() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")


def remeasure(table_path: Path, keys: list[str], why: str) -> None:
    """Measure the configs ``keys`` of a recorded table again, in one fresh study on this
    (idle) machine, and replace their rows: for runs that something else on the machine
    disturbed while the grid recorded. The table lists what was measured again and why."""
    table = json.loads(table_path.read_text())
    space = load_space(table["space"])
    rows = {Config.from_dict(r["config"]).key(): r for r in table["measurements"]}
    again = _measure(space, [Config.from_dict(rows[k]["config"]) for k in keys])
    keys = [k for k in keys if k in again]
    for key in keys:
        before = Measurement.from_dict(rows[key]["measurement"]).rate
        rows[key] = again[key]
        after = Measurement.from_dict(again[key]["measurement"]).rate
        print(f"{key}: {before or 0:,.0f} -> {after or 0:,.0f}")
    table["measurements"] = list(rows.values())
    table.setdefault("remeasured", []).append(
        {
            "configs": len(keys),
            "why": why,
            "date": _today(),
            "command": f"python benchmarks/search.py remeasure {table_path} KEYS --why ...",
        }
    )
    table_path.write_text(json.dumps(table, indent=1))


def near_the_top(values: dict[str, float], within: float) -> list[str]:
    """The keys whose value is within ``within`` (a share) of the best value, best first.

    Which configs ``repeat`` measures again: every one a single run's noise could have
    put at the top, not a fixed count (a fixed 12 leaves out the 13th when the top is a
    plateau, and measures configs far below a clear winner)."""
    if not 0 <= within < 1:
        raise ArgumentError(f"--within must be a share in [0, 1) but got {within}")
    best = max(values.values(), default=0.0)
    if best <= 0:
        return []
    return sorted(
        (k for k, v in values.items() if v >= (1 - within) * best), key=lambda k: -values[k]
    )


def repeat(table_path: Path, within: float, repeats: int) -> None:
    """Every config of a recorded table within ``within`` of its best run (see
    :func:`near_the_top`), and its baseline, measured ``repeats`` more times each: every
    pass a fresh study over all of them (the baseline first, as in any study; the rest in
    an order rotated per pass). The runs go into each row's ``repeats`` with their pass;
    its ``measurement`` stays the recorded run.

    Why: a grid measured once per config has a noisy top, and the best of 200 single runs
    is the luckiest of them (the winner's curse). The replay answers a repeated config
    with its median run as measured (``ReplayBackend``'s medians), so the optimum a
    search is judged against is a figure that repeats."""
    table = json.loads(table_path.read_text())
    space = load_space(table["space"])
    rows = {Config.from_dict(r["config"]).key(): r for r in table["measurements"]}
    base = space.baseline.key()

    def rate(measurement: dict[str, Any]) -> float:
        return _value(measurement, space)

    # Ranked by what the replay answers (a repeated row's median run), so that a second
    # pass reaches the configs a lucky first run kept out of the first; a config already
    # repeated as often as asked is not measured again (the baseline is, every pass: the
    # pass's pairing).
    standings = {k: standing(r, rate) for k, r in rows.items()}
    chosen = [
        k
        for k in near_the_top(standings, within)
        if len(rows[k].get("repeats", [])) < repeats and k != base
    ]
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in [*chosen, base]}
    first = len(table.get("repeated", []))
    for n in range(repeats):
        turn = n % len(chosen) if chosen else 0
        order = chosen[turn:] + chosen[:turn]  # rotated per pass
        configs = [Config.from_dict(rows[k]["config"]) for k in [base, *order] if k in rows]
        again = _measure(space, list({c.key(): c for c in configs}.values()))
        for key, row in again.items():
            runs[key].append({"pass": f"{_today()}#{first + n}", "measurement": row["measurement"]})
    for key, made in runs.items():
        rows[key] = {**rows[key], "repeats": rows[key].get("repeats", []) + made}
        each = ", ".join(f"{rate(r['measurement']):,.0f}" for r in made)
        print(f"{key or 'baseline'}: recorded {rate(rows[key]['measurement']):,.0f}; again {each}")
    table["measurements"] = list(rows.values())
    table.setdefault("repeated", []).append(
        {
            "top": len(chosen),
            "within": within,
            "repeats": repeats,
            "date": _today(),
            "command": f"python benchmarks/search.py repeat {table_path} --within {within} "
            f"--repeats {repeats}",
        }
    )
    table_path.write_text(json.dumps(table, indent=1))


def standing(row: dict[str, Any], rate) -> float:
    """A table row's figure as the replay answers it: the median of its recorded run and
    its repeats (``rate`` of each measurement), the lower middle of an even count; its
    recorded run alone before any repeat."""
    runs = sorted(rate(r["measurement"]) for r in [row, *row.get("repeats", [])])
    return runs[(len(runs) - 1) // 2]


def _fixed_text(measurements: list[Measurement]) -> str:
    """The fixed-cost figure of a recorded grid (:func:`autotune.measurement.fixed_cost`).
    Tables recorded before the time split count start-up (imports, build) only."""
    overhead = fixed_cost(measurements)
    if overhead is None:
        return "no fixed cost recorded"
    fixed, share = overhead
    what = (
        "process start, imports, device, build, result and exit"
        if any(m.time_split() is not None for m in measurements)
        else "imports and build, recorded before the time split"
    )
    return f"per-trial fixed cost ({what}) median {fixed:.1f} s, {share:.0%} of a trial's wall time"


def _trajectory(space, backend: ReplayBackend, reference) -> tuple[list[float], list[float]]:
    """Objective of the best feasible config after each measured trial, and elapsed wall.
    The accuracy guard's reference runs of a new layout add their wall time to the next
    trial's but are not trials: a study's budget of 10 trials runs 10 and its references."""
    best, values, walls, elapsed = 0.0, [], [], 0.0
    for i, config in enumerate(backend.calls):
        m = backend.measurement(config)
        elapsed += m.wall_s or 0.0
        if i in backend.references:
            continue
        if judge(m, space, reference=reference).feasible:
            best = max(best, objective(m, space.trial))
        values.append(best)
        walls.append(elapsed)
    return values, walls


# The files whose code decides the screening's moves: its rules and the loop that asks
# them. A change to either re-reports every table (docs/benchmarks.md).
RULES = ("autotune/study/screening.py", "autotune/study/search.py")


def rules_commit() -> str:
    """The last commit that changed the screening's rules (:data:`RULES`), short; with
    ``+changes`` when the working tree changes them; ``?`` outside a git checkout."""
    root = Path(__file__).resolve().parent.parent
    git = ["git", "-C", str(root)]
    try:
        commit = subprocess.run(
            [*git, "log", "-1", "--format=%h", "--", *RULES],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run([*git, "diff", "--quiet", "HEAD", "--", *RULES]).returncode
    except (OSError, subprocess.CalledProcessError):
        return "?"
    return f"{commit}+changes" if dirty else (commit or "?")


def screening_trace(space, table, budget: int, name: str = "") -> str:
    """What the screening did on ``table`` (it is deterministic: seed 0 stands for every
    seed): the rules the baseline's profile fired, and the moves its trials made, in order."""
    space = _replay_space(space, SCREEN, 0)
    backend = ReplayBackend(table, space.baseline, name=name)
    with tempfile.TemporaryDirectory() as tmp:
        storage = f"sqlite:///{Path(tmp) / 'trace.db'}"
        tune(space, storage=storage, out_dir=Path(tmp) / "runs", backend=backend, n_trials=budget)
        study = optuna.load_study(study_name=space.study.name, storage=storage)
        schedule = study.user_attrs.get(screening.ATTR) or {}
        moves = [
            str(t.user_attrs[screening.MOVE])
            for t in study.get_trials(deepcopy=False)
            if screening.MOVE in t.user_attrs
        ]
    reasons = "; ".join(schedule.get("reasons", [])) or "no rule fired (the knobs in listed order)"
    made = ", ".join(moves) or "none"
    return (
        f"Screening trace (rules of {rules_commit()}): {reasons}. "
        f"Moves made in {budget} trials: {made}."
    )


def _replay_space(space, sampler: str, seed: int):
    """``space`` as a replay runs it (:data:`SETTINGS`): ``sampler`` (``screen+tpe``: TPE
    after the screening) with ``seed``, no pruning, no confirmation, no noise runs."""
    search = dataclasses.replace(
        space.search,
        sampler="tpe" if sampler == SCREEN else sampler,
        screening=sampler == SCREEN,
        seed=seed,
        confirm_top=0,
        prune=False,
        # The baseline's noise runs would look its one row up twice more: no noise to
        # measure, and _trajectory would count them as trials.
        noise_runs=0,
    )
    return dataclasses.replace(space, search=search)


def _one_run(space, table, sampler: str, seed: int, budget: int, name: str = ""):
    space = _replay_space(space, sampler, seed)
    backend = ReplayBackend(table, space.baseline, name=name)
    with tempfile.TemporaryDirectory() as tmp:
        tune(space, storage="memory", out_dir=tmp, backend=backend, n_trials=budget)
    return _trajectory(space, backend, (table.get("reference") or {}).get("losses"))


def _median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def _median_reached(xs: list[float | None]) -> float | None:
    """The median over every seed, a seed that never got there counting as never
    (``None`` when that is at least half the seeds: the table prints "-")."""
    value = statistics.median([math.inf if x is None else x for x in xs])
    return None if math.isinf(value) else value


def replay(
    tables: list[Path], seeds: int, samplers: list[str], out: Path | None, gp_seeds: int
) -> None:
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    names = ",".join(samplers)
    command = (
        f"python benchmarks/search.py replay {' '.join(map(str, tables))} --seeds {seeds}"
        f"{f' --gp-seeds {gp_seeds}' if gp_seeds != seeds else ''}"
        f"{f' --samplers {names}' if tuple(samplers) != SAMPLERS else ''}"
        f"{f' --out {out}' if out else ''}"
    )
    today = _today()
    lines = [
        BEGIN,
        f"Replayed {today} with `{command}`, the screening rules of commit "
        f"{rules_commit()} ({', '.join(RULES)}) (this block is written by that command; the "
        "tables by `record`, each with its date and machine below). Each strategy runs "
        f"{max(BUDGETS)} trials per seed; trials and wall s to 95% are medians over every "
        'seed, a seed that never got there counting as never ("-": half the seeds or more).',
        "",
        f"Settings: {SETTINGS}",
        "",
    ]
    for path in tables:
        table = json.loads(path.read_text())
        space = load_space(table["space"])
        backend = ReplayBackend(table, space.baseline, name=str(path))
        (opt_config, optimum) = backend.optimum(space)
        n = len(backend.rows)
        base = backend.measurement(space.baseline)
        measured = [m for _, m in backend.rows.values()]
        cvs = [m.step_time_cv for _, m in backend.rows.values() if m.step_time_cv is not None]
        budget = min(max(BUDGETS), n)
        rec = table.get("recorded", {})
        lines += [
            f"## {path.stem}: {n} configs, grid optimum {opt_config.short()} "
            f"= {optimum:,.1f} {base.unit}/s ({optimum / objective(base, space.trial):.2f}x "
            "the baseline)",
            "",
            f"Recorded with `{rec.get('command', '?')}` on {rec.get('date', '?')}, "
            f"{rec.get('machine', '?')}. "
            f"Recording the grid took {table.get('record_wall_s', 0):.0f} s; median step-time "
            f"CV {statistics.median(cvs):.1%}; {_fixed_text(measured)}; the median run "
            f"{statistics.median(m.wall_s for m in measured if m.wall_s):.1f} s, the longest "
            f"{max(m.wall_s for m in measured if m.wall_s):.1f} s."
            f"{_later_text(table, space, opt_config, optimum)}"
            f"{_flat_text(table, space, opt_config, optimum)}"
            f"{_held_out_text(rec)}",
            "",
            screening_trace(space, table, budget, str(path)),
            "",
            "| sampler | best/optimum @5 | @8 | @10 | @20 | seeds >= 95% @10 | trials to 95% "
            "(median) | to 99% | wall s to 95% (median) |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for sampler in samplers:
            # GP's fits cost ~0.3 s per proposal here (TPE ~0.01 s): --gp-seeds can cut them.
            n_seeds = gp_seeds if sampler == "gp" else seeds
            runs = [
                _one_run(space, table, sampler, seed, budget, str(path)) for seed in range(n_seeds)
            ]
            ratio = {
                b: _median([v[min(b, len(v)) - 1] / optimum for v, _ in runs]) for b in BUDGETS
            }
            hit10 = sum(1 for v, _ in runs if v[min(10, len(v)) - 1] >= 0.95 * optimum)
            first = {
                share: [
                    next((i for i, x in enumerate(v) if x >= share * optimum), None)
                    for v, _ in runs
                ]
                for share in (0.95, 0.99)
            }
            trials95 = _median_reached([i + 1 if i is not None else None for i in first[0.95]])
            trials99 = _median_reached([i + 1 if i is not None else None for i in first[0.99]])
            wall95 = _median_reached(
                [
                    w[i] if i is not None else None
                    for (v, w), i in zip(runs, first[0.95], strict=True)
                ]
            )
            cells = [f"{ratio[b]:.3f}" for b in BUDGETS]
            lines.append(
                f"| {sampler} | {' | '.join(cells)} | {hit10}/{n_seeds} | {trials95 or '-'} | "
                f"{trials99 or '-'} | {f'{wall95:.0f}' if wall95 is not None else '-'} |"
            )
            print(lines[-1], flush=True)
        lines.append("")
    lines.append(END)
    text = "\n".join(lines)
    print(text)
    if out:
        out.write_text(_spliced(out.read_text() if out.exists() else "", text))


# What the replay is: printed above its tables (docs/benchmarks.md).
SETTINGS = (
    "every replay runs the tuner with `search.prune: false`, `search.confirm_top: 0` and "
    "`search.noise_runs: 0` (no pruning, no confirmation rounds, no noise runs of the "
    "baseline; `_one_run`), so a wall time here is the sum of "
    "the recorded full runs of the search's trials and of the accuracy guard's reference "
    "runs, not what a live study with its default pruning and confirmation would spend. "
    "Repeated configs answer with their median run as measured (no scaling by a pass's "
    "baseline). The screening is deterministic (it follows the table's values, not the "
    "seed): `screen+tpe`'s seeds share one trajectory until the hand-over to TPE, so its "
    '"N/20" and its medians up to the hand-over are one trajectory per grid, not 20 '
    "samples. A flat grid (its baseline within 5% of its optimum, or the optimum's runs "
    "overlapping the baseline's) cannot judge a search."
)


def _flat_text(table: dict[str, Any], space, opt_config: Config, optimum: float) -> str:
    """Whether a grid can judge a search: not when its baseline is already within 5% of
    the optimum, nor when the optimum's repeated runs overlap the baseline's (its lead is
    within the machine's noise)."""
    base_runs, best_runs = (_runs(table, space, c) for c in (space.baseline, opt_config))
    base = statistics.median(base_runs) if base_runs else 0.0
    if base >= 0.95 * optimum:
        return (
            f" **Flat:** the baseline makes {base / optimum:.0%} of the optimum, so every "
            "strategy is within 5% at trial 1: this grid cannot judge a search."
        )
    if len(base_runs) > 1 and len(best_runs) > 1 and min(best_runs) <= max(base_runs):
        return (
            f" **Flat:** the optimum's runs ({min(best_runs):,.0f}-{max(best_runs):,.0f}) "
            f"overlap the baseline's ({min(base_runs):,.0f}-{max(base_runs):,.0f}): its "
            f"{optimum / base:.2f}x lead is within the noise, and this grid cannot judge a "
            "search."
        )
    return ""


def _held_out_text(recorded: dict[str, Any]) -> str:
    """Whether the table was recorded after the rules it judges were frozen."""
    if recorded.get("held_out"):
        return f" **Held out:** {recorded['held_out']}"
    if recorded.get("rules_commit"):
        return f" Recorded with the screening rules of {recorded['rules_commit']}."
    return ""


def _runs(table: dict[str, Any], space, config: Config) -> list[float]:
    """Every run of ``config`` in ``table`` (recorded and repeated), as values."""
    for row in table["measurements"]:
        if Config.from_dict(row["config"]).key() == config.key():
            runs = [row, *row.get("repeats", [])]
            return [v for r in runs if (v := _value(r["measurement"], space)) > 0]
    return []


def _later_text(table: dict[str, Any], space, opt_config: Config, optimum: float) -> str:
    """What was measured after the recording (``remeasure``, ``repeat``), in words: for
    repeats, each run of the optimum's config over the baseline run of the same pass (the
    pairing that cancels the machine's drift between the recording and the pass)."""
    parts = [
        f" {r['configs']} configs measured again on {r['date']} (`{r['command']}`): {r['why']}."
        for r in table.get("remeasured", [])
    ]
    for r in table.get("repeated", []):
        configs = "config" if r["top"] == 1 else "configs"
        which = (
            f"its {r['top']} {configs} within {r['within']:.0%} of its best (a repeated "
            "config's median run) and not yet repeated"
            if "within" in r
            else f"its best {r['top']} {configs}"
        )
        parts.append(
            f" {which[0].upper()}{which[1:]} and its baseline measured {r['repeats']} more "
            f"times each on {r['date']} (`{r['command']}`): the replay answers each of them "
            "with its median run as measured (ReplayBackend's medians)."
        )
    rows = {Config.from_dict(x["config"]).key(): x for x in table["measurements"]}

    def value(m: dict[str, Any]) -> float:
        return _value(m, space)

    def by_pass(key: str) -> dict[str, float]:
        row = rows.get(key, {})
        runs = {r["pass"]: value(r["measurement"]) for r in row.get("repeats", [])}
        return {"recorded": value(row["measurement"]), **runs} if runs else {}

    best, base = by_pass(opt_config.key()), by_pass(space.baseline.key())
    paired = [best[p] / base[p] for p in best if base.get(p)]
    if paired:
        runs = ", ".join(f"{x:,.0f}" for x in best.values())
        bases = ", ".join(f"{x:,.0f}" for x in base.values())
        each = ", ".join(f"{x:.2f}x" for x in paired)
        parts.append(
            f" The optimum's runs: {runs}; the baseline's: {bases}; each over the baseline "
            f"of its pass: {each}."
        )
    return "".join(parts)


# The generated block of docs/benchmarks.md: replay rewrites what lies between these.
BEGIN, END = markers("search.py replay")


def _spliced(document: str, block: str) -> str:
    """``document`` with its generated block replaced by ``block`` (appended if none)."""
    return spliced(document, "search.py replay", block)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("record")
    r.add_argument("space", type=Path)
    r.add_argument("--out", type=Path)
    r.add_argument("--launcher", choices=LAUNCHERS, help="override trial.launcher")
    rp = sub.add_parser("replay")
    rp.add_argument("tables", type=Path, nargs="+")
    rp.add_argument("--seeds", type=int, default=30)
    rp.add_argument("--gp-seeds", type=int, help="seeds for gp (default: --seeds)")
    rp.add_argument("--samplers", default=",".join(SAMPLERS))
    rp.add_argument("--out", type=Path)
    rm = sub.add_parser("remeasure", help="measure some configs of a table again")
    rm.add_argument("table", type=Path)
    rm.add_argument("keys", type=Path, help="a file of config keys, one per line")
    rm.add_argument("--why", required=True, help="what disturbed their first runs")
    st = sub.add_parser("repeat", help="measure a table's best configs again, kept apart")
    st.add_argument("table", type=Path)
    st.add_argument(
        "--within",
        type=float,
        default=0.15,
        help="every config within this share of the best run (default 0.15: 15%%)",
    )
    st.add_argument("--repeats", type=int, default=2, help="more runs of each")
    args = p.parse_args(argv)
    try:
        _dispatch(args)
    except AutotuneError as e:  # one line, no traceback: a table or space that cannot serve
        print(f"search.py: error: {e}", file=sys.stderr)
        return 1
    return 0


def _dispatch(args: argparse.Namespace) -> None:
    if args.command == "repeat":
        repeat(args.table, args.within, args.repeats)
    elif args.command == "remeasure":
        remeasure(args.table, args.keys.read_text().split(), args.why)
    elif args.command == "record":
        out = args.out or Path("benchmarks/tables") / f"{args.space.stem}.json"
        record(args.space, out, args.launcher)
    else:
        gp_seeds = args.gp_seeds if args.gp_seeds is not None else args.seeds
        replay(args.tables, args.seeds, args.samplers.split(","), args.out, gp_seeds)


if __name__ == "__main__":
    sys.exit(main())
