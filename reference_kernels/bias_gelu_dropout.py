"""``dropout(gelu(x + bias), p)`` in one pass over x, with a reproducible counter-based mask: its plans, launches and
public functions (the Triton kernels: ``_bias_gelu_dropout_kernels``).

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

from pytest_fusioncheck.budget import Budget

from ._common import (cdiv, check_tensor, define_op, inference_result, interpreting, next_power_of_2, traced_result,
                      tracing)
from ._device import sm_count
from ._bias_gelu_dropout_kernels import _bias_gelu_dropout_kernel, _bias_gelu_dropout_lean_kernel, _dropout_mask_kernel
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


CALLS = Calls("bias_gelu_dropout.fused")  # a problem's first call plans, its second records, later ones replay (_launch.py)


def fused(x, bias, p: float = 0.1, seed: int = 0, approximate: str = "none", out=None) -> torch.Tensor:
    """``dropout(gelu(x + bias), p)`` (training mode, kept values scaled by 1/(1-p)) in one kernel.

    x: (..., N) fp32/fp16/bf16 with a unit last stride, bias: (N,) of x's dtype. The
    result has x's shape and dtype (written into ``out`` when given, a contiguous tensor
    like x); its mask is ``dropout_mask(x.shape, p, seed)``. Under ``torch.compile``: the op
    ``reference_kernels::bias_gelu_dropout`` (``out`` then takes a copy of its result).
    """
    _check_p_seed(p, seed)  # the seed is not in the key: checked each call
    if tracing():
        result = traced_result(_BIAS_GELU_DROPOUT_OP(x, bias, float(p), int(seed), str(approximate)), out,
                               "bias_gelu_dropout.fused")
    else:
        result = _calls(x, bias, p, seed, approximate, out)
    return inference_result("bias_gelu_dropout.fused", (x, bias), result)


def _calls(x, bias, p, seed, approximate, out=None):
    """The call's launches (recorded or replayed: the seed is a launch argument), and the op's implementation."""
    return CALLS((p, approximate), (x, bias, out), lambda: _fused(x, bias, p, seed, approximate, out), {"seed": seed})


def _fake(x, bias, p, seed, approximate):
    _check(x, bias, p, seed, approximate)
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


_BIAS_GELU_DROPOUT_OP = define_op(
    "bias_gelu_dropout(Tensor x, Tensor bias, float p, int seed, str approximate) -> Tensor", _calls, _fake)


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
