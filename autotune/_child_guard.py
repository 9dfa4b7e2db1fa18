"""Trial processes die with the process that started them (Linux ``PR_SET_PDEATHSIG``)."""

from __future__ import annotations

import os
import sys


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
