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

This module holds the plan, the launches and the public functions; the Triton kernels are ``_softmax_kernels``'. The
plans that lost to these are listed in docs/kernels.md, "Variants removed". The max and sum are taken in float32
whatever the input dtype; the output has the input's dtype. Rows of ``-inf`` and rows holding ``nan`` or ``+inf`` come
out as torch's do (all ``nan``).
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from pytest_fusioncheck.budget import Budget

from . import _device, _softmax_held
from ._common import (ELEMS_PER_THREAD, MAX_ROW, ROWS_TILE, as_rows, cdiv, check_tensor, define_op, eager_only,
                      inference_result, interpreting, next_power_of_2, output_like, reg_cap, rows_cols, traced_result,
                      tracing, warps_for)
from ._device import Device
from ._ragged import (PACKED_N_MAX, PHASED_ROWS_MIN_COLS, PIECE_SLACK, PIECE_WASTE, PIECES_MIN_COLS, Phased,
                      launch_width, phased, ragged_width, row_pieces)
from ._softmax_kernels import _softmax_fwd_kernel, _softmax_split_kernel
from ._split_walk import MAX_SPLIT_GROUP, SPLIT_CHUNK_BYTES, SPLIT_PER_SM, SPLIT_WARPS, split_group, split_run
from ._launch import Calls, launch as launch_kernel


# --------------------------------------------------------------------------- plan

# What every plan is built from (docs/kernels.md, "softmax"): the rows plan (MAX_ROW, ROWS_TILE: _common; the ragged
# rows' PACKED_N_MAX, PHASED_ROWS_MIN_COLS, PIECE_SLACK, PIECES_MIN_COLS: _ragged); wider rows are held in shared
# memory ("held", sm_90) or walked twice, the second time from L2 ("persistent", "split"; the walk's MAX_SPLIT_GROUP,
# SPLIT_CHUNK_BYTES, SPLIT_PER_SM, SPLIT_WARPS: _split_walk).
# Rows in up to two power-of-two pieces (_row_pieces: a third lost 13-27 points); PIECE_MIN_WARPS warps at least.
PIECE_MIN_WARPS = 2
# The staged plan: one row a step, STAGED_ELEMS a thread, up to STAGED_STAGES - 1 rows in flight in the shared memory
# a block may take less STAGED_SMEM_SPARE.
STAGED_ELEMS = 32
STAGED_STAGES = 3
STAGED_SMEM_SPARE = 35840
# The walk (_split_walk) sized for the L2: a persistent program an SM with one 64 KiB chunk in flight; split slices
# of SPLIT_SLICE_BYTES; fp32 slices of one step held in registers by one 16-warp program an SM from
# SPLIT_HOLD_MIN_ROW_BYTES.
PERSISTENT_CHUNK_BYTES = 65536
SPLIT_SLICE_BYTES = 65536
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
    piece_waste: tuple = (PIECE_WASTE,) * 4
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
    warps, per_sm = (16, 1) if hold else (SPLIT_WARPS, SPLIT_PER_SM) if split else (16, 1)
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
    return reg_cap(device.regs_per_sm, warps * per_sm)


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
                _softmax_held.launch_split(x2, y2, p.group)
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


CALLS = Calls("softmax.fused")  # a problem's first call plans, its second records, later ones replay (_launch.py)


def fused(x: torch.Tensor, *, out: torch.Tensor | None = None, max_row: int | None = None) -> torch.Tensor:
    """Softmax of ``x`` over its last dimension by the fused kernel (plans: the module docstring).

    ``x``: float32, float16 or bfloat16, at least one dimension, any strides (a last
    dimension that is not contiguous, or leading dims that do not flatten to one, cost a
    copy). Returns a contiguous tensor of ``x``'s shape and dtype, written into ``out``
    when given (contiguous, same shape, dtype and device). ``max_row`` overrides the
    launch plan (``plan``), for tests. Under ``torch.compile``: the op ``reference_kernels::softmax`` (``out``
    then takes a copy of its result).
    """
    if tracing():
        eager_only("softmax.fused", max_row=max_row)
        result = traced_result(_SOFTMAX_OP(x), out, "softmax.fused")
    else:
        result = _calls(x, out, max_row)
    return inference_result("softmax.fused", (x,), result)


def _calls(x, out=None, max_row=None):
    """The call's launches (recorded or replayed), and the op's implementation."""
    return CALLS((max_row,), (x, out), lambda: _fused(x, out, max_row))


def _fake(x):
    check_tensor(x, "x", min_ndim=1)
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


_SOFTMAX_OP = define_op("softmax(Tensor x) -> Tensor", _calls, _fake)


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
