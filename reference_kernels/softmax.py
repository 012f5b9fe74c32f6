"""Fused softmax over the last dimension, for any row width.

Six launch plans (three share one kernel) (``MODE`` picks the code path at compile time);
``_softmax_settings`` chooses:

* ``rows`` (rows up to 16384 wide): a program loads ``BLOCK_M`` whole rows, reduces max and
  sum of exponentials in registers and writes the result: one read, one write. Measured
  92-100% of copy bandwidth on an H200.
* ``persistent`` and ``split`` (wider rows, the default: ``_WIDE_ROWS_PLAN = "auto"`` takes
  ``persistent`` up to 128 KiB a row, ``split`` beyond): ``_softmax_split_kernel``, a few
  programs an SM walking tiles (a whole row, or one of a row's slices whose programs
  exchange (max, sum)) twice, sized so that the tiles in flight fit in L2 and the second
  read comes from there; a tile of one step is held in registers instead (no second read).
  Measured 81% of copy at 65536 and 71-75% at 262144 (docs/kernels.md, "The split walk"
  and "softmax"): short of the 90% target, above every anchor.
* ``looped`` (wider rows, by name): one program a row walks it in ``_CHUNK`` steps
  twice, first for the running max and sum of exponentials (kept per lane, combined at the
  end), then to normalise; the second read comes from L2 while the rows in flight fit there.
* ``two_pass`` (wider rows, ``one_pass=False``): the row is cut into chunks, one
  program each; a first launch writes each chunk's (max, sum of exp), a second combines a
  row's partials and re-reads ``x`` to normalise: two reads and one write of ``x``.
* ``one_pass`` (wider rows, opt-in: ``one_pass=True``): the chunk programs keep their chunk
  in registers, publish their partials, wait until every chunk of the row has published,
  then normalise what they hold: one read, one write, plus 8 bytes per chunk and row. The
  wait is safe because programs take their tile numbers from an atomic counter in the
  order they start, so the tiles handed out always form a prefix: every row but the last
  handed-out one has all its chunk programs running, and a row needs only ``n_chunks``
  co-resident programs (capped far below what a GPU holds). It is not the default because
  it measured slow on the H200 (13-66% of copy; docs/kernels.md, "The split walk", says
  why).

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

from ._common import check_tensor, interpreting, next_power_of_2

_ROWS = tl.constexpr(0)  # whole rows per program
_ONE_PASS = tl.constexpr(1)  # chunks, partials exchanged while the chunk stays in registers
_STATS = tl.constexpr(2)  # two-pass fallback, pass 1: partials only
_FROM_STATS = tl.constexpr(3)  # two-pass fallback, pass 2: combine partials, re-read x
# Arrival counters sit one 128-byte line apart, so that the programs spinning on one row
# do not queue behind those spinning on the next (docs/kernels.md, "The split walk").
_COUNTER_STRIDE_INTS = 32
_COUNTER_STRIDE = tl.constexpr(_COUNTER_STRIDE_INTS)


@triton.jit
def _wait_for_peers(count_ptr, n_peers):
    """Arrive at ``count_ptr`` and spin until ``n_peers`` programs have arrived.

    The first barrier puts every thread's earlier stores into this program's release; the
    spin reads through to L2 without an atomic, and one acquire afterwards orders the
    reads of the peers' partials after their releases.
    """
    tl.debug_barrier()
    tl.atomic_add(count_ptr, 1, sem="release", scope="gpu")
    arrived = tl.load(count_ptr, volatile=True)
    while arrived < n_peers:
        arrived = tl.load(count_ptr, volatile=True)
    tl.atomic_add(count_ptr, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()


@triton.jit
def _softmax_fwd_kernel(
    x_ptr,  # (M, N) input; row stride stride_x, column stride 1
    y_ptr,  # (M, N) output; row stride stride_y, column stride 1
    part_ptr,  # (M, 2, n_chunks) float32 partial (max, sum of exp) per row and chunk; unused in rows mode
    count_ptr,  # ((cdiv(M, BLOCK_M) + 1) * _COUNTER_STRIDE,) int32 zeros: arrivals per row block, then the tile counter
    n_rows,  # M
    n_cols,  # N
    stride_x,  # elements between rows of x
    stride_y,  # elements between rows of y
    n_chunks,  # chunks per row: cdiv(N, BLOCK_N); 1 in rows mode
    MODE: tl.constexpr,  # _ROWS, _ONE_PASS, _STATS or _FROM_STATS
    BLOCK_M: tl.constexpr,  # rows per program
    BLOCK_N: tl.constexpr,  # columns per program: >= N in rows mode, else the chunk width
    BLOCK_C: tl.constexpr,  # next_power_of_2(n_chunks), partials combined at once
):
    if MODE == _ONE_PASS:
        # Tile numbers in start order (see the module docstring: why waiting is safe).
        n_row_blocks = tl.cdiv(n_rows, BLOCK_M)
        tile = tl.atomic_add(count_ptr + n_row_blocks * _COUNTER_STRIDE, 1)
    else:
        tile = tl.program_id(0)
    row_block = tile // n_chunks
    chunk = tile % n_chunks
    rows = row_block * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = chunk * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < n_rows
    mask = row_ok[:, None] & (cols < n_cols)[None, :]
    rows64 = rows.to(tl.int64)
    x = tl.load(x_ptr + rows64[:, None] * stride_x + cols[None, :], mask=mask, other=-float("inf"))
    x = x.to(tl.float32)

    if MODE == _ROWS:
        row_max = tl.max(x, axis=1)
        row_sum = tl.sum(tl.exp(x - row_max[:, None]), axis=1)
    else:
        part_m_ptr = part_ptr + rows64 * (2 * n_chunks)
        part_s_ptr = part_m_ptr + n_chunks
        if MODE != _FROM_STATS:
            chunk_max = tl.max(x, axis=1)
            chunk_sum = tl.sum(tl.exp(x - chunk_max[:, None]), axis=1)
            # A chunk of only -inf contributes nothing (exp(-inf - -inf) would be nan).
            chunk_sum = tl.where(chunk_max == -float("inf"), 0.0, chunk_sum)
            tl.store(part_m_ptr + chunk, chunk_max, mask=row_ok)
            tl.store(part_s_ptr + chunk, chunk_sum, mask=row_ok)
        if MODE == _ONE_PASS:
            _wait_for_peers(count_ptr + row_block * _COUNTER_STRIDE, n_chunks)
        if MODE != _STATS:
            c = tl.arange(0, BLOCK_C)
            pmask = row_ok[:, None] & (c < n_chunks)[None, :]
            m_i = tl.load(part_m_ptr[:, None] + c[None, :], mask=pmask, other=-float("inf"), volatile=True)
            s_i = tl.load(part_s_ptr[:, None] + c[None, :], mask=pmask, other=0.0, volatile=True)
            row_max = tl.max(m_i, axis=1)
            scaled = tl.where(m_i == -float("inf"), 0.0, s_i * tl.exp(m_i - row_max[:, None]))
            row_sum = tl.sum(scaled, axis=1)

    if MODE != _STATS:
        y = tl.exp(x - row_max[:, None]) * (1.0 / row_sum)[:, None]
        tl.store(y_ptr + rows64[:, None] * stride_y + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_looped_kernel(
    x_ptr,  # (M, N) input, unit column stride
    y_ptr,  # (M, N) output, unit column stride
    n_cols,  # N
    stride_x,  # elements between rows of x
    stride_y,  # elements between rows of y
    BLOCK_N: tl.constexpr,  # columns per step
):
    """One program a row, any width: an online pass for (max, sum of exp), then a normalising pass.

    The running max and sum are kept per lane (no reduction inside the loop) and combined
    once at the end. The second pass re-reads the row, which the first has just brought
    into L2: one HBM read and one write while the rows in flight fit in the L2, at most two
    reads and a write when they do not.
    """
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x
    y_row = y_ptr + row * stride_y
    cols = tl.arange(0, BLOCK_N)
    run_max = tl.full([BLOCK_N], -float("inf"), tl.float32)
    run_sum = tl.zeros([BLOCK_N], tl.float32)
    nan_seen = tl.zeros([BLOCK_N], tl.int32)  # max/where drop nan: track it, the row is then nan
    for start in range(0, n_cols, BLOCK_N):
        offs = start + cols
        x = tl.load(x_row + offs, mask=offs < n_cols, other=-float("inf")).to(tl.float32)
        nan_seen = nan_seen | (x != x).to(tl.int32)
        new_max = tl.maximum(run_max, x)
        empty = new_max == -float("inf")  # nothing but -inf on this lane so far
        rescale = tl.where(empty, 0.0, tl.exp(run_max - new_max))
        run_sum = run_sum * rescale + tl.where(empty, 0.0, tl.exp(x - new_max))
        run_max = new_max
    row_max = tl.max(run_max, axis=0)
    lane_sum = tl.where(run_max == -float("inf"), 0.0, run_sum * tl.exp(run_max - row_max))
    inv_sum = 1.0 / tl.sum(lane_sum, axis=0)
    row_max = tl.where(tl.max(nan_seen, axis=0) > 0, float("nan"), row_max)
    for start in range(0, n_cols, BLOCK_N):
        offs = start + cols
        mask = offs < n_cols
        x = tl.load(x_row + offs, mask=mask, other=0.0).to(tl.float32)
        y = tl.exp(x - row_max) * inv_sum
        tl.store(y_row + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


_FLT_MAX = tl.constexpr(3.4028234663852886e38)
# Spin until the int32 at $1 is >= $2: an acquire load a try (every thread: each then holds
# its own acquire), with a nanosleep back-off from 32 to 256 ns between tries so that the
# waiters of a row cost its counter's line a few requests a microsecond, not one a clock.
_SPIN_ASM = tl.constexpr("""{
.reg .pred %p_done;
.reg .u32 %ns;
mov.u32 %ns, 32;
SPIN_TRY:
ld.acquire.gpu.global.u32 $0, [$1];
setp.ge.s32 %p_done, $0, $2;
@%p_done bra SPIN_DONE;
nanosleep.u32 %ns;
shl.b32 %ns, %ns, 1;
min.u32 %ns, %ns, 256;
bra SPIN_TRY;
SPIN_DONE:
}""")


_LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _exp(x, FAST_EXP: tl.constexpr):
    """exp(x) as 2^(x log2 e); ``FAST_EXP``: one ``ex2.approx.ftz`` (tl.exp2 adds three instructions for
    subnormal results, which a softmax flushes to 0 anyway); off under the interpreter, which runs no PTX."""
    if FAST_EXP:
        return tl.inline_asm_elementwise(
            "ex2.approx.ftz.f32 $0, $1;", "=f,f", [x * _LOG2E], dtype=tl.float32, is_pure=True, pack=1
        )
    else:
        return tl.exp2(x * _LOG2E)


@triton.jit
def _first_tile(sync_ptr, n_rows, GROUP: tl.constexpr):
    """A split-walk program's first tile: its program id (round robin) when GROUP == 1, else a ticket."""
    if GROUP == 1:
        return tl.program_id(0)
    else:
        return tl.atomic_add(sync_ptr + n_rows * _COUNTER_STRIDE, 1, sem="relaxed")


