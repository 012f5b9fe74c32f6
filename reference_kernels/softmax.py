"""Fused softmax over the last dimension, for any row width.

``plan`` chooses one of five launch plans on four kernels, from the problem and the ``_device.Device`` (its resources
queried, its measured choices from ``tuned/<arch>.json``: docs/kernels.md, "Planning"):

* ``rows`` (rows up to ``MAX_ROW`` wide): ``_softmax_fwd_kernel``, a program loads ``block_m`` whole rows, reduces max
  and sum of exponentials in registers and writes the result: one read, one write (16-bit rows of ``shift_16bit``: the
  sum alone, of exponentials against the row's first element). 92-100% of copy on an H200.
* ``held`` (wider rows on compute capability 9.x with Triton's Gluon, ``_softmax_held``): a program a row copies it into
  shared memory (``cp.async``) and reads it there twice; one read and one write. Rows that fewer than ``held_per_sm``
  programs an SM hold go in 2-16 slices, a slice a program, whose programs exchange their (max, sum). 74-95% of copy.
* ``staged`` (rows in ``staged_cols``, tuned data only): the rows kernel, one row on up to 32 warps; 16-bit rows walked
  by one persistent program an SM whose row loop Triton pipelines (the next rows' loads in flight through shared
  memory), fp32 rows one program a row. 69-90% of copy.
* ``persistent`` and ``split`` (every other wide row): ``_softmax_split_kernel``, a few programs an SM walking tiles (a
  whole row, or one of a row's slices whose programs exchange (max, sum)) twice, the slices of rows up to 1 MiB sized
  so that those in flight fit in L2 and the second read comes from there; a tile of one step is held in registers
  instead (no second read); aligned 16-bit rows of ``split`` sum exp(x - the row's first element) in pass one. The walk is shared with the
  layer-norm forward (``_split_walk``). 56-81% of copy: short of the 90% target, above every anchor.

The plans that lost to these are listed in docs/kernels.md, "Variants removed". The max and sum are taken in float32
whatever the input dtype; the output has the input's dtype. Rows of ``-inf`` and rows holding ``nan`` or ``+inf`` come
out as torch's do (all ``nan``).
"""

from __future__ import annotations

import dataclasses
import functools

import torch
import triton
import triton.language as tl

from pytest_fusioncheck.budget import Budget

from . import _device, _softmax_held
from ._common import (ELEMS_PER_THREAD, as_rows, cdiv, check_tensor, interpreting, next_power_of_2, output_like, rows_cols,
                      warps_for)
from ._device import Device
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

# What every plan is built from (docs/kernels.md, "softmax"): a rows program holds up to MAX_ROW elements of a row
# (32 warps x 32 threads x 16 fp32) and ROWS_TILE elements in all (4 warps x 32 x 16); wider rows are held in shared
# memory ("held", sm_90) or walked twice, the second time from L2 ("persistent", "split").
MAX_ROW = 16384
ROWS_TILE = 2048
MAX_REGS = 255  # the most registers a thread may have
MAX_SPLIT_GROUP = 16  # programs a row's slices wait on: far below what a GPU holds at once
PACKED_N_MAX = 2047  # packed rows of no multiple of 16 up to this width take N as a compile-time constant (_narrow)
PHASED_ROWS_MIN_COLS = 2048  # the rows plan reads unaligned rows as aligned vectors from here ("Ragged rows")
# Rows in up to two power-of-two pieces (_row_pieces: a third lost 13-27 points), a second piece only while over
# PIECE_SLACK of the lanes would be masked, from PIECES_MIN_COLS; PIECE_MIN_WARPS warps at least.
PIECE_SLACK = 0.125
PIECES_MIN_COLS = 256
PIECE_MIN_WARPS = 2
# The staged plan: one row a step, STAGED_ELEMS a thread, up to STAGED_STAGES - 1 rows in flight in the shared memory
# a block may take less STAGED_SMEM_SPARE.
STAGED_ELEMS = 32
STAGED_STAGES = 3
STAGED_SMEM_SPARE = 35840
# The walk (_split_walk) sized for the L2: a persistent program an SM with one 64 KiB chunk in flight; split slices
# of SPLIT_SLICE_BYTES walked in SPLIT_CHUNK_BYTES steps by three 8-warp programs an SM (3 x 132 x 64 KiB: 26 MB);
# fp32 slices of one step held in registers by one 16-warp program an SM from SPLIT_HOLD_MIN_ROW_BYTES.
PERSISTENT_CHUNK_BYTES = 65536
SPLIT_CHUNK_BYTES = 16384
SPLIT_SLICE_BYTES = 65536
SPLIT_PER_SM = 3
SPLIT_HOLD_MIN_ROW_BYTES = 262144
WIDE_PLANS = ("staged", "persistent", "split")


