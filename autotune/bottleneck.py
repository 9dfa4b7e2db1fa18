"""Bottleneck analysis: profile a trial's config once, keep the result, turn it into advice.

:func:`ensure_profiles` runs the profile pass (``autotune._child`` in ``profile`` mode, see
:mod:`autotune._profile`) for the baseline and the recommended config, in their own
subprocesses like any trial, and stores each summary in the study's user attrs
(``profile:<trial number>``), so ``autotune report`` profiles a trial once and reuses the
result on every later report. Artifacts go to ``<runs>/<study>/trial-NNNN/profile/``:
``result.json`` (the summary), ``trace.json`` (a Chrome trace), ``stdout.log``/``stderr.log``.
:func:`advice` reads a summary as plain sentences.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna

from . import runner
from .measurement import OK, PRUNED
from .results import TuneResult
from .space import Space
from .tuner import Reporter, TrialRecord

PROFILE_ATTR = "profile:{number}"
DEFAULT_PROFILE_STEPS = 5

# A phase taking at least this share of the step gets a piece of advice.
DATA_SHARE = 0.20
TRANSFER_SHARE = 0.10
SYNC_SHARE = 0.10
OPTIMIZER_SHARE = 0.20
OTHER_SHARE = 0.20
COMPUTE_SHARE = 0.70
CONVERSION_SHARE = 0.15
GPU_BUSY = 0.60
CONVERSION_OPS = ("aten::copy_", "aten::to", "aten::_to_copy")


def stored_profile(study: optuna.Study, record: TrialRecord) -> dict[str, Any] | None:
    """The stored profile of a trial, if it was made for that trial's config."""
    stored = study.user_attrs.get(PROFILE_ATTR.format(number=record.number))
    if stored and stored.get("config") == record.config.to_dict():
        return stored
    return None


def ensure_profiles(
    space: Space,
    study: optuna.Study,
    records: list[TrialRecord],
    runs_dir: Path,
    *,
    steps: int = DEFAULT_PROFILE_STEPS,
    force: bool = False,
    reporter: Reporter | None = None,
) -> dict[int, dict[str, Any]]:
    """Profile each of ``records`` unless the study already holds its profile.

    Args:
        space: the space the study was run from (workload, device, trial settings).
        study: where profiles are kept (``profile:<number>`` user attrs).
        records: the trials to profile, e.g. baseline and best; repeats are profiled once.
        runs_dir: the study's run folder (``<output_dir>/<study>``).
        steps: profiled optimizer steps (after the trial's warm-up steps).
        force: profile again even when a stored profile exists.
        reporter: receives a note before each profile run.

    Returns:
        Trial number -> profile summary (``status`` is ``ok`` or why it failed).
    """
    if steps < 1:
        raise ValueError(f"steps must be at least 1 but got {steps}")
    reporter = reporter or Reporter()
    out: dict[int, dict[str, Any]] = {}
    for record in records:
        if record.number in out:
            continue
        stored = None if force else stored_profile(study, record)
        if stored is None:
            reporter.note(f"profiling trial #{record.number} ({record.config.short()})")
            folder = runs_dir / f"trial-{record.number:04d}" / "profile"
            stored = runner.profile_trial(space, record.config, folder, steps)
            stored["config"] = record.config.to_dict()
            if stored.get("status") == "ok":  # a failed profile is retried next time
                study.set_user_attr(PROFILE_ATTR.format(number=record.number), stored)
        out[record.number] = stored
    return out


def _pct(share: float) -> str:
    return f"{share:.0%}"


