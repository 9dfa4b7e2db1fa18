"""Kill soak: one study whose driver is SIGKILLed at seeded random moments and restarted,
then checked: the budget is exact, no completed trial was lost or measured twice, every
RUNNING trial was resolved, no process of the study is left, and ``autotune show``
agrees with Optuna's own view of the study. Also once with 2 workers, one killed.

    python benchmarks/kill_soak.py                      # 24 kills, seed 0: ~6 min on 2 cores
    python benchmarks/kill_soak.py --cycles 30 --seed 3 --out /tmp/soak

Nothing else heavy may run meanwhile (the kill moments are timed). The kill moments, by
kind: ``start`` (the driver is starting: imports, storage, probe), ``trial`` (a trial is
running: after its spec file appears), ``write`` (a trial's result file has just
appeared: the driver reads it and writes the trial to the storage) and ``confirm``
(during the paired confirmation rounds). ``tests/e2e/test_kill_soak.py`` runs a short
soak of each kind in CI. Figures: docs/faults.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import optuna

from autotune.study.procs import process_table

ROOT = Path(__file__).resolve().parents[1]
SPACE = """\
workload: {root}/tests/workloads.py:tiny
knobs:
  batch_size: [4, 8, 16, 32]
  num_workers: [0, 1]
  zero_grad_set_to_none: [false, true]
baseline: {{batch_size: 8}}
global_batch: 32
trial: {{warmup_steps: 1, measured_steps: 1000}}
search: {{confirm_top: {confirm_top}, confirm_rounds: {rounds}, seed: 0, prune: false}}
study: {{heartbeat_s: 1}}
budget: {{n_trials: {n_trials}}}
"""
KINDS = ("start", "trial", "write", "confirm")
MEASURED_ROLES = ("baseline", "search")  # what spends the budget


@dataclass
class Soak:
    """One soak's settings and what it saw."""

    folder: Path
    seed: int = 0
    n_trials: int = 8
    confirm_top: int = 2
    rounds: int = 2
    kills: Counter = field(default_factory=Counter)  # by kind
    mid_trial: int = 0  # kills that left a RUNNING trial behind
    seen: dict[int, float] = field(default_factory=dict)  # completed trial -> value
    left: list[str] = field(default_factory=list)  # processes that outlived a kill
    runs: int = 0  # drivers started

    @property
    def space(self) -> Path:
        path = self.folder / "space.yaml"
        if not path.exists():
            path.write_text(
                SPACE.format(
                    root=ROOT,
                    n_trials=self.n_trials,
                    confirm_top=self.confirm_top,
                    rounds=self.rounds,
                )
            )
        return path

    @property
    def storage(self) -> str:
        return f"sqlite:///{self.folder / 'autotune.db'}"

    def launch(self, log: Path, *args: str) -> subprocess.Popen:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
        self.runs += 1
        with open(log, "w") as out:
            return subprocess.Popen(
                [sys.executable, "-m", "autotune", "run", str(self.space), *args],
                cwd=self.folder,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )


# ---------------------------------------------------------------- processes


def descendants(pid: int) -> dict[int, int]:
    """The processes below ``pid`` (children, their workers...): pid -> process group."""
    table = process_table()
    found: dict[int, int] = {}
    frontier = [pid]
    while frontier:
        parent = frontier.pop()
        for child, (ppid, pgid, _) in table.items():
            if ppid == parent and child not in found:
                found[child] = pgid
                frontier.append(child)
    return found


def survivors(before: dict[int, int], marker: str | None) -> list[str]:
    """Live processes (not zombies) among ``before``, in their process groups, or whose
    command line names ``marker`` (the soak's folder; None while another driver of the
    study still runs)."""
    table = process_table()
    ours, pid = set(), os.getpid()  # this process and its parents name the folder too
    while pid in table and pid not in ours:
        ours.add(pid)
        pid = table[pid][0]
    groups = set(before.values()) - {os.getpgid(0)}
    out = []
    for pid, (_, pgid, state) in table.items():
        if state == "Z" or pid in ours:
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if pid in before or pgid in groups or (marker is not None and marker in cmdline):
            out.append(f"{pid} (group {pgid}): {cmdline[:120]}")
    return out


# ---------------------------------------------------------------- kill moments


def _files(folder: Path, name: str) -> set[tuple[str, int]]:
    out = set()
    for path in folder.glob(f"autotune-runs/*/trial-*/{name}"):
        try:
            out.add((str(path), path.stat().st_mtime_ns))
        except OSError:
            pass
    return out