@dataclasses.dataclass(frozen=True)
class Tuning:
    """Choices measured on one kind of GPU and Triton (``tuned/<arch>.json``, "softmax"; docs/kernels.md, "softmax",
    gives each with its figures). The defaults are the plans' principles alone, and run on any GPU."""

    rows_tile_fp32: int = ROWS_TILE  # elements a rows program holds of fp32 rows
    # (lanes, least masked share, tile): 16-bit rows of a multiple of 8 columns whose power of two is ``lanes``, that
    # share of it masked, held in one piece, take ``tile`` elements a program
    masked_rows: tuple | None = None
    shift_16bit: tuple = ()  # bands (inclusive) of 16-bit rows whose exponentials are taken against the first element
    odd_16bit: tuple | None = None  # (lo, hi): odd 16-bit rows the rows plan reads as aligned vectors and edge words
    narrow_phased: tuple | None = None  # (lo, hi): narrow rows the rows plan reads as aligned vectors ...
    narrow_packed_multiple: int = 0  # ... but packed ones of a multiple of this (0: none), at a compile-time width
    tail_regs_16bit: tuple | None = None  # (least, most, regs): aligned 16-bit rows of 8192 lanes + a piece in [least, most]
    # masked share from which a row goes in pieces: under 4096 lanes; wider 16-bit; wider fp32, unaligned / aligned
    piece_waste: tuple = (0.45, 0.45, 0.45, 0.45)
    staged_cols: tuple | None = None  # (lo, hi): rows the staged plan takes (None: never) ...
    staged_lane_use_16bit: float = 0.0  # ... 16-bit ones only filling this much of their power of two
    held_ragged_16bit_from: int = 0  # 16-bit rows of no multiple of 16 held from this width (0: from MAX_ROW + 1)
    held_fp32_aligned: tuple = ((MAX_ROW + 1, 1 << 30),)  # bands of fp32 rows of a multiple of 16 that are held
    held_per_sm: tuple = (2, 1)  # programs an SM a whole held row needs, 16-bit / fp32; fewer: held in slices
    persistent: tuple | None = None  # (most row bytes, least lane use): 16-bit rows the persistent walk takes
    split_shift_16bit: bool = False  # aligned 16-bit rows of the split walk sum exp(x - the row's first element)


DEFAULT_TUNING = Tuning()


@dataclasses.dataclass(frozen=True)
class Plan:
    """How one softmax is launched (``plan``); benchmarks may vary it (``dataclasses.replace``)."""

    mode: str  # "rows", "held", "staged", "persistent" or "split"
    block_m: int
    block_n: int
    num_warps: int
    group: int = 1  # "split" and "held": programs (slices) per row; "persistent" is "split" with 1
    per_sm: int = 0  # "staged", "persistent", "split", "held": programs an SM
    max_regs: int = 0  # registers a thread may use (Triton's maxnreg), 0: the compiler's choice
    stages: int = 0  # "staged": software-pipelining depth of the row loop (0: one program a row)
    pieces: tuple = ()  # "staged": (BLOCK_N, BLOCK_T, BLOCK_U) of a contiguous input's rows (_row_pieces)
    device: Device = dataclasses.field(default=_device.INTERPRETER, compare=False, repr=False)
    tuning: Tuning = dataclasses.field(default=DEFAULT_TUNING, compare=False, repr=False)


