"""The trial process's work: read the spec, run its mode, write the result file.

Modes: ``probe`` (what this machine and workload can do), ``trial`` (build, warm up,
measure), ``profile`` (build, warm up, profile) and ``check`` (``autotune validate``:
build the workload and run one step, naming the field of each mistake). A failure of
the workload is data: it is written as a result with its status and a one-line reason, never raised.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from ..errors import AutotuneError, first_line
from ..measurement import FAILED, OK, OOM, Measurement
from ..trial_spec import TrialSpec
from .baton import BATON
from .build import applied_settings, build, native_settings, prepare, stored_lengths
from .compile import describe_compile_failure
from .guard import RANK, WORLD
from .loop import measure, write_json


def is_oom(exc: BaseException) -> bool:
    """The one predicate that decides whether an exception means "out of memory"."""
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and (
        "out of memory" in text or "can't allocate memory" in text
    )


def run_trial(spec: TrialSpec, started: float) -> dict[str, Any]:
    """Build, warm up, measure; the payload of ``result.json``. Exceptions propagate.

    A workload from a Trainer or a Lightning pair runs the framework's own loop
    (:mod:`.native`); any other, autotune's."""
    t = time.perf_counter()
    prepared = prepare(spec)
    if prepared.workload.native is not None:
        from .native import measure_native

        lengths = stored_lengths(spec) if prepared.workload.tokens is not None else None
        m = measure_native(prepared, spec.progress_path, started=started, lengths=lengths)
        return {**m.to_dict(), "applied": native_settings(prepared)}
    built = build(spec, prepared)
    build_s = time.perf_counter() - t - built.device_init_s
    m = measure(built, spec.progress_path, started=started)
    m = m.replace(device_init_s=built.device_init_s, build_s=build_s)
    return {**m.to_dict(), "applied": applied_settings(built.applied)}


def run_mode(spec: TrialSpec, started: float) -> dict[str, Any]:
    """The payload of the spec's mode; exceptions propagate."""
    mode = spec.mode
    if mode == "probe":
        from .probe import probe

        return probe(spec)
    if mode == "check":
        from .check import check

        return check(spec)
    if mode == "profile":
        from .profile import profile

        return profile(build(spec))
    return run_trial(spec, started)


def failure_reason(exc: BaseException, spec: TrialSpec) -> str:
    """One readable line: what failed, naming the knob when a compiler or kernel choice
    did, and the framework's frame when its own loop ran the trial (``in Trainer.fit(),
    lightning/...py:514 in log: ...``)."""
    reason = _failure(exc, spec)
    where = getattr(exc, "autotune_where", None)
    return f"in {where}: {reason}" if where else reason


def _failure(exc: BaseException, spec: TrialSpec) -> str:
    text = first_line(exc)
    if isinstance(exc, AutotuneError):
        return text
    config = spec.config
    if config is None:
        return f"{type(exc).__name__}: {text}"
    if type(exc).__name__ == "FailOnRecompileLimitHit":
        import torch._dynamo

        limit = torch._dynamo.config.recompile_limit
        return (
            f"torch.compile hit its recompile limit ({limit} graphs of one function): the "
            "input shapes vary too much; compile_dynamic: true, pad_to_multiple_of or "
            "length_grouping make fewer shapes"
        )
    if config.sdpa_backend != "auto" and ("No available kernel" in text or "No viable" in text):
        # torch explains why in warnings on stderr; the gist fits one line
        return (
            f"sdpa_backend={config.sdpa_backend}: torch has no such attention kernel for "
            f"these inputs (dtype, head size, mask or device): {text}"
        )
    return describe_compile_failure(exc, config) or f"{type(exc).__name__}: {text}"


def main(argv: list[str], *, started: float, phases: dict[str, float] | None = None) -> None:
    """Run the spec at ``argv[0]``, write the result to ``argv[1]``, exit the process.

    ``phases``: the process's start-up before this call (``process_start_s``,
    ``import_s``), added to the result."""
    spec_path, result_path = Path(argv[0]), Path(argv[1])
    spec = TrialSpec.read(spec_path)  # the one reading of the spec
    try:
        BATON.open(spec.baton, spec.turn_s)  # an interleaved run: its first turn
        BATON.take()
        payload = run_mode(spec, started)
    except Exception as exc:  # the trial's failure is data, reported to the driver
        traceback.print_exc()
        status = OOM if is_oom(exc) else FAILED
        payload = Measurement(status=status, reason=failure_reason(exc, spec)[:500]).to_dict()
    payload.update(phases or {})
    payload["wall_s"] = time.perf_counter() - started
    if BATON.active:  # its turns: how often it handed the machine back and forth
        payload.update(turns=BATON.turns, waited_s=BATON.waited_s)
    if RANK == 0:  # under DDP, rank 0 speaks for the trial
        write_json(result_path, payload)
    BATON.done()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: DataLoader workers and compile threads can make it slow.
    # A failed rank exits non-zero so that torch.distributed.run stops the others.
    os._exit(1 if WORLD > 1 and payload.get("status") != OK else 0)
