"""A trial's processes: they die with the driver, and a DDP trial starts its ranks.

Linux ``PR_SET_PDEATHSIG`` makes each trial process die with the process that started it,
so a killed ``autotune run`` leaves nothing running. A multi-process (DDP) trial is
``python -m autotune.trial --ranks N SPEC RESULT``: that process becomes
``torch.distributed.run`` (same PID; the parent-death signal survives ``exec``), which
starts N ranks of ``python -m autotune.trial SPEC RESULT``.
"""

from __future__ import annotations

import os
import sys

RANK = int(os.environ.get("RANK", "0"))
WORLD = int(os.environ.get("WORLD_SIZE", "1"))


def die_with_driver() -> None:
    """Ask Linux to SIGKILL this process when the driver dies (even by SIGKILL), so a
    killed ``autotune run`` leaves no trial running; DataLoader workers follow their parent.
    """
    driver = os.environ.get("AUTOTUNE_DRIVER_PID")
    if not driver or not sys.platform.startswith("linux"):
        return
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != int(driver):  # the driver died before prctl took effect
        os._exit(1)


def launch_ranks(world: int, spec: str, result: str) -> None:
    """Become ``torch.distributed.run`` with ``world`` ranks of the trial; never returns."""
    os.environ["AUTOTUNE_DRIVER_PID"] = str(os.getpid())  # the ranks' parent, after exec
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={int(world)}",
        "-m",
        "autotune.trial",
        spec,
        result,
    ]
    os.execv(sys.executable, argv)


def init_distributed(device):
    """Join the trial's process group when ``torch.distributed.run`` started several ranks;
    returns this rank's device."""
    if WORLD == 1:
        return device
    import torch
    import torch.distributed as dist

    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return device
