"""Run chosen reference kernels once each inside a cudaProfilerStart/Stop range, for Nsight Compute.

Each case is compiled and warmed up outside the range, then launched once inside it, inside
an NVTX range named after the case, so that ncu's ``--profile-from-start off`` profiles just
that launch (and ``--nvtx`` names it). Used for the stall and occupancy figures in
docs/kernels.md:

    ncu --clock-control none --profile-from-start off --nvtx \
        --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
        --section SchedulerStats --section MemoryWorkloadAnalysis \
        python3 benchmarks/ncu_kernels.py [--out DIR] [CASE ...]        (default: every case)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from benchmarks._common import add_out_option, require_cuda, write_output_to  # noqa: E402
from reference_kernels import bias_gelu_dropout as bgd  # noqa: E402
from reference_kernels import gemm_epilogue, layer_norm, softmax  # noqa: E402


FILL_BYTES = 2**27  # rows of None: as many as fill 128 MiB (2^26 16-bit or 2^25 fp32 elements)


def _inputs(m, n, dtype):
    """(m, n) normal values on the GPU; ``m`` None: the rows of ``FILL_BYTES``."""
    rows = FILL_BYTES // (n * dtype.itemsize) if m is None else m
    return torch.randn(rows, n, device="cuda", dtype=dtype)


def _softmax(m, n, dtype):
    x = _inputs(m, n, dtype)
    return lambda: softmax.fused(x)


def _ln_backward(m, n, dtype):
    x = _inputs(m, n, dtype)
    w = torch.randn(n, device="cuda", dtype=dtype)
    b = torch.randn(n, device="cuda", dtype=dtype)
    _, mean, rstd = layer_norm.forward(x, w, b)
    dy = torch.randn_like(x)
    return lambda: layer_norm.backward(dy, x, w, mean, rstd)


def _ln_forward(m, n, dtype):
    x = _inputs(m, n, dtype)
    w = torch.randn(n, device="cuda", dtype=dtype)
    b = torch.randn(n, device="cuda", dtype=dtype)
    return lambda: layer_norm.forward(x, w, b)


def _gemm(m, k, n, activation="gelu", approximate="none", impl="ours"):
    """GEMM + bias + activation at (m, k, n), bf16; impl "ours" (the bucket tunes in the warm-up
    call), "mm" (cuBLAS, no epilogue) or "addmm_act" (cuBLASLt's bias + tanh-GELU epilogue)."""
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16) / k**0.5
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    if impl == "mm":
        return lambda: torch.mm(a, b)
    if impl == "addmm_act":
        return lambda: torch._addmm_activation(bias, a, b, use_gelu=True)
    return lambda: gemm_epilogue.fused(a, b, bias if activation else None, activation, approximate=approximate)


def _dropout(p, variant):
    x = _inputs(16384, 8192, torch.bfloat16)
    bias = torch.randn(8192, device="cuda", dtype=torch.bfloat16)
    return lambda: bgd._launch(x, bias, p, 1, variant=variant)


