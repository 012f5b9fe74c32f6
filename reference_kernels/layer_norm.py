"""Fused layer norm over the last dimension: forward and backward, for any row width.

Forward reads ``x`` once and writes ``y`` once (plus float32 ``mean`` and ``rstd`` per row, kept for the backward).
Backward reads ``x`` and ``dy`` once, writes ``dx`` once and reduces ``dweight``/``dbias`` deterministically: each
program sums its rows into its own float32 share row, and a small kernel adds the shares in a fixed order, so two runs
give bitwise-identical gradients (no atomics).

Read top-down: the plan (``_Plan``, ``Tuning`` — the widths measured on one GPU and Triton, data in
``tuned/<arch>.json`` — and ``_layer_norm_settings``, with the rules that pick the Gluon plans of ``_layer_norm_held``),
then the launches, then the public functions (``forward``, ``backward``, ``fused``, ``unfused``, ``budget``). The
Triton kernels are ``_layer_norm_kernels``'. docs/kernels.md, "layer_norm: forward" and "layer_norm: backward", says
what each plan is, where it is picked and what it measured.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import torch

from pytest_fusioncheck.budget import Budget

from . import _layer_norm_held
from . import _device
from ._common import (ELEMS_PER_THREAD, MAX_ROW, RESIDENT_WARPS, ROWS_TILE, as_rows, cdiv, check_tensor,
                      define_op, eager_only, float32_pair, inference_result, interpreting, next_power_of_2, output_like,
                      reg_cap, rows_cols, traced_result, tracing, wants_grad, warps_for)
from ._device import Device
from ._ragged import (PACKED_N_MAX, PHASED_ROWS_MIN_COLS, PIECE_SLACK, PIECE_WASTE, PIECES_MIN_COLS, VECTOR_BYTES,
                      Phased, launch_width, packed_width, phased, phased_rows, ragged_width, row_pieces)
from ._split_walk import (COUNTER_STRIDE_INTS, MAX_SPLIT_GROUP, SPLIT_CHUNK_BYTES, SPLIT_PER_SM, SPLIT_WARPS,
                          split_group, split_run)
from ._launch import Calls, launch as launch_kernel, write_only
from ._layer_norm_kernels import (
    _FROM_STATS,
    _ONE_PASS,
    _ROWS,
    _STATS,
    _layer_norm_bwd_flat_kernel,
    _layer_norm_bwd_kernel,
    _layer_norm_bwd_lean_kernel,
    _layer_norm_bwd_phased_kernel,
    _layer_norm_dwdb_kernel,
    _layer_norm_fwd_kernel,
    _layer_norm_fwd_looped_kernel,
    _layer_norm_fwd_split_kernel,
)

# --------------------------------------------------------------------------- plan


class _Plan(NamedTuple):
    """How one layer-norm pass is launched; ``_layer_norm_settings`` makes it."""

    mode: str  # "rows"; forward "split", "looped"; backward "one_pass", "two_pass"
    block_m: int
    block_n: int
    num_warps: int
    n_groups: int = 1  # backward: row groups, each summed into its own dweight/dbias share
    variant: str = "measured"  # backward only: "measured" (_layer_norm_bwd_kernel) or "lean" (_layer_norm_bwd_lean_kernel)
    max_regs: int | None = None  # backward lean and phased, forward unaligned rows: ptxas register cap (maxnreg), None for ptxas's choice
    group: int = 1  # forward "split": programs (slices) per row
    per_sm: int = 0  # forward "split": programs launched per SM
    prefetch: bool = False  # backward "rows" (measured kernel): the next row block's loads in flight meanwhile
    stages: int = 1  # backward "phased" and "flat": pipelining depth of the row loop (rows in flight: stages - 1)
    block_t: int = 0  # backward "phased": a second piece of the row, from block_n on (_ragged.row_pieces)
    block_u: int = 0  # backward "phased": a third piece, from block_n + block_t on


# The plans' shape parameters: what each plan is and why is docs/kernels.md, "layer_norm: forward" and "layer_norm:
# backward" (each section named below); the widths where a plan is taken are data (``Tuning``, tuned/<arch>.json).
# The figures behind each value are in those sections and in git's history, not here.

# forward, whole rows ("The rows kernel", as softmax's): rows up to MAX_ROW held whole, ROWS_TILE elements a program
# (_common), ragged rows as softmax's (PACKED_N_MAX, PHASED_ROWS_MIN_COLS, PIECE_SLACK, PIECES_MIN_COLS: _ragged)
# fp32 aligned rows load weight and bias before x where the Tuning's rule says (``_params_first``; "fp32 aligned rows
# against Liger's shape")
# forward rows held or streamed by _layer_norm_held ("One pass for the statistics", "Rows streamed past the held
# weight", "Rows under 1025"): where and on which programs are the Tuning's choices (sm_90 only)
# aligned 16-bit rows whose power-of-two tile masks lanes take twice ROWS_TILE elements a program, twice the rows
# ("Aligned 16-bit rows"; packed ones of a multiple of _PACKED_ROWS_MULTIPLE too: ``_forward_rows_tile``)
# rows past MAX_ROW ("The split walk"): fp32 "split" with slices held in registers, 16-bit "looped" (``wide=`` names
# one of _WIDE_PLANS: "auto" is that rule)
_CHUNK = 4096  # looped steps
_WIDE_PLANS = ("auto", "split", "looped")
_SPLIT_HOLD_MIN_ELEM_SIZE = 4  # slices held in registers: fp32 only
# held slices: one SPLIT_CHUNK_BYTES step at least, wider for wider rows (up to MAX_SPLIT_GROUP a row), while a
# ``warps_for`` program holds one at ELEMS_PER_THREAD a thread (fp32: 64 KiB on 16 warps)
_LOOPED_WARPS = 16

# backward, rows ("layer_norm: backward"): rows up to one _BWD_ROWS_TILE-element tile, a tile a step, on _BWD_WARPS
# warps, _BWD_PROGRAMS_PER_SM row groups an SM; 16-bit rows that fill a program of _BWD_NARROW_WARPS warps at one
# 16-byte vector a thread (513-1024) a row a step, RESIDENT_WARPS an SM (narrower ones lost to the tile, bf16 64
# 89 -> 18); wider rows on the lean kernel, whole or in _BWD_CHUNK chunks ("one_pass"; the measured kernel's chunks
# where it is asked for)
_BWD_ROWS_TILE = 4096
_BWD_WARPS = 8
_BWD_PROGRAMS_PER_SM = 2
_BWD_NARROW_WARPS = 4
_BWD_CHUNK = 2048
# dweight/dbias: share rows summed per program of the first level (the second adds the splits), a step a tile of
# _BWD_ROWS_TILE elements in _DWDB_BLOCK_N-column rows on the warps that hold it (``warps_for``)
_DWDB_GROUPS_PER_SPLIT = 32
_DWDB_BLOCK_N = 256
_SUM_HERE_BYTES = 256 << 10  # shares summed by the rows backward's last group, in its launch, up to this size
# the backward kernel where no other plan takes the row: "lean" (a row a step, the next row's loads in flight) past
# _BWD_ROWS_TILE; "measured" up to it (it lost past it, its chunks too)
_BWD_VARIANTS = ("measured", "lean", "phased", "flat")

# rows that start unaligned ("Ragged rows", "Packed rows"): the forward rows plan reads aligned vectors from
# PHASED_ROWS_MIN_COLS columns; packed rows take N at compile time up to PACKED_N_MAX, those of a multiple of
# _PACKED_ROWS_MULTIPLE (8-byte 16-bit vectors) in packed_rows_band on the rows plan, and the masked-rows tile
_PACKED_ROWS_MULTIPLE = 4
# pieces ("Rows in pieces, ragged or aligned (forward)"; softmax's rule, _ragged.row_pieces): up to _ROW_PIECES; aligned
# rows keep their power of two unless it masks PIECE_WASTE (_ragged), or unless the later pieces are a sliver (at most
# 1/_SLIVER of its lanes, blocks up to _SLIVER_MAX_SINGLE; 16-bit rows only)
_ROW_PIECES = 3
_SLIVER_MAX_SINGLE = {2: 4096, 4: 8192}
_SLIVER = 128
# aligned 16-bit rows in two JOINT pieces (aligned_pieces_16bit, "Aligned 16-bit rows"): a second piece of
# aligned_pieces_min_lanes or more, capped for RESIDENT_WARPS
# the forward rows plan on aligned vectors: fp32 rows, _PHASED_ROWS_ELEMS elements a thread (the phased backward's
# threads hold as many: half of x, half of dy)
_PHASED_MIN_ELEM_SIZE = 4
_PHASED_ROWS_ELEMS = 16  # 8-32 warps, 80-84 registers uncapped: capped for RESIDENT_WARPS

# backward, pipelined whole rows ("Pipelined whole rows", "Aligned 16-bit rows in pieces"): _PHASED_BWD_ELEMS elements
# of x and of dy a thread, so rows of up to _PHASED_BWD_MAX_ROW lanes on RESIDENT_WARPS warps (16384 spilled there) and
# a tail of one element a thread (8191 holds as 8192 + 8), programs to RESIDENT_WARPS warps an SM, _BWD_STAGES - 1
# rows of x and dy in flight within the shared memory an SM has
_PHASED_BWD_ELEMS = _PHASED_ROWS_ELEMS // 2
_PHASED_BWD_MAX_ROW = 32 * RESIDENT_WARPS * _PHASED_BWD_ELEMS
_PHASED_BWD_MAX_TAIL = 32 * RESIDENT_WARPS
_BWD_STAGES = 3  # the pipelined backward plans (phased, flat): two rows or windows in flight
# two pieces where the power of two masks PIECE_SLACK of the lanes (ragged rows, fp32 under 4096), as the forward's
_PHASED_BWD_PIECES = 2
# a 16-bit one-vector tail read with the edges as 32-bit words (TAIL) up to this first piece
_PHASED_BWD_TAIL_WORDS_MAX = 4096
# 16-bit aligned rows in two pieces (the second at least 16 lanes: the rows are), the register cap
# by its lanes; three pieces, a one-lane third piece loaded a row ahead (AHEAD), first pieces unmasked (FULL), pieces
# merged into one reduction (MERGE): _phased_ahead, _full_first, _merge_pieces; the cap: the Tuning's
# phased_bwd_aligned_piece_max_regs

# backward, rows laid flat ("Rows laid flat"): windows of whole rows in a tile of _FLAT_BWD_TILE lanes (16-bit: one
# 16-byte vector a thread on RESIDENT_WARPS warps) or half of it (two programs an SM), cut in _FLAT_BWD_SEGMENT-lane
# segments, where the tile holds the Tuning's flat_bwd_min_gain more of its lanes in use than the plan it replaces
_FLAT_BWD_TILE = 32 * RESIDENT_WARPS * VECTOR_BYTES // 2
_FLAT_BWD_SEGMENT = 256
_FLAT_BWD_MAX_SEGMENTS = 64  # segments a tile at most (the row sums add segments through an (S, S) mask)

# backward, the lean kernel: one 16-byte vector a thread, whole rows up to the rows plan's tile (_BWD_ROWS_TILE), else
# _BWD_CHUNK chunks; the register cap for RESIDENT_WARPS, but 16-bit chunks, which spill there: _LEAN_CHUNKS_16BIT_REGS
_LEAN_CHUNKS_16BIT_REGS = 80
# chunked plans: one_pass while a row's chunks are co-resident (the device's SMs x programs an SM), else two_pass;
# beyond _MAX_CHUNKS chunks a row the chunks (and the looped forward's steps) widen
_MAX_CHUNKS = 4096


def _resident_regs(device: Device) -> int:
    """The register cap (``maxnreg``) that lets ``RESIDENT_WARPS`` warps an SM reside: 64 on sm_80-sm_100."""
    return reg_cap(device.regs_per_sm, RESIDENT_WARPS)


@dataclasses.dataclass(frozen=True)
class Tuning:
    """The width bands measured on one kind of GPU and Triton (``tuned/<arch>.json``, "layer_norm"): where a plan or a
    kernel option won there. By element size: pairs (2 or 4, value). The defaults take none of them: the base plans
    (rows, the split walk and the looped rows forward; rows, phased past the rows plan's widest row, lean and chunked
    backward) and the held kernels nowhere.
    docs/kernels.md, "layer_norm: forward" and "layer_norm: backward", gives each band with its figures."""

    # forward: which plan
    held_fwd_min_cols: tuple = ()  # ragged rows held (_layer_norm_held) from this width
    held_fwd_aligned_bands: tuple = ()  # aligned rows held in these bands
    stream_fwd_min_cols: tuple = ()  # ragged rows streamed past the held weight from this width
    stream_fwd_aligned_min_cols: tuple = ()  # aligned rows streamed from this width ...
    # ... and (from width, share): from that width, where the rows plan's power-of-two block holds at most that share
    # of lanes, while the narrow streamed shape holds the row (_block_underused)
    stream_fwd_aligned_max_use: tuple = ()
    stream_fwd_bands: tuple = ()  # ragged rows streamed in these bands before the held plan is asked
    held_fwd_even_min_cols: int = 0  # even rows under this width keep the rows plan's 4-byte pairs, not held ...
    stream_fwd_even_max_warps: int = 0  # ... nor streamed but 16-bit ones on programs of at most these warps
    stream_fwd_16bit_most: tuple | None = None  # 16-bit rows stream on programs of at most (segments, warps)
    packed_rows_band: tuple | None = None  # packed ragged rows of a multiple of 4 on the rows plan, NARROW
    # forward: the rows kernel's options
    masked_rows_16bit: tuple | None = None  # 16-bit rows that mask lanes take the masked-rows tile
    aligned_pieces_16bit: tuple | None = None  # 16-bit aligned rows in two JOINT pieces ...
    aligned_pieces_min_lanes: int | None = None  # ... where the second has at least these lanes
    aligned_pieces_block_warps_tails: tuple | None = None  # aligned pieces whose tails keep their block's warps
    joint_16bit_min_cols: int | None = None  # JOINT statistics on one tile from here (bf16)
    joint_fp16_min_cols: int | None = None  # ... and fp16
    rows_widen_bands: tuple = ()  # bf16 aligned rows widened by a shift (CUDA)
    # fp32 aligned rows load weight and bias first: (from this width, where they fill this share of their block, of
    # blocks up to this many lanes, and this share of a wider one)
    fwd_params_first: tuple | None = None
    # backward: which plan
    held_bwd_bands: tuple = ()  # a band of ragged rows held where the phased plan does not take them
    # ragged and aligned rows on the phased plan from here; by default past the rows plan's widest row, where a row no
    # longer fits one rows program and the phased plan still holds it whole (not a band; docs/kernels.md, "Planning")
    phased_bwd_min_cols: tuple = ((2, _BWD_ROWS_TILE + 1), (4, _BWD_ROWS_TILE + 1))  # by element size
    phased_bwd_aligned_min_cols: int | None = _BWD_ROWS_TILE + 1  # ...
    phased_bwd_aligned_16bit: tuple | None = None  # ... and 16-bit aligned ones in this band
    phased_bwd_aligned_fp32: tuple | None = None  # ... and fp32 aligned ones in this band
    flat_bwd_16bit: tuple | None = None  # 16-bit aligned rows laid flat in this band ...
    flat_bwd_min_gain: float | None = None  # ... where their tile uses this share of its lanes more than the other plan
    flat_bwd_also: tuple = ()  # ... and these widths
    # backward: the phased and rows kernels' options
    phased_bwd_aligned_pieces_16bit: tuple = ()  # 16-bit aligned rows in two pieces
    phased_bwd_aligned_three_pieces_16bit: tuple = ()  # ... in three ...
    phased_bwd_aligned_piece_max_regs: tuple = ()  # ... capped at (the later pieces' lanes up to, registers) pairs
    phased_bwd_tail_max_regs: int | None = None  # register cap of a tail read as words (Triton 3.6's ptxas)
    bwd_prefetch_16bit_min: int | None = None  # 16-bit rows wider than this prefetch the next row block


DEFAULT_TUNING = Tuning()


def _tuning(device: Device) -> Tuning:
    """The layer norm's choices on ``device``: its tuned file's where this Triton matches it, else ``DEFAULT_TUNING``."""
    return _device.tuning("layer_norm", device, DEFAULT_TUNING)


def _layer_norm_settings(
    n_rows: int,
    n_cols: int,
    elem_size: int,
    *,
    backward: bool = False,
    device: Device = _device.INTERPRETER,
    max_row: int | None = None,
    one_pass: bool | None = None,
    variant: str | None = None,
    wide: str | None = None,
    phased_ok: bool = True,
    flat_ok: bool = True,
    packed: bool = False,
    tuning: Tuning | None = None,
) -> _Plan:
    """The launch plan of a forward or backward pass over an (n_rows, n_cols) input.

    ``max_row`` overrides the widest row held by one program (and is then the chunk or
    step width), ``one_pass`` forces the backward's one-pass (never under the interpreter) or
    two-pass chunked plan: tests use both to reach every code path with small shapes. ``variant``
    ("measured", "lean", "phased" or "flat") forces the backward kernel at every shape ("phased": whole
    rows only; "flat": aligned rows of at most ``_FLAT_BWD_MAX_SEGMENTS`` segments); left out, rows that start
    unaligned (N not a multiple of 16) from
    ``phased_bwd_min_cols`` up to ``_PHASED_BWD_MAX_ROW`` take "phased" where ``phased_ok`` (dy in
    x's dtype), 16-bit aligned rows that ``_flat_backward`` names take "flat" where ``flat_ok`` too (x and
    dy contiguous from a 16-byte aligned address), else "lean" past the rows plan's widest row, where it measured
    faster, and "measured" elsewhere. ``packed`` (the
    rows lie back to back, strides N): unaligned rows that ``_packed_rows`` names take the rows plan,
    not the phased backward.
    ``wide`` names the forward plan for rows wider than ``MAX_ROW`` (``_WIDE_PLANS``; "auto": fp32 "split", 16-bit
    "looped"); as in softmax, an explicit "split" is refused under the interpreter.
    """
    if variant is not None and variant not in _BWD_VARIANTS:
        raise ValueError(f"unknown backward variant {variant!r}; expected one of {_BWD_VARIANTS}")
    t = _tuning(device) if tuning is None else tuning
    if backward and (variant == "flat" or (variant is None and max_row is None and phased_ok and flat_ok
                                            and _flat_backward(n_cols, elem_size, t))):
        return _flat_backward_plan(n_rows, n_cols, elem_size, device)
    if backward and (variant == "phased" or (variant is None and max_row is None and phased_ok
                                              and _phased_backward(n_cols, elem_size, t)
                                              and not (packed and _packed_rows(n_cols, t)))):
        return _phased_backward_plan(n_rows, n_cols, elem_size, device)
    if backward and (variant == "lean" or (variant is None and n_cols > _BWD_ROWS_TILE)):
        return _lean_backward_plan(n_rows, n_cols, elem_size, device, max_row, one_pass)
    widest = max_row if max_row is not None else (_BWD_ROWS_TILE if backward else MAX_ROW)
    # the columns a forward rows program covers: the widest phase too where it reads aligned vectors (_ragged)
    width = ragged_width(n_cols, elem_size) if not backward and _phase_rows(n_cols, elem_size) else n_cols
    if not backward and width != n_cols and width <= widest:  # unaligned rows read as aligned vectors
        block_n = next_power_of_2(width)
        block_m = max(1, min(ROWS_TILE // block_n, next_power_of_2(n_rows)))
        warps = max(warps_for(block_m * block_n), min(32, block_m * block_n // (32 * _PHASED_ROWS_ELEMS)))
        return _Plan("rows", block_m, block_n, warps, max_regs=_resident_regs(device))
    if width <= widest:
        block_n = next_power_of_2(width)
        if backward and elem_size == 2 and block_n == 32 * _BWD_NARROW_WARPS * VECTOR_BYTES // elem_size:
            block_m, warps, per_sm = 1, _BWD_NARROW_WARPS, RESIDENT_WARPS // _BWD_NARROW_WARPS
        else:
            tile = _BWD_ROWS_TILE if backward else _forward_rows_tile(n_cols, elem_size, packed, t)
            block_m = max(1, min(tile // block_n, next_power_of_2(n_rows)))
            warps = _BWD_WARPS if backward else warps_for(block_m * block_n)
            per_sm = _BWD_PROGRAMS_PER_SM
        least = t.bwd_prefetch_16bit_min
        prefetch = backward and elem_size == 2 and max_row is None and least is not None and n_cols > least
        plan = _Plan("rows", block_m, block_n, warps, prefetch=prefetch)
        n_chunks = 1
    elif not backward:  # wider rows, and unaligned ones whose phase overflows the 16384 block (16383)
        return _wide_forward_plan(n_cols, elem_size, wide, max_row)
    else:
        chunk = next_power_of_2(max_row) if max_row is not None else _BWD_CHUNK
        block_n = max(chunk, next_power_of_2(cdiv(n_cols, _MAX_CHUNKS)))
        n_chunks = cdiv(n_cols, block_n)
        if one_pass and interpreting():
            raise ValueError("the one-pass chunked plan waits on other programs: it cannot run under the interpreter")
        per_sm = _BWD_PROGRAMS_PER_SM
        if one_pass is None:  # while a row's chunks are co-resident, as the one pass's exchange needs
            one_pass = not interpreting() and n_chunks <= device.sms * per_sm
        plan = _Plan("one_pass" if one_pass else "two_pass", 1, block_n, _BWD_WARPS)
    if backward:
        row_blocks = cdiv(n_rows, plan.block_m)
        plan = plan._replace(n_groups=max(1, min(row_blocks, (device.sms * per_sm) // n_chunks)))
    return plan


def _wide_forward_plan(n_cols: int, elem_size: int, wide: str | None, max_row: int | None) -> _Plan:
    """The forward's plan for rows wider than ``MAX_ROW`` (``wide``, default "auto").

    "looped": one program a row. "split": ``_layer_norm_fwd_split_kernel``, fp32 slices of one step
    held in registers (32 elements a thread, a few programs an SM) while they fit, else 16 KB steps.
    """
    plan = wide or "auto"
    if plan not in _WIDE_PLANS:
        raise ValueError(f"unknown wide-row plan {plan!r}; choose one of {_WIDE_PLANS}")
    if plan == "auto":
        plan = "split" if elem_size >= _SPLIT_HOLD_MIN_ELEM_SIZE else "looped"
    if plan == "looped":
        chunk = next_power_of_2(max_row) if max_row is not None else _CHUNK
        return _Plan("looped", 1, max(chunk, next_power_of_2(cdiv(n_cols, _MAX_CHUNKS))), _LOOPED_WARPS)
    row_bytes = n_cols * elem_size
    slice_bytes = next_power_of_2(max(SPLIT_CHUNK_BYTES, cdiv(row_bytes, MAX_SPLIT_GROUP)))
    slice_cols = slice_bytes // elem_size
    hold = (max_row is None and elem_size >= _SPLIT_HOLD_MIN_ELEM_SIZE
            and slice_cols <= 32 * warps_for(slice_cols) * ELEMS_PER_THREAD)
    if max_row is not None:
        chunk, warps, per_sm = next_power_of_2(max_row), SPLIT_WARPS, SPLIT_PER_SM
    elif hold:
        chunk = slice_cols
        warps = warps_for(chunk)
        per_sm = max(1, 16 // warps)
    else:
        chunk, warps, per_sm = SPLIT_CHUNK_BYTES // elem_size, SPLIT_WARPS, SPLIT_PER_SM
    group = split_group(n_cols, chunk, min(MAX_SPLIT_GROUP, cdiv(row_bytes, slice_bytes)))[0]
    if group > 1 and interpreting():
        if wide == "split":
            raise ValueError("the split plan waits on other programs: it cannot run under the interpreter")
        group = 1
    return _Plan(plan, 1, chunk, warps, group=group, per_sm=per_sm)


def _phase_rows(n_cols: int, elem_size: int) -> bool:
    """Whether the forward ``rows`` plan reads unaligned rows as aligned vectors (``_ragged``)."""
    return n_cols >= PHASED_ROWS_MIN_COLS and elem_size >= _PHASED_MIN_ELEM_SIZE


def _phased_bwd_pieces(n_cols: int, elem_size: int, t: Tuning | None = None) -> tuple[int, int, int] | None:
    """(BLOCK_N, BLOCK_T, BLOCK_U) of the phased backward for a contiguous (n_cols)-wide input, or None past what it
    holds: ``_PHASED_BWD_MAX_ROW`` lanes, or a first piece of that many and a tail of ``_PHASED_BWD_MAX_TAIL``."""
    aligned = _aligned_16bit_bwd_pieces(n_cols, elem_size, t)
    if aligned is not None:
        return aligned
    vec = max(1, 16 // elem_size)
    need = ragged_width(n_cols, elem_size)
    block_n, block_t, _ = row_pieces(need, vec, _PHASED_BWD_PIECES, PIECE_SLACK)
    pieces = n_cols % 16 != 0 or (elem_size >= 4 and n_cols < 4096)
    if elem_size < 4 and block_t > vec:  # 16-bit: only a one-vector tail (wider ones lost to edge words)
        pieces = False
    if (not pieces
            or next_power_of_2(need) - need < PIECE_SLACK * next_power_of_2(need)):
        block_n, block_t = next_power_of_2(need), 0
    if block_n > _PHASED_BWD_MAX_ROW or (block_n + block_t > _PHASED_BWD_MAX_ROW and block_t > _PHASED_BWD_MAX_TAIL):
        return None
    if block_t == vec == 8 and block_n <= _PHASED_BWD_TAIL_WORDS_MAX:
        # the one-vector tail read as words with the edges
        block_t = 0
    return block_n, block_t, 0


def _merge_pieces(block_n: int, block_t: int, warps: int, elem_size: int, block_u: int = 0) -> int:
    """``MERGE`` of the phased backward: its threads where the rows are 16-bit (fp32
    pieces lost: docs/kernels.md, "Aligned 16-bit rows in pieces") and a row in two pieces (or three) gives every
    thread lanes of each, at most one 16-byte vector of each (each piece a multiple of the threads), so that a thread's
    lanes are side by side, its sums move no data, and the pieces' row sums go through one block reduction instead of
    one each; else 0. (More than a vector a thread repeats the layout every vector: the reshape would go through shared
    memory, as it did in the forward.)"""
    threads = 32 * warps
    return threads if (elem_size == 2 and block_t >= threads and block_n % threads == 0
                       and block_t % threads == 0 and block_u % threads == 0 and block_n // threads <= 8) else 0


def _phased_ahead(block_u: int, warps: int, elem_size: int) -> bool:
    """``AHEAD`` of the phased backward: a 16-bit row's third piece of fewer than two
    lanes a thread (2-byte loads, which ``cp.async`` does not copy: synchronous in the pipelined loop, ``LDG.U16`` in
    the sm_90 SASS) loaded a row ahead into registers. Second pieces load the same way but keep it: with several
    programs an SM, or 64 registers, the row ahead lost (docs/kernels.md, "Aligned 16-bit rows in pieces")."""
    return elem_size == 2 and 0 < block_u < 2 * 32 * warps


def _full_first(block_n: int, block_t: int, n_cols: int, vec: int, prefetch: bool, ahead: bool) -> bool:
    """``FULL`` of the phased backward: aligned rows (``vec`` 1: every row at phase 0)
    held in pieces, whose first piece of ``block_n`` columns lies inside every row, take it without masks; not with a
    third piece a row ahead (``ahead``: ``_phased_ahead``), where it lost."""
    return (vec == 1 and block_t > 0 and n_cols > block_n and not prefetch
            and not ahead)


def _phased_bwd_warps(spread: int, elem_size: int) -> int:
    """Warps of the phased backward for ``spread`` lanes at ``_PHASED_BWD_ELEMS`` a thread (4 to RESIDENT_WARPS)."""
    return max(4, min(RESIDENT_WARPS, next_power_of_2(cdiv(spread, 32 * _PHASED_BWD_ELEMS))))


def _tail_in_words(block_n: int, block_t: int, n_cols: int, vec: int) -> bool:
    """``TAIL`` of the phased backward: 16-bit rows read with their edges as words (``vec`` 8) held as
    one piece that stops short of the launch's width (``_phased_bwd_pieces`` turned a one-vector tail piece into
    words), so the words hold the row's last vector."""
    return vec == 8 and block_t == 0 and block_n < launch_width(n_cols, vec)


