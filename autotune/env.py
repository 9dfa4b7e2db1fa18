"""The environment a measurement was taken in: a config is only valid where it was measured."""

from __future__ import annotations

import os
import platform
import socket
from pathlib import Path
from typing import Any

from . import __version__


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _system_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def nvml_info(pci_bus_id: str | None = None, index: int = 0) -> dict[str, Any]:
    """Driver version and memory of one GPU from NVML; empty without a driver.

    The GPU is found by PCI bus id when given: NVML indices ignore CUDA_VISIBLE_DEVICES.
    """
    try:
        import pynvml
    except ImportError:
        return {}
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return {}
    try:
        if pci_bus_id:
            handle = pynvml.nvmlDeviceGetHandleByPciBusId(pci_bus_id)
        else:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
        driver = pynvml.nvmlSystemGetDriverVersion()
        return {
            "driver": driver.decode() if isinstance(driver, bytes) else driver,
            "nvml_total_bytes": int(mem.total),
        }
    except pynvml.NVMLError:
        return {}
    finally:
        pynvml.nvmlShutdown()


def _pci_bus_id(props: Any) -> str | None:
    try:
        return f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
    except AttributeError:
        return None


def environment(device_type: str) -> dict[str, Any]:
    """Describe this machine; call in the trial process (it imports torch)."""
    import torch

    env: dict[str, Any] = {
        "device": device_type,
        "torch": torch.__version__,
        "autotune": __version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "hostname": socket.gethostname(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "system_memory_bytes": _system_memory_bytes(),
        "torch_threads": torch.get_num_threads(),
    }
    if device_type == "cuda":
        props = torch.cuda.get_device_properties(0)
        env.update(
            device_name=props.name,
            device_memory_bytes=int(props.total_memory),
            cuda=torch.version.cuda,
            cudnn=torch.backends.cudnn.version(),
            capability=f"{props.major}.{props.minor}",
            **nvml_info(_pci_bus_id(props)),
        )
    else:
        env.update(device_name=env["cpu"], device_memory_bytes=env["system_memory_bytes"])
    return env
