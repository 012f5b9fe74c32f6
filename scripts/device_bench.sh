#!/usr/bin/env bash
# The BENCHMARKS.md tables of the reference kernels in one device call (the commands that
# BENCHMARKS.md names), each with its own time limit; tables and JSON go to $OUT:
#   bash scripts/device_bench.sh [STAGE...]   (default: softmax layer_norm dropout gemm;
#                                              needs the Liger wheel under .whl/: carry [".whl"])
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/gpu.txt"
stage() {  # stage NAME SECONDS CMD...: run CMD with a limit, log to $OUT/NAME.txt, show its tail
    local name=$1 limit=$2; shift 2
    echo "== $name"; local t0=$SECONDS
    timeout "$limit" "$@" 2>&1 | grep -v USDT > "$OUT/$name.txt"
    echo "rc=${PIPESTATUS[0]} ${name} took $((SECONDS - t0)) s" | tee -a "$OUT/$name.txt"
    tail -3 "$OUT/$name.txt"
}
run_stage() {
    case $1 in
    softmax) stage softmax 170 python3 benchmarks/bench_softmax.py --quick --impls ours,torch,compile,liger --json "$OUT/softmax.json" ;;
    layer_norm) stage layer_norm 200 python3 benchmarks/bench_layer_norm.py --quick --impls ours,torch,compile,liger \
        --json "$OUT/layer_norm.json" ;;
    dropout) stage dropout 60 python3 benchmarks/bench_bias_gelu_dropout.py --quick ;;
    gemm) stage gemm 140 python3 benchmarks/bench_gemm_epilogue.py --quick ;;
    *) echo "unknown stage $1" >&2; return 2 ;;
    esac
}
for name in ${@:-softmax layer_norm dropout gemm}; do run_stage "$name"; done
