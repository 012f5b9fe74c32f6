"""Softmax's Triton kernels (planned and launched by ``softmax``; docs/kernels.md, "softmax").

``_softmax_fwd_kernel``: ``BLOCK_M`` whole rows in registers, in up to two pieces, read as aligned vectors (the
"rows" and "staged" plans). ``_softmax_split_kernel``: the split walk's persistent programs over whole rows or slices
(``_split_walk``; the "persistent" and "split" plans). The Gluon kernels that hold rows in shared memory are
``_softmax_held``'s.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._math import exp
from ._ragged import body_bounds, edge_words, edges, in_row, row_first, row_origin, vec_end
from ._split_walk import exchange_partials, first_tile, gather_partials, next_ticket, prefetch_target, tile_start

_FLT_MAX = tl.constexpr(3.4028234663852886e38)


@triton.jit
def _softmax_fwd_kernel(
    x_ptr,  # input: row r's first element at x_ptr + x_phase + r * stride_x; column stride 1
    y_ptr,  # output: row r's first element at y_ptr + x_phase + r * stride_y (same phase as x's, _ragged.phased)
    x_phase,  # phase of row 0 (0 when VEC == 1)
    n_rows,  # M
    n_cols,  # N
    stride_x,  # elements between rows of x
    stride_y,  # elements between rows of y
    BLOCK_M: tl.constexpr,  # rows per program
    BLOCK_N: tl.constexpr,  # virtual columns of the row's first piece (_row_pieces)
    BLOCK_T: tl.constexpr,  # columns of the second piece, from BLOCK_N on; 0: none
    BLOCK_U: tl.constexpr,  # columns of the third piece, from BLOCK_N + BLOCK_T on; 0: none
    VEC: tl.constexpr,  # elements in 16 bytes for rows that start unaligned, 1 when every row is aligned
    NARROW: tl.constexpr,  # 0, or N = both strides for packed rows on Triton's own accesses (_narrow)
    FAST_EXP: tl.constexpr,  # exponentials by ex2.approx.ftz (not under the interpreter)
    STAGES: tl.constexpr = 0,  # 0: one block of rows a program; else persistent, pipelined STAGES deep
    EDGE_WORDS: tl.constexpr = False,  # 16-bit rows: the edges read as 32-bit words (_ragged.edge_words)
    SHIFT: tl.constexpr = False,  # exponentials against the row's first element: one reduction (_softmax_rows)
):
    """Whole rows in registers: BLOCK_M rows a step, one read and one write (_ragged: unaligned rows).

    A row is held as up to three power-of-two pieces side by side (the plan takes two: 4096 +
    1024 for 5120, 4096 + 8 for a 4097-wide bf16 row), so that few lanes are masked: 16-bit
    rows are issue-bound and a masked lane costs as much as a loaded one (docs/kernels.md,
    "softmax", "The rows kernel").

    ``STAGES`` > 0 (the "staged" plan): a program an SM walks blocks g, g + G, ... in a loop that
    Triton software-pipelines, so the next STAGES - 1 blocks' loads are in flight in shared memory
    (``cp.async``) while this one is reduced: one program an SM keeps bytes in flight through its
    reductions without registers to spare (docs/kernels.md, "softmax", "The staged plan")."""
    if NARROW > 0:  # compile-time row length and strides: the rows of a program load as vectors
        n_cols = NARROW
        stride_x = NARROW
        stride_y = NARROW
    if STAGES == 0:
        _softmax_rows(x_ptr, y_ptr, x_phase, n_rows, n_cols, stride_x, stride_y, tl.program_id(0),
                      BLOCK_M, BLOCK_N, BLOCK_T, BLOCK_U, VEC, FAST_EXP, EDGE_WORDS, SHIFT)
    else:
        for block in tl.range(tl.program_id(0), tl.cdiv(n_rows, BLOCK_M), tl.num_programs(0), num_stages=STAGES):
            _softmax_rows(x_ptr, y_ptr, x_phase, n_rows, n_cols, stride_x, stride_y, block,
                          BLOCK_M, BLOCK_N, BLOCK_T, BLOCK_U, VEC, FAST_EXP, EDGE_WORDS, SHIFT)


@triton.jit
def _softmax_rows(x_ptr, y_ptr, x_phase, n_rows, n_cols, stride_x, stride_y, block, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_U: tl.constexpr, VEC: tl.constexpr,
                  FAST_EXP: tl.constexpr, EDGE_WORDS: tl.constexpr, SHIFT: tl.constexpr = False):
    """Rows ``block * BLOCK_M ..`` of ``_softmax_fwd_kernel`` (its arguments).

    ``SHIFT`` (16-bit rows): the exponentials are taken against the row's first element, not its
    max, so that one block reduction (the sum) replaces two (the max, then the sum); rows whose sum
    leaves [1, 2^100] (a max more than ~69 above the first element, inf, nan) are redone with the max
    (docs/kernels.md, "softmax", "One reduction")."""
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < n_rows
    x_base, ph = row_origin(x_phase, rows, stride_x, VEC)
    y_base, _ = row_origin(x_phase, rows, stride_y, VEC)
    zero = tl.zeros([BLOCK_M], tl.int32)  # makes the row bounds tensors also when VEC == 1 (scalars then)
    ph = ph + zero
    # The body (whole vectors inside the row) is masked a vector at a time; the at most
    # 2 (VEC - 1) elements around it are the edges, loaded apart: no element-wise select.
    first, last = body_bounds(ph, n_cols, VEC)
    first = (first + zero)[:, None]
    last = (last + zero)[:, None]
    x_row = x_ptr + x_base[:, None]
    if SHIFT:  # against the row's first element (virtual column ph)
        x, x_t, x_u, xe, xe_hi, e, e_ok, e_ok_hi, _ = _softmax_load(
            x_ptr, x_row, x_base, ph, n_cols, first, last, row_ok, BLOCK_N, BLOCK_T, BLOCK_U, VEC, EDGE_WORDS, False)
        shift = tl.load(x_ptr + x_base + ph, mask=row_ok, other=0.0).to(tl.float32)
        x, x_t, x_u, xe, xe_hi, row_sum = _softmax_exp_sum(x, x_t, x_u, xe, xe_hi, e_ok, shift, BLOCK_T, BLOCK_U, VEC,
                                                           FAST_EXP, EDGE_WORDS)
        redo = row_ok & ~_shifted_sum_ok(row_sum)
        if tl.max(redo.to(tl.int32), axis=0) > 0:
            x, x_t, x_u, xe, xe_hi, e, e_ok, e_ok_hi, row_sum = _softmax_max_exp_sum(
                x_ptr, x_row, x_base, ph, n_cols, first, last, row_ok, BLOCK_N, BLOCK_T, BLOCK_U, VEC, FAST_EXP,
                EDGE_WORDS)
    else:
        x, x_t, x_u, xe, xe_hi, e, e_ok, e_ok_hi, row_sum = _softmax_max_exp_sum(
            x_ptr, x_row, x_base, ph, n_cols, first, last, row_ok, BLOCK_N, BLOCK_T, BLOCK_U, VEC, FAST_EXP, EDGE_WORDS)
    inv_sum = (1.0 / row_sum)[:, None]
    y_row = y_ptr + y_base[:, None]
    _store_piece(y_row, 0, BLOCK_N, x * inv_sum, first, last, row_ok)
    if BLOCK_T > 0:
        _store_piece(y_row, BLOCK_N, BLOCK_T, x_t * inv_sum, first, last, row_ok)
    if BLOCK_U > 0:
        _store_piece(y_row, BLOCK_N + BLOCK_T, BLOCK_U, x_u * inv_sum, first, last, row_ok)
    if VEC == 8 and EDGE_WORDS:
        y_row3 = y_ptr + y_base[:, None, None]
        tl.store(y_row3 + e, (xe * inv_sum[:, :, None]).to(y_ptr.dtype.element_ty), mask=e_ok)
        tl.store(y_row3 + e + 1, (xe_hi * inv_sum[:, :, None]).to(y_ptr.dtype.element_ty), mask=e_ok_hi)
    elif VEC > 1:
        tl.store(y_row + e, (xe * inv_sum).to(y_ptr.dtype.element_ty), mask=e_ok)


@triton.jit
def _softmax_load(x_ptr, x_row, x_base, ph, n_cols, first, last, row_ok, BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr,
                  BLOCK_U: tl.constexpr, VEC: tl.constexpr, EDGE_WORDS: tl.constexpr, MAX: tl.constexpr):
    """The rows' pieces and edges in float32, -inf outside the rows, and with ``MAX`` the rows' max, each piece
    reduced into it as it arrives (the order the kernel was measured in: loading everything first and then
    taking the max compiled differently on sm_90, bf16 8192 + 512 lanes 64 -> 88 bytes of stack):
    (x, x_t, x_u, xe, xe_hi, e, e_ok, e_ok_hi, row_max). A piece, edge or max the plan lacks is a placeholder
    that nothing reads."""
    x = _row_piece(x_row, 0, BLOCK_N, first, last, row_ok)
    row_max = x
    if MAX:
        row_max = tl.max(x, axis=1)
    x_t = x
    x_u = x
    if BLOCK_T > 0:
        x_t = _row_piece(x_row, BLOCK_N, BLOCK_T, first, last, row_ok)
        if MAX:
            row_max = tl.maximum(row_max, tl.max(x_t, axis=1))
    if BLOCK_U > 0:
        x_u = _row_piece(x_row, BLOCK_N + BLOCK_T, BLOCK_U, first, last, row_ok)
        if MAX:
            row_max = tl.maximum(row_max, tl.max(x_u, axis=1))
    if VEC == 8 and EDGE_WORDS:  # 16-bit: the edges' two vectors as 32-bit words, (BLOCK_M, 2, 4) each half
        ph3 = ph[:, None, None]
        ok3 = row_ok[:, None, None]
        # several rows a program: the last program's rows past the tensor read nothing (one row: always a row)
        xe, xe_hi, e = edge_words(x_ptr, x_base[:, None, None], ph3, n_cols, VEC,
                                  rows_ok=ok3 if x_base.shape[0] > 1 else None)
        e_ok = in_row(e, ph3, n_cols) & ok3
        e_ok_hi = in_row(e + 1, ph3, n_cols) & ok3
        xe = tl.where(e_ok, xe, -float("inf"))
        xe_hi = tl.where(e_ok_hi, xe_hi, -float("inf"))
        if MAX:
            row_max = tl.maximum(row_max, tl.max(tl.max(tl.maximum(xe, xe_hi), axis=2), axis=1))
    elif VEC > 1:
        e, e_ok = edges(ph[:, None], n_cols, VEC)
        e_ok = e_ok & row_ok[:, None]
        xe = tl.load(x_row + e, mask=e_ok, other=-float("inf")).to(tl.float32)
        if MAX:
            row_max = tl.maximum(row_max, tl.max(xe, axis=1))
        xe_hi = xe
        e_ok_hi = e_ok
    else:
        e = tl.zeros([1], tl.int32)
        e_ok = e == 0
        e_ok_hi = e_ok
        xe = tl.zeros([1], tl.float32)
        xe_hi = xe
    return x, x_t, x_u, xe, xe_hi, e, e_ok, e_ok_hi, row_max


@triton.jit
def _softmax_max_exp_sum(x_ptr, x_row, x_base, ph, n_cols, first, last, row_ok, BLOCK_N: tl.constexpr,
                         BLOCK_T: tl.constexpr, BLOCK_U: tl.constexpr, VEC: tl.constexpr, FAST_EXP: tl.constexpr,
                         EDGE_WORDS: tl.constexpr):
    """``_softmax_load`` with the rows' max, then ``_softmax_exp_sum`` against it:
    (x, x_t, x_u, xe, xe_hi, e, e_ok, e_ok_hi, row_sum)."""
    x, x_t, x_u, xe, xe_hi, e, e_ok, e_ok_hi, row_max = _softmax_load(
        x_ptr, x_row, x_base, ph, n_cols, first, last, row_ok, BLOCK_N, BLOCK_T, BLOCK_U, VEC, EDGE_WORDS, True)
    x, x_t, x_u, xe, xe_hi, row_sum = _softmax_exp_sum(x, x_t, x_u, xe, xe_hi, e_ok, row_max, BLOCK_T, BLOCK_U, VEC,
                                                       FAST_EXP, EDGE_WORDS)
    return x, x_t, x_u, xe, xe_hi, e, e_ok, e_ok_hi, row_sum


@triton.jit
def _softmax_exp_sum(x, x_t, x_u, xe, xe_hi, e_ok, shift, BLOCK_T: tl.constexpr, BLOCK_U: tl.constexpr,
                     VEC: tl.constexpr, FAST_EXP: tl.constexpr, EDGE_WORDS: tl.constexpr):
    """exp(piece - shift) for every piece and edge, in place of x (-inf -> 0), and the rows' sums of them:
    (x, x_t, x_u, xe, xe_hi, row_sum). exp(x - shift), not 2^(x log2 e - shift log2 e) in one FMA: that
    loses |x| 2^-24 in the exponent (logits of 1e4: 6e-4 relative)."""
    x = exp(x - shift[:, None], FAST_EXP)
    row_sum = tl.sum(x, axis=1)
    if BLOCK_T > 0:
        x_t = exp(x_t - shift[:, None], FAST_EXP)
        row_sum += tl.sum(x_t, axis=1)
    if BLOCK_U > 0:
        x_u = exp(x_u - shift[:, None], FAST_EXP)
        row_sum += tl.sum(x_u, axis=1)
    if VEC == 8 and EDGE_WORDS:  # masked lanes: -inf -> 0
        xe = exp(xe - shift[:, None, None], FAST_EXP)
        xe_hi = exp(xe_hi - shift[:, None, None], FAST_EXP)
        row_sum += tl.sum(tl.sum(xe + xe_hi, axis=2), axis=1)
    elif VEC > 1:
        xe = exp(xe - shift[:, None], FAST_EXP)
        row_sum += tl.sum(tl.where(e_ok, xe, 0.0), axis=1)
    return x, x_t, x_u, xe, xe_hi, row_sum


@triton.jit
def _row_piece(x_row, start: tl.constexpr, SIZE: tl.constexpr, first, last, row_ok):
    """Virtual columns ``start .. start + SIZE`` of the rows at ``x_row`` ((BLOCK_M, 1) pointers) in
    float32: the body's whole vectors ([first, last), _ragged.body_bounds), -inf elsewhere."""
    v = start + tl.arange(0, SIZE)[None, :]
    return tl.load(x_row + v, mask=row_ok[:, None] & (v >= first) & (v < last), other=-float("inf")).to(tl.float32)


