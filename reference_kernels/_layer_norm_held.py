"""Layer-norm rows held in shared memory: the "held" plans of the forward and the backward (docs/kernels.md, "Rows held
in shared memory"; "layer_norm: backward").

A persistent program copies each row into shared memory (``_held``: ``cp.async`` from the row's aligned-down start),
takes its statistics (16-bit rows: the sums of x - x[row, 0] and of its square in one pass; fp32: the mean, then the
centred variance) and its output from there, and copies the next row into each segment the output pass leaves. The
weight and bias are what a ragged row makes hard: a row that starts ``shift`` elements past a 16-byte boundary needs
column c of the weight at slot c + shift, off the weight's own vector grid. The grid's size is a multiple of the
vector, so every row of a program starts at the same phase (row r's phase is r N mod VEC), and each program copies the
weight and bias once into shared memory at its phase; its rows then read them as aligned vectors.

Rows too wide to hold with their weight and bias are streamed past the held weight and bias (``launch_stream``): one
program an SM holds each row in registers as loaded, from the same aligned-down start, and loads the next row behind
its output pass (docs/kernels.md, "Rows streamed past the held weight").

The backward holds x and dy the same way (two rows at once where they fit, ``bwd_shape``), with the weight at the
program's phase and the program's float32 dweight/dbias shares in registers (rows of up to eight segments,
``Shapes.bwd_reg_shares``) or in shared memory too: one phase a program keeps its shares in its own slots, written out
once at the end, shifted to the real columns, and summed as every backward plan's shares are
(``layer_norm._sum_shares``).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import torch

from . import _device
from ._common import RESIDENT_WARPS, THREAD_MAX_REGS, float32_pair, reg_cap
from ._held import (BLOCK, MAX_REGS, SM90, SMEM_PER_BLOCK, SMEM_PER_SM, SMEM_RESERVED, WARPS,  # noqa: F401
                    CompilationError, async_copy, available, copy_segment, disable, edge_columns, gl, gluon,
                    land_segment, only_the_row, packed_rows, per_sm, phase0, phase_grid, row_span, row_start,
                    segment_block, segments, tuned_triton, widen)
from ._launch import launch as launch_kernel

if gluon is not None:
    from ._held import _async_load

    @gluon.jit
    def _layer_norm_fwd_held_kernel(
        x_ptr,  # input, rows packed (stride N), 16-byte aligned at row 0
        w_ptr,  # weight (N,), any float dtype
        b_ptr,  # bias (N,)
        y_ptr,  # output, x's layout
        mean_ptr,  # (M,) float32
        rstd_ptr,  # (M,) float32
        n_rows,
        n_cols,
        eps,
        BLOCK: gl.constexpr,  # elements a segment
        NSEG: gl.constexpr,  # segments a row (_held.segments)
        VEC: gl.constexpr,  # x's elements in 16 bytes; the grid is a multiple of it
        JOINT: gl.constexpr,  # mean and variance from one pass: sums of x - x[row, 0] and of its square (fwd_joint)
        WIDEN: gl.constexpr,  # bf16 widened by a shift or an AND an element (_held.widen)
        num_warps: gl.constexpr,
    ):
        """A program's rows (all at one phase): a persistent walk, rows pid, pid + programs, ... ; three passes over
        shared memory: the sum as each segment lands (the neighbours' elements of the first and the last two
        segments, the only ones a row's ends fall in, become 0 there), the centred sum of squares, and the output
        with the weight and bias held at the program's phase. JOINT: two passes, the sums of d = x - x[row, 0] and of
        d^2 as each segment lands (one reduction of the pair), then the output; the row's first element is loaded a
        row ahead. The output's partial vectors at the row's two ends are stored element by element (the edges)."""
        layout: gl.constexpr = gl.BlockedLayout([VEC], [32], [num_warps], [0])
        edge_layout: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
        flat: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
        buf = gl.allocate_shared_memory(x_ptr.dtype.element_ty, [NSEG, BLOCK], flat)
        wbuf = gl.allocate_shared_memory(w_ptr.dtype.element_ty, [NSEG, BLOCK], flat)
        bbuf = gl.allocate_shared_memory(b_ptr.dtype.element_ty, [NSEG, BLOCK], flat)
        idx = gl.arange(0, BLOCK, layout=layout)
        eidx = gl.arange(0, 2 * VEC, layout=edge_layout)
        pid = gl.program_id(0)
        first = pid
        step = gl.num_programs(0)  # a multiple of VEC

        abase, shift = row_start(first, n_cols, VEC)  # the shift is the same for every row of this program
        end, first_v, last_v = row_span(shift, n_cols, VEC)
        n_vecs = gl.where(first < n_rows, gl.cdiv(end, VEC), 0)
        for s in gl.static_range(NSEG):
            copy_segment(buf, x_ptr, abase, s, n_vecs, idx, BLOCK, VEC)
        _weights_at_phase(wbuf, bbuf, w_ptr, b_ptr, idx, shift, n_cols, BLOCK, NSEG)
        ecol, emask = edge_columns(eidx, shift, end, VEC)
        ew = gl.load(w_ptr + (ecol - shift), mask=emask, other=0.0).to(gl.float32)
        eb = gl.load(b_ptr + (ecol - shift), mask=emask, other=0.0).to(gl.float32)
        pivot_n = gl.load(x_ptr + gl.minimum(first, n_rows - 1).to(gl.int64) * n_cols)  # JOINT: the row's x[row, 0]
        for row in range(first, n_rows, step):
            ev = gl.load(x_ptr + abase + ecol, mask=emask, other=0.0).to(gl.float32)
            nxt = row + step
            if JOINT:
                pivot = pivot_n.to(gl.float32)
                pivot_n = gl.load(x_ptr + gl.minimum(nxt, n_rows - 1).to(gl.int64) * n_cols)
                acc = gl.zeros([BLOCK], gl.float32, layout)
                acc2 = gl.zeros([BLOCK], gl.float32, layout)
                for s in gl.static_range(NSEG):
                    async_copy.wait_group(NSEG - 1 - s)
                    d = only_the_row(widen(buf.index(s).load(layout), WIDEN) - pivot, s, idx, shift, end, 0.0, BLOCK,
                                     NSEG)
                    acc += d
                    acc2 += d * d
                mean, var = _joint_stats(acc, acc2, pivot, n_cols)
            else:
                acc = gl.zeros([BLOCK], gl.float32, layout)
                for s in gl.static_range(NSEG):
                    acc += land_segment(buf, s, idx, shift, end, 0.0, layout, BLOCK, NSEG)  # neighbours' elements 0
                mean = gl.sum(acc, axis=0) / n_cols
                acc = gl.zeros([BLOCK], gl.float32, layout)
                for s in gl.static_range(NSEG):
                    d = only_the_row(buf.index(s).load(layout).to(gl.float32) - mean, s, idx, shift, end, 0.0, BLOCK,
                                     NSEG)
                    acc += d * d
                var = gl.sum(acc, axis=0) / n_cols
            rstd = 1.0 / gl.sqrt(var + eps)
            gl.store(mean_ptr + row, mean)
            gl.store(rstd_ptr + row, rstd)

            nabase = nxt.to(gl.int64) * n_cols // VEC * VEC  # the same shift: the step is a multiple of VEC
            nv = gl.where(nxt < n_rows, gl.cdiv(end, VEC), 0)
            for u in range(NSEG):
                v = widen(buf.index(u).load(layout), WIDEN)
                w = widen(wbuf.index(u).load(layout), WIDEN)
                b = widen(bbuf.index(u).load(layout), WIDEN)
                y = ((v - mean) * rstd * w + b).to(y_ptr.dtype.element_ty)
                vi = (u * BLOCK + idx) // VEC
                gl.store(y_ptr + abase + u * BLOCK + idx, y, mask=(vi >= first_v) & (vi < last_v))
                copy_segment(buf, x_ptr, nabase, u, nv, idx, BLOCK, VEC)
            ey = (ev - mean) * rstd * ew + eb
            gl.store(y_ptr + abase + ecol, ey.to(y_ptr.dtype.element_ty), mask=emask)
            abase = nabase
        async_copy.wait_group(0)

    @gluon.jit
    def _widen_held(v, WIDEN: gl.constexpr):
        # _held.widen, and with WIDEN fp16 pairs converted by inline PTX as well: the compiler's own conversion of an
        # fp16 row held in registers spilled (sm_90, Triton 3.6: 144 bytes a thread at 37409 columns, none this way)
        if WIDEN and v.dtype == gl.float16:
            return gl.inline_asm_elementwise("{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $2; cvt.f32.f16 $0, lo;"
                                             " cvt.f32.f16 $1, hi; }", "=r,=r,r", [v.to(gl.uint16, bitcast=True)],
                                             dtype=gl.float32, is_pure=True, pack=2)
        return widen(v, WIDEN)

    @gluon.jit
    def _load_segment(x_ptr, base, s: gl.constexpr, n_vecs, idx, BLOCK: gl.constexpr, VEC: gl.constexpr):
        # segment s of a row into registers: its 16-byte vectors from the row's aligned-down start (none past n_vecs)
        col = s * BLOCK + idx
        return gl.load(x_ptr + base + col, mask=col // VEC < n_vecs, other=0.0)

    @gluon.jit
    def _layer_norm_fwd_stream_kernel(
        x_ptr,  # input, rows packed (stride N), 16-byte aligned at row 0
        w_ptr,  # weight (N,), any float dtype
        b_ptr,  # bias (N,)
        y_ptr,  # output, x's layout
        mean_ptr,  # (M,) float32
        rstd_ptr,  # (M,) float32
        n_rows,
        n_cols,
        eps,
        BLOCK: gl.constexpr,  # elements a segment
        NSEG: gl.constexpr,  # segments a row (_held.segments)
        VEC: gl.constexpr,  # x's elements in 16 bytes; the grid is a multiple of it
        WIDEN: gl.constexpr,  # bf16 widened by a shift or an AND an element, fp16 by inline PTX (_widen_held)
        num_warps: gl.constexpr,
        RECENTRE: gl.constexpr = 0.0,  # > 0: rows whose (mean - x[row, 0])^2 > RECENTRE var redo var centred
    ):
        """Rows too wide to hold in shared memory, with the weight and bias held there: rows pid, pid + programs, ...
        (all at one phase), each row held in registers as loaded (16-byte vectors from its aligned-down start, a tuple
        of NSEG segments), the next row's segments loaded as the output pass leaves each of this row's. Pass one: the
        sums of d = x - x[row, 0] and of d^2 (and with RECENTRE, where x[row, 0] lay far from the mean, the sum of
        (x - mean)^2 over the held segments); pass two: the output, with the weight and bias at the program's phase.
        The row's partial vectors at its two ends are stored element by element (the edges)."""
        layout: gl.constexpr = gl.BlockedLayout([VEC], [32], [num_warps], [0])
        edge_layout: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
        flat: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
        wbuf = gl.allocate_shared_memory(w_ptr.dtype.element_ty, [NSEG, BLOCK], flat)
        bbuf = gl.allocate_shared_memory(b_ptr.dtype.element_ty, [NSEG, BLOCK], flat)
        idx = gl.arange(0, BLOCK, layout=layout)
        eidx = gl.arange(0, 2 * VEC, layout=edge_layout)
        pid = gl.program_id(0)
        step = gl.num_programs(0)  # a multiple of VEC

        abase, shift = row_start(pid, n_cols, VEC)  # the shift is the same for every row of this program
        end, first_v, last_v = row_span(shift, n_cols, VEC)
        row_vecs = gl.cdiv(end, VEC)
        n_vecs = gl.where(pid < n_rows, row_vecs, 0)
        xs = ()
        for s in gl.static_range(NSEG):
            xs = xs + (_load_segment(x_ptr, abase, s, n_vecs, idx, BLOCK, VEC),)
        _weights_at_phase(wbuf, bbuf, w_ptr, b_ptr, idx, shift, n_cols, BLOCK, NSEG)
        ecol, emask = edge_columns(eidx, shift, end, VEC)
        ew = gl.load(w_ptr + (ecol - shift), mask=emask, other=0.0).to(gl.float32)
        eb = gl.load(b_ptr + (ecol - shift), mask=emask, other=0.0).to(gl.float32)
        pivot_n = gl.load(x_ptr + gl.minimum(pid, n_rows - 1).to(gl.int64) * n_cols)  # the row's x[row, 0]
        ev_n = gl.load(x_ptr + abase + ecol, mask=emask & (pid < n_rows), other=0.0)
        for row in range(pid, n_rows, step):
            ev = ev_n.to(gl.float32)
            nxt = row + step
            nabase = nxt.to(gl.int64) * n_cols // VEC * VEC  # the same shift: the step is a multiple of VEC
            nn_vecs = gl.where(nxt < n_rows, row_vecs, 0)
            pivot = pivot_n.to(gl.float32)
            pivot_n = gl.load(x_ptr + gl.minimum(nxt, n_rows - 1).to(gl.int64) * n_cols)
            ev_n = gl.load(x_ptr + nabase + ecol, mask=emask & (nxt < n_rows), other=0.0)
            acc = gl.zeros([BLOCK], gl.float32, layout)
            acc2 = gl.zeros([BLOCK], gl.float32, layout)
            for s in gl.static_range(NSEG):
                d = only_the_row(_widen_held(xs[s], WIDEN) - pivot, s, idx, shift, end, 0.0, BLOCK, NSEG)
                acc += d
                acc2 += d * d
            mean, var = _joint_stats(acc, acc2, pivot, n_cols)
            if RECENTRE > 0:
                if (mean - pivot) * (mean - pivot) > RECENTRE * var:  # docs/kernels.md, "Statistics"
                    acc = gl.zeros([BLOCK], gl.float32, layout)
                    for s in gl.static_range(NSEG):
                        d = only_the_row(_widen_held(xs[s], WIDEN) - mean, s, idx, shift, end, 0.0, BLOCK, NSEG)
                        acc += d * d
                    var = gl.sum(acc, axis=0) / n_cols
            rstd = 1.0 / gl.sqrt(var + eps)
            gl.store(mean_ptr + row, mean)
            gl.store(rstd_ptr + row, rstd)
            nxs = ()
            for u in gl.static_range(NSEG):  # (all of them at the pass's start spilled: 448 bytes a thread at 50257)
                v = _widen_held(xs[u], WIDEN)
                nxs = nxs + (_load_segment(x_ptr, nabase, u, nn_vecs, idx, BLOCK, VEC),)
                w = _widen_held(wbuf.index(u).load(layout), WIDEN)
                b = _widen_held(bbuf.index(u).load(layout), WIDEN)
                y = ((v - mean) * rstd * w + b).to(y_ptr.dtype.element_ty)
                vi = (u * BLOCK + idx) // VEC
                gl.store(y_ptr + abase + u * BLOCK + idx, y, mask=(vi >= first_v) & (vi < last_v))
            ey = (ev - mean) * rstd * ew + eb
            gl.store(y_ptr + abase + ecol, ey.to(y_ptr.dtype.element_ty), mask=emask)
            abase = nabase
            xs = nxs

    @gluon.jit
    def _add_pairs(a1, a2, b1, b2):
        return a1 + b1, a2 + b2

    @gluon.jit
    def _weights_at_phase(wbuf, bbuf, w_ptr, b_ptr, idx, shift, n_cols, BLOCK: gl.constexpr, NSEG: gl.constexpr):
        # the forward's weight and bias at the program's phase: slot j holds column j - shift (once, by plain loads)
        for t in range(NSEG):
            c = t * BLOCK + idx - shift
            ok = (c >= 0) & (c < n_cols)
            wbuf.index(t).store(gl.load(w_ptr + c, mask=ok, other=0.0))
            bbuf.index(t).store(gl.load(b_ptr + c, mask=ok, other=0.0))

    @gluon.jit
    def _joint_stats(acc, acc2, pivot, n_cols):
        # (mean, variance) of a row from the lanes' sums of d = x - pivot and of d^2, in one reduction of the pair
        s1, s2 = gl.reduce((acc, acc2), 0, _add_pairs)
        mean_d = s1 / n_cols
        var = s2 / n_cols - mean_d * mean_d
        var = gl.where(var < 0.0, 0.0, var)  # rounding; not a maximum, which would drop a nan
        return pivot + mean_d, var

    @gluon.jit
    def _copy_pair(xbuf, dybuf, x_ptr, dy_ptr, abase, slot, s0, n_vecs, idx, BLOCK: gl.constexpr, VEC: gl.constexpr,
                   COUNT: gl.constexpr):
        # segments s0 .. s0 + COUNT - 1 of a row of x and of dy (laid out alike) into segments slot + s0 .. of their
        # buffers: one commit group (a whole row into its ring slot, or one segment)
        for k in gl.static_range(COUNT):
            col = (s0 + k) * BLOCK + idx
            ok = col // VEC < n_vecs
            _async_load(xbuf.index(slot + s0 + k), x_ptr + abase + col, mask=ok)
            _async_load(dybuf.index(slot + s0 + k), dy_ptr + abase + col, mask=ok)
        async_copy.commit_group()

    @gluon.jit
    def _bwd_dx(xhat, dyv, wv, rstd, c1, c2):
        # dx from x-hat, dy, the weight and the row's two sums over N (c1: of x-hat w dy, c2: of w dy)
        return (wv * dyv - (xhat * c1 + c2)) * rstd

    @gluon.jit
    def _bwd_dx_segment(xbuf, dybuf, wbuf, dx_ptr, abase, slot, u, idx, mean, rstd, c1, c2, first_v, last_v,
                        layout: gl.constexpr, BLOCK: gl.constexpr, VEC: gl.constexpr, WIDEN: gl.constexpr):
        # pass two on segment u of the row in ring slot ``slot``: dx stored (its whole vectors; the edges apart), and
        # (dy, x-hat) returned for the shares
        xhat = (widen(xbuf.index(slot + u).load(layout), WIDEN) - mean) * rstd
        dyv = widen(dybuf.index(slot + u).load(layout), WIDEN)
        wv = widen(wbuf.index(u).load(layout), WIDEN)
        vi = (u * BLOCK + idx) // VEC
        gl.store(dx_ptr + abase + u * BLOCK + idx, _bwd_dx(xhat, dyv, wv, rstd, c1, c2).to(dx_ptr.dtype.element_ty),
                 mask=(vi >= first_v) & (vi < last_v))
        return dyv, xhat

    @gluon.jit
    def _bwd_row_ahead(mean_ptr, rstd_ptr, x_ptr, dy_ptr, abase, row, n_rows, ecol, emask):
        # a row's statistics and edge elements, loaded a row ahead: global loads waited on at the row's start would put
        # their latency on every row (past the last row: row n_rows - 1's statistics and no edges)
        r = gl.minimum(row, n_rows - 1)
        ok = emask & (row < n_rows)
        return (gl.load(mean_ptr + r), gl.load(rstd_ptr + r), gl.load(x_ptr + abase + ecol, mask=ok, other=0.0),
                gl.load(dy_ptr + abase + ecol, mask=ok, other=0.0))

    @gluon.jit
    def _bwd_store_shares(dw_part_ptr, db_part_ptr, share, dw, db, t, idx, shift, end, BLOCK: gl.constexpr):
        # segment t of a program's dweight/dbias shares, at the real columns (the neighbours' slots never go out)
        c = t * BLOCK + idx
        ok = (c >= shift) & (c < end)
        gl.store(dw_part_ptr + share + c, dw, mask=ok)
        gl.store(db_part_ptr + share + c, db, mask=ok)

    @gluon.jit
    def _layer_norm_bwd_held_kernel(
        x_ptr,  # forward input, rows packed (stride N), 16-byte aligned at row 0
        dy_ptr,  # gradient of y, x's layout and dtype
        w_ptr,  # weight (N,), any float dtype
        mean_ptr,  # (M,) float32 from the forward
        rstd_ptr,  # (M,) float32 from the forward
        dx_ptr,  # gradient of x, x's layout and dtype
        dw_part_ptr,  # (programs, N) float32: each program's share of dweight
        db_part_ptr,  # (programs, N) float32: each program's share of dbias
        n_rows,
        n_cols,
        BLOCK: gl.constexpr,  # elements a segment (VEC x 32 x num_warps, twice that for fp32)
        NSEG: gl.constexpr,  # segments a row (_held.segments)
        VEC: gl.constexpr,  # x's elements in 16 bytes; the grid is a multiple of it
        RING: gl.constexpr,  # rows held at once: 1, the next row copied segment by segment as pass two leaves each;
        # R > 1, a ring of R rows, R - 1 of them in flight (each a copy of its own) while one is reduced
        PAIRED: gl.constexpr,  # the row's two sums in one block reduction of the pair (paired)
        REG_SHARES: gl.constexpr,  # the dweight/dbias shares in registers, a tensor a segment (Shapes.bwd_reg_shares)
        WIDEN: gl.constexpr,  # bf16 widened by a shift or an AND an element (_held.widen; bwd_widen)
        num_warps: gl.constexpr,
    ):
        """Rows pid, pid + programs, ... (all at one phase), x and dy held in shared memory. Pass one: the row's two
        sums (x-hat . w dy and the sum of w dy), their terms masked in the first and the last two segments (the only
        ones a row's ends fall in). Pass two: dx, and the program's dweight/dbias shares (float32 in shared memory, in
        the program's slots; the neighbours' slots gather what is never written out). The shares go out once, at the
        program's end, shifted to the real columns; the partial vectors at the row's ends are stored element by
        element (the edges). With REG_SHARES the shares are held in registers instead, a tensor a segment (pass two
        unrolled), which frees their shared memory for more programs an SM and drops their read-modify-write."""
        layout: gl.constexpr = gl.BlockedLayout([VEC], [32], [num_warps], [0])
        edge_layout: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
        flat: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
        xbuf = gl.allocate_shared_memory(x_ptr.dtype.element_ty, [RING * NSEG, BLOCK], flat)
        dybuf = gl.allocate_shared_memory(x_ptr.dtype.element_ty, [RING * NSEG, BLOCK], flat)
        wbuf = gl.allocate_shared_memory(w_ptr.dtype.element_ty, [NSEG, BLOCK], flat)
        if not REG_SHARES:
            dwbuf = gl.allocate_shared_memory(gl.float32, [NSEG, BLOCK], flat)
            dbbuf = gl.allocate_shared_memory(gl.float32, [NSEG, BLOCK], flat)
        idx = gl.arange(0, BLOCK, layout=layout)
        eidx = gl.arange(0, 2 * VEC, layout=edge_layout)
        pid = gl.program_id(0)
        n_progs = gl.num_programs(0)

        abase, shift = row_start(pid, n_cols, VEC)  # the shift is the same for every row of this program
        end, first_v, last_v = row_span(shift, n_cols, VEC)
        row_vecs = gl.cdiv(end, VEC)
        if RING == 1:
            for s in gl.static_range(NSEG):
                _copy_pair(xbuf, dybuf, x_ptr, dy_ptr, abase, 0, s, gl.where(pid < n_rows, row_vecs, 0), idx, BLOCK,
                           VEC, 1)
        else:
            for k in gl.static_range(RING - 1):
                r = pid + k * n_progs
                _copy_pair(xbuf, dybuf, x_ptr, dy_ptr, r.to(gl.int64) * n_cols // VEC * VEC, k * NSEG, 0,
                           gl.where(r < n_rows, row_vecs, 0), idx, BLOCK, VEC, NSEG)
        zero = gl.zeros([BLOCK], gl.float32, layout)
        for t in range(NSEG):  # the weight at this program's phase (slot j: column j - shift), zero shares
            c = t * BLOCK + idx - shift
            wbuf.index(t).store(gl.load(w_ptr + c, mask=(c >= 0) & (c < n_cols), other=0.0))
            if not REG_SHARES:
                dwbuf.index(t).store(zero)
                dbbuf.index(t).store(zero)
        dws = ()
        dbs = ()
        if REG_SHARES:
            for t in gl.static_range(NSEG):
                dws = dws + (zero,)
                dbs = dbs + (zero,)
        ecol, emask = edge_columns(eidx, shift, end, VEC)
        ew = gl.load(w_ptr + (ecol - shift), mask=emask, other=0.0).to(gl.float32)
        mean_n, rstd_n, ex_n, edy_n = _bwd_row_ahead(mean_ptr, rstd_ptr, x_ptr, dy_ptr, abase, pid, n_rows, ecol, emask)
        it = 0
        for row in range(pid, n_rows, n_progs):
            slot = 0
            if RING > 1:  # the row RING - 1 ahead into the slot the last row left, then wait for this row's
                slot = it % RING * NSEG
                ahead = row + (RING - 1) * n_progs
                _copy_pair(xbuf, dybuf, x_ptr, dy_ptr, ahead.to(gl.int64) * n_cols // VEC * VEC,
                           (it + RING - 1) % RING * NSEG, 0, gl.where(ahead < n_rows, row_vecs, 0), idx, BLOCK, VEC,
                           NSEG)
                async_copy.wait_group(RING - 1)
            it += 1
            mean = mean_n
            rstd = rstd_n
            ex = ex_n.to(gl.float32)
            edy = edy_n.to(gl.float32)
            nabase = (row + n_progs).to(gl.int64) * n_cols // VEC * VEC  # the same shift: programs are VEC apart
            mean_n, rstd_n, ex_n, edy_n = _bwd_row_ahead(mean_ptr, rstd_ptr, x_ptr, dy_ptr, nabase, row + n_progs, n_rows,
                                                         ecol, emask)
            a1 = gl.zeros([BLOCK], gl.float32, layout)
            a2 = gl.zeros([BLOCK], gl.float32, layout)
            for s in gl.static_range(NSEG):
                if RING == 1:
                    async_copy.wait_group(NSEG - 1 - s)
                xhat = (widen(xbuf.index(slot + s).load(layout), WIDEN) - mean) * rstd
                wdy = widen(wbuf.index(s).load(layout), WIDEN) * widen(dybuf.index(slot + s).load(layout), WIDEN)
                term = xhat * wdy
                if (s == 0) | (s >= NSEG - 2):  # a neighbour's x or dy may be anything: out of the sums
                    col = s * BLOCK + idx
                    inside = (col >= shift) & (col < end)
                    wdy = gl.where(inside, wdy, 0.0)
                    term = gl.where(inside, term, 0.0)
                a1 += term
                a2 += wdy
            if PAIRED:
                c1, c2 = gl.reduce((a1, a2), 0, _add_pairs)
                c1 = c1 / n_cols
                c2 = c2 / n_cols
            else:
                c1 = gl.sum(a1, axis=0) / n_cols
                c2 = gl.sum(a2, axis=0) / n_cols

            nv = gl.where(row + n_progs < n_rows, row_vecs, 0)
            if REG_SHARES:
                for u in gl.static_range(NSEG):
                    dyv, xhat = _bwd_dx_segment(xbuf, dybuf, wbuf, dx_ptr, abase, slot, u, idx, mean, rstd, c1, c2,
                                                first_v, last_v, layout, BLOCK, VEC, WIDEN)
                    dws = dws[:u] + (dws[u] + dyv * xhat,) + dws[u + 1:]
                    dbs = dbs[:u] + (dbs[u] + dyv,) + dbs[u + 1:]
                    if RING == 1:
                        _copy_pair(xbuf, dybuf, x_ptr, dy_ptr, nabase, 0, u, nv, idx, BLOCK, VEC, 1)
            else:
                for u in range(NSEG):
                    dyv, xhat = _bwd_dx_segment(xbuf, dybuf, wbuf, dx_ptr, abase, slot, u, idx, mean, rstd, c1, c2,
                                                first_v, last_v, layout, BLOCK, VEC, WIDEN)
                    dwbuf.index(u).store(dwbuf.index(u).load(layout) + dyv * xhat)
                    dbbuf.index(u).store(dbbuf.index(u).load(layout) + dyv)
                    if RING == 1:
                        _copy_pair(xbuf, dybuf, x_ptr, dy_ptr, nabase, 0, u, nv, idx, BLOCK, VEC, 1)
            edx = _bwd_dx((ex - mean) * rstd, edy, ew, rstd, c1, c2)
            gl.store(dx_ptr + abase + ecol, edx.to(dx_ptr.dtype.element_ty), mask=emask)
            abase = nabase
        async_copy.wait_group(0)
        share = pid.to(gl.int64) * n_cols - shift
        if REG_SHARES:
            for t in gl.static_range(NSEG):  # the shares at the real columns
                _bwd_store_shares(dw_part_ptr, db_part_ptr, share, dws[t], dbs[t], t, idx, shift, end, BLOCK)
        else:
            for t in range(NSEG):
                _bwd_store_shares(dw_part_ptr, db_part_ptr, share, dwbuf.index(t).load(layout),
                                  dbbuf.index(t).load(layout), t, idx, shift, end, BLOCK)


@dataclasses.dataclass(frozen=True)
class Shapes:
    """The held and streamed programs' shapes measured on sm_90 with Triton 3.6, the only GPUs these kernels run on:
    data in ``tuned/90.json``, "layer_norm_held" (``SHAPES``); docs/kernels.md, "One pass for the statistics", "Rows
    streamed past the held weight", "Shares in registers", gives each with its figures. The defaults are the base shape
    of each kernel: 8-warp forward programs, ``BWD_WARPS``-warp backward ones, no narrower programs, nothing
    streamed."""

    fwd_narrowest: tuple | None = None  # (warps, widest row): the forward's rows up to that width on these warps ...
    fwd_narrow: tuple | None = None  # ... else (warps, programs an SM at least): these warps where that many fit
    stream_max_segments: tuple = ()  # (element size, segments): rows the one-program-an-SM stream holds
    stream_narrow_max_cols: int = 0  # rows up to this width stream on narrower programs (STREAM_NARROW_WARPS) ...
    stream_narrow_max_segments: int = 0  # ... holding at most this many segments ...
    stream_narrow_max_segments_by_warps: tuple = ()  # ... or, by warps, (warps, segments)
    stream_narrow_regs: tuple = ()  # (segments, registers a thread); MAX_REGS where not named
    stream_narrow_min_per_sm: int = 1  # programs an SM at least, where the warps allow
    bwd_narrow: tuple | None = None  # (warps, segments at most): narrower backward programs
    bwd_reg_shares: tuple = ()  # (segments, registers a thread): shares in registers (with Triton 3.6: tuned_triton)
    bwd_widen_aligned_min_segments: int | None = None  # aligned bf16 rows widened from this many segments


# What the kernels launch (tests set it): the sm_90 file's, whatever this Triton (only bwd_reg_shares waits for 3.6)
SHAPES = _device.tuned("layer_norm_held", 90, Shapes())


def col_bytes(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> int:
    """Shared memory a column takes: the row's element, the weight's and the bias's."""
    return x.element_size() + wb_bytes(weight, bias)


def _forward_tensors(x2: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, y2: torch.Tensor) -> bool:
    """What both forwards take: packed, 16-byte aligned CUDA rows (x and y of one dtype), contiguous weight and bias of
    N elements on their device."""
    n_cols = x2.shape[1]
    return (y2.dtype == x2.dtype and packed_rows(x2, y2)
            and all(t.device == x2.device and t.shape == (n_cols,) and t.stride(0) == 1 for t in (weight, bias)))


def fits(x2: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, y2: torch.Tensor) -> bool:
    """Whether ``launch`` takes these: ``_forward_tensors``, and a row (with its weight and bias) that fits shared
    memory."""
    n_cols = x2.shape[1]
    return (_forward_tensors(x2, weight, bias, y2)
            and per_sm(n_cols, x2.element_size(), col_bytes(x2, weight, bias),
                       aligned=phase0(n_cols, x2.element_size())) > 0)


# The forward's shape: narrower programs (``Shapes.fwd_narrow``, on segments of a 16-byte vector a thread,
# ``segment_block``) where enough of them fit an SM, else 8-warp programs on 2048-element ones (docs/kernels.md, "One
# pass for the statistics").
# The held forward is issue-bound (ncu, bf16 5121: 76% of issue slots busy, ~30 instructions an element), so 16-bit rows
# take their mean and variance in one pass (JOINT, ``fwd_joint``: sums of x - x[row, 0] and of its square, as the rows
# plan's 16-bit rows do) and bf16 is widened by a shift or an AND an element (WIDEN, always; docs/kernels.md, "layer_norm:
# forward"; the two-pass and compiler-widened variants: "Variants removed").
# The streamed forward takes every row's statistics in one pass (the sums of x - x[row, 0] and of its square); fp32 rows
# whose x[row, 0] lies far from the mean, (mean - x[row, 0])^2 > STREAM_RECENTRE_FP32 var, take their variance again
# about the mean from the held registers (always so cost 2-5 points at 6001-22001: docs/kernels.md, "Statistics"). None:
# never.
STREAM_RECENTRE_FP32: float | None = 4.0


def fwd_joint(elem_size: int) -> bool:
    """Whether the forward of rows of ``elem_size``-byte elements takes its statistics in one pass: 16-bit rows; fp32
    keeps the centred second pass."""
    return elem_size == 2


def stream_recentre(elem_size: int) -> float:
    """``RECENTRE`` of the streamed forward: ``STREAM_RECENTRE_FP32`` for fp32 rows, else 0 (never)."""
    return float(STREAM_RECENTRE_FP32 or 0.0) if elem_size >= 4 else 0.0


def fwd_shape(n_cols: int, elem_size: int, col_bytes: int) -> tuple[int, int, int, int]:
    """(warps, elements a segment, segments a row, programs an SM) of the forward for rows of ``n_cols`` (rows that
    start on 16-byte boundaries, ``_held.phase0``, without the slack before a row's start): ``SHAPES``' narrowest
    programs up to their width, its narrow ones where enough fit an SM, else 8-warp ones."""
    p0, s = phase0(n_cols, elem_size), SHAPES
    if s.fwd_narrowest is not None and n_cols <= s.fwd_narrowest[1]:
        w = s.fwd_narrowest[0]
        b = segment_block(w)
        return w, b, segments(n_cols, elem_size, b, p0), per_sm(n_cols, elem_size, col_bytes, w, b, p0)
    if s.fwd_narrow is not None:
        w, least = s.fwd_narrow
        block = segment_block(w)
        narrow = per_sm(n_cols, elem_size, col_bytes, w, block, p0)
        if narrow >= least:
            return w, block, segments(n_cols, elem_size, block, p0), narrow
    return WARPS, BLOCK, segments(n_cols, elem_size, None, p0), per_sm(n_cols, elem_size, col_bytes, aligned=p0)


def launch(x2, weight, bias, y2, mean, rstd, eps: float, sm_count: int) -> None:
    """Layer norm of the packed (M, N) rows of ``x2`` into ``y2``, ``mean`` and ``rstd`` (``fits``)."""
    if not fits(x2, weight, bias, y2):
        raise ValueError("the held layer norm takes packed, 16-byte aligned CUDA rows of one dtype, contiguous (N,)"
                         f" weight and bias, and rows that fit shared memory (x: {tuple(x2.shape)} strides"
                         f" {x2.stride()} on {x2.device}, weight {tuple(weight.shape)}, bias {tuple(bias.shape)})")
    n_rows, n_cols = x2.shape
    es = x2.element_size()
    vec = 16 // es
    warps, block, nseg, fit = fwd_shape(n_cols, es, col_bytes(x2, weight, bias))
    grid = phase_grid(n_rows, es, fit, sm_count)  # persistent programs, a multiple of VEC: one phase a program
    launch_kernel(_layer_norm_fwd_held_kernel, (grid,),
        x2, weight, bias, y2, mean, rstd, n_rows, n_cols, eps, BLOCK=block, NSEG=nseg, VEC=vec, JOINT=fwd_joint(es),
        WIDEN=True, num_warps=warps, maxnreg=MAX_REGS)


# Rows too wide to hold with their weight and bias (16-bit past ~37000 columns) are streamed, the weight and bias held
# at the program's phase in shared memory (4 bytes a column in 16-bit: to 57337 columns) by 8-warp programs, one an SM
# with the whole register file: each row held in registers as loaded, the next row's segments loaded as the output pass
# leaves each of this row's, for rows of up to ``Shapes.stream_max_segments`` segments (by element size: two rows of 16
# bytes a thread a segment, 32 in fp32; fp32 past 12 segments spilled more than it gained). docs/kernels.md, "Rows
# streamed past the held weight".
STREAM_WARPS = 8


def wb_bytes(weight: torch.Tensor, bias: torch.Tensor) -> int:
    """Shared memory a column of the weight and the bias takes."""
    return weight.element_size() + bias.element_size()


def stream_segments(n_cols: int, elem_size: int, wb_bytes: int) -> int:
    """Segments a row of ``n_cols`` elements of ``elem_size`` bytes takes on the streamed forward, whose weight and bias
    take ``wb_bytes`` a column; 0 where it does not take the rows: the weight and bias held whole do not fit one block's
    shared memory, or the row and the next do not fit the registers (``Shapes.stream_max_segments``)."""
    nseg = segments(n_cols, elem_size, BLOCK, phase0(n_cols, elem_size))
    if nseg * BLOCK * wb_bytes + SMEM_RESERVED > SMEM_PER_BLOCK:
        return 0
    return nseg if nseg <= dict(SHAPES.stream_max_segments).get(4 if elem_size >= 4 else 2, 0) else 0


# Rows of up to ``Shapes.stream_narrow_max_cols`` columns are streamed by several narrower programs an SM instead (one
# 8-warp program an SM holds too little in flight for short rows): each the fewest warps of STREAM_NARROW_WARPS whose
# segments (one 16-byte vector a thread) hold the row in the fewest slots, at most the Shapes' segments for those warps,
# and as many programs an SM as RESIDENT_WARPS warps (_common), shared memory and the Shapes' registers allow, the
# register file split between them (docs/kernels.md, "Rows streamed past the held weight": the sm_90 file's one-warp
# programs take up to three 256-element 16-bit segments, its 16-warp ones fp32 rows of 12289-16383 in eight).
STREAM_NARROW_WARPS = (1, 2, 4, 8, 16, 32)


class StreamShape(NamedTuple):
    warps: int
    block: int  # elements a segment
    nseg: int  # segments a row
    per_sm: int  # programs an SM
    max_regs: int  # registers a thread


def stream_shape(n_cols: int, elem_size: int, wb_bytes: int) -> StreamShape | None:
    """The streamed forward's shape for rows of ``n_cols`` elements of ``elem_size`` bytes whose weight and bias take
    ``wb_bytes`` a column; None where it does not take them. Rows past ``Shapes.stream_narrow_max_cols``: one
    ``STREAM_WARPS`` program an SM on ``BLOCK``-element segments (``stream_segments``); narrower ones: the narrow shape
    above."""
    s = SHAPES
    if n_cols > s.stream_narrow_max_cols:
        nseg = stream_segments(n_cols, elem_size, wb_bytes)
        return StreamShape(STREAM_WARPS, BLOCK, nseg, 1, THREAD_MAX_REGS) if nseg else None
    vec, aligned = 16 // elem_size, phase0(n_cols, elem_size)
    caps = dict(s.stream_narrow_max_segments_by_warps)
    best = None  # (warps, elements a segment, segments): the fewest slots, the fewest warps among equals
    for warps in STREAM_NARROW_WARPS:
        block = vec * 32 * warps
        nseg = segments(n_cols, elem_size, block, aligned)
        if nseg <= caps.get(warps, s.stream_narrow_max_segments) and (best is None or nseg * block < best[1] * best[2]):
            best = (warps, block, nseg)
    if best is None:
        return None
    warps, block, nseg = best
    smem = nseg * block * wb_bytes + SMEM_RESERVED
    if smem > SMEM_PER_BLOCK:
        return None
    most = max(1, min(RESIDENT_WARPS // warps, SMEM_PER_SM // (smem + SMEM_RESERVED)))
    programs = min(most, SM90.regs_per_sm // (dict(s.stream_narrow_regs).get(nseg, MAX_REGS) * warps * 32))
    programs = max(1, programs, min(most, s.stream_narrow_min_per_sm))
    return StreamShape(warps, block, nseg, programs, reg_cap(SM90.regs_per_sm, programs * warps))


def fits_stream(x2: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, y2: torch.Tensor) -> bool:
    """Whether ``launch_stream`` takes these: as ``fits``, with only the weight and bias to fit shared memory and the
    row the registers (``stream_shape``)."""
    return (_forward_tensors(x2, weight, bias, y2)
            and stream_shape(x2.shape[1], x2.element_size(), wb_bytes(weight, bias)) is not None)


def launch_stream(x2, weight, bias, y2, mean, rstd, eps: float, sm_count: int) -> None:
    """Layer norm of the packed (M, N) rows of ``x2`` into ``y2``, ``mean`` and ``rstd``, the rows streamed past the
    held weight and bias (``fits_stream``): ``stream_shape``'s programs an SM, a multiple of the vector (one phase a
    program)."""
    if not fits_stream(x2, weight, bias, y2):
        raise ValueError("the streamed layer norm takes packed, 16-byte aligned CUDA rows of one dtype, contiguous (N,)"
                         " weight and bias that fit shared memory, rows that fit the registers (x: "
                         f"{tuple(x2.shape)} strides {x2.stride()} on {x2.device}, weight {tuple(weight.shape)}"
                         f" {weight.dtype}, bias {tuple(bias.shape)} {bias.dtype})")
    n_rows, n_cols = x2.shape
    es = x2.element_size()
    vec = 16 // es
    shape = stream_shape(n_cols, es, wb_bytes(weight, bias))
    grid = phase_grid(n_rows, es, shape.per_sm, sm_count)
    launch_kernel(_layer_norm_fwd_stream_kernel, (grid,),
        x2, weight, bias, y2, mean, rstd, n_rows, n_cols, eps, BLOCK=shape.block, NSEG=shape.nseg, VEC=vec,
        WIDEN=True, num_warps=shape.warps, RECENTRE=stream_recentre(es), maxnreg=shape.max_regs)


# The backward's shape (docs/kernels.md, "layer_norm: backward"): warps a program (a segment is 16 bytes a thread, 2048
# elements at 8 warps), and the rows held at once: a ring of BWD_RING (all but one in flight), fewer where shared memory
# does not hold them; with one, the next row is copied segment by segment as pass two leaves each.
BWD_WARPS = 4
# Narrower programs for rows of few segments: ``Shapes.bwd_narrow`` (the sm_90 file: 2 warps on 512-element segments
# for up to three of them, eight programs an SM; docs/kernels.md, "Shares in registers").
BWD_RING = 2
# The dweight/dbias shares held in registers (two float32 tensors a segment, 16 registers a thread a segment) instead of
# shared memory, for rows of the segment counts ``Shapes.bwd_reg_shares`` names: a column then takes 8 bytes less of
# shared memory, so more programs fit an SM, and pass two drops the shares' read-modify-write. Its value is the
# registers a thread needs then (the least that compiled without spills with Triton 3.6 for sm_90), which caps the
# programs an SM; with another Triton (_held.tuned_triton) the shares stay in shared memory. docs/kernels.md, "Shares
# in registers". bf16 x, dy and weight are widened by a shift or an AND an element (_held.widen, ``bwd_widen``), as
# the forward's; rows of N a multiple of 16 (which Triton compiles apart) only from ``Shapes.
# bwd_widen_aligned_min_segments`` segments, the others take the compiler's conversion.


class BwdShape(NamedTuple):
    warps: int
    block: int  # elements a segment
    nseg: int  # segments a row
    ring: int  # rows held at once
    per_sm: int  # programs an SM (0: a row does not fit)
    max_regs: int  # registers a thread: the register file shared by those programs
    reg_shares: bool = False  # the dweight/dbias shares in registers (Shapes.bwd_reg_shares)


def bwd_shape(n_cols: int, elem_size: int, w_size: int) -> BwdShape:
    """How the backward holds rows of ``n_cols`` elements of ``elem_size`` bytes with a weight of ``w_size``-byte
    elements: the largest ring up to ``BWD_RING`` that fits shared memory, the programs an SM, their registers."""
    warps, p0, s = BWD_WARPS, phase0(n_cols, elem_size), SHAPES  # rows on 16-byte boundaries: no slack (_held.phase0)
    if s.bwd_narrow is not None and segments(n_cols, elem_size, segment_block(s.bwd_narrow[0]), p0) <= s.bwd_narrow[1]:
        warps = s.bwd_narrow[0]
    block = segment_block(warps)
    nseg = segments(n_cols, elem_size, block, p0)
    need = dict(s.bwd_reg_shares).get(nseg) if tuned_triton() else None  # registers a thread with the shares held
    reg = need is not None
    for ring in range(BWD_RING, 0, -1):  # a column: x and dy for each row held, the weight, two float32 shares
        progs = per_sm(n_cols, elem_size, ring * 2 * elem_size + w_size + (0 if reg else 8), warps, block, p0)
        if reg:
            progs = min(progs, SM90.regs_per_sm // (warps * 32 * need))
        if progs:
            return BwdShape(warps, block, nseg, ring, progs, reg_cap(SM90.regs_per_sm, warps * progs), reg)
    return BwdShape(warps, block, nseg, 1, 0, 0, reg)


def bwd_widen(shape: BwdShape, n_cols: int) -> bool:
    """Whether the backward of rows of ``n_cols`` on this shape widens bf16 by a shift or an AND (rows of N a multiple
    of 16 from ``Shapes.bwd_widen_aligned_min_segments`` segments)."""
    least = SHAPES.bwd_widen_aligned_min_segments
    return n_cols % 16 != 0 or (least is not None and shape.nseg >= least)


def paired(shape: BwdShape) -> bool:
    """Whether the backward of this shape takes its row's two sums in one block reduction of the pair: where two rows
    are held (a ring), three barriers a row fewer than two reductions (docs/kernels.md, "Rows held in shared memory
    (backward)")."""
    return shape.ring > 1


def _bwd_shape(x2: torch.Tensor, weight: torch.Tensor) -> BwdShape:
    return bwd_shape(x2.shape[1], x2.element_size(), weight.element_size())


def backward_programs(x2: torch.Tensor, weight: torch.Tensor, sm_count: int) -> int:
    """The backward's programs (and so its dweight/dbias share rows): as many as fit the SMs, a multiple of VEC (one
    phase a program), no more than the rows need."""
    return phase_grid(x2.shape[0], x2.element_size(), _bwd_shape(x2, weight).per_sm, sm_count)


def fits_backward(dy2: torch.Tensor, x2: torch.Tensor, weight: torch.Tensor, dx2: torch.Tensor) -> bool:
    """Whether ``launch_backward`` takes these: packed, 16-byte aligned CUDA rows of x, dy and dx of one dtype, a
    contiguous weight of N elements on their device, a row (with its weight and shares) that fits shared memory."""
    n_cols = x2.shape[1]
    return (dy2.dtype == x2.dtype == dx2.dtype and packed_rows(x2, dy2, dx2) and weight.device == x2.device
            and weight.shape == (n_cols,) and weight.stride(0) == 1
            and _bwd_shape(x2, weight).per_sm > 0)


def launch_backward(dy2, x2, weight, mean, rstd, dx2, sm_count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """dx of the packed (M, N) rows into ``dx2`` (``fits_backward``); returns the (programs, N) float32 dweight and
    dbias shares, which the caller sums (``layer_norm._sum_shares``)."""
    if not fits_backward(dy2, x2, weight, dx2):
        raise ValueError("the held layer-norm backward takes packed, 16-byte aligned CUDA rows of x, dy and dx of one"
                         " dtype, a contiguous (N,) weight, and rows that fit shared memory (x: "
                         f"{tuple(x2.shape)} {x2.dtype} strides {x2.stride()} on {x2.device}, dy: {tuple(dy2.shape)}"
                         f" {dy2.dtype}, dx: {tuple(dx2.shape)} {dx2.dtype}, weight {tuple(weight.shape)})")
    n_rows, n_cols = x2.shape
    progs = backward_programs(x2, weight, sm_count)
    shape = _bwd_shape(x2, weight)
    dw_part, db_part = float32_pair(progs, n_cols, x2.device)
    launch_kernel(_layer_norm_bwd_held_kernel, (progs,),
        x2, dy2, weight, mean, rstd, dx2, dw_part, db_part, n_rows, n_cols, BLOCK=shape.block, NSEG=shape.nseg,
        VEC=16 // x2.element_size(), RING=shape.ring, PAIRED=paired(shape), REG_SHARES=shape.reg_shares,
        WIDEN=bwd_widen(shape, n_cols), num_warps=shape.warps,
        maxnreg=shape.max_regs)
    return dw_part, db_part
