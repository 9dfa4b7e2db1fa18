"""autotune: find the fastest way to train a PyTorch model on this machine, and prove it.

The public API is re-exported here. Names that need torch are imported lazily, so
``import autotune`` (and the driver process) stays light.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__version__ = "0.1.0"

__all__ = [
    "Applied",
    "AutotuneError",
    "Config",
    "Mapped",
    "Measurement",
    "Report",
    "Space",
    "SpaceError",
    "StorageError",
    "TrialRecord",
    "TuneResult",
    "Workload",
    "WorkloadError",
    "apply",
    "apply_workload",
    "config_from_env",
    "export_config",
    "hf_training_arguments",
    "lightning_kwargs",
    "load_best",
    "load_config",
    "load_space",
    "make_report",
    "tune",
]

_WHERE = {
    "Applied": "training",
    "apply": "training",
    "apply_workload": "training",
    "AutotuneError": "errors",
    "SpaceError": "errors",
    "StorageError": "errors",
    "WorkloadError": "errors",
    "Config": "config",
    "load_config": "config",
    "Measurement": "measurement",
    "Mapped": "trainers",
    "hf_training_arguments": "trainers",
    "lightning_kwargs": "trainers",
    "config_from_env": "export",
    "export_config": "export",
    "load_best": "export",
    "Report": "reporting",
    "make_report": "reporting",
    "Space": "space",
    "load_space": "space",
    "TrialRecord": "results",
    "TuneResult": "results",
    "tune": "tuner",
    "Workload": "workload",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(import_module(f".{_WHERE[name]}", __name__), name)
    raise AttributeError(f"module 'autotune' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
