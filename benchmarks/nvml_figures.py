"""Print the window telemetry of every trial of a stored study: NVML's device memory of
the process beside the allocator's peak, SM utilisation, power, the SM clock, energy per
sample and the throttle reasons (docs/energy.md). Runs nothing.

    python benchmarks/nvml_figures.py benchmarks/spaces/gpu_check.yaml
"""

from __future__ import annotations

import sys

from autotune import load_space
from autotune.output.facts import energy_text, fmt_bytes
from autotune.study.storage import load_result


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[-1].strip())
        return 2
    _, result = load_result(load_space(argv[0]))
    why = result.environment.get("energy_unavailable")
    if why:
        print(f"energy: not available here: {why}")
    for t in result.trials:
        m = t.measurement
        if m.samples_per_s is None:
            continue
        print(
            f"#{t.number} {t.config.short()}: peak {fmt_bytes(m.peak_mem_bytes)}"
            f" · NVML process {fmt_bytes(m.gpu_proc_mem_max_bytes)}"
            f" (device used {fmt_bytes(m.gpu_mem_used_max_bytes)})"
            f" · SM util median {_num(m.sm_util_median_pct, '.0f')}%"
            f" · power median {_num(m.power_median_w, '.0f')} W max {_num(m.power_max_w, '.0f')} W"
            f" · SM clock median {_num(m.sm_clock_median_mhz, '.0f')} min"
            f" {_num(m.sm_clock_min_mhz, '.0f')} MHz"
            f" · energy {_num(m.energy_j, '.1f')} J over {_num(m.energy_s, '.2f')} s"
            f" ({m.energy_source or '-'}) · {energy_text(m) or '-'}"
            f" · throttled {m.throttled if m.throttled is not None else '-'}"
            f" · CPU cores busy {_num(m.cpu_util_cores, '.2f')}"
            f" · samples {m.telemetry_samples or 0}"
            + (f" · missing: {'; '.join(m.telemetry_missing)}" if m.telemetry_missing else "")
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