def _aligned_16bit_bwd_pieces(n_cols: int, elem_size: int, t: Tuning | None = None) -> tuple[int, int, int] | None:
    """The pieces (BLOCK_N, BLOCK_T, BLOCK_U) in which the phased backward holds a 16-bit aligned row, or None (one
    power of two): two in a band of ``phased_bwd_aligned_pieces_16bit`` (the second of at least
    16 lanes, as the aligned row's remainder is), three in a band of ``phased_bwd_aligned_three_pieces_16bit``
    where all three merge on the first piece's warps (``_merge_pieces``: one reduction a row)."""
    t = t or DEFAULT_TUNING
    if elem_size >= 4 or n_cols % 16:
        return None
    if _in_any(t.phased_bwd_aligned_pieces_16bit, n_cols):
        block_n, block_t, _ = row_pieces(n_cols, 1, 2, PIECE_SLACK)
        if block_t > 0 and block_n + block_t <= _PHASED_BWD_MAX_ROW:
            return block_n, block_t, 0
    if _in_any(t.phased_bwd_aligned_three_pieces_16bit, n_cols):
        block_n, block_t, block_u = row_pieces(n_cols, 1, 3, 0.0)
        if (block_u > 0 and block_n + block_t + block_u <= _PHASED_BWD_MAX_ROW
                and _merge_pieces(block_n, block_t, _phased_bwd_warps(block_n, elem_size), elem_size, block_u)):
            return block_n, block_t, block_u
    return None


