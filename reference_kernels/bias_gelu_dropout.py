"""``dropout(gelu(x + bias), p)`` in one pass over x, with a reproducible counter-based mask.

One read of x (and bias), one write of y: the bias add, the GELU, the random draw, the
keep/drop decision and the 1/(1-p) scaling all happen in registers. Eager PyTorch spends
three to four passes on the same chain; even compiled, it draws one Philox call per
element, which makes the chain arithmetic-bound.

The mask is a pure function of ``(seed, row, column)``: element (i, j) of the (rows, N)
view of x uses 16-bit lane ``j % 8`` of Philox-4x32-10 counter ``i * ceil(N / 8) + j // 8``
(``tl.randint4x``: 128 random bits per call, split into eight 16-bit draws). An element is
dropped when its draw is below ``round(p * 65536)``, so the drop rate is p to within
2**-17. ``dropout_mask`` materialises the same mask with the same helper, so
``unfused`` reproduces ``fused`` exactly, whatever block sizes either launch uses.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from pytest_fusioncheck.budget import Budget
from reference_kernels._common import FLOAT_DTYPES, check_tensor, interpreting, next_power_of_2
from reference_kernels.gemm_epilogue import _gelu

RNG_BITS = 16  # bits of randomness per element: 8 elements per Philox call
PHILOX_ROUNDS = 10  # Philox-4x32-10, as cuRAND and tl.rand use
_APPROXIMATIONS = ("none", "tanh")


# --------------------------------------------------------------------------- kernels


def _launch_metadata(grid, kernel, args):
    """What profilers (and pytest-fusioncheck's byte model) read off a launch."""
    M, N = args["M"], args["N"]
    elt = args["y_ptr"].element_size()
    return {"name": f"{kernel.name} [M={M}, N={N}]", "bytes": elt * (2 * M * N + N), "flops": 30 * M * N}


@triton.jit
def _philox4x32(seed, counter, N_ROUNDS: tl.constexpr):
    """``tl.randint4x(seed, counter, N_ROUNDS)``, bit for bit, with each 32x32-bit product
    taken as one 64-bit multiply (one IMAD.WIDE, high and low halves at once) instead of
    separate high and low multiplies: a third fewer instructions for the draw."""
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
        prod_b = c2.to(tl.uint64) * 0xCD9E8D57
        prod_a = c0.to(tl.uint64) * 0xD2511F53
        c0 = (prod_b >> 32).to(tl.uint32) ^ c1 ^ k0
        c2 = (prod_a >> 32).to(tl.uint32) ^ c3 ^ k1
        c1 = prod_b.to(tl.uint32)
        c3 = prod_a.to(tl.uint32)
        k0 = tl.add(k0, 0x9E3779B9, sanitize_overflow=False)
        k1 = tl.add(k1, 0xBB67AE85, sanitize_overflow=False)
    return c0, c1, c2, c3


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
    if WIDE:
        counter = rows.to(tl.int64)[:, None] * groups_per_row + groups[None, :]
    else:
        counter = rows[:, None] * groups_per_row + groups[None, :]
    r0, r1, r2, r3 = _philox4x32(seed, counter, N_ROUNDS)
    lane = tl.arange(0, LANES)[None, None, :]
    word = lane // PER_WORD
    r = tl.where(word == 0, r0[:, :, None],
                 tl.where(word == 1, r1[:, :, None], tl.where(word == 2, r2[:, :, None], r3[:, :, None])))
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
    num_programs,  # programs in the grid; each takes tiles pid, pid + num_programs, ...
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ONE_COL_TILE: tl.constexpr,  # BLOCK_N >= N: bias is loaded and converted once per program
    RNG_BITS: tl.constexpr,
    HAS_DROPOUT: tl.constexpr,  # p > 0 (else no random numbers are drawn)
    GELU_MODE: tl.constexpr,  # see gemm_epilogue._gelu: 0/3 exact, 1 tanh, 2 libdevice erf
    WIDE: tl.constexpr,
    N_ROUNDS: tl.constexpr,
):
    LANES: tl.constexpr = 128 // RNG_BITS
    G: tl.constexpr = BLOCK_N // LANES
    n_col_tiles = tl.cdiv(N, BLOCK_N)
    num_tiles = tl.cdiv(M, BLOCK_M) * n_col_tiles
    lanes = tl.arange(0, LANES)[None, None, :]
    tile = tl.program_id(0)
    if ONE_COL_TILE:
        cols = tl.arange(0, G)[None, :, None] * LANES + lanes
        bias = tl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
    # The next tile's x is loaded before this tile's arithmetic, so that its DRAM latency
    # hides behind the GELU and the random draw (a one-deep software pipeline).
    rows = (tile // n_col_tiles) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = (tile % n_col_tiles) * BLOCK_N + tl.arange(0, G)[None, :, None] * LANES + lanes
    x_next = tl.load(x_ptr + rows.to(tl.int64)[:, None, None] * stride_xm + cols,
                     mask=(rows[:, None, None] < M) & (cols < N), other=0.0)
    for tile in range(tile, num_tiles, num_programs):
        x = x_next
        rows = (tile // n_col_tiles) * BLOCK_M + tl.arange(0, BLOCK_M)
        groups = (tile % n_col_tiles) * G + tl.arange(0, G)
        cols = groups[None, :, None] * LANES + lanes
        mask = (rows[:, None, None] < M) & (cols < N)
        nxt = tile + num_programs
        rows_n = (nxt // n_col_tiles) * BLOCK_M + tl.arange(0, BLOCK_M)
        cols_n = (nxt % n_col_tiles) * BLOCK_N + tl.arange(0, G)[None, :, None] * LANES + lanes
        x_next = tl.load(x_ptr + rows_n.to(tl.int64)[:, None, None] * stride_xm + cols_n,
                         mask=(rows_n[:, None, None] < M) & (cols_n < N), other=0.0)
        if not ONE_COL_TILE:
            bias = tl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
        y = _gelu(x.to(tl.float32) + bias, GELU_MODE)
        if HAS_DROPOUT:
            keep = _keep(seed, rows, groups, tl.cdiv(N, LANES), threshold, RNG_BITS, WIDE, N_ROUNDS)
            y = y * tl.where(keep, scale, 0.0)  # a multiply, so NaN/inf stay NaN when dropped, like torch
        tl.store(y_ptr + rows.to(tl.int64)[:, None, None] * N + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


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


# --------------------------------------------------------------------------- launch heuristics


def _launch_config(M: int, N: int, rng_bits: int = RNG_BITS) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, programs per SM; 0 = one program per tile).

    On GPU: 8K elements a tile (32 a thread); rows of 8K and wider take one row a tile,
    so that bias shares the tile's layout (no shuffle through shared memory) and, when
    a row fits one tile, is loaded once per program. In the interpreter: small tiles and
    four programs, so the tile loop runs several times.
    """
    lanes = 128 // rng_bits
    if interpreting():
        block_n = max(lanes, min(next_power_of_2(N), 64))
        return max(1, min(next_power_of_2(M), 256 // block_n)), block_n, 1, 1
    block_n = max(lanes, min(next_power_of_2(N), 8192))
    block_m = max(1, min(next_power_of_2(M), 8192 // block_n))
    return block_m, block_n, 8, 0


_sm_counts: dict = {}


def _num_programs(device: torch.device, tiles: int, per_sm: int) -> int:
    if per_sm == 0:
        return tiles
    if interpreting() or device.type != "cuda":
        return min(tiles, 4)
    if device not in _sm_counts:
        _sm_counts[device] = torch.cuda.get_device_properties(device).multi_processor_count
    return min(tiles, per_sm * _sm_counts[device])


def _gelu_mode(approximate: str) -> int:
    """tanh form (1), or the exact form with PTX fast-math on CUDA (3) and portable ops in the interpreter (0)."""
    return 1 if approximate == "tanh" else (0 if interpreting() else 3)


def _threshold(p: float, rng_bits: int = RNG_BITS) -> int:
    return int(round(p * (1 << rng_bits)))


def _check_p_seed(p, seed) -> None:
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability p must be a number in [0, 1], got {p!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
        raise ValueError(f"seed must be an int in [0, 2**63), got {seed!r}")


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
            gelu_mode=None, rounds=PHILOX_ROUNDS):
    """Launch the fused kernel; the keywords after ``out`` override defaults (tests, benchmarks)."""
    x2 = _rows_view(x)
    M, N = x2.shape
    y = torch.empty(x.shape, device=x.device, dtype=x.dtype) if out is None else out
    if M == 0 or N == 0:
        return y
    block_m, block_n, warps, per_sm = config or _launch_config(M, N, rng_bits)
    threshold = _threshold(p, rng_bits)
    programs = _num_programs(x.device, triton.cdiv(M, block_m) * triton.cdiv(N, block_n), per_sm)
    _bias_gelu_dropout_kernel[(programs,)](
        x2, bias, y, M, N, x2.stride(0), seed, threshold, _scale(p), programs,
        BLOCK_M=block_m, BLOCK_N=block_n, ONE_COL_TILE=block_n >= N, RNG_BITS=rng_bits,
        HAS_DROPOUT=threshold > 0,
        GELU_MODE=_gelu_mode(approximate) if gelu_mode is None else gelu_mode,
        WIDE=(M * triton.cdiv(N, 128 // rng_bits) >= 2**31) if wide is None else wide,
        N_ROUNDS=rounds, num_warps=warps,
    )
    return y


# --------------------------------------------------------------------------- public functions


def dropout_mask(shape, p: float, seed: int, device="cuda", rng_bits: int = RNG_BITS) -> torch.Tensor:
    """The bool keep-mask ``fused(x, bias, p, seed)`` applies to an x of ``shape``."""
    _check_p_seed(p, seed)
    shape = tuple(shape)
    N = shape[-1] if shape else 1
    mask = torch.empty(shape, device=device, dtype=torch.uint8)
    M = mask.numel() // N if N else 0
    if mask.numel():
        block_m, block_n, warps, _ = _launch_config(M, N, rng_bits)
        grid = (triton.cdiv(M, block_m), triton.cdiv(N, block_n))
        _dropout_mask_kernel[grid](
            mask, M, N, seed, _threshold(p, rng_bits),
            BLOCK_M=block_m, BLOCK_N=block_n, RNG_BITS=rng_bits,
            WIDE=M * triton.cdiv(N, 128 // rng_bits) >= 2**31, N_ROUNDS=PHILOX_ROUNDS, num_warps=warps,
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


def fused(x, bias, p: float = 0.1, seed: int = 0, approximate: str = "none", out=None) -> torch.Tensor:
    """``dropout(gelu(x + bias), p)`` (training mode, kept values scaled by 1/(1-p)) in one kernel.

    x: (..., N) fp32/fp16/bf16 with a unit last stride, bias: (N,) of x's dtype. The
    result has x's shape and dtype (written into ``out`` when given, a contiguous tensor
    like x); its mask is ``dropout_mask(x.shape, p, seed)``.
    """
    _check(x, bias, p, seed, approximate)
    if out is not None:
        check_tensor(out, "out", dtypes=(x.dtype,))
        if out.shape != x.shape or not out.is_contiguous() or out.device != x.device:
            raise ValueError(f"out must be a contiguous {tuple(x.shape)} tensor on {x.device}")
    return _launch(x, bias, float(p), seed, approximate, out)


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