@triton.jit
def _store_piece(y_row, start: tl.constexpr, SIZE: tl.constexpr, y, first, last, row_ok):
    """A piece of the output: the body's whole vectors ([first, last))."""
    v = start + tl.arange(0, SIZE)[None, :]
    tl.store(y_row + v, y.to(y_row.dtype.element_ty), mask=row_ok[:, None] & (v >= first) & (v < last))


@triton.jit
def _load_chunk(ptrs, in_row):
    """A chunk of x, masked to the row with -inf beyond it (exp gives 0)."""
    return tl.load(ptrs, mask=in_row, other=-float("inf"))


@triton.jit
def _softmax_split_kernel(
    x_ptr,  # input: row r's first element at x_ptr + x_phase + r * stride_x, unit column stride
    y_ptr,  # output: row r's first element at y_ptr + x_phase + r * stride_y (same phase, _ragged.phased)
    part_ptr,  # (M, GROUP, 2) float32 partial (max, sum of exp) per row and slice; unused when GROUP == 1
    sync_ptr,  # ((M + 1) * COUNTER_STRIDE,) int32 zeros: arrivals per row, then the ticket; unused when GROUP == 1
    x_phase,  # phase of row 0 (0 when VEC == 1)
    n_rows,  # M
    n_cols,  # N
    stride_x,  # elements between rows of x
    stride_y,  # elements between rows of y
    slice_cols,  # virtual columns per slice: a multiple of BLOCK_N, GROUP slices cover N + VEC - 1
    n_programs,  # programs launched (persistent: a few an SM)
    GROUP: tl.constexpr,  # slices (programs) per row
    BLOCK_N: tl.constexpr,  # columns per step
    BLOCK_G: tl.constexpr,  # next_power_of_2(GROUP)
    FAST_EXP: tl.constexpr,  # exponentials by ex2.approx.ftz (not under the interpreter)
    SUB: tl.constexpr,  # neighbouring elements reduced in-thread before the online step (16 bytes' worth)
    HOLD: tl.constexpr,  # a tile is one step (slice_cols == BLOCK_N): pass two reuses the registers, no re-read
    EARLY: tl.constexpr,  # HOLD and GROUP == 1: the next tile's loads go out before this one's reductions
    VEC: tl.constexpr,  # elements in 16 bytes for rows that start unaligned, 1 when every row is aligned
    SHIFT: tl.constexpr = False,  # not HOLD: pass one sums exp(x - the row's first element), no running max
):
    """Persistent programs, each walking tiles (a row's slice) twice: online (max, sum of exp), then normalise.

    The grid is a few programs an SM, so that the slices in flight (programs x slice bytes)
    stay far below the L2 and the second pass re-reads from it. Each step prefetches the
    next step's chunk (the next slice chunk, the slice's first chunk again for the second
    pass, the next tile's first chunk at the end) into registers before working on the
    current one, so a program always has one chunk of loads in flight (a tile of one step
    held for pass two with GROUP == 1, ``EARLY``: the next tile's chunk is loaded before this
    tile's cross-warp reductions, not after them). GROUP == 1: a tile
    is a whole row, tiles go round robin, nothing waits (runs under the interpreter).
    GROUP > 1: the programs of a row publish their partials and wait for each other; tiles
    come from an atomic ticket taken only after a program's wait, so the tiles handed out
    form a prefix and a program never holds a tile it cannot finish without waiting on
    itself (deadlock-free while GROUP programs fit on the GPU at once).
    The online step is taken once per SUB neighbouring elements (a thread's vector load),
    which keeps the running (max, sum) at BLOCK_N / SUB lanes: few registers. Maxima start
    at -FLT_MAX, not -inf, so a run of -inf adds exp(-inf) = 0 instead of nan, and one
    exponential a step, exp(min(m, m') - max(m, m')), rescales whichever sum is behind.
    Columns are virtual (``_ragged``): a row's elements sit at ph .. ph + N from the aligned
    vector holding its first; slices are cut in that space, so a row with a small phase can
    leave its last slice empty (it publishes (-FLT_MAX, 0) and still prefetches the next tile).
    ``SHIFT`` (16-bit rows): pass one sums exp(x - c), c the row's first element, as the rows kernel's
    one reduction does (docs/kernels.md, "One reduction"); a row whose sum leaves [1, 2^100] is walked
    again the online way, its slices exchanging a second time (on partials plane 1, the counter to 2 GROUP).
    """
    n_tiles = n_rows * GROUP
    tile = first_tile(sync_ptr, n_rows, GROUP)
    cols = tl.arange(0, BLOCK_N)
    row, lo = tile_start(tile, n_rows, slice_cols, GROUP)
    x_next = _load_row_chunk(x_ptr, x_phase, row, stride_x, lo, cols, n_cols, VEC)
    if SHIFT:  # the tile's c, loaded a tile ahead
        shift_next = row_first(x_ptr, x_phase, row, stride_x, VEC)
    while tile < n_tiles:
        row = tile // GROUP
        lo = (tile % GROUP) * slice_cols
        x_base, ph = row_origin(x_phase, row, stride_x, VEC)
        y_base, _ = row_origin(x_phase, row, stride_y, VEC)
        hi = tl.minimum(lo + slice_cols, ph + n_cols)
        x_row = x_ptr + x_base
        if VEC > 1:  # the tile's edge elements, loaded now so that their latency hides behind pass one
            v_e, e_ok = edges(ph, n_cols, VEC)
            e_ok = e_ok & (v_e >= lo) & (v_e < hi)
            x_e = tl.load(x_row + v_e, mask=e_ok, other=0.0)
        if SHIFT:
            x_next, row_max, tile_sum = _pass_one(x_next, x_row, lo, hi, cols, ph, n_cols, shift_next, BLOCK_N, SUB,
                                                  HOLD, FAST_EXP, VEC, True)
            row_sum = tile_sum
            if GROUP > 1:
                _, p_sum = gather_partials(part_ptr, sync_ptr, row, tile % GROUP, tile_sum, tile_sum, GROUP, 0.0, 0.0,
                                           GROUP, BLOCK_G)
                row_sum = tl.sum(p_sum, axis=0)
            redo = ~_shifted_sum_ok(row_sum)  # else the row again, with its max
            if redo:
                x_next, row_max, row_sum = _pass_one(x_next, x_row, lo, hi, cols, ph, n_cols, 0.0, BLOCK_N, SUB, HOLD,
                                                     FAST_EXP, VEC, False)
                if GROUP > 1:
                    p_max, p_sum = gather_partials(part_ptr + n_rows * (2 * GROUP), sync_ptr, row, tile % GROUP, row_max,
                                                   row_sum, 2 * GROUP, -_FLT_MAX, 0.0, GROUP, BLOCK_G)
                    row_max, row_sum = _merge_partials(p_max, p_sum, FAST_EXP)
            if GROUP == 1:
                next_tile = tile + n_programs
            else:
                next_tile = next_ticket(sync_ptr, n_rows)
        else:
            x_next, tile_max, tile_sum = _pass_one(x_next, x_row, lo, hi, cols, ph, n_cols, 0.0, BLOCK_N, SUB, HOLD,
                                                   FAST_EXP, VEC, False)
            if EARLY:  # the next tile is known without a wait: its loads fly during the reductions
                x_held = x_next
                early_row, early_lo = tile_start(tile + n_programs, n_rows, slice_cols, GROUP)
                x_next = _load_row_chunk(x_ptr, x_phase, early_row, stride_x, early_lo, cols, n_cols, VEC)
            if GROUP == 1:
                row_max = tile_max
                row_sum = tile_sum
                next_tile = tile + n_programs
            else:
                p_max, p_sum, next_tile = exchange_partials(
                    part_ptr, sync_ptr, row, tile % GROUP, tile_max, tile_sum, n_rows, -_FLT_MAX, 0.0, GROUP, BLOCK_G
                )
                row_max, row_sum = _merge_partials(p_max, p_sum, FAST_EXP)
        inv_sum = 1.0 / row_sum
        next_row, next_lo = tile_start(next_tile, n_rows, slice_cols, GROUP)
        if SHIFT:
            shift_next = row_first(x_ptr, x_phase, next_row, stride_x, VEC)
        first, last = body_bounds(ph, n_cols, VEC)
        for start in range(lo, hi, BLOCK_N):
            if EARLY:
                x = x_held.to(tl.float32)
            else:
                x = x_next.to(tl.float32)
                pre_row, pre_col = prefetch_target(start, hi, row, next_row, next_lo, BLOCK_N)
                x_next = _load_row_chunk(x_ptr, x_phase, pre_row, stride_x, pre_col, cols, n_cols, VEC)
            y = exp(x - row_max, FAST_EXP) * inv_sum
            tl.store(y_ptr + y_base + start + cols, y.to(y_ptr.dtype.element_ty), mask=(start + cols >= first) & (start + cols < last))
        if VEC > 1:
            if hi <= lo:  # an empty slice: nothing prefetched the next tile's first chunk
                x_next = _load_row_chunk(x_ptr, x_phase, next_row, stride_x, next_lo, cols, n_cols, VEC)
            y_e = exp(x_e.to(tl.float32) - row_max, FAST_EXP) * inv_sum
            tl.store(y_ptr + y_base + v_e, y_e.to(y_ptr.dtype.element_ty), mask=e_ok)
        tile = next_tile


