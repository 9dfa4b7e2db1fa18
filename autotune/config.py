"""A concrete training configuration: one value for every knob."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from .errors import AutotuneError
from .knobs import KNOBS


@dataclass(frozen=True)
class Config:
    """One value per knob. This is what a trial measures and what :func:`autotune.training` applies.

    ``batch_size`` is the micro-batch; one optimizer step sees
    ``batch_size * accumulation_steps`` samples (:attr:`global_batch`).
    """

    batch_size: int = KNOBS["batch_size"].default
    accumulation_steps: int = KNOBS["accumulation_steps"].default
    amp_dtype: str = KNOBS["amp_dtype"].default
    num_workers: int = KNOBS["num_workers"].default
    cudnn_benchmark: bool = KNOBS["cudnn_benchmark"].default
    compile_mode: str = KNOBS["compile_mode"].default
    gradient_checkpointing: bool = KNOBS["gradient_checkpointing"].default
    world_size: int = KNOBS["world_size"].default
    ddp_bucket_cap_mb: int = KNOBS["ddp_bucket_cap_mb"].default
    ddp_gradient_as_bucket_view: bool = KNOBS["ddp_gradient_as_bucket_view"].default
    ddp_static_graph: bool = KNOBS["ddp_static_graph"].default

    def __post_init__(self) -> None:
        for name in KNOBS:
            try:
                object.__setattr__(self, name, KNOBS[name].normalize(getattr(self, name)))
            except ValueError as e:
                raise AutotuneError(f"config: {name} {e}") from None
        values = self.to_dict()
        for name, knob in KNOBS.items():
            if values[name] != knob.default:
                reason = knob.requires(values)
                if reason:
                    raise AutotuneError(f"config: {name}={values[name]} {reason}")

    @property
    def global_batch(self) -> int:
        """Samples per optimizer step, over all DDP processes."""
        return self.batch_size * self.accumulation_steps * self.world_size

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Config:
        """Build a config from a mapping; unknown keys are an error, missing keys take defaults."""
        unknown = sorted(set(values) - set(KNOBS))
        if unknown:
            raise AutotuneError(f"config: unknown knob(s) {', '.join(unknown)}")
        return cls(**values)

    def replace(self, **changes: Any) -> Config:
        return dataclasses.replace(self, **changes)

    def key(self) -> str:
        """A stable string identifying this config (used to skip re-running it)."""
        return ",".join(f"{k}={v}" for k, v in sorted(self.to_dict().items()))

    def short(self) -> str:
        """A compact human form: the micro-batch, then every knob that is not at its default."""
        parts = [f"bs={self.batch_size}"]
        for name, value in self.to_dict().items():
            if name == "batch_size" or value == KNOBS[name].default:
                continue
            short = _SHORT.get(name, name)
            parts.append(short if value is True else f"{short}={value}")
        return " ".join(parts)


_SHORT = {
    "accumulation_steps": "acc",
    "amp_dtype": "amp",
    "num_workers": "workers",
    "compile_mode": "compile",
    "gradient_checkpointing": "ckpt",
    "cudnn_benchmark": "cudnn_bench",
    "world_size": "ddp",
    "ddp_bucket_cap_mb": "bucket_mb",
    "ddp_gradient_as_bucket_view": "grad_view",
    "ddp_static_graph": "static_graph",
}


def load_config(path: str) -> Config:
    """Load the ``config:`` section of a ``best_config.yaml`` (or a plain mapping file)."""
    from pathlib import Path

    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as e:
        raise AutotuneError(f"{path}: cannot read config: {e}") from None
    if isinstance(data, dict) and isinstance(data.get("config"), dict):
        data = data["config"]
    if not isinstance(data, dict):
        raise AutotuneError(f"{path}: must hold a mapping of knob values")
    return Config.from_dict(data)
