"""Softmax rows held in shared memory: the "held" plan (docs/kernels.md, "Rows held in shared memory").

A wide row (16385-56000 16-bit columns) is too wide for one program's registers and, walked twice,
re-reads from L2 what a few programs an SM hold in flight. Here a program copies the whole row into
shared memory with ``cp.async`` (16-byte vectors from the row's aligned-down start, no registers
held), takes its max and its sum of exponentials in one pass and its output from there: one HBM read
and one write, and as many programs an SM as shared memory holds rows, each one's loads in flight
behind the others' arithmetic. A program a row, placed by the GPU's block scheduler wherever an SM
frees room (a persistent walk left SMs idle at its end: docs/kernels.md, "A program a row").
Written in Gluon (Triton's explicit-layout dialect), which gives the kernel its shared memory;
Triton's own language does not.

Rows too wide for two programs an SM (``launch_split``, ``_softmax_held_split_kernel``) are held in slices, a slice a
program, whose programs exchange their (max, sum) through ``_split_walk``'s counters and ticket order.

What it shares with the layer-norm forward's held kernel (the sizes, ``available``, the segment copy) is in
``_held``; the softmax module's planner picks it only where ``available``.
"""

from __future__ import annotations

import torch

from ._common import cdiv, next_power_of_2
from ._held import (BLOCK, MAX_REGS, WARPS, CompilationError, async_copy, available, copy_segment, disable,  # noqa: F401
                    edge_columns, gl, gluon, land_segment, packed_rows, per_sm, row_start, segments, thread_barrier,
                    tuned_triton, widen)
from ._split_walk import COUNTER_STRIDE, exchange, spin_asm
from ._launch import launch as launch_kernel

