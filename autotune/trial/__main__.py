"""``python -m autotune.trial [--ranks N] SPEC.json RESULT.json``: one trial process.

Exit code 0 means the result file was written (whatever the trial's status); anything
else means the process died before that. ``--ranks N`` starts a DDP trial of N ranks.
"""

import faulthandler
import os
import sys
import time
from pathlib import Path

T0 = time.perf_counter()  # before torch is imported: the trial's start-up cost counts
T0_WALL = time.time()

from ..trial_spec import SPAWNED_AT, STACKS_FILE, STACKS_SIGNAL  # noqa: E402  (no torch)


def _write_stacks() -> None:
    """Where a trial crashed or hung (``autotune.study.stacks``): a fatal signal writes
    every thread's stack to ``stacks-<pid>.log`` in the trial's folder, and so does
    ``STACKS_SIGNAL``, which the supervisor sends before it kills a trial that overran its
    timeout (the file stays open: faulthandler writes to its descriptor).
    One file per process (the processes' writes would interleave in one): a forked
    DataLoader worker opens its own."""
    global _STACKS
    folder = Path(sys.argv[-1]).parent  # RESULT.json's folder
    try:
        _STACKS = open(folder / STACKS_FILE.format(pid=os.getpid()), "w")  # noqa: SIM115
    except OSError:
        return
    faulthandler.enable(file=_STACKS, all_threads=True)
    faulthandler.register(STACKS_SIGNAL, file=_STACKS, all_threads=True)


_STACKS = None
_write_stacks()
os.register_at_fork(after_in_child=_write_stacks)

from .guard import die_with_driver, launch_ranks  # noqa: E402

die_with_driver()
if sys.argv[1:2] == ["--ranks"]:
    launch_ranks(int(sys.argv[2]), sys.argv[3], sys.argv[4])

from .main import main  # noqa: E402  (imports torch)

try:  # from the driver's spawn to this process's first line: the interpreter's start
    _spawned = {"process_start_s": max(0.0, T0_WALL - float(os.environ[SPAWNED_AT]))}
except (KeyError, ValueError):
    _spawned = {}
main(sys.argv[1:], started=T0, phases={**_spawned, "import_s": time.perf_counter() - T0})