def wait_for_moment(
    soak: Soak, kind: str, proc: subprocess.Popen, log: Path, rng: random.Random
) -> bool:
    """Wait for the moment of a ``kind`` kill; False when the driver ended first."""
    deadline = time.monotonic() + 300
    if kind == "start":
        until = time.monotonic() + rng.uniform(0.2, 4.0)
        while time.monotonic() < until:
            if proc.poll() is not None:
                return False
            time.sleep(0.01)
        return True
    name = {"trial": "spec.json", "write": "result.json"}.get(kind)
    before = _files(soak.folder, name) if name else set()
    nth = rng.randint(1, 3)  # the first, second or third trial of this run: progress
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        if name and len(_files(soak.folder, name) - before) >= nth:
            break
        if kind == "confirm" and "confirm round" in log.read_text(errors="replace"):
            break
        time.sleep(0.005 if kind == "write" else 0.05)
    else:
        raise RuntimeError(f"no {kind} moment within 300 s (log: {log})")
    # A forked run of the soak's workload (1000 measured steps) lasts ~0.5-6 s: a pause
    # of up to 1 s lands in that run or the next, and in the confirmation before it ends.
    pause = {"trial": (0.0, 1.0), "write": (0.0, 0.05), "confirm": (0.0, 1.0)}[kind]
    time.sleep(rng.uniform(*pause))
    return proc.poll() is None


def _study(storage: str, name: str = "space") -> optuna.Study:
    from autotune.study.storage import open_storage

    return optuna.load_study(study_name=name, storage=open_storage(storage))


def kill(
    soak: Soak, proc: subprocess.Popen, kind: str, storage: str | None = None, name: str = "space"
) -> None:
    """SIGKILL the driver; note what was running and any process that outlives it."""
    below = descendants(proc.pid)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    soak.kills[kind] += 1
    deadline = time.monotonic() + 15
    marker = str(soak.folder) if storage is None else None  # no other driver runs
    while (left := survivors(below, marker)) and time.monotonic() < deadline:
        time.sleep(0.1)
    soak.left += left
    try:
        study = _study(storage or soak.storage, name)
    except (KeyError, ValueError):  # killed before the study was created
        return
    running = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
    soak.mid_trial += any(t.user_attrs.get("heartbeat", {}).get("pid") == proc.pid for t in running)
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        soak.seen.setdefault(t.number, t.value)


def run_soak(soak: Soak, cycles: int, kinds: list[str] | None = None) -> dict:
    """``cycles`` driver runs killed at a moment of a (seeded) random kind, or of
    ``kinds`` in order; then one run to the end. Returns the figures (see :func:`check`)."""
    rng = random.Random(soak.seed)
    confirming = False
    for i in range(cycles):
        if kinds is not None:
            kind = kinds[i % len(kinds)]
        else:  # the confirmation is a kind of its own once it has begun
            kind = rng.choice(KINDS if confirming else KINDS[:3])
        log = soak.folder / f"driver-{i:02d}.log"
        proc = soak.launch(log)
        if not wait_for_moment(soak, kind, proc, log, rng):
            break  # the study ended before this kill
        kill(soak, proc, kind)
        confirming = confirming or "confirm round" in log.read_text(errors="replace")
    else:
        proc = soak.launch(soak.folder / "driver-last.log")
        proc.wait(timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"the last driver exited {proc.returncode}: see {soak.folder}")
    return check(soak, soak.storage)


# ---------------------------------------------------------------- checks


def check(soak: Soak, storage: str, name: str = "space") -> dict:
    """The study's figures; ``problems`` lists every broken promise (none expected)."""
    from autotune.space_file import load_space
    from autotune.study.storage import load_result

    study = _study(storage, name)
    states = Counter(t.state.name for t in study.trials)
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    problems = []
    unresolved = states["RUNNING"] + states["WAITING"]
    if unresolved:
        problems.append(f"{unresolved} trial(s) left RUNNING or WAITING")
    measured = [
        t.user_attrs["config_key"] for t in complete if t.user_attrs.get("role") in MEASURED_ROLES
    ]
    twice = len(measured) - len(set(measured))
    if len(set(measured)) != soak.n_trials:
        problems.append(f"budget: {len(set(measured))} configs measured, not {soak.n_trials}")
    rounds = [  # a round runs each config once, and the baseline's twin once
        (t.user_attrs["round"], t.user_attrs["config_key"], t.user_attrs.get("twin", False))
        for t in complete
        if t.user_attrs.get("round") is not None
    ]
    twice += len(rounds) - len(set(rounds))
    if twice:
        problems.append(f"{twice} measurement(s) made twice")
    by_number = {t.number: t.value for t in complete}
    lost = [n for n, v in soak.seen.items() if by_number.get(n) != v]
    if lost:
        problems.append(f"completed trials lost or changed: {lost}")
    if soak.left:
        problems.append(f"processes outlived a kill: {soak.left}")
    space = load_space(soak.space)
    _, result = load_result(space, storage, name)
    short = [c.knob for c in result.contributions if len(c.ratios) < soak.rounds]
    if short:
        problems.append(f"contributions with fewer than {soak.rounds} paired rounds: {short}")
    problems += _show_agrees(soak, storage, name, complete)
    return {
        "kills": sum(soak.kills.values()),
        "by_kind": dict(soak.kills),
        "kills_mid_trial": soak.mid_trial,
        "drivers": soak.runs,
        "trials": len(study.trials),
        "states": dict(states),
        "configs_measured": len(set(measured)),
        "confirmation_runs": len(rounds),
        "retried": sum("retry_of" in t.user_attrs for t in complete),
        "lost": len(lost),
        "measured_twice": twice,
        "processes_left": len(soak.left),
        "problems": problems,
    }


