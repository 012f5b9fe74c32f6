"""Layer-norm forward rows held in shared memory: the forward's "held" plan (docs/kernels.md, "Rows held in shared
memory").

A persistent program copies each row into shared memory (``_held``: ``cp.async`` from the row's aligned-down start),
takes its mean, its centred variance and its output from there, and copies the next row into each segment the output
pass leaves. The weight and bias are what a ragged row makes hard: a row that starts ``shift`` elements past a
16-byte boundary needs column c of the weight at slot c + shift, off the weight's own vector grid. The grid's size is
a multiple of the vector, so every row of a program starts at the same phase (row r's phase is r N mod VEC), and each
program copies the weight and bias once into shared memory at its phase; its rows then read them as aligned vectors.
"""

from __future__ import annotations

import torch
import triton

from ._held import (BLOCK, MAX_REGS, WARPS, CompilationError, async_copy, available, copy_segment, disable,  # noqa: F401
                    gl, gluon, packed_rows, per_sm, segments)

if gluon is not None:

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
        num_warps: gl.constexpr,
    ):
        """Rows pid, pid + programs, ... (all at one phase); three passes over shared memory: the sum as each segment
        lands (the neighbours' elements of the first and the last two segments, the only ones a row's ends fall in,
        become 0 there), the centred sum of squares, and the output with the weight and bias held at the program's
        phase. The output's partial vectors at the row's two ends are stored element by element (the edges)."""
        layout: gl.constexpr = gl.BlockedLayout([VEC], [32], [num_warps], [0])
        edge_layout: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
        flat: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
        buf = gl.allocate_shared_memory(x_ptr.dtype.element_ty, [NSEG, BLOCK], flat)
        wbuf = gl.allocate_shared_memory(w_ptr.dtype.element_ty, [NSEG, BLOCK], flat)
        bbuf = gl.allocate_shared_memory(b_ptr.dtype.element_ty, [NSEG, BLOCK], flat)
        idx = gl.arange(0, BLOCK, layout=layout)
        eidx = gl.arange(0, 2 * VEC, layout=edge_layout)
        pid = gl.program_id(0)
        n_progs = gl.num_programs(0)

        base = pid.to(gl.int64) * n_cols
        abase = base // VEC * VEC
        shift = (base - abase).to(gl.int32)  # the same for every row of this program
        end = shift + n_cols
        first_v = gl.cdiv(shift, VEC)
        last_v = end // VEC
        n_vecs = gl.where(pid < n_rows, gl.cdiv(end, VEC), 0)
        for s in gl.static_range(NSEG):
            copy_segment(buf, x_ptr, abase, s, n_vecs, idx, BLOCK, VEC)
        # the weight and bias at this program's phase: slot j holds column j - shift (once, by plain loads)
        for t in range(NSEG):
            c = t * BLOCK + idx - shift
            ok = (c >= 0) & (c < n_cols)
            wbuf.index(t).store(gl.load(w_ptr + c, mask=ok, other=0.0))
            bbuf.index(t).store(gl.load(b_ptr + c, mask=ok, other=0.0))
        ecol = gl.where(eidx < VEC, shift // VEC * VEC + eidx, last_v * VEC + eidx - VEC)
        emask = (ecol >= shift) & (ecol < end) & ((eidx >= VEC) | (shift % VEC > 0))
        ew = gl.load(w_ptr + (ecol - shift), mask=emask, other=0.0).to(gl.float32)
        eb = gl.load(b_ptr + (ecol - shift), mask=emask, other=0.0).to(gl.float32)
        for row in range(pid, n_rows, n_progs):
            ev = gl.load(x_ptr + abase + ecol, mask=emask, other=0.0).to(gl.float32)
            acc = gl.zeros([BLOCK], gl.float32, layout)
            for s in gl.static_range(NSEG):
                async_copy.wait_group(NSEG - 1 - s)
                seg = buf.index(s)
                v = seg.load(layout).to(gl.float32)
                if (s == 0) | (s >= NSEG - 2):
                    col = s * BLOCK + idx
                    v = gl.where((col >= shift) & (col < end), v, 0.0)
                    seg.store(v.to(x_ptr.dtype.element_ty))
                acc += v
            mean = gl.sum(acc, axis=0) / n_cols
            acc = gl.zeros([BLOCK], gl.float32, layout)
            for s in gl.static_range(NSEG):
                d = buf.index(s).load(layout).to(gl.float32) - mean
                if (s == 0) | (s >= NSEG - 2):
                    col = s * BLOCK + idx
                    d = gl.where((col >= shift) & (col < end), d, 0.0)
                acc += d * d
            rstd = 1.0 / gl.sqrt(gl.sum(acc, axis=0) / n_cols + eps)
            gl.store(mean_ptr + row, mean)
            gl.store(rstd_ptr + row, rstd)

            nxt = row + n_progs
            nabase = nxt.to(gl.int64) * n_cols // VEC * VEC  # the same shift: n_progs is a multiple of VEC
            nv = gl.where(nxt < n_rows, gl.cdiv(end, VEC), 0)
            for u in range(NSEG):
                v = buf.index(u).load(layout).to(gl.float32)
                w = wbuf.index(u).load(layout).to(gl.float32)
                b = bbuf.index(u).load(layout).to(gl.float32)
                y = ((v - mean) * rstd * w + b).to(y_ptr.dtype.element_ty)
                vi = (u * BLOCK + idx) // VEC
                gl.store(y_ptr + abase + u * BLOCK + idx, y, mask=(vi >= first_v) & (vi < last_v))
                copy_segment(buf, x_ptr, nabase, u, nv, idx, BLOCK, VEC)
            ey = (ev - mean) * rstd * ew + eb
            gl.store(y_ptr + abase + ecol, ey.to(y_ptr.dtype.element_ty), mask=emask)
            abase = nabase
        async_copy.wait_group(0)


def col_bytes(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> int:
    """Shared memory a column takes: the row's element, the weight's and the bias's."""
    return x.element_size() + weight.element_size() + bias.element_size()


def fits(x2: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, y2: torch.Tensor) -> bool:
    """Whether ``launch`` takes these: packed, 16-byte aligned CUDA rows (x and y of one dtype), contiguous weight and
    bias of N elements on their device, a row (with its weight and bias) that fits shared memory."""
    n_cols = x2.shape[1]
    return (y2.dtype == x2.dtype and packed_rows(x2, y2)
            and all(t.device == x2.device and t.shape == (n_cols,) and t.stride(0) == 1 for t in (weight, bias))
            and per_sm(n_cols, x2.element_size(), col_bytes(x2, weight, bias)) > 0)


def launch(x2, weight, bias, y2, mean, rstd, eps: float, sm_count: int) -> None:
    """Layer norm of the packed (M, N) rows of ``x2`` into ``y2``, ``mean`` and ``rstd`` (``fits``)."""
    if not fits(x2, weight, bias, y2):
        raise ValueError("the held layer norm takes packed, 16-byte aligned CUDA rows of one dtype, contiguous (N,)"
                         f" weight and bias, and rows that fit shared memory (x: {tuple(x2.shape)} strides"
                         f" {x2.stride()} on {x2.device}, weight {tuple(weight.shape)}, bias {tuple(bias.shape)})")
    n_rows, n_cols = x2.shape
    es = x2.element_size()
    vec = 16 // es
    progs = per_sm(n_cols, es, col_bytes(x2, weight, bias)) * sm_count // vec * vec  # a multiple of VEC: one phase
    _layer_norm_fwd_held_kernel[(max(vec, min(triton.cdiv(n_rows, vec) * vec, progs)),)](
        x2, weight, bias, y2, mean, rstd, n_rows, n_cols, eps, BLOCK=BLOCK, NSEG=segments(n_cols, es), VEC=vec,
        num_warps=WARPS, maxnreg=MAX_REGS)