if gluon is not None:

    @gluon.jit
    def _ex2(x):
        return gl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=gl.float32, is_pure=True,
                                         pack=1)

    @gluon.jit
    def _exp_from(v, c):
        # exp(v - c) by ex2.approx.ftz, the subtraction first: folded into one FMA, v log2(e) - c log2(e) loses
        # |c| 2^-24 of the exponent, which at a fully masked row's max (finfo.min) is 1e31 (docs/kernels.md)
        LOG2E: gl.constexpr = 1.4426950408889634
        return _ex2((v - c) * LOG2E)

    @gluon.jit
    def _finite_or_zero(m):
        # a running max to subtract: -inf (nothing but -inf seen yet) as 0, so that -inf - max is -inf, not nan
        return gl.where(m == float("-inf"), 0.0, m)

    @gluon.jit
    def _merge_max_sum(m1, a1, m2, a2):
        # two (max, sum of exp(x - max)) pairs as one
        m = gl.maximum(m1, m2)
        k = _finite_or_zero(m)
        return m, a1 * _exp_from(m1, k) + a2 * _exp_from(m2, k)

    @gluon.jit
    def _tile_max_sum(buf, idx, shift, end, layout: gl.constexpr, vec_layout: gl.constexpr, BLOCK: gl.constexpr,
                      NSEG: gl.constexpr, VEC: gl.constexpr, WIDEN: gl.constexpr):
        # the (max, sum of exp(x - max)) of the elements [shift, end) held in buf, in one pass, each segment as it
        # lands: each thread's running max and sum over its VEC-element vectors (one rescale a vector), then one
        # reduction of the (max, sum) pairs. In the first and the last two segments (the only ones the ends can fall
        # in) the neighbours' elements become -inf, so that the output needs no masks; a max still -inf (a vector of
        # neighbours, or a row of -inf) is subtracted as 0 (_finite_or_zero), so those terms add 0 instead of
        # exp(-inf + inf)
        m = gl.full([BLOCK // VEC], float("-inf"), gl.float32, gl.SliceLayout(1, vec_layout))
        a = gl.zeros([BLOCK // VEC], gl.float32, gl.SliceLayout(1, vec_layout))
        for s in gl.static_range(NSEG):
            v = land_segment(buf, s, idx, shift, end, float("-inf"), layout, BLOCK, NSEG, WIDEN)
            v2 = gl.convert_layout(gl.reshape(v, [BLOCK // VEC, VEC]), vec_layout)
            m_new = gl.maximum(m, gl.max(v2, axis=1))
            k = _finite_or_zero(m_new)
            a = a * _exp_from(m, k) + gl.sum(_exp_from(v2, k[:, None]), axis=1)
            m = m_new
        return gl.reduce((m, a), 0, _merge_max_sum)

    @gluon.jit
    def _tile_edges(x_ptr, abase, shift, end, eidx, VEC: gl.constexpr):
        # the tile's partial vectors at its two ends, loaded at its start: (columns, mask, values) (edge_columns)
        ecol, emask = edge_columns(eidx, shift, end, VEC)
        return ecol, emask, gl.load(x_ptr + abase + ecol, mask=emask, other=0.0).to(gl.float32)

    @gluon.jit
    def _tile_output(buf, y_ptr, abase, shift, end, c, inv, ecol, emask, ev, idx, layout: gl.constexpr,
                     BLOCK: gl.constexpr, NSEG: gl.constexpr, VEC: gl.constexpr, WIDEN: gl.constexpr):
        # exp(x - c) * inv (inv: 1 / the row's sum) for the whole vectors of [shift, end) from buf; then the partial
        # vectors at the two ends from the edges (_tile_edges)
        first_v = gl.cdiv(shift, VEC)
        last_v = end // VEC
        for u in range(NSEG):
            v = widen(buf.index(u).load(layout), WIDEN)
            y = (_exp_from(v, c) * inv).to(y_ptr.dtype.element_ty)
            col = u * BLOCK + idx
            vi = col // VEC
            gl.store(y_ptr + abase + col, y, mask=(vi >= first_v) & (vi < last_v))
        ey = _exp_from(ev, c) * inv
        gl.store(y_ptr + abase + ecol, ey.to(y_ptr.dtype.element_ty), mask=emask)

    @gluon.jit
    def _softmax_held_kernel(
        x_ptr,  # input, rows packed (stride N), 16-byte aligned at row 0
        y_ptr,  # output, the same layout
        n_rows,
        n_cols,
        BLOCK: gl.constexpr,  # elements a segment
        NSEG: gl.constexpr,  # segments a row (segments())
        VEC: gl.constexpr,  # elements in 16 bytes
        WIDEN: gl.constexpr,  # bf16 widened by a shift or an AND an element (_held.widen; WIDEN)
        num_warps: gl.constexpr,
    ):
        """Row pid (the grid: a program a row). It lies in shared memory in NSEG segments, counted from the aligned
        vector that holds its first element (``shift`` elements before it). The max and the sum (one pass,
        ``_tile_max_sum``) and the output (``_tile_output``) read it there. Segments strictly inside the row take no
        masks; the first and last take element masks, and the output's partial vectors at the two ends of the
        row are stored element by element (the edges, loaded at the row's start: ``_tile_edges``)."""
        layout: gl.constexpr = gl.BlockedLayout([VEC], [32], [num_warps], [0])
        edge_layout: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
        vec_layout: gl.constexpr = gl.BlockedLayout([1, VEC], [32, 1], [num_warps, 1], [1, 0])  # a thread's vectors
        buf = gl.allocate_shared_memory(x_ptr.dtype.element_ty, [NSEG, BLOCK], gl.SwizzledSharedLayout(1, 1, 1, [0]))
        idx = gl.arange(0, BLOCK, layout=layout)
        eidx = gl.arange(0, 2 * VEC, layout=edge_layout)
        abase, shift = row_start(gl.program_id(0), n_cols, VEC)
        for s in gl.static_range(NSEG):
            copy_segment(buf, x_ptr, abase, s, gl.cdiv(n_cols + shift, VEC), idx, BLOCK, VEC)
        end = shift + n_cols
        ecol, emask, ev = _tile_edges(x_ptr, abase, shift, end, eidx, VEC)
        c, total = _tile_max_sum(buf, idx, shift, end, layout, vec_layout, BLOCK, NSEG, VEC, WIDEN)
        _tile_output(buf, y_ptr, abase, shift, end, c, 1.0 / total, ecol, emask, ev, idx, layout, BLOCK, NSEG, VEC,
                     WIDEN)

    @gluon.jit
    def _ticket(sync_ptr, n_rows):
        # the next tile of the walk: a relaxed atomic ticket, taken only after a program's wait on its row
        # (_split_walk's module docstring: why that cannot deadlock)
        return gl.atomic_add(sync_ptr + n_rows * COUNTER_STRIDE, 1, sem="relaxed")

    @gluon.jit
    def _softmax_held_split_kernel(
        x_ptr,  # input, rows packed (stride N), 16-byte aligned at row 0
        y_ptr,  # output, the same layout
        part_ptr,  # (n_rows, GROUP, 2) float32: each slice's (max, sum)
        sync_ptr,  # (n_rows + 1) x COUNTER_STRIDE int32 zeros: each row's arrivals, then the ticket
        n_rows,
        n_cols,
        slice_cols,  # columns a slice (a multiple of VEC); the last slice of a row takes what is left
        GROUP: gl.constexpr,  # slices a row
        BLOCK_G: gl.constexpr,  # GROUP's power of two
        BLOCK: gl.constexpr,
        NSEG: gl.constexpr,  # segments a slice (segments(slice_cols))
        VEC: gl.constexpr,
        WIDEN: gl.constexpr,
        SPIN: gl.constexpr,  # the wait's PTX (_split_walk.spin_asm(SPIN_MAX_NS))
        num_warps: gl.constexpr,
    ):
        """The held kernel for rows wider than a few programs an SM hold: each row in GROUP slices (tiles), a slice a
        program (the grid: a program a slice), held in shared memory as ``_softmax_held_kernel`` holds a row. A
        program's tile is a ticket it takes as it starts, so tiles go out in the order programs start. A slice's (max,
        sum) goes out to ``part``; the program arrives at its row's counter, waits for the row's other slices
        (``_split_walk``'s release add and acquire spin), merges the row's pairs and writes its output. Slices start
        at multiples of VEC columns, so every slice of a row has the row's phase and its own partial edge vectors."""
        layout: gl.constexpr = gl.BlockedLayout([VEC], [32], [num_warps], [0])
        edge_layout: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
        vec_layout: gl.constexpr = gl.BlockedLayout([1, VEC], [32, 1], [num_warps, 1], [1, 0])
        buf = gl.allocate_shared_memory(x_ptr.dtype.element_ty, [NSEG, BLOCK], gl.SwizzledSharedLayout(1, 1, 1, [0]))
        idx = gl.arange(0, BLOCK, layout=layout)
        eidx = gl.arange(0, 2 * VEC, layout=edge_layout)
        gidx = gl.arange(0, BLOCK_G, layout=edge_layout)
        n_tiles = n_rows * GROUP

        tile = _ticket(sync_ptr, n_rows)
        abase, shift, n_tile = _slice_start(tile, n_rows, n_cols, slice_cols, GROUP, VEC)
        n_vecs = gl.where(tile < n_tiles, gl.cdiv(n_tile + shift, VEC), 0)
        for s in gl.static_range(NSEG):
            copy_segment(buf, x_ptr, abase, s, n_vecs, idx, BLOCK, VEC)
        if tile < n_tiles:  # every ticket is a tile: the grid is a program a tile
            row = tile // GROUP
            end = shift + n_tile
            ecol, emask, ev = _tile_edges(x_ptr, abase, shift, end, eidx, VEC)
            c, total = _tile_max_sum(buf, idx, shift, end, layout, vec_layout, BLOCK, NSEG, VEC, WIDEN)

            # the exchange: this slice's pair out, the row's pairs in (every thread holds its own acquire)
            part_row = part_ptr + row.to(gl.int64) * (2 * GROUP)
            slot = tile % GROUP
            gl.store(part_row + 2 * slot, c)
            gl.store(part_row + 2 * slot + 1, total)
            count = sync_ptr + row.to(gl.int64) * COUNTER_STRIDE
            thread_barrier()  # every thread's stores precede the release
            gl.atomic_add(count, 1, sem="release", scope="gpu")
            gl.inline_asm_elementwise(SPIN, "=r,l,r", [count, GROUP], dtype=gl.int32, is_pure=False, pack=1)
            thread_barrier()
            all_c = gl.load(part_row + 2 * gidx, mask=gidx < GROUP, other=float("-inf"), volatile=True)
            all_t = gl.load(part_row + 2 * gidx + 1, mask=gidx < GROUP, other=0.0, volatile=True)
            c, total = gl.reduce((all_c, all_t), 0, _merge_max_sum)
            _tile_output(buf, y_ptr, abase, shift, end, c, 1.0 / total, ecol, emask, ev, idx, layout, BLOCK, NSEG,
                         VEC, WIDEN)
        async_copy.wait_group(0)

    @gluon.jit
    def _slice_start(tile, n_rows, n_cols, slice_cols, GROUP: gl.constexpr, VEC: gl.constexpr):
        # a tile's aligned-down start, shift and columns; past the last tile the last row's last slice (a start in
        # bounds that nothing copies: its n_vecs is 0)
        t = gl.minimum(tile, n_rows * GROUP - 1)
        first = (t % GROUP) * slice_cols
        base = (t // GROUP).to(gl.int64) * n_cols + first
        abase = base // VEC * VEC
        return abase, (base - abase).to(gl.int32), gl.minimum(slice_cols, n_cols - first)


# bf16 rows widened by a shift or an AND an element in both passes (_held.widen), as the layer norm's held kernels (H200,
# bf16, % of copy: 17000 81 -> 82, 50257 78 -> 81, 60000 79 -> 81, 128256 80 -> 82, 200001 75 -> 75); with the Triton the
# choice was measured with (_held.tuned_triton: Triton 3.9 spills 8 bytes a thread at 50257 with it).
WIDEN = True

# The exchange's wait: nanosleep back-off between tries, doubling from 32 ns up to this (0: none).
SPIN_MAX_NS = 256


def widen_rows() -> bool:
    """Whether the softmax kernels widen bf16 by a shift or an AND (``WIDEN``, on the Triton it was measured with)."""
    return WIDEN and tuned_triton()


def fits(x2: torch.Tensor, y2: torch.Tensor) -> bool:
    """Whether ``launch`` takes these (M, N) views: CUDA tensors whose rows lie packed (stride N, unit column
    stride), both 16 bytes aligned, of one dtype, a row that fits shared memory."""
    return y2.dtype == x2.dtype and packed_rows(x2, y2) and per_sm(x2.shape[1], x2.element_size()) > 0


def launch(x2: torch.Tensor, y2: torch.Tensor) -> None:
    """Softmax of the packed (M, N) rows of ``x2`` into ``y2`` (``fits``)."""
    if not fits(x2, y2):
        raise ValueError("the held softmax takes packed, 16-byte aligned CUDA rows of one dtype that fit shared memory"
                         f" (x: {tuple(x2.shape)} strides {x2.stride()} on {x2.device}, y: {tuple(y2.shape)})")
    n_rows, n_cols = x2.shape
    es = x2.element_size()
    launch_kernel(_softmax_held_kernel, (n_rows,),  # a program a row (docs/kernels.md, "A program a row")
        x2, y2, n_rows, n_cols, BLOCK=BLOCK, NSEG=segments(n_cols, es), VEC=16 // es,
        WIDEN=widen_rows(), num_warps=WARPS, maxnreg=MAX_REGS)


def split_shape(n_cols: int, elem_size: int, group: int) -> tuple[int, int]:
    """(slices a row, columns a slice) for ``group`` slices asked: slices of a multiple of 16 bytes (so that each
    has its row's phase), none empty."""
    vec = 16 // elem_size
    slice_cols = cdiv(cdiv(n_cols, max(1, group)), vec) * vec
    return cdiv(n_cols, slice_cols), slice_cols


def split_fits(x2: torch.Tensor, y2: torch.Tensor, group: int) -> bool:
    """Whether ``launch_split`` takes these (M, N) views in ``group`` slices a row (``fits``, for a slice's width)."""
    _, slice_cols = split_shape(x2.shape[1], x2.element_size(), group)
    return y2.dtype == x2.dtype and packed_rows(x2, y2) and per_sm(slice_cols, x2.element_size()) > 0


def launch_split(x2: torch.Tensor, y2: torch.Tensor, group: int) -> None:
    """Softmax of the packed (M, N) rows of ``x2`` into ``y2``, each row in ``group`` slices held by programs that
    exchange their (max, sum) (``split_fits``; ``split_shape`` may make fewer slices)."""
    if not split_fits(x2, y2, group):
        raise ValueError("the held softmax takes packed, 16-byte aligned CUDA rows of one dtype whose slices fit shared"
                         f" memory (x: {tuple(x2.shape)} strides {x2.stride()} on {x2.device}, y: {tuple(y2.shape)},"
                         f" {group} slices)")
    n_rows, n_cols = x2.shape
    es = x2.element_size()
    group, slice_cols = split_shape(n_cols, es, group)
    if group == 1:
        return launch(x2, y2)
    part, sync = exchange(n_rows, group, x2.device, x2)
    launch_kernel(_softmax_held_split_kernel, (n_rows * group,),  # a program a slice
        x2, y2, part, sync, n_rows, n_cols, slice_cols, GROUP=group, BLOCK_G=next_power_of_2(group),
        BLOCK=BLOCK, NSEG=segments(slice_cols, es), VEC=16 // es, WIDEN=widen_rows(),
        SPIN=spin_asm(SPIN_MAX_NS), num_warps=WARPS, maxnreg=MAX_REGS)