@triton.jit
def _shifted_sum_ok(row_sum):
    """Whether a sum of exp(x - c), c an element of the row, can stand: it holds c's own 1, so a sum under 1
    (c is -inf or nan) or over 2^100 (the max more than ~69 above c, +inf) or nan is redone with the max."""
    return (row_sum >= 1.0) & (row_sum <= 1.2676506002282294e30)


@triton.jit
def _merge_partials(p_max, p_sum, FAST_EXP: tl.constexpr):
    """A row's (max, sum of exp(x - max)) from its slices' exchanged (max, sum) pairs."""
    row_max = tl.max(p_max, axis=0)
    return row_max, tl.sum(p_sum * exp(p_max - row_max, FAST_EXP), axis=0)


@triton.jit
def _pass_one(x_next, x_row, lo, hi, cols, ph, n_cols, shift, BLOCK_N: tl.constexpr, SUB: tl.constexpr,
              HOLD: tl.constexpr, FAST_EXP: tl.constexpr, VEC: tl.constexpr, SHIFT: tl.constexpr):
    """Pass one of ``_softmax_split_kernel`` over the tile's steps [lo, hi): (x_next, m, the tile's sum of
    exp(x - m)), m the tile's max found online, or with ``SHIFT`` the given ``shift``; x_next holds the
    tile's first chunk on entry and, loaded again for pass two, on exit."""
    run_max = tl.full([BLOCK_N // SUB], -_FLT_MAX, tl.float32)
    run_sum = tl.zeros([BLOCK_N // SUB], tl.float32)
    for start in range(lo, hi, BLOCK_N):
        x = _row_values(x_next, start, cols, ph, n_cols, BLOCK_N, VEC)
        x = tl.reshape(x, (BLOCK_N // SUB, SUB))
        if not HOLD:  # HOLD: x_next stays this chunk, which pass two normalises from registers
            nxt = start + BLOCK_N
            nxt = tl.where(nxt < hi, nxt, lo)  # after the last chunk: the first again, for pass two
            x_next = _load_chunk(x_row + nxt + cols, nxt + cols < vec_end(ph, n_cols, VEC))
        if SHIFT:  # -inf outside the row adds 0
            run_sum += tl.sum(exp(x - shift, FAST_EXP), axis=1)
        else:  # a thread's SUB neighbours first (no exchange), then one online step per SUB
            sub_max = tl.maximum(tl.max(x, axis=1), -_FLT_MAX)  # -inf only: 0 terms, not nan
            sub_sum = tl.sum(exp(x - sub_max[:, None], FAST_EXP), axis=1)  # nan or +inf: nan, kept to the end
            new_max = tl.maximum(run_max, sub_max)
            e = exp(tl.minimum(run_max, sub_max) - new_max, FAST_EXP)  # the old sum's rescale, or the new one's
            run_sum = tl.where(sub_max > run_max, run_sum * e + sub_sum, run_sum + sub_sum * e)
            run_max = new_max
    if SHIFT:
        return x_next, shift, tl.sum(run_sum, axis=0)
    else:
        tile_max = tl.max(run_max, axis=0)
        return x_next, tile_max, tl.sum(run_sum * exp(run_max - tile_max, FAST_EXP), axis=0)


@triton.jit
def _load_row_chunk(x_ptr, x_phase, row, stride_x, start, cols, n_cols, VEC: tl.constexpr):
    """The chunk of ``row`` at virtual columns ``start + cols``, whole vectors (_ragged)."""
    base, ph = row_origin(x_phase, row, stride_x, VEC)
    return _load_chunk(x_ptr + base + start + cols, start + cols < vec_end(ph, n_cols, VEC))


@triton.jit
def _row_values(chunk, start, cols, ph, n_cols, BLOCK_N: tl.constexpr, VEC: tl.constexpr):
    """A loaded chunk in float32, the neighbouring rows' elements of its edge vectors as -inf
    (only a row's first and last chunks hold any)."""
    x = chunk.to(tl.float32)
    if VEC > 1:
        if (start == 0) | (start + BLOCK_N > ph + n_cols):
            x = tl.where(in_row(start + cols, ph, n_cols), x, -float("inf"))
    return x
