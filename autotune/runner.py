"""Run one trial (or the probe) in a fresh subprocess and collect its result.

Each run gets a folder holding ``spec.json`` (what to run), ``stdout.log``/``stderr.log``
and ``result.json`` (written by the child). The child runs in its own process group, so a
timeout or Ctrl-C kills it together with its DataLoader workers.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .config import Config
from .errors import WorkloadError
from .measurement import FAILED, TIMEOUT, Measurement
from .space import Space


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"trial process killed by {name}"
    return f"trial process exited with code {returncode} before writing its result"


def _last_line(path: Path) -> str:
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:300] if lines else ""


def run_child(spec: dict[str, Any], folder: Path, timeout_s: float) -> dict[str, Any]:
    """Run ``autotune._child`` on ``spec`` in ``folder``; return its result payload.

    A child that dies or overruns ``timeout_s`` yields a payload with status
    ``failed``/``timeout`` and the reason; this function itself raises only on
    KeyboardInterrupt (after killing the child's whole process group).
    """
    folder.mkdir(parents=True, exist_ok=True)
    spec_path, result_path = folder / "spec.json", folder / "result.json"
    spec_path.write_text(json.dumps(spec, indent=1, default=str))
    result_path.unlink(missing_ok=True)
    env = dict(os.environ)
    # The child must import this very autotune, even when it is not installed.
    package_root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    env.setdefault("PYTHONUNBUFFERED", "1")
    start = time.perf_counter()
    with open(folder / "stdout.log", "wb") as out, open(folder / "stderr.log", "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "autotune._child", str(spec_path), str(result_path)],
            stdout=out,
            stderr=err,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            return {
                "status": TIMEOUT,
                "reason": f"no result within {timeout_s:g} s; killed",
                "wall_s": time.perf_counter() - start,
            }
        except BaseException:
            _kill_group(proc)
            raise
        # Reap anything the child left behind in its group (e.g. DataLoader workers).
        _kill_group(proc)
    if proc.returncode == 0 and result_path.exists():
        return json.loads(result_path.read_text())
    reason = _describe_exit(proc.returncode)
    tail = _last_line(folder / "stderr.log")
    return {
        "status": FAILED,
        "reason": f"{reason}: {tail}" if tail else reason,
        "wall_s": time.perf_counter() - start,
    }


def _base_spec(space: Space) -> dict[str, Any]:
    return {
        "workload": space.workload,
        "workload_args": space.workload_args,
        "base_dir": str(space.base_dir),
        "device": space.device,
    }


def probe(space: Space, folder: Path) -> dict[str, Any]:
    """Load the workload once in a subprocess: capabilities, environment, dataset size.

    Raises:
        WorkloadError: the workload cannot be loaded or built.
    """
    result = run_child({**_base_spec(space), "mode": "probe"}, folder, space.trial.timeout_s)
    if result.get("status") != "ok":
        raise WorkloadError(f"{result.get('reason', 'probe failed')} (log: {folder})")
    return result


def run_trial(space: Space, config: Config, folder: Path) -> Measurement:
    """Measure ``config`` in a fresh subprocess. Never raises for a failing trial."""
    spec = {
        **_base_spec(space),
        "mode": "trial",
        "config": config.to_dict(),
        "trial": asdict(space.trial),
    }
    result = run_child(spec, folder, space.trial.timeout_s)
    return Measurement.from_dict(result)


def profile_trial(space: Space, config: Config, folder: Path, steps: int) -> dict[str, Any]:
    """Profile ``steps`` steps of ``config`` in a fresh subprocess (see :mod:`autotune._profile`).

    The child builds the trial as :func:`run_trial` does, writes its summary to
    ``folder/result.json`` and a Chrome trace to ``folder/trace.json``. Never raises for a
    failing profile: the payload then has ``status`` and ``reason``.
    """
    spec = {
        **_base_spec(space),
        "mode": "profile",
        "config": config.to_dict(),
        "trial": asdict(space.trial),
        "profile_steps": steps,
        "trace_path": str((folder / "trace.json").resolve()),
    }
    return run_child(spec, folder, space.trial.timeout_s)