def _show_agrees(soak: Soak, storage: str, name: str, complete: list) -> list[str]:
    """``autotune show`` against Optuna's trials: the configs, and the ok ones (a config
    is ok when every run of it is)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    shown = subprocess.run(
        [sys.executable, "-m", "autotune", "show", str(soak.space), "--storage", storage]
        + ["--study-name", name],
        cwd=soak.folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if shown.returncode != 0:
        return [f"autotune show exited {shown.returncode}: {shown.stderr.strip()}"]
    runs: dict[str, list[str]] = {}
    for t in complete:
        if "config" in t.user_attrs and t.user_attrs.get("role") != "duplicate":
            runs.setdefault(t.user_attrs["config_key"], []).append(t.user_attrs.get("status"))
    ok = sum(all(s == "ok" for s in statuses) for statuses in runs.values())
    configs = re.search(r"study \S+: (\d+) configs", shown.stdout)
    oks = re.search(r"configs by status: .*?(\d+) ok", shown.stdout)
    problems = []
    if not configs or int(configs[1]) != len(runs):
        problems.append(f"show lists {configs and configs[1]} configs, Optuna {len(runs)}")
    if not oks or int(oks[1]) != ok:
        problems.append(f"show counts {oks and oks[1]} ok configs, Optuna {ok}")
    return problems


# ---------------------------------------------------------------- 2 workers


def run_workers_soak(soak: Soak) -> dict:
    """Two workers share a study (journal storage); worker 1 is SIGKILLed during a
    trial at a seeded moment; worker 0 finishes the study."""
    rng = random.Random(soak.seed)
    storage = f"journal://{soak.folder / 'workers.log'}"
    logs = [soak.folder / f"worker-{i}.log" for i in range(2)]
    args = ["--storage", storage, "--study-name", "workers", "--no-summary"]
    procs = [soak.launch(log, *args, "--worker-index", str(i)) for i, log in enumerate(logs)]
    deadline = time.monotonic() + 300
    while "trial " not in logs[1].read_text(errors="replace"):  # its first trial is done
        if procs[1].poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"worker 1 ended or ran no trial: {logs[1]}")
        time.sleep(0.05)
    time.sleep(rng.uniform(0.5, 2.0))  # into its next trial
    if procs[1].poll() is not None:
        raise RuntimeError("worker 1 ended before its kill")
    kill(soak, procs[1], "worker", storage, "workers")
    procs[0].wait(timeout=1800)
    soak.left += survivors({}, str(soak.folder))  # nothing of either worker is left
    if procs[0].returncode != 0:
        raise RuntimeError(f"worker 0 exited {procs[0].returncode}: {logs[0]}")
    return check(soak, storage, "workers")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cycles", type=int, default=24, help="driver runs killed (default 24)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="folder of the study (default: a new one under /tmp)")
    args = p.parse_args()
    folder = Path(args.out or f"/tmp/kill-soak-{args.seed}-{int(time.time())}")
    folder.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    figures = run_soak(Soak(folder, seed=args.seed, n_trials=12, rounds=3), args.cycles)
    figures["seconds"] = round(time.monotonic() - start)
    print(json.dumps({"driver_kills": figures}, indent=1))
    start = time.monotonic()
    (folder / "workers").mkdir(exist_ok=True)
    workers = run_workers_soak(Soak(folder / "workers", seed=args.seed, n_trials=8, rounds=2))
    workers["seconds"] = round(time.monotonic() - start)
    print(json.dumps({"two_workers": workers}, indent=1))
    return 1 if figures["problems"] or workers["problems"] else 0


if __name__ == "__main__":
    import docblock  # in this script's folder, first on sys.path

    sys.exit(docblock.run(main, "kill_soak.py"))
