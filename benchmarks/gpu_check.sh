#!/usr/bin/env bash
# The GPU check: the `cuda`-marked tests, the trainer exports against the real transformers
# and Lightning, then a real study on the GPU, in one short run.
#
# On the CPU machine (once per session; the wheels are ignored by git):
#     bash benchmarks/gpu_check.sh fetch
# then on the lent GPU machine, in one call of the device tool:
#     run(command="bash benchmarks/gpu_check.sh", carry=[".whl"], timeout_s=600)
# The steps are capped at 210 s (cuda tests) + 60 s (exports) + 270 s (study) + 60 s, so
# the call fits a 15-minute device budget with the machine's start; a capped study keeps
# what it stored.
#
# The GPU image has torch (and pytest, pyyaml, rich, matplotlib, nvidia-ml-py, joblib)
# but no Optuna: `fetch` downloads Optuna and what it needs that the image lacks, as
# Python 3.12 wheels of the versions this checkout's venv runs. The run needs no
# `pip install -e .`: the repository is put on PYTHONPATH, and the trial subprocesses
# (`python -m autotune.trial`) inherit it. Logs and the study's figures go to $OUT (the
# device tool's return folder) or ./gpu-check-out.
set -uo pipefail
cd "$(dirname "$0")/.."

WHEELS=(optuna alembic sqlalchemy colorlog mako)

if [[ "${1:-}" == "fetch" ]]; then
    py="${PYTHON:-.venv/bin/python}"
    mkdir -p .whl
    for name in "${WHEELS[@]}"; do
        version=$("$py" -m pip show "$name" 2>/dev/null | awk '/^Version:/ {print $2}')
        spec="$name${version:+==$version}"
        python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
            --implementation cp --platform manylinux_2_28_x86_64 \
            --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
            -d .whl "$spec" || exit 1
    done
    ls -l .whl
    exit 0
fi

out="${OUT:-gpu-check-out}"
mkdir -p "$out"
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/autotune-site .whl/*.whl || exit 1
    export PYTHONPATH="/tmp/autotune-site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export MPLCONFIGDIR=/tmp/autotune-mpl

{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    python3 -c 'import torch, optuna; print("torch", torch.__version__, "cuda", torch.version.cuda,
        "optuna", optuna.__version__, "gpu", torch.cuda.get_device_name(0))'
} 2>&1 | tee "$out/versions.txt"

start=$(date +%s)
timeout 210 python3 -m pytest -q -m cuda -p no:cacheprovider tests 2>&1 | tee "$out/cuda-tests.log"
tests_rc=${PIPESTATUS[0]}
echo "cuda tests: exit $tests_rc in $(( $(date +%s) - start )) s" | tee -a "$out/summary.txt"

# The image has transformers, accelerate and Lightning: the exports are built for real there.
start=$(date +%s)
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/output/test_export.py 2>&1 \
    | tee "$out/export-tests.log"
export_rc=${PIPESTATUS[0]}
echo "export tests: exit $export_rc in $(( $(date +%s) - start )) s" | tee -a "$out/summary.txt"

start=$(date +%s)
rm -f /tmp/autotune-gpu-check.db
timeout 270 python3 -m autotune run benchmarks/spaces/gpu_check.yaml --out /tmp/gpu-check-runs \
    2>&1 | tee "$out/study.log"
study_rc=${PIPESTATUS[0]}
echo "study: exit $study_rc in $(( $(date +%s) - start )) s" | tee -a "$out/summary.txt"
cp /tmp/gpu-check-runs/gpu_check/best_config.yaml "$out/" 2>/dev/null
timeout 30 python3 -m autotune show benchmarks/spaces/gpu_check.yaml > "$out/show.txt" 2>&1
# NVML's figures of each trial's window: device memory, utilisation, power, energy per
# sample, clocks and throttling (docs/energy.md)
timeout 30 python3 benchmarks/nvml_figures.py benchmarks/spaces/gpu_check.yaml 2>&1 \
    | tee "$out/nvml.txt"
[[ $tests_rc == 0 && $export_rc == 0 && $study_rc == 0 ]]
