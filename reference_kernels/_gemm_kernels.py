"""The GEMM epilogue's Triton kernels (planned and launched by ``gemm_epilogue``; docs/kernels.md, "gemm_epilogue").

``_gemm_epilogue_tma_kernel``: a persistent grid walking output tiles in grouped order, operands by TMA (sm_90+).
``_gemm_epilogue_kernel``: the tiled ``tl.dot`` kernel on pointers. ``_gemm_splitk_kernel`` writes fp32 partial sums of
K ranges, ``_splitk_epilogue_kernel`` sums them (or reads the library's product) and applies the epilogue. The epilogue
itself is ``_gemm_common._epilogue``; the warp-specialised Gluon kernel is ``_gemm_ws``'s.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._gemm_common import _epilogue, _launch_metadata, _tile_coords


@triton.jit(launch_metadata=_launch_metadata)
def _gemm_epilogue_kernel(
    a_ptr,  # (M, K)
    b_ptr,  # (K, N)
    c_ptr,  # (M, N) output
    bias_ptr,  # (N,) or None
    res_ptr,  # (M, N) or None
    M,  # rows of a and c
    N,  # columns of b and c
    K,  # columns of a, rows of b
    stride_am, stride_ak,  # a strides
    stride_bk, stride_bn,  # b strides
    stride_cm, stride_cn,  # c strides
    stride_rm, stride_rn,  # residual strides
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ACTIVATION: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    GELU_DEGREE: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,  # interpreter only: its tl.dot multiplies bf16 bit patterns
    INPUT_PRECISION: tl.constexpr,  # fp32 inputs: "tf32" or "ieee" (torch's allow_tf32); else unused
):
    pid_m, pid_n = _tile_coords(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # Rows/columns past the edge read row/column 0 (never stored), so the loads need no M/N mask.
    rows_in = tl.where(rows < M, rows, 0).to(tl.int64)
    cols_in = tl.where(cols < N, cols, 0).to(tl.int64)
    ks = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rows_in[:, None] * stride_am + ks[None, :] * stride_ak
    b_ptrs = b_ptr + ks[:, None] * stride_bk + cols_in[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=ks[None, :] < k_left, other=0.0)
        b = tl.load(b_ptrs, mask=ks[:, None] < k_left, other=0.0)
        if DOT_IN_FP32:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    acc = _epilogue(acc, rows, cols, M, N, bias_ptr, res_ptr, stride_rm, stride_rn,
                    HAS_BIAS, ACTIVATION, HAS_RESIDUAL, GELU_DEGREE)
    c_ptrs = c_ptr + rows.to(tl.int64)[:, None] * stride_cm + cols[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(rows[:, None] < M) & (cols[None, :] < N))


@triton.jit
def _tma_dot(a_desc, b_desc, acc, off_m, off_n, k_lo, k_hi, BLOCK_K: tl.constexpr, B_KMAJOR: tl.constexpr,
             DOT_IN_FP32: tl.constexpr, INPUT_PRECISION: tl.constexpr):
    """``acc`` plus the tile at (off_m, off_n) of a @ b over K tiles k_lo..k_hi, both operands by TMA (b's descriptor
    over (N, K) where B_KMAJOR): the main loop of the persistent and the split-K kernels."""
    for ki in range(k_lo, k_hi):
        off_k = ki * BLOCK_K
        x = a_desc.load([off_m, off_k])
        if B_KMAJOR:
            y = b_desc.load([off_n, off_k]).T
        else:
            y = b_desc.load([off_k, off_n])
        if DOT_IN_FP32:
            x = x.to(tl.float32)
            y = y.to(tl.float32)
        acc = tl.dot(x, y, acc, input_precision=INPUT_PRECISION)
    return acc


@triton.jit(launch_metadata=_launch_metadata)
def _gemm_epilogue_tma_kernel(
    a_desc,  # (M, K) descriptor, block (BLOCK_M, BLOCK_K)
    b_desc,  # (K, N) descriptor, block (BLOCK_K, BLOCK_N); (N, K), block (BLOCK_N, BLOCK_K) if B_KMAJOR
    c_desc,  # (M, N) descriptor, block (BLOCK_M, BLOCK_N // EPILOGUE_SPLIT)
    bias_ptr,  # (N,) or None
    res_ptr,  # (M, N) or None
    M,  # rows of a and c
    N,  # columns of b and c
    K,  # columns of a, rows of b
    stride_rm, stride_rn,  # residual strides
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    EPILOGUE_SPLIT: tl.constexpr,  # 1, or 2: store the tile in two column halves
    NUM_PROGRAMS: tl.constexpr,  # the persistent grid's stride: programs an SM x SMs
    B_KMAJOR: tl.constexpr,  # b is a transposed view of a contiguous (N, K) tensor
    HAS_BIAS: tl.constexpr,
    ACTIVATION: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    GELU_DEGREE: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,  # interpreter only: its tl.dot multiplies bf16 bit patterns
    INPUT_PRECISION: tl.constexpr,  # fp32 inputs: "tf32" or "ieee" (torch's allow_tf32); else unused
):
    start_pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    num_tiles = num_pid_m * num_pid_n
    # The epilogue recomputes its tile from its own counter, so the compiler can overlap
    # the next tile's first loads with this tile's epilogue (as tutorial 09 does).
    tile_id_c = start_pid - NUM_PROGRAMS
    for tile_id in tl.range(start_pid, num_tiles, NUM_PROGRAMS, flatten=True):
        pid_m, pid_n = _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc = _tma_dot(a_desc, b_desc, acc, off_m, off_n, 0, k_tiles, BLOCK_K, B_KMAJOR, DOT_IN_FP32, INPUT_PRECISION)

        tile_id_c += NUM_PROGRAMS
        pid_m, pid_n = _tile_coords(tile_id_c, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        rows = off_m + tl.arange(0, BLOCK_M)
        if EPILOGUE_SPLIT == 2:
            HALF: tl.constexpr = BLOCK_N // 2
            acc0, acc1 = tl.split(tl.permute(tl.reshape(acc, (BLOCK_M, 2, HALF)), (0, 2, 1)))
            cols = off_n + tl.arange(0, HALF)
            acc0 = _epilogue(acc0, rows, cols, M, N, bias_ptr, res_ptr, stride_rm, stride_rn,
                             HAS_BIAS, ACTIVATION, HAS_RESIDUAL, GELU_DEGREE)
            c_desc.store([off_m, off_n], acc0.to(c_desc.dtype))
            acc1 = _epilogue(acc1, rows, cols + HALF, M, N, bias_ptr, res_ptr, stride_rm, stride_rn,
                             HAS_BIAS, ACTIVATION, HAS_RESIDUAL, GELU_DEGREE)
            c_desc.store([off_m, off_n + HALF], acc1.to(c_desc.dtype))
        else:
            cols = off_n + tl.arange(0, BLOCK_N)
            acc = _epilogue(acc, rows, cols, M, N, bias_ptr, res_ptr, stride_rm, stride_rn,
                            HAS_BIAS, ACTIVATION, HAS_RESIDUAL, GELU_DEGREE)
            c_desc.store([off_m, off_n], acc.to(c_desc.dtype))


def _splitk_metadata(grid, kernel, args):
    """The split-K main loop: reads a and b, writes SPLIT_K fp32 partial (M, N) tiles."""
    M, N, K, S = args["M"], args["N"], args["K"], args["SPLIT_K"]
    a = args["a"]
    elt = (a.base if hasattr(a, "base") else a).element_size()
    nbytes = elt * (M * K + K * N) + 4 * S * M * N
    return {"name": f"{kernel.name} [M={M}, N={N}, K={K}, split={S}]", "bytes": nbytes, "flops": 2 * M * N * K}


def _splitk_epilogue_metadata(grid, kernel, args):
    """The epilogue over a stored product: reads the SPLIT_K partials (and bias, residual), writes the output."""
    M, N, S = args["M"], args["N"], args["SPLIT_K"]
    elt = args["c_ptr"].element_size()
    nbytes = args["ws_ptr"].element_size() * S * M * N + elt * M * N
    if args["HAS_BIAS"]:
        nbytes += elt * N
    if args["HAS_RESIDUAL"]:
        nbytes += elt * M * N
    return {"name": f"{kernel.name} [M={M}, N={N}, split={S}]", "bytes": nbytes, "flops": (S - 1) * M * N}


@triton.jit(launch_metadata=_splitk_metadata)
def _gemm_splitk_kernel(
    a,  # (M, K): a TMA descriptor, block (BLOCK_M, BLOCK_K), if USE_TMA, else a pointer
    b,  # (K, N): descriptor, block (BLOCK_K, BLOCK_N), or (N, K), block (BLOCK_N, BLOCK_K) if B_KMAJOR; or a pointer
    ws_ptr,  # (SPLIT_K, M, N) fp32 workspace: one partial sum per K range
    M,  # rows of a and c
    N,  # columns of b and c
    K,  # columns of a, rows of b
    stride_am, stride_ak,  # a strides (pointer path)
    stride_bk, stride_bn,  # b strides (pointer path)
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    SPLIT_K: tl.constexpr,  # K ranges a tile is cut into; the host keeps it <= cdiv(K, BLOCK_K)
    USE_TMA: tl.constexpr,
    B_KMAJOR: tl.constexpr,  # TMA path: b is a transposed view of a contiguous (N, K) tensor
    DOT_IN_FP32: tl.constexpr,  # interpreter only: its tl.dot multiplies bf16 bit patterns
    INPUT_PRECISION: tl.constexpr,  # fp32 inputs: "tf32" or "ieee"; else unused
):
    """One program per (tile, K range): the K ranges of a tile are neighbours in launch order."""
    pid = tl.program_id(0)
    split = pid % SPLIT_K
    pid_m, pid_n = _tile_coords(pid // SPLIT_K, tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    k_tiles = tl.cdiv(K, BLOCK_K)
    k_lo = split * k_tiles // SPLIT_K  # balanced ranges: none is empty while SPLIT_K <= k_tiles
    k_hi = (split + 1) * k_tiles // SPLIT_K
    off_m = pid_m * BLOCK_M
    off_n = pid_n * BLOCK_N
    rows = off_m + tl.arange(0, BLOCK_M)
    cols = off_n + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if USE_TMA:
        acc = _tma_dot(a, b, acc, off_m, off_n, k_lo, k_hi, BLOCK_K, B_KMAJOR, DOT_IN_FP32, INPUT_PRECISION)
    else:
        rows_in = tl.where(rows < M, rows, 0).to(tl.int64)  # past the edge: row/column 0, never stored
        cols_in = tl.where(cols < N, cols, 0).to(tl.int64)
        ks = k_lo * BLOCK_K + tl.arange(0, BLOCK_K)
        a_ptrs = a + rows_in[:, None] * stride_am + ks[None, :].to(tl.int64) * stride_ak
        b_ptrs = b + ks[:, None].to(tl.int64) * stride_bk + cols_in[None, :] * stride_bn
        for ki in range(k_lo, k_hi):
            k_left = K - ki * BLOCK_K
            x = tl.load(a_ptrs, mask=tl.arange(0, BLOCK_K)[None, :] < k_left, other=0.0)
            y = tl.load(b_ptrs, mask=tl.arange(0, BLOCK_K)[:, None] < k_left, other=0.0)
            if DOT_IN_FP32:
                x = x.to(tl.float32)
                y = y.to(tl.float32)
            acc = tl.dot(x, y, acc, input_precision=INPUT_PRECISION)
            a_ptrs += BLOCK_K * stride_ak
            b_ptrs += BLOCK_K * stride_bk
    mn = tl.cast(M, tl.int64) * N  # not M.to: Triton makes an argument of 1 a Python int
    ws_ptrs = ws_ptr + split * mn + rows.to(tl.int64)[:, None] * N + cols[None, :]
    tl.store(ws_ptrs, acc, mask=(rows[:, None] < M) & (cols[None, :] < N))


@triton.jit(launch_metadata=_splitk_epilogue_metadata)
def _splitk_epilogue_kernel(
    ws_ptr,  # (SPLIT_K, M, N) fp32 partial sums, or the library's (M, N) product (SPLIT_K 1, may be c_ptr)
    c_ptr,  # (M, N) output
    bias_ptr,  # (N,) or None
    res_ptr,  # (M, N) or None
    M,
    N,
    stride_cm,  # output row stride (unit column stride)
    stride_rm, stride_rn,  # residual strides
    SPLIT_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ACTIVATION: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    GELU_DEGREE: tl.constexpr,
):
    """Sum the K ranges in a fixed order (the result does not depend on launch timing), then the epilogue; in fp32
    whatever the partials' dtype. With one range it is the library path's epilogue (``_library``)."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    offs = rows.to(tl.int64)[:, None] * N + cols[None, :]
    mn = tl.cast(M, tl.int64) * N  # not M.to: Triton makes an argument of 1 a Python int
    acc = tl.load(ws_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    for s in tl.static_range(1, SPLIT_K):
        acc += tl.load(ws_ptr + s * mn + offs, mask=mask, other=0.0)
    acc = _epilogue(acc, rows, cols, M, N, bias_ptr, res_ptr, stride_rm, stride_rn,
                    HAS_BIAS, ACTIVATION, HAS_RESIDUAL, GELU_DEGREE)
    c_ptrs = c_ptr + rows.to(tl.int64)[:, None] * stride_cm + cols[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)