@dataclass(frozen=True)
class Evidence:
    """What the study measured, so that advice does not send the user to try again a knob
    value that already lost here.

    ``trials`` holds each measured config (as a dict), its objective value and its status;
    ``best_config`` and ``best_value`` are the recommended config's.
    """

    trials: tuple[tuple[dict[str, Any], float, str], ...]
    best_config: dict[str, Any]
    best_value: float

    @classmethod
    def from_result(cls, result: TuneResult) -> Evidence | None:
        """The evidence of a study's summarised trials; ``None`` without a winner."""
        if result.best is None or not result.best.value:
            return None
        rows = tuple((t.config.to_dict(), t.value, t.status) for t in result.trials)
        return cls(rows, result.best.config.to_dict(), result.best.value)

    def measured(self, knob: str, wanted: Callable[[Any], bool]) -> str | None:
        """How the measured configs with a wanted value of ``knob`` did; ``None`` if none was
        measured."""
        runs = [(v, status) for c, v, status in self.trials if knob in c and wanted(c[knob])]
        if not runs:
            return None
        if knob in self.best_config and wanted(self.best_config[knob]):
            return "the recommended config has it"
        speeds = [v for v, status in runs if status in (OK, PRUNED) and v]
        if speeds:
            slower = 1 - max(speeds) / self.best_value
            n = f"{len(runs)} trial{'s' if len(runs) > 1 else ''}"
            if slower < 0.005:
                return f"{n} measured here, the best as fast as the recommended config"
            return f"{n} measured here, the best {slower:.0%} slower than the recommended config"
        statuses = ", ".join(sorted({status for _, status in runs}))
        return f"measured here: every such trial was infeasible ({statuses})"


# An idea for a tip: (what to try, the knob, which of its values the idea means).
Idea = tuple[str, str, Callable[[Any], bool]]


def _suggest(head: str, ideas: list[Idea], evidence: Evidence | None, verb: str = "try") -> str:
    """``head``, then the ideas not yet measured, then those the study measured and how they
    did (a suggestion that already lost here is reported as such, not repeated)."""
    fresh, tried = [], []
    for text, knob, wanted in ideas:
        seen = evidence.measured(knob, wanted) if evidence else None
        if seen:
            tried.append(f"{text} ({seen})")
        else:
            fresh.append(text)
    tip = head
    if fresh:
        tip += f": {verb} " + ", ".join(fresh)
    if tried:
        tip += ("; " if fresh else ": ") + "already measured: " + "; ".join(tried)
    if not ideas:
        tip += ": the knobs here are used up"
    return tip


