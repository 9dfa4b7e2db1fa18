"""Model FLOPs utilisation: how far a config is from this machine's limit.

MFU (the PaLM paper's definition) is the model's FLOPs per second over the device's
peak. Both figures are the probe's, once per study (:mod:`autotune.trial.flops`,
:mod:`autotune.trial.peak`), kept in the study's environment: the model FLOPs of one
step per sample (per real token for token workloads), and the measured matmul peak of
each compute dtype. A config's MFU is :func:`mfu_of`, the one function every view uses.

It is MFU, not HFU: gradient checkpointing's recomputation, padding and packing's EOS
separators do work that is not counted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .config import Config
from .measurement import Measurement

LABEL = "MFU"
# What the figure is, in words, wherever it is shown.
MEANING = (
    "model FLOPs/s over this machine's measured matmul peak; not HFU: recomputation and "
    "padding are not counted"
)
# torch dtype attribute of each dtype name of a peak key.
DTYPE_OF = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}

# Dense (no sparsity) tensor-core peaks, FLOP/s, from NVIDIA's datasheets, by a name
# fragment NVML reports (most specific first). fp32-high is TF32.
_T = 1e12
DATASHEET: tuple[tuple[str, str, dict[str, float]], ...] = (
    (
        "H200",
        "NVIDIA H200 SXM datasheet",
        {"bf16": 989 * _T, "fp16": 989 * _T, "fp32-high": 494 * _T, "fp32": 67 * _T},
    ),
    (
        "H100 PCIe",
        "NVIDIA H100 PCIe datasheet",
        {"bf16": 756 * _T, "fp16": 756 * _T, "fp32-high": 378 * _T, "fp32": 51 * _T},
    ),
    (
        "H100",
        "NVIDIA H100 SXM datasheet",
        {"bf16": 989 * _T, "fp16": 989 * _T, "fp32-high": 494 * _T, "fp32": 67 * _T},
    ),
    (
        "A100",
        "NVIDIA A100 datasheet",
        {"bf16": 312 * _T, "fp16": 312 * _T, "fp32-high": 156 * _T, "fp32": 19.5 * _T},
    ),
    (
        "L40S",
        "NVIDIA L40S datasheet",
        {"bf16": 362 * _T, "fp16": 362 * _T, "fp32-high": 183 * _T, "fp32": 91.6 * _T},
    ),
    (
        "L4",
        "NVIDIA L4 datasheet",
        {"bf16": 121 * _T, "fp16": 121 * _T, "fp32-high": 60 * _T, "fp32": 30.3 * _T},
    ),
    (
        "A10G",
        "NVIDIA A10G datasheet",
        {"bf16": 70 * _T, "fp16": 70 * _T, "fp32-high": 35 * _T, "fp32": 31.2 * _T},
    ),
    ("T4", "NVIDIA T4 datasheet", {"fp16": 65 * _T, "fp32": 8.1 * _T}),
    ("V100", "NVIDIA V100 SXM2 datasheet", {"fp16": 125 * _T, "fp32": 15.7 * _T}),
)


def datasheet_peaks(gpu_name: str) -> dict[str, Any] | None:
    """The datasheet peaks of the GPU NVML calls ``gpu_name``; ``None`` for one unknown."""
    for fragment, source, peaks in DATASHEET:
        if fragment.lower() in gpu_name.lower():
            return {"source": source, "gpu": gpu_name, **peaks}
    return None


def peak_key(config: Config) -> str:
    """The dtype a config's matmuls compute in: ``bf16``/``fp16`` under autocast (or an
    FSDP bf16 param dtype), else ``fp32`` at its matmul precision (``fp32-high``...)."""
    if config.amp_dtype != "fp32":
        return config.amp_dtype
    if config.fsdp != "off" and config.fsdp_policy()[0] == "bf16":
        return "bf16"
    return "fp32" if config.matmul_precision == "highest" else f"fp32-{config.matmul_precision}"


def peak_keys(knobs: dict[str, tuple[Any, ...]], baseline: Config) -> list[str]:
    """Every peak key a config of the space can need: the probe measures these."""
    keys = {peak_key(baseline)}
    for amp in knobs.get("amp_dtype", ()):
        if amp != "fp32":
            keys.add(amp)
    for precision in knobs.get("matmul_precision", ()):
        keys.add("fp32" if precision == "highest" else f"fp32-{precision}")
    if "bf16" in knobs.get("fsdp_param_dtype", ()):
        keys.add("bf16")
    keys.add("fp32")
    order = ["fp32", "fp32-high", "fp32-medium", "bf16", "fp16"]
    return sorted(keys, key=lambda k: order.index(k) if k in order else len(order))


def peak_name(key: str) -> str:
    """``fp32-high`` -> ``fp32 (matmul_precision high)``."""
    dtype, _, precision = key.partition("-")
    return f"{dtype} (matmul_precision {precision})" if precision else dtype


@dataclass(frozen=True)
class Mfu:
    """One config's MFU: ``flops_per_s`` (model FLOPs/s) over the measured peak of the
    dtype it computes in (``peak``, a key of the environment's ``peak_flops``);
    ``datasheet`` over the datasheet peak, when the GPU is known."""

    mfu: float
    flops_per_s: float
    peak: str
    peak_flops_per_s: float
    datasheet: float | None = None

    def text(self) -> str:
        """``38% bf16``: the figure and its peak."""
        return f"{percent(self.mfu)} {self.peak}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "mfu": round(self.mfu, 4),
            "model_flops_per_s": self.flops_per_s,
            "peak": self.peak,
            "peak_flops_per_s": self.peak_flops_per_s,
            "mfu_of_datasheet_peak": None if self.datasheet is None else round(self.datasheet, 4),
            "kind": f"{LABEL}: {MEANING}",
        }


def model_flops(environment: dict[str, Any]) -> dict[str, Any]:
    """The probe's model FLOPs record (``{}`` for a study from before it existed)."""
    return environment.get("model_flops") or {}


def shown(environment: dict[str, Any]) -> bool:
    """Whether views show MFU: the probe counted (or tried to count) the model FLOPs."""
    return bool(model_flops(environment))


def measured_peak(environment: dict[str, Any], key: str) -> float | None:
    """The measured peak (FLOP/s) of ``key``; an fp32 precision that was not measured
    (it changes nothing here) falls back to plain fp32."""
    peaks = environment.get("peak_flops") or {}
    found = peaks.get(key) or (peaks.get("fp32") if key.startswith("fp32-") else None)
    return (found or {}).get("flops_per_s")


def mfu_of(m: Measurement, config: Config, environment: dict[str, Any]) -> Mfu | None:
    """A config's MFU from its measurement and the study's environment, or ``None``
    (not ok, no rate, FLOPs or peak unknown, or counted in another unit).

    The model FLOPs/s are the FLOPs per unit times the rate the objective counts
    (samples/s, or real tokens/s); the peak is the measured one of the dtype the config
    computes in, times the processes of a multi-GPU config (one device each).
    """
    flops = model_flops(environment)
    per_unit, rate = flops.get("per_unit"), m.rate
    if not (m.ok and per_unit and rate) or flops.get("unit") != m.unit:
        return None
    key = peak_key(config)
    peak = measured_peak(environment, key)
    if not peak:
        return None
    devices = config.world_size if environment.get("device") == "cuda" else 1
    achieved = per_unit * rate
    sheet = (environment.get("datasheet_flops") or {}).get(key)
    return Mfu(
        mfu=achieved / (peak * devices),
        flops_per_s=achieved,
        peak=key,
        peak_flops_per_s=peak * devices,
        datasheet=achieved / (sheet * devices) if sheet else None,
    )


def unavailable(environment: dict[str, Any]) -> str | None:
    """Why no config of the study has an MFU, in one line; ``None`` when they can, or
    when the study was probed before autotune counted FLOPs (its views show no MFU)."""
    flops = model_flops(environment)
    if not flops:
        return None
    if flops.get("per_unit") is None:
        return flops.get("reason") or "the model FLOPs were not counted"
    if not any("flops_per_s" in p for p in (environment.get("peak_flops") or {}).values()):
        return "the machine's peak was not measured"
    return None


def flops_text(x: float) -> str:
    """``1.23 GFLOP`` (also for rates, with ``/s`` added by the caller)."""
    for unit, scale in (("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6), ("kFLOP", 1e3)):
        if x >= scale:
            return f"{x / scale:.3g} {unit}"
    return f"{x:.3g} FLOP"


def peaks_text(environment: dict[str, Any]) -> str:
    """``measured fp32 97.1 GFLOP/s, bf16 1.3 GFLOP/s (matmul 512: larger ones too
    slow)``: the measured peaks (the size named where :data:`autotune.trial.peak.SIZE_S`
    stopped the doubling), and the datasheet's on a known GPU."""
    parts = []
    for key, found in (environment.get("peak_flops") or {}).items():
        if "flops_per_s" in found:
            part = f"{peak_name(key)} {flops_text(found['flops_per_s'])}/s"
            if found.get("capped"):
                part += f" (matmul {found['size']}: larger ones too slow)"
            parts.append(part)
        else:
            parts.append(f"{peak_name(key)}: {found.get('error', 'not measured')}")
    text = "measured " + ", ".join(parts)
    sheet = environment.get("datasheet_flops")
    if sheet:
        figures = ", ".join(
            f"{peak_name(k)} {flops_text(v)}/s"
            for k, v in sheet.items()
            if isinstance(v, (int, float))
        )
        text += f"; datasheet ({sheet['source']}, dense) {figures}"
    return text


def describe(environment: dict[str, Any]) -> str | None:
    """What the study's MFU stands on, in one line: the model FLOPs and the peaks;
    ``None`` without them (see :func:`unavailable` for why)."""
    if not shown(environment) or unavailable(environment):
        return None
    flops = model_flops(environment)
    unit = "real token" if flops["unit"] == "tokens" else "sample"
    text = (
        f"the model computes {flops_text(flops['per_unit'])} per {unit} per step "
        "(torch's FlopCounterMode: matmuls, convolutions, attention; forward and backward)"
    )
    ratio = flops.get("padded_ratio")
    if ratio:
        text += f"; the baseline's padded micro-batch computes {ratio:.2f}x its real tokens' FLOPs"
    return f"{text}; {peaks_text(environment)}"


def percent(share: float) -> str:
    """An MFU as a percentage: whole percent, or two significant digits under 1% (a tiny
    model's 0.06% is not 0%)."""
    return f"{share:.0%}" if share >= 0.01 or share == 0 else f"{share * 100:.2g}%"
