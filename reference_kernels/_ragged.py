"""Rows that do not start on a 16-byte boundary: whole aligned vectors in, masked edges out.

Triton emits a 16-byte load or store only where it can prove the address 16-byte aligned
and the mask constant over the vector. In an (M, N) tensor whose row length (or stride) is
not a multiple of 16 bytes (a vocabulary of 50257, a width of 17000 in bf16) no row after
the first starts aligned, so every access of every row is scalar: the `rows` softmax runs
~1.5x the instructions, and the wide-row kernels, whose 64 KiB chunks then need one
register per element, spill (sm_90: 1488 B of stack a thread, 800 spill stores) and their
local-memory traffic swamps the row (docs/kernels.md, "Ragged rows").

The fix keeps every bulk access vectorised. A row's elements sit at *virtual* columns
``phase .. phase + N`` counted from the aligned vector that holds its first element
(``row_origin``); ``phase`` < ``VEC`` (16 bytes' worth of elements) varies row to row.

* Loads read whole aligned vectors (mask ``v < vec_end``, constant over each vector). The
  few elements of the first and last vector that belong to the neighbouring rows (or lie
  past the tensor's end, inside the same 16-byte vector, so inside the allocation's
  granule: never a fault) are replaced in registers (``in_row``).
* Stores write the vectors wholly inside the row (``body_bounds``); the at most ``VEC - 1``
  elements at each end are written by a small masked store (``edges``).

``VEC`` 1 is the aligned case: every helper reduces to the plain row arithmetic, so that
Triton's own divisibility specialisation still vectorises.

The launcher side (``phased``) checks what the kernel relies on: both row origins' phases
agree row for row (same phase at row 0, same row stride modulo ``VEC``), and the
storages start 16-byte aligned; otherwise it returns copies that do.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ._common import TRITON_DIVISIBILITY, next_power_of_2

VECTOR_BYTES = 16
# The rows plans' rules for ragged rows (softmax's and the layer-norm forward's): packed rows of no multiple of 16 up to
# PACKED_N_MAX take N as a compile-time constant ("Packed rows"); unaligned rows are read as aligned vectors from
# PHASED_ROWS_MIN_COLS ("Ragged rows"); a row in power-of-two pieces (``row_pieces``) takes a second piece only where
# more than PIECE_SLACK of its lanes would be masked, from PIECES_MIN_COLS; a row goes in pieces at all only where its
# own power of two masks PIECE_WASTE of its lanes (a piece costs two row reductions; softmax's default, the layer-norm
# forward's aligned rows)
PACKED_N_MAX = 2047
PHASED_ROWS_MIN_COLS = 2048
PIECE_SLACK = 0.125
PIECES_MIN_COLS = 256
PIECE_WASTE = 0.45


@triton.jit
def row_origin(phase0, row, stride, VEC: tl.constexpr):
    """(offset of the aligned vector holding ``row``'s first element, the row's phase in it).

    ``phase0``: the phase of row 0 (its first element's offset from an aligned address).
    """
    r0 = phase0 + row.to(tl.int64) * stride
    if VEC > 1:
        ph = (r0 % VEC).to(tl.int32)
        r0 = tl.multiple_of(r0 - ph, VEC)
    else:
        ph = 0
    return r0, ph


@triton.jit
def row_first(x_ptr, phase0, row, stride, VEC: tl.constexpr):
    """``row``'s first element in float32 (the shift the split walks' one-pass sums take)."""
    base, ph = row_origin(phase0, row, stride, VEC)
    return tl.load(x_ptr + base + ph).to(tl.float32)


@triton.jit
def vec_end(ph, n_cols, VEC: tl.constexpr):
    """End of the last vector a row of ``n_cols`` at phase ``ph`` touches: the load bound (``ph``: as in
    ``body_bounds``)."""
    if VEC > 1:
        return tl.multiple_of((ph + n_cols + VEC - 1) // VEC * VEC, VEC)
    else:
        return n_cols


@triton.jit
def in_row(v, ph, n_cols):
    """Virtual columns ``v`` that hold the row's own elements."""
    return (v >= ph) & (v < ph + n_cols)


