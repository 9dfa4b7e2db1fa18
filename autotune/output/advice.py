"""Advice from a profile: what dominates a training step and what to try.

Each rule reads a profile summary (the shares of a step, see
:mod:`autotune.trial.profile`), the profiled config and, when given, the study's
:class:`Evidence`, and returns one sentence or nothing. A suggestion the study already
measured says how it did instead of being suggested again.

Every rule checks three things before it speaks: the config (no autocast advice for a
config without autocast, no knob suggested that is already on), the phase its ops ran in
(a copy in the dataset's ``__getitem__`` is data loading, not compute) and the cap of a
knob (no more workers than CPUs, no larger micro-batch than a fixed global batch). It
never suggests a knob a trial cannot show (``persistent_workers`` only saves the worker
re-spawn at each epoch; a trial is one endless epoch).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..config import Config
from ..errors import AutotuneError
from ..measurement import OK, PREDICTED_OVER_MEMORY, PRUNED
from ..mfu import peak_name
from ..results import TuneResult
from ..study.screening import DATA_SHARE, PADDING_SHARE

# A phase taking at least this share of the step gets a piece of advice (data loading and
# padding: at the screening's DATA_SHARE and PADDING_SHARE, so both agree on what matters).
TRANSFER_SHARE = 0.10
SYNC_SHARE = 0.10
OPTIMIZER_SHARE = 0.20
OTHER_SHARE = 0.20
COMPUTE_SHARE = 0.70
CONVERSION_SHARE = 0.15
GPU_BUSY = 0.60
# MFU (of the measured peak) at or above HIGH_MFU is near the limit; below LOW_MFU, far.
HIGH_MFU = 0.50
LOW_MFU = 0.20
CONVERSION_OPS = ("aten::copy_", "aten::to", "aten::_to_copy")
# The phases autocast casts in: its weight and activation casts run in forward, their
# gradients' casts in backward.
COMPUTE_PHASES = ("forward", "backward")


def _pct(share: float) -> str:
    return f"{share:.0%}"


@dataclass(frozen=True)
class Evidence:
    """What the study measured, so that advice does not send the user to try again a knob
    value that already lost here, nor past a cap of this machine or study.

    ``trials`` holds each measured config (as a dict), its objective value and its status;
    ``best_config`` and ``best_value`` are the recommended config's; ``cpu_count`` is the
    machine's (the cap of ``num_workers``) and ``global_batch`` the study's fixed global
    batch (the cap of ``batch_size``), each ``None`` when unknown.
    """

    trials: tuple[tuple[dict[str, Any], float, str], ...]
    best_config: dict[str, Any]
    best_value: float
    cpu_count: int | None = None
    global_batch: int | None = None
    # config key -> (MFU, the peak it is of), for the configs that have one
    mfu: tuple[tuple[str, float, str], ...] = ()
    # the measured peaks (FLOP/s) by key (autotune.mfu.peak_key)
    peaks: tuple[tuple[str, float], ...] = ()

    @classmethod
    def from_result(cls, result: TuneResult) -> Evidence | None:
        """The evidence of a study's summarised trials; ``None`` without a winner."""
        if result.best is None or not result.best.value:
            return None
        rows = tuple(  # a config skipped as predicted over memory was not measured
            (t.config.to_dict(), t.value, t.status)
            for t in result.trials
            if t.status != PREDICTED_OVER_MEMORY
        )
        mfu = tuple(
            (t.config.key(), found.mfu, found.peak)
            for t in result.trials
            if (found := result.mfu(t)) is not None
        )
        return cls(
            rows,
            result.best.config.to_dict(),
            result.best.value,
            cpu_count=result.environment.get("cpu_count"),
            global_batch=result.global_batch,
            mfu=mfu,
            peaks=tuple(
                (key, found["flops_per_s"])
                for key, found in (result.environment.get("peak_flops") or {}).items()
                if "flops_per_s" in found
            ),
        )

    def mfu_of(self, config: dict[str, Any]) -> tuple[float, str] | None:
        """The MFU and its peak of a measured config (as a dict), if it has one."""
        try:
            key = Config.from_dict(config).key()
        except AutotuneError:
            return None
        return next(((m, peak) for k, m, peak in self.mfu if k == key), None)

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


def _suggest(
    head: str, ideas: list[Idea], evidence: Evidence | None, verb: str = "try", then: str = ""
) -> str:
    """``head``, then the ideas not yet measured, then those the study measured and how they
    did (a suggestion that already lost here is reported as such, not repeated), then
    ``then`` (what no knob does: a change to the user's code)."""
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
    if then:
        tip += ("; " if ideas else ": ") + then
    elif not ideas:
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

    def op_share(self, names: tuple[str, ...], phases: tuple[str, ...]) -> float | None:
        """The share of the step the host ops ``names`` took inside ``phases``; ``None``
        for a profile whose top ops do not say where they ran (older than that)."""
        ops = [op for op in self.profile.get("top_ops", []) if op["name"] in names]
        if any("phases" not in op for op in ops):
            return None
        return sum(op["phases"].get(p, 0.0) for op in ops for p in phases)

    @property
    def cpu_count(self) -> int | None:
        """The CPUs of the machine the profile ran on (the cap of ``num_workers``)."""
        found = self.profile.get("cpu_count")
        return found or (self.evidence.cpu_count if self.evidence else None)


