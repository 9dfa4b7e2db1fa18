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


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _rss_bytes(pid: int) -> int:
    """Resident set size, from ``statm``: a counter the kernel keeps, read in microseconds."""
    try:
        return int((_PROC / str(pid) / "statm").read_text().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


def group_memory_over(pgid: int, cap_bytes: int) -> int | None:
    """The group's memory (sum of PSS) when it is over ``cap_bytes``, else ``None``.

    PSS is what the cap means (forked DataLoader workers share the parent's pages), but
    ``smaps_rollup`` walks the process's page tables: 16 ms for a 1 GB process on the
    2-core machine (2026-12-06), every poll of the driver (0.25 s), on the cores the trial
    is timed on, which slowed an eager trial 2-3%. RSS bounds PSS from above and is a
    counter (25 us), so a group whose RSS fits the cap fits it; only one that does not
    is read in PSS.
    """
    members = group_members(pgid)
    if sum(_rss_bytes(pid) for pid in members) <= cap_bytes:
        return None
    used = sum(_pss_bytes(pid) for pid in members)
    return used if used > cap_bytes else None


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
