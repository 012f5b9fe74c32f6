#!/usr/bin/env bash
# Everything GPU-side in one call on the lent H200 (the device tool runs it from the repo
# root; $OUT comes back). Runs the project in place with the machine's torch and Triton:
#   bash scripts/device_check.sh
# One log, $OUT/gpu_check.log (plugin GPU tests, reference-kernel tests, examples), plus
# $OUT/gpu.txt: with scripts/device_bench.sh in the same call, 8 files, the most a call returns.
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-out}; mkdir -p "$OUT"
LOG=$OUT/gpu_check.log; : > "$LOG"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
section() {  # section TITLE SECONDS CMD...: run CMD with a limit, append its output to $LOG, show its tail
    local title=$1 limit=$2; shift 2
    echo "== $title" | tee -a "$LOG"
    timeout "$limit" "$@" 2>&1 | grep -v USDT > "$OUT/section.tmp"
    cat "$OUT/section.tmp" >> "$LOG"; tail -3 "$OUT/section.tmp"; rm -f "$OUT/section.tmp"
}
section "plugin GPU tests" 300 python3 -m pytest -p pytest_fusioncheck.plugin -p no:cacheprovider -m gpu -q -rs tests/test_gpu.py
section "reference kernel GPU tests" 240 python3 -m pytest -p pytest_fusioncheck.plugin -p no:cacheprovider -q -n 4 \
    --timeout 90 tests/test_ref_softmax.py tests/test_ref_layer_norm.py tests/test_ref_gemm_epilogue.py \
    tests/test_ref_bias_gelu_dropout.py
section "examples on the GPU (xfail demos shown as failures with --runxfail)" 200 python3 -m pytest \
    -p pytest_fusioncheck.plugin -p no:cacheprovider examples --fusion-report -q --runxfail
