"""Process-group bookkeeping for trial subprocesses (Linux /proc; no-ops elsewhere)."""

from __future__ import annotations

import os
from pathlib import Path

_PROC = Path("/proc")


def group_members(pgid: int) -> list[int]:
    """PIDs whose process group is ``pgid`` (the trial and its DataLoader workers)."""
    pids = []
    try:
        entries = list(_PROC.iterdir())
    except OSError:
        return []
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # Field 5 is the process group; the command name (field 2) may hold spaces.
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 2 and int(fields[2]) == pgid:
            pids.append(int(entry.name))
    return pids


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