def _data_tip(step: Step) -> str | None:
    """Data loading: more workers below the CPU count, else cheaper samples. Never
    ``persistent_workers`` (a trial cannot show it), nor ``prefetch_factor``: a deeper queue
    does not feed a step its workers cannot keep up with."""
    data, c = step.share("data"), step.config
    if data < DATA_SHARE:
        return None
    workers, cpus = c.get("num_workers", 0), step.cpu_count
    cheaper = "make each sample cheaper (the dataset's __getitem__, its transforms, the collate)"
    ideas: list[Idea] = []
    if cpus is not None and workers >= cpus:
        then = f"num_workers is already at the {cpus} CPUs of this machine: {cheaper}"
    else:
        then = "or " + cheaper
        more = "more DataLoader workers" if workers else "DataLoader workers"
        ideas.append((f"{more} (num_workers > {workers})", "num_workers", lambda v: v > workers))
    if workers:
        head = f"the step waits {_pct(data)} of its time for its {workers} DataLoader worker(s)"
    else:
        head = f"data loading takes {_pct(data)} of the step in the training process"
    return _suggest(head, ideas, step.evidence, verb="use" if not workers else "try", then=then)


def _transfer_tip(step: Step) -> str | None:
    """Host-to-device copies (CUDA): pinned memory and non_blocking copies where off."""
    transfer, c = step.share("to_device"), step.config
    if not step.cuda or transfer < TRANSFER_SHARE:
        return None
    ideas: list[Idea] = []
    if not c.get("pin_memory"):
        ideas.append(("pinned memory (pin_memory)", "pin_memory", bool))
    if not c.get("non_blocking"):
        ideas.append(
            (
                "non_blocking copies, which overlap with compute from pinned memory",
                "non_blocking",
                bool,
            )
        )
    then = "" if ideas else "send less per batch (uint8 images normalised on the GPU)"
    head = f"host-to-device copies take {_pct(transfer)} of the step"
    return _suggest(head, ideas, step.evidence, then=then)


def _sync_tip(step: Step) -> str | None:
    """The host waiting for the GPU: only the causes the profile and config show (device
    reads, the fp16 loss scaler, a blocking batch copy); waits with none of them are what
    a GPU-bound step does, and get no advice."""
    sync, c, p = step.share("sync"), step.config, step.profile
    if not step.cuda or sync < SYNC_SHARE:
        return None
    causes = []
    reads = p.get("host_reads_per_step", 0.0)
    if reads > 0:
        causes.append(
            f"{reads:.0f} device-value reads per step (.item(), printing the loss, "
            "bool(tensor)): keep them out of the step, or do them every N steps"
        )
    if c.get("amp_dtype") == "fp16":
        causes.append(
            "the fp16 GradScaler reads its scale every step (bf16 autocast, where the GPU has "
            "it, needs no scaler)"
        )
    copy_wait = p.get("sync_shares", {}).get("to_device", 0.0)
    if copy_wait >= SYNC_SHARE / 2 and not (c.get("non_blocking") and c.get("pin_memory")):
        causes.append(
            f"the batch copy blocks {_pct(copy_wait)} of the step until the GPU is done: "
            "non_blocking copies from pinned memory (pin_memory) let the host run ahead"
        )
    if not causes:
        return None
    return f"the host waits for the GPU {_pct(sync)} of the step: " + "; ".join(causes)


def _launch_tip(step: Step) -> str | None:
    """An idle GPU while the host is not loading data: larger batches, compile, CUDA graphs
    (a larger micro-batch only below a fixed global batch)."""
    busy, c = step.profile.get("device_busy"), step.config
    if not step.cuda or busy is None:
        return None
    data = step.share("data")
    if data >= 1 or busy / (1 - data) >= GPU_BUSY:  # idle while loading data: _data_tip's
        return None
    batch = c.get("batch_size", 0)
    ideas: list[Idea] = []
    fixed = step.evidence.global_batch if step.evidence else None
    if not (fixed and c.get("accumulation_steps", 1) <= 1):
        ideas.append(("a larger batch_size", "batch_size", lambda v: v > batch))
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
    outside = f", {_pct(busy / (1 - data))} outside data loading" if data >= 0.05 else ""
    return _suggest(
        f"the GPU is busy only {_pct(busy)} of the step{outside} (waiting on the host): "
        "fewer, larger kernels cut the per-kernel launch overhead",
        ideas,
        step.evidence,
    )