def _phased_backward(n_cols: int, elem_size: int, t: Tuning | None = None) -> bool:
    """Whether the backward's default plan for rows of ``n_cols`` is "phased" (dy in x's dtype): aligned rows held in
    three pieces too, outside the aligned bands."""
    t = t or DEFAULT_TUNING
    held = _phased_bwd_pieces(n_cols, elem_size, t)
    if held is None:
        return False
    if n_cols % 16 == 0:
        band = t.phased_bwd_aligned_16bit if elem_size < 4 else t.phased_bwd_aligned_fp32
        least = t.phased_bwd_aligned_min_cols
        return (least is not None and n_cols >= least) or _in(band, n_cols) or held[2] > 0
    least = _sized(t.phased_bwd_min_cols, elem_size)
    return least is not None and n_cols >= least


def _phased_backward_plan(n_rows: int, n_cols: int, elem_size: int, device: Device) -> _Plan:
    """The plan of ``_layer_norm_bwd_phased_kernel``: whole rows, a multiple of VEC programs walking rows,
    ``_PHASED_BWD_ELEMS`` elements of x and dy a thread (up to 32 warps), capped at 64 registers
    (no spills in an sm_90 compile), as many programs as fill ``RESIDENT_WARPS``. Aligned 16-bit
    rows in two pieces (``_aligned_16bit_bwd_pieces``): warps for the first piece, the register cap of
    ``phased_bwd_aligned_piece_max_regs`` (Triton 3.6's ptxas; else the resident cap) and the programs an SM that it
    lets fit."""
    vec = max(1, 16 // elem_size)
    t = _tuning(device)
    held = _phased_bwd_pieces(n_cols, elem_size, t)
    if held is None:
        raise ValueError(f"the phased backward holds whole rows up to {_PHASED_BWD_MAX_ROW} columns (and a tail of "
                         f"{_PHASED_BWD_MAX_TAIL} past them), not {n_cols}")
    block_n, block_t, block_u = held
    aligned_pieces = _aligned_16bit_bwd_pieces(n_cols, elem_size, t) is not None
    first_only = aligned_pieces
    warps = _phased_bwd_warps(block_n if first_only else block_n + block_t, elem_size)
    per_sm = max(1, RESIDENT_WARPS // warps)
    max_regs = _resident_regs(device)
    if aligned_pieces:  # the cap for the later pieces' width, and the programs an SM that it lets fit
        caps = t.phased_bwd_aligned_piece_max_regs
        max_regs = next((cap for widest, cap in caps if block_t + block_u <= widest), max_regs)
        per_sm = max(1, min(per_sm, device.regs_per_sm // (warps * 32 * max_regs)))
    elif _tail_in_words(block_n, block_t, n_cols, 1 if n_cols % 16 == 0 else vec) and t.phased_bwd_tail_max_regs:
        # the row's power of two and its tail in words (TAIL): a cap of their own, as the register file allows
        max_regs = max(max_regs, min(t.phased_bwd_tail_max_regs, reg_cap(device.regs_per_sm, warps)))
        per_sm = max(1, min(per_sm, device.regs_per_sm // (warps * 32 * max_regs)))
    stages = _BWD_STAGES
    if stages > 1:  # x and dy, stages - 1 rows each, in shared memory
        held_bytes = (stages - 1) * (block_n + block_t + block_u) * elem_size * 2
        per_sm = max(1, min(per_sm, device.smem_per_sm // held_bytes))
    n_groups = min(device.sms * per_sm, n_rows)
    if n_cols % vec:  # rows at several phases: a multiple of vec programs, rounded down (one more than the
        n_groups = max(vec, n_groups // vec * vec)  # SMs hold runs its whole share after the rest: bf16 8192 45% -> 78%)
    return _Plan("rows", 1, block_n, warps, n_groups, "phased", max_regs, prefetch=False,
                 stages=stages, block_t=block_t, block_u=block_u)


def _flat_shape(n_cols: int) -> tuple[int, int, int, int]:
    """(P, K, R, S) of the flat backward for rows of ``n_cols``: segments of P lanes (the widest power of two up
    to ``_FLAT_BWD_SEGMENT`` that divides the row), K of them a row, R rows a window, S segments a tile (a power
    of two, at most ``_FLAT_BWD_TILE`` lanes and ``_FLAT_BWD_MAX_SEGMENTS`` segments), or at most half that many
    lanes where those hold as large a share of their lanes in use and two rows or more. ValueError where one row does
    not fit."""
    tile, segments = _FLAT_BWD_TILE, _FLAT_BWD_MAX_SEGMENTS
    seg = min(_FLAT_BWD_SEGMENT, n_cols & -n_cols)
    k = n_cols // seg
    most = min(tile // seg, segments)
    if k > most:
        raise ValueError(f"the flat plan holds rows of up to {most} segments of {seg} lanes, not {n_cols} columns")
    r = most // k
    r_small = min(tile // 2 // seg, segments) // k
    if r_small >= 2 and r_small * k * next_power_of_2(r * k) >= r * k * next_power_of_2(r_small * k):
        r = r_small
    return seg, k, r, next_power_of_2(r * k)


def _flat_backward(n_cols: int, elem_size: int, t: Tuning | None = None) -> bool:
    """Whether the backward's default plan for aligned rows of ``n_cols`` is "flat": 16-bit rows in
    ``flat_bwd_16bit``, a multiple of ``_FLAT_BWD_SEGMENT`` columns, whose tile uses ``flat_bwd_min_gain`` more
    of its lanes than the plan it replaces (the phased kernel's whole row; its pieces, or the rows plan, as the row's
    power of two), or in ``flat_bwd_also``."""
    t = t or DEFAULT_TUNING
    if elem_size != 2 or n_cols % _FLAT_BWD_SEGMENT or not _in(t.flat_bwd_16bit, n_cols):
        return False
    try:
        _, k, r, segments = _flat_shape(n_cols)
    except ValueError:
        return False
    if n_cols in t.flat_bwd_also:
        return True
    if t.flat_bwd_min_gain is None:
        return False
    held = _phased_bwd_pieces(n_cols, elem_size, t) if _phased_backward(n_cols, elem_size, t) else None
    lanes = held[0] if held and not held[1] else next_power_of_2(n_cols)
    return r * k / segments >= n_cols / lanes + t.flat_bwd_min_gain


def _flat_backward_plan(n_rows: int, n_cols: int, elem_size: int, device: Device) -> _Plan:
    """The plan of ``_layer_norm_bwd_flat_kernel`` (``_flat_shape``): block_m R rows a window, block_n P lanes a
    segment, warps for one 16-byte vector a thread (up to 32), as many programs an SM as ``RESIDENT_WARPS`` hold."""
    seg, _, r, segments = _flat_shape(n_cols)
    vec = max(1, 16 // elem_size)
    warps = max(1, min(32, next_power_of_2(cdiv(segments * seg, 32 * vec))))
    n_groups = max(1, min(device.sms * max(1, RESIDENT_WARPS // warps), cdiv(n_rows, r)))
    return _Plan("rows", r, seg, warps, n_groups, "flat", _resident_regs(device), stages=_BWD_STAGES)


def _packed_rows(n_cols: int, t: Tuning | None = None) -> bool:
    """Whether unaligned rows of ``n_cols`` that lie packed take the rows plan with a compile-time width
    (``NARROW``) instead of the held or streamed forward or the phased backward: in ``packed_rows_band``, a multiple of
    ``_PACKED_ROWS_MULTIPLE`` and at most ``PACKED_N_MAX``."""
    band = (t or DEFAULT_TUNING).packed_rows_band
    return (band is not None and band[0] <= n_cols <= min(band[1], PACKED_N_MAX) and n_cols % 16 != 0
            and n_cols % _PACKED_ROWS_MULTIPLE == 0)


def _narrow_packed(n_cols: int, t: Tuning | None = None) -> bool:
    """Whether rows of ``n_cols`` lie under ``packed_rows_band`` with N a multiple of ``_PACKED_ROWS_MULTIPLE``: there
    the rows plan at a compile-time width loads 8- or 16-byte vectors (16-bit 1000: 97% of copy forward, 77% backward)
    and the held plans, measured at odd widths only, do not take them."""
    band = (t or DEFAULT_TUNING).packed_rows_band
    return band is not None and n_cols < band[0] and n_cols % _PACKED_ROWS_MULTIPLE == 0


def _in_bands(bands: tuple, n_cols: int, elem_size: int) -> bool:
    """Whether ``n_cols`` lies in one of the inclusive ranges ``bands`` holds for ``elem_size`` (4: fp32, 2: 16-bit)."""
    return _in_any(_sized(bands, elem_size), n_cols)


def _sized(pairs: tuple, elem_size: int):
    """The value a tuned choice by element size (pairs (2 or 4, value)) holds for ``elem_size``, or None."""
    return dict(pairs).get(4 if elem_size >= 4 else 2)


def _in(band: tuple | None, n: int) -> bool:
    return band is not None and band[0] <= n <= band[1]


def _in_any(bands: tuple | None, n: int) -> bool:
    return any(lo <= n <= hi for lo, hi in bands or ())


def _lean_backward_plan(
    n_rows: int, n_cols: int, elem_size: int, device: Device, max_row: int | None, one_pass: bool | None
) -> _Plan:
    """The plan of ``_layer_norm_bwd_lean_kernel``: one 16-byte vector per tensor a thread."""
    vector = 16 // elem_size
    size = 4 if elem_size >= 4 else 2
    widest = max_row if max_row is not None else _BWD_ROWS_TILE
    if n_cols <= widest:
        mode, block_n, n_chunks = "rows", next_power_of_2(n_cols), 1
        max_regs = _resident_regs(device)
    else:
        block_n = next_power_of_2(max_row) if max_row is not None else _BWD_CHUNK
        block_n = max(block_n, next_power_of_2(cdiv(n_cols, _MAX_CHUNKS)))
        n_chunks = cdiv(n_cols, block_n)
        if one_pass and interpreting():
            raise ValueError("the one-pass chunked plan waits on other programs: it cannot run under the interpreter")
        mode, max_regs = "chunks", _LEAN_CHUNKS_16BIT_REGS if size == 2 else _resident_regs(device)
    warps = max(1, min(RESIDENT_WARPS, block_n // (32 * vector)))
    resident = max(1, min(device.warps_per_sm // warps, device.regs_per_sm // (max_regs * 32 * warps)))
    if mode == "chunks":  # one pass while a row's chunks are co-resident, as its exchange needs
        if one_pass is None:
            one_pass = not interpreting() and n_chunks <= device.sms * resident
        mode = "one_pass" if one_pass else "two_pass"
    n_groups = max(1, min(n_rows, (device.sms * resident) // n_chunks))
    return _Plan(mode, 1, block_n, warps, n_groups, "lean", max_regs)


# --------------------------------------------------------------------------- launchers


def _row_pieces(n_cols: int, vec: int, max_pieces: int | None = None, packed: bool = False,
                elem_size: int = 2) -> tuple[int, int, int]:
    """(BLOCK_N, BLOCK_T, BLOCK_U) of the forward rows kernel (``_ragged.row_pieces``): pieces covering
    every phase of the row (N + VEC - 1 virtual columns). H200 sweep (docs/kernels.md, "layer_norm:
    forward"): unaligned rows gain from them at every width (fp32 4097 51 -> 80% of copy with the
    vector-masked body), three pieces best (12345: 63 vs 51% on two); aligned rows (N a multiple of 16)
    lost up to 32 points in pieces (bf16 768-6144, 11008-13824) and gained nowhere for sure, so they
    keep their own power of two unless it masks ``PIECE_WASTE`` of the lanes. Rows under
    ``PIECES_MIN_COLS``: one piece. ``packed`` (a compile-time width, ``NARROW``): as aligned rows.
    Aligned rows whose power of two is at most ``_SLIVER_MAX_SINGLE[elem_size]`` take it
    whole, unless the rows are 16-bit and the pieces past the first hold at most 1/``_SLIVER`` of its lanes
    (1028 = 1024 + 8, 2064 = 2048 + 16)."""
    pieces = _ROW_PIECES if max_pieces is None else max_pieces
    need = launch_width(n_cols, vec)
    single = next_power_of_2(need)
    aligned = n_cols % 16 == 0 or packed
    if n_cols < PIECES_MIN_COLS or (aligned and single - need < PIECE_WASTE * single):
        pieces = 1
    split = row_pieces(need, vec, pieces, PIECE_SLACK)
    key = 4 if elem_size >= 4 else 2
    sliver = key == 2 and split[1] + split[2] <= split[0] // _SLIVER
    if aligned and split[1] and single <= _SLIVER_MAX_SINGLE[key] and not sliver:
        return single, 0, 0
    return split


def _aligned_16bit_pieces(n_cols: int, t: Tuning | None = None) -> tuple[int, int, int] | None:
    """Two pieces for a 16-bit aligned row in ``aligned_pieces_16bit``, where the second has at least
    ``aligned_pieces_min_lanes`` lanes (1024: 5120 = 4096 + 1024, 5632 and 6144 = 4096 + 2048), else None."""
    t = t or DEFAULT_TUNING
    if not _in(t.aligned_pieces_16bit, n_cols) or t.aligned_pieces_min_lanes is None:
        return None
    pieces = row_pieces(n_cols, 1, 2, PIECE_SLACK)
    return pieces if pieces[1] >= t.aligned_pieces_min_lanes else None


def _forward_launch(x2, weight, bias, y2, mean, rstd, eps: float, plan: _Plan) -> None:
    n_rows, n_cols = x2.shape
    if plan.mode == "looped" or (plan.mode == "rows" and not _phase_rows(n_cols, x2.element_size())):
        r = Phased.plain(x2, y2)  # Triton's own (scalar, for unaligned rows) accesses
    else:
        r = phased(x2, y2)
    if plan.mode == "rows":
        dev = _device.of(x2.device)
        t = _tuning(dev)
        block_n = max(plan.block_n, next_power_of_2(launch_width(n_cols, r.vec)))
        narrow = r.packed_width(n_cols, PACKED_N_MAX)
        pieces = (_row_pieces(n_cols, r.vec, packed=narrow > 0, elem_size=x2.element_size())
                  if block_n == next_power_of_2(launch_width(n_cols, r.vec))
                  else (block_n, 0, 0))
        cap = plan if r.vec > 1 else plan._replace(max_regs=None)
        joint = packed = False
        if r.vec == 1 and x2.element_size() == 2 and block_n == next_power_of_2(n_cols):
            split = _aligned_16bit_pieces(n_cols, t)
            if split is not None:  # two pieces, their statistics in one reduction each, 64 registers
                pieces, joint, cap = split, True, plan._replace(max_regs=_resident_regs(dev))
                packed = True
            else:
                joint = pieces[1] == 0 and _joint_tile(n_cols, x2.dtype, t)
                packed = joint
        warps = plan.num_warps
        if pieces[1] and not _block_warps(pieces, r.vec, joint, t):
            # the plan's elements a thread over the pieces' lanes (4096 + 4: half the warps of 8192)
            warps = max(4, plan.num_warps * (1 << (sum(pieces).bit_length() - 1)) // block_n)
        launch_kernel(_layer_norm_fwd_kernel, (cdiv(n_rows, plan.block_m),),
            r.x, weight, bias, r.y, mean, rstd, r.phase, n_rows, n_cols, r.stride_x, r.stride_y, eps,
            BLOCK_M=plan.block_m, BLOCK_N=pieces[0], BLOCK_T=pieces[1], BLOCK_U=pieces[2], VEC=r.vec,
            JOINT=joint, PACKED=packed, NARROW=narrow,
            PARAMS_FIRST=_params_first(n_cols, pieces, x2.element_size(), r.vec, t),
            WIDEN=r.vec == 1 and _rows_widen(x2, n_cols, t), num_warps=warps, **_reg_cap(cap),
        )
    elif plan.mode == "looped":  # a program a row
        launch_kernel(_layer_norm_fwd_looped_kernel, (n_rows,),
            x2, weight, bias, y2, mean, rstd, n_cols, x2.stride(0), y2.stride(0), eps,
            BLOCK_N=plan.block_n, num_warps=plan.num_warps,
        )
    else:
        _forward_launch_split(r, weight, bias, mean, rstd, n_rows, n_cols, eps, plan)
    r.finish()


def _block_warps(pieces: tuple, vec: int, joint: bool, t: Tuning | None = None) -> bool:
    """Whether aligned rows in pieces (``vec`` 1, not JOINT) keep the warps of their whole block instead of those of
    their first piece: pieces past the first whose lanes lie in ``aligned_pieces_block_warps_tails``."""
    if vec != 1 or joint or not pieces[1]:
        return False
    return _in((t or DEFAULT_TUNING).aligned_pieces_block_warps_tails, pieces[1] + pieces[2])


def _params_first(n_cols: int, pieces: tuple, elem_size: int, vec: int, t: Tuning | None = None) -> bool:
    """Whether a forward rows program loads weight and bias before x (``fwd_params_first``): fp32 rows of a multiple of
    16 columns on one piece (``pieces`` (BLOCK_N, 0, 0), ``vec`` 1) from the rule's width that fill its share of their
    block (of a block wider than its lanes, its second share)."""
    block_n, rule = pieces[0], (t or DEFAULT_TUNING).fwd_params_first
    if elem_size < 4 or vec != 1 or n_cols % 16 or pieces[1] or rule is None:
        return False
    least, use, widest, wide_use = rule
    return n_cols >= least and n_cols >= (wide_use if block_n > widest else use) * block_n


def _forward_rows_tile(n_cols: int, elem_size: int, packed: bool = False, t: Tuning | None = None) -> int:
    """Elements a forward rows program holds (rows of the tile times its lanes): twice ``ROWS_TILE`` for 16-bit rows
    of a multiple of 16 columns (``_PACKED_ROWS_MULTIPLE`` where they lie ``packed``) in ``masked_rows_16bit`` that
    mask lanes, else ``ROWS_TILE``."""
    band = (t or DEFAULT_TUNING).masked_rows_16bit
    masked = n_cols != next_power_of_2(n_cols)
    aligned = n_cols % 16 == 0 or (packed and n_cols % _PACKED_ROWS_MULTIPLE == 0)
    return 2 * ROWS_TILE if elem_size == 2 and aligned and masked and _in(band, n_cols) else ROWS_TILE


def _joint_tile(n_cols: int, dtype: torch.dtype, t: Tuning | None = None) -> bool:
    """Whether an aligned 16-bit row held on one tile takes JOINT statistics (and PACKED x): from
    ``joint_16bit_min_cols``, fp16 from ``joint_fp16_min_cols`` (docs/kernels.md, "Aligned 16-bit rows")."""
    t = t or DEFAULT_TUNING
    least = t.joint_fp16_min_cols if dtype == torch.float16 else t.joint_16bit_min_cols
    return least is not None and n_cols >= least


def _forward_launch_split(r: Phased, weight, bias, mean, rstd, n_rows: int, n_cols: int, eps: float, plan: _Plan) -> None:
    group, slice_cols = split_group(launch_width(n_cols, r.vec), plan.block_n, plan.group)
    early = group == 1 and slice_cols == plan.block_n
    split_run(
        _layer_norm_fwd_split_kernel,
        lambda part, sync, n_programs: (
            r.x, weight, bias, r.y, mean, rstd, part, sync, r.phase, n_rows, n_cols, r.stride_x, r.stride_y,
            slice_cols, n_programs, eps),
        n_rows, group, plan.per_sm, r.x.device, mean,
        GROUP=group, BLOCK_N=plan.block_n, BLOCK_G=next_power_of_2(group),
        SUB=max(1, min(plan.block_n, 16 // r.x.element_size())), HOLD=slice_cols == plan.block_n,
        EARLY=early, VEC=r.vec, num_warps=plan.num_warps,
    )


def _backward_launch(dy2, x2, weight, mean, rstd, dx2, dw, db, plan: _Plan) -> None:
    n_rows, n_cols = x2.shape
    if plan.variant == "phased":
        _backward_launch_phased(dy2, x2, weight, mean, rstd, dx2, dw, db, plan)
        return
    if plan.variant == "flat":
        _backward_launch_flat(dy2, x2, weight, mean, rstd, dx2, dw, db, plan)
        return
    n_chunks = cdiv(n_cols, plan.block_n)
    n_row_blocks = cdiv(n_rows, plan.block_m)
    rows_per_group = cdiv(n_row_blocks, plan.n_groups) * plan.block_m
    n_groups = cdiv(n_rows, rows_per_group)
    grid = (n_groups * n_chunks,)
    scalars = (n_rows, n_cols, x2.stride(0), dy2.stride(0), dx2.stride(0), rows_per_group, n_chunks)
    if plan.variant == "lean":
        kernel, outputs = _layer_norm_bwd_lean_kernel, ()
        common = dict(BLOCK_N=plan.block_n, num_warps=plan.num_warps)
        if plan.max_regs is not None and not interpreting():
            common["maxnreg"] = plan.max_regs
    else:
        kernel, outputs = _layer_norm_bwd_kernel, (x2, x2)  # dw_ptr, db_ptr: read where SUM_HERE alone
        common = dict(BLOCK_M=plan.block_m, BLOCK_N=plan.block_n, num_warps=plan.num_warps)
        if plan.mode == "rows":
            common["PREFETCH"] = plan.prefetch
            common["NARROW"] = _packed_width(x2, dy2, dx2)
    if plan.mode == "rows" and kernel is _layer_norm_bwd_kernel and _shares_summed_in_launch(n_groups, n_cols):
        one = n_groups == 1  # one group's shares are the sums: written as dw, db, nothing to add
        dw_part, db_part = (dw, db) if one else float32_pair(n_groups, n_cols, x2.device)
        count = x2 if one else torch.zeros(1, dtype=torch.int32, device=x2.device)
        launch_kernel(kernel, grid, x2, dy2, weight, mean, rstd, dx2, dw_part, db_part, x2, count, dw, db, *scalars,
                      MODE=_ROWS, BLOCK_C=1, SUM_HERE=not one, **common)
        return
    dw_part, db_part = float32_pair(n_groups, n_cols, x2.device)
    tensors = (x2, dy2, weight, mean, rstd, dx2, dw_part, db_part)
    if plan.mode == "rows":
        launch_kernel(kernel, grid, *tensors, x2, x2, *outputs, *scalars, MODE=_ROWS, BLOCK_C=1, **common)
    else:
        part = torch.empty((n_rows, 2, n_chunks), dtype=torch.float32, device=x2.device)
        block_c = next_power_of_2(n_chunks)
        if plan.mode == "one_pass":
            count = torch.zeros((n_row_blocks + 1) * COUNTER_STRIDE_INTS, dtype=torch.int32, device=x2.device)
            launch_kernel(kernel, grid, *tensors, part, count, *outputs, *scalars, MODE=_ONE_PASS, BLOCK_C=block_c,
                          **common)
        else:
            for mode in (_STATS, _FROM_STATS):
                launch_kernel(kernel, grid, *tensors, part, part, *outputs, *scalars, MODE=mode, BLOCK_C=block_c,
                              **common)
    _sum_shares(dw_part, db_part, dw, db)


def _shares_summed_in_launch(n_groups: int, n_cols: int) -> bool:
    """Whether the rows backward sums its dweight/dbias shares in its own launch (its last group to finish,
    ``_sum_shares_if_last``) rather than ``_sum_shares``'s: where they are at most ``_SUM_HERE_BYTES``, which one
    program should read in about what a second launch costs the device (an estimate: not yet timed on a GPU); the
    launch's host cost (~4 us) goes whatever the size (docs/kernels.md, "layer_norm: backward")."""
    return n_groups * n_cols * 8 <= _SUM_HERE_BYTES


def _backward_launch_phased(dy2, x2, weight, mean, rstd, dx2, dw, db, plan: _Plan) -> None:
    n_rows, n_cols = x2.shape
    r = phased_rows((x2, dy2), (dx2,))
    # every row of a program at one phase: a multiple of r.vec programs (rounded down; the plan's
    # count already is one where rows of its width start at several phases)
    n_groups = max(r.vec, plan.n_groups // r.vec * r.vec)
    need = launch_width(n_cols, r.vec)
    words = r.vec == 8
    reach = cdiv(n_cols + r.vec - 1, r.vec) * r.vec  # with words: the last vector in them
    if plan.block_n + plan.block_t + plan.block_u >= need or (words and plan.block_t == 0 and plan.block_n + r.vec >= reach):
        block_n, block_t, block_u = plan.block_n, plan.block_t, plan.block_u
    else:  # planned for other phases than these rows have
        block_n, block_t, block_u = next_power_of_2(need), 0, 0
    tail = _tail_in_words(block_n, block_t, n_cols, r.vec)
    ahead = _phased_ahead(block_u, plan.num_warps, x2.element_size())
    dw_part, db_part = float32_pair(n_groups, n_cols, x2.device)
    launch_kernel(_layer_norm_bwd_phased_kernel, (n_groups,),
        *r.reads, weight, mean, rstd, *r.writes, dw_part, db_part, r.phase, n_rows, n_cols, *r.read_strides,
        *r.write_strides, n_groups,
        BLOCK_N=block_n, VEC=r.vec, PREFETCH=plan.prefetch, STAGES=plan.stages, BLOCK_T=block_t,
        EDGE_WORDS=block_t == 0, TAIL=tail,
        MERGE=_merge_pieces(block_n, block_t, plan.num_warps, x2.element_size(), block_u), BLOCK_U=block_u,
        AHEAD=ahead, FULL=_full_first(block_n, block_t, n_cols, r.vec, plan.prefetch, ahead),
        num_warps=plan.num_warps, **_reg_cap(plan),
    )
    r.finish()
    _sum_shares(dw_part, db_part, dw, db)


def _share_rows(plan: _Plan) -> int:
    """The float32 dweight/dbias share rows a backward plan writes (and ``_sum_shares`` re-reads): one a program,
    R a program of the flat plan (one a row of its window)."""
    return plan.n_groups * (plan.block_m if plan.variant == "flat" else 1)


def _backward_share_rows(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> int:
    """The float32 dweight/dbias share rows ``backward`` writes for these tensors (and re-reads to sum them), whichever
    plan runs: the held plan's programs, else ``_share_rows`` of the planned launch. What the byte budget's slack for
    the shares is computed from (tests/test_ref_dogfood.py)."""
    x2, dy2 = as_rows(x), as_rows(dy)
    if _held_backward(dy2, x2, weight.contiguous(), x2, _tuning(_device.of(x.device))):  # a fresh dx is packed wherever x is
        return _layer_norm_held.backward_programs(x2, weight, _device.of(x.device).sms)
    plan = _layer_norm_settings(*x2.shape, x.element_size(), backward=True, device=_device.of(x.device),
                                phased_ok=dy.dtype == x.dtype, flat_ok=_flat_layout(x2, dy2),
                                packed=_packed_width(x2, dy2) > 0)
    return _share_rows(plan)


def _flat_layout(*tensors: torch.Tensor) -> bool:
    """Whether each (M, N) tensor's rows lie back to back from a 16-byte aligned address (the flat backward's)."""
    return all(t.is_contiguous() and t.data_ptr() % VECTOR_BYTES == 0 for t in tensors)


def _backward_launch_flat(dy2, x2, weight, mean, rstd, dx2, dw, db, plan: _Plan) -> None:
    n_rows, n_cols = x2.shape
    if not _flat_layout(x2, dy2, dx2):
        raise ValueError("the flat backward reads x, dy and dx as contiguous rows from 16-byte aligned addresses")
    seg, r = plan.block_n, plan.block_m
    k = n_cols // seg
    if k * seg != n_cols or seg & (seg - 1):
        raise ValueError(f"the flat backward's segments of {seg} lanes do not divide rows of {n_cols}")
    dw_part, db_part = float32_pair(_share_rows(plan), n_cols, x2.device)
    launch_kernel(_layer_norm_bwd_flat_kernel, (plan.n_groups,),
        x2, dy2, weight, mean, rstd, dx2, dw_part, db_part, n_rows, plan.n_groups,
        N=n_cols, P=seg, K=k, R=r, S=next_power_of_2(r * k), STAGES=plan.stages,
        num_warps=plan.num_warps,
        **_reg_cap(plan),
    )
    _sum_shares(dw_part, db_part, dw, db)


def _packed_width(*rows: torch.Tensor) -> int:
    """N where every (M, N) tensor's rows lie back to back (strides N), N is not a multiple of 16 elements and at
    most ``PACKED_N_MAX``, else 0 (``_ragged.packed_width``): the rows backward's ``NARROW``, and what makes
    ``packed`` for the plans of both passes."""
    return packed_width(rows[0].shape[1], tuple(t.stride(0) for t in rows), PACKED_N_MAX)


def _rows_widen(x: torch.Tensor, n_cols: int, t: Tuning | None = None) -> bool:
    """Whether the rows kernel widens ``x``'s rows of ``n_cols`` by ``_math.widen``: bf16 rows of a multiple of 16
    columns in ``rows_widen_bands``, on CUDA, not under the interpreter, which runs no PTX."""
    return (x.dtype == torch.bfloat16 and n_cols % 16 == 0 and x.is_cuda and not interpreting()
            and _in_any((t or DEFAULT_TUNING).rows_widen_bands, n_cols))


def _reg_cap(plan: _Plan) -> dict:
    """Launch options capping registers (``_Plan.max_regs``); none under the interpreter."""
    return {"maxnreg": plan.max_regs} if plan.max_regs and not interpreting() else {}


def _sum_shares(dw_part: torch.Tensor, db_part: torch.Tensor, dw: torch.Tensor, db: torch.Tensor) -> None:
    """dw, db = column sums of the (n_groups, N) shares, deterministically, in one launch: past
    ``_DWDB_GROUPS_PER_SPLIT`` shares, splits of them summed first, then the splits' sums by the last split of each
    column block to arrive."""
    n_groups, n_cols = dw_part.shape
    block_n = min(_DWDB_BLOCK_N, next_power_of_2(n_cols))
    col_blocks = cdiv(n_cols, block_n)
    block_g, warps = _BWD_ROWS_TILE // _DWDB_BLOCK_N, warps_for(_BWD_ROWS_TILE)
    if n_groups > _DWDB_GROUPS_PER_SPLIT:
        n_splits = cdiv(n_groups, _DWDB_GROUPS_PER_SPLIT)
        dw_mid, db_mid = float32_pair(n_splits, n_cols, dw_part.device)
        count = torch.zeros(col_blocks, dtype=torch.int32, device=dw_part.device)
        launch_kernel(_layer_norm_dwdb_kernel, (col_blocks, n_splits),
            dw_part, db_part, dw, db, dw_mid, db_mid, count, n_groups, n_cols, _DWDB_GROUPS_PER_SPLIT,
            BLOCK_G=block_g, BLOCK_N=block_n, SPLITS=True, num_warps=warps,
        )
        return
    launch_kernel(_layer_norm_dwdb_kernel, (col_blocks, 1),
        dw_part, db_part, dw, db, dw_part, db_part, dw_part, n_groups, n_cols, n_groups, BLOCK_G=block_g,
        BLOCK_N=block_n, num_warps=warps
    )


# --------------------------------------------------------------------------- public functions


def _held_default(n_cols: int, elem_size: int, t: Tuning | None = None) -> bool:
    """Whether the forward takes the held plan for rows of ``n_cols`` where it can run (``held_fwd_min_cols``):
    widths that are not a multiple of 16, from the band's first width on (fp32 rows under 16385 where the streamed
    plan does not take them first, ``_stream_band``); aligned rows in ``held_fwd_aligned_bands``."""
    t = t or DEFAULT_TUNING
    if n_cols % 16 == 0:
        return _in_aligned_band(t.held_fwd_aligned_bands, n_cols, elem_size)
    least = _sized(t.held_fwd_min_cols, elem_size)
    if least is None or n_cols < least or _packed_rows(n_cols, t) or _narrow_packed(n_cols, t):
        return False
    return not _paired_rows(n_cols, t)


def _paired_rows(n_cols: int, t: Tuning) -> bool:
    """Whether rows of ``n_cols`` are even and under ``held_fwd_even_min_cols``: rows the rows plan reads as 4-byte
    pairs, which the held plan leaves to it and the streamed plan takes only on its narrowest programs."""
    return n_cols % 2 == 0 and n_cols < t.held_fwd_even_min_cols


def _held_forward(x2: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, y2: torch.Tensor,
                  t: Tuning | None = None) -> bool:
    """Whether this forward runs on ``_layer_norm_held``: the width's rule (``t``, default the tensors' device's), this
    machine, and tensors it takes."""
    t = _tuning(_device.of(x2.device)) if t is None else t
    return (_held_default(x2.shape[1], x2.element_size(), t)
            and _layer_norm_held.available() and _layer_norm_held.fits(x2, weight, bias, y2))


def _stream_band(n_cols: int, elem_size: int, t: Tuning | None = None) -> bool:
    """Whether rows of ``n_cols`` are streamed before the held plan is asked (``stream_fwd_bands``): N not a multiple
    of 16 inside a band of their element size, and not rows the packed rows plan takes (``_packed_rows``,
    ``_narrow_packed``, even rows under ``held_fwd_even_min_cols`` but 16-bit ones on programs of at most
    ``stream_fwd_even_max_warps`` warps); 16-bit rows only where their streamed shape has at most
    ``stream_fwd_16bit_most`` segments and warps (the shape of parameters in x's dtype: the rule's, whatever the
    call's)."""
    t = t or DEFAULT_TUNING
    even = _paired_rows(n_cols, t)
    if (n_cols % 16 == 0 or not _in_bands(t.stream_fwd_bands, n_cols, elem_size) or _packed_rows(n_cols, t)
            or _narrow_packed(n_cols, t)):
        return False
    shape = _layer_norm_held.stream_shape(n_cols, elem_size, 2 * elem_size)  # the shape with parameters of x's dtype
    if even and (shape is None or elem_size >= 4 or shape.warps > t.stream_fwd_even_max_warps):
        return False
    if shape is None or elem_size >= 4 or t.stream_fwd_16bit_most is None:
        return shape is not None
    most_segments, most_warps = t.stream_fwd_16bit_most
    return shape.nseg <= most_segments and shape.warps <= most_warps


def _stream_forward(x2: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, y2: torch.Tensor,
                    band: bool | None = None, t: Tuning | None = None) -> bool:
    """Whether this forward streams its rows past the held weight and bias: rows in ``_stream_band`` (``band``: its
    answer, where the caller has it), and rows from the width of their element size on (``stream_fwd_min_cols``; N a
    multiple of 16 from ``stream_fwd_aligned_min_cols``, or where ``_block_underused``), on a machine that runs the
    held kernels, of tensors ``launch_stream`` takes."""
    t, n_cols, elem_size = t or DEFAULT_TUNING, x2.shape[1], x2.element_size()
    aligned = n_cols % 16 == 0
    least = _sized(t.stream_fwd_aligned_min_cols if aligned else t.stream_fwd_min_cols, elem_size)
    if band is None:
        band = _stream_band(n_cols, elem_size, t)
    wanted = band or (least is not None and n_cols >= least) or (aligned and _block_underused(n_cols, elem_size, t))
    return wanted and _layer_norm_held.available() and _layer_norm_held.fits_stream(x2, weight, bias, y2)


def _block_underused(n_cols: int, elem_size: int, t: Tuning) -> bool:
    """Whether aligned rows of ``n_cols`` are streamed for the rows plan's power-of-two block, of which a row fills
    at most a share (the rows plan's other lanes idle; the stream reads a row in segments):
    ``stream_fwd_aligned_max_use`` gives the width it starts at and the share; only rows the narrow streamed shape
    holds (``_layer_norm_held.Shapes.stream_narrow_max_cols``)."""
    rule = _sized(t.stream_fwd_aligned_max_use, elem_size)
    if rule is None or n_cols > _layer_norm_held.SHAPES.stream_narrow_max_cols:
        return False
    least, most = rule
    return n_cols >= least and n_cols <= most * next_power_of_2(n_cols)


def _in_aligned_band(bands: tuple, n_cols: int, elem_size: int) -> bool:
    """Whether aligned rows of ``n_cols`` (a multiple of 16) are held: inside one of the bands of their element size
    (inclusive), and not a power of two (whose tiles the other plans fill whole)."""
    return _in_bands(bands, n_cols, elem_size) and n_cols & (n_cols - 1) != 0


def _held_bwd_default(n_cols: int, elem_size: int, t: Tuning | None = None) -> bool:
    """Whether the backward takes the held plan for rows of ``n_cols`` where it can run: ragged rows (N not a multiple
    of 16) in ``held_bwd_bands`` that the phased plan does not take (``_phased_backward``: under its first width, past
    its widest row), so that no Triton plan would read them element by element; not the packed rows ``_narrow_packed``
    names (the rows plan's compile-time width)."""
    t = t or DEFAULT_TUNING
    if n_cols % 16 == 0 or not _in(_sized(t.held_bwd_bands, elem_size), n_cols) or _narrow_packed(n_cols, t):
        return False
    return not _phased_backward(n_cols, elem_size, t)


def _held_backward(dy2: torch.Tensor, x2: torch.Tensor, weight: torch.Tensor, dx2: torch.Tensor,
                   t: Tuning | None = None) -> bool:
    """Whether this backward runs on ``_layer_norm_held``: the width's rule (``t``, default the tensors' device's), this
    machine, and tensors it takes."""
    t = _tuning(_device.of(x2.device)) if t is None else t
    return (_held_bwd_default(x2.shape[1], x2.element_size(), t) and _layer_norm_held.available()
            and _layer_norm_held.fits_backward(dy2, x2, weight, dx2))


def _check_params(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    check_tensor(x, "x", min_ndim=1)
    for name, p in (("weight", weight), ("bias", bias)):
        check_tensor(p, name, ndim=1)
        if p.shape[0] != x.shape[-1]:
            raise ValueError(f"{name} has shape {tuple(p.shape)}; x's last dimension needs ({x.shape[-1]},)")
        if p.get_device() != x.get_device():  # device indices: cheaper than comparing torch.device objects
            raise ValueError(f"{name} is on {p.device} but x is on {x.device}")


# a problem's first call plans, its second records, later ones replay (_launch.py)
FORWARD_CALLS = Calls("layer_norm.forward")
BACKWARD_CALLS = Calls("layer_norm.backward")


def forward(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    eps: float = 1e-5,
    *,
    out: torch.Tensor | None = None,
    max_row: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Layer norm of ``x`` over its last dimension: ``(y, mean, rstd)``.

    ``y`` has ``x``'s shape and dtype (written into ``out`` when given: contiguous, same
    shape, dtype and device); ``mean`` and ``rstd`` are float32 of shape ``x.shape[:-1]``.
    ``weight`` and ``bias`` have shape ``(N,)``, any float dtype. ``max_row`` overrides the
    launch plan, for tests. Where autograd would differentiate through the call (grad mode, an input that requires
    grad), ``y`` differentiates as ``fused``'s does (``out`` then takes a copy of y); with ``max_row`` set such a call
    has no backward (a gradient reaching it raises). Under ``torch.compile``: the op ``reference_kernels::layer_norm``.
    """
    grad = wants_grad((x, weight, bias))
    if grad and max_row is None:
        y, mean, rstd = _LayerNormFunction.apply(x, weight, bias, (eps, None, None, None, True))
        return traced_result(y, out, "layer_norm.forward"), mean, rstd
    if tracing():
        eager_only("layer_norm.forward", max_row=max_row)
        y, mean, rstd = _LAYER_NORM_OP(x, weight, bias, float(eps))
        return traced_result(y, out, "layer_norm.forward"), mean, rstd
    result = _forward_calls(x, weight, bias, eps, out, max_row)
    return inference_result("layer_norm.forward", (x, weight, bias), result) if grad else result


def _forward_calls(x, weight, bias, eps, out=None, max_row=None, stats=True):
    """The forward's launches (recorded or replayed), and its op's implementation: ``(y, mean, rstd)``, or ``y`` alone
    where ``stats`` is False (nothing differentiates: the replays pass the record's statistics again)."""
    return FORWARD_CALLS((eps, max_row, stats), (x, weight, bias, out),
                         lambda: _forward(x, weight, bias, eps, out, max_row, stats))


def _forward(x, weight, bias, eps, out, max_row, stats=True):
    _check_params(x, weight, bias)
    y = output_like(x, out)
    # apart: a replayed allocation costs about what a view of a shared one does (docs/kernels.md, "Host time a call")
    mean = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)
    rstd = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)
    if not stats:  # written, never read: kept with the record
        write_only(mean)
        write_only(rstd)
    if x.numel() == 0:
        return (y, mean, rstd) if stats else y
    x2 = as_rows(x)
    rows = x.dim() == 2  # already rows: no views to make
    y2 = y if rows else y.view(x2.shape)
    mean1, rstd1 = (mean, rstd) if rows else (mean.view(-1), rstd.view(-1))
    _forward_any(x2, weight, bias, y2, mean1, rstd1, float(eps), max_row)
    return (y, mean, rstd) if stats else y


def _forward_any(x2, weight, bias, y2, mean, rstd, eps: float, max_row: int | None) -> None:
    """The forward's plan, then its launches: the held or streamed Gluon kernels where they take these rows, else the
    Triton plan (``_layer_norm_settings``)."""
    device = x2.device
    t = _tuning(_device.of(device))
    band = max_row is None and _stream_band(x2.shape[1], x2.element_size(), t)  # asked once: it builds the stream's shape
    streamed = max_row is None and _stream_forward(x2, weight, bias, y2, band, t)
    if max_row is None and not (band and streamed) and _held_forward(x2, weight, bias, y2, t):
        try:
            _layer_norm_held.launch(x2, weight, bias, y2, mean, rstd, eps, _device.of(device).sms)
            return
        except _layer_norm_held.CompilationError as exc:  # a Triton whose Gluon moved on: warn once, then without it
            _layer_norm_held.disable(exc)
    if streamed and _layer_norm_held.available():  # available: not if the held plan's compile just failed
        try:
            _layer_norm_held.launch_stream(x2, weight, bias, y2, mean, rstd, eps, _device.of(device).sms)
            return
        except _layer_norm_held.CompilationError as exc:
            _layer_norm_held.disable(exc)
    plan = _layer_norm_settings(*x2.shape, x2.element_size(), max_row=max_row, device=_device.of(device),
                                packed=_packed_width(x2, y2) > 0)
    _forward_launch(x2, weight.contiguous(), bias.contiguous(), y2, mean, rstd, eps, plan)


def backward(
    dy: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    mean: torch.Tensor,
    rstd: torch.Tensor,
    *,
    bias_dtype: torch.dtype | None = None,
    max_row: int | None = None,
    one_pass: bool | None = None,
    variant: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients ``(dx, dweight, dbias)`` of layer norm, given ``dy`` and the forward's saved values.

    ``max_row``/``one_pass``/``variant`` override the launch plan (``_layer_norm_settings``). Under
    ``torch.compile``: the op ``reference_kernels::layer_norm_backward``.
    """
    if tracing():
        eager_only("layer_norm.backward", max_row=max_row, one_pass=one_pass, variant=variant)
        result = _LAYER_NORM_BACKWARD_OP(dy, x, weight, mean, rstd, bias_dtype)
    else:
        result = _backward_calls(dy, x, weight, mean, rstd, bias_dtype, max_row, one_pass, variant)
    return inference_result("layer_norm.backward", (dy, x, weight, mean, rstd), result)


def _backward_calls(dy, x, weight, mean, rstd, bias_dtype, max_row=None, one_pass=None, variant=None):
    """The backward's launches (recorded or replayed), and its op's implementation."""
    return BACKWARD_CALLS((bias_dtype, max_row, one_pass, variant), (dy, x, weight, mean, rstd),
                          lambda: _backward(dy, x, weight, mean, rstd, bias_dtype, max_row, one_pass, variant))


def _backward(dy, x, weight, mean, rstd, bias_dtype, max_row, one_pass, variant):
    check_tensor(dy, "dy", min_ndim=1)
    if dy.shape != x.shape:
        raise ValueError(f"dy has shape {tuple(dy.shape)} but x has {tuple(x.shape)}")
    n_cols = x.shape[-1]
    device = x.device
    dx = torch.empty(x.shape, dtype=x.dtype, device=device)
    if x.numel() == 0:  # no rows: zero gradients for the parameters
        dw = torch.zeros(n_cols, dtype=weight.dtype, device=device)
        return dx, dw, torch.zeros(n_cols, dtype=bias_dtype or weight.dtype, device=device)
    dw = torch.empty(n_cols, dtype=weight.dtype, device=device)  # every column is written
    db = torch.empty(n_cols, dtype=bias_dtype or weight.dtype, device=device)
    x2, dy2 = as_rows(x), as_rows(dy)
    rows = x.dim() == 2  # already rows: no views to make
    dx2 = dx if rows else dx.view(x2.shape)
    weight = weight.contiguous()
    mean1, rstd1 = (mean, rstd) if rows and mean.dim() == 1 else (mean.reshape(-1), rstd.reshape(-1))
    _backward_any(dy2, x2, weight, mean1, rstd1, dx2, dw, db, max_row, one_pass, variant)
    return dx, dw, db


def _backward_any(dy2, x2, weight, mean, rstd, dx2, dw, db, max_row, one_pass, variant) -> None:
    """The backward's plan, then its launches: the held Gluon kernel where it takes these rows, else the Triton plan."""
    if (max_row is None and one_pass is None and variant is None
            and _held_backward(dy2, x2, weight, dx2, _tuning(_device.of(x2.device)))):
        try:
            shares = _layer_norm_held.launch_backward(dy2, x2, weight, mean, rstd, dx2, _device.of(x2.device).sms)
            _sum_shares(*shares, dw, db)
            return
        except _layer_norm_held.CompilationError as exc:  # a Triton whose Gluon moved on: warn once, then without it
            _layer_norm_held.disable(exc)
    plan = _layer_norm_settings(
        *x2.shape,
        x2.element_size(),
        backward=True,
        device=_device.of(x2.device),
        max_row=max_row,
        one_pass=one_pass,
        variant=variant,
        phased_ok=dy2.dtype == x2.dtype,
        flat_ok=_flat_layout(x2, dy2),
        packed=_packed_width(x2, dy2, dx2) > 0,
    )
    _backward_launch(dy2, x2, weight, mean, rstd, dx2, dw, db, plan)


class _LayerNormFunction(torch.autograd.Function):
    """y, differentiable, or with ``stats`` (y, mean, rstd), the statistics not: eager, through the recorded calls;
    traced by torch.compile, through the ops (their autograd falls through, ``define_op``), so a compiled graph's
    backward calls ``layer_norm_backward``. The options come in one argument and ``fused`` takes y alone: each
    argument and output costs ``Function.apply`` Python (docs/kernels.md, "Host time a call")."""

    @staticmethod
    def forward(ctx, x, weight, bias, options):
        eps, max_row, one_pass, variant, stats = options
        if tracing():
            y, mean, rstd = _LAYER_NORM_OP(x, weight, bias, float(eps))
        else:
            y, mean, rstd = _forward_calls(x, weight, bias, eps, None, max_row)
        ctx.save_for_backward(x, weight, mean, rstd)
        ctx.bias_dtype = bias.dtype
        ctx.plan_overrides = (max_row, one_pass, variant)
        if not stats:
            return y
        ctx.mark_non_differentiable(mean, rstd)  # statistics, not outputs a loss reads
        return y, mean, rstd

    @staticmethod
    def backward(ctx, dy, *stats_grads):
        x, weight, mean, rstd = ctx.saved_tensors
        max_row, one_pass, variant = ctx.plan_overrides
        dx, dw, db = backward(dy, x, weight, mean, rstd, bias_dtype=ctx.bias_dtype, max_row=max_row,
                              one_pass=one_pass, variant=variant)
        return dx, dw, db, None


def fused(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    eps: float = 1e-5,
    *,
    max_row: int | None = None,
    one_pass: bool | None = None,
    bwd_variant: str | None = None,
) -> torch.Tensor:
    """Differentiable fused layer norm: ``forward`` now, ``backward`` under autograd.

    ``max_row`` overrides both passes' plans, ``one_pass`` the backward's chunked plan and
    ``bwd_variant`` ("measured" or "lean") its kernel, for tests and benchmarks. Under ``torch.compile``: the op
    ``reference_kernels::layer_norm``, differentiable by ``reference_kernels::layer_norm_backward``.
    """
    if tracing():
        eager_only("layer_norm.fused", max_row=max_row, one_pass=one_pass, bwd_variant=bwd_variant)
    elif not wants_grad((x, weight, bias)):  # nothing to differentiate: no autograd Function (~9 us of host a call)
        return _forward_calls(x, weight, bias, eps, None, max_row, stats=False)
    return _LayerNormFunction.apply(x, weight, bias, (eps, max_row, one_pass, bwd_variant, False))


def _fake_forward(x, weight, bias, eps):
    _check_params(x, weight, bias)
    stats = [torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device) for _ in range(2)]
    return torch.empty(x.shape, dtype=x.dtype, device=x.device), *stats


def _fake_backward(dy, x, weight, mean, rstd, bias_dtype):
    n_cols = x.shape[-1]
    return (torch.empty(x.shape, dtype=x.dtype, device=x.device),
            torch.empty(n_cols, dtype=weight.dtype, device=x.device),
            torch.empty(n_cols, dtype=bias_dtype or weight.dtype, device=x.device))


_LAYER_NORM_OP = define_op("layer_norm(Tensor x, Tensor weight, Tensor bias, float eps) -> (Tensor, Tensor, Tensor)",
                           _forward_calls, _fake_forward)
_LAYER_NORM_BACKWARD_OP = define_op(
    "layer_norm_backward(Tensor dy, Tensor x, Tensor weight, Tensor mean, Tensor rstd, ScalarType? bias_dtype)"
    " -> (Tensor, Tensor, Tensor)", _backward_calls, _fake_backward)


def unfused(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """Layer norm op by op as people write it; traffic per line for x of shape (M, N)."""
    mean = x.mean(dim=-1, keepdim=True)  # read MN elements ; write M elements
    centred = x - mean  # read MN + M elements ; write MN elements
    squared = centred * centred  # read MN elements ; write MN elements
    var = squared.mean(dim=-1, keepdim=True)  # read MN elements ; write M elements
    shifted = var + eps  # read M elements ; write M elements
    rstd = torch.rsqrt(shifted)  # read M elements ; write M elements
    normed = centred * rstd  # read MN + M elements ; write MN elements
    scaled = normed * weight  # read MN + N elements ; write MN elements
    return scaled + bias  # read MN + N elements ; write MN elements


def budget(x: torch.Tensor, weight: torch.Tensor | None = None, bias: torch.Tensor | None = None, *, backward: bool = False) -> Budget:
    """Compulsory traffic of the forward (or, with ``backward=True``, the backward) pass.

    Forward: read x, weight, bias; write y and float32 mean, rstd. Backward: read x, dy
    (x's dtype), weight and float32 mean, rstd; write dx, dweight, dbias. ``weight`` and
    ``bias`` default to x's dtype.
    """
    m, n = rows_cols(x)
    size = x.element_size()
    w_size = weight.element_size() if weight is not None else size
    b_size = bias.element_size() if bias is not None else w_size
    if not backward:
        return Budget(
            read_bytes=m * n * size + n * (w_size + b_size),
            write_bytes=m * n * size + 2 * m * 4,
            label="layer_norm forward",
        )
    return Budget(
        read_bytes=2 * m * n * size + n * w_size + 2 * m * 4,
        write_bytes=m * n * size + n * (w_size + b_size),
        label="layer_norm backward",
    )


def unfused_traffic(x: torch.Tensor, weight: torch.Tensor | None = None, bias: torch.Tensor | None = None) -> Budget:
    """Traffic of ``unfused`` in x's dtype (weight and bias the same): the sum of its line comments."""
    m, n = rows_cols(x)
    size = x.element_size()
    reads = (m * n) + (m * n + m) + (m * n) + (m * n) + m + m + (m * n + m) + (m * n + n) + (m * n + n)
    writes = m + (m * n) + (m * n) + m + m + m + (m * n) + (m * n) + (m * n)
    return Budget(read_bytes=reads * size, write_bytes=writes * size, label="layer_norm forward, op by op")
