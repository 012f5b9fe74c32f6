# Sourced by scripts/device_bench.sh and scripts/device_variants.sh: the shared set-up of a
# device call (Liger from the carried wheel, the repository on PYTHONPATH, the GPU's clocks in
# $OUT/gpu.txt) and `stage`, which runs one step with its own time limit.
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
    tail -4 "$OUT/$name.txt"
}
