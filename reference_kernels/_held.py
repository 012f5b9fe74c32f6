"""What the kernels that hold rows in shared memory share (docs/kernels.md, "Rows held in shared memory").

A persistent Gluon program copies a row into shared memory with ``cp.async`` in ``BLOCK``-element segments (16-byte
vectors counted from the aligned vector that holds the row's first element, so that ragged rows copy as aligned ones),
reads it there as often as its arithmetic needs, and copies the next row into each segment its last pass leaves.
The softmax (``_softmax_held``) and the layer norm's forward and backward (``_layer_norm_held``) are written this
way. Gluon is Triton's explicit-layout dialect (Triton 3.5+): it gives a kernel its shared memory, which Triton's own
language does not. ``available`` says whether this machine runs it (a CUDA GPU of compute capability 9.x, Triton with Gluon, not
the interpreter); the planners pick these plans only then.
"""

from __future__ import annotations

import torch
import triton
from triton.compiler.errors import CompilationError

try:  # Gluon: Triton 3.5+; its names move between releases, so any failure means "not here"
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy
except Exception:  # pragma: no cover - depends on the Triton build
    gluon = gl = async_copy = None

from ._common import RESIDENT_WARPS, cdiv, disable_after_compile_failure, interpreting, reg_cap, sm90
from ._device import DESCRIPTIONS, Device

WARPS = 8


def segment_block(warps: int) -> int:
    """Elements a segment of ``warps``-warp programs: 32 threads a warp x 8 elements, one 16-byte vector of 16-bit
    elements (two of fp32) a thread."""
    return 256 * warps


BLOCK = segment_block(WARPS)  # 2048
SMEM_RESERVED = 1024  # what the driver keeps per block, and the reductions' scratch
SM90 = DESCRIPTIONS["H100"]  # the shared memory, registers and warps an SM of the GPUs the held kernels run on
MAX_REGS = reg_cap(SM90.regs_per_sm, RESIDENT_WARPS)  # registers a thread: four 8-warp programs an SM (64)
SMEM_PER_SM = SM90.smem_per_sm  # bytes of shared memory an SM gives its blocks (sm_90: 228 KiB)
SMEM_PER_BLOCK = SM90.smem_per_block  # the most one block may take (sm_90 opt-in)


