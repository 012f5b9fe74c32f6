"""What the GEMM-epilogue kernels share (``gemm_epilogue``'s Triton kernels and ``_gemm_ws``'s Gluon one).

The epilogue applied to the fp32 accumulator tile (bias, activation, residual), the grouped tile order, the launch
metadata profilers read, the activation codes' mapping to their PTX fast-math forms and the GELU fit's degree, and
the TMA alignment check: one definition each, so that both kernels compute the same thing by construction and
neither subject module imports the other (docs/kernels.md, "gemm_epilogue").
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import tma_ok
from ._math import gelu

# The exact GELU's fit in the epilogue (see _math.gelu): 9 (erfcc), 7 (as accurate, two FMAs fewer), or 5
# (within one 16-bit ulp). Timed on the H200 in two runs (docs/kernels.md, "gemm_epilogue"): at
# 4096^3 degree 7 led degree 9 by 8% in the first and trailed it by 6% in the second, the same
# configs; no degree wins beyond this GEMM's run-to-run spread. 7: the fewer instructions at
# degree 9's accuracy.
GELU_DEGREE = 7
# The GELUs on CUDA with PTX fast-math (rcp.approx, ex2.approx: ~2^-22 relative each) instead of an
# IEEE division and tl.exp2's range fix-ups: the tanh form (cuBLASLt's epilogue's function) and the
# exact one (docs/kernels.md, "gemm_epilogue").
TANH_FAST = True
EXACT_FAST = True


def _launch_metadata(grid, kernel, args):
    """What profilers (and pytest-fusioncheck's byte model) read off a launch."""
    M, N, K = args["M"], args["N"], args["K"]
    out = args["c_ptr"] if "c_ptr" in args else args["c_desc"].base
    elt = out.element_size()
    nbytes = elt * (M * K + K * N + M * N)
    if args["HAS_BIAS"]:
        nbytes += elt * N
    if args["HAS_RESIDUAL"]:
        nbytes += elt * M * N
    return {"name": f"{kernel.name} [M={M}, N={N}, K={K}]", "bytes": nbytes, "flops": 2 * M * N * K}


@triton.jit
def _activation(x, ACTIVATION: tl.constexpr, GELU_DEGREE: tl.constexpr):
    if ACTIVATION == 1:
        x = tl.where(x < 0.0, 0.0, x)  # relu; NaN stays NaN like torch.relu
    elif ACTIVATION == 2:
        x = gelu(x, 0, GELU_DEGREE)
    elif ACTIVATION == 3:
        x = gelu(x, 1)
    elif ACTIVATION == 4:  # the tanh form with rcp.approx / ex2.approx (CUDA only; TANH_FAST)
        x = gelu(x, 3)
    elif ACTIVATION == 5:  # the exact form with rcp.approx / ex2.approx (CUDA only; EXACT_FAST)
        x = gelu(x, 2, GELU_DEGREE)
    return x


@triton.jit
def _epilogue(
    acc,  # (BLOCK_M, BLOCK_N) fp32 accumulator tile
    rows,  # (BLOCK_M,) output row indices
    cols,  # (BLOCK_N,) output column indices
    M,  # rows of the output
    N,  # columns of the output
    bias_ptr,  # (N,)
    res_ptr,  # (M, N)
    stride_rm,  # residual row stride
    stride_rn,  # residual column stride
    HAS_BIAS: tl.constexpr,
    ACTIVATION: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    GELU_DEGREE: tl.constexpr,  # the exact GELU's fit: 9, 7 or (16-bit outputs) 5; see _math.gelu
):
    if HAS_BIAS:
        bias = tl.load(bias_ptr + cols, mask=cols < N, other=0.0)
        acc = acc + bias.to(tl.float32)[None, :]
    acc = _activation(acc, ACTIVATION, GELU_DEGREE)
    if HAS_RESIDUAL:
        res_ptrs = res_ptr + rows.to(tl.int64)[:, None] * stride_rm + cols[None, :] * stride_rn
        res = tl.load(res_ptrs, mask=(rows[:, None] < M) & (cols[None, :] < N), other=0.0)
        acc = acc + res.to(tl.float32)
    return acc


@triton.jit
def _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """Grouped ordering: GROUP_M row-tiles share each column of B while it is in L2."""
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = tile_id // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + (tile_id % group_size_m)
    pid_n = (tile_id % num_pid_in_group) // group_size_m
    return pid_m, pid_n


def _tma_ok(t: torch.Tensor) -> bool:
    """A matrix TMA can describe (``_common.tma_ok``)."""
    return t.dim() == 2 and tma_ok(t)


def fast_activation(code: int) -> int:
    """The kernels' code for a GELU in PTX fast-math where ``TANH_FAST`` / ``EXACT_FAST`` ask for it (CUDA)."""
    if code == 3 and TANH_FAST:
        return 4
    if code == 2 and EXACT_FAST:
        return 5
    return code