CASES = {
    "dropout_lean": lambda: _dropout(0.1, "lean"),
    "dropout_lean_p0": lambda: _dropout(0.0, "lean"),
    "dropout_measured_p0": lambda: _dropout(0.0, "measured"),
    "softmax_fp32_65536": lambda: _softmax(2048, 65536, torch.float32),
    "softmax_bf16_65536": lambda: _softmax(2048, 65536, torch.bfloat16),
    "softmax_fp32_16384": lambda: _softmax(8192, 16384, torch.float32),
    # ragged widths (docs/kernels.md, "Ragged rows") against an aligned row of the same block
    "softmax_fp32_8191": lambda: _softmax(4096, 8191, torch.float32),
    "softmax_fp32_8704": lambda: _softmax(4096, 8704, torch.float32),
    "softmax_bf16_12345": lambda: _softmax(4096, 12345, torch.bfloat16),
    "softmax_bf16_17000": lambda: _softmax(4096, 17000, torch.bfloat16),
    # the held plan: whole rows three programs an SM, and rows in four slices (docs/kernels.md, "Rows held in shared
    # memory")
    "softmax_bf16_30522": lambda: _softmax(2048, 30522, torch.bfloat16),
    "softmax_bf16_128256": lambda: _softmax(512, 128256, torch.bfloat16),
    # rows in slices still under 80% (docs/kernels.md, "Rows in slices"): the exchange's wait, the counters' fill
    "softmax_bf16_74988": lambda: _softmax(1024, 74988, torch.bfloat16),
    "softmax_bf16_117344": lambda: _softmax(512, 117344, torch.bfloat16),
    "softmax_fp32_30522": lambda: _softmax(2048, 30522, torch.float32),
    # narrow rows (2^26 elements): width 3 ran at 8% of copy, torch's kernel beside it; 8 is a
    # MoE router's width; 1023 / 1024 a ragged 16-bit row and its aligned neighbour
    "softmax_bf16_3": lambda: _softmax(None, 3, torch.bfloat16),
    "torch_softmax_bf16_3": lambda: (lambda x: lambda: torch.softmax(x, -1))(_inputs(None, 3, torch.bfloat16)),
    "softmax_bf16_8": lambda: _softmax(2**23, 8, torch.bfloat16),
    "softmax_bf16_1023": lambda: _softmax(65536, 1023, torch.bfloat16),
    "softmax_bf16_1024": lambda: _softmax(65536, 1024, torch.bfloat16),
    "ln_bwd_bf16_1024": lambda: _ln_backward(131072, 1024, torch.bfloat16),
    "ln_bwd_bf16_4096": lambda: _ln_backward(32768, 4096, torch.bfloat16),
    "ln_bwd_bf16_8192": lambda: _ln_backward(8192, 8192, torch.bfloat16),
    # ragged layer-norm rows (docs/kernels.md, "layer_norm: forward") against aligned 4096
    "ln_fwd_fp32_4097": lambda: _ln_forward(8192, 4097, torch.float32),
    "ln_fwd_bf16_4097": lambda: _ln_forward(16384, 4097, torch.bfloat16),
    "ln_fwd_bf16_4096": lambda: _ln_forward(16384, 4096, torch.bfloat16),
    "softmax_bf16_4097": lambda: _softmax(16384, 4097, torch.bfloat16),
    # the staged softmax plan (docs/kernels.md, "The staged plan"): 16-bit pipelined walk, fp32 one program a row
    "softmax_bf16_32768": lambda: _softmax(4096, 32768, torch.bfloat16),
    "softmax_fp32_32768": lambda: _softmax(2048, 32768, torch.float32),
    # the pipelined phased backward's open cliffs (docs/kernels.md, "layer_norm: backward"): 8192 lanes for
    # 4608 columns, and a one-vector tail piece (4096 + 8) read by 2-byte loads
    "ln_bwd_bf16_4608": lambda: _ln_backward(16384, 4608, torch.bfloat16),
    "ln_bwd_bf16_4097": lambda: _ln_backward(16384, 4097, torch.bfloat16),
    # issue 12's open 16-bit misses: aligned rows that leave their tile's lanes empty (forward 8704-14848
    # on 16384 lanes, backward 4097-7680 in two pieces or on 8192 lanes, softmax 8704 as 8192 + 512),
    # unaligned forward rows on the walk; 16384 / 8192 the full tiles beside them
    "softmax_bf16_8704": lambda: _softmax(8192, 8704, torch.bfloat16),
    "ln_fwd_bf16_10240": lambda: _ln_forward(8192, 10240, torch.bfloat16),
    "ln_fwd_bf16_12288": lambda: _ln_forward(8192, 12288, torch.bfloat16),
    "ln_fwd_bf16_16384": lambda: _ln_forward(8192, 16384, torch.bfloat16),
    "ln_fwd_bf16_5121": lambda: _ln_forward(16384, 5121, torch.bfloat16),
    # aligned 16-bit rows under 4096 held on a power-of-two tile: 1280 (2048 lanes), 2560 (4096)
    "ln_fwd_bf16_1280": lambda: _ln_forward(65536, 1280, torch.bfloat16),
    "ln_fwd_fp16_1280": lambda: _ln_forward(65536, 1280, torch.float16),
    "ln_fwd_bf16_2560": lambda: _ln_forward(32768, 2560, torch.bfloat16),
    "ln_bwd_bf16_5120": lambda: _ln_backward(16384, 5120, torch.bfloat16),
    "ln_bwd_bf16_6144": lambda: _ln_backward(16384, 6144, torch.bfloat16),
    "ln_bwd_bf16_7168": lambda: _ln_backward(16384, 7168, torch.bfloat16),
    # rows laid flat (docs/kernels.md, "Rows laid flat"): five rows a window of 32 segments; 3072, which stays on
    # the rows plan (two rows in 24 of 32 segments lost there)
    "ln_bwd_bf16_1536": lambda: _ln_backward(32768, 1536, torch.bfloat16),
    "ln_bwd_bf16_3072": lambda: _ln_backward(16384, 3072, torch.bfloat16),
    # the GEMM epilogue at K = 768 (docs/kernels.md, "gemm_epilogue"): ours with each epilogue, and cuBLAS
    "gemm_bf16_2048x768x3072": lambda: _gemm(2048, 768, 3072),
    "gemm_bf16_2048x768x3072_tanh": lambda: _gemm(2048, 768, 3072, approximate="tanh"),
    "gemm_bf16_2048x768x3072_none": lambda: _gemm(2048, 768, 3072, activation=None),
    "mm_bf16_2048x768x3072": lambda: _gemm(2048, 768, 3072, impl="mm"),
    "addmm_act_bf16_2048x768x3072": lambda: _gemm(2048, 768, 3072, impl="addmm_act"),
    # skinny outputs (N = 768, K = 3072): 48 tiles of 128x128 for 132 SMs, so split-K (two launches)
    "gemm_bf16_1024x3072x768": lambda: _gemm(1024, 3072, 768),
    "mm_bf16_1024x3072x768": lambda: _gemm(1024, 3072, 768, impl="mm"),
    # issue 12's narrow misses without a profile before: a MoE router's 160 experts and 600 (two pieces lost), 66 and
    # 333 (twice-odd and odd rows on aligned vectors), layer-norm forward 1088 (aligned, 1024 + 64) and backward 1025
    "softmax_bf16_160": lambda: _softmax(None, 160, torch.bfloat16),
    "softmax_bf16_600": lambda: _softmax(None, 600, torch.bfloat16),
    "softmax_bf16_66": lambda: _softmax(None, 66, torch.bfloat16),
    "softmax_bf16_333": lambda: _softmax(None, 333, torch.bfloat16),
    "ln_fwd_bf16_1088": lambda: _ln_forward(None, 1088, torch.bfloat16),
    "ln_bwd_bf16_1025": lambda: _ln_backward(2**25 // 1025, 1025, torch.bfloat16),
    # softmax rows held in shared memory (the held plan): GPT-2's vocabulary and its aligned neighbour
    "softmax_bf16_50257": lambda: _softmax(4096, 50257, torch.bfloat16),
    "softmax_bf16_50304": lambda: _softmax(4096, 50304, torch.bfloat16),
    # rows held in shared memory, layer norm (docs/kernels.md, "Rows held in shared memory (backward)"): a ragged row
    # of five 1024-element segments forward and backward, and 7001 forward
    "ln_bwd_bf16_5113": lambda: _ln_backward(16384, 5113, torch.bfloat16),
    "ln_fwd_bf16_7001": lambda: _ln_forward(16384, 7001, torch.bfloat16),
    "ln_fwd_fp32_65536": lambda: _ln_forward(2048, 65536, torch.float32),
    "ln_fwd_bf16_65536": lambda: _ln_forward(2048, 65536, torch.bfloat16),
    # misses left (docs/kernels.md): fp32 ragged rows on 16-warp streamed programs, the 16-bit backward at 8191 (phased)
    "ln_fwd_fp32_12345": lambda: _ln_forward(8192, 12345, torch.float32),
    "ln_bwd_bf16_8191": lambda: _ln_backward(16384, 8191, torch.bfloat16),
    # issue 12's misses without a profile before (docs/kernels.md, "Where the targets are missed"), 2^26 16-bit or
    # 2^25 fp32 elements: the forward's one-warp and two-warp streamed rows (258, 555, 1023), aligned 384, 5120 (two
    # pieces) and fp32 9216 / 16384 (the persistent plan); the backward at GPT-2 XL's 1600, 1023 (held) and fp32 4097 /
    # 8191 (phased); fp32 rows in slices
    "ln_fwd_bf16_258": lambda: _ln_forward(None, 258, torch.bfloat16),
    "ln_fwd_bf16_555": lambda: _ln_forward(None, 555, torch.bfloat16),
    "ln_fwd_bf16_1023": lambda: _ln_forward(None, 1023, torch.bfloat16),
    "ln_fwd_bf16_384": lambda: _ln_forward(None, 384, torch.bfloat16),
    "ln_fwd_bf16_5120": lambda: _ln_forward(None, 5120, torch.bfloat16),
    "ln_fwd_fp16_5120": lambda: _ln_forward(None, 5120, torch.float16),  # against bf16 5120 ("Aligned 16-bit rows")
    "ln_fwd_fp32_9216": lambda: _ln_forward(None, 9216, torch.float32),
    "ln_fwd_fp32_16384": lambda: _ln_forward(None, 16384, torch.float32),
    "ln_bwd_bf16_1600": lambda: _ln_backward(None, 1600, torch.bfloat16),
    "ln_bwd_bf16_1023": lambda: _ln_backward(None, 1023, torch.bfloat16),
    "ln_bwd_fp32_4097": lambda: _ln_backward(None, 4097, torch.float32),
    "ln_bwd_fp32_8191": lambda: _ln_backward(None, 8191, torch.float32),
    "softmax_fp32_192743": lambda: _softmax(None, 192743, torch.float32),
    # fp32 misses of the 2026-12-03 sweep without a profile: ragged forward rows of 333 and 1025, softmax 26865 (held)
    "ln_fwd_fp32_333": lambda: _ln_forward(None, 333, torch.float32),
    "ln_fwd_fp32_1025": lambda: _ln_forward(None, 1025, torch.float32),
    "softmax_fp32_26865": lambda: _softmax(None, 26865, torch.float32),
    # the dense sweep's cliff just above 4096 (docs/kernels.md, "Where the targets are missed"): 16-bit 4224 in two
    # pieces (4096 + 128), fp32 4224 on its whole 8192 block
    "ln_fwd_bf16_4224": lambda: _ln_forward(None, 4224, torch.bfloat16),
    "ln_fwd_fp32_4224": lambda: _ln_forward(None, 4224, torch.float32),
    # the dense sweep's bands without a profile: 16-bit aligned 2112-3200 forward (a 4096 block) and backward (the rows
    # plan), softmax 16-bit just above 4096
    "ln_fwd_bf16_2368": lambda: _ln_forward(None, 2368, torch.bfloat16),
    "ln_bwd_bf16_2368": lambda: _ln_backward(None, 2368, torch.bfloat16),
    "softmax_bf16_4352": lambda: _softmax(None, 4352, torch.bfloat16),
    "ln_bwd_bf16_1408": lambda: _ln_backward(None, 1408, torch.bfloat16),  # aligned 1088-1472: the phased plan
    "softmax_bf16_1088": lambda: _softmax(None, 1088, torch.bfloat16),  # 16-bit 999-1088: 1024 + 64 lanes
    "softmax_bf16_2240": lambda: _softmax(None, 2240, torch.bfloat16),  # just above 2048
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="*", metavar="CASE", help=f"default: every case; one of {', '.join(CASES)}")
    add_out_option(parser)
    args = parser.parse_args()
    write_output_to(args.out, __file__)
    names = args.cases
    unknown = [n for n in names if n not in CASES]
    if unknown:
        raise SystemExit(f"unknown case(s) {unknown}; choose from {sorted(CASES)}")
    require_cuda(__file__)
    for name in names or list(CASES):
        fn = CASES[name]()
        fn()  # compile and warm up outside the profiled range
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        torch.cuda.nvtx.range_push(name)
        fn()
        torch.cuda.nvtx.range_pop()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
        print(f"ran {name}", flush=True)
        del fn
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