def plan(n_rows: int, n_cols: int, elem_size: int, device: Device, *, tuning: Tuning | None = None,
         max_row: int | None = None, wide: str | None = None, held: bool | None = None) -> Plan:
    """The launch plan for an (n_rows, n_cols) softmax on ``device``: the one place its choices live.

    ``tuning``: the measured choices (default: ``device``'s tuned file where this Triton matches it, else
    ``DEFAULT_TUNING``). ``max_row`` overrides the widest row held by one program (tests force the wide-row plans with a
    small value; it is then also their step width). ``wide`` names the plan for wide rows (``WIDE_PLANS``); "split"
    with more than one program a row waits on other programs, so on a device whose programs do not run at once (the
    interpreter) an explicit ``wide="split"`` is refused and an implied one runs one program a row. ``held``: whether the "held" plan may be taken (default: where
    ``device`` runs it, ``_softmax_held.available``); neither ``max_row`` nor ``wide`` ever takes it.
    """
    t = _device.tuning("softmax", device, DEFAULT_TUNING) if tuning is None else tuning
    if wide is not None and wide not in WIDE_PLANS:
        raise ValueError(f"unknown wide-row plan {wide!r}; choose one of {WIDE_PLANS}")
    made = functools.partial(Plan, device=device, tuning=t)
    if held is None:
        held = device.arch // 10 == 9 and _softmax_held.available()
    if held and max_row is None and wide is None:
        slices = _held_split_group(n_cols, elem_size, device, t)
        if slices:
            per_sm = _softmax_held.per_sm(_softmax_held.split_shape(n_cols, elem_size, slices)[1], elem_size, device=device)
            return made("held", 1, _softmax_held.BLOCK, _softmax_held.WARPS, slices, per_sm, _softmax_held.MAX_REGS)
        if _held_default(n_cols, elem_size, device, t):
            return made("held", 1, _softmax_held.BLOCK, _softmax_held.WARPS,
                        per_sm=_softmax_held.per_sm(n_cols, elem_size, device=device), max_regs=_softmax_held.MAX_REGS)
    widest = max_row if max_row is not None else MAX_ROW
    staged_ok = t.staged_cols is not None and ragged_width(n_cols, elem_size) <= t.staged_cols[1]
    if wide == "staged" and not staged_ok:
        held_cols = "no rows" if t.staged_cols is None else f"rows of {t.staged_cols[0]}-{t.staged_cols[1]} columns"
        raise ValueError(f"the staged plan takes {held_cols} with these choices on {device.name}, not {n_cols}")
    if staged_ok and (wide == "staged" or (max_row is None and wide is None and _staged_default(n_cols, elem_size, t))):
        return _staged_plan(n_cols, elem_size, device, t)
    # A rows-plan program's tile covers the row's columns; where a phase carries an unaligned row past it, those last
    # few elements are edges (``_softmax_fwd_kernel``): a 4095-wide bf16 row takes a 4096-lane tile, not 8192
    # (docs/kernels.md, "Ragged rows").
    if n_cols <= widest:
        block_n = next_power_of_2(n_cols)
        block_m = max(1, min(_rows_tile(n_cols, elem_size, t) // block_n, next_power_of_2(n_rows)))
        return made("rows", block_m, block_n, warps_for(block_m * block_n), max_regs=_resident_regs(16, 2, device))
    mode = wide if wide in ("persistent", "split") else _auto_wide_plan(n_cols, elem_size, t)
    split = mode == "split"
    hold = (split and max_row is None and elem_size >= 4
            and SPLIT_HOLD_MIN_ROW_BYTES <= n_cols * elem_size <= MAX_SPLIT_GROUP * SPLIT_SLICE_BYTES)
    warps, per_sm = (16, 1) if hold else (8, SPLIT_PER_SM) if split else (16, 1)
    if max_row is None:
        chunk = (SPLIT_SLICE_BYTES if hold else SPLIT_CHUNK_BYTES if split else PERSISTENT_CHUNK_BYTES) // elem_size
    else:
        chunk = next_power_of_2(max_row)
    group = min(MAX_SPLIT_GROUP, cdiv(n_cols * elem_size, SPLIT_SLICE_BYTES)) if split else 1
    group = split_group(n_cols, chunk, group)[0]
    if group > 1 and not device.concurrent:
        if wide == "split":
            raise ValueError("the split plan waits on other programs: it cannot run under the interpreter")
        group = 1
    return made(mode, 1, chunk, warps, group, per_sm, _resident_regs(warps, per_sm, device))


def _held_default(n_cols: int, elem_size: int, device: Device, t: Tuning) -> bool:
    """Whether rows of ``n_cols`` are held whole: wider than ``MAX_ROW`` (16-bit rows of no multiple of 16 columns
    from ``held_ragged_16bit_from``) where ``held_per_sm`` programs an SM fit; fp32 rows of a multiple of 16 columns
    only in ``held_fp32_aligned``."""
    ragged_16 = elem_size < 4 and n_cols % 16 != 0 and 0 < t.held_ragged_16bit_from <= n_cols
    if n_cols <= MAX_ROW and not ragged_16:
        return False
    if _softmax_held.per_sm(n_cols, elem_size, device=device) < t.held_per_sm[elem_size >= 4]:
        return False
    if elem_size >= 4 and n_cols % 16 == 0:
        return any(lo <= n_cols <= hi for lo, hi in t.held_fp32_aligned)
    return True


def _held_split_group(n_cols: int, elem_size: int, device: Device, t: Tuning) -> int:
    """Slices a row is held in: rows wider than ``MAX_ROW`` of which fewer than ``held_per_sm`` programs an SM hold
    whole, in the fewest slices (up to ``MAX_SPLIT_GROUP``) of which ``SPLIT_PER_SM`` programs an SM fit; 0 where the
    row is not held in slices."""
    if n_cols <= MAX_ROW or _softmax_held.per_sm(n_cols, elem_size, device=device) >= t.held_per_sm[elem_size >= 4]:
        return 0
    for asked in range(2, MAX_SPLIT_GROUP + 1):
        group, slice_cols = _softmax_held.split_shape(n_cols, elem_size, asked)
        if group > 1 and _softmax_held.per_sm(slice_cols, elem_size, device=device) >= SPLIT_PER_SM:
            return group
    return 0


def _rows_tile(n_cols: int, elem_size: int, t: Tuning) -> int:
    """Elements a rows-plan program holds: ``ROWS_TILE`` (fp32: ``rows_tile_fp32``); ``masked_rows``' tile for 16-bit
    rows of a multiple of 8 columns whose power of two is its lanes, that share masked, held in one piece."""
    if t.masked_rows and elem_size == 2 and n_cols % 8 == 0:
        lanes, share, tile = t.masked_rows
        if next_power_of_2(n_cols) == lanes and n_cols <= (1 - share) * lanes and _row_pieces(n_cols, 1, elem_size, t)[1] == 0:
            return max(ROWS_TILE, tile)
    return t.rows_tile_fp32 if elem_size >= 4 else ROWS_TILE


def _staged_default(n_cols: int, elem_size: int, t: Tuning) -> bool:
    """Whether the staged plan is taken: rows in ``staged_cols``, 16-bit ones filling ``staged_lane_use_16bit`` of
    their power of two."""
    if n_cols < t.staged_cols[0]:
        return False
    return elem_size >= 4 or n_cols / next_power_of_2(n_cols) >= t.staged_lane_use_16bit


def _staged_plan(n_cols: int, elem_size: int, device: Device, t: Tuning, vec: int | None = None) -> Plan:
    """The staged plan: the rows kernel, one row a step on ``STAGED_ELEMS`` elements a thread (4 to 32 warps, the rows
    cap); 16-bit rows walked by a persistent program an SM with up to ``STAGED_STAGES - 1`` rows in flight in shared
    memory, fp32 rows one program a row. ``vec``: the launch's (default: that of a contiguous tensor)."""
    if vec is None:
        vec = 1 if ragged_width(n_cols, elem_size) == n_cols else max(1, 16 // elem_size)
    pieces = _row_pieces(n_cols, vec, elem_size, t, max_pieces=1)
    lanes = sum(pieces)
    warps = max(4, min(32, next_power_of_2(cdiv(lanes, 32 * STAGED_ELEMS))))
    row_bytes = lanes * elem_size
    smem = device.smem_per_block - STAGED_SMEM_SPARE
    stages = max(1, min(STAGED_STAGES, 1 + smem // row_bytes)) if elem_size < 4 else 0
    regs = _resident_regs(16, 2, device)
    by_regs = device.regs_per_sm // (warps * 32 * regs)
    by_smem = smem // ((stages - 1) * row_bytes) if stages > 1 else by_regs
    return Plan("staged", 1, pieces[0], warps, per_sm=max(1, min(by_regs, by_smem)), max_regs=regs, stages=stages,
                pieces=pieces, device=device, tuning=t)


def _resident_regs(warps: int, per_sm: int, device: Device) -> int:
    """The register cap at which ``per_sm`` programs of ``warps`` warps fit an SM's registers at once (in Triton's
    steps of 8), or 0 when one program an SM needs no cap."""
    if per_sm <= 1:
        return 0
    return min(MAX_REGS, device.regs_per_sm // (warps * 32 * per_sm) // 8 * 8)


def _auto_wide_plan(n_cols: int, elem_size: int, t: Tuning) -> str:
    """"persistent" for 16-bit rows within ``persistent``'s bytes that fill its chunks that much, else "split"."""
    if t.persistent is None or elem_size >= 4 or n_cols * elem_size > t.persistent[0]:
        return "split"
    chunk = PERSISTENT_CHUNK_BYTES // elem_size
    width = ragged_width(n_cols, elem_size)
    return "persistent" if width / (cdiv(width, chunk) * chunk) >= t.persistent[1] else "split"


# --------------------------------------------------------------------------- launchers


def _launch(x2: torch.Tensor, y2: torch.Tensor, p: Plan) -> None:
    n_rows, n_cols = x2.shape
    es, t = x2.element_size(), p.tuning
    if p.mode == "held":
        if _softmax_held.split_fits(x2, y2, p.group):
            try:
                _softmax_held.launch_split(x2, y2, p.group, p.device.sms)
                return
            except _softmax_held.CompilationError as exc:  # a Triton whose Gluon moved on: warn once, then without it
                _softmax_held.disable(exc)
        # rows not packed (a column slice) or not 16-byte aligned: the plan without it
        return _launch(x2, y2, plan(n_rows, n_cols, es, p.device, tuning=t, held=False))
    if p.mode == "staged":
        r = phased(x2, y2)
        if launch_width(n_cols, r.vec) > t.staged_cols[1]:  # an aligned width at an odd offset, too wide
            r.finish()
            return _launch(x2, y2, plan(n_rows, n_cols, es, p.device, tuning=t, max_row=MAX_ROW))
        p = _staged_plan(n_cols, es, p.device, t, r.vec)
        grid = max(1, min(n_rows, p.device.sms * p.per_sm)) if p.stages else n_rows
        launch_kernel(_softmax_fwd_kernel, (grid,),
            r.x, r.y, r.phase, n_rows, n_cols, r.stride_x, r.stride_y,
            BLOCK_M=1, BLOCK_N=p.pieces[0], BLOCK_T=p.pieces[1], BLOCK_U=p.pieces[2], VEC=r.vec, NARROW=0,
            FAST_EXP=not interpreting(), STAGES=p.stages, EDGE_WORDS=True,
            SHIFT=r.vec == 1 and _shift(n_cols, es, t), num_warps=p.num_warps,
            **_reg_cap(p),
        )
        r.finish()
        return
    r = Phased.plain(x2, y2)  # Triton's own (scalar, for unaligned rows) accesses
    if p.mode != "rows" or (_phase_rows(n_cols, es, t) and not _packed_band(r, n_cols, t)):
        r = phased(x2, y2)
    if p.mode == "rows":
        block_n = max(p.block_n, next_power_of_2(n_cols))
        pieces = _row_pieces(n_cols, r.vec, es, t) if block_n == next_power_of_2(n_cols) else (block_n, 0, 0)
        warps = p.num_warps if pieces[1] == 0 else _piece_warps(p.block_m * sum(pieces))
        p = dataclasses.replace(p, max_regs=_rows_regs(pieces, r.vec, es, p.max_regs, t))
        launch_kernel(_softmax_fwd_kernel, (cdiv(n_rows, p.block_m),),
            r.x, r.y, r.phase, n_rows, n_cols, r.stride_x, r.stride_y,
            BLOCK_M=p.block_m, BLOCK_N=pieces[0], BLOCK_T=pieces[1], BLOCK_U=pieces[2], VEC=r.vec,
            NARROW=_narrow(r, n_cols), FAST_EXP=not interpreting(),
            EDGE_WORDS=_edge_words(n_cols, es, t), SHIFT=_shift(n_cols, es, t), num_warps=warps,
            **_reg_cap(p),
        )
    else:
        _launch_split(r, n_rows, n_cols, p)
    r.finish()


def _row_pieces(n_cols: int, vec: int, elem_size: int, t: Tuning, max_pieces: int = 2) -> tuple[int, int, int]:
    """(BLOCK_N, BLOCK_T, BLOCK_U) of the rows kernel (``_ragged.row_pieces``).

    The pieces cover every whole vector a row can hold; the edges take the rest (``_softmax_fwd_kernel``): N virtual
    columns for aligned rows, the vectors up to N + VEC - 1 for unaligned ones. A row keeps its own power of two unless
    that leaves at least ``_piece_waste`` of its lanes masked (each piece adds two row reductions).
    """
    need = (n_cols + vec - 1) // vec * vec if vec > 1 else n_cols
    single = next_power_of_2(need)
    if n_cols < PIECES_MIN_COLS or (single - need) < _piece_waste(need, elem_size, vec, t) * single:
        max_pieces = 1
    return row_pieces(need, vec, max_pieces, PIECE_SLACK)


def _piece_waste(need: int, elem_size: int, vec: int, t: Tuning) -> float:
    """Share of masked lanes from which a row is held in pieces (``Tuning.piece_waste``): rows under 4096 lanes;
    wider 16-bit rows; wider fp32 rows, unaligned (``vec`` > 1) or aligned."""
    narrow, wide_16, ragged_32, aligned_32 = t.piece_waste
    if need < 4096:
        return narrow
    if elem_size < 4:
        return wide_16
    return aligned_32 if vec == 1 else ragged_32


def _piece_warps(lanes: int) -> int:
    """Warps of a rows program holding ``lanes`` in pieces: 32 elements a thread over the largest power of two under
    ``lanes``, ``PIECE_MIN_WARPS`` to 16 (4096 + 8 on 4 warps, not the 8 of an 8192 tile)."""
    return max(PIECE_MIN_WARPS, min(16, (1 << (lanes.bit_length() - 1)) // (32 * ELEMS_PER_THREAD)))


def _shift(n_cols: int, elem_size: int, t: Tuning) -> bool:
    """Whether 16-bit rows of ``n_cols`` take the rows kernel's one-reduction path (``Tuning.shift_16bit``)."""
    return elem_size == 2 and any(lo <= n_cols <= hi for lo, hi in t.shift_16bit)


def _narrow(r: Phased, n_cols: int) -> int:
    """``NARROW`` of the rows kernel: N for packed rows on Triton's own accesses that are not a multiple of 16
    elements and at most ``PACKED_N_MAX`` wide (``Phased.packed_width``); else 0.

    A runtime stride that is not a multiple of 16 tells Triton nothing of alignment, so each element was a scalar load
    (bf16 8 columns: 41% of copy, ncu); a compile-time stride lets a row load as vectors as wide as the largest power
    of two dividing N (a row of 1, 2, 4 or 8: one vector). Strides that are multiples of 16 Triton already knows, so
    those rows keep a runtime N (no compile a width).
    """
    return r.packed_width(n_cols, PACKED_N_MAX)


def _in(band: tuple | None, n: int) -> bool:
    return band is not None and band[0] <= n <= band[1]


def _phase_rows(n_cols: int, elem_size: int, t: Tuning) -> bool:
    """Whether the rows plan reads unaligned rows as aligned vectors (``_ragged``): from ``PHASED_ROWS_MIN_COLS``, and
    in ``Tuning.narrow_phased`` and ``odd_16bit``."""
    return n_cols >= PHASED_ROWS_MIN_COLS or _in(t.narrow_phased, n_cols) or _odd_16bit(n_cols, elem_size, t)


def _odd_16bit(n_cols: int, elem_size: int, t: Tuning) -> bool:
    return elem_size == 2 and n_cols % 2 == 1 and _in(t.odd_16bit, n_cols)


def _edge_words(n_cols: int, elem_size: int, t: Tuning) -> bool:
    """Whether the rows plan loads a phased row's edges as 32-bit words: from ``PHASED_ROWS_MIN_COLS``, and in
    ``Tuning.odd_16bit``."""
    return n_cols >= PHASED_ROWS_MIN_COLS or _odd_16bit(n_cols, elem_size, t)


def _packed_band(r: Phased, n_cols: int, t: Tuning) -> bool:
    """Whether rows in ``Tuning.narrow_phased`` keep Triton's own accesses at a compile-time width (``_narrow``)
    instead of aligned vectors: packed rows whose N is a multiple of ``narrow_packed_multiple``."""
    m = t.narrow_packed_multiple
    return m > 0 and n_cols % m == 0 and r.packed_width(n_cols, PACKED_N_MAX) > 0


def _launch_split(r: Phased, n_rows: int, n_cols: int, p: Plan) -> None:
    group, slice_cols = split_group(launch_width(n_cols, r.vec), p.block_n, p.group)
    # 16-bit aligned rows of the split plan whose slices take several steps sum exp(x - the row's first element)
    shift = (p.tuning.split_shift_16bit and r.x.element_size() == 2 and p.mode == "split" and slice_cols != p.block_n
             and r.vec == 1)
    split_run(
        _softmax_split_kernel,
        lambda part, sync, n_programs: (
            r.x, r.y, part, sync, r.phase, n_rows, n_cols, r.stride_x, r.stride_y, slice_cols, n_programs),
        n_rows, group, p.per_sm, r.x.device, r.x,
        GROUP=group, BLOCK_N=p.block_n, BLOCK_G=next_power_of_2(group), FAST_EXP=not interpreting(),
        SUB=max(1, min(p.block_n, 16 // r.x.element_size())), HOLD=slice_cols == p.block_n,
        EARLY=group == 1 and slice_cols == p.block_n, VEC=r.vec, SHIFT=shift, num_warps=p.num_warps,
        planes=2 if shift else 1, **_reg_cap(p),
    )


def _rows_regs(pieces: tuple[int, int, int], vec: int, elem_size: int, cap: int, t: Tuning) -> int:
    """The rows plan's register cap for a row held as ``pieces``: ``Tuning.tail_regs_16bit`` for aligned 16-bit rows
    of 8192 lanes and a second piece in its band, else ``cap``."""
    if t.tail_regs_16bit is None or elem_size != 2 or vec != 1:
        return cap
    least, most, regs = t.tail_regs_16bit
    return regs if pieces[0] == 8192 and least <= pieces[1] <= most and pieces[2] == 0 else cap


def _reg_cap(p: Plan) -> dict:
    """Launch options capping registers (``Plan.max_regs``); none under the interpreter."""
    return {"maxnreg": p.max_regs} if p.max_regs and not interpreting() else {}


# --------------------------------------------------------------------------- public functions


CALLS = Calls("softmax.fused")  # each problem's first call recorded, replayed after (_launch.py)


def fused(x: torch.Tensor, *, out: torch.Tensor | None = None, max_row: int | None = None) -> torch.Tensor:
    """Softmax of ``x`` over its last dimension by the fused kernel (plans: the module docstring).

    ``x``: float32, float16 or bfloat16, at least one dimension, any strides (a last
    dimension that is not contiguous, or leading dims that do not flatten to one, cost a
    copy). Returns a contiguous tensor of ``x``'s shape and dtype, written into ``out``
    when given (contiguous, same shape, dtype and device). ``max_row`` overrides the
    launch plan (``plan``), for tests.
    """
    return CALLS((max_row,), (x, out), lambda: _fused(x, out, max_row))


def _fused(x: torch.Tensor, out: torch.Tensor | None, max_row: int | None) -> torch.Tensor:
    check_tensor(x, "x", min_ndim=1)
    y = output_like(x, out)
    if x.numel() == 0:
        return y
    x2 = as_rows(x)
    y2 = y if x.dim() == 2 else y.view(-1, x.shape[-1])
    _launch(x2, y2, plan(x2.shape[0], x2.shape[1], x.element_size(), _device.of(x.device), max_row=max_row))
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
