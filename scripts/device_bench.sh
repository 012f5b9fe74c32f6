#!/usr/bin/env bash
# The BENCHMARKS.md tables of the reference kernels in one device call (the commands that
# BENCHMARKS.md names), each with its own time limit; tables and JSON go to $OUT:
#   bash scripts/device_bench.sh [STAGE...]   (default: softmax layer_norm dropout gemm;
#                                              needs the Liger wheel under .whl/: carry [".whl"])
source "$(dirname "$0")/_device_env.sh"
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
