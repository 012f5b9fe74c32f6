"""attention's Triton kernels (the walk ``attention``'s module docstring describes): ``_attention_fwd_kernel`` through
pointers and ``_attention_fwd_tma_kernel`` through TMA descriptors, and the block walk they share. Their plans and
launches are ``attention``'s; the warp-specialised Gluon kernel is ``_attention_ws``."""

from __future__ import annotations

import triton
import triton.language as tl

from . import _attention_ws
from ._math import exp2

_FLT_MAX = tl.constexpr(3.4028234663852886e38)


@triton.jit
def _online_softmax(
    raw,  # (BLOCK_M, BLOCK_N) float32 scores q @ k^T of one key block, unscaled
    m_i,  # (BLOCK_M,) running max of the scaled scores
    l_i,  # (BLOCK_M,) running sum of exponentials
    offs_m,  # (BLOCK_M,) query row indices
    offs_n,  # (BLOCK_N,) key column indices
    seq_len,
    qk_scale,  # softmax scale x log2(e)
    MASKED: tl.constexpr,  # mask columns >= N and (CAUSAL) above the diagonal; else every column is seen
    CAUSAL: tl.constexpr,
    FAST_EXP: tl.constexpr,  # ex2.approx.ftz (not under the interpreter)
    SCALE_FMA: tl.constexpr,  # qk_scale > 0: the scaled max is max(raw) x scale, each exponent's argument one FMA
):
    """The online softmax's step over one key block: (p, alpha, m_new, l_new), alpha rescaling what was summed
    under the old max."""
    if MASKED:
        seen = (offs_n < seq_len)[None, :]
        if CAUSAL:
            seen = seen & (offs_m[:, None] >= offs_n[None, :])
        s = tl.where(seen, raw * qk_scale, -float("inf"))
        # m starts at -FLT_MAX, not -inf: a row with no column in this block adds exp2(-inf) = 0, not nan.
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = exp2(s - m_new[:, None], FAST_EXP)
    elif SCALE_FMA:
        m_new = tl.maximum(m_i, tl.max(raw, axis=1) * qk_scale)
        p = exp2(raw * qk_scale - m_new[:, None], FAST_EXP)
    else:
        s = raw * qk_scale
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = exp2(s - m_new[:, None], FAST_EXP)
    alpha = exp2(m_i - m_new, FAST_EXP)
    return p, alpha, m_new, l_i * alpha + tl.sum(p, axis=1)


