#!/usr/bin/env bash
# The GPU session's one command (benchmarks/gpu/README.md): runs benchmarks/gpu/check.py on the GPU
# and leaves the JSON and the log in OUT_DIR (default: $OUT, the device tool's folder, else .).
#
#   bash benchmarks/gpu/check.sh [OUT_DIR] [check.py flags...]
#
# Python: .venv/bin/python when it exists (a machine with the project installed), else python3 (the
# lent GPU machines' image holds torch, transformers, accelerate and peft but not gymnasium: carry
# its wheels in .whl/, installed here first). envrl itself runs from this checkout (PYTHONPATH), so
# the evaluation's worker processes import the same code.
set -o pipefail
cd "$(dirname "$0")/../.."
out_dir=${1:-${OUT:-.}}
shift || true
mkdir -p "$out_dir"
if [ -x .venv/bin/python ]; then
    python=.venv/bin/python
else
    python=python3
    if compgen -G ".whl/*.whl" >/dev/null; then
        "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target /tmp/site .whl/*.whl || exit 1
        export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
    fi
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | tee "$out_dir/gpu.txt"
# 540 s: inside the device tool's 600 s limit, so the JSON written after each stage comes back
timeout 540 "$python" benchmarks/gpu/check.py --out "$out_dir/gpu_check.json" "$@" 2>&1 | tee "$out_dir/gpu_check.log"
