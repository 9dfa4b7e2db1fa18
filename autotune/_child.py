"""The trial subprocess: ``python -m autotune._child SPEC.json RESULT.json``.

It imports the workload, applies the config, runs warm-up then measured steps and writes
a result JSON at the path the driver gave. Exit code 0 means the result file was written
(whatever the trial's status); anything else means the process died before that.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

T0 = time.perf_counter()


from ._child_guard import die_with_driver  # noqa: E402

die_with_driver()

import torch  # noqa: E402

from .capabilities import capabilities  # noqa: E402
from .config import Config  # noqa: E402
from .env import environment  # noqa: E402
from .errors import AutotuneError, first_line  # noqa: E402
from .graph import describe_compile_failure  # noqa: E402
from .measure import StepClock, peak_memory, reset_peak_memory, spread  # noqa: E402
from .measurement import FAILED, NAN, OK, OOM, Measurement  # noqa: E402
from .training import Applied, apply_workload, resolve_device, set_threads  # noqa: E402
from .workload import Workload, load_workload  # noqa: E402


def is_oom(exc: BaseException) -> bool:
    """The one predicate that decides whether an exception means "out of memory"."""
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and (
        "out of memory" in text or "can't allocate memory" in text
    )


def _load(spec: dict[str, Any]) -> Workload:
    base = Path(spec["base_dir"]) if spec.get("base_dir") else None
    return load_workload(spec["workload"], spec.get("workload_args"), base)


def probe(spec: dict[str, Any]) -> dict[str, Any]:
    """Check that the workload loads and tell the driver what this machine can do."""
    device = resolve_device(spec.get("device", "auto"))
    workload = _load(spec)
    dataset = workload.dataset()
    return {
        "status": OK,
        "capabilities": capabilities(device, workload, dataset),
        "environment": environment(device.type),
        "workload": {
            "name": workload.name,
            "dataset_len": len(dataset),
            "tokens_per_sample": workload.tokens_per_sample,
        },
    }


@dataclass
class Built:
    """A trial's workload with the config applied, as both trial and profile modes run it."""

    config: Config
    trial: dict[str, Any]
    device: torch.device
    workload: Workload
    applied: Applied
    batches: Iterator[Any]


def build(spec: dict[str, Any]) -> Built:
    """Seed, build the workload and apply the config: the same code path as ``autotune.apply``."""
    config = Config.from_dict(spec["config"])
    set_threads(config)  # before the workload: the inter-op pool is sized only once
    trial = spec["trial"]
    device = _init_distributed(resolve_device(spec.get("device", "auto")))
    seed = int(trial.get("seed", 0))
    workload = _load(spec)
    applied = apply_workload(config, workload, device=device, seed=seed, endless=True)
    return Built(config, trial, device, workload, applied, iter(applied.loader))


def applied_settings(applied: Applied) -> dict[str, Any]:
    """What :func:`autotune.apply` set up, read back from the objects it built.

    Written into each trial's ``result.json`` (``applied``), so a test or a user can check
    that their own ``apply`` call builds the same loader, model and optimizer as the trial.
    DataLoader attributes are read generically, so new loader knobs show up here too.
    """
    loader, model, opt = applied.loader, applied.model, applied.optimizer
    inner = getattr(model, "_orig_mod", model)
    loader_attrs = (
        "batch_size",
        "num_workers",
        "pin_memory",
        "persistent_workers",
        "prefetch_factor",
        "drop_last",
        "timeout",
    )
    group = opt.param_groups[0] if opt.param_groups else {}
    autocast = applied.autocast()
    return {
        "config": applied.config.to_dict(),
        "device": str(applied.device),
        "loader": {k: getattr(loader, k, None) for k in loader_attrs}
        | {"sampler": type(loader.sampler).__name__},
        "model": {
            "type": type(inner).__name__,
            "compiled": inner is not model,
            "training": inner.training,
            "param_dtypes": sorted({str(p.dtype) for p in inner.parameters()}),
            "param_devices": sorted({str(p.device) for p in inner.parameters()}),
            "checkpointed_blocks": sum(
                1 for m in inner.modules() if getattr(m, "_autotune_checkpointed", False)
            ),
        },
        "optimizer": {
            "type": type(opt).__name__,
            **{k: group.get(k) for k in ("foreach", "fused") if k in group},
        },
        "autocast": str(autocast.fast_dtype) if isinstance(autocast, torch.autocast) else None,
        "grad_scaler": applied.scaler is not None,
        "torch": {
            "cudnn_benchmark": torch.backends.cudnn.benchmark,
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "num_threads": torch.get_num_threads(),
            "interop_threads": torch.get_num_interop_threads(),
        },
    }


def run_trial(spec: dict[str, Any]) -> dict[str, Any]:
    """Build, warm up, measure; the payload of ``result.json``. Exceptions propagate."""
    built = build(spec)
    m = measure(built, spec.get("progress_path"))
    return {**m.to_dict(), "applied": applied_settings(built.applied)}