@triton.jit
def _accumulate(acc, p, alpha, v, DOT_IN_FP32: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """``acc`` rescaled by ``alpha`` plus ``p @ v``, on the tensor cores in the input's precision (FlashAttention's)."""
    p = p.to(v.dtype)
    if DOT_IN_FP32:  # interpreter only: its tl.dot multiplies bf16 bit patterns
        p = p.to(tl.float32)
        v = v.to(tl.float32)
    return tl.dot(p, v, acc * alpha[:, None], input_precision=DOT_PRECISION)


@triton.jit
def _attention_blocks(
    acc,  # (BLOCK_M, HEAD_DIM) float32 output accumulator, scaled by the running sum's terms
    l_i,  # (BLOCK_M,) float32 running sum of exponentials
    m_i,  # (BLOCK_M,) float32 running max of the (base-2 scaled) scores
    q,  # (BLOCK_M, HEAD_DIM) the program's query rows (float32 under the interpreter)
    k_base,  # k of this (batch, head): row n at k_base + n * stride_kn, head_dim contiguous
    v_base,  # v of this (batch, head)
    stride_kn,
    stride_vn,
    offs_m,  # (BLOCK_M,) query row indices
    offs_d,  # (HEAD_DIM,)
    lo,  # first key column (a multiple of BLOCK_N)
    hi,  # key columns end
    seq_len,  # N
    qk_scale,  # softmax scale x log2(e)
    BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr,
    CAUSAL: tl.constexpr,
    FAST_EXP: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
    DOT_PRECISION: tl.constexpr,  # "ieee" for float32 inputs and under the interpreter (exact fp32 products)
    SCALE_FMA: tl.constexpr,
):
    """One stage of the walk over key/value blocks [lo, hi), k and v through pointers."""
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k_ptrs = k_base + offs_n[:, None] * stride_kn + offs_d[None, :]
        v_ptrs = v_base + offs_n[:, None] * stride_vn + offs_d[None, :]
        if MASKED:
            k = tl.load(k_ptrs, mask=(offs_n < seq_len)[:, None], other=0.0)
        else:
            k = tl.load(k_ptrs)
        if DOT_IN_FP32:
            k = k.to(tl.float32)
        raw = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        p, alpha, m_i, l_i = _online_softmax(raw, m_i, l_i, offs_m, offs_n, seq_len, qk_scale, MASKED, CAUSAL,
                                             FAST_EXP, SCALE_FMA)
        if MASKED:
            v = tl.load(v_ptrs, mask=(offs_n < seq_len)[:, None], other=0.0)
        else:
            v = tl.load(v_ptrs)
        acc = _accumulate(acc, p, alpha, v, DOT_IN_FP32, DOT_PRECISION)
    return acc, l_i, m_i


@triton.jit
def _attention_tma_blocks(
    acc, l_i, m_i, q,  # as _attention_blocks'
    k_desc,  # (B, H, N, HEAD_DIM) descriptor of k, blocks of (1, 1, BLOCK_N, HEAD_DIM); rows past N read 0
    v_desc,  # of v, the same blocks
    b,  # batch index
    h,  # head index
    offs_m, lo, hi, seq_len, qk_scale,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    MASKED: tl.constexpr,
    CAUSAL: tl.constexpr,
    FAST_EXP: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    SCALE_FMA: tl.constexpr,
):
    """One stage of the walk over key/value blocks [lo, hi), k and v through TMA (``_attention_fwd_tma_kernel``)."""
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k = k_desc.load([b, h, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
        if DOT_IN_FP32:
            k = k.to(tl.float32)
        raw = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        p, alpha, m_i, l_i = _online_softmax(raw, m_i, l_i, offs_m, offs_n, seq_len, qk_scale, MASKED, CAUSAL,
                                             FAST_EXP, SCALE_FMA)
        v = v_desc.load([b, h, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
        acc = _accumulate(acc, p, alpha, v, DOT_IN_FP32, DOT_PRECISION)
    return acc, l_i, m_i


@triton.jit
def _query_block(CAUSAL: tl.constexpr):
    """The program's query block: causal programs heaviest first (the last block has the most key blocks to walk)."""
    if CAUSAL:
        m_block = tl.num_programs(0) - 1 - tl.program_id(0)
    else:
        m_block = tl.program_id(0)
    return m_block


@triton.jit
def _walk_start(m_block, seq_len, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                CAUSAL: tl.constexpr):
    """The walk's running max, sum and accumulator, and its two stages' ends: key columns every row sees in full
    (causal: left of the diagonal block; else whole blocks), then the masked rest."""
    m_i = tl.full([BLOCK_M], -_FLT_MAX, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    if CAUSAL:
        full_hi = m_block * BLOCK_M
        masked_hi = tl.minimum(full_hi + BLOCK_M, seq_len)
    else:
        full_hi = (seq_len // BLOCK_N) * BLOCK_N
        masked_hi = seq_len
    return m_i, l_i, acc, full_hi, masked_hi


@triton.jit(launch_metadata=_attention_ws.launch_metadata)
def _attention_fwd_kernel(
    q_ptr, k_ptr, v_ptr,  # (B, H, N, HEAD_DIM), any strides but a unit one for HEAD_DIM (vector loads, cp.async)
    o_ptr,  # (B, H, N, HEAD_DIM) output
    stride_qb, stride_qh, stride_qn,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_ob, stride_oh, stride_on,
    n_heads,  # H
    seq_len,  # N
    qk_scale,  # softmax scale x log2(e)
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,  # query rows a program
    BLOCK_N: tl.constexpr,  # key/value rows a step; divides BLOCK_M
    CAUSAL: tl.constexpr,
    FAST_EXP: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    SCALE_FMA: tl.constexpr,
):
    """Grid (query blocks, B x H). One pass over k and v; (N, N) scores stay on chip."""
    m_block = _query_block(CAUSAL)
    bh = tl.program_id(1)
    b = (bh // n_heads).to(tl.int64)
    h = (bh % n_heads).to(tl.int64)
    q_base = q_ptr + b * stride_qb + h * stride_qh
    k_base = k_ptr + b * stride_kb + h * stride_kh
    v_base = v_ptr + b * stride_vb + h * stride_vh
    o_base = o_ptr + b * stride_ob + h * stride_oh

    offs_m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < seq_len
    # Rows past N load zeros (uniform scores, never nan) and are not stored.
    q = tl.load(q_base + offs_m[:, None] * stride_qn + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    if DOT_IN_FP32:
        q = q.to(tl.float32)

    m_i, l_i, acc, full_hi, masked_hi = _walk_start(m_block, seq_len, HEAD_DIM, BLOCK_M, BLOCK_N, CAUSAL)
    acc, l_i, m_i = _attention_blocks(
        acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn, offs_m, offs_d,
        0, full_hi, seq_len, qk_scale, BLOCK_N, False, CAUSAL, FAST_EXP, DOT_IN_FP32, DOT_PRECISION, SCALE_FMA,
    )
    acc, l_i, m_i = _attention_blocks(
        acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn, offs_m, offs_d,
        full_hi, masked_hi, seq_len, qk_scale, BLOCK_N, True, CAUSAL, FAST_EXP, DOT_IN_FP32, DOT_PRECISION, SCALE_FMA,
    )
    # Every row saw column 0 (the walk starts there), so l_i >= 1.
    out = acc / l_i[:, None]
    o_ptrs = o_base + offs_m[:, None] * stride_on + offs_d[None, :]
    tl.store(o_ptrs, out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None])


@triton.jit(launch_metadata=_attention_ws.launch_metadata)
def _attention_fwd_tma_kernel(
    q_desc, k_desc, v_desc,  # (B, H, N, HEAD_DIM) descriptors: q's blocks (1, 1, BLOCK_M, HEAD_DIM), k's and v's BLOCK_N
    o_desc,  # the output's, blocks as q's
    n_heads,  # H
    seq_len,  # N
    qk_scale,  # softmax scale x log2(e)
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    FAST_EXP: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    SCALE_FMA: tl.constexpr,
):
    """``_attention_fwd_kernel`` with q, k, v and the output through TMA: a block a copy, no address arithmetic a
    thread; rows past N read as zeros and are not written (the descriptors' bounds), so no row mask."""
    m_block = _query_block(CAUSAL)
    bh = tl.program_id(1)
    b = bh // n_heads
    h = bh % n_heads
    start_m = m_block * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    q = q_desc.load([b, h, start_m, 0]).reshape(BLOCK_M, HEAD_DIM)
    if DOT_IN_FP32:
        q = q.to(tl.float32)
    m_i, l_i, acc, full_hi, masked_hi = _walk_start(m_block, seq_len, HEAD_DIM, BLOCK_M, BLOCK_N, CAUSAL)
    acc, l_i, m_i = _attention_tma_blocks(
        acc, l_i, m_i, q, k_desc, v_desc, b, h, offs_m, 0, full_hi, seq_len, qk_scale,
        BLOCK_N, HEAD_DIM, False, CAUSAL, FAST_EXP, DOT_IN_FP32, DOT_PRECISION, SCALE_FMA,
    )
    acc, l_i, m_i = _attention_tma_blocks(
        acc, l_i, m_i, q, k_desc, v_desc, b, h, offs_m, full_hi, masked_hi, seq_len, qk_scale,
        BLOCK_N, HEAD_DIM, True, CAUSAL, FAST_EXP, DOT_IN_FP32, DOT_PRECISION, SCALE_FMA,
    )
    out = acc / l_i[:, None]
    o_desc.store([b, h, start_m, 0], out.to(o_desc.dtype).reshape(1, 1, BLOCK_M, HEAD_DIM))