def advice(profile: dict[str, Any], evidence: Evidence | None = None) -> list[str]:
    """Plain advice from a profile summary: what dominates the step and what to try.

    Each rule fires on a share threshold (module constants); a profile that trips none
    gets one sentence saying so. The profile's ``config`` tailors the suggestions (a
    knob already on is not suggested again), and with the study's ``evidence`` a
    suggestion the study already measured says how it did instead.
    """
    if profile.get("status") != "ok":
        return [f"no profile: {profile.get('status')}: {profile.get('reason', '')}"]
    s = profile["shares"]
    c = profile.get("config", {})
    cuda = profile.get("device") == "cuda"
    tips: list[str] = []
    data = s.get("data", 0.0)
    if data >= DATA_SHARE:
        workers = c.get("num_workers", 0)
        if not workers:
            tip = _suggest(
                f"data loading takes {_pct(data)} of the step in the training process",
                [("DataLoader workers (num_workers > 0)", "num_workers", lambda v: v > 0)],
                evidence,
                verb="use",
            )
        else:
            tip = (
                f"the step waits {_pct(data)} of its time for its {workers} DataLoader "
                "worker(s): more workers, persistent_workers, a larger prefetch_factor, "
                "or cheaper per-sample transforms"
            )
        if cuda and not c.get("pin_memory"):
            tip += "; pinned memory (pin_memory) speeds up the copy to the GPU"
        tips.append(tip)
    transfer = s.get("to_device", 0.0)
    if cuda and transfer >= TRANSFER_SHARE:
        tips.append(
            f"host-to-device copies take {_pct(transfer)} of the step: pin_memory with "
            "non_blocking copies overlaps them with compute"
        )
    sync = s.get("sync", 0.0)
    if sync >= SYNC_SHARE:
        reads = profile.get("host_reads_per_step", 0.0)
        tips.append(
            f"the host waits for the GPU {_pct(sync)} of the step ({reads:.0f} device-value "
            "reads per step: .item(), printing the loss, fp16 loss scaling): keep such "
            "reads out of the step, or do them every N steps"
        )
    busy = profile.get("device_busy")
    if cuda and busy is not None and busy < GPU_BUSY:
        tips.append(_launch_tip(busy, c, evidence))
    optimizer = s.get("optimizer", 0.0)
    if optimizer >= OPTIMIZER_SHARE:
        ideas: list[Idea] = []
        if c.get("optimizer_impl", "default") not in ("foreach", "fused"):
            ideas.append(
                (
                    "a foreach or fused implementation (optimizer_impl), which updates all "
                    "parameters in a few kernels",
                    "optimizer_impl",
                    lambda v: v in ("foreach", "fused"),
                )
            )
        tips.append(
            _suggest(f"the optimizer step takes {_pct(optimizer)} of the step", ideas, evidence)
        )
    compute = s.get("forward", 0.0) + s.get("backward", 0.0)
    if compute >= COMPUTE_SHARE:
        tips.append(_compute_tip(compute, c, cuda, evidence))
    conversions = sum(
        op["share"] for op in profile.get("top_ops", []) if op["name"] in CONVERSION_OPS
    )
    if conversions >= CONVERSION_SHARE:
        tips.append(
            f"copies and dtype conversions ({', '.join(CONVERSION_OPS)}) take "
            f"{_pct(conversions)} of the step: autocast re-casts weights every step; on "
            "hardware without native reduced precision, fp32 is faster"
        )
    other = s.get("other", 0.0)
    if other >= OTHER_SHARE:
        tips.append(
            f"{_pct(other)} of the step is outside data/forward/backward/optimizer: Python "
            "overhead in the loop (logging, metrics, callbacks)"
        )
    return tips or ["no single part dominates the step: the config is balanced"]


def _launch_tip(busy: float, c: dict[str, Any], evidence: Evidence | None) -> str:
    batch = c.get("batch_size", 0)
    ideas: list[Idea] = [("a larger batch_size", "batch_size", lambda v: v > batch)]
    if c.get("compile_mode", "off") == "off":
        ideas.append(("torch.compile (compile_mode)", "compile_mode", lambda v: v != "off"))
    if c.get("compile_mode") != "reduce-overhead":
        ideas.append(
            (
                "CUDA graphs (compile_mode: reduce-overhead)",
                "compile_mode",
                lambda v: v == "reduce-overhead",
            )
        )
    return _suggest(
        f"the GPU is busy only {_pct(busy)} of the step (waiting on the host): fewer, "
        "larger kernels cut the per-kernel launch overhead",
        ideas,
        evidence,
    )


def _compute_tip(compute: float, c: dict[str, Any], cuda: bool, evidence: Evidence | None) -> str:
    ideas: list[Idea] = []
    if c.get("amp_dtype", "fp32") == "fp32":
        ideas.append(
            (
                "bf16/fp16 autocast (amp_dtype) on tensor cores"
                if cuda
                else "bf16 autocast (amp_dtype) only on a CPU with native bf16 (AMX, AVX512-BF16)",
                "amp_dtype",
                lambda v: v != "fp32",
            )
        )
    if c.get("compile_mode", "off") == "off":
        ideas.append(
            ("torch.compile (compile_mode) to fuse kernels", "compile_mode", lambda v: v != "off")
        )
    if c.get("gradient_checkpointing"):
        ideas.append(
            (
                "gradient_checkpointing off if memory allows (it re-runs block forwards)",
                "gradient_checkpointing",
                lambda v: not v,
            )
        )
    if cuda and c.get("matmul_precision", "highest") == "highest":
        ideas.append(
            ("TF32 matmuls (matmul_precision: high)", "matmul_precision", lambda v: v != "highest")
        )
    head = f"the step is compute-bound ({_pct(compute)} in forward and backward)"
    return _suggest(head, ideas, evidence)
