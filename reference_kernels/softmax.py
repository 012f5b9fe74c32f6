"""Fused softmax over the last dimension, for any row width.

Five launch plans, on four kernels; ``_softmax_settings`` chooses:

* ``rows`` (rows up to 16384 wide): ``_softmax_fwd_kernel``, a program loads ``BLOCK_M``
  whole rows, reduces max and sum of exponentials in registers and writes the result: one
  read, one write (16-bit rows of ``_SHIFT_16BIT``: the sum alone, of exponentials against the
  row's first element). Measured 92-100% of copy bandwidth on an H200.
* ``held`` (from 16385 columns, 16-bit rows to ~56000 where two programs an SM hold them in shared
  memory, fp32 rows whole at one program an SM to ~57000; on compute-capability 9.x GPUs with Triton's Gluon,
  ``_softmax_held``): a program a row copies it into shared memory (``cp.async``) and reads it there twice;
  one read and one write. Wider rows (16-bit to ~590000, fp32 but the staged plan's aligned rows) in 2-16
  slices, a slice a program, whose programs exchange their (max, sum) (``_held_split_group``). 76-95% of
  copy in the sweep (docs/kernels.md, "Rows held in shared memory"); the plans below where it is not
  available or measured slower.
* ``staged`` (16385-32768: fp32 rows, and 16-bit rows that fill most of 32768): the
  same kernel, one row on up to 32 warps; 16-bit rows walked by one persistent program an SM
  whose row loop Triton pipelines (the next rows' loads in flight through shared memory),
  fp32 rows one program a row. 69-90% of copy (docs/kernels.md, "The staged plan").
* ``persistent`` and ``split`` (other wider rows, and every wide row where ``held`` is not available:
  ``_WIDE_ROWS_PLAN = "auto"`` takes ``persistent`` up to 128 KiB a row, ``split`` beyond):
  ``_softmax_split_kernel``, a few programs an SM walking tiles (a whole row, or one of a row's slices whose programs
  exchange (max, sum)) twice, sized so that the tiles in flight fit in L2 and the second
  read comes from there; a tile of one step is held in registers instead (no second read);
  aligned 16-bit rows of ``split`` sum exp(x - the row's first element) in pass one (``SHIFT``).
  The walk is shared with the layer-norm forward (``_split_walk``). Measured 81% of copy at
  65536 and 71-75% at 262144 (docs/kernels.md, "The split walk" and "softmax"): short of
  the 90% target, above every anchor.

The wide-row plans that lost to these (one program a row looping twice, chunk programs
exchanging partials, a two-launch fallback) are listed with their figures in
docs/kernels.md, "softmax".

The max and sum are taken in float32 whatever the input dtype; the output has the input's
dtype. Rows of ``-inf`` and rows holding ``nan`` or ``+inf`` come out as torch's do (all
``nan``).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from pytest_fusioncheck.budget import Budget

from . import _softmax_held
from ._common import (ELEMS_PER_THREAD, as_rows, cdiv, check_tensor, interpreting, next_power_of_2, output_like, rows_cols, sm_count,
                      warps_for)
from ._math import exp
from ._ragged import (Phased, body_bounds, edge_words, edges, in_row, launch_width, phased, ragged_width, row_origin,
                      row_pieces, vec_end)
from ._split_walk import (exchange_partials, first_tile, gather_partials, next_ticket, prefetch_target, split_group, split_run,
                          tile_start)
from ._launch import Calls, launch as launch_kernel

_FLT_MAX = tl.constexpr(3.4028234663852886e38)


# --------------------------------------------------------------------------- kernels


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
        shift_next = _row_first(x_ptr, x_phase, row, stride_x, VEC)
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
            shift_next = _row_first(x_ptr, x_phase, next_row, stride_x, VEC)
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
def _row_first(x_ptr, x_phase, row, stride_x, VEC: tl.constexpr):
    """The first element of ``row`` in float32 (SHIFT's c)."""
    base, ph = row_origin(x_phase, row, stride_x, VEC)
    return tl.load(x_ptr + base + ph).to(tl.float32)


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


# --------------------------------------------------------------------------- plan


class _Plan(NamedTuple):
    """How one softmax is launched; ``_softmax_settings`` makes it, benchmarks may vary it."""

    mode: str  # "rows", "held", "staged", "persistent" or "split"
    block_m: int
    block_n: int
    num_warps: int
    group: int = 1  # "split" and "held": programs (slices) per row; "persistent" is "split" with 1
    per_sm: int = 0  # "staged", "persistent", "split": programs launched per SM
    max_regs: int = 0  # registers a thread may use (Triton's maxnreg), 0: the compiler's choice
    stages: int = 0  # "staged": software-pipelining depth of the row loop
    pieces: tuple = ()  # "staged": (BLOCK_N, BLOCK_T, BLOCK_U) of a contiguous input's rows (_row_pieces)


# The heuristics, from the H200 sweeps (docs/kernels.md, "softmax"): rows up to
# _MAX_ROW wide are held whole by one program, _ROWS_TILE elements per program for narrow
# rows, 32 per thread and at least 4 warps (``warps_for``).
_MAX_ROW = 16384
_ROWS_TILE = 2048
# fp32 rows: elements a program instead of _ROWS_TILE (None: the same), one row of 1024 a program on 4 warps as Liger's
# kernel holds it. H200, % of copy, against 2048 (docs/kernels.md, "softmax", "fp32 tile"): 8 97 -> 99.6, 256 96-97 ->
# 99, 512 96 -> 98, 1000 96.7 -> 98.4, 1024 96 -> 98.7 (Liger 97-99), 300 96.7 -> 95; rows of 2048 lanes and wider are
# one a program either way.
_ROWS_TILE_FP32: int | None = 1024
# 16-bit rows of 16-byte multiples whose power of two is _MASKED_ROWS_BLOCK lanes, a quarter or more of them masked,
# held in one piece, take _MASKED_ROWS_TILE elements a program (four rows, 32 elements a thread on 4 warps, not two
# rows at 16), as the layer norm's forward does (docs/kernels.md, "softmax", "More rows a program"). H200, % of copy,
# bf16 / fp16: 576 85 -> 88-90 / 87 -> 90, 600 86 -> 92 / 88 -> 93, 640 88 -> 94 / 90 -> 95, 768 95 -> 99 / 96 -> 98-99;
# narrower blocks level or mixed (80 +3 / -1, 160 -1 / 0, 320 -1 / +2, 384 0 / +1), 520 (512 + 8 in pieces) 92 -> 85.
_MASKED_ROWS_TILE = 4096
_MASKED_ROWS_BLOCK = 1024
_MASKED_ROWS_MIN_SHARE = 0.25
# The plan for rows wider than _MAX_ROW, from the H200 sweeps (docs/kernels.md, "softmax"). "auto":
# "persistent" (a program an SM walks whole rows twice, the second time from L2, the next chunk
# always in flight) for rows up to _PERSISTENT_MAX_ROW_BYTES,
# "split" (a row cut into slices, programs exchanging (max, sum) with a back-off wait) wider.
# Measured at 65536 / 262144: persistent 70-80% / 63-64% of copy, split 74-76% / 70-73% (fp32
# slices held in registers 80% / 75%), against Liger 62-64% (65536; it refuses 262144).
_WIDE_ROWS_PLAN = "auto"
_WIDE_PLANS = ("auto", "staged", "persistent", "split")
# "staged" (_softmax_fwd_kernel, one row a step), "auto"'s choice from _STAGED_MIN_COLS to _STAGED_MAX_COLS
# where _staged_default says: whole rows in registers (_STAGED_ELEMS a thread, up to 32 warps, capped at 64
# registers); where _STAGED_PERSISTENT (16-bit), a persistent program walking rows with the next rows'
# loads in flight through shared memory (Triton's pipeliner, up to _STAGED_STAGES - 1 rows, within
# _STAGED_SMEM_BYTES a program), else one program a row (docs/kernels.md, "softmax", "The staged plan").
_STAGED_MIN_COLS = 16385
_STAGED_MAX_COLS = 32768
_STAGED_ELEMS = 32
_STAGED_STAGES = 3
_STAGED_SMEM_BYTES = 196608
_STAGED_PIECES = 1  # 16-bit 28000: 81% against 59% in three; fp32 25049: 79% against 59% (one program a row)
_STAGED_PIECE_WASTE = 0.05
_STAGED_PERSISTENT = {4: False, 2: True}  # by element size: fp32 32768 90%+ one program a row, 81% pipelined
# Rows of 16385+ columns held in shared memory by Gluon programs, a program a row (_softmax_held; docs/kernels.md, "Rows
# held in shared memory"), where it measured faster on the H200: 16-bit rows with two or more programs an SM (powers of
# two with _HELD_16BIT_POW2: 32768 93 against the staged walk's 86); fp32 multiples of 16 columns in
# _HELD_FP32_ALIGNED_BANDS; other fp32 rows wherever one fits an SM (17000: 70 -> 82; held a program a row, 2026-12-03,
# twice: 26865 80 -> 89-90, 28001 79-80 -> 88-89 against the staged plan, 29001 82 -> 90, 30522 82 -> 90, 40001 82 -> 88,
# 50257 81 -> 86 against slices). False: never.
_HELD = True
_HELD_MIN_COLS = 16385
# 16-bit rows of no multiple of 16 columns are held from here, a program a row (_softmax_held.ONE_ROW). H200, % of
# copy, the rows plan -> held, bf16 / fp16: 12345 84 / 83 -> 90 / 91, 12500 83 / 84 -> 92 / 93, 13500 86 / 87 -> 93 /
# 93, 14500 88 / 89 -> 93 / 94, 15500 91 / 91 -> 93 / 93, 16383 93 / 93 -> 92 / 92; narrower mixed (9000 77 -> 86,
# 10001 90 / 95 -> 92 / 92, 8200 99 -> 81) and aligned rows level or lower (11008-16000 -0.5 to -3; 9216 84 -> 91):
# not taken there.
_HELD_RAGGED_16BIT_MIN_COLS = 12289
_HELD_16BIT_POW2 = True  # 16-bit rows of a power of two held too (32768: the staged walk 85-86 -> 93-94)
_HELD_MIN_PER_SM = {2: 2, 4: 1}  # by element size; 16-bit at one an SM mixed: 60000 70 -> 74, 65536 77 -> 66
# fp32 rows of a multiple of 16 columns held whole, a program a row, in these bands (inclusive) where one fits an SM.
# H200, 2026-12-03, twice, staged -> held: 16400 75 -> 94, 18432 80 -> 95, 20480 83 -> 95, 24000 88 -> 94-96, 24576 88 ->
# 94-95, 26624 89 -> 94, 28672 90 -> 91, 29696 / 30720 / 32000 90 -> 90-92; 32768 level (staged); past it at one an SM
# (49152 83 in slices -> 89, 40960 90; one run each). (): never.
_HELD_FP32_ALIGNED_BANDS: tuple[tuple[int, int], ...] = ((16385, 32767), (32769, 1 << 20))
# Rows under _HELD_SPLIT_BELOW programs an SM whole (16-bit past ~56000 columns, fp32 past ~57000) held in GROUP slices,
# a slice a program, the slices of a row exchanging their (max, sum) (_softmax_held.launch_split; docs/kernels.md,
# "Rows held in shared memory"): as few slices as leave the first of
# _HELD_SPLIT_PER_SM's programs an SM that up to _MAX_SPLIT_GROUP slices reach. H200, % of copy, the split walk ->
# slices: bf16 60000 71 -> 80, 128256 71 -> 81, 262144 69 -> 78; fp32 65536 75 -> 87. fp32 rows at one program an SM
# are held whole (a program a slice against a program a row, 2026-12-03, twice: 29001 / 30522 / 31001 82 -> 88-90,
# 40001 82 -> 88, 50257 81 -> 86), and fp32 slices three an SM, not four (65536 82 -> 86-88, 128256 / 262144 82 -> 82-83).
# False: the plans before.
_HELD_SPLIT = True
_HELD_SPLIT_BELOW = {2: 2, 4: 1}  # by element size: programs an SM of the whole row
_HELD_SPLIT_PER_SM = {2: (3,), 4: (3,)}  # by element size, in order of preference
_STAGED_MIN_LANE_USE_16BIT = 0.85  # 16-bit rows take "staged" only filling this much of their power of two
_STAGED_UNALIGNED_16BIT = True  # with _EDGE_WORDS: bf16 30522 72 -> 76% (17000, 22618 at 52-63% lost: under 0.85)
_PERSISTENT_MAX_ROW_BYTES = 131072
_PERSISTENT_CHUNK_BYTES = 65536  # one program an SM, one chunk of loads in flight
_PERSISTENT_MIN_LANE_USE = 0.99  # rows that leave more of their last chunk empty go to "split" (28000-32000: 76% vs 64-72%)
_PERSISTENT_WARPS = 16
_SPLIT_CHUNK_BYTES = 16384  # three programs an SM: 48 KB in flight
_SPLIT_WARPS = 8
_SPLIT_PER_SM = 3
# fp32 rows up to _MAX_SPLIT_GROUP slices: one 64 KiB step a slice, held in registers for pass
# two (HOLD), one 16-warp program an SM: 76-80% of copy against 73-74% re-reading from L2. 16-bit
# slices held so measured 48-63%: they keep the 16 KB steps (docs/kernels.md, "softmax").
_SPLIT_HOLD_MIN_ELEM_SIZE = 4
_SPLIT_HOLD_WARPS = 16
_SPLIT_HOLD_MIN_ROW_BYTES = 262144  # narrower fp32 rows: 16 KB steps, three an SM (69-72% against 55-60% held)
_SPLIT_SLICE_BYTES = 65536  # 3 x 132 slices in flight = 26 MB (held: 132 = 9 MB), under half the L2
_MAX_SPLIT_GROUP = 16  # programs a row waits on: far below what a GPU holds at once
# 16-bit rows on the split walk: pass one sums exp(x - the row's first element) (SHIFT, docs/kernels.md "The
# split walk"). H200, % of copy, two runs each on two machines, bf16 / fp16: 20000 76 -> 82 / 77 -> 82, 49152
# 72 -> 75 / 73 -> 76, 50304 70 -> 72 / 71 -> 72, 100352-151936 +1-3, 17000 level on one machine and +4-7 on the
# other; not on the persistent plan (65536: bf16 79 -> 75, fp16 76 -> 80) nor ragged rows (50257: 64 -> 61 / 62 -> 59).
_SPLIT_SHIFT_16BIT = True
_SPLIT_SHIFT_PLANS = ("split",)
_SPLIT_SHIFT_RAGGED = False
# Registers: a plan that counts on several programs an SM being resident caps the registers
# at what that needs (Triton's maxnreg); without it triton 3.6 gave the unaligned-row kernels
# 95 / 106 registers and one or two programs an SM fewer than planned (ncu; docs/kernels.md,
# "Ragged rows"). Rows: two 16-warp programs an SM (64). Split: three 8-warp programs (80).
_REGS_PER_SM = 65536
_MAX_REGS = 255
_ROWS_MAX_REGS = 64
# Aligned 16-bit rows held as 8192 lanes plus a second piece of _TAIL_PIECE_REGS_16BIT[0]..[1] lanes (8448-8704)
# on 8 warps: _TAIL_PIECE_REGS_16BIT[2] registers (8-16 bytes of stack), five programs an SM instead of four
# (ncu: the 8704 row waits on latency with four; shorter pieces and unaligned rows lost; docs/kernels.md,
# "softmax", "One reduction"). None: the rows cap.
_TAIL_PIECE_REGS_16BIT: tuple[int, int, int] | None = (256, 512, 48)
# Unaligned rows (_ragged): the wide-row plans always read them as aligned vectors (scalar
# 64 KiB chunks spill); the rows plan where that measured faster than Triton's scalar path
# (docs/kernels.md, "Ragged rows"): from 2048 columns, and 64..128.
_PHASED_ROWS_MIN_COLS = 2048
# Odd 16-bit rows just past 1024 on aligned vectors (and edge words) as well: H200, 2026-12-03, two runs, Triton's
# scalar accesses -> vectors, bf16 / fp16: 1025 85-86 -> 89 / 85-86 -> 92, 1027 86 -> 89 / 86-87 -> 92, 1031 85 -> 89
# / 85 -> 92, 1039 85-86 -> 87-88 / 85 -> 91; outside it lost or level (fp16 993 / 1009 85 -> 82, bf16 1041 86 -> 84;
# 1026, twice-odd, 98 -> 88). None: no band.
_PHASED_ODD_16BIT: tuple[int, int] | None = (1025, 1039)
# The edges of unaligned 16-bit rows loaded as 32-bit words (_ragged.edge_words), which the staged plan's
# pipeline copies with cp.async (2-byte loads it cannot); the rows plan gains 1-3 points from 2048 columns
# (12345: 72 -> 75%), and narrower phased rows (64..128), not timed with them, keep the 2-byte edges.
_EDGE_WORDS = True
# Rows held as up to _ROW_PIECES power-of-two pieces (``_row_pieces``): fewer masked lanes than the
# row's own power of two (4097 bf16: 4104 lanes, not 8192). Two, not three: a third piece lost 13-27
# points at 7000 and 12345 (H200). A second piece only while over _PIECE_SLACK of the lanes would be
# masked, and only where the row's own power of two masks _piece_waste of them.
_ROW_PIECES = 2
_PIECE_SLACK = 0.125
_PIECES_MIN_COLS = 256
_PIECES_WIDE = 4096
_PIECE_WASTE_NARROW = 0.45
_PIECE_WASTE_WIDE_16BIT = 0.2
_PIECE_WASTE_WIDE_FP32 = 0.3
# fp32 rows that all start aligned (VEC 1) keep their power of two from 4096 whatever it masks (1.0: never in pieces),
# as Liger's kernel does: H200, 2026-12-03, two runs, pieces -> one tile (Liger beside): 5632 94 -> 96.6 (96.2), 8704
# 92 -> 95.5 (94.1), 9728 94 -> 96.3 (95.5), 10240 93.5 -> 96 (95.2); 4096 level. Ragged fp32 rows keep the rule above.
_PIECE_WASTE_WIDE_FP32_ALIGNED = 1.0
_PIECE_MIN_WARPS = 2  # 2049 bf16 on 2 warps (32 elements a thread): 73 -> 90%+ of copy (H200)
_PHASED_NARROW_COLS = (64, 128)
# Packed rows (contiguous, strides N) on Triton's own accesses whose N is not a multiple of 16 elements, up to this
# width, take N as a compile-time constant (_narrow, Phased.packed_width): the rows' alignment (the largest power
# of two dividing N) becomes known, so a 60-wide bf16 row loads as 8-byte vectors and a 24-wide one as 16-byte ones,
# not element by element (sm_90 SASS: 1040 -> 312 and 888 -> 224 instructions a program); one compile a width.
# H200, % of copy, bf16 / fp32: 24 31 / 59 -> 98 / 98, 40 21 / 41 -> 93 / 98, 60 31 / 57 -> 97 / 98, 200 49 / 90 ->
# 99 / 98, 600 65 / 97 -> 88 / 100, 1000 86 / 97 -> 99 / 98, 1500 79 / 98 -> 98 / 99; odd widths level (13 37 -> 37)
_PACKED_N_MAX = 2047
# Packed rows in _PHASED_NARROW_COLS whose N is a multiple of this keep Triton's accesses at a compile-time width
# instead of aligned vectors (_packed_band). H200, % of copy, bf16 / fp32: 68 55 / 82 -> 66 / 99, 72 59 / 85 -> 86
# / 98, 100 77 / 98 -> 88 / 97; odd and twice-odd rows lost (65 53 -> 20, 66 54 -> 37, 98 76 -> 54, 127 89 -> 39)
_PACKED_BAND_MULTIPLE = 4
# 16-bit rows in these bands (inclusive) take their exponentials against the row's first element: one block
# reduction instead of two, on the rows plan and the staged plan's aligned rows (_softmax_rows' SHIFT;
# docs/kernels.md, "One reduction"). H200, % of copy: bf16 8704 75 -> 82, 10240 84 -> 93, 12345 74 -> 83,
# 16384 93 -> 97, 32768 84 -> 86; fp16 1000 79 -> 85; 2048-8192 level or up to 1 point lower, and odd widths
# under 16 lost (bf16 3 36-39 -> 26: a row's extra load among few elements), so not there.
_SHIFT_16BIT: tuple[tuple[int, int], ...] | None = ((256, 2047), (8193, 32768))


def _softmax_settings(
    n_rows: int,
    n_cols: int,
    elem_size: int,
    *,
    max_row: int | None = None,
    wide: str | None = None,
    held: bool | None = None,
) -> _Plan:
    """The launch plan for an (n_rows, n_cols) softmax: the one place its heuristics live.

    ``max_row`` overrides the widest row held by one program (tests force the wide-row
    plans with a small value; it is then also their step width). ``wide`` names the plan
    for wide rows ("persistent" or "split") instead of ``_WIDE_ROWS_PLAN``; "split" with more
    than one program a row waits on other programs, so under the interpreter an explicit
    ``wide="split"`` is refused and the ``_WIDE_ROWS_PLAN`` choice runs one program a row.
    ``elem_size`` sizes the persistent and split chunks (bytes in flight). ``held``: whether the "held" plan may
    be taken (default: where this machine runs it, ``_softmax_held.available``); neither ``max_row`` nor ``wide``
    ever takes it.
    """
    if held is None:
        held = _softmax_held.available()
    slices = _held_split_group(n_cols, elem_size) if held and max_row is None and wide is None else 0
    if slices:
        return _Plan("held", 1, _softmax_held.BLOCK, _softmax_held.WARPS, slices,
                     _softmax_held.per_sm(_softmax_held.split_shape(n_cols, elem_size, slices)[1], elem_size),
                     _softmax_held.MAX_REGS)
    if held and max_row is None and wide is None and _held_default(n_cols, elem_size):
        return _Plan("held", 1, _softmax_held.BLOCK, _softmax_held.WARPS,
                     per_sm=_softmax_held.per_sm(n_cols, elem_size), max_regs=_softmax_held.MAX_REGS)
    widest = max_row if max_row is not None else _MAX_ROW
    wide_plan = wide or _WIDE_ROWS_PLAN
    if wide_plan not in _WIDE_PLANS:
        raise ValueError(f"unknown wide-row plan {wide_plan!r}; choose one of {_WIDE_PLANS}")
    staged_ok = ragged_width(n_cols, elem_size) <= _STAGED_MAX_COLS
    if wide == "staged" and not staged_ok:
        raise ValueError(f"the staged plan holds rows up to {_STAGED_MAX_COLS} columns, not {n_cols}")
    if staged_ok and (wide == "staged" or (wide_plan == "staged" and n_cols > widest)
                      or (max_row is None and wide_plan == "auto" and _staged_default(n_cols, elem_size))):
        return _staged_plan(n_cols, elem_size)
    # A rows-plan program's tile covers the row's columns; where a phase carries an unaligned
    # row past it, those last few elements are edges (``_softmax_fwd_kernel``): a 4095-wide
    # bf16 row takes a 4096-lane tile, not 8192 (docs/kernels.md, "Ragged rows").
    if n_cols <= widest:
        block_n = next_power_of_2(n_cols)
        block_m = max(1, min(_rows_tile(n_cols, elem_size) // block_n, next_power_of_2(n_rows)))
        return _Plan("rows", block_m, block_n, warps_for(block_m * block_n), max_regs=_ROWS_MAX_REGS)
    if wide_plan == "staged":  # _WIDE_ROWS_PLAN "staged", a row too wide for it: the wide plans' choice
        wide_plan = "auto"
    if wide_plan == "auto":
        wide_plan = _auto_wide_plan(n_cols, elem_size)
    split = wide_plan == "split"
    group = min(_MAX_SPLIT_GROUP, cdiv(n_cols * elem_size, _SPLIT_SLICE_BYTES)) if split else 1
    hold = (split and max_row is None and elem_size >= _SPLIT_HOLD_MIN_ELEM_SIZE
            and _SPLIT_HOLD_MIN_ROW_BYTES <= n_cols * elem_size <= _MAX_SPLIT_GROUP * _SPLIT_SLICE_BYTES)
    warps, per_sm = (_SPLIT_HOLD_WARPS, 1) if hold else (_SPLIT_WARPS, _SPLIT_PER_SM) if split else (_PERSISTENT_WARPS, 1)
    if max_row is None:
        chunk_bytes = _SPLIT_SLICE_BYTES if hold else _SPLIT_CHUNK_BYTES if split else _PERSISTENT_CHUNK_BYTES
        chunk = chunk_bytes // elem_size
    else:
        chunk = next_power_of_2(max_row)
    group = split_group(n_cols, chunk, group)[0]
    if group > 1 and interpreting():
        if wide == "split":
            raise ValueError("the split plan waits on other programs: it cannot run under the interpreter")
        group = 1
    return _Plan(wide_plan, 1, chunk, warps, group, per_sm, _resident_regs(warps, per_sm))


def _held_default(n_cols: int, elem_size: int) -> bool:
    """Whether the planner takes the "held" plan for rows of ``n_cols`` (``_HELD``, from ``_HELD_MIN_COLS``, 16-bit
    rows of no multiple of 16 columns from ``_HELD_RAGGED_16BIT_MIN_COLS``, at least ``_HELD_MIN_PER_SM`` programs an
    SM): 16-bit rows (powers of two with ``_HELD_16BIT_POW2``); fp32 rows of a multiple of 16 columns in
    ``_HELD_FP32_ALIGNED_BANDS``, other fp32 rows always."""
    progs = _softmax_held.per_sm(n_cols, elem_size)
    narrow_ok = elem_size < 4 and n_cols % 16 != 0 and n_cols >= _HELD_RAGGED_16BIT_MIN_COLS
    if not _HELD or (n_cols < _HELD_MIN_COLS and not narrow_ok):
        return False
    if progs < _HELD_MIN_PER_SM[4 if elem_size >= 4 else 2]:
        return False
    if elem_size < 4:
        return _HELD_16BIT_POW2 or n_cols & (n_cols - 1) != 0
    if n_cols % 16 == 0:
        return any(lo <= n_cols <= hi for lo, hi in _HELD_FP32_ALIGNED_BANDS)
    return True


def _held_split_group(n_cols: int, elem_size: int) -> int:
    """Slices a row for the "held" plan in slices (``_HELD_SPLIT``): rows of which fewer than ``_HELD_SPLIT_BELOW``
    programs an SM hold whole, in the fewest slices that leave the first
    of ``_HELD_SPLIT_PER_SM``'s programs an SM that ``_MAX_SPLIT_GROUP`` slices reach; 0 where it is not taken (the
    planner goes on to ``_held_default``)."""
    key = 4 if elem_size >= 4 else 2
    if not _HELD_SPLIT or n_cols < _HELD_MIN_COLS or _softmax_held.per_sm(n_cols, elem_size) >= _HELD_SPLIT_BELOW[key]:
        return 0
    for target in _HELD_SPLIT_PER_SM[key]:
        for asked in range(2, _MAX_SPLIT_GROUP + 1):
            group, slice_cols = _softmax_held.split_shape(n_cols, elem_size, asked)
            if group > 1 and _softmax_held.per_sm(slice_cols, elem_size) >= target:
                return group
    return 0


def _rows_tile(n_cols: int, elem_size: int) -> int:
    """Elements a rows-plan program holds: ``_MASKED_ROWS_TILE`` for 16-bit rows of a multiple of 8 columns whose power
    of two is ``_MASKED_ROWS_BLOCK`` lanes, at least ``_MASKED_ROWS_MIN_SHARE`` of them masked, held in one piece
    (``_row_pieces``); else ``_ROWS_TILE`` (fp32: ``_ROWS_TILE_FP32`` where set)."""
    if (elem_size == 2 and n_cols % 8 == 0 and next_power_of_2(n_cols) == _MASKED_ROWS_BLOCK
            and n_cols <= (1 - _MASKED_ROWS_MIN_SHARE) * _MASKED_ROWS_BLOCK and _row_pieces(n_cols, 1, elem_size)[1] == 0):
        return max(_ROWS_TILE, _MASKED_ROWS_TILE)
    return _ROWS_TILE_FP32 if elem_size >= 4 and _ROWS_TILE_FP32 else _ROWS_TILE


def _staged_default(n_cols: int, elem_size: int) -> bool:
    """Whether "auto" takes the staged plan (from ``_STAGED_MIN_COLS``; H200 sweep, docs/kernels.md "softmax"):
    fp32 rows, and 16-bit rows that fill ``_STAGED_MIN_LANE_USE_16BIT`` of their power of two (unaligned ones
    where ``_STAGED_UNALIGNED_16BIT``; below it the split walk was faster: 16385 46% against 57%)."""
    if n_cols < _STAGED_MIN_COLS:
        return False
    if elem_size >= 4:
        return True
    aligned = ragged_width(n_cols, elem_size) == n_cols
    return (aligned or _STAGED_UNALIGNED_16BIT) and n_cols / next_power_of_2(n_cols) >= _STAGED_MIN_LANE_USE_16BIT


def _staged_plan(n_cols: int, elem_size: int, vec: int | None = None) -> _Plan:
    """The staged plan: the rows kernel, one row a step (persistent and pipelined where
    ``_STAGED_PERSISTENT``). The row in up to ``_STAGED_PIECES`` pieces (``_row_pieces``, from ``_STAGED_PIECE_WASTE`` of masked lanes) on
    ``_STAGED_ELEMS`` elements a thread (4 to 32 warps, 64 registers); as many rows in flight (stages
    - 1) as ``_STAGED_SMEM_BYTES`` holds, up to ``_STAGED_STAGES - 1``; as many programs an SM as
    registers and shared memory allow. ``vec``: the launch's (default: that of a contiguous tensor)."""
    if vec is None:
        vec = 1 if ragged_width(n_cols, elem_size) == n_cols else max(1, 16 // elem_size)
    pieces = _row_pieces(n_cols, vec, elem_size, max_pieces=_STAGED_PIECES, waste=_STAGED_PIECE_WASTE)
    lanes = sum(pieces)
    warps = max(4, min(32, next_power_of_2(cdiv(lanes, 32 * _STAGED_ELEMS))))
    row_bytes = lanes * elem_size
    stages = max(1, min(_STAGED_STAGES, 1 + _STAGED_SMEM_BYTES // row_bytes))
    by_regs = _REGS_PER_SM // (warps * 32 * _ROWS_MAX_REGS)
    by_smem = _STAGED_SMEM_BYTES // ((stages - 1) * row_bytes) if stages > 1 else by_regs
    return _Plan("staged", 1, pieces[0], warps, per_sm=max(1, min(by_regs, by_smem)), max_regs=_ROWS_MAX_REGS,
                 stages=stages, pieces=pieces)


def _resident_regs(warps: int, per_sm: int) -> int:
    """The register cap at which ``per_sm`` programs of ``warps`` warps fit an SM's 64K registers at once
    (in Triton's steps of 8), or 0 when one program an SM needs no cap."""
    if per_sm <= 1:
        return 0
    return min(_MAX_REGS, _REGS_PER_SM // (warps * 32 * per_sm) // 8 * 8)


def _auto_wide_plan(n_cols: int, elem_size: int) -> str:
    """``_WIDE_ROWS_PLAN`` "auto": "persistent" for 16-bit rows up to ``_PERSISTENT_MAX_ROW_BYTES``
    that fill its 64 KiB chunks (``_PERSISTENT_MIN_LANE_USE``), else "split" (docs/kernels.md, "softmax")."""
    if elem_size >= 4 or n_cols * elem_size > _PERSISTENT_MAX_ROW_BYTES:
        return "split"
    chunk = _PERSISTENT_CHUNK_BYTES // elem_size
    width = ragged_width(n_cols, elem_size)
    return "persistent" if width / (cdiv(width, chunk) * chunk) >= _PERSISTENT_MIN_LANE_USE else "split"


# --------------------------------------------------------------------------- launchers


def _launch(x2: torch.Tensor, y2: torch.Tensor, plan: _Plan) -> None:
    n_rows, n_cols = x2.shape
    if plan.mode == "held":
        if _softmax_held.split_fits(x2, y2, plan.group):
            try:
                _softmax_held.launch_split(x2, y2, plan.group, sm_count(x2.device))
                return
            except _softmax_held.CompilationError as exc:  # a Triton whose Gluon moved on: warn once, then without it
                _softmax_held.disable(exc)
        # rows not packed (a column slice) or not 16-byte aligned: the plan without it
        return _launch(x2, y2, _softmax_settings(n_rows, n_cols, x2.element_size(), held=False))
    if plan.mode == "staged":
        r = phased(x2, y2)
        if launch_width(n_cols, r.vec) > _STAGED_MAX_COLS:  # an aligned width at an odd offset, too wide
            r.finish()
            return _launch(x2, y2, _softmax_settings(n_rows, n_cols, x2.element_size(), max_row=_MAX_ROW))
        plan = _staged_plan(n_cols, x2.element_size(), r.vec)
        persistent = _STAGED_PERSISTENT[4 if x2.element_size() >= 4 else 2]
        grid = max(1, min(n_rows, sm_count(x2.device) * plan.per_sm)) if persistent else n_rows
        launch_kernel(_softmax_fwd_kernel, (grid,),
            r.x, r.y, r.phase, n_rows, n_cols, r.stride_x, r.stride_y,
            BLOCK_M=1, BLOCK_N=plan.pieces[0], BLOCK_T=plan.pieces[1], BLOCK_U=plan.pieces[2], VEC=r.vec, NARROW=0,
            FAST_EXP=not interpreting(), STAGES=plan.stages if persistent else 0, EDGE_WORDS=_EDGE_WORDS,
            SHIFT=r.vec == 1 and _shift(n_cols, x2.element_size()), num_warps=plan.num_warps,
            **_reg_cap(plan),
        )
        r.finish()
        return
    r = Phased.plain(x2, y2)  # Triton's own (scalar, for unaligned rows) accesses
    if plan.mode != "rows" or (_phase_rows(n_cols, x2.element_size()) and not _packed_band(r, n_cols)):
        r = phased(x2, y2)
    if plan.mode == "rows":
        block_n = max(plan.block_n, next_power_of_2(n_cols))
        pieces = (_row_pieces(n_cols, r.vec, x2.element_size()) if block_n == next_power_of_2(n_cols)
                  else (block_n, 0, 0))
        warps = plan.num_warps if pieces[1] == 0 else _piece_warps(plan.block_m * sum(pieces))
        plan = plan._replace(max_regs=_rows_regs(pieces, r.vec, x2.element_size(), plan.max_regs))
        launch_kernel(_softmax_fwd_kernel, (cdiv(n_rows, plan.block_m),),
            r.x, r.y, r.phase, n_rows, n_cols, r.stride_x, r.stride_y,
            BLOCK_M=plan.block_m, BLOCK_N=pieces[0], BLOCK_T=pieces[1], BLOCK_U=pieces[2], VEC=r.vec,
            NARROW=_narrow(r, n_cols), FAST_EXP=not interpreting(),
            EDGE_WORDS=_edge_words(n_cols, x2.element_size()), SHIFT=_shift(n_cols, x2.element_size()),
            num_warps=warps,
            **_reg_cap(plan),
        )
    else:
        _launch_split(r, n_rows, n_cols, plan)
    r.finish()


def _row_pieces(n_cols: int, vec: int, elem_size: int = 4, max_pieces: int | None = None,
                waste: float | None = None) -> tuple[int, int, int]:
    """(BLOCK_N, BLOCK_T, BLOCK_U) of the rows kernel (``_ragged.row_pieces``).

    The pieces cover every whole vector a row can hold; the edges take the rest
    (``_softmax_fwd_kernel``): N virtual columns for aligned rows, the vectors up to N + VEC -
    1 for unaligned ones. A row keeps its own power of two unless that leaves at least
    ``_piece_waste`` of its lanes masked (each piece adds two row reductions).
    """
    need = (n_cols + vec - 1) // vec * vec if vec > 1 else n_cols
    pieces = _ROW_PIECES if max_pieces is None else max_pieces
    single = next_power_of_2(need)
    least = _piece_waste(need, elem_size, vec) if waste is None else waste
    if n_cols < _PIECES_MIN_COLS or (single - need) < least * single:
        pieces = 1
    return row_pieces(need, vec, pieces, _PIECE_SLACK)


def _piece_waste(need: int, elem_size: int, vec: int = 1) -> float:
    """Share of masked lanes from which a row is held in pieces (H200 sweep, docs/kernels.md "softmax"):
    rows narrower than 4096 only just above a power of two (1025, 2049: 50%; 768, 1536, 2560 lost
    6-8 points in pieces); wider ones from 20% in 16-bit (5120, 10000, 12288 gained 7-16 points) and
    30% in ragged fp32 (6144 lost 5); aligned fp32 rows (``vec`` 1) ``_PIECE_WASTE_WIDE_FP32_ALIGNED``."""
    if need < _PIECES_WIDE:
        return _PIECE_WASTE_NARROW
    if elem_size < 4:
        return _PIECE_WASTE_WIDE_16BIT
    return _PIECE_WASTE_WIDE_FP32_ALIGNED if vec == 1 else _PIECE_WASTE_WIDE_FP32


def _piece_warps(lanes: int) -> int:
    """Warps of a rows program holding ``lanes`` in pieces: 32 elements a thread over the largest power of
    two under ``lanes``, ``_PIECE_MIN_WARPS`` to 16 (4096 + 8 on 4 warps, not the 8 of an 8192 tile)."""
    return max(_PIECE_MIN_WARPS, min(16, (1 << (lanes.bit_length() - 1)) // (32 * ELEMS_PER_THREAD)))


def _shift(n_cols: int, elem_size: int) -> bool:
    """Whether 16-bit rows of ``n_cols`` take the rows kernel's one-reduction path (``_SHIFT_16BIT``)."""
    return elem_size == 2 and any(lo <= n_cols <= hi for lo, hi in _SHIFT_16BIT or ())


def _narrow(r: Phased, n_cols: int) -> int:
    """``NARROW`` of the rows kernel: N for packed rows on Triton's own accesses that are not a multiple of 16
    elements and at most ``_PACKED_N_MAX`` wide (``Phased.packed_width``); else 0.

    A runtime stride that is not a multiple of 16 tells Triton nothing of alignment, so each element was a
    scalar load (bf16 8 columns: 41% of copy, ncu); a compile-time stride lets a row load as vectors as wide as
    the largest power of two dividing N (a row of 1, 2, 4 or 8: one vector). Strides that are multiples of 16
    Triton already knows, so those rows keep a runtime N (no compile a width).
    """
    return r.packed_width(n_cols, _PACKED_N_MAX)


def _phase_rows(n_cols: int, elem_size: int = 4) -> bool:
    """Whether the ``rows`` plan reads unaligned rows as aligned vectors (``_ragged``): where it measured
    faster than Triton's scalar accesses (docs/kernels.md, "Ragged rows"); their edges as words where
    ``_edge_words``."""
    return (n_cols >= _PHASED_ROWS_MIN_COLS or _PHASED_NARROW_COLS[0] <= n_cols <= _PHASED_NARROW_COLS[1]
            or _odd_16bit_band(n_cols, elem_size))


def _odd_16bit_band(n_cols: int, elem_size: int) -> bool:
    """Whether rows of ``n_cols`` are odd 16-bit ones in ``_PHASED_ODD_16BIT``."""
    band = _PHASED_ODD_16BIT
    return elem_size == 2 and n_cols % 2 == 1 and band is not None and band[0] <= n_cols <= band[1]


def _edge_words(n_cols: int, elem_size: int) -> bool:
    """Whether the rows plan loads a phased row's edges as 32-bit words (``_EDGE_WORDS``): from
    ``_PHASED_ROWS_MIN_COLS``, and in ``_PHASED_ODD_16BIT`` (as measured there)."""
    return _EDGE_WORDS and (n_cols >= _PHASED_ROWS_MIN_COLS or _odd_16bit_band(n_cols, elem_size))


def _packed_band(r: Phased, n_cols: int) -> bool:
    """Whether rows in ``_PHASED_NARROW_COLS`` keep Triton's own accesses with a compile-time width (``_narrow``)
    instead of aligned vectors: packed rows whose N is a multiple of ``_PACKED_BAND_MULTIPLE``."""
    return n_cols % _PACKED_BAND_MULTIPLE == 0 and r.packed_width(n_cols, _PACKED_N_MAX) > 0


def _launch_split(r: Phased, n_rows: int, n_cols: int, plan: _Plan) -> None:
    group, slice_cols = split_group(launch_width(n_cols, r.vec), plan.block_n, plan.group)
    shift = _split_shift(plan, r.vec, r.x.element_size(), slice_cols)
    split_run(
        _softmax_split_kernel,
        lambda part, sync, n_programs: (
            r.x, r.y, part, sync, r.phase, n_rows, n_cols, r.stride_x, r.stride_y, slice_cols, n_programs),
        n_rows, group, plan.per_sm, r.x.device, r.x,
        GROUP=group, BLOCK_N=plan.block_n, BLOCK_G=next_power_of_2(group), FAST_EXP=not interpreting(),
        SUB=max(1, min(plan.block_n, 16 // r.x.element_size())), HOLD=slice_cols == plan.block_n,
        EARLY=group == 1 and slice_cols == plan.block_n, VEC=r.vec, SHIFT=shift, num_warps=plan.num_warps,
        planes=2 if shift else 1, **_reg_cap(plan),
    )


def _split_shift(plan: _Plan, vec: int, elem_size: int, slice_cols: int) -> bool:
    """Whether the split walk's pass one sums exp(x - c) (``SHIFT``): 16-bit rows of the plans in
    ``_SPLIT_SHIFT_PLANS``, aligned unless ``_SPLIT_SHIFT_RAGGED``, tiles of more than one step."""
    return (_SPLIT_SHIFT_16BIT and elem_size == 2 and plan.mode in _SPLIT_SHIFT_PLANS and slice_cols != plan.block_n
            and (vec == 1 or _SPLIT_SHIFT_RAGGED))


def _rows_regs(pieces: tuple[int, int, int], vec: int, elem_size: int, cap: int) -> int:
    """The rows plan's register cap for a row held as ``pieces``: ``_TAIL_PIECE_REGS_16BIT`` for aligned 16-bit
    rows of 8192 lanes and a second piece in its band, else ``cap``."""
    if _TAIL_PIECE_REGS_16BIT is None or elem_size != 2 or vec != 1:
        return cap
    least, most, regs = _TAIL_PIECE_REGS_16BIT
    return regs if pieces[0] == 8192 and least <= pieces[1] <= most and pieces[2] == 0 else cap


def _reg_cap(plan: _Plan) -> dict:
    """Launch options capping registers (``_Plan.max_regs``); none under the interpreter."""
    return {"maxnreg": plan.max_regs} if plan.max_regs and not interpreting() else {}


# --------------------------------------------------------------------------- public functions


CALLS = Calls("softmax.fused")  # each problem's first call recorded, replayed after (_launch.py)


def fused(x: torch.Tensor, *, out: torch.Tensor | None = None, max_row: int | None = None) -> torch.Tensor:
    """Softmax of ``x`` over its last dimension by the fused kernel (plans: the module docstring).

    ``x``: float32, float16 or bfloat16, at least one dimension, any strides (a last
    dimension that is not contiguous, or leading dims that do not flatten to one, cost a
    copy). Returns a contiguous tensor of ``x``'s shape and dtype, written into ``out``
    when given (contiguous, same shape, dtype and device). ``max_row`` overrides the
    launch heuristic (``_softmax_settings``), for tests.
    """
    return CALLS((max_row,), (x, out), lambda: _fused(x, out, max_row))


def _fused(x: torch.Tensor, out: torch.Tensor | None, max_row: int | None) -> torch.Tensor:
    check_tensor(x, "x", min_ndim=1)
    y = output_like(x, out)
    if x.numel() == 0:
        return y
    x2 = as_rows(x)
    y2 = y if x.dim() == 2 else y.view(-1, x.shape[-1])
    _launch(x2, y2, _softmax_settings(x2.shape[0], x2.shape[1], x.element_size(), max_row=max_row))
    return y


def unfused(x: torch.Tensor) -> torch.Tensor:
    """The five-op softmax as people write it; traffic per line for x of shape (M, N)."""
    x_max = x.amax(dim=-1, keepdim=True)  # read MN elements ; write M elements
    z = x - x_max  # read MN + M elements ; write MN elements
    numerator = torch.exp(z)  # read MN elements ; write MN elements
    denominator = numerator.sum(dim=-1, keepdim=True)  # read MN elements ; write M elements
    return numerator / denominator  # read MN + M elements ; write MN elements


def budget(x: torch.Tensor) -> Budget:
    """Compulsory traffic of a softmax of ``x``: read x once, write y once."""
    m, n = rows_cols(x)
    size = x.element_size()
    return Budget(read_bytes=m * n * size, write_bytes=m * n * size, label="softmax")


def unfused_traffic(x: torch.Tensor) -> Budget:
    """Traffic of ``unfused(x)``: the sum of its line comments, each op reading from and writing to HBM."""
    m, n = rows_cols(x)
    size = x.element_size()
    reads = (m * n) + (m * n + m) + (m * n) + (m * n) + (m * n + m)
    writes = m + (m * n) + (m * n) + m + (m * n)
    return Budget(read_bytes=reads * size, write_bytes=writes * size, label="softmax, five ops")
