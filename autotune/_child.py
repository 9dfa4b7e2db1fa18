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
from pathlib import Path
from typing import Any

T0 = time.perf_counter()

import torch  # noqa: E402

from .capabilities import capabilities  # noqa: E402
from .config import Config  # noqa: E402
from .env import environment  # noqa: E402
from .errors import AutotuneError  # noqa: E402
from .graph import describe_compile_failure, first_line  # noqa: E402
from .measure import StepClock, peak_memory, reset_peak_memory, spread  # noqa: E402
from .measurement import FAILED, NAN, OK, OOM, Measurement  # noqa: E402
from .training import apply, resolve_device, set_threads  # noqa: E402
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


def run_trial(spec: dict[str, Any]) -> Measurement:
    """Build, warm up, measure. Exceptions propagate to :func:`main`."""
    config = Config.from_dict(spec["config"])
    set_threads(config)  # before the workload: the inter-op pool is sized only once
    trial = spec["trial"]
    device = resolve_device(spec.get("device", "auto"))
    seed = int(trial.get("seed", 0))
    workload = _load(spec)
    torch.manual_seed(seed)
    model = workload.model()
    blocks = list(workload.blocks(model)) if workload.blocks else None
    applied = apply(
        config,
        model=model,
        dataset=workload.dataset(),
        loss=workload.loss,
        optimizer=workload.optimizer,
        blocks=blocks,
        collate_fn=workload.collate_fn,
        device=device,
        seed=seed,
        endless=True,
    )
    batches = iter(applied.loader)
    startup_s = time.perf_counter() - T0
    reset_peak_memory(device)

    losses: list[torch.Tensor] = []
    warmup = StepClock(device)
    warmup.start()
    for _ in range(int(trial["warmup_steps"])):
        losses.append(applied.train_step(batches))
    warmup.stop()

    clock = StepClock(device)
    clock.start()
    for _ in range(int(trial["measured_steps"])):
        losses.append(applied.train_step(batches))
        clock.mark()
    clock.stop()

    values = [float(x) for x in torch.stack(losses).cpu().tolist()]
    per_step = config.global_batch
    steps = int(trial["measured_steps"])
    samples_per_s = steps * per_step / clock.window_s
    stats = spread(clock.step_times_s())
    steady_step_s = clock.window_s / steps
    m = Measurement(
        status=OK,
        samples_per_s=samples_per_s,
        tokens_per_s=samples_per_s * workload.tokens_per_sample
        if workload.tokens_per_sample
        else None,
        samples_per_step=per_step,
        measured_steps=steps,
        window_s=clock.window_s,
        warmup_s=warmup.window_s,
        # What warm-up cost beyond steady-state steps: compilation, autotuning, caches.
        compile_s=max(0.0, warmup.window_s - int(trial["warmup_steps"]) * steady_step_s),
        startup_s=startup_s,
        skipped_steps=applied.skipped_steps,
        losses=values,
        **stats,
        **peak_memory(device),
    )
    if not all(math.isfinite(x) for x in values):
        first = next(i for i, x in enumerate(values) if not math.isfinite(x))
        return m.replace(status=NAN, reason=f"loss is {values[first]} at step {first}")
    return m


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
        else:
            payload = run_trial(spec).to_dict()
    except Exception as exc:  # the trial's failure is data, reported to the driver
        traceback.print_exc()
        status = OOM if is_oom(exc) else FAILED
        payload = Measurement(status=status, reason=_reason(exc, spec)[:500]).to_dict()
    payload["wall_s"] = time.perf_counter() - T0
    _write(result_path, payload)
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: DataLoader workers and compile threads can make it slow.
    os._exit(0)


if __name__ == "__main__":
    main()