@triton.jit
def _tile_start(tile, n_rows, slice_cols, GROUP: tl.constexpr):
    """(row, first column) of ``tile``; past the last tile the last row: a harmless in-bounds prefetch."""
    return tl.minimum(tile // GROUP, n_rows - 1), (tile % GROUP) * slice_cols


@triton.jit
def _prefetch_target(start, hi, row, next_row, next_lo, BLOCK_N: tl.constexpr):
    """(row, column) that pass two prefetches at step ``start``: the slice's next step, or after the
    slice's last step [.., hi) the next tile's first."""
    nxt = start + BLOCK_N
    last = nxt >= hi
    return tl.where(last, next_row, row), tl.where(last, next_lo, nxt)


@triton.jit
def _exchange_partials(part_ptr, sync_ptr, row, slot, a, b, n_rows, a_other, b_other,
                       GROUP: tl.constexpr, BLOCK_G: tl.constexpr):
    """Publish this slice's partials (a, b) in part[row, slot], wait for the row's GROUP slices, then
    take the next ticket: (every slice's a, every slice's b, next tile), lanes past GROUP a_other, b_other.

    The ticket comes only after the wait, so the tiles handed out form a prefix and no program holds
    two tiles of one row (``_softmax_split_kernel``'s docstring: why that cannot deadlock).
    """
    part_row = part_ptr + row.to(tl.int64) * (2 * GROUP)
    tl.store(part_row + 2 * slot, a)
    tl.store(part_row + 2 * slot + 1, b)
    _arrive_and_wait(sync_ptr + row.to(tl.int64) * _COUNTER_STRIDE, GROUP)
    g = tl.arange(0, BLOCK_G)
    all_a = tl.load(part_row + 2 * g, mask=g < GROUP, other=a_other, volatile=True)
    all_b = tl.load(part_row + 2 * g + 1, mask=g < GROUP, other=b_other, volatile=True)
    return all_a, all_b, tl.atomic_add(sync_ptr + n_rows * _COUNTER_STRIDE, 1, sem="relaxed")


@triton.jit
def _load_chunk(ptrs, in_row, EVEN: tl.constexpr):
    """A chunk of x: unmasked when EVEN, else masked to the row with -inf beyond it (exp gives 0)."""
    if EVEN:
        return tl.load(ptrs)
    else:
        return tl.load(ptrs, mask=in_row, other=-float("inf"))


@triton.jit
def _arrive_and_wait(count_ptr, n_peers):
    """Arrive at ``count_ptr`` (release) and wait, with back-off, until ``n_peers`` have arrived (acquire)."""
    tl.debug_barrier()  # every thread's partial stores precede the release
    tl.atomic_add(count_ptr, 1, sem="release", scope="gpu")
    tl.inline_asm_elementwise(_SPIN_ASM, "=r,l,r", [count_ptr, n_peers], dtype=tl.int32, is_pure=False, pack=1)
    tl.debug_barrier()


@triton.jit
def _softmax_split_kernel(
    x_ptr,  # (M, N) input, unit column stride
    y_ptr,  # (M, N) output, unit column stride
    part_ptr,  # (M, GROUP, 2) float32 partial (max, sum of exp) per row and slice; unused when GROUP == 1
    sync_ptr,  # ((M + 1) * _COUNTER_STRIDE,) int32 zeros: arrivals per row, then the ticket; unused when GROUP == 1
    n_rows,  # M
    n_cols,  # N
    stride_x,  # elements between rows of x
    stride_y,  # elements between rows of y
    slice_cols,  # columns per slice: a multiple of BLOCK_N, GROUP slices cover a row, none empty
    n_programs,  # programs launched (persistent: a few an SM)
    GROUP: tl.constexpr,  # slices (programs) per row
    BLOCK_N: tl.constexpr,  # columns per step
    BLOCK_G: tl.constexpr,  # next_power_of_2(GROUP)
    FAST_EXP: tl.constexpr,  # exponentials by ex2.approx.ftz (not under the interpreter)
    SUB: tl.constexpr,  # neighbouring elements reduced in-thread before the online step (16 bytes' worth)
    HOLD: tl.constexpr,  # a tile is one step (slice_cols == BLOCK_N): pass two reuses the registers, no re-read
    EVEN: tl.constexpr,  # n_cols % BLOCK_N == 0: no column masks
    EARLY: tl.constexpr,  # HOLD and GROUP == 1: the next tile's loads go out before this one's reductions
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
    """
    n_tiles = n_rows * GROUP
    tile = _first_tile(sync_ptr, n_rows, GROUP)
    cols = tl.arange(0, BLOCK_N)
    row, lo = _tile_start(tile, n_rows, slice_cols, GROUP)
    x_next = _load_chunk(x_ptr + row.to(tl.int64) * stride_x + lo + cols, lo + cols < n_cols, EVEN)
    while tile < n_tiles:
        row = tile // GROUP
        lo = (tile % GROUP) * slice_cols
        hi = tl.minimum(lo + slice_cols, n_cols)
        x_row = x_ptr + row.to(tl.int64) * stride_x
        y_row = y_ptr + row.to(tl.int64) * stride_y
        run_max = tl.full([BLOCK_N // SUB], -_FLT_MAX, tl.float32)
        run_sum = tl.zeros([BLOCK_N // SUB], tl.float32)
        for start in range(lo, hi, BLOCK_N):
            x = tl.reshape(x_next.to(tl.float32), (BLOCK_N // SUB, SUB))
            if not HOLD:  # HOLD: x_next stays this chunk, which pass two normalises from registers
                nxt = start + BLOCK_N
                nxt = tl.where(nxt < hi, nxt, lo)  # after the last chunk: the first again, for pass two
                x_next = _load_chunk(x_row + nxt + cols, nxt + cols < n_cols, EVEN)
            # A thread's SUB neighbours first (no exchange), then one online step per SUB.
            sub_max = tl.maximum(tl.max(x, axis=1), -_FLT_MAX)  # -inf only: 0 terms, not nan
            sub_sum = tl.sum(_exp(x - sub_max[:, None], FAST_EXP), axis=1)  # nan or +inf: nan, kept to the end
            new_max = tl.maximum(run_max, sub_max)
            e = _exp(tl.minimum(run_max, sub_max) - new_max, FAST_EXP)  # the old sum's rescale, or the new one's
            run_sum = tl.where(sub_max > run_max, run_sum * e + sub_sum, run_sum + sub_sum * e)
            run_max = new_max
        if EARLY:  # the next tile is known without a wait: its loads fly during the reductions
            x_held = x_next
            early_row, early_lo = _tile_start(tile + n_programs, n_rows, slice_cols, GROUP)
            early_ptr = x_ptr + early_row.to(tl.int64) * stride_x + early_lo + cols
            x_next = _load_chunk(early_ptr, early_lo + cols < n_cols, EVEN)
        tile_max = tl.max(run_max, axis=0)
        tile_sum = tl.sum(run_sum * _exp(run_max - tile_max, FAST_EXP), axis=0)
        if GROUP == 1:
            row_max = tile_max
            row_sum = tile_sum
            next_tile = tile + n_programs
        else:
            p_max, p_sum, next_tile = _exchange_partials(
                part_ptr, sync_ptr, row, tile % GROUP, tile_max, tile_sum, n_rows, -_FLT_MAX, 0.0, GROUP, BLOCK_G
            )
            row_max = tl.max(p_max, axis=0)
            row_sum = tl.sum(p_sum * _exp(p_max - row_max, FAST_EXP), axis=0)
        inv_sum = 1.0 / row_sum
        next_row, next_lo = _tile_start(next_tile, n_rows, slice_cols, GROUP)
        for start in range(lo, hi, BLOCK_N):
            if EARLY:
                x = x_held.to(tl.float32)
            else:
                x = x_next.to(tl.float32)
                pre_row, pre_col = _prefetch_target(start, hi, row, next_row, next_lo, BLOCK_N)
                pre_ptr = x_ptr + pre_row.to(tl.int64) * stride_x + pre_col + cols
                x_next = _load_chunk(pre_ptr, pre_col + cols < n_cols, EVEN)
            y = _exp(x - row_max, FAST_EXP) * inv_sum
            if EVEN:
                tl.store(y_row + start + cols, y.to(y_ptr.dtype.element_ty))
            else:
                tl.store(y_row + start + cols, y.to(y_ptr.dtype.element_ty), mask=start + cols < n_cols)
        tile = next_tile


class _Plan(NamedTuple):
    """How one softmax is launched; ``_softmax_settings`` makes it, benchmarks may vary it."""

    mode: str  # "rows", "looped", "persistent", "split", "one_pass" or "two_pass"
    block_m: int
    block_n: int
    num_warps: int
    group: int = 1  # "split": programs (slices) per row; "persistent" is "split" with 1
    per_sm: int = 0  # "persistent", "split": programs launched per SM
    even: bool = False  # "persistent", "split": no column masks where the chunks divide the row


# The heuristics, from the H200 sweeps (docs/kernels.md, "softmax"): rows up to
# _MAX_ROW wide are held whole by one program, _ROWS_TILE elements per program for narrow
# rows, 32 per thread (at least 4 warps); wider rows are cut into _CHUNK-wide chunks.
_MAX_ROW = 16384
_ROWS_TILE = 2048
_CHUNK = 4096
_ELEMS_PER_THREAD = 32
# The plan for rows wider than _MAX_ROW, from the H200 sweeps (docs/kernels.md, "softmax"). "auto":
# "persistent" (a program an SM walks whole rows twice, the second time from L2, the next chunk
# always in flight) for rows up to _PERSISTENT_MAX_ROW_BYTES,
# "split" (a row cut into slices, programs exchanging (max, sum) with a back-off wait) wider.
# Measured at 65536 / 262144: persistent 70-80% / 63-64% of copy, split 74-76% / 70-73% (fp32
# slices held in registers 80% / 75%), against "looped" 51-57% / 47-58% and Liger 62-64%
# (65536; it refuses 262144). "looped",
# "one_pass" (13-66%) and "two_pass" (7-36%) stay selectable by name.
_WIDE_ROWS_PLAN = "auto"
_PERSISTENT_MAX_ROW_BYTES = 131072
_LOOPED_WARPS = 16
_PERSISTENT_CHUNK_BYTES = 65536  # one program an SM, one chunk of loads in flight
_PERSISTENT_WARPS = 16
_SPLIT_CHUNK_BYTES = 16384  # three programs an SM: 48 KB in flight
_SPLIT_WARPS = 8
_SPLIT_PER_SM = 3
# fp32 rows up to _MAX_SPLIT_GROUP slices: one 64 KiB step a slice, held in registers for pass
# two (HOLD), one 16-warp program an SM: 76-80% of copy against 73-74% re-reading from L2. 16-bit
# slices held so measured 48-63%: they keep the 16 KB steps (docs/kernels.md, "softmax").
_SPLIT_HOLD_MIN_ELEM_SIZE = 4
_SPLIT_HOLD_WARPS = 16
_SPLIT_SLICE_BYTES = 65536  # 3 x 132 slices in flight = 26 MB (held: 132 = 9 MB), under half the L2
_MAX_SPLIT_GROUP = 16  # programs a row waits on: far below what a GPU holds at once
# Drop the column masks of the split kernel when the chunks divide the row: 10-15% fewer
# instructions in its loops (sm_90 SASS), but timed within 1-3 points of the masked kernel, so off
# (docs/kernels.md, "The split walk").
_SPLIT_EVEN = False
_INTERPRETER_SMS = 3  # "SMs" under the interpreter: few, so programs walk several tiles
_ONE_PASS_WARPS = 4  # measured best for one_pass chunks of 2048-4096
# Chunks a row may need before the one-pass plan (which needs them co-resident) gives way
# to the two-pass fallback; far below the programs an H100/H200 holds at once.
_MAX_ONE_PASS_CHUNKS = 128
_MAX_CHUNKS = 4096


def _warps_for(elements: int) -> int:
    return max(4, min(16, elements // (32 * _ELEMS_PER_THREAD)))


def _split_group(n_cols: int, block_n: int, group: int) -> tuple[int, int]:
    """(programs per row, columns per slice) for ``group`` slices asked: whole chunks a slice, none empty."""
    n_steps = triton.cdiv(n_cols, block_n)
    steps = triton.cdiv(n_steps, max(1, min(group, n_steps)))
    return triton.cdiv(n_steps, steps), steps * block_n


def _softmax_settings(
    n_rows: int,
    n_cols: int,
    elem_size: int,
    *,
    max_row: int | None = None,
    one_pass: bool | None = None,
    wide: str | None = None,
) -> _Plan:
    """The launch plan for an (n_rows, n_cols) softmax: the one place its heuristics live.

    ``max_row`` overrides the widest row held by one program (tests force the chunked
    plans with a small value; it is then also the chunk width); ``one_pass=False`` forces
    the two-pass fallback, ``True`` the one-pass plan (never under the interpreter).
    ``wide`` names the plan for wide rows instead of ``_WIDE_ROWS_PLAN``; "split" with more
    than one program a row waits on other programs, so under the interpreter an explicit
    ``wide="split"`` is refused and the ``_WIDE_ROWS_PLAN`` choice runs one program a row.
    ``elem_size`` sizes the persistent and split chunks (bytes in flight).
    """
    widest = max_row if max_row is not None else _MAX_ROW
    if n_cols <= widest:
        block_n = next_power_of_2(n_cols)
        block_m = max(1, min(_ROWS_TILE // block_n, next_power_of_2(n_rows)))
        return _Plan("rows", block_m, block_n, _warps_for(block_m * block_n))
    chunk = next_power_of_2(max_row) if max_row is not None else _CHUNK
    # Beyond _MAX_CHUNKS chunks a row's partials would crowd one program: widen the chunks.
    chunk = max(chunk, next_power_of_2(triton.cdiv(n_cols, _MAX_CHUNKS)))
    n_chunks = triton.cdiv(n_cols, chunk)
    if one_pass and interpreting():
        raise ValueError("the one-pass chunked plan waits on other programs: it cannot run under the interpreter")
    wide_plan = wide or _WIDE_ROWS_PLAN
    if wide_plan == "auto":
        wide_plan = "persistent" if n_cols * elem_size <= _PERSISTENT_MAX_ROW_BYTES else "split"
    if one_pass is None and wide_plan in ("persistent", "split"):
        split = wide_plan == "split"
        group = min(_MAX_SPLIT_GROUP, triton.cdiv(n_cols * elem_size, _SPLIT_SLICE_BYTES)) if split else 1
        hold = (split and max_row is None and elem_size >= _SPLIT_HOLD_MIN_ELEM_SIZE
                and n_cols * elem_size <= _MAX_SPLIT_GROUP * _SPLIT_SLICE_BYTES)
        warps, per_sm = (_SPLIT_HOLD_WARPS, 1) if hold else (_SPLIT_WARPS, _SPLIT_PER_SM) if split else (_PERSISTENT_WARPS, 1)
        if max_row is None:
            chunk_bytes = _SPLIT_SLICE_BYTES if hold else _SPLIT_CHUNK_BYTES if split else _PERSISTENT_CHUNK_BYTES
            chunk = chunk_bytes // elem_size
        group = _split_group(n_cols, chunk, group)[0]
        if group > 1 and interpreting():
            if wide == "split":
                raise ValueError("the split plan waits on other programs: it cannot run under the interpreter")
            group = 1
        return _Plan(wide_plan, 1, chunk, warps, group, per_sm, _SPLIT_EVEN)
    if one_pass is None and wide_plan == "looped":
        return _Plan("looped", 1, chunk, _LOOPED_WARPS)
    if one_pass is None:
        one_pass = _WIDE_ROWS_PLAN == "one_pass" and not interpreting() and n_chunks <= _MAX_ONE_PASS_CHUNKS
    if one_pass:
        return _Plan("one_pass", 1, chunk, _ONE_PASS_WARPS)
    return _Plan("two_pass", 1, chunk, _warps_for(chunk))


def _launch(x2: torch.Tensor, y2: torch.Tensor, plan: _Plan) -> None:
    n_rows, n_cols = x2.shape
    n_row_blocks = triton.cdiv(n_rows, plan.block_m)
    common = dict(BLOCK_M=plan.block_m, BLOCK_N=plan.block_n, num_warps=plan.num_warps)
    if plan.mode == "looped":
        _softmax_looped_kernel[(n_rows,)](
            x2, y2, n_cols, x2.stride(0), y2.stride(0), BLOCK_N=plan.block_n, num_warps=plan.num_warps
        )
        return
    if plan.mode in ("persistent", "split"):
        _launch_split(x2, y2, plan)
        return
    if plan.mode == "rows":
        _softmax_fwd_kernel[(n_row_blocks,)](
            x2, y2, x2, x2, n_rows, n_cols, x2.stride(0), y2.stride(0), 1, MODE=_ROWS, BLOCK_C=1, **common
        )
        return
    n_chunks = triton.cdiv(n_cols, plan.block_n)
    block_c = next_power_of_2(n_chunks)
    part = torch.empty((n_rows, 2, n_chunks), dtype=torch.float32, device=x2.device)
    grid = (n_row_blocks * n_chunks,)
    args = (x2, y2, part)
    strides = (n_rows, n_cols, x2.stride(0), y2.stride(0), n_chunks)
    if plan.mode == "one_pass":
        count = torch.zeros((n_row_blocks + 1) * _COUNTER_STRIDE_INTS, dtype=torch.int32, device=x2.device)
        _softmax_fwd_kernel[grid](*args, count, *strides, MODE=_ONE_PASS, BLOCK_C=block_c, **common)
    else:
        _softmax_fwd_kernel[grid](*args, part, *strides, MODE=_STATS, BLOCK_C=block_c, **common)
        _softmax_fwd_kernel[grid](*args, part, *strides, MODE=_FROM_STATS, BLOCK_C=block_c, **common)


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return _INTERPRETER_SMS
    return torch.cuda.get_device_properties(device).multi_processor_count


def _split_launch(n_rows: int, group: int, per_sm: int, device: torch.device, unused: torch.Tensor):
    """(programs, part, sync) of a split-walk launch: ``per_sm`` programs an SM (no more than tiles)
    and, for ``group`` > 1, the partials and zeroed counters they exchange through (else ``unused``,
    never read)."""
    if group > 1 and interpreting():
        raise ValueError("the split plan waits on other programs: it cannot run under the interpreter")
    n_programs = max(1, min(n_rows * group, max(1, per_sm) * _sm_count(device)))
    if group == 1:
        return n_programs, unused, unused
    part = torch.empty((n_rows, group, 2), dtype=torch.float32, device=device)
    sync = torch.zeros((n_rows + 1) * _COUNTER_STRIDE_INTS, dtype=torch.int32, device=device)
    return n_programs, part, sync


def _launch_split(x2: torch.Tensor, y2: torch.Tensor, plan: _Plan) -> None:
    n_rows, n_cols = x2.shape
    group, slice_cols = _split_group(n_cols, plan.block_n, plan.group)
    n_programs, part, sync = _split_launch(n_rows, group, plan.per_sm, x2.device, x2)
    _softmax_split_kernel[(n_programs,)](
        x2, y2, part, sync, n_rows, n_cols, x2.stride(0), y2.stride(0), slice_cols, n_programs,
        GROUP=group, BLOCK_N=plan.block_n, BLOCK_G=next_power_of_2(group), FAST_EXP=not interpreting(),
        SUB=max(1, min(plan.block_n, 16 // x2.element_size())), HOLD=slice_cols == plan.block_n,
        EVEN=plan.even and n_cols % plan.block_n == 0, EARLY=group == 1 and slice_cols == plan.block_n,
        num_warps=plan.num_warps,
    )


def _as_rows(x: torch.Tensor) -> torch.Tensor:
    """``x`` as an (M, N) view with unit column stride; copies only when no such view exists."""
    n_cols = x.shape[-1]
    if x.stride(-1) != 1 and n_cols > 1:
        x = x.contiguous()
    try:
        return x.view(-1, n_cols)
    except RuntimeError:  # leading dims not flattenable without a copy
        return x.contiguous().view(-1, n_cols)


def fused(
    x: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    max_row: int | None = None,
    one_pass: bool | None = None,
) -> torch.Tensor:
    """Softmax of ``x`` over its last dimension by the fused kernel (plans: the module docstring).

    ``x``: float32, float16 or bfloat16, at least one dimension, any strides (a last
    dimension that is not contiguous, or leading dims that do not flatten to one, cost a
    copy). Returns a contiguous tensor of ``x``'s shape and dtype, written into ``out``
    when given (contiguous, same shape, dtype and device). ``max_row`` and ``one_pass``
    override the launch heuristic (``_softmax_settings``), for tests.
    """
    check_tensor(x, "x", min_ndim=1)
    y = _output(x, out)
    if x.numel() == 0:
        return y
    x2 = _as_rows(x)
    y2 = y.view(-1, x.shape[-1])
    plan = _softmax_settings(x2.shape[0], x2.shape[1], x.element_size(), max_row=max_row, one_pass=one_pass)
    _launch(x2, y2, plan)
    return y


def _output(x: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    if out is None:
        return torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if not isinstance(out, torch.Tensor) or out.shape != x.shape or out.dtype != x.dtype or out.device != x.device:
        raise ValueError(f"out must be a tensor of x's shape {tuple(x.shape)}, dtype {x.dtype} and device {x.device}")
    if not out.is_contiguous():
        raise ValueError("out must be contiguous")
    return out


def unfused(x: torch.Tensor) -> torch.Tensor:
    """The five-op softmax as people write it; traffic per line for x of shape (M, N)."""
    x_max = x.amax(dim=-1, keepdim=True)  # read MN elements ; write M elements
    z = x - x_max  # read MN + M elements ; write MN elements
    numerator = torch.exp(z)  # read MN elements ; write MN elements
    denominator = numerator.sum(dim=-1, keepdim=True)  # read MN elements ; write M elements
    return numerator / denominator  # read MN + M elements ; write MN elements


def _rows_cols(x: torch.Tensor) -> tuple[int, int]:
    n_cols = x.shape[-1] if x.dim() else 1
    return (x.numel() // n_cols if n_cols else 0), n_cols


def budget(x: torch.Tensor) -> Budget:
    """Compulsory traffic of a softmax of ``x``: read x once, write y once."""
    m, n = _rows_cols(x)
    size = x.element_size()
    return Budget(read_bytes=m * n * size, write_bytes=m * n * size, label="softmax")


def unfused_traffic(x: torch.Tensor) -> Budget:
    """Traffic of ``unfused(x)``: the sum of its line comments, each op reading from and writing to HBM."""
    m, n = _rows_cols(x)
    size = x.element_size()
    reads = (m * n) + (m * n + m) + (m * n) + (m * n) + (m * n + m)
    writes = m + (m * n) + (m * n) + m + (m * n)
    return Budget(read_bytes=reads * size, write_bytes=writes * size, label="softmax, five ops")