def measure(built: Built, progress_path: str | None = None) -> Measurement:
    """Warm-up steps untimed, then the timed window (progress reported to ``progress_path``)."""
    config, trial, device = built.config, built.trial, built.device
    workload, applied, batches = built.workload, built.applied, built.batches
    startup_s = time.perf_counter() - T0
    reset_peak_memory(device)

    losses: list[torch.Tensor] = []
    warmup = StepClock(device)
    warmup.start()
    for _ in range(int(trial["warmup_steps"])):
        losses.append(applied.train_step(batches))
    warmup.stop()

    progress = _Progress(progress_path if RANK == 0 else None, warmup.window_s, config.global_batch)
    clock = StepClock(device)
    clock.start()
    for _ in range(int(trial["measured_steps"])):
        losses.append(applied.train_step(batches))
        clock.mark()
        progress.update(clock)
    clock.stop()

    stacked = torch.stack(losses)
    window_s, warmup_s = clock.window_s, warmup.window_s
    memory = peak_memory(device)
    if WORLD > 1:  # global view: mean loss, slowest rank's window, largest memory peak
        stacked, window_s, warmup_s, memory["peak_mem_bytes"] = _reduce_ranks(
            stacked, window_s, warmup_s, memory["peak_mem_bytes"], device
        )
    values = [float(x) for x in stacked.cpu().tolist()]
    per_step = config.global_batch  # samples of all ranks
    steps = int(trial["measured_steps"])
    samples_per_s = steps * per_step / window_s
    stats = spread(clock.step_times_s())
    steady_step_s = window_s / steps
    m = Measurement(
        status=OK,
        samples_per_s=samples_per_s,
        tokens_per_s=samples_per_s * workload.tokens_per_sample
        if workload.tokens_per_sample
        else None,
        samples_per_step=per_step,
        measured_steps=steps,
        window_s=window_s,
        warmup_s=warmup_s,
        # What warm-up cost beyond steady-state steps: compilation, autotuning, caches.
        compile_s=max(0.0, warmup_s - int(trial["warmup_steps"]) * steady_step_s),
        startup_s=startup_s,
        skipped_steps=applied.skipped_steps,
        losses=values,
        **stats,
        **memory,
    )
    if not all(math.isfinite(x) for x in values):
        first = next(i for i, x in enumerate(values) if not math.isfinite(x))
        return m.replace(status=NAN, reason=f"loss is {values[first]} at step {first}")
    return m


RANK = int(os.environ.get("RANK", "0"))
WORLD = int(os.environ.get("WORLD_SIZE", "1"))


def _init_distributed(device: torch.device) -> torch.device:
    """Join the trial's process group when ``torch.distributed.run`` started several ranks."""
    if WORLD == 1:
        return device
    import torch.distributed as dist

    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return device


def _reduce_ranks(
    losses: torch.Tensor, window_s: float, warmup_s: float, peak: int, device: torch.device
) -> tuple[torch.Tensor, float, float, int]:
    import torch.distributed as dist

    losses = losses.clone()
    dist.all_reduce(losses)
    losses /= WORLD
    worst = torch.tensor([window_s, warmup_s, float(peak)], dtype=torch.float64, device=device)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    window_s, warmup_s, peak_f = worst.tolist()
    return losses, window_s, warmup_s, int(peak_f)


class _Progress:
    """Tells the driver how the measured window is going, so it can stop a hopeless trial.

    Written at most every ``every_s`` seconds; never forces a device sync.
    """

    def __init__(
        self, path: str | None, warmup_s: float, samples_per_step: int, every_s: float = 0.2
    ) -> None:
        self.path = Path(path) if path else None
        self.base = {"warmup_s": warmup_s, "samples_per_step": samples_per_step}
        self.every_s = every_s
        self.last = 0.0

    def update(self, clock: StepClock) -> None:
        now = time.perf_counter()
        if self.path is None or now - self.last < self.every_s:
            return
        self.last = now
        steps, elapsed_s = clock.progress()
        _write(self.path, {**self.base, "steps": steps, "elapsed_s": elapsed_s})


def _reason(exc: BaseException, spec: dict[str, Any]) -> str:
    """One readable line: what failed, naming the knob when a compiler or kernel choice did."""
    text = first_line(exc)
    if isinstance(exc, AutotuneError):
        return text
    try:
        config = Config.from_dict(spec["config"]) if "config" in spec else None
    except AutotuneError:
        config = None
    if config is None:
        return f"{type(exc).__name__}: {text}"
    if config.sdpa_backend != "auto" and ("No available kernel" in text or "No viable" in text):
        # torch explains why in warnings on stderr; the gist fits one line
        return (
            f"sdpa_backend={config.sdpa_backend}: torch has no such attention kernel for "
            f"these inputs (dtype, head size, mask or device): {text}"
        )
    return describe_compile_failure(exc, config) or f"{type(exc).__name__}: {text}"


def _write(path: Path, payload: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(payload, indent=1))
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    spec_path, result_path = Path(args[0]), Path(args[1])
    spec = json.loads(spec_path.read_text())
    try:
        if spec.get("mode") == "probe":
            payload = probe(spec)
        elif spec.get("mode") == "profile":
            from ._profile import profile

            payload = profile(build(spec), spec)
        else:
            payload = run_trial(spec)
    except Exception as exc:  # the trial's failure is data, reported to the driver
        traceback.print_exc()
        status = OOM if is_oom(exc) else FAILED
        payload = Measurement(status=status, reason=_reason(exc, spec)[:500]).to_dict()
    payload["wall_s"] = time.perf_counter() - T0
    if RANK == 0:  # under DDP, rank 0 speaks for the trial
        _write(result_path, payload)
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: DataLoader workers and compile threads can make it slow.
    # A failed rank exits non-zero so that torch.distributed.run stops the others.
    os._exit(1 if WORLD > 1 and payload.get("status") != OK else 0)


if __name__ == "__main__":
    main()
