"""The layer norm's Triton kernels (launched and planned by ``layer_norm``; docs/kernels.md, "layer_norm: forward" and
"layer_norm: backward").

Forward: whole rows in registers (``_layer_norm_fwd_kernel``: aligned rows, rows read as aligned vectors, rows in
pieces), a wide row a program in chunks (``_layer_norm_fwd_looped_kernel``) and the split walk
(``_layer_norm_fwd_split_kernel``, ``_split_walk``). Backward: row groups or chunked rows (``_layer_norm_bwd_kernel``,
``_layer_norm_bwd_lean_kernel``), pipelined whole rows (``_layer_norm_bwd_phased_kernel``), rows laid flat
(``_layer_norm_bwd_flat_kernel``); every backward writes float32 shares that ``_layer_norm_dwdb_kernel`` sums in a
fixed order (few shares: the rows kernel itself, ``_sum_shares_if_last``). The Gluon kernels that hold rows in shared
memory are ``_layer_norm_held``'s.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._math import widen, widen_after
from ._ragged import (
    body_bounds,
    edge_word_columns,
    edge_words,
    edges,
    in_row,
    row_first,
    row_origin,
    vec_end,
)
from ._split_walk import COUNTER_STRIDE, exchange_partials, first_tile, prefetch_target, tile_start

# The backward kernels' MODE: whole rows, or a row in chunks (one_pass: partials exchanged while the
# chunks stay in registers; two_pass: a launch for the partials, then one that combines them).
_ROWS = tl.constexpr(0)
_ONE_PASS = tl.constexpr(1)
_STATS = tl.constexpr(2)  # two_pass, first launch: partials only
_FROM_STATS = tl.constexpr(3)  # two_pass, second launch: combine the partials, re-read the inputs


# --------------------------------------------------------------------------- kernels: forward


@triton.jit
def _layer_norm_aligned_rows(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, n_rows, n_cols, stride_x, stride_y, eps,
                             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr,
                             BLOCK_U: tl.constexpr, JOINT: tl.constexpr, PACKED: tl.constexpr = False,
                             PARAMS_FIRST: tl.constexpr = False, WIDEN: tl.constexpr = False):
    """``_layer_norm_fwd_kernel`` for rows Triton already knows aligned (or reads with scalar accesses).

    One piece: the plain body, centred values kept for y (the pieces' body, which recomputes
    x - mean, takes 80 registers against 68 at bf16 8192 and measured 63-65% of copy at bf16
    5120 against 78-79% for this one; docs/kernels.md, "layer_norm: forward"). JOINT (16-bit rows,
    ``_forward_launch``): the row's sums of x - x[row, 0] and of its square in one reduction a piece,
    instead of a reduction for the mean and then one for the variance. PACKED (with JOINT): x held in its
    loaded 16-bit registers through the reduction and widened again after it. PARAMS_FIRST (not JOINT): the weight
    and bias loaded before x, not after the reductions (``_params_first``). WIDEN: bf16 widened by a shift or an AND
    (``widen``, ``rows_widen_bands``)."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < n_rows
    rows64 = rows.to(tl.int64)
    if BLOCK_T == 0:
        cols = tl.arange(0, BLOCK_N)
        col_ok = cols < n_cols
        mask = row_ok[:, None] & col_ok[None, :]
        if PARAMS_FIRST:  # weight and bias in flight with x, not after the reductions (Liger's order)
            w = widen(tl.load(w_ptr + cols, mask=col_ok, other=0.0), WIDEN)
            b = widen(tl.load(b_ptr + cols, mask=col_ok, other=0.0), WIDEN)
        x_in = tl.load(x_ptr + rows64[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)
        x = widen(x_in, WIDEN)
        if JOINT:
            shift = tl.load(x_ptr + rows64 * stride_x, mask=row_ok, other=0.0).to(tl.float32)
            mean, var = _ln_joint_stats(tl.where(mask, x - shift[:, None], 0.0), shift, n_cols)
            if PACKED:  # x held in its 16-bit registers across the reduction, widened again for y (the compiler's
                # conversion: widen_after's PTX one took bf16 12288 from 78 to 112 registers on sm_90)
                x = widen_after(x_in, mean[:, None])
            centred = x - mean[:, None]
        else:
            mean = tl.sum(x, axis=1) / n_cols
            centred = tl.where(mask, x - mean[:, None], 0.0)
            var = tl.sum(centred * centred, axis=1) / n_cols
        rstd = 1.0 / tl.sqrt(var + eps)
        if not PARAMS_FIRST:
            w = widen(tl.load(w_ptr + cols, mask=col_ok, other=0.0), WIDEN)
            b = widen(tl.load(b_ptr + cols, mask=col_ok, other=0.0), WIDEN)
        y = centred * rstd[:, None] * w[None, :] + b[None, :]
        tl.store(y_ptr + rows64[:, None] * stride_y + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)
        tl.store(mean_ptr + rows, mean, mask=row_ok)
        tl.store(rstd_ptr + rows, rstd, mask=row_ok)
    elif JOINT:
        _ln_joint_pieces(x_ptr + rows64[:, None] * stride_x, w_ptr, b_ptr, y_ptr + rows64[:, None] * stride_y, mean_ptr,
                         rstd_ptr, rows, row_ok, n_cols, eps, BLOCK_N, BLOCK_T, BLOCK_U, PACKED, WIDEN)
    else:
        _layer_norm_row_pieces(x_ptr + rows64[:, None] * stride_x, w_ptr, b_ptr, y_ptr + rows64[:, None] * stride_y,
                               mean_ptr, rstd_ptr, rows, row_ok, 0, n_cols, 0, n_cols, eps, BLOCK_N, BLOCK_T, BLOCK_U, 1,
                               WIDEN)


@triton.jit
def _layer_norm_phased_rows(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, x_phase, n_rows, n_cols, stride_x,
                            stride_y, eps, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr,
                            BLOCK_U: tl.constexpr, VEC: tl.constexpr):
    """``_layer_norm_fwd_kernel`` for unaligned rows read as aligned vectors (``_ragged``)."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < n_rows
    x_base, ph = row_origin(x_phase, rows, stride_x, VEC)
    y_base, _ = row_origin(x_phase, rows, stride_y, VEC)
    zero = tl.zeros([BLOCK_M], tl.int32)  # one phase a row, as a tensor
    ph = ph + zero
    first, last = body_bounds(ph, n_cols, VEC)
    _layer_norm_row_pieces(x_ptr + x_base[:, None], w_ptr, b_ptr, y_ptr + y_base[:, None], mean_ptr, rstd_ptr, rows,
                           row_ok, ph[:, None], n_cols, (first + zero)[:, None], (last + zero)[:, None], eps, BLOCK_N,
                           BLOCK_T, BLOCK_U, VEC)


@triton.jit
def _layer_norm_row_pieces(x_row, w_ptr, b_ptr, y_row, mean_ptr, rstd_ptr, rows, row_ok, ph2, n_cols, first, last, eps,
                           BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_U: tl.constexpr, VEC: tl.constexpr,
                           WIDEN: tl.constexpr = False):
    """The rows kernels' body: rows at ``x_row`` ((BLOCK_M, 1) pointers, virtual columns) held as up to three
    pieces (``_row_pieces``). The body, the whole vectors in [first, last) (VEC 1: [0, N)), is masked a
    vector at a time; the at most 2 (VEC - 1) elements around it are the edges, loaded apart. The weight and bias
    are loaded after the reductions (before x lost here: docs/kernels.md, "fp32 aligned rows against Liger's shape")."""
    x = _ln_piece(x_row, 0, BLOCK_N, first, last, row_ok, VEC, WIDEN=WIDEN)
    total = tl.sum(x, axis=1)
    if BLOCK_T > 0:
        x_t = _ln_piece(x_row, BLOCK_N, BLOCK_T, first, last, row_ok, VEC, WIDEN=WIDEN)
        total += tl.sum(x_t, axis=1)
    if BLOCK_U > 0:
        x_u = _ln_piece(x_row, BLOCK_N + BLOCK_T, BLOCK_U, first, last, row_ok, VEC, WIDEN=WIDEN)
        total += tl.sum(x_u, axis=1)
    if VEC > 1:
        e, e_ok = edges(ph2, n_cols, VEC)
        e_ok = e_ok & row_ok[:, None]
        xe = tl.load(x_row + e, mask=e_ok, other=0.0).to(tl.float32)
        total += tl.sum(xe, axis=1)
    mean = total / n_cols
    var = _ln_piece_sq(x, 0, BLOCK_N, mean, first, last, VEC)
    if BLOCK_T > 0:
        var += _ln_piece_sq(x_t, BLOCK_N, BLOCK_T, mean, first, last, VEC)
    if BLOCK_U > 0:
        var += _ln_piece_sq(x_u, BLOCK_N + BLOCK_T, BLOCK_U, mean, first, last, VEC)
    if VEC > 1:
        ce = tl.where(e_ok, xe - mean[:, None], 0.0)
        var += tl.sum(ce * ce, axis=1)
    rstd = 1.0 / tl.sqrt(var / n_cols + eps)
    # y = (x - mean) rstd w + b, not (x rstd - mean rstd) w + b in FMAs: that cancels where the mean
    # is large against the spread (a one-wide row: 5e-4 off, on the H200)
    w_n, b_n = _ln_piece_wb(w_ptr, b_ptr, 0, BLOCK_N, ph2, n_cols, first, last, row_ok, VEC)
    _ln_piece_out(y_row, 0, BLOCK_N, x, mean, rstd, w_n, b_n, first, last, row_ok, VEC, WIDEN)
    if BLOCK_T > 0:
        w_t, b_t = _ln_piece_wb(w_ptr, b_ptr, BLOCK_N, BLOCK_T, ph2, n_cols, first, last, row_ok, VEC)
        _ln_piece_out(y_row, BLOCK_N, BLOCK_T, x_t, mean, rstd, w_t, b_t, first, last, row_ok, VEC, WIDEN)
    if BLOCK_U > 0:
        w_u, b_u = _ln_piece_wb(w_ptr, b_ptr, BLOCK_N + BLOCK_T, BLOCK_U, ph2, n_cols, first, last, row_ok, VEC)
        _ln_piece_out(y_row, BLOCK_N + BLOCK_T, BLOCK_U, x_u, mean, rstd, w_u, b_u, first, last, row_ok, VEC, WIDEN)
    if VEC > 1:
        we = tl.load(w_ptr + (e - ph2), mask=e_ok, other=0.0)
        be = tl.load(b_ptr + (e - ph2), mask=e_ok, other=0.0)
        ye = (xe - mean[:, None]) * rstd[:, None] * we.to(tl.float32) + be.to(tl.float32)
        tl.store(y_row + e, ye.to(y_row.dtype.element_ty), mask=e_ok)
    tl.store(mean_ptr + rows, mean, mask=row_ok)
    tl.store(rstd_ptr + rows, rstd, mask=row_ok)


@triton.jit
def _add_pairs(a1, b1, a2, b2):
    return a1 + a2, b1 + b2


@triton.jit
def _ln_joint_sums(d):
    """Per row: (sum of d, sum of d^2), in one reduction."""
    return tl.reduce((d, d * d), 1, _add_pairs)


@triton.jit
def _ln_joint_stats(d, shift, n_cols):
    """(mean, variance) per row from d = x - shift (0 outside the row) in one reduction of d and d^2.

    The shift is an element of the row, so (mean - shift)^2 <= N var and the subtraction below loses
    at most ~N float32 ulps of the variance (the looped and split plans sum the same way)."""
    s1, s2 = _ln_joint_sums(d)
    return _ln_joint_finish(s1, s2, shift, n_cols)


@triton.jit
def _ln_joint_finish(s1, s2, shift, n_cols):
    """(mean, variance) from the sums s1, s2 of d = x - shift and of d^2 over a row (the looped and split
    kernels finish their sums the same way, inline: moving them onto this changes their sm_90 scheduling)."""
    mean_d = s1 / n_cols
    var = s2 / n_cols - mean_d * mean_d
    var = tl.where(var < 0.0, 0.0, var)  # rounding; not tl.maximum, which would drop a nan
    return shift + mean_d, var


@triton.jit
def _ln_joint_pieces(x_row, w_ptr, b_ptr, y_row, mean_ptr, rstd_ptr, rows, row_ok, n_cols, eps,
                     BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_U: tl.constexpr, PACKED: tl.constexpr = False,
                     WIDEN: tl.constexpr = False):
    """``_layer_norm_row_pieces`` for aligned rows in two pieces with JOINT statistics: each piece's sums of
    x - x[row, 0] and of its square in one reduction (two reductions, not four one after another)."""
    tl.static_assert(BLOCK_T > 0 and BLOCK_U == 0, "JOINT pieces: two (_aligned_16bit_pieces)")
    shift = tl.load(x_row, mask=row_ok[:, None], other=0.0).to(tl.float32)  # (BLOCK_M, 1): the row's first element
    x_in = _ln_piece(x_row, 0, BLOCK_N, 0, n_cols, row_ok, 1, RAW=True)
    x = widen(x_in, WIDEN)
    s1, s2 = _ln_joint_sums(tl.where(tl.arange(0, BLOCK_N)[None, :] < n_cols, x - shift, 0.0))
    x_t_in = _ln_piece(x_row, BLOCK_N, BLOCK_T, 0, n_cols, row_ok, 1, RAW=True)
    x_t = widen(x_t_in, WIDEN)
    t1, t2 = _ln_joint_sums(tl.where(BLOCK_N + tl.arange(0, BLOCK_T)[None, :] < n_cols, x_t - shift, 0.0))
    mean, var = _ln_joint_finish(s1 + t1, s2 + t2, tl.reshape(shift, (shift.shape[0],)), n_cols)
    if PACKED:
        x = widen_after(x_in, mean[:, None], WIDEN)
        x_t = widen_after(x_t_in, mean[:, None], WIDEN)
    rstd = 1.0 / tl.sqrt(var + eps)
    w_n, b_n = _ln_piece_wb(w_ptr, b_ptr, 0, BLOCK_N, 0, n_cols, 0, n_cols, row_ok, 1)
    _ln_piece_out(y_row, 0, BLOCK_N, x, mean, rstd, w_n, b_n, 0, n_cols, row_ok, 1, WIDEN)
    w_t, b_t = _ln_piece_wb(w_ptr, b_ptr, BLOCK_N, BLOCK_T, 0, n_cols, 0, n_cols, row_ok, 1)
    _ln_piece_out(y_row, BLOCK_N, BLOCK_T, x_t, mean, rstd, w_t, b_t, 0, n_cols, row_ok, 1, WIDEN)
    tl.store(mean_ptr + rows, mean, mask=row_ok)
    tl.store(rstd_ptr + rows, rstd, mask=row_ok)


@triton.jit
def _in_body(v, first, last, VEC: tl.constexpr):
    """Virtual columns ``v`` of the body's whole vectors (VEC 1: ``v < N``, ``last``)."""
    if VEC > 1:
        return (v >= first) & (v < last)
    else:
        return v < last


@triton.jit
def _ln_piece(x_row, start: tl.constexpr, SIZE: tl.constexpr, first, last, row_ok, VEC: tl.constexpr,
              RAW: tl.constexpr = False, WIDEN: tl.constexpr = False):
    """Virtual columns ``start .. start + SIZE`` of the rows at ``x_row`` in float32 (``RAW``: as loaded; WIDEN:
    ``widen``): the body, 0 elsewhere."""
    v = start + tl.arange(0, SIZE)[None, :]
    x = tl.load(x_row + v, mask=row_ok[:, None] & _in_body(v, first, last, VEC), other=0.0)
    if not RAW:
        x = widen(x, WIDEN)
    return x


@triton.jit
def _ln_piece_sq(x, start: tl.constexpr, SIZE: tl.constexpr, mean, first, last, VEC: tl.constexpr):
    """Sum over the body's columns of a piece of (x - mean)^2, per row."""
    v = start + tl.arange(0, SIZE)[None, :]
    centred = tl.where(_in_body(v, first, last, VEC), x - mean[:, None], 0.0)
    return tl.sum(centred * centred, axis=1)


@triton.jit
def _ln_piece_wb(w_ptr, b_ptr, start: tl.constexpr, SIZE: tl.constexpr, ph2, n_cols, first, last, row_ok,
                 VEC: tl.constexpr):
    """(weight, bias) over a piece's body columns, in their own dtype.

    Read at the row's own columns (virtual column - phase): where VEC > 1 no phase makes that
    provably aligned, so scalar loads (of two (N,) vectors in L1)."""
    if VEC > 1:
        v = start + tl.arange(0, SIZE)[None, :]
        body = row_ok[:, None] & _in_body(v, first, last, VEC)
        w = tl.load(w_ptr + (v - ph2), mask=body, other=0.0)
        b = tl.load(b_ptr + (v - ph2), mask=body, other=0.0)
    else:
        c = start + tl.arange(0, SIZE)
        w = tl.load(w_ptr + c, mask=c < n_cols, other=0.0)[None, :]
        b = tl.load(b_ptr + c, mask=c < n_cols, other=0.0)[None, :]
    return w, b


@triton.jit
def _ln_piece_out(y_row, start: tl.constexpr, SIZE: tl.constexpr, x, mean, rstd, w, b, first, last, row_ok,
                  VEC: tl.constexpr, WIDEN: tl.constexpr = False):
    """y over a piece's body columns (``w``, ``b`` from ``_ln_piece_wb``)."""
    v = start + tl.arange(0, SIZE)[None, :]
    y = (x - mean[:, None]) * rstd[:, None] * widen(w, WIDEN) + widen(b, WIDEN)
    tl.store(y_row + v, y.to(y_row.dtype.element_ty), mask=row_ok[:, None] & _in_body(v, first, last, VEC))


@triton.jit
def _layer_norm_fwd_kernel(
    x_ptr,  # input: row r's first element at x_ptr + x_phase + r * stride_x; column stride 1
    w_ptr,  # (N,) weight
    b_ptr,  # (N,) bias
    y_ptr,  # output: row r's first element at y_ptr + x_phase + r * stride_y (same phase as x's, _ragged.phased)
    mean_ptr,  # (M,) float32 row means
    rstd_ptr,  # (M,) float32 reciprocal row standard deviations
    x_phase,  # phase of row 0 (0 when VEC == 1)
    n_rows,  # M
    n_cols,  # N
    stride_x,  # elements between rows of x
    stride_y,  # elements between rows of y
    eps,  # added to the variance
    BLOCK_M: tl.constexpr,  # rows per program
    BLOCK_N: tl.constexpr,  # virtual columns of the row's first piece (``_row_pieces``: all pieces >= N + VEC - 1)
    BLOCK_T: tl.constexpr,  # columns of the second piece, from BLOCK_N on; 0: none
    BLOCK_U: tl.constexpr,  # columns of the third piece, from BLOCK_N + BLOCK_T on; 0: none
    VEC: tl.constexpr,  # elements in 16 bytes for rows that start unaligned, 1 when every row is aligned
    JOINT: tl.constexpr = False,  # aligned rows: statistics from one reduction of (x - x[row, 0], its square) a piece
    PACKED: tl.constexpr = False,  # with JOINT, 16-bit x: x held as loaded through the reduction, widened again
    NARROW: tl.constexpr = 0,  # VEC 1: 0, or N = both strides for packed rows (_ragged.Phased.packed_width)
    PARAMS_FIRST: tl.constexpr = False,  # VEC 1, not JOINT: weight and bias loaded before x (_params_first)
    WIDEN: tl.constexpr = False,  # VEC 1, CUDA: bf16 widened by a shift or an AND (_math.widen, rows_widen_bands)
):
    """Whole rows in registers: BLOCK_M rows a program, one read of x and one write of y.

    A row is held as up to three power-of-two pieces (4096 + 1024 for 5120): few masked lanes
    (softmax's rows kernel does the same; docs/kernels.md, "layer_norm: forward").
    Unaligned rows (``_ragged``): x and y in whole aligned vectors from each row's aligned
    origin, the row's edge elements loaded and stored apart; weight and bias are read at the
    row's own columns (virtual column - phase), which Triton cannot prove aligned: scalar
    loads of two (N,) vectors that stay in L1.
    """
    if NARROW > 0:  # compile-time row length and strides: rows load as vectors of their alignment
        n_cols = NARROW
        stride_x = NARROW
        stride_y = NARROW
    if VEC == 1:  # aligned rows: the plain kernel (the general one ran bf16 5120 at 68% of copy, this 79%)
        _layer_norm_aligned_rows(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, n_rows, n_cols, stride_x, stride_y,
                                 eps, BLOCK_M, BLOCK_N, BLOCK_T, BLOCK_U, JOINT, PACKED, PARAMS_FIRST, WIDEN)
    else:
        _layer_norm_phased_rows(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, x_phase, n_rows, n_cols, stride_x,
                                stride_y, eps, BLOCK_M, BLOCK_N, BLOCK_T, BLOCK_U, VEC)


@triton.jit
def _layer_norm_fwd_looped_kernel(
    x_ptr,  # (M, N) input, unit column stride
    w_ptr,  # (N,) weight
    b_ptr,  # (N,) bias
    y_ptr,  # (M, N) output, unit column stride
    mean_ptr,  # (M,) float32 out: row means
    rstd_ptr,  # (M,) float32 out: 1 / sqrt(var + eps)
    n_cols,  # N
    stride_x,  # elements between rows of x
    stride_y,  # elements between rows of y
    eps,  # added to the variance
    BLOCK_N: tl.constexpr,  # columns per step
):
    """A row a program, any width: a pass for the statistics, then a normalising pass.

    The first pass sums ``x - x[0]`` and its square per lane (the shift keeps the
    variance from cancelling when the mean is large against the spread); the second
    re-reads the row, which the first has just brought into L2: the first pass's loads ask L2 to
    keep the row (evict_last), the second's to drop it (evict_first), so that rows read once do
    not push out rows still to be read twice (a smaller grid, bounding the rows in flight,
    measured no better at 65536; docs/kernels.md, "layer_norm: forward").
    """
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x
    y_row = y_ptr + row * stride_y
    cols = tl.arange(0, BLOCK_N)
    shift = tl.load(x_row).to(tl.float32)
    s1 = tl.zeros([BLOCK_N], tl.float32)
    s2 = tl.zeros([BLOCK_N], tl.float32)
    for start in tl.range(0, n_cols, BLOCK_N, num_stages=1):
        offs = start + cols
        mask = offs < n_cols
        x = tl.load(x_row + offs, mask=mask, other=0.0, eviction_policy="evict_last")
        d = tl.where(mask, x.to(tl.float32) - shift, 0.0)
        s1 += d
        s2 += d * d
    mean_d = tl.sum(s1, axis=0) / n_cols
    var = tl.sum(s2, axis=0) / n_cols - mean_d * mean_d
    var = tl.where(var < 0.0, 0.0, var)  # rounding; not tl.maximum, which would drop a nan
    mean = shift + mean_d
    rstd = 1.0 / tl.sqrt(var + eps)
    tl.store(mean_ptr + row, mean)
    tl.store(rstd_ptr + row, rstd)
    for start in tl.range(0, n_cols, BLOCK_N, num_stages=1):
        offs = start + cols
        mask = offs < n_cols
        x = tl.load(x_row + offs, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
        w = tl.load(w_ptr + offs, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
        b = tl.load(b_ptr + offs, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
        y = (x - mean) * rstd * w + b
        tl.store(y_row + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _layer_norm_fwd_split_kernel(
    x_ptr,  # input: row r's first element at x_ptr + x_phase + r * stride_x, unit column stride
    w_ptr,  # (N,) weight
    b_ptr,  # (N,) bias
    y_ptr,  # output: row r's first element at y_ptr + x_phase + r * stride_y (same phase, _ragged.phased)
    mean_ptr,  # (M,) float32 out: row means
    rstd_ptr,  # (M,) float32 out: 1 / sqrt(var + eps)
    part_ptr,  # (M, GROUP, 2) float32 per-slice (sum, sum of squares) of x - x[row, 0]; unused when GROUP == 1
    sync_ptr,  # ((M + 1) * COUNTER_STRIDE,) int32 zeros: arrivals per row, then the ticket; unused when GROUP == 1
    x_phase,  # phase of row 0 (0 when VEC == 1)
    n_rows,  # M
    n_cols,  # N
    stride_x,  # elements between rows of x
    stride_y,  # elements between rows of y
    slice_cols,  # virtual columns per slice: a multiple of BLOCK_N, GROUP slices cover N + VEC - 1
    n_programs,  # programs launched (a few an SM)
    eps,  # added to the variance
    GROUP: tl.constexpr,  # slices (programs) per row
    BLOCK_N: tl.constexpr,  # columns per step
    BLOCK_G: tl.constexpr,  # next_power_of_2(GROUP)
    SUB: tl.constexpr,  # neighbouring elements summed in-thread before the running sums (16 bytes' worth)
    HOLD: tl.constexpr,  # a tile is one step (slice_cols == BLOCK_N): pass two reuses the registers, no re-read
    EARLY: tl.constexpr,  # HOLD and GROUP == 1: the next tile's loads go out before this one's reductions
    VEC: tl.constexpr,  # elements in 16 bytes for rows that start unaligned, 1 when every row is aligned
):
    """The split walk (``_split_walk``, as ``softmax._softmax_split_kernel``) for layer norm: persistent programs, each
    taking tiles (a row, or one of a row's GROUP slices) twice, statistics then normalise,
    with the next step's chunk always in flight and the second pass read from L2 (or
    held in registers when a tile is one step; with GROUP == 1 the next tile's chunk is
    then loaded before this tile's reductions, ``EARLY``). Every slice of a row sums ``x - x[row, 0]``
    and its square, so the slices' sums simply add (the shift keeps the variance from
    cancelling, as in the looped kernel); GROUP > 1 exchanges them through ``part`` with
    the walk's ticketed, deadlock-free wait, adding them in slice order (the
    result does not depend on arrival order). Slice 0 writes the row's mean and rstd.
    Columns are virtual (``_ragged``, as in softmax's walk): slices are cut in that space, a
    row with a small phase can leave its last slice empty (it publishes zero sums), and the
    row's edge elements are loaded before pass one and stored after pass two.
    """
    n_tiles = n_rows * GROUP
    tile = first_tile(sync_ptr, n_rows, GROUP)
    cols = tl.arange(0, BLOCK_N)
    row, lo = tile_start(tile, n_rows, slice_cols, GROUP)
    x_next = _fwd_row_chunk(x_ptr, x_phase, row, stride_x, lo, cols, n_cols, VEC)
    shift_next = row_first(x_ptr, x_phase, row, stride_x, VEC)
    while tile < n_tiles:
        row = tile // GROUP
        lo = (tile % GROUP) * slice_cols
        x_base, ph = row_origin(x_phase, row, stride_x, VEC)
        y_base, _ = row_origin(x_phase, row, stride_y, VEC)
        hi = tl.minimum(lo + slice_cols, ph + n_cols)
        x_row = x_ptr + x_base
        y_row = y_ptr + y_base
        if VEC > 1:  # the tile's edge elements, loaded now so that their latency hides behind pass one
            v_e, e_ok = edges(ph, n_cols, VEC)
            e_ok = e_ok & (v_e >= lo) & (v_e < hi)
            x_e = tl.load(x_row + v_e, mask=e_ok, other=0.0)
        shift = shift_next
        s1 = tl.zeros([BLOCK_N // SUB], tl.float32)
        s2 = tl.zeros([BLOCK_N // SUB], tl.float32)
        for start in range(lo, hi, BLOCK_N):
            d = tl.where(_own(start + cols, ph, n_cols, VEC), x_next.to(tl.float32) - shift, 0.0)
            if not HOLD:  # HOLD: x_next stays this chunk, which pass two normalises from registers
                nxt = start + BLOCK_N
                nxt = tl.where(nxt < hi, nxt, lo)  # after the last chunk: the first again, for pass two
                x_next = tl.load(x_row + nxt + cols, mask=nxt + cols < vec_end(ph, n_cols, VEC), other=0.0)
            d = tl.reshape(d, (BLOCK_N // SUB, SUB))
            s1 += tl.sum(d, axis=1)
            s2 += tl.sum(d * d, axis=1)
        if EARLY:  # the next tile is known without a wait: its loads fly during the reductions
            x_held = x_next
            early_row, early_lo = tile_start(tile + n_programs, n_rows, slice_cols, GROUP)
            x_next = _fwd_row_chunk(x_ptr, x_phase, early_row, stride_x, early_lo, cols, n_cols, VEC)
        t1 = tl.sum(s1, axis=0)
        t2 = tl.sum(s2, axis=0)
        if GROUP == 1:
            next_tile = tile + n_programs
        else:
            p1, p2, next_tile = exchange_partials(part_ptr, sync_ptr, row, tile % GROUP, t1, t2, n_rows, 0.0, 0.0,
                                                   GROUP, BLOCK_G)
            t1 = tl.sum(p1, axis=0)
            t2 = tl.sum(p2, axis=0)
        mean_d = t1 / n_cols
        var = t2 / n_cols - mean_d * mean_d
        var = tl.where(var < 0.0, 0.0, var)  # rounding; not tl.maximum, which would drop a nan
        mean = shift + mean_d
        rstd = 1.0 / tl.sqrt(var + eps)
        if tile % GROUP == 0:
            tl.store(mean_ptr + row, mean)
            tl.store(rstd_ptr + row, rstd)
        next_row, next_lo = tile_start(next_tile, n_rows, slice_cols, GROUP)
        shift_next = row_first(x_ptr, x_phase, next_row, stride_x, VEC)
        first, last = body_bounds(ph, n_cols, VEC)
        for start in range(lo, hi, BLOCK_N):
            if EARLY:
                x = x_held.to(tl.float32)
            else:
                x = x_next.to(tl.float32)
                pre_row, pre_col = prefetch_target(start, hi, row, next_row, next_lo, BLOCK_N)
                x_next = _fwd_row_chunk(x_ptr, x_phase, pre_row, stride_x, pre_col, cols, n_cols, VEC)
            v = start + cols
            mine = _own(v, ph, n_cols, VEC)
            w = tl.load(w_ptr + (v - ph), mask=mine, other=0.0).to(tl.float32)
            b = tl.load(b_ptr + (v - ph), mask=mine, other=0.0).to(tl.float32)
            y = (x - mean) * rstd * w + b
            tl.store(y_row + v, y.to(y_ptr.dtype.element_ty), mask=(v >= first) & (v < last))
        if VEC > 1:
            if hi <= lo:  # an empty slice: nothing prefetched the next tile's first chunk
                x_next = _fwd_row_chunk(x_ptr, x_phase, next_row, stride_x, next_lo, cols, n_cols, VEC)
            w_e = tl.load(w_ptr + (v_e - ph), mask=e_ok, other=0.0).to(tl.float32)
            b_e = tl.load(b_ptr + (v_e - ph), mask=e_ok, other=0.0).to(tl.float32)
            y_e = (x_e.to(tl.float32) - mean) * rstd * w_e + b_e
            tl.store(y_row + v_e, y_e.to(y_ptr.dtype.element_ty), mask=e_ok)
        tile = next_tile


@triton.jit
def _own(v, ph, n_cols, VEC: tl.constexpr):
    """Virtual columns ``v`` that hold the row's own elements (``_ragged.in_row``; VEC 1: plain ``v < N``, which
    Triton's divisibility analysis keeps vectorised)."""
    if VEC > 1:
        return in_row(v, ph, n_cols)
    else:
        return v < n_cols


@triton.jit
def _fwd_row_chunk(x_ptr, x_phase, row, stride_x, start, cols, n_cols, VEC: tl.constexpr):
    """The chunk of ``row`` at virtual columns ``start + cols``, whole vectors (_ragged), 0 past the row's last vector."""
    base, ph = row_origin(x_phase, row, stride_x, VEC)
    return tl.load(x_ptr + base + start + cols, mask=start + cols < vec_end(ph, n_cols, VEC), other=0.0)


@triton.jit
def _wait_for_peers(count_ptr, n_peers):
    """Arrive at ``count_ptr`` and spin until ``n_peers`` programs (a row's chunks) have arrived.

    The wait is safe because the one-pass programs take their tile numbers from an atomic
    counter in the order they start, so the tiles handed out always form a prefix: every row
    but the last handed-out one has all its chunk programs running, and a row needs only
    ``n_chunks`` co-resident programs (the plan takes one pass only where the device holds them at once).
    The first barrier puts every thread's earlier stores into this program's release; the
    spin reads through to L2 without an atomic, and one acquire afterwards orders the reads
    of the peers' partials after their releases.
    """
    tl.debug_barrier()
    tl.atomic_add(count_ptr, 1, sem="release", scope="gpu")
    arrived = tl.load(count_ptr, volatile=True)
    while arrived < n_peers:
        arrived = tl.load(count_ptr, volatile=True)
    tl.atomic_add(count_ptr, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()


@triton.jit
def _sum_shares_if_last(dw_part_ptr, db_part_ptr, dw_ptr, db_ptr, count_ptr, n_groups, n_cols, cols, col_ok,
                        BLOCK_N: tl.constexpr, UNROLL: tl.constexpr = 4):
    """Arrive at ``count_ptr`` once this program's shares of ``cols`` are stored; the last of the ``n_groups`` programs
    to arrive adds every group's shares of them, in group order (deterministic), into dweight and dbias in their
    dtypes: a backward's one launch where its shares are few, and the shares' one launch where splits of them are
    summed first (docs/kernels.md, "layer_norm: backward").

    Nothing waits: the last arrival alone reads, so no program needs another resident. The barrier and the release
    put every thread's share stores before the arrival; the last program's acquire, then a barrier, order its reads
    (through to L2) after every release (as ``_wait_for_peers``).
    """
    tl.debug_barrier()
    ticket = tl.atomic_add(count_ptr, 1, sem="release", scope="gpu")
    if ticket == n_groups - 1:
        tl.atomic_add(count_ptr, 0, sem="acquire", scope="gpu")
        tl.debug_barrier()
        dw = tl.zeros((BLOCK_N,), dtype=tl.float32)
        db = tl.zeros((BLOCK_N,), dtype=tl.float32)
        for g0 in range(0, n_groups, UNROLL):  # UNROLL groups' loads in flight at once, added in order
            for j in tl.static_range(UNROLL):
                g = cols * 0 + g0 + j  # a vector, as the masks are
                ok = col_ok & (g < n_groups)
                share = g.to(tl.int64) * n_cols + cols
                dw += tl.load(dw_part_ptr + share, mask=ok, other=0.0, cache_modifier=".cg")
                db += tl.load(db_part_ptr + share, mask=ok, other=0.0, cache_modifier=".cg")
        tl.store(dw_ptr + cols, dw.to(dw_ptr.dtype.element_ty), mask=col_ok)
        tl.store(db_ptr + cols, db.to(db_ptr.dtype.element_ty), mask=col_ok)


@triton.jit
def _load_row_block(x_ptr, dy_ptr, r0, row_end, cols, col_ok, stride_x, stride_dy, BLOCK_M: tl.constexpr):
    """Rows [r0, r0 + BLOCK_M) of x and dy as stored, masked to rows below ``row_end``."""
    rows = r0 + tl.arange(0, BLOCK_M)
    mask = (rows < row_end)[:, None] & col_ok[None, :]
    rows64 = rows.to(tl.int64)
    x = tl.load(x_ptr + rows64[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)
    dy = tl.load(dy_ptr + rows64[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0)
    return x, dy


@triton.jit
def _layer_norm_bwd_kernel(
    x_ptr,  # (M, N) forward input; row stride stride_x
    dy_ptr,  # (M, N) gradient of y; row stride stride_dy
    w_ptr,  # (N,) weight
    mean_ptr,  # (M,) float32 row means from the forward
    rstd_ptr,  # (M,) float32 reciprocal standard deviations from the forward
    dx_ptr,  # (M, N) gradient of x; row stride stride_dx
    dw_part_ptr,  # (n_groups, N) float32: this row group's share of dweight; with one group, dweight itself
    db_part_ptr,  # (n_groups, N) float32: this row group's share of dbias; with one group, dbias itself
    part_ptr,  # (M, 2, n_chunks) float32 chunk sums of (xhat * w * dy, w * dy); unused in rows mode
    count_ptr,  # ((cdiv(M, BLOCK_M) + 1) * COUNTER_STRIDE,) int32 zeros: arrivals per row block, then the tile
    # counter; with SUM_HERE (1,): the groups' arrivals
    dw_ptr,  # (N,) dweight: the shares' sum where SUM_HERE, else unused
    db_ptr,  # (N,) dbias: as dw_ptr
    n_rows,  # M
    n_cols,  # N
    stride_x,  # elements between rows of x
    stride_dy,  # elements between rows of dy
    stride_dx,  # elements between rows of dx
    rows_per_group,  # rows a program walks through; a multiple of BLOCK_M
    n_chunks,  # chunks per row: cdiv(N, BLOCK_N); 1 in rows mode
    MODE: tl.constexpr,  # _ROWS, _ONE_PASS, _STATS or _FROM_STATS
    BLOCK_M: tl.constexpr,  # rows per step of the walk
    BLOCK_N: tl.constexpr,  # columns per program: >= N in rows mode, else the chunk width
    BLOCK_C: tl.constexpr,  # next_power_of_2(n_chunks)
    PREFETCH: tl.constexpr = False,  # rows mode: load the next row block before working on this one
    NARROW: tl.constexpr = 0,  # rows mode: 0, or N = the three strides for packed rows (_packed_width)
    SUM_HERE: tl.constexpr = False,  # rows mode: the last group to finish sums the shares (_sum_shares_if_last)
):
    tl.static_assert(MODE == _ROWS or not SUM_HERE)
    if NARROW > 0:  # compile-time row length and strides: rows load as vectors of their alignment
        n_cols = NARROW
        stride_x = NARROW
        stride_dy = NARROW
        stride_dx = NARROW
    if MODE == _ONE_PASS:
        tile = tl.atomic_add(count_ptr + tl.cdiv(n_rows, BLOCK_M) * COUNTER_STRIDE, 1)
    else:
        tile = tl.program_id(0)
    group = tile // n_chunks
    chunk = tile % n_chunks
    cols = chunk * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < n_cols
    w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    dw_acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    db_acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    row_start = group * rows_per_group
    row_end = tl.minimum(row_start + rows_per_group, n_rows)
    if PREFETCH:  # in the input dtype (16-bit: packed); past row_end masked off, no traffic
        x_next, dy_next = _load_row_block(x_ptr, dy_ptr, row_start, row_end, cols, col_ok, stride_x, stride_dy, BLOCK_M)
    for r0 in range(row_start, row_end, BLOCK_M):
        rows = r0 + tl.arange(0, BLOCK_M)
        row_ok = rows < row_end
        mask = row_ok[:, None] & col_ok[None, :]
        rows64 = rows.to(tl.int64)
        if PREFETCH:  # widen this block, then send the next one's loads
            x = x_next.to(tl.float32)
            dy = dy_next.to(tl.float32)
            x_next, dy_next = _load_row_block(x_ptr, dy_ptr, r0 + BLOCK_M, row_end, cols, col_ok, stride_x, stride_dy,
                                              BLOCK_M)
        else:
            x, dy = _load_row_block(x_ptr, dy_ptr, r0, row_end, cols, col_ok, stride_x, stride_dy, BLOCK_M)
            x = x.to(tl.float32)
            dy = dy.to(tl.float32)
        mean = tl.load(mean_ptr + rows, mask=row_ok, other=0.0)
        rstd = tl.load(rstd_ptr + rows, mask=row_ok, other=0.0)
        xhat = tl.where(mask, (x - mean[:, None]) * rstd[:, None], 0.0)
        wdy = w[None, :] * dy
        if MODE == _ROWS:
            c1 = tl.sum(xhat * wdy, axis=1) / n_cols
            c2 = tl.sum(wdy, axis=1) / n_cols
        else:
            part_1_ptr = part_ptr + rows64 * (2 * n_chunks)
            part_2_ptr = part_1_ptr + n_chunks
            if MODE != _FROM_STATS:
                tl.store(part_1_ptr + chunk, tl.sum(xhat * wdy, axis=1), mask=row_ok)
                tl.store(part_2_ptr + chunk, tl.sum(wdy, axis=1), mask=row_ok)
            if MODE == _ONE_PASS:
                _wait_for_peers(count_ptr + (r0 // BLOCK_M) * COUNTER_STRIDE, n_chunks)
            if MODE != _STATS:
                c = tl.arange(0, BLOCK_C)
                pmask = row_ok[:, None] & (c < n_chunks)[None, :]
                c1 = tl.sum(tl.load(part_1_ptr[:, None] + c[None, :], mask=pmask, other=0.0, volatile=True), axis=1)
                c2 = tl.sum(tl.load(part_2_ptr[:, None] + c[None, :], mask=pmask, other=0.0, volatile=True), axis=1)
                c1 = c1 / n_cols
                c2 = c2 / n_cols
        if MODE != _STATS:
            dx = (wdy - (xhat * c1[:, None] + c2[:, None])) * rstd[:, None]
            tl.store(dx_ptr + rows64[:, None] * stride_dx + cols[None, :], dx.to(dx_ptr.dtype.element_ty), mask=mask)
            dw_acc += dy * xhat
            db_acc += dy
    if MODE != _STATS:
        group64 = group.to(tl.int64)
        tl.store(dw_part_ptr + group64 * n_cols + cols, tl.sum(dw_acc, axis=0).to(dw_part_ptr.dtype.element_ty),
                 mask=col_ok)
        tl.store(db_part_ptr + group64 * n_cols + cols, tl.sum(db_acc, axis=0).to(db_part_ptr.dtype.element_ty),
                 mask=col_ok)
        if SUM_HERE:
            _sum_shares_if_last(dw_part_ptr, db_part_ptr, dw_ptr, db_ptr, count_ptr, tl.num_programs(0), n_cols, cols,
                                col_ok, BLOCK_N)


@triton.jit
def _layer_norm_bwd_lean_kernel(
    x_ptr,  # (M, N) forward input; row stride stride_x
    dy_ptr,  # (M, N) gradient of y; row stride stride_dy
    w_ptr,  # (N,) weight
    mean_ptr,  # (M,) float32 row means from the forward
    rstd_ptr,  # (M,) float32 reciprocal standard deviations from the forward
    dx_ptr,  # (M, N) gradient of x; row stride stride_dx
    dw_part_ptr,  # (n_groups, N) float32: this row group's share of dweight
    db_part_ptr,  # (n_groups, N) float32: this row group's share of dbias
    part_ptr,  # (M, 2, n_chunks) float32 chunk sums of (xhat * w * dy, w * dy); unused in rows mode
    count_ptr,  # ((M + 1) * COUNTER_STRIDE,) int32 zeros: arrivals per row, then the tile counter
    n_rows,  # M
    n_cols,  # N
    stride_x,  # elements between rows of x
    stride_dy,  # elements between rows of dy
    stride_dx,  # elements between rows of dx
    rows_per_group,  # rows a program walks through
    n_chunks,  # chunks per row: cdiv(N, BLOCK_N); 1 in rows mode
    MODE: tl.constexpr,  # _ROWS, _ONE_PASS, _STATS or _FROM_STATS
    BLOCK_N: tl.constexpr,  # columns per program: >= N in rows mode, else the chunk width
    BLOCK_C: tl.constexpr,  # next_power_of_2(n_chunks)
):
    """The register-lean backward: one row a step, the next row's loads in flight meanwhile.

    Each step holds one row (or chunk of a row) of ``BLOCK_N`` elements, a few a thread;
    before working on row ``r`` it issues the loads of row ``r + 1`` (in the input dtype:
    packed, half the registers for 16-bit inputs), so the memory system always has one
    row per program in flight, including while a chunk waits for its peers. dweight and
    dbias only need the saved statistics, so they are accumulated as soon as a row
    arrives and ``x``/``dy`` die before the row reductions. Addresses are 32-bit column
    offsets from a 64-bit row pointer formed once a row.
    """
    if MODE == _ONE_PASS:
        tile = tl.atomic_add(count_ptr + n_rows * COUNTER_STRIDE, 1)
    else:
        tile = tl.program_id(0)
    group = tile // n_chunks
    chunk = tile % n_chunks
    cols = chunk * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < n_cols
    row_start = group * rows_per_group
    row_end = tl.minimum(row_start + rows_per_group, n_rows)
    w_in = tl.load(w_ptr + cols, mask=col_ok, other=0.0)  # widened where used: fewer registers
    dw_acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    db_acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    x_next = tl.load(x_ptr + row_start.to(tl.int64) * stride_x + cols, mask=col_ok, other=0.0)
    dy_next = tl.load(dy_ptr + row_start.to(tl.int64) * stride_dy + cols, mask=col_ok, other=0.0)
    mean_next = tl.load(mean_ptr + row_start)
    rstd_next = tl.load(rstd_ptr + row_start)
    for row in range(row_start, row_end):
        row64 = tl.cast(row, tl.int64)
        x = x_next
        dy_in = dy_next
        mean = mean_next
        rstd = rstd_next
        ahead = tl.minimum(row + 1, row_end - 1).to(tl.int64)  # the last row reloads itself
        x_next = tl.load(x_ptr + ahead * stride_x + cols, mask=col_ok, other=0.0)
        dy_next = tl.load(dy_ptr + ahead * stride_dy + cols, mask=col_ok, other=0.0)
        mean_next = tl.load(mean_ptr + ahead)
        rstd_next = tl.load(rstd_ptr + ahead)
        dy = dy_in.to(tl.float32)
        xhat = (x.to(tl.float32) - mean) * rstd  # off the row it meets dy = w = 0: no mask needed
        if MODE != _STATS:
            dw_acc += dy * xhat
            db_acc += dy
        wdy = w_in.to(tl.float32) * dy
        if MODE == _ROWS:
            c1 = tl.sum(xhat * wdy, axis=0) / n_cols
            c2 = tl.sum(wdy, axis=0) / n_cols
        else:
            part_1_ptr = part_ptr + row64 * (2 * n_chunks)
            part_2_ptr = part_1_ptr + n_chunks
            if MODE != _FROM_STATS:
                tl.store(part_1_ptr + chunk, tl.sum(xhat * wdy, axis=0))
                tl.store(part_2_ptr + chunk, tl.sum(wdy, axis=0))
            if MODE == _ONE_PASS:
                _wait_for_peers(count_ptr + row * COUNTER_STRIDE, n_chunks)
            if MODE != _STATS:
                c = tl.arange(0, BLOCK_C)
                c1 = tl.sum(tl.load(part_1_ptr + c, mask=c < n_chunks, other=0.0, volatile=True), axis=0) / n_cols
                c2 = tl.sum(tl.load(part_2_ptr + c, mask=c < n_chunks, other=0.0, volatile=True), axis=0) / n_cols
        if MODE != _STATS:
            dx = (wdy - (xhat * c1 + c2)) * rstd
            tl.store(dx_ptr + row64 * stride_dx + cols, dx.to(dx_ptr.dtype.element_ty), mask=col_ok)
    if MODE != _STATS:
        group64 = group.to(tl.int64)
        tl.store(dw_part_ptr + group64 * n_cols + cols, dw_acc, mask=col_ok)
        tl.store(db_part_ptr + group64 * n_cols + cols, db_acc, mask=col_ok)


@triton.jit
def _bwd_row_terms(x_in, dy_in, own, mean, rstd):
    """A backward piece's (dy, x-hat) in float32, 0 outside the row's own lanes ``own``."""
    dy = tl.where(own, dy_in.to(tl.float32), 0.0)
    return dy, tl.where(own, (x_in.to(tl.float32) - mean) * rstd, 0.0)


@triton.jit
def _layer_norm_bwd_phased_kernel(
    x_ptr,  # forward input: row r's first element at x_ptr + x_phase + r * stride_x, unit column stride
    dy_ptr,  # gradient of y, rows at x's phase (_ragged.phased_rows)
    w_ptr,  # (N,) weight
    mean_ptr,  # (M,) float32 row means from the forward
    rstd_ptr,  # (M,) float32 reciprocal standard deviations from the forward
    dx_ptr,  # gradient of x, rows at x's phase
    dw_part_ptr,  # (n_groups, N) float32: this program's share of dweight
    db_part_ptr,  # (n_groups, N) float32: this program's share of dbias
    x_phase,  # phase of row 0 (0 when VEC == 1)
    n_rows,  # M
    n_cols,  # N
    stride_x,  # elements between rows of x
    stride_dy,  # elements between rows of dy
    stride_dx,  # elements between rows of dx
    n_groups,  # programs; a multiple of VEC, so that every row a program takes has the same phase
    BLOCK_N: tl.constexpr,  # virtual columns of the row's first piece (with BLOCK_T: >= N + VEC - 1)
    VEC: tl.constexpr,  # elements in 16 bytes for rows that start unaligned, 1 when every row is aligned
    PREFETCH: tl.constexpr,  # the next row's x and dy loaded (into registers) before this row is reduced
    STAGES: tl.constexpr = 1,  # software-pipelining depth of the row loop: STAGES - 1 rows in flight in shared memory
    BLOCK_T: tl.constexpr = 0,  # virtual columns of a second piece, from BLOCK_N on (_ragged.row_pieces); 0: none
    EDGE_WORDS: tl.constexpr = False,  # 16-bit rows: the edges read as 32-bit words (_ragged.edge_words)
    TAIL: tl.constexpr = False,  # with EDGE_WORDS: the pieces stop a vector short of the widest phase, whose
    # last vector the words then hold (a body vector past the pieces: in the sums and the shares too)
    MERGE: tl.constexpr = 0,  # > 0 (the program's threads, dividing both pieces): both pieces' sums in one reduction
    BLOCK_U: tl.constexpr = 0,  # virtual columns of a third piece, from BLOCK_N + BLOCK_T on (MERGE dividing it too); 0: none
    AHEAD: tl.constexpr = False,  # the third piece loaded a row ahead into registers: 16-bit pieces of under two lanes
    # a thread load 2 bytes, which cp.async does not take (synchronous in the pipelined loop)
    FULL: tl.constexpr = False,  # the first piece lies inside every row (aligned rows wider than it): no masks there
):
    """Whole rows, aligned or not (``_ragged``): program g takes rows g, g + n_groups, ...

    With n_groups a multiple of VEC (and every tensor's rows at x's phase) all of a program's
    rows share one phase, so dweight/dbias accumulate in the program's virtual columns and
    shift to the real ones once, at the end; the weight is read at that shift once too. x
    and dy go in whole aligned vectors; dx is stored as whole vectors plus the row's edges, whose
    x and dy are loaded apart (they stay in L1). The next rows' loads are in flight while this row
    is reduced: with STAGES > 1 through shared memory (``tl.range``'s pipeliner, ``cp.async``: no
    registers held), with PREFETCH in registers (docs/kernels.md, "layer_norm: backward").
    """
    tl.static_assert(not (PREFETCH and BLOCK_T > 0), "a row in two pieces is not prefetched into registers")
    tl.static_assert(not TAIL or (EDGE_WORDS and VEC == 8), "a tail in words is for 16-bit rows read as words")
    tl.static_assert(BLOCK_U == 0 or (BLOCK_T > 0 and MERGE > 0), "a third piece is for merged pieces")
    tl.static_assert(not AHEAD or BLOCK_U > 0, "a row ahead is for a third piece")
    tl.static_assert(not FULL or (VEC == 1 and BLOCK_T > 0 and not PREFETCH), "a full first piece: aligned rows in pieces")
    g = tl.program_id(0)
    v = tl.arange(0, BLOCK_N)
    _, ph = row_origin(x_phase, g, stride_x, VEC)
    mine = _own(v, ph, n_cols, VEC)
    load_ok = v < vec_end(ph, n_cols, VEC)
    w = tl.load(w_ptr + (v - ph), mask=mine, other=0.0).to(tl.float32)
    first, last = body_bounds(ph, n_cols, VEC)
    body = (v >= first) & (v < last)
    if BLOCK_T > 0:  # the second piece: its own lanes, weight and sums
        v_t = BLOCK_N + tl.arange(0, BLOCK_T)
        mine_t = _own(v_t, ph, n_cols, VEC)
        load_ok_t = v_t < vec_end(ph, n_cols, VEC)
        w_t = tl.load(w_ptr + (v_t - ph), mask=mine_t, other=0.0).to(tl.float32)
        body_t = (v_t >= first) & (v_t < last)
        dw_acc_t = tl.zeros((BLOCK_T,), dtype=tl.float32)
        db_acc_t = tl.zeros((BLOCK_T,), dtype=tl.float32)
    if BLOCK_U > 0:  # the third piece, as the second
        v_u = BLOCK_N + BLOCK_T + tl.arange(0, BLOCK_U)
        mine_u = _own(v_u, ph, n_cols, VEC)
        load_ok_u = v_u < vec_end(ph, n_cols, VEC)
        w_u = tl.load(w_ptr + (v_u - ph), mask=mine_u, other=0.0).to(tl.float32)
        body_u = (v_u >= first) & (v_u < last)
        dw_acc_u = tl.zeros((BLOCK_U,), dtype=tl.float32)
        db_acc_u = tl.zeros((BLOCK_U,), dtype=tl.float32)
    if VEC == 8 and EDGE_WORDS:  # 16-bit: the edges' two vectors as 32-bit words (_ragged.edge_words)
        e = edge_word_columns(ph, n_cols, VEC, BLOCK_N + BLOCK_T)  # (2, 4): the words' even columns; e + 1 odd
        e_ok = in_row(e, ph, n_cols)
        e_ok_hi = in_row(e + 1, ph, n_cols)
        w_e = tl.load(w_ptr + (e - ph), mask=e_ok, other=0.0).to(tl.float32)
        w_e_hi = tl.load(w_ptr + (e + 1 - ph), mask=e_ok_hi, other=0.0).to(tl.float32)
        if TAIL:  # the row's words past the pieces
            e_sum = e_ok & (e >= BLOCK_N + BLOCK_T)
            e_sum_hi = e_ok_hi & (e + 1 >= BLOCK_N + BLOCK_T)
            dw_acc_e = tl.zeros(e.shape, dtype=tl.float32)
            db_acc_e = tl.zeros(e.shape, dtype=tl.float32)
            dw_acc_e_hi = tl.zeros(e.shape, dtype=tl.float32)
            db_acc_e_hi = tl.zeros(e.shape, dtype=tl.float32)
    elif VEC > 1:
        e, e_ok = edges(ph, n_cols, VEC)
        w_e = tl.load(w_ptr + (e - ph), mask=e_ok, other=0.0).to(tl.float32)
    dw_acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    db_acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    first_row = tl.minimum(g, n_rows - 1)  # a program without rows loads row n_rows - 1 and never uses it
    x_base, _ = row_origin(x_phase, first_row, stride_x, VEC)
    dy_base, _ = row_origin(x_phase, first_row, stride_dy, VEC)
    if PREFETCH:
        x_next = tl.load(x_ptr + x_base + v, mask=load_ok, other=0.0)
        dy_next = tl.load(dy_ptr + dy_base + v, mask=load_ok, other=0.0)
    if AHEAD:
        # a program without rows loads nothing (row n_rows - 1 may be at another phase; a tensor compare: the
        # interpreter's loads refuse a scalar's mask)
        first_ok = load_ok_u & (g + 0 * v_u < n_rows)
        x_u_next = tl.load(x_ptr + x_base + v_u, mask=first_ok, other=0.0)
        dy_u_next = tl.load(dy_ptr + dy_base + v_u, mask=first_ok, other=0.0)
    for r in tl.range(g, n_rows, n_groups, num_stages=STAGES):
        row = tl.cast(r, tl.int64)
        x_base, _ = row_origin(x_phase, row, stride_x, VEC)
        dy_base, _ = row_origin(x_phase, row, stride_dy, VEC)
        dx_base, _ = row_origin(x_phase, row, stride_dx, VEC)
        if PREFETCH:
            x_in = x_next
            dy_in = dy_next
            ahead = tl.minimum(row + n_groups, n_rows - 1)  # the last rows reload one that exists
            a_x, _ = row_origin(x_phase, ahead, stride_x, VEC)
            a_dy, _ = row_origin(x_phase, ahead, stride_dy, VEC)
            x_next = tl.load(x_ptr + a_x + v, mask=load_ok, other=0.0)
            dy_next = tl.load(dy_ptr + a_dy + v, mask=load_ok, other=0.0)
        else:
            if FULL:
                x_in = tl.load(x_ptr + x_base + v)
                dy_in = tl.load(dy_ptr + dy_base + v)
            else:
                x_in = tl.load(x_ptr + x_base + v, mask=load_ok, other=0.0)
                dy_in = tl.load(dy_ptr + dy_base + v, mask=load_ok, other=0.0)
        if BLOCK_T > 0:
            x_t_in = tl.load(x_ptr + x_base + v_t, mask=load_ok_t, other=0.0)
            dy_t_in = tl.load(dy_ptr + dy_base + v_t, mask=load_ok_t, other=0.0)
        if BLOCK_U > 0:
            if AHEAD:  # this row's third piece from the registers; the next row's on its way
                x_u_in = x_u_next
                dy_u_in = dy_u_next
                ahead = tl.where(row + n_groups < n_rows, row + n_groups, row)  # the last rows reload their own
                a_x, _ = row_origin(x_phase, ahead, stride_x, VEC)
                a_dy, _ = row_origin(x_phase, ahead, stride_dy, VEC)
                x_u_next = tl.load(x_ptr + a_x + v_u, mask=load_ok_u, other=0.0)
                dy_u_next = tl.load(dy_ptr + a_dy + v_u, mask=load_ok_u, other=0.0)
            else:
                x_u_in = tl.load(x_ptr + x_base + v_u, mask=load_ok_u, other=0.0)
                dy_u_in = tl.load(dy_ptr + dy_base + v_u, mask=load_ok_u, other=0.0)
        if VEC == 8 and EDGE_WORDS:
            x_e, x_e_hi, _cols = edge_words(x_ptr, x_base, ph, n_cols, VEC, BLOCK_N + BLOCK_T)
            dy_e, dy_e_hi, _cols = edge_words(dy_ptr, dy_base, ph, n_cols, VEC, BLOCK_N + BLOCK_T)
        elif VEC > 1:
            x_e = tl.load(x_ptr + x_base + e, mask=e_ok, other=0.0).to(tl.float32)
            dy_e = tl.load(dy_ptr + dy_base + e, mask=e_ok, other=0.0).to(tl.float32)
        mean = tl.load(mean_ptr + row)
        rstd = tl.load(rstd_ptr + row)
        if FULL:
            dy = dy_in.to(tl.float32)
            xhat = (x_in.to(tl.float32) - mean) * rstd
        else:
            dy, xhat = _bwd_row_terms(x_in, dy_in, mine, mean, rstd)
        dw_acc += dy * xhat
        db_acc += dy
        wdy = w * dy
        if MERGE > 0:  # both pieces' sums in one reduction: each thread's lanes of either piece added first
            dy_t, xhat_t = _bwd_row_terms(x_t_in, dy_t_in, mine_t, mean, rstd)
            dw_acc_t += dy_t * xhat_t
            db_acc_t += dy_t
            wdy_t = w_t * dy_t
            p1 = (tl.sum(tl.reshape(xhat * wdy, (MERGE, BLOCK_N // MERGE)), axis=1)
                  + tl.sum(tl.reshape(xhat_t * wdy_t, (MERGE, BLOCK_T // MERGE)), axis=1))
            p2 = (tl.sum(tl.reshape(wdy, (MERGE, BLOCK_N // MERGE)), axis=1)
                  + tl.sum(tl.reshape(wdy_t, (MERGE, BLOCK_T // MERGE)), axis=1))
            if BLOCK_U > 0:
                dy_u, xhat_u = _bwd_row_terms(x_u_in, dy_u_in, mine_u, mean, rstd)
                dw_acc_u += dy_u * xhat_u
                db_acc_u += dy_u
                wdy_u = w_u * dy_u
                p1 += tl.sum(tl.reshape(xhat_u * wdy_u, (MERGE, BLOCK_U // MERGE)), axis=1)
                p2 += tl.sum(tl.reshape(wdy_u, (MERGE, BLOCK_U // MERGE)), axis=1)
            s1, s2 = tl.reduce((p1, p2), 0, _add_pairs)
        else:  # a piece's two row sums (x-hat . w dy, sum of w dy) in one reduction
            s1, s2 = tl.reduce((xhat * wdy, wdy), 0, _add_pairs)
        if BLOCK_T > 0 and MERGE == 0:
            dy_t, xhat_t = _bwd_row_terms(x_t_in, dy_t_in, mine_t, mean, rstd)
            dw_acc_t += dy_t * xhat_t
            db_acc_t += dy_t
            wdy_t = w_t * dy_t
            t1, t2 = tl.reduce((xhat_t * wdy_t, wdy_t), 0, _add_pairs)
            s1 += t1
            s2 += t2
        if TAIL:
            xhat_e = tl.where(e_sum, (x_e - mean) * rstd, 0.0)
            xhat_e_hi = tl.where(e_sum_hi, (x_e_hi - mean) * rstd, 0.0)
            dy_e_own = tl.where(e_sum, dy_e, 0.0)
            dy_e_own_hi = tl.where(e_sum_hi, dy_e_hi, 0.0)
            dw_acc_e += dy_e_own * xhat_e
            db_acc_e += dy_e_own
            dw_acc_e_hi += dy_e_own_hi * xhat_e_hi
            db_acc_e_hi += dy_e_own_hi
            wdy_e_own = w_e * dy_e_own
            wdy_e_own_hi = w_e_hi * dy_e_own_hi
            s1 += tl.sum(xhat_e * wdy_e_own + xhat_e_hi * wdy_e_own_hi, axis=None)
            s2 += tl.sum(wdy_e_own + wdy_e_own_hi, axis=None)
        c1 = s1 / n_cols
        c2 = s2 / n_cols
        dx = (wdy - (xhat * c1 + c2)) * rstd
        if FULL:
            tl.store(dx_ptr + dx_base + v, dx.to(dx_ptr.dtype.element_ty))
        else:
            tl.store(dx_ptr + dx_base + v, dx.to(dx_ptr.dtype.element_ty), mask=body)
        if BLOCK_T > 0:
            dx_t = (wdy_t - (xhat_t * c1 + c2)) * rstd
            tl.store(dx_ptr + dx_base + v_t, dx_t.to(dx_ptr.dtype.element_ty), mask=body_t)
        if BLOCK_U > 0:
            dx_u = (wdy_u - (xhat_u * c1 + c2)) * rstd
            tl.store(dx_ptr + dx_base + v_u, dx_u.to(dx_ptr.dtype.element_ty), mask=body_u)
        if VEC > 1:
            xhat_e = (x_e - mean) * rstd
            wdy_e = w_e * dy_e
            dx_e = (wdy_e - (xhat_e * c1 + c2)) * rstd
            tl.store(dx_ptr + dx_base + e, dx_e.to(dx_ptr.dtype.element_ty), mask=e_ok)
            if VEC == 8 and EDGE_WORDS:  # the odd columns of the words
                dx_e_hi = (w_e_hi * dy_e_hi - ((x_e_hi - mean) * rstd * c1 + c2)) * rstd
                tl.store(dx_ptr + dx_base + e + 1, dx_e_hi.to(dx_ptr.dtype.element_ty), mask=e_ok_hi)
    share = g.to(tl.int64) * n_cols + (v - ph)
    tl.store(dw_part_ptr + share, dw_acc, mask=mine)
    tl.store(db_part_ptr + share, db_acc, mask=mine)
    if BLOCK_T > 0:
        share_t = g.to(tl.int64) * n_cols + (v_t - ph)
        tl.store(dw_part_ptr + share_t, dw_acc_t, mask=mine_t)
        tl.store(db_part_ptr + share_t, db_acc_t, mask=mine_t)
    if BLOCK_U > 0:
        share_u = g.to(tl.int64) * n_cols + (v_u - ph)
        tl.store(dw_part_ptr + share_u, dw_acc_u, mask=mine_u)
        tl.store(db_part_ptr + share_u, db_acc_u, mask=mine_u)
    if TAIL:
        share_e = g.to(tl.int64) * n_cols + (e - ph)
        tl.store(dw_part_ptr + share_e, dw_acc_e, mask=e_sum)
        tl.store(db_part_ptr + share_e, db_acc_e, mask=e_sum)
        tl.store(dw_part_ptr + share_e + 1, dw_acc_e_hi, mask=e_sum_hi)
        tl.store(db_part_ptr + share_e + 1, db_acc_e_hi, mask=e_sum_hi)


@triton.jit
def _flat_row_sums(a, q, seg, K: tl.constexpr, R: tl.constexpr):
    """Each segment's row totals of the per-segment sums ``a`` and ``q`` (a row: K consecutive segments of the
    window's R * K): an (S, S) mask of the segments that share a row, reduced (a segmented scan read back by
    ``tl.gather`` measured slower at 32 segments: docs/kernels.md, "Rows laid flat")."""
    slot = seg // K
    same_row = (slot[:, None] == slot[None, :]) & (seg < R * K)[None, :]
    return tl.reduce((tl.where(same_row, a[None, :], 0.0), tl.where(same_row, q[None, :], 0.0)), 1, _add_pairs)


@triton.jit
def _layer_norm_bwd_flat_kernel(
    x_ptr,  # forward input, contiguous (M, N), 16-byte aligned
    dy_ptr,  # gradient of y, laid out as x
    w_ptr,  # (N,) weight
    mean_ptr,  # (M,) float32 row means from the forward
    rstd_ptr,  # (M,) float32 reciprocal standard deviations from the forward
    dx_ptr,  # gradient of x, laid out as x
    dw_part_ptr,  # (n_groups * R, N) float32: this program's R shares of dweight
    db_part_ptr,  # (n_groups * R, N) float32: this program's R shares of dbias
    n_rows,  # M
    n_groups,  # programs
    N: tl.constexpr,  # row width, K * P
    P: tl.constexpr,  # segment: a power of two that divides N
    K: tl.constexpr,  # segments a row
    R: tl.constexpr,  # rows a window (R * K <= S)
    S: tl.constexpr,  # segments a tile (a power of two)
    STAGES: tl.constexpr,  # software-pipelining depth of the window loop
):
    """Aligned rows laid flat: a window is R whole rows, R * K segments of P contiguous elements, held
    in an (S, P) tile, so that a row whose width is not a power of two masks no lanes but the tile's
    last S - R * K segments (a 1536-wide row on its 2048-lane tile masks a quarter; six rows of 1280 fill
    30 of 32 segments of 256). Program g walks windows g, g + n_groups, ...; the loop is pipelined like
    the phased kernel's (the next windows' x and dy in flight through shared memory). A segment's two
    sums come from one reduction along the tile's rows, a row's from adding its K segments' (an (S, S)
    mask of the segments that share a row). Segment s of every window holds the same columns, so its
    weight loads once and its dweight/dbias accumulate in place; a program writes R share rows
    (docs/kernels.md, "layer_norm: backward", "Rows laid flat")."""
    g = tl.program_id(0)
    seg = tl.arange(0, S)
    slot = seg // K  # the segment's row in its window
    used = seg < R * K
    cols = (seg % K)[:, None] * P + tl.arange(0, P)[None, :]
    offs = seg[:, None] * P + tl.arange(0, P)[None, :]
    w = tl.load(w_ptr + cols, mask=used[:, None], other=0.0).to(tl.float32)
    dw_acc = tl.zeros((S, P), dtype=tl.float32)
    db_acc = tl.zeros((S, P), dtype=tl.float32)
    for i in tl.range(g, tl.cdiv(n_rows, R), n_groups, num_stages=STAGES):
        window = tl.cast(i, tl.int64)
        rows = window * R + slot
        ok = used & (rows < n_rows)
        base = window * (R * N)
        x = tl.load(x_ptr + base + offs, mask=ok[:, None], other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + base + offs, mask=ok[:, None], other=0.0).to(tl.float32)
        mean = tl.load(mean_ptr + rows, mask=ok, other=0.0)
        rstd = tl.load(rstd_ptr + rows, mask=ok, other=0.0)
        xhat = (x - mean[:, None]) * rstd[:, None]  # 0 in masked segments (x, mean and rstd 0 there)
        dw_acc += dy * xhat
        db_acc += dy
        wdy = w * dy
        a, b = tl.reduce((xhat * wdy, wdy), 1, _add_pairs)  # per segment
        s1, s2 = _flat_row_sums(a, b, seg, K, R)
        c1 = (s1 / N)[:, None]
        c2 = (s2 / N)[:, None]
        dx = (wdy - (xhat * c1 + c2)) * rstd[:, None]
        tl.store(dx_ptr + base + offs, dx.to(dx_ptr.dtype.element_ty), mask=ok[:, None])
    share = (g * R + slot).to(tl.int64)[:, None] * N + cols
    tl.store(dw_part_ptr + share, dw_acc, mask=used[:, None])
    tl.store(db_part_ptr + share, db_acc, mask=used[:, None])


@triton.jit
def _layer_norm_dwdb_kernel(
    dw_part_ptr,  # (n_groups, N) float32 shares of dweight
    db_part_ptr,  # (n_groups, N) float32 shares of dbias
    dw_ptr,  # (N,) out: dweight, the sum of every share
    db_ptr,  # (N,) out: dbias
    dw_mid_ptr,  # (n_splits, N) float32: each split's sum of its shares of dweight, where SPLITS; else unused
    db_mid_ptr,  # (n_splits, N) float32: as dw_mid_ptr, for dbias
    count_ptr,  # (column blocks,) int32 zeros: each column block's splits arrived, where SPLITS; else unused
    n_groups,  # rows of the share buffers
    n_cols,  # N
    groups_per_split,  # share rows summed by one program: program (c, s) sums rows [s * it, (s + 1) * it)
    BLOCK_G: tl.constexpr,  # share rows added per step (fixed order: deterministic)
    BLOCK_N: tl.constexpr,  # columns per program
    SPLITS: tl.constexpr = False,  # more than one split: sums through dw_mid, db_mid
):
    """Sum fixed row ranges of the shares, column block by column block, in a fixed order.

    (column blocks, splits) programs each sum a split of the shares; with one split, into dweight and dbias; with
    several, into the splits' rows, the last split of a column block to arrive adding those (``_sum_shares_if_last``)
    in the same launch. The splits keep hundreds of programs reading the shares (a single level left 4-16 programs
    reading 8.6 MB: 21-75 us of a 230-300 us backward on the H200, ncu; docs/kernels.md, "layer_norm: backward"); the
    fixed ranges and order keep the result bitwise identical run to run.
    """
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < n_cols
    split = tl.program_id(1)
    g_end = tl.minimum(n_groups, (split + 1) * groups_per_split)
    dw = tl.zeros((BLOCK_G, BLOCK_N), dtype=tl.float32)
    db = tl.zeros((BLOCK_G, BLOCK_N), dtype=tl.float32)
    for g0 in range(split * groups_per_split, g_end, BLOCK_G):
        g = g0 + tl.arange(0, BLOCK_G)
        mask = (g < g_end)[:, None] & col_ok[None, :]
        offs = g.to(tl.int64)[:, None] * n_cols + cols[None, :]
        dw += tl.load(dw_part_ptr + offs, mask=mask, other=0.0)
        db += tl.load(db_part_ptr + offs, mask=mask, other=0.0)
    if SPLITS:
        out = split.to(tl.int64) * n_cols + cols
        tl.store(dw_mid_ptr + out, tl.sum(dw, axis=0), mask=col_ok)
        tl.store(db_mid_ptr + out, tl.sum(db, axis=0), mask=col_ok)
        _sum_shares_if_last(dw_mid_ptr, db_mid_ptr, dw_ptr, db_ptr, count_ptr + tl.program_id(0), tl.num_programs(1),
                            n_cols, cols, col_ok, BLOCK_N)
    else:
        tl.store(dw_ptr + cols, tl.sum(dw, axis=0).to(dw_ptr.dtype.element_ty), mask=col_ok)
        tl.store(db_ptr + cols, tl.sum(db, axis=0).to(db_ptr.dtype.element_ty), mask=col_ok)