def _optimizer_tip(step: Step) -> str | None:
    """The optimizer step: a foreach or fused implementation, set_to_none zeroing."""
    optimizer, c = step.share("optimizer"), step.config
    if optimizer < OPTIMIZER_SHARE:
        return None
    ideas: list[Idea] = []
    impl = c.get("optimizer_impl", "default")
    if impl not in ("foreach", "fused"):
        ideas.append(
            (
                "a foreach or fused implementation (optimizer_impl), which updates all "
                "parameters in a few kernels",
                "optimizer_impl",
                lambda v: v in ("foreach", "fused"),
            )
        )
    elif impl == "foreach":
        ideas.append(
            ("the fused implementation (optimizer_impl)", "optimizer_impl", lambda v: v == "fused")
        )
    if c.get("zero_grad_set_to_none") is False:
        ideas.append(
            (
                "zero_grad_set_to_none: true (drops the gradients instead of zeroing them)",
                "zero_grad_set_to_none",
                bool,
            )
        )
    return _suggest(f"the optimizer step takes {_pct(optimizer)} of the step", ideas, step.evidence)


def _compute_tip(step: Step) -> str | None:
    """Forward and backward dominate: autocast, compile, TF32 where off; checkpointing
    off where on."""
    compute, c, cuda = step.share(*COMPUTE_PHASES), step.config, step.cuda
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
    """Copies and conversions in forward and backward (those in data loading are data).
    Autocast is blamed only when the config autocasts; channels_last only when it is on."""
    conversions = step.op_share(CONVERSION_OPS, COMPUTE_PHASES)
    if conversions is None or conversions < CONVERSION_SHARE:
        return None
    c = step.config
    amp = c.get("amp_dtype", "fp32")
    head = (
        f"copies and dtype conversions ({', '.join(CONVERSION_OPS)}) take "
        f"{_pct(conversions)} of the step in forward and backward"
    )
    if amp != "fp32":
        return _suggest(
            f"{head}: {amp} autocast casts the fp32 weights every step, which pays only on "
            f"hardware that computes {amp} natively",
            [("fp32 (amp_dtype: fp32)", "amp_dtype", lambda v: v == "fp32")],
            step.evidence,
        )
    code = "the model's or loss's own .to(), .float() and .contiguous() calls"
    if c.get("channels_last"):
        return _suggest(
            f"{head}: channels_last converts layouts around ops without an NHWC kernel",
            [("channels_last: false", "channels_last", lambda v: not v)],
            step.evidence,
            then=f"or look for {code}",
        )
    return f"{head}: without autocast these are {code} or their gradients; no knob removes them"


def _other_tip(step: Step) -> str | None:
    """Time outside the five timed parts. A trial's loop runs no logging, metrics or
    callbacks there, so this says what ran there (the top ops outside the parts) or that
    the profiler's own bookkeeping blurs the other shares; it suggests no knob."""
    other = step.share("other")
    if other < OTHER_SHARE:
        return None
    head = (
        f"{_pct(other)} of the step ran outside data loading, the copy, forward, backward "
        "and the optimizer step"
    )
    ops = [
        (op["phases"].get("other", 0.0), op["name"])
        for op in step.profile.get("top_ops", [])
        if "phases" in op
    ]
    found = [f"{name} {_pct(share)}" for share, name in sorted(ops, reverse=True) if share >= 0.05]
    if found:
        return f"{head}: the largest ops there are {', '.join(found[:3])} (no knob acts there)"
    return (
        f"{head}: in a trial that is the profiler's own bookkeeping or Python between the "
        "parts (no knob acts there); read the other shares as approximate"
    )


def _padding_tip(step: Step) -> str | None:
    """Padded token positions: length grouping (needs packing off), packing, a smaller
    pad_to_multiple_of; each only where off."""
    padding, c = step.profile.get("padding_share"), step.config
    if padding is None or padding < PADDING_SHARE:
        return None
    ideas: list[Idea] = []
    packed = c.get("packing", "off") != "off"
    if not packed and c.get("length_grouping", "off") == "off":
        ideas.append(
            (
                "length_grouping (batches of samples of similar length)",
                "length_grouping",
                lambda v: v != "off",
            )
        )
    if not packed:
        ideas.append(
            (
                "packing (samples concatenated into rows; causal-LM workloads)",
                "packing",
                lambda v: v != "off",
            )
        )
    multiple = c.get("pad_to_multiple_of", 1)
    if not packed and multiple > 1:
        ideas.append(
            (
                f"a smaller pad_to_multiple_of (now {multiple})",
                "pad_to_multiple_of",
                lambda v: v < multiple,
            )
        )
    head = f"{_pct(padding)} of the token positions are padding, computed for nothing"
    return _suggest(head, ideas, step.evidence)


