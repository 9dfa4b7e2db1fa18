"""Graph compilers for the model: ``torch.compile`` or TorchScript (script / trace).

A model that a compiler cannot handle fails the trial with a readable reason; the
study goes on (failures are data).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..errors import AutotuneError, first_line

if TYPE_CHECKING:
    from ..config import Config

_DYNAMIC = {"auto": None, "true": True, "false": False}


class GraphError(AutotuneError):
    """TorchScript could not script or trace the model."""


def compile_model(model: nn.Module, config: Config) -> nn.Module:
    """``model`` wrapped the way ``config`` says (``compile_mode``, its options, or ``jit``)."""
    if config.compile_mode != "off":
        mode = None if config.compile_mode == "default" else config.compile_mode
        return torch.compile(
            model,
            mode=mode,
            dynamic=_DYNAMIC[config.compile_dynamic],
            fullgraph=config.compile_fullgraph,
        )
    if config.jit == "script":
        try:
            return torch.jit.script(model)
        except torch.OutOfMemoryError:
            raise
        except Exception as e:
            raise GraphError(f"jit=script: torch.jit.script failed: {first_line(e)}") from e
    if config.jit == "trace":
        return TraceOnFirstCall(model)
    return model


def describe_compile_failure(exc: BaseException, config: Config) -> str | None:
    """A reason naming the compile settings when ``exc`` comes from torch.compile."""
    dynamo = getattr(torch, "_dynamo", None)
    exc_type = getattr(getattr(dynamo, "exc", None), "TorchDynamoException", None)
    if config.compile_mode == "off" or exc_type is None or not isinstance(exc, exc_type):
        return None
    settings = f"compile_mode={config.compile_mode}"
    if config.compile_fullgraph:
        settings += " compile_fullgraph=true"
    if config.compile_dynamic != "auto":
        settings += f" compile_dynamic={config.compile_dynamic}"
    return f"torch.compile ({settings}) failed: {type(exc).__name__}: {first_line(exc)}"


class TraceOnFirstCall(nn.Module):
    """Traces the wrapped model with the arguments of its first call.

    Only the loss function knows how the model is called, so the first real batch is
    the example input. The traced module shares the wrapped model's parameters.
    """

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module
        self._traced: Any = None  # not a submodule: its parameters are module's

    @property
    def traced(self) -> torch.jit.ScriptModule | None:
        return self._traced

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs:
            raise GraphError(
                f"jit=trace: the model must be called with positional arguments only "
                f"but got keyword arguments {', '.join(sorted(kwargs))}"
            )
        if self._traced is None:
            try:
                traced = torch.jit.trace(self.module, args, check_trace=False)
            except torch.OutOfMemoryError:
                raise
            except Exception as e:
                raise GraphError(f"jit=trace: torch.jit.trace failed: {first_line(e)}") from e
            object.__setattr__(self, "_traced", traced)
        return self._traced(*args)
