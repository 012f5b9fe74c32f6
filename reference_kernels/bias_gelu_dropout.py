"""``dropout(gelu(x + bias), p)`` in one pass over x, with a reproducible counter-based mask.

One read of x (and bias), one write of y: the bias add, the GELU, the random draw, the
keep/drop decision and the 1/(1-p) scaling all happen in registers. Eager PyTorch spends
three to four passes on the same chain; even compiled, it draws one Philox call per
element, which makes the chain arithmetic-bound. So does ours, to a lesser degree: the
draw is what separates it from the copy roofline (docs/kernels.md, "bias_gelu_dropout").

The mask is a pure function of ``(seed, row, column)``: element (i, j) of the (rows, N)
view of x uses 16-bit lane ``j % 8`` of Philox-4x32-10 counter ``i * ceil(N / 8) + j // 8``
(the stream of ``tl.randint4x``, which ``_philox4x32`` reproduces bit for bit: 128 random
bits per call, split into eight 16-bit draws). An element is dropped when its draw is below
``round(p * 65536)``, so the drop rate is p to within 2**-17, while kept values are scaled
by the nominal 1/(1-p). ``dropout_mask`` materialises the same mask with the same helper,
so ``unfused`` reproduces ``fused`` exactly, whatever block sizes either launch uses.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from pytest_fusioncheck.budget import Budget

from ._common import cdiv, check_tensor, interpreting, next_power_of_2, traced_result, tracing
from ._device import sm_count
from ._math import gelu, phi_scaled, widen
from ._launch import Calls, launch as launch_kernel

RNG_BITS = 16  # bits of randomness per element: 8 elements per Philox call
PHILOX_ROUNDS = 10  # Philox-4x32-10, as cuRAND and tl.rand use
_APPROXIMATIONS = ("none", "tanh")
# "lean" (the default): the same mask, GELU fit folded with the scale, fewer instructions an
# element, persistent programs prefetching their next row tile: 78-79% of copy on the H200
# (docs/kernels.md, "bias_gelu_dropout"); exact GELU and 16-bit draws only, the rest takes
# "measured" (the first kernel, 65% of copy; one program a tile, nothing hoisted).
_VARIANTS = ("measured", "lean")
_KERNEL_VARIANT = "lean"
# Lean kernel: programs per SM, each walking row tiles. More, smaller programs (4-8 elements a
# thread, 39 registers: 48 warps an SM instead of 32) measured no better: 73-79% against 78%.
_LEAN_PROGRAMS_PER_SM = 2
_LEAN_WARPS = 16  # lean tiles of 8K elements on 16 warps: 75% of copy against 70% on 8 (GELU degree 7)
# Degree of the GELU fit for 16-bit outputs in the lean kernel (fp32 outputs always take 7). 5 saves
# 2 of ~29 instructions an element and stays within 1 bf16/fp16 ulp of the correctly rounded
# GELU (scripts/gelu_fit.py); on the H200 78-79% of copy against 74-75% for 7 (two runs).
_LEAN_GELU_DEGREE_16BIT = 5


# --------------------------------------------------------------------------- kernels


def _launch_metadata(grid, kernel, args):
    """What profilers (and pytest-fusioncheck's byte model) read off a launch.

    "flops" is an estimate: ~30 fp32 operations an element for the bias add, the GELU and
    the scaling; the integer work of the draw is not counted.
    """
    M, N = args["M"], args["N"]
    elt = args["y_ptr"].element_size()
    return {"name": f"{kernel.name} [M={M}, N={N}]", "bytes": elt * (2 * M * N + N), "flops": 30 * M * N}


@triton.jit
def _philox_products(c0, c2, FAST: tl.constexpr):
    """The two 32x32 -> 64-bit products of a Philox round as (hi, lo) words: c2 * 0xCD9E8D57 and
    c0 * 0xD2511F53, one IMAD.WIDE each on CUDA. Left to itself, LLVM merges the rounds'
    truncations and XORs into 64-bit operations, and ptxas then pays extra IMADs and IADD3s."""
    if FAST:
        return tl.inline_asm_elementwise(
            "{ .reg .b64 pb, pa; mul.wide.u32 pb, $5, 0xCD9E8D57; mul.wide.u32 pa, $4, 0xD2511F53; "
            "mov.b64 {$1, $0}, pb; mov.b64 {$3, $2}, pa; }",
            "=r,=r,=r,=r,r,r", [c0, c2], dtype=(tl.uint32, tl.uint32, tl.uint32, tl.uint32), is_pure=True, pack=1)
    else:
        prod_b = c2.to(tl.uint64) * 0xCD9E8D57
        prod_a = c0.to(tl.uint64) * 0xD2511F53
        return (prod_b >> 32).to(tl.uint32), prod_b.to(tl.uint32), (prod_a >> 32).to(tl.uint32), prod_a.to(tl.uint32)


@triton.jit
def _philox4x32(seed, counter, N_ROUNDS: tl.constexpr, FAST: tl.constexpr = False):
    """``tl.randint4x(seed, counter, N_ROUNDS)``, bit for bit, with each 32x32-bit product
    taken as one 64-bit multiply (one IMAD.WIDE, high and low halves at once) instead of
    separate high and low multiplies: a third fewer instructions for the draw. ``FAST``
    (CUDA only) issues the products as inline PTX: 4 instructions a round."""
    seed = seed.to(tl.uint64)
    k0 = (seed & 0xFFFFFFFF).to(tl.uint32)
    k1 = ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32)
    c0 = counter.to(tl.uint32)
    zero = c0 * 0
    if counter.dtype.primitive_bitwidth > 32:
        c1 = (counter >> 32).to(tl.uint32)
    else:
        c1 = zero
    c2 = zero
    c3 = zero
    for _ in tl.static_range(N_ROUNDS):
        hi_b, lo_b, hi_a, lo_a = _philox_products(c0, c2, FAST)
        c0 = hi_b ^ c1 ^ k0
        c2 = hi_a ^ c3 ^ k1
        c1 = lo_b
        c3 = lo_a
        k0 = tl.add(k0, 0x9E3779B9, sanitize_overflow=False)
        k1 = tl.add(k1, 0xBB67AE85, sanitize_overflow=False)
    return c0, c1, c2, c3


@triton.jit
def _lane_words(
    seed,  # scalar Philox key
    rows,  # (BLOCK_M,) row indices
    groups,  # (G,) column-group indices: columns LANES*g .. LANES*g + LANES-1
    groups_per_row,  # ceil(N / LANES): counters per row
    LANES: tl.constexpr,  # draws per counter: 128 // bits a draw
    WIDE: tl.constexpr,  # counters may pass 2**31: compute them in int64
    N_ROUNDS: tl.constexpr,  # Philox rounds
    FAST: tl.constexpr = False,  # Philox products as inline PTX (CUDA)
):
    """(BLOCK_M, G, LANES) uint32: for each draw, the 32-bit Philox word that holds it. The mask's
    definition, shared by every kernel that draws it: lane l of group g in row i is in word
    l // (LANES // 4) of the Philox-4x32 output for counter i * groups_per_row + g."""
    if WIDE:
        counter = rows.to(tl.int64)[:, None] * groups_per_row + groups[None, :]
    else:
        counter = rows[:, None] * groups_per_row + groups[None, :]
    r0, r1, r2, r3 = _philox4x32(seed, counter, N_ROUNDS, FAST)
    word = tl.arange(0, LANES)[None, None, :] // (LANES // 4)
    return tl.where(word == 0, r0[:, :, None],
                    tl.where(word == 1, r1[:, :, None], tl.where(word == 2, r2[:, :, None], r3[:, :, None])))


@triton.jit
def _keep(
    seed,  # scalar Philox key
    rows,  # (BLOCK_M,) row indices
    groups,  # (BLOCK_N // LANES,) column-group indices: columns LANES*g .. LANES*g + LANES-1
    groups_per_row,  # ceil(N / LANES): counters per row
    threshold,  # drop where the draw < threshold
    RNG_BITS: tl.constexpr,
    WIDE: tl.constexpr,  # counters may pass 2**31: compute them in int64
    N_ROUNDS: tl.constexpr,  # Philox rounds
):
    """(BLOCK_M, BLOCK_N // LANES, LANES) keep-mask, LANES = 128 // RNG_BITS draws per counter."""
    LANES: tl.constexpr = 128 // RNG_BITS
    PER_WORD: tl.constexpr = 32 // RNG_BITS
    r = _lane_words(seed, rows, groups, groups_per_row, LANES, WIDE, N_ROUNDS)
    lane = tl.arange(0, LANES)[None, None, :]
    draw = (r >> ((lane % PER_WORD) * RNG_BITS).to(tl.uint32)) & ((1 << RNG_BITS) - 1)
    return draw.to(tl.int32) >= threshold


@triton.jit(launch_metadata=_launch_metadata, do_not_specialize=["seed", "threshold"])
def _bias_gelu_dropout_kernel(
    x_ptr,  # (M, N), row stride stride_xm, unit column stride
    bias_ptr,  # (N,)
    y_ptr,  # (M, N) contiguous output
    M,  # rows of the (rows, N) view
    N,  # columns
    stride_xm,  # row stride of x
    seed,  # scalar Philox key
    threshold,  # drop where the 16-bit draw < threshold; round(p * 2**RNG_BITS)
    scale,  # 1 / (1 - p), or 0 when p == 1
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    RNG_BITS: tl.constexpr,
    HAS_DROPOUT: tl.constexpr,  # p > 0 (else no random numbers are drawn)
    GELU_MODE: tl.constexpr,  # see _math.gelu: 0 exact, 1 tanh, 2 exact with PTX fast-math
    WIDE: tl.constexpr,
    N_ROUNDS: tl.constexpr,
):
    LANES: tl.constexpr = 128 // RNG_BITS
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    groups = tl.program_id(1) * (BLOCK_N // LANES) + tl.arange(0, BLOCK_N // LANES)
    cols = groups[None, :, None] * LANES + tl.arange(0, LANES)[None, None, :]  # (1, G, LANES)
    in_cols = cols < N
    mask = (rows[:, None, None] < M) & in_cols
    rows64 = rows.to(tl.int64)[:, None, None]
    x = tl.load(x_ptr + rows64 * stride_xm + cols, mask=mask, other=0.0)
    b = tl.load(bias_ptr + cols, mask=in_cols, other=0.0)
    y = gelu(x.to(tl.float32) + b.to(tl.float32), GELU_MODE)
    if HAS_DROPOUT:
        keep = _keep(seed, rows, groups, tl.cdiv(N, LANES), threshold, RNG_BITS, WIDE, N_ROUNDS)
        y = y * tl.where(keep, scale, 0.0)  # a multiply, so NaN/inf stay NaN when dropped, like torch
    tl.store(y_ptr + rows64 * N + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["seed", "threshold"])
def _dropout_mask_kernel(
    mask_ptr,  # (M, N) uint8 output, 1 = keep
    M,  # rows
    N,  # columns
    seed,  # scalar Philox key
    threshold,  # drop where the draw < threshold
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    RNG_BITS: tl.constexpr,
    WIDE: tl.constexpr,
    N_ROUNDS: tl.constexpr,
):
    LANES: tl.constexpr = 128 // RNG_BITS
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    groups = tl.program_id(1) * (BLOCK_N // LANES) + tl.arange(0, BLOCK_N // LANES)
    cols = groups[None, :, None] * LANES + tl.arange(0, LANES)[None, None, :]
    keep = _keep(seed, rows, groups, tl.cdiv(N, LANES), threshold, RNG_BITS, WIDE, N_ROUNDS)
    ptrs = mask_ptr + rows.to(tl.int64)[:, None, None] * N + cols
    tl.store(ptrs, keep.to(tl.uint8), mask=(rows[:, None, None] < M) & (cols < N))


@triton.jit
def _load_f32(ptrs, mask, FAST: tl.constexpr):
    """Load and widen to fp32 (``_math.widen``: on CUDA, bf16 pairs straight from the loaded 32-bit register, one
    shift or AND each; the compiler's own conversion spends a PRMT, a MOV and a shift on the odd element)."""
    v = tl.load(ptrs) if mask is None else tl.load(ptrs, mask=mask, other=0.0)
    return widen(v, FAST)


@triton.jit
def _load_tile(x_ptr, row0, x_offs, local, col_mask, M, stride_xm, EVEN: tl.constexpr):
    """The raw x tile of BLOCK_M rows from ``row0`` (masked unless EVEN)."""
    ptrs = x_ptr + tl.cast(row0, tl.int64) * stride_xm + x_offs
    if EVEN:
        return tl.load(ptrs)
    else:
        return tl.load(ptrs, mask=(row0 + local < M) & col_mask, other=0.0)


@triton.jit(launch_metadata=_launch_metadata, do_not_specialize=["seed", "threshold16", "scale", "log2_scale"])
def _bias_gelu_dropout_lean_kernel(
    x_ptr,  # (M, N), row stride stride_xm, unit column stride
    bias_ptr,  # (N,)
    y_ptr,  # (M, N) contiguous output
    M,  # rows of the (rows, N) view
    N,  # columns
    stride_xm,  # row stride of x
    seed,  # scalar Philox key
    threshold16,  # round(p * 2**16) << 16 as an int32 bit pattern: keep where (draw << 16) >= it, unsigned
    scale,  # effective 1 / (1 - p): 1 without a draw, 0 when everything is dropped
    log2_scale,  # log2(scale), -inf for 0
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_DROPOUT: tl.constexpr,  # 0 < threshold < 2**16 (else no random numbers are drawn)
    FAST: tl.constexpr,  # PTX rcp.approx / ex2.approx (CUDA); IEEE division and exp2 otherwise
    EVEN: tl.constexpr,  # M % BLOCK_M == 0 and N % BLOCK_N == 0: no bounds masks
    WIDE: tl.constexpr,  # Philox counters may pass 2**31: compute them in int64
    N_ROUNDS: tl.constexpr,
    GELU_DEGREE: tl.constexpr,  # 7, or 5 for 16-bit outputs (see _math.phi_scaled)
):
    """The first ("measured") kernel's outputs and mask with fewer instructions an element (docs/kernels.md).

    A grid of (programs over rows, column tiles): each program loads and widens its bias
    tile once and walks row tiles with a stride, so the key schedule, the bias and the
    address set-up are paid once per program. The keep test compares each 16-bit draw in
    the top half of a 32-bit word against threshold << 16 (one compare for odd lanes, a
    shift and a compare for even ones), and the 1/(1-p) scale lives in the GELU fit. The next row
    tile's loads are issued before this one is computed: without that prefetch, two
    programs an SM with nothing in flight while computing ran at 63% of copy on the H200, p = 0
    too (docs/kernels.md, "bias_gelu_dropout").
    """
    LANES: tl.constexpr = 8
    groups = tl.program_id(1) * (BLOCK_N // LANES) + tl.arange(0, BLOCK_N // LANES)
    lane = tl.arange(0, LANES)[None, None, :]
    cols = groups[None, :, None] * LANES + lane  # (1, G, LANES)
    groups_per_row = tl.cdiv(N, LANES)
    local = tl.arange(0, BLOCK_M)[:, None, None]
    if EVEN:
        col_mask = None
    else:
        col_mask = cols < N
    b = _load_f32(bias_ptr + cols, col_mask, FAST)
    if HAS_DROPOUT:
        thr = tl.cast(threshold16, tl.uint32, bitcast=True)
    if BLOCK_M == 1:
        x_offs = cols
        y_offs = cols
    else:
        x_offs = local.to(tl.int64) * stride_xm + cols
        y_offs = local.to(tl.int64) * N + cols
    step = tl.num_programs(0) * BLOCK_M
    last0 = (M - 1) // BLOCK_M * BLOCK_M  # the last row tile: prefetches past it reload it (in bounds, unused)
    x_next = _load_tile(x_ptr, tl.program_id(0) * BLOCK_M, x_offs, local, col_mask, M, stride_xm, EVEN)
    for row0 in tl.range(tl.program_id(0) * BLOCK_M, M, step):
        if EVEN:
            mask = None
        else:
            mask = (row0 + local < M) & col_mask
        y_row = y_ptr + tl.cast(row0, tl.int64) * N
        x = widen(x_next, FAST)  # the next tile's loads stay in flight while this one is computed
        x_next = _load_tile(x_ptr, tl.minimum(row0 + step, last0), x_offs, local, col_mask, M, stride_xm, EVEN)
        sel = phi_scaled(x + b, scale, log2_scale, FAST, GELU_DEGREE)
        if HAS_DROPOUT:
            r = _lane_words(seed, row0 + tl.arange(0, BLOCK_M), groups, groups_per_row, LANES, WIDE, N_ROUNDS, FAST)
            r = tl.where(lane % 2 == 0, r << 16, r)  # the lane's 16-bit draw in the top half
            sel = tl.where(r >= thr, sel, 0.0)  # then x * 0: NaN/inf stay NaN when dropped, like torch
        y = (x + b) * sel
        tl.store(y_row + y_offs, y.to(y_ptr.dtype.element_ty), mask=mask)


# --------------------------------------------------------------------------- plan: launch heuristics


def _launch_config(M: int, N: int, rng_bits: int = RNG_BITS) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps): 8K elements a program (32 a thread) on GPU, small tiles in the interpreter.

    Rows of 8K and wider take one row a program, so that bias shares the tile's layout
    and needs no shuffle through shared memory. On the H200 the tile shape barely
    matters as long as a thread holds 16-32 elements (docs/kernels.md, "bias_gelu_dropout").
    """
    lanes = 128 // rng_bits
    if interpreting():
        block_n = max(lanes, min(next_power_of_2(N), 64))
        return max(1, min(next_power_of_2(M), 256 // block_n)), block_n, 1
    block_n = max(lanes, min(next_power_of_2(N), 8192))
    block_m = max(1, min(next_power_of_2(M), 8192 // block_n))
    return block_m, block_n, 8


def _lean_programs(M: int, block_m: int, col_tiles: int, device: torch.device) -> int:
    """Programs over rows for the lean kernel: a few per SM (each walks row tiles), 2 in the interpreter."""
    row_tiles = cdiv(M, block_m)
    if interpreting() or device.type != "cuda":
        return min(row_tiles, 2)
    return max(1, min(row_tiles, _LEAN_PROGRAMS_PER_SM * sm_count(device) // col_tiles))


def _lean_gelu_degree(out_dtype: torch.dtype, asked: int | None) -> int:
    """The GELU fit's degree for the lean kernel: 7 for fp32 outputs, else ``asked`` or the default."""
    degree = _LEAN_GELU_DEGREE_16BIT if asked is None else asked
    if degree not in (5, 7):
        raise ValueError(f"GELU fit of degree {degree}: 5 or 7")
    return 7 if out_dtype == torch.float32 else degree


def _gelu_mode(approximate: str) -> int:
    """tanh form (1), or the exact form with PTX fast-math on CUDA (2) and portable ops in the interpreter (0)."""
    return 1 if approximate == "tanh" else (0 if interpreting() else 2)


# --------------------------------------------------------------------------- launchers


def _threshold(p: float, rng_bits: int = RNG_BITS) -> int:
    return int(round(p * (1 << rng_bits)))


def _rows_view(x: torch.Tensor) -> torch.Tensor:
    """x as (rows, N) without copying; raise if its layout has no such view."""
    N = x.shape[-1]
    if x.stride(-1) != 1 and N > 1:
        raise ValueError(f"x must have a unit stride in its last dimension, got strides {tuple(x.stride())}")
    try:
        return x.view(-1, N)
    except RuntimeError:
        raise ValueError(
            f"x of shape {tuple(x.shape)} and strides {tuple(x.stride())} has no (rows, {N}) view; "
            "pass x.contiguous()"
        ) from None


def _scale(p: float) -> float:
    return 1.0 / (1.0 - p) if p < 1.0 else 0.0


def _launch(x, bias, p, seed, approximate="none", out=None, rng_bits=RNG_BITS, config=None, wide=None,
            gelu_mode=None, rounds=PHILOX_ROUNDS, variant=None, programs=None, gelu_degree=None):
    """Launch the fused kernel; the keywords after ``out`` override defaults (tests, benchmarks)."""
    x2 = _rows_view(x)
    M, N = x2.shape
    y = torch.empty(x.shape, device=x.device, dtype=x.dtype) if out is None else out
    if M == 0 or N == 0:
        return y
    variant = _KERNEL_VARIANT if variant is None else variant
    if variant not in _VARIANTS:
        raise ValueError(f"unknown kernel variant {variant!r}; choose one of {_VARIANTS}")
    if variant == "lean" and approximate == "none" and rng_bits == 16 and gelu_mode is None:
        return _launch_lean(x2, bias, y, p, seed, config, wide, rounds, programs, gelu_degree)
    block_m, block_n, warps = config or _launch_config(M, N, rng_bits)
    threshold = _threshold(p, rng_bits)
    grid = (cdiv(M, block_m), cdiv(N, block_n))
    launch_kernel(_bias_gelu_dropout_kernel, grid,
        x2, bias, y, M, N, x2.stride(0), seed, threshold, _scale(p),
        BLOCK_M=block_m, BLOCK_N=block_n, RNG_BITS=rng_bits, HAS_DROPOUT=threshold > 0,
        GELU_MODE=_gelu_mode(approximate) if gelu_mode is None else gelu_mode,
        WIDE=(M * cdiv(N, 128 // rng_bits) >= 2**31) if wide is None else wide,
        N_ROUNDS=rounds, num_warps=warps,
    )
    return y


def _launch_lean(x2, bias, y, p, seed, config=None, wide=None, rounds=PHILOX_ROUNDS, programs=None, gelu_degree=None):
    """The lean kernel on the first kernel's tiles (16 warps on the GPU); same mask, scale folded into the GELU fit."""
    M, N = x2.shape
    block_m, block_n, warps = config or _launch_config(M, N)
    if config is None and not interpreting():
        warps = _LEAN_WARPS
    threshold = _threshold(p)
    scale = _scale(p) if 0 < threshold < 1 << RNG_BITS else (1.0 if threshold == 0 else 0.0)
    col_tiles = cdiv(N, block_n)
    grid = (programs or _lean_programs(M, block_m, col_tiles, x2.device), col_tiles)
    thr16 = (threshold << 16) & 0xFFFFFFFF
    launch_kernel(_bias_gelu_dropout_lean_kernel, grid,
        x2, bias, y, M, N, x2.stride(0), seed, thr16 - (1 << 32) if thr16 >= 1 << 31 else thr16, scale,
        math.log2(scale) if scale > 0 else -math.inf,
        BLOCK_M=block_m, BLOCK_N=block_n, HAS_DROPOUT=0 < threshold < 1 << RNG_BITS, FAST=not interpreting(),
        EVEN=M % block_m == 0 and N % block_n == 0,
        WIDE=(M * cdiv(N, 8) >= 2**31) if wide is None else wide, N_ROUNDS=rounds,
        GELU_DEGREE=_lean_gelu_degree(y.dtype, gelu_degree), num_warps=warps,
    )
    return y


# --------------------------------------------------------------------------- public functions


def _check_p_seed(p, seed) -> None:
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability p must be a number in [0, 1], got {p!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
        raise ValueError(f"seed must be an int in [0, 2**63), got {seed!r}")


def dropout_mask(shape, p: float, seed: int, device="cuda", rng_bits: int = RNG_BITS) -> torch.Tensor:
    """The bool keep-mask ``fused(x, bias, p, seed)`` applies to an x of ``shape``."""
    _check_p_seed(p, seed)
    shape = tuple(shape)
    N = shape[-1] if shape else 1
    mask = torch.empty(shape, device=device, dtype=torch.uint8)
    M = mask.numel() // N if N else 0
    if mask.numel():
        block_m, block_n, warps = _launch_config(M, N, rng_bits)
        grid = (cdiv(M, block_m), cdiv(N, block_n))
        launch_kernel(_dropout_mask_kernel, grid,
            mask, M, N, seed, _threshold(p, rng_bits),
            BLOCK_M=block_m, BLOCK_N=block_n, RNG_BITS=rng_bits,
            WIDE=M * cdiv(N, 128 // rng_bits) >= 2**31, N_ROUNDS=PHILOX_ROUNDS, num_warps=warps,
        )
    return mask.view(torch.bool)


def _check(x, bias, p, seed, approximate) -> None:
    check_tensor(x, "x", min_ndim=1)
    check_tensor(bias, "bias", dtypes=(x.dtype,), ndim=1)
    if bias.shape[0] != x.shape[-1]:
        raise ValueError(f"bias must have shape ({x.shape[-1]},) to match x {tuple(x.shape)}, got {tuple(bias.shape)}")
    if bias.device != x.device:
        raise ValueError(f"bias is on {bias.device} but x is on {x.device}")
    if approximate not in _APPROXIMATIONS:
        raise ValueError(f"unknown approximate={approximate!r}; choose 'none' or 'tanh'")
    _check_p_seed(p, seed)


CALLS = Calls("bias_gelu_dropout.fused")  # each problem's first call recorded, replayed after (_launch.py)


def fused(x, bias, p: float = 0.1, seed: int = 0, approximate: str = "none", out=None) -> torch.Tensor:
    """``dropout(gelu(x + bias), p)`` (training mode, kept values scaled by 1/(1-p)) in one kernel.

    x: (..., N) fp32/fp16/bf16 with a unit last stride, bias: (N,) of x's dtype. The
    result has x's shape and dtype (written into ``out`` when given, a contiguous tensor
    like x); its mask is ``dropout_mask(x.shape, p, seed)``. Under ``torch.compile``: the op
    ``reference_kernels::bias_gelu_dropout`` (``out`` then takes a copy of its result).
    """
    _check_p_seed(p, seed)  # the seed is not in the key: checked each call
    if tracing():
        return traced_result(_bias_gelu_dropout_op(x, bias, float(p), int(seed), str(approximate)), out,
                             "bias_gelu_dropout.fused")
    return CALLS((p, approximate), (x, bias, out), lambda: _fused(x, bias, p, seed, approximate, out), {"seed": seed})


@torch.library.custom_op("reference_kernels::bias_gelu_dropout", mutates_args=(),
                         schema="(Tensor x, Tensor bias, float p, int seed, str approximate) -> Tensor")
def _bias_gelu_dropout_op(x, bias, p, seed, approximate):
    return fused(x, bias, p, seed, approximate)


@_bias_gelu_dropout_op.register_fake
def _(x, bias, p, seed, approximate):
    _check(x, bias, p, seed, approximate)
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def _fused(x, bias, p, seed, approximate, out):
    _check(x, bias, p, seed, approximate)
    if out is not None:
        check_tensor(out, "out", dtypes=(x.dtype,))
        if out.shape != x.shape or not out.is_contiguous() or out.device != x.device:
            raise ValueError(f"out must be a contiguous {tuple(x.shape)} tensor on {x.device}")
    y = torch.empty(x.shape, device=x.device, dtype=x.dtype) if out is None else out
    if x.numel():
        _launch(x, bias, float(p), seed, approximate, y)
    return y


def unfused(x, bias, p: float = 0.1, seed: int = 0, approximate: str = "none") -> torch.Tensor:
    """The same chain as people write it, op by op, with the mask materialised."""
    h = x + bias  # read MN + N elements ; write MN elements
    h = F.gelu(h, approximate=approximate)  # read MN elements ; write MN elements
    keep = dropout_mask(x.shape, p, seed, device=x.device)  # write MN bytes
    h = h * keep  # read MN elements + MN bytes ; write MN elements
    return h * _scale(p)  # read MN elements ; write MN elements


def budget(x, bias, p: float = 0.1, seed: int = 0, approximate: str = "none") -> Budget:
    """Compulsory traffic: x and bias read once, y written once (the mask never leaves the chip)."""
    elt = x.element_size()
    return Budget(read_bytes=elt * (x.numel() + bias.numel()), write_bytes=elt * x.numel(),
                  label="bias_gelu_dropout")