@triton.jit
def body_bounds(ph, n_cols, VEC: tl.constexpr):
    """[first, last) virtual columns of the vectors wholly inside the row: the vectorised store's bounds.

    ``ph`` is a scalar or one phase a row (1-D; broadcast the bounds for 2-D masks: Triton's
    divisibility hint takes one value a dimension).
    """
    if VEC > 1:
        first = tl.multiple_of((ph + VEC - 1) // VEC * VEC, VEC)
        last = tl.multiple_of((ph + n_cols) // VEC * VEC, VEC)
    else:
        first = 0
        last = n_cols
    return first, last


@triton.jit
def edges(ph, n_cols, VEC: tl.constexpr):
    """(virtual columns, mask) of the row's elements outside ``body``: at most VEC - 1 at each end.

    ``ph`` may be a scalar or an (M, 1) column (one phase a row); the result has 2 * VEC columns.
    """
    e = tl.arange(0, 2 * VEC)
    first = (ph + VEC - 1) // VEC * VEC
    last = tl.maximum((ph + n_cols) // VEC * VEC, first)
    v = tl.where(e < VEC, ph + e, last + e - VEC)
    ok = tl.where(e < VEC, v < first, True) & (v < ph + n_cols)
    return v, ok


@triton.jit
def edge_words(ptr, base, ph, n_cols, VEC: tl.constexpr, TILE: tl.constexpr = 0, rows_ok=None):
    """A 16-bit row's edges as 32-bit words: ``(lo, hi, v)``, float32 values and the virtual columns of ``lo``.

    Reads the two aligned vectors that hold the edges, the one before the body ([first - VEC,
    first)) and the one after it ([max(last, first), + VEC)), as 4-byte words: a few elements a
    thread of a wide program, and a software-pipelined loop copies 4-byte loads with ``cp.async``
    (``edges``' 2-byte loads it cannot, so they stayed synchronous in the loop). ``lo`` holds the
    elements at the even columns ``v``, ``hi`` those at ``v + 1``; the row's own among them:
    ``in_row`` (the two vectors never overlap the body or each other). ``ptr + base``: the row's
    aligned origin (``row_origin``). ``ph`` is a scalar or one phase a row shaped (M, 1, 1); the
    results are (2, VEC // 2) or (M, 2, VEC // 2). Words of a vector holding none of the row read 0.
    ``TILE`` > 0: a kernel holding only the virtual columns under TILE; the second vector is then the one
    at TILE where the body reaches past it (a body vector: the caller stores it and counts it). ``rows_ok``: (M, 1, 1)
    rows that exist, for a program of several rows whose last ones may lie past the tensor (nothing of theirs is read).
    """
    start, load_ok = _edge_vector_starts(ph, n_cols, VEC, TILE)
    if rows_ok is not None:
        load_ok = load_ok & rows_ok
    words_ptr = tl.cast(ptr + base, tl.pointer_type(tl.int32))
    words = tl.load(words_ptr + (start // 2 + tl.arange(0, VEC // 2)[None, :]), mask=load_ok, other=0)
    lo, hi = _split_words(words, ptr)
    return lo, hi, edge_word_columns(ph, n_cols, VEC, TILE)


@triton.jit
def edge_word_columns(ph, n_cols, VEC: tl.constexpr, TILE: tl.constexpr = 0):
    """The virtual columns of ``edge_words``' ``lo`` values (its third result), without loading."""
    start, _ = _edge_vector_starts(ph, n_cols, VEC, TILE)
    return start + 2 * tl.arange(0, VEC // 2)[None, :]


@triton.jit
def _edge_vector_starts(ph, n_cols, VEC: tl.constexpr, TILE: tl.constexpr = 0):
    """(first column, load mask) of the two aligned vectors around the body: (2, 1), or (M, 2, 1); with TILE,
    the second one at TILE where the body reaches past it."""
    first = (ph + VEC - 1) // VEC * VEC
    last = tl.maximum((ph + n_cols) // VEC * VEC, first)
    if TILE > 0:
        last = tl.minimum(last, TILE)
    k = tl.arange(0, 2)[:, None]
    start = tl.where(k == 0, first - VEC, last)  # multiples of VEC
    # vector 0 holds some of the row where first > ph, vector 1 where ph + N > last (one tensor compare:
    # comparing scalars gives the interpreter an int32 mask that its loads refuse)
    return start, tl.where(k == 0, first, ph + n_cols) > tl.where(k == 0, ph, last)


@triton.jit
def _split_words(words, ptr):
    """The two 16-bit elements (of ``ptr``'s dtype) of each 32-bit word, in float32: (low, high)."""
    lo = (words & 0xFFFF).to(tl.int16).to(ptr.dtype.element_ty, bitcast=True).to(tl.float32)
    hi = (words >> 16).to(tl.int16).to(ptr.dtype.element_ty, bitcast=True).to(tl.float32)
    return lo, hi


def vector_elems(t: torch.Tensor) -> int:
    """Elements in a 16-byte vector of ``t``'s dtype."""
    return max(1, VECTOR_BYTES // t.element_size())


def _phase0(t: torch.Tensor, vec: int) -> int:
    return (t.data_ptr() // t.element_size()) % vec


def _storage_aligned(t: torch.Tensor) -> bool:
    return t.untyped_storage().data_ptr() % VECTOR_BYTES == 0


def _aligned_view(t: torch.Tensor, phase: int) -> torch.Tensor:
    """``t``'s storage seen from the aligned address ``phase`` elements before ``t``'s first one."""
    return t.as_strided((t.numel() + phase,), (1,), t.storage_offset() - phase)


def aligned(x2: torch.Tensor, y2: torch.Tensor) -> bool:
    """True when Triton's own specialisation already vectorises every row of ``x2`` and ``y2``: ``VEC`` 1.

    Triton marks an integer argument aligned when it is a multiple of 16 (elements, whatever
    the dtype), so the row length and strides must be, and both row 0s 16-byte aligned.
    """
    return (x2.shape[1] % TRITON_DIVISIBILITY == 0
            and all(t.data_ptr() % VECTOR_BYTES == 0 and t.stride(0) % TRITON_DIVISIBILITY == 0 for t in (x2, y2)))


class Phased(NamedTuple):
    """What a kernel built on the helpers above is launched with (``phased``)."""

    x: torch.Tensor  # flat view of x's storage from the aligned address ``phase`` elements before row 0
    y: torch.Tensor  # the same for the output
    phase: int  # row 0's phase (0 when vec == 1)
    vec: int  # the kernel's VEC: 1 when every row is aligned
    stride_x: int
    stride_y: int
    y_rows: torch.Tensor  # the (M, N) rows the kernel writes
    y_out: torch.Tensor | None  # where ``finish`` copies them, when the kernel ran on a copy

    @classmethod
    def plain(cls, x2: torch.Tensor, y2: torch.Tensor) -> "Phased":
        """The rows as they are, for Triton's own accesses (``VEC`` 1, no copies)."""
        return cls(x2, y2, 0, 1, x2.stride(0), y2.stride(0), y2, None)

    def finish(self) -> None:
        if self.y_out is not None:
            self.y_out.copy_(self.y_rows)

    def packed_width(self, n_cols: int, widest: int) -> int:
        """``n_cols`` where rows on Triton's own accesses (``plain``) lie back to back in x and y (strides N), N
        is not a multiple of 16 elements and at most ``widest``; else 0. A kernel given N as a compile-time
        constant (the rows' width and strides) knows the rows' alignment, the largest power of two dividing N,
        and loads vectors that wide where a runtime stride gave one element a load (docs/kernels.md, "Ragged
        rows", "Packed rows"). One compile a width, hence ``widest``."""
        return packed_width(n_cols, (self.stride_x, self.stride_y), widest) if self.vec == 1 and self.phase == 0 else 0


def packed_width(n_cols: int, strides: tuple, widest: int) -> int:
    """``n_cols`` where every row stride is N (rows back to back), N is not a multiple of 16 elements and at most
    ``widest``, else 0: a kernel's compile-time width (``Phased.packed_width``)."""
    return n_cols if all(s == n_cols for s in strides) and n_cols % 16 and n_cols <= widest else 0


def phased(x2: torch.Tensor, y2: torch.Tensor) -> Phased:
    """Kernel arguments for rows of ``x2`` read and rows of ``y2`` written with the helpers above.

    Where ``x2`` and ``y2`` rows have different phases (a slice of a wider tensor, an ``out``
    at an odd offset) the kernel runs on contiguous copies, which costs one extra read and
    write of the tensor concerned; call ``finish()`` after the launch.
    """
    if aligned(x2, y2):
        return Phased.plain(x2, y2)
    vec = vector_elems(x2)

    def agree() -> bool:
        return (_storage_aligned(x2) and _storage_aligned(y2) and _phase0(x2, vec) == _phase0(y2, vec)
                and (x2.stride(0) - y2.stride(0)) % vec == 0)

    y_out = None
    if not agree():
        x2 = x2.clone(memory_format=torch.contiguous_format)  # a fresh allocation: aligned, stride N
        if not agree():
            y_out, y2 = y2, torch.empty_like(x2)
    phase = _phase0(x2, vec)
    return Phased(_aligned_view(x2, phase), _aligned_view(y2, phase), phase, vec, x2.stride(0), y2.stride(0), y2, y_out)


class PhasedRows(NamedTuple):
    """What a kernel that reads several (M, N) tensors and writes several, all at one phase, is launched with
    (``phased_rows``: ``phased`` for more than one input or output)."""

    reads: tuple  # flat views of each read tensor's storage from the aligned address ``phase`` elements before row 0
    writes: tuple  # the same for each written tensor
    phase: int  # row 0's phase (0 when vec == 1)
    vec: int  # the kernel's VEC: 1 when every row is aligned
    read_strides: tuple
    write_strides: tuple
    write_rows: tuple  # the (M, N) rows the kernel writes, per written tensor
    write_outs: tuple  # per written tensor: where ``finish`` copies its rows, or None when written in place

    def finish(self) -> None:
        for rows, out in zip(self.write_rows, self.write_outs):
            if out is not None:
                out.copy_(rows)


def phased_rows(reads: tuple, writes: tuple) -> PhasedRows:
    """``phased`` for several tensors: rows of every tensor in ``reads`` and ``writes`` at the same phase, row for row.

    Where every tensor is aligned as Triton specialises (``aligned``) the rows go as they are
    (``VEC`` 1). Otherwise the tensors that do not agree with the first (phase of row 0, row
    stride modulo ``VEC``, storage alignment) run on contiguous copies: a read is cloned (one
    extra read and write of it), a write gets a fresh tensor copied out by ``finish()``.
    """
    everything = tuple(reads) + tuple(writes)
    if all(aligned(everything[0], t) for t in everything):
        return PhasedRows(tuple(reads), tuple(writes), 0, 1, tuple(t.stride(0) for t in reads),
                          tuple(t.stride(0) for t in writes), tuple(writes), (None,) * len(writes))
    vec = vector_elems(everything[0])

    def agree(a: torch.Tensor, b: torch.Tensor) -> bool:
        return (_storage_aligned(a) and _storage_aligned(b) and _phase0(a, vec) == _phase0(b, vec)
                and (a.stride(0) - b.stride(0)) % vec == 0)

    def fresh_like(t: torch.Tensor) -> bool:  # what a contiguous allocation of t's shape agrees with
        return _storage_aligned(t) and _phase0(t, vec) == 0 and (t.stride(0) - t.shape[1]) % vec == 0

    reads = list(reads)
    if not all(agree(reads[0], t) for t in everything):
        reads = [t if fresh_like(t) else t.clone(memory_format=torch.contiguous_format) for t in reads]
    rows = [t if agree(reads[0], t) else torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in writes]
    outs = [None if r is t else t for r, t in zip(rows, writes)]
    phase = _phase0(reads[0], vec)
    return PhasedRows(tuple(_aligned_view(t, phase) for t in reads), tuple(_aligned_view(t, phase) for t in rows), phase,
                      vec, tuple(t.stride(0) for t in reads), tuple(t.stride(0) for t in rows), tuple(rows), tuple(outs))


def row_pieces(need: int, vec: int, max_pieces: int, slack: float) -> tuple[int, int, int]:
    """Up to ``max_pieces`` (at most 3) powers of two, side by side, covering ``need`` virtual columns, 0s after.

    A rows kernel holds a row as these pieces instead of one power of two, so that few of its
    lanes are masked: 16-bit rows are issue-bound and a masked lane costs what a loaded one
    does (4104 lanes for a 4097-wide bf16 row, not 8192). Largest power of two first, the
    last rounded up (at least ``vec``, so every piece starts on a vector); the fewest pieces
    that leave at most ``slack`` of the lanes masked, else the fewest masked lanes (each piece
    costs its own reductions). One piece: ``need``'s own power of two.
    """
    best = (next_power_of_2(need), 0, 0)
    for count in range(2, min(max_pieces, 3) + 1):
        pieces, rest = [], need
        while rest > 0 and len(pieces) < count - 1:
            p = 1 << (rest.bit_length() - 1)
            pieces.append(p)
            rest -= p
        if rest > 0:
            pieces.append(max(vec, next_power_of_2(rest)))
        if sum(pieces) < sum(best):
            best = (tuple(pieces) + (0, 0))[:3]
        if sum(best) - need <= slack * sum(best):
            break
    return best


def ragged_width(n_cols: int, elem_size: int) -> int:
    """Virtual columns of a contiguous row of ``n_cols``: the row plus the widest phase when rows are unaligned."""
    return n_cols if n_cols % TRITON_DIVISIBILITY == 0 else launch_width(n_cols, max(1, VECTOR_BYTES // elem_size))


def launch_width(n_cols: int, vec: int) -> int:
    """Virtual columns a launch must cover: the row plus the widest phase."""
    return n_cols + vec - 1 if vec > 1 else n_cols


__all__ = ["row_origin", "row_first", "vec_end", "in_row", "body_bounds", "edges", "edge_words", "edge_word_columns",
           "phased", "phased_rows", "launch_width", "vector_elems", "row_pieces"]
