"""Advice from a profile: what dominates a training step and what to try.

Each rule reads a profile summary (the shares of a step, see
:mod:`autotune.trial.profile`), the profiled config and, when given, the study's
:class:`Evidence`, and returns one sentence or nothing. A suggestion the study already
measured says how it did instead of being suggested again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..measurement import OK, PRUNED
from ..results import TuneResult

# A phase taking at least this share of the step gets a piece of advice.
DATA_SHARE = 0.20
TRANSFER_SHARE = 0.10
SYNC_SHARE = 0.10
OPTIMIZER_SHARE = 0.20
OTHER_SHARE = 0.20
COMPUTE_SHARE = 0.70
CONVERSION_SHARE = 0.15
GPU_BUSY = 0.60
PADDING_SHARE = 0.20
RECOMPILE_GRAPHS = 3  # graphs of a compiled model in a profile: a few (forward, backward)
CONVERSION_OPS = ("aten::copy_", "aten::to", "aten::_to_copy")


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


@dataclass(frozen=True)
class Step:
    """What a rule reads: one profile's shares, its config and device, the study's evidence."""

    profile: dict[str, Any]
    config: dict[str, Any]
    cuda: bool
    evidence: Evidence | None

    def share(self, *phases: str) -> float:
        return sum(self.profile["shares"].get(p, 0.0) for p in phases)


def _data_tip(step: Step) -> str | None:
    data, c = step.share("data"), step.config
    if data < DATA_SHARE:
        return None
    workers = c.get("num_workers", 0)
    if not workers:
        tip = _suggest(
            f"data loading takes {_pct(data)} of the step in the training process",
            [("DataLoader workers (num_workers > 0)", "num_workers", lambda v: v > 0)],
            step.evidence,
            verb="use",
        )
    else:
        tip = (
            f"the step waits {_pct(data)} of its time for its {workers} DataLoader "
            "worker(s): more workers, persistent_workers, a larger prefetch_factor, "
            "or cheaper per-sample transforms"
        )
    if step.cuda and not c.get("pin_memory"):
        tip += "; pinned memory (pin_memory) speeds up the copy to the GPU"
    return tip


def _transfer_tip(step: Step) -> str | None:
    transfer = step.share("to_device")
    if not step.cuda or transfer < TRANSFER_SHARE:
        return None
    return (
        f"host-to-device copies take {_pct(transfer)} of the step: pin_memory with "
        "non_blocking copies overlaps them with compute"
    )


def _sync_tip(step: Step) -> str | None:
    sync = step.share("sync")
    if sync < SYNC_SHARE:
        return None
    reads = step.profile.get("host_reads_per_step", 0.0)
    return (
        f"the host waits for the GPU {_pct(sync)} of the step ({reads:.0f} device-value "
        "reads per step: .item(), printing the loss, fp16 loss scaling): keep such "
        "reads out of the step, or do them every N steps"
    )


def _launch_tip(step: Step) -> str | None:
    busy, c = step.profile.get("device_busy"), step.config
    if not step.cuda or busy is None or busy >= GPU_BUSY:
        return None
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
        step.evidence,
    )


def _optimizer_tip(step: Step) -> str | None:
    optimizer = step.share("optimizer")
    if optimizer < OPTIMIZER_SHARE:
        return None
    ideas: list[Idea] = []
    if step.config.get("optimizer_impl", "default") not in ("foreach", "fused"):
        ideas.append(
            (
                "a foreach or fused implementation (optimizer_impl), which updates all "
                "parameters in a few kernels",
                "optimizer_impl",
                lambda v: v in ("foreach", "fused"),
            )
        )
    return _suggest(f"the optimizer step takes {_pct(optimizer)} of the step", ideas, step.evidence)


def _compute_tip(step: Step) -> str | None:
    compute, c, cuda = step.share("forward", "backward"), step.config, step.cuda
    if compute < COMPUTE_SHARE:
        return None
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
    return _suggest(head, ideas, step.evidence)


def _conversion_tip(step: Step) -> str | None:
    ops = step.profile.get("top_ops", [])
    conversions = sum(op["share"] for op in ops if op["name"] in CONVERSION_OPS)
    if conversions < CONVERSION_SHARE:
        return None
    return (
        f"copies and dtype conversions ({', '.join(CONVERSION_OPS)}) take "
        f"{_pct(conversions)} of the step: autocast re-casts weights every step; on "
        "hardware without native reduced precision, fp32 is faster"
    )


def _other_tip(step: Step) -> str | None:
    other = step.share("other")
    if other < OTHER_SHARE:
        return None
    return (
        f"{_pct(other)} of the step is outside data/forward/backward/optimizer: Python "
        "overhead in the loop (logging, metrics, callbacks)"
    )


def _padding_tip(step: Step) -> str | None:
    padding = step.profile.get("padding_share")
    if padding is None or padding < PADDING_SHARE:
        return None
    ideas: list[Idea] = []
    if step.config.get("length_grouping", "off") == "off":
        ideas.append(
            (
                "length_grouping (batches of samples of similar length)",
                "length_grouping",
                lambda v: v != "off",
            )
        )
    if step.config.get("packing", "off") == "off":
        ideas.append(
            (
                "packing (samples concatenated into rows; causal-LM workloads)",
                "packing",
                lambda v: v != "off",
            )
        )
    head = f"{_pct(padding)} of the token positions are padding, computed for nothing"
    return _suggest(head, ideas, step.evidence)


def _recompile_tip(step: Step) -> str | None:
    graphs = step.profile.get("graphs")
    if graphs is None or graphs <= RECOMPILE_GRAPHS:
        return None
    ideas: list[Idea] = []
    if step.config.get("compile_dynamic") != "true":
        ideas.append(
            (
                "compile_dynamic: true (one graph for all shapes)",
                "compile_dynamic",
                lambda v: v == "true",
            )
        )
    if step.config.get("pad_to_multiple_of", 1) == 1:
        ideas.append(
            ("pad_to_multiple_of 64 (fewer distinct shapes)", "pad_to_multiple_of", lambda v: v > 1)
        )
    head = f"torch.compile built {graphs} graphs: the input shapes vary and it recompiles"
    return _suggest(head, ideas, step.evidence)


# The rules, in the order their advice is given. Each fires on a share threshold above.
RULES: tuple[Callable[[Step], str | None], ...] = (
    _data_tip,
    _transfer_tip,
    _sync_tip,
    _launch_tip,
    _optimizer_tip,
    _compute_tip,
    _conversion_tip,
    _other_tip,
    _padding_tip,
    _recompile_tip,
)


def advice(profile: dict[str, Any], evidence: Evidence | None = None) -> list[str]:
    """Plain advice from a profile summary: what dominates the step and what to try.

    Each rule of :data:`RULES` fires on a share threshold (module constants); a profile
    that trips none gets one sentence saying so. The profile's ``config`` tailors the
    suggestions (a knob already on is not suggested again), and with the study's
    ``evidence`` a suggestion the study already measured says how it did instead.
    """
    if profile.get("status") != "ok":
        return [f"no profile: {profile.get('status')}: {profile.get('reason', '')}"]
    step = Step(profile, profile.get("config", {}), profile.get("device") == "cuda", evidence)
    tips = [tip for rule in RULES if (tip := rule(step)) is not None]
    return tips or ["no single part dominates the step: the config is balanced"]