def phase0(n_cols: int, elem_size: int) -> bool:
    """Whether every packed row of ``n_cols`` starts on a 16-byte boundary (N a multiple of the 16-byte vector, the
    tensor 16-byte aligned, as ``packed_rows`` requires): no row then needs the slack before its start."""
    return n_cols % (16 // elem_size) == 0


def segments(n_cols: int, elem_size: int, block: int | None = None, aligned: bool = False) -> int:
    """Segments of ``block`` (default ``BLOCK``) elements that hold a row from its aligned-down start (up to 15 bytes
    before it); ``aligned``: rows that start on a 16-byte boundary (``phase0``), which need no such slack."""
    slack = 0 if aligned else 16 // elem_size - 1
    return cdiv(n_cols + slack, block or BLOCK)


def phase_grid(n_rows: int, elem_size: int, per_sm_programs: int, sm_count: int) -> int:
    """Programs of a kernel whose programs walk rows pid, pid + programs, ...: a multiple of the 16-byte vector's
    elements, so that every row of a program starts at one phase (row r's phase is r N mod VEC), ``per_sm_programs`` on
    every SM, no more than the rows need."""
    vec = 16 // elem_size
    return max(vec, min(cdiv(n_rows, vec) * vec, per_sm_programs * sm_count // vec * vec))


def per_sm(n_cols: int, elem_size: int, col_bytes: int | None = None, warps: int | None = None,
           block: int | None = None, aligned: bool = False, *, device: Device = SM90) -> int:
    """Programs an SM of ``device`` runs at once: as many as shared memory holds rows of (``col_bytes`` a column:
    default the element's), up to what the warps and registers allow; 0 where one does not fit. ``warps`` and
    ``block``: a program's warps and its segments' elements (default ``WARPS``, ``BLOCK``); ``aligned`` as for
    ``segments``. ``device`` defaults to sm_90's figures, the only GPUs the held kernels run on (``available``)."""
    warps, block = warps or WARPS, block or BLOCK
    row = segments(n_cols, elem_size, block, aligned) * block * (col_bytes or elem_size) + SMEM_RESERVED
    if row > device.smem_per_block:
        return 0
    return min(device.smem_per_sm // (row + SMEM_RESERVED), device.warps_per_sm // warps,
               device.regs_per_sm // (warps * 32 * MAX_REGS))


# The Triton release whose sm_90 compiles set the register-bound choices of the held kernels (the layer-norm backward's
# shares in registers, the softmax's bf16 widening): another release allocates registers its own way (Triton 3.9 spills
# 120 bytes a thread of the backward at 3001 columns and 288 at 5113 where 3.6 spills none, and 8 of the softmax at
# 50257), so it keeps the plans without them until they are measured there (scripts/held_sass.py shows the spills).
TUNED_TRITON = "3.6."


def tuned_triton() -> bool:
    """Whether this Triton is the release the register-bound choices were measured with (``TUNED_TRITON``)."""
    return triton.__version__.startswith(TUNED_TRITON)


_DISABLED: list[str] = []  # why the held kernels stopped being used in this process (disable())


_capable = sm90  # compute capability 9.x (tests replace it)


def available(device_index: int | None = None) -> bool:
    """Whether the held kernels run here: Triton with Gluon, not the interpreter, a CUDA GPU of compute capability 9.x
    (the sizes above are sm_90's shared memory; other GPUs take the plans without them), and no compile failure so far
    in this process (``disable``)."""
    if gluon is None or _DISABLED or interpreting() or not torch.cuda.is_available():
        return False
    return _capable(device_index)


def disable(error: Exception) -> None:
    """After a held kernel failed to compile (a Triton whose Gluon moved on): warn once and use the other plans."""
    disable_after_compile_failure(_DISABLED, "the shared-memory (held) kernels do not compile", "the other plans run "
                                  "instead", error)


def packed_rows(*tensors: torch.Tensor) -> bool:
    """Whether these (M, N) views lie packed (stride N, unit column stride) and 16 bytes aligned, on one CUDA device."""
    first = tensors[0]
    return all(t.is_cuda and t.device == first.device and t.shape == first.shape and t.stride(1) == 1
               and (t.stride(0) == t.shape[1] or t.shape[0] == 1) and t.data_ptr() % 16 == 0 for t in tensors)


if gluon is not None:
    # the per-thread async copy into shared memory: async_load in newer Triton (3.9), async_copy_global_to_shared in 3.6
    # (3.9 keeps the old name only to raise; the arguments are the same)
    _async_load = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared
    # a barrier of the program's threads: gl.barrier in 3.9, gl.thread_barrier in 3.6
    thread_barrier = getattr(gl, "barrier", None) or gl.thread_barrier

    @gluon.jit
    def copy_segment(buf, x_ptr, abase, s, n_vecs, idx, BLOCK: gl.constexpr, VEC: gl.constexpr):
        # segment s of a row into shared memory: the 16-byte vectors from the row's aligned-down start that
        # overlap the row (the first and last carry a neighbour's elements, left out of the arithmetic)
        col = s * BLOCK + idx
        _async_load(buf.index(s), x_ptr + abase + col, mask=col // VEC < n_vecs)
        async_copy.commit_group()

    @gluon.jit
    def row_start(row, n_cols, VEC: gl.constexpr):
        # a packed row's aligned-down start (a multiple of VEC elements) and its shift: the elements of the vector
        # that holds its first element which lie before it
        base = row.to(gl.int64) * n_cols
        abase = base // VEC * VEC
        return abase, (base - abase).to(gl.int32)

    @gluon.jit
    def row_span(shift, n_cols, VEC: gl.constexpr):
        # counted from the row's aligned-down start (row_start): its end, and its first and last whole vectors
        # (the vectors from first_v up to last_v hold none of the neighbours' elements)
        end = shift + n_cols
        return end, gl.cdiv(shift, VEC), end // VEC

    @gluon.jit
    def edge_columns(eidx, shift, end, VEC: gl.constexpr):
        # (columns, mask) of the row's elements in its first and last partial vectors, counted from the aligned-down
        # start: eidx's first VEC lanes the first vector, the other VEC the last
        ecol = gl.where(eidx < VEC, shift // VEC * VEC + eidx, end // VEC * VEC + eidx - VEC)
        return ecol, (ecol >= shift) & (ecol < end) & ((eidx >= VEC) | (shift % VEC > 0))

    @gluon.jit
    def only_the_row(v, s: gl.constexpr, idx, shift, end, fill, BLOCK: gl.constexpr, NSEG: gl.constexpr):
        # segment s's values with the neighbours' elements made fill; only the first and the last two segments hold
        # any (the row's ends fall there), so the others pass through unmasked
        if (s == 0) | (s >= NSEG - 2):
            col = s * BLOCK + idx
            v = gl.where((col >= shift) & (col < end), v, fill)
        return v

    @gluon.jit
    def widen(v, WIDEN: gl.constexpr):
        # float32 of a loaded tensor; with WIDEN, bf16 pairs straight from their 32-bit register, one shift or AND each
        # (the compiler's conversion spends a PRMT and a shift on the odd element; docs/kernels.md, "layer_norm:
        # forward")
        if WIDEN and v.dtype == gl.bfloat16:
            bits = gl.inline_asm_elementwise("{ shl.b32 $0, $2, 16; and.b32 $1, $2, 0xffff0000; }", "=r,=r,r",
                                             [v.to(gl.uint16, bitcast=True)], dtype=gl.uint32, is_pure=True, pack=2)
            return bits.to(gl.float32, bitcast=True)
        return v.to(gl.float32)

    @gluon.jit
    def land_segment(buf, s: gl.constexpr, idx, shift, end, fill, layout: gl.constexpr, BLOCK: gl.constexpr,
                     NSEG: gl.constexpr, WIDEN: gl.constexpr = False):
        # segment s of a row copied in segment by segment, once its copy has landed: float32 (widen), the neighbours'
        # elements made fill (only_the_row) and written back as fill, so that the passes after read it unmasked
        async_copy.wait_group(NSEG - 1 - s)
        seg = buf.index(s)
        v = only_the_row(widen(seg.load(layout), WIDEN), s, idx, shift, end, fill, BLOCK, NSEG)
        if (s == 0) | (s >= NSEG - 2):
            seg.store(v.to(seg.dtype))
        return v
