"""autotune: find the fastest way to train a PyTorch model on this machine, and prove it.

The public API is re-exported here, each name imported on first use: ``import autotune``
(and the driver process) stays light, and only ``apply``/``Applied``/``apply_workload``
(the code a trial runs, :mod:`autotune.trial.apply`) and ``sample_mask``/
``isolated_attention`` (for a model's forward, :mod:`autotune.trial.tokens`) import torch.
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
    "Tokens",
    "TrialRecord",
    "TuneResult",
    "Workload",
    "WorkloadError",
    "apply",
    "apply_workload",
    "config_from_env",
    "export_config",
    "hf_training_arguments",
    "isolated_attention",
    "lightning_kwargs",
    "load_best",
    "load_config",
    "load_space",
    "make_report",
    "run_workers",
    "sample_mask",
    "tune",
]

_WHERE = {
    "Applied": "trial.apply",
    "apply": "trial.apply",
    "apply_workload": "trial.apply",
    "isolated_attention": "trial.tokens",
    "sample_mask": "trial.tokens",
    "AutotuneError": "errors",
    "SpaceError": "errors",
    "StorageError": "errors",
    "WorkloadError": "errors",
    "Config": "config",
    "load_config": "config",
    "Measurement": "measurement",
    "Mapped": "frameworks.mapping",
    "hf_training_arguments": "frameworks.mapping",
    "lightning_kwargs": "frameworks.mapping",
    "config_from_env": "output.export",
    "export_config": "output.export",
    "load_best": "output.export",
    "Report": "output.report",
    "make_report": "output.report",
    "Space": "space",
    "load_space": "space_file",
    "TrialRecord": "results",
    "TuneResult": "results",
    "tune": "study.tuner",
    "run_workers": "study.workers",
    "Workload": "workload",
    "Tokens": "workload",
}


# Submodules reached as attributes after a plain ``import autotune`` (``autotune.hf.apply``).
_SUBMODULES = ("hf", "lightning")


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return import_module(f".{name}", __name__)
    if name in _WHERE:
        return getattr(import_module(f".{_WHERE[name]}", __name__), name)
    raise AttributeError(f"module 'autotune' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__, *_SUBMODULES])
