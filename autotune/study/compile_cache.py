"""torch.compile's caches in a study: one inductor cache per config, seeded with the
machine's vector-ISA probe.

Each ``torch.compile`` config compiles in its own cache folder in the study's run folder
(``compile-cache/<config digest>/``), so a config's first compile is *cold* whatever
compiled before it (its compile time does not depend on the order of the trials), and
its repeats reuse its compiled graphs (*warm*).

Before inductor compiles its first CPU kernel in a process, it finds the machine's
vector instruction set by building and loading a test library for each ISA it knows (10
on x86; ~8.5 s on the 2-core development machine). It keeps those libraries in its cache
folder, so on a user's machine that cost is paid once per machine (inductor's default
cache lives in the temporary folder), not once per config; what every process still pays
is loading them (~1.3 s). The study pays it once too: the probe run builds them in
``compile-cache/machine/`` and each config's cache starts as a copy of that folder (the
copied files do not make it warm). A cold compile is then the config's own graphs and
kernels, compiled from nothing, as a user's first run of that config compiles them.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from ..config import Config
from ..space import Space

CACHES = "compile-cache"
MACHINE = "machine"
# In each config's cache: the files copied from the machine's probe (they do not make a
# cache warm).
SEEDED = "autotune-seeded.json"


def _files(folder: Path) -> set[str]:
    """The files under ``folder`` (relative paths), leaving out inductor's lock files."""
    found = set()
    for path in folder.rglob("*"):
        rel = path.relative_to(folder)
        if rel.parts[0] != "locks" and path.is_file():
            found.add(rel.as_posix())
    return found


def compiled(cache: Path) -> bool:
    """Whether ``cache`` holds anything a compile of its config wrote (a repeat is warm)."""
    if not cache.is_dir():
        return False
    marker = cache / SEEDED
    seeded = set(json.loads(marker.read_text())) if marker.is_file() else set()
    return bool(_files(cache) - seeded - {SEEDED})


def _fresh_tmp(target: Path) -> Path:
    """A temporary folder beside ``target`` for this process to fill (emptied if a
    killed driver of the same pid left one)."""
    tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    return tmp


def _publish(tmp: Path, target: Path) -> None:
    """Make ``tmp`` ``target`` in one rename, or drop it when another driver of the
    study made ``target`` first: a process killed half-way never leaves a half-made one."""
    try:
        os.rename(tmp, target)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)


def _seed(cache: Path, machine: Path) -> None:
    """Make ``cache`` a copy of the machine's probe (``machine``), atomically."""
    if not machine.is_dir():
        return
    tmp = _fresh_tmp(cache)
    shutil.copytree(machine, tmp, ignore=shutil.ignore_patterns("locks"))
    (tmp / SEEDED).write_text(json.dumps(sorted(_files(tmp))))
    _publish(tmp, cache)


def compile_cache(config: Config, folder: Path) -> tuple[dict[str, str], str | None]:
    """The environment giving a torch.compile run of ``config`` its own inductor cache in
    the study's run folder (``folder`` is the run's folder in it), and whether that cache
    is ``cold`` (the config's first compile) or ``warm``. Eager configs: nothing."""
    if config.compile_mode == "off":
        return {}, None
    root = (folder.parent / CACHES).resolve()
    cache = root / hashlib.sha256(config.key().encode()).hexdigest()[:16]
    if not cache.is_dir():
        _seed(cache, root / MACHINE)
    state = "warm" if compiled(cache) else "cold"
    cache.mkdir(parents=True, exist_ok=True)
    env = {"TORCHINDUCTOR_CACHE_DIR": str(cache), "TRITON_CACHE_DIR": str(cache / "triton")}
    return env, state


def may_compile(space: Space) -> bool:
    """Whether a config of ``space`` can use torch.compile."""
    modes = {*space.knobs.get("compile_mode", ()), space.baseline.compile_mode}
    return modes != {"off"}


def machine_probe(space: Space, folder: Path) -> Path | None:
    """The folder in which the probe run (``folder`` is its run folder) finds the
    machine's vector ISA for inductor, or None when there is nothing to find: the space
    never compiles, or the study found it already (a resumed study, another worker).
    The probe writes in a temporary folder, made the machine's by :func:`keep_machine_probe`
    once the probe succeeded."""
    machine = (folder.parent / CACHES / MACHINE).resolve()
    if not may_compile(space) or machine.is_dir():
        return None
    tmp = _fresh_tmp(machine)
    tmp.mkdir(parents=True)
    return tmp


def keep_machine_probe(tmp: Path, ok: bool) -> None:
    """Make the probe's folder ``tmp`` the machine's (``ok``), or drop it."""
    if ok and any(tmp.iterdir()):
        _publish(tmp, tmp.with_name(MACHINE))
    else:
        shutil.rmtree(tmp, ignore_errors=True)
