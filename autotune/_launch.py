"""Start a multi-process (DDP) trial: ``python -m autotune._launch WORLD SPEC RESULT``.

Asks Linux to kill this process with the driver, then becomes ``torch.distributed.run``
(same PID; the parent-death signal survives ``exec``), which starts WORLD ranks of
``autotune._child``. The ranks in turn die with this launcher, so killing the driver or
the trial's process group leaves nothing behind.
"""

from __future__ import annotations

import os
import sys

from ._child_guard import die_with_driver


def main() -> None:
    world, spec, result = sys.argv[1:4]
    die_with_driver()
    os.environ["AUTOTUNE_DRIVER_PID"] = str(os.getpid())  # the ranks' parent, after exec
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={int(world)}",
        "-m",
        "autotune._child",
        spec,
        result,
    ]
    os.execv(sys.executable, argv)


if __name__ == "__main__":
    main()