def _recompile_tip(step: Step) -> str | None:
    """Graphs torch.compile built during the profiled steps (after warm-up): a guard fails
    as the run goes on. The graph count alone is not used: graph breaks make many graphs
    that are built once."""
    recompiles, c = step.profile.get("recompiles"), step.config
    if not recompiles or c.get("compile_mode", "off") == "off":
        return None
    ideas: list[Idea] = []
    if c.get("compile_dynamic") != "true":
        ideas.append(
            (
                "compile_dynamic: true (one graph for all shapes)",
                "compile_dynamic",
                lambda v: v == "true",
            )
        )
    tokens = step.profile.get("padding_share") is not None
    if tokens and c.get("packing", "off") == "off" and c.get("pad_to_multiple_of", 1) == 1:
        ideas.append(
            ("pad_to_multiple_of 64 (fewer distinct shapes)", "pad_to_multiple_of", lambda v: v > 1)
        )
    steps = step.profile.get("profile_steps", 0)
    head = (
        f"torch.compile built {recompiles} new graph(s) in the {steps} profiled steps after "
        "warm-up: it recompiles, most often for a new input shape"
    )
    then = "TORCH_LOGS=recompiles names the guard that fails"
    return _suggest(head, ideas, step.evidence, then=then if not ideas else "")


_PHASE_WORDS = {
    "data": "data loading",
    "to_device": "the copy to the device",
    "compute": "forward and backward",
    "optimizer": "the optimizer step",
    "sync": "waiting on the device",
    "other": "time outside the step's parts",
}


def _largest_phase(step: Step, exclude: tuple[str, ...] = ()) -> tuple[str, float]:
    """The largest part of the step (forward and backward counted together)."""
    shares = dict(step.profile["shares"])
    shares["compute"] = shares.pop("forward", 0.0) + shares.pop("backward", 0.0)
    name, share = max(((k, v) for k, v in shares.items() if k not in exclude), key=lambda kv: kv[1])
    return _PHASE_WORDS.get(name, name), share


def _mfu_tip(step: Step) -> str | None:
    """How far the profiled config is from this machine's measured peak (its MFU, from
    the study): near it, no knob will help much; far from it, where the step goes."""
    found = step.evidence.mfu_of(step.config) if step.evidence else None
    if found is None or not step.profile.get("shares"):
        return None
    mfu, peak = found
    of = f"{_pct(mfu)} of this machine's measured {peak_name(peak)} peak (MFU)"
    if mfu >= HIGH_MFU:
        rest, share = _largest_phase(step, exclude=("compute",))
        rest = (
            f"the rest is {rest} ({_pct(share)} of the step) and the elementwise work the "
            "FLOP count leaves out"
        )
        peaks = dict(step.evidence.peaks)
        own = peaks.get(peak, 0.0)
        higher = [(k, v) for k, v in peaks.items() if v > 1.2 * own and k in ("bf16", "fp16")]
        if not higher:
            return (
                f"compute-bound near the peak, {of}: further knobs will not help much; "
                f"{rest}; beyond that, fewer FLOPs per sample (a smaller model)"
            )
        key, rate = max(higher, key=lambda kv: kv[1])
        idea: Idea = (f"{key} autocast (amp_dtype)", "amp_dtype", lambda v: v == key)
        return _suggest(
            f"compute-bound near the peak, {of}: knobs that keep {peak_name(peak)} will not "
            f"help much ({rest}); {key} has a {rate / own:.1f}x higher measured peak here",
            [idea],
            step.evidence,
        )
    if mfu < LOW_MFU:
        phase, share = _largest_phase(step)
        return (
            f"far from the machine's limit, {of}: the largest part of the step is {phase} "
            f"({_pct(share)}); start there"
        )
    return None


# The rules, in the order their advice is given. Each fires on a threshold above and checks
# the config, the phase its ops ran in and the caps of the knobs it suggests.
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
    _mfu_tip,
)


def advice(profile: dict[str, Any], evidence: Evidence | None = None) -> list[str]:
    """Plain advice from a profile summary: what dominates the step and what to try.

    Each rule of :data:`RULES` fires on a share threshold (module constants); a profile
    that trips none gets one sentence saying so. The profile's ``config`` tailors the
    suggestions (a knob already on is not suggested again), and with the study's
    ``evidence`` a suggestion the study already measured says how it did instead.
    """
    if profile.get("status") != OK:
        return [f"no profile: {profile.get('status')}: {profile.get('reason', '')}"]
    step = Step(profile, profile.get("config", {}), profile.get("device") == "cuda", evidence)
    tips = [tip for rule in RULES if (tip := rule(step)) is not None]
    return tips or ["no single part dominates the step: the config is balanced"]
