#!/usr/bin/env bash
# Times the reference-kernel variants prepared offline (softmax wide-row plans, layer-norm
# backward `lean`, dropout `lean`, GEMM configs and GELU fits) in one device call, after their GPU tests:
#   bash scripts/device_variants.sh [STAGE...]   (default: every stage; the device tool runs it
#                                                 from the repo root)
# Stages: tests, dropout, ln_fwd, ln_bwd, softmax_wide, gemm.
# Needs the Liger wheel under .whl/ (carry [".whl"]). Each stage has its own time limit so a
# hang in one cannot eat the call; logs and JSON go to $OUT.
source "$(dirname "$0")/_device_env.sh"
run_stage() {
    case $1 in
    tests) stage kernel_tests 200 python3 -m pytest -p pytest_fusioncheck.plugin -p no:cacheprovider -q -n 8 --timeout 90 \
        tests/test_ref_softmax.py tests/test_ref_layer_norm.py tests/test_ref_bias_gelu_dropout.py \
        tests/test_ref_gemm_epilogue.py ;;
    dropout) stage dropout 80 python3 benchmarks/bench_bias_gelu_dropout.py --quick --variants ;;
    ln_fwd) stage ln_fwd 120 python3 benchmarks/bench_layer_norm.py --quick --sweep --passes forward --impls ours \
        --widths 16384,65536 --json "$OUT/ln_fwd.json" ;;
    ln_bwd) stage ln_bwd 120 python3 benchmarks/bench_layer_norm.py --quick --sweep --passes backward --impls ours,torch,compile \
        --json "$OUT/ln_bwd.json" ;;
    softmax_wide) stage softmax_wide 150 python3 benchmarks/bench_softmax.py --quick --sweep --widths 65536,262144 \
        --impls ours,liger --json "$OUT/softmax_wide.json" ;;
    gemm) stage gemm 300 python3 benchmarks/bench_gemm_epilogue.py --quick --variants ;;
    *) echo "unknown stage $1" >&2; return 2 ;;
    esac
}
for name in ${@:-tests dropout ln_fwd ln_bwd softmax_wide}; do run_stage "$name"; done
