"""The driver's memory cap reads a trial's process group as the cap means it (PSS: forked
workers' shared pages counted once), and reads it cheaply while the group fits."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from autotune.study import procs

MiB = 2**20

# A parent that holds 200 MiB of written pages and forks two workers that share them.
_GROUP = textwrap.dedent("""
    import os, sys, time
    held = b"x" * (200 * 2**20)
    for _ in range(2):
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
    print("ready", flush=True)
    time.sleep(60)
""")


@pytest.fixture
def group():
    if not sys.platform.startswith("linux"):
        pytest.skip("reads /proc")
    proc = subprocess.Popen(
        [sys.executable, "-c", _GROUP], stdout=subprocess.PIPE, start_new_session=True, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 10
        while len(procs.group_members(proc.pid)) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        yield proc.pid
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_shared_pages_count_once_against_the_cap(group):
    members = procs.group_members(group)
    assert len(members) == 3
    rss = sum(procs._rss_bytes(p) for p in members)
    assert rss > 600 * MiB  # each of the three maps the 200 MiB
    # Over the cap in RSS, within it in PSS: not over.
    assert procs.group_memory_over(group, 450 * MiB) is None
    # Over it in PSS: the figure is the PSS (the 200 MiB once), not the RSS.
    used = procs.group_memory_over(group, 100 * MiB)
    assert used is not None
    assert 200 * MiB < used < 450 * MiB


def test_a_group_within_the_cap_is_read_without_walking_its_pages(group, monkeypatch):
    walked = []
    real = procs._pss_bytes
    monkeypatch.setattr(procs, "_pss_bytes", lambda pid: walked.append(pid) or real(pid))
    assert procs.group_memory_over(group, 4096 * MiB) is None
    assert walked == []  # smaps_rollup costs ~16 ms a GB, in the trial's time
    assert procs.group_memory_over(group, 100 * MiB) is not None
    assert len(walked) == 3
