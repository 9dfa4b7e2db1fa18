"""Process-group bookkeeping for trial subprocesses (Linux /proc; no-ops elsewhere)."""

from __future__ import annotations

import os
from pathlib import Path

_PROC = Path("/proc")


def process_table() -> dict[int, tuple[int, int, str]]:
    """Every process this machine shows: pid -> (parent pid, process group, state)."""
    out = {}
    try:
        entries = list(_PROC.iterdir())
    except OSError:
        return {}
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # Fields after the command name (which may hold spaces): state, ppid, pgrp, ...
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 2:
            out[int(entry.name)] = (int(fields[1]), int(fields[2]), fields[0])
    return out


def group_members(pgid: int) -> list[int]:
    """PIDs whose process group is ``pgid`` (the trial and its DataLoader workers)."""
    return [pid for pid, (_, group, _) in process_table().items() if group == pgid]


def _pss_bytes(pid: int) -> int:
    """Proportional set size: shared pages (forked workers) are split, not double counted."""
    try:
        for line in (_PROC / str(pid) / "smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def group_memory_bytes(pgid: int) -> int:
    """Memory held by a whole process group (sum of PSS)."""
    return sum(_pss_bytes(pid) for pid in group_members(pgid))


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
