"""Fused softmax over the last dimension, for any row width.

Four launch plans (three share one kernel) (``MODE`` picks the code path at compile time);
``_softmax_settings`` chooses:

* ``rows`` (rows up to 16384 wide): a program loads ``BLOCK_M`` whole rows, reduces max and
  sum of exponentials in registers and writes the result: one read, one write. Measured
  92-100% of copy bandwidth on an H200.
* ``looped`` (wider rows, the default): one program a row walks it in ``_CHUNK`` steps
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
  its first H200 measurement was slow (notes/softmax_layer_norm.md says why and what
  changed since).

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
# do not queue behind those spinning on the next (see notes/softmax_layer_norm.md).
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


class _Plan(NamedTuple):
    """How one softmax is launched; ``_softmax_settings`` makes it, benchmarks may vary it."""

    mode: str  # "rows", "looped", "one_pass" or "two_pass"
    block_m: int
    block_n: int
    num_warps: int


# The heuristics, from the H200 sweep of 2026-11-29 (notes/softmax_layer_norm.md): rows up to
# _MAX_ROW wide are held whole by one program, _ROWS_TILE elements per program for narrow
# rows, 32 per thread (at least 4 warps); wider rows are cut into _CHUNK-wide chunks.
_MAX_ROW = 16384
_ROWS_TILE = 2048
_CHUNK = 4096
_ELEMS_PER_THREAD = 32
# The plan for rows wider than _MAX_ROW. "looped" (one program a row, two passes over it,
# the second from L2) is the default: on the H200 "one_pass" measured 13-58% of copy and
# "two_pass" 7-20% at 65536-262144 (2026-11-29 sweep, notes/softmax_layer_norm.md), below
# the 62-64% Liger and torch.compile reach with a looped kernel of this shape.
_WIDE_ROWS_PLAN = "looped"
_LOOPED_WARPS = 16
_ONE_PASS_WARPS = 4  # measured best for one_pass chunks of 2048-4096
# Chunks a row may need before the one-pass plan (which needs them co-resident) gives way
# to the two-pass fallback; far below the programs an H100/H200 holds at once.
_MAX_ONE_PASS_CHUNKS = 128
_MAX_CHUNKS = 4096


def _warps_for(elements: int) -> int:
    return max(4, min(16, elements // (32 * _ELEMS_PER_THREAD)))


def _softmax_settings(
    n_rows: int, n_cols: int, elem_size: int, *, max_row: int | None = None, one_pass: bool | None = None
) -> _Plan:
    """The launch plan for an (n_rows, n_cols) softmax: the one place its heuristics live.

    ``max_row`` overrides the widest row held by one program (tests force the chunked
    plans with a small value; it is then also the chunk width); ``one_pass=False`` forces
    the two-pass fallback, ``True`` the one-pass plan (never under the interpreter).
    ``elem_size`` is accepted for dtype-specific tuning; the H200 sweep found none needed.
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
    if one_pass is None and _WIDE_ROWS_PLAN == "looped":
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
