#!/usr/bin/env bash
# The GPU-side checks in one go, on any machine with a CUDA GPU: the plugin's `gpu`-marked
# tests, the reference kernels' tests (natively, not under the interpreter), the examples,
# then the benchmarks behind BENCHMARKS.md. Runs the repository in place (it need not be
# installed) with the Python environment's torch and Triton.
#
#   bash scripts/gpu_check.sh [--out DIR] [--sweep] [STAGE ...]
#
#   --out DIR   logs, tables and JSON go here (default: ./gpu-results)
#   --sweep     the kernel benchmarks also time their launch-plan variants (--sweep /
#               --variants): the sweeps behind docs/kernels.md; the width sweep takes every
#               multiple of 64 to 16384 (--dense: issue 12's list, ~6 minutes on an H200)
#   STAGE       plugin kernels examples softmax layer_norm dropout gemm attention decode
#               overhead eager host ops tuning peak models sweep (the default: all of these), and fidelity (opt-in: needs Nsight Compute;
#               writes DIR/fidelity_h200.json, to copy to tests/data/ when the model changes)
#
# DIR/environment.txt names the GPU and versions; the test stages log to DIR/<stage>.log,
# each benchmark to DIR/<script>.txt (and .json); DIR/summary.txt has every stage's exit
# status. Liger-Kernel, if installed (or carried in .whl/), is one more anchor in the softmax and layer-norm
# tables. PYTHON picks the interpreter (default python3). Exit status 1 if a stage failed.
set -uo pipefail

OUT=gpu-results SWEEP=0 STAGES=()
while [ $# -gt 0 ]; do
    case $1 in
    --out) OUT=${2:?--out needs a directory}; shift 2 ;;
    --out=*) OUT=${1#--out=}; shift ;;
    --sweep) SWEEP=1; shift ;;
    -h | --help) sed -n '2,/^set -uo/{/^set -uo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    -*) echo "gpu_check.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) STAGES+=("$1"); shift ;;
    esac
done
[ ${#STAGES[@]} -gt 0 ] || STAGES=(plugin kernels examples softmax layer_norm dropout gemm attention decode overhead eager host ops tuning peak models sweep)

mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd) || exit 2
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO" || exit 2
PY=${PYTHON:-python3}
export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1

# Wheels carried to a GPU machine that reaches no registry (an ignored .whl/ at the repository root: nvtx, Liger-Kernel
# for the anchor columns) go into this interpreter, without their dependencies: through "$PY -m pip", since a bare pip
# may belong to another Python than the one that runs the benchmarks.
if compgen -G "$REPO/.whl/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-deps "$REPO"/.whl/*.whl 2>/dev/null || echo "gpu_check.sh: a wheel in .whl/ did not install"
fi

# Load the plugin by name only when it is not installed (loading it twice is an error).
PYTEST=("$PY" -m pytest -p no:cacheprovider)
"$PY" -c "import importlib.metadata as m, sys; sys.exit(not any(e.name == 'fusioncheck' for e in m.entry_points(group='pytest11')))" \
    || PYTEST+=(-p pytest_fusioncheck.plugin)
# The kernel tests wait on other programs (split rows): a hang must fail, not stall the run.
KERNEL_OPTS=()
"$PY" -c "import xdist" 2>/dev/null && KERNEL_OPTS+=(-n 4)
"$PY" -c "import pytest_timeout" 2>/dev/null && KERNEL_OPTS+=(--timeout 300)

{
    nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader 2>/dev/null || echo "nvidia-smi: not found"
    "$PY" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.cuda.is_available())"
} | tee "$OUT/environment.txt"

logged() {  # logged NAME CMD...: run CMD, its output to the terminal and DIR/NAME.log
    local name=$1; shift
    "$@" 2>&1 | tee "$OUT/$name.log"
    return "${PIPESTATUS[0]}"
}

sweep() {  # sweep FLAG: FLAG when --sweep was given
    [ "$SWEEP" = 1 ] && echo "$1"
}

run_stage() {
    case $1 in
    plugin) logged plugin "${PYTEST[@]}" -m gpu -q tests --ignore-glob='tests/test_ref_*' ;;
    kernels) logged kernels "${PYTEST[@]}" -q ${KERNEL_OPTS[@]+"${KERNEL_OPTS[@]}"} tests/test_ref_*.py ;;
    # The two demo regressions are xfail(strict=True); --runxfail shows their failure messages.
    examples) logged examples "${PYTEST[@]}" -q examples --fusion-report ;;
    softmax) "$PY" benchmarks/bench_softmax.py --quick --out "$OUT" $(sweep --sweep) ;;
    layer_norm) "$PY" benchmarks/bench_layer_norm.py --quick --out "$OUT" $(sweep --sweep) ;;
    dropout) "$PY" benchmarks/bench_bias_gelu_dropout.py --quick --out "$OUT" $(sweep --variants) ;;
    gemm) "$PY" benchmarks/bench_gemm_epilogue.py --quick --out "$OUT" $(sweep --variants) ;;
    attention) "$PY" benchmarks/bench_attention.py --quick --out "$OUT" $(sweep --variants) && { [ "$SWEEP" = 0 ] ||
        "$PY" benchmarks/bench_attention.py --ws-variants --width 768 --tokens 8192 --json "$OUT/bench_attention_ws.json"; } ;;
    decode) "$PY" benchmarks/bench_decode.py --out "$OUT" ;;
    overhead) "$PY" benchmarks/bench_overhead.py --device cuda --out "$OUT" ;;
    eager) "$PY" benchmarks/bench_eager.py --quick --out "$OUT" ;;
    host) "$PY" benchmarks/bench_host.py --out "$OUT" && "$PY" benchmarks/bench_host.py --python --out "$OUT" ;;
    ops) "$PY" benchmarks/bench_ops.py --out "$OUT" ;;
    tuning) "$PY" benchmarks/bench_tuning.py --out "$OUT" ;;
    peak) "$PY" benchmarks/bench_peak.py --out "$OUT" --write-data "$OUT/peak_h200.json" ;;
    models) "$PY" benchmarks/model_counts.py --out "$OUT" --write-data "$OUT/model_counts_h200.json" ;;
    sweep) "$PY" benchmarks/sweep.py --subjects softmax,layer_norm_fwd,layer_norm_bwd --out "$OUT" $(sweep --dense) ;;
    fidelity) "$PY" benchmarks/fidelity.py --out "$OUT" --write-data "$OUT/fidelity_h200.json" ;;
    *) echo "gpu_check.sh: unknown stage $1 (see --help)" >&2; return 2 ;;
    esac
}

failed=0
: > "$OUT/summary.txt"
for stage in "${STAGES[@]}"; do
    echo "== $stage"
    start=$SECONDS
    run_stage "$stage"
    rc=$?
    echo "$stage: exit $rc, $((SECONDS - start)) s" | tee -a "$OUT/summary.txt"
    [ "$rc" = 0 ] || failed=1
done
echo "results in $OUT"
exit "$failed"
