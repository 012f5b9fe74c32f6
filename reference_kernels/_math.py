"""Triton math shared by the subjects: fast-math primitives and the exact GELU.

``rcp``, ``exp2`` and ``exp`` take a ``FAST`` flag: on CUDA one ``rcp.approx.ftz`` /
``ex2.approx.ftz`` by inline PTX, without the range fix-ups that IEEE division and
``tl.exp2`` put around their MUFU instruction; under the interpreter (which runs no PTX)
the portable ops. ``gelu`` (GELU of an fp32 tensor) and ``phi_scaled`` (the dropout
scale folded into its fit) serve the GEMM epilogue and bias + GELU + dropout;
docs/kernels.md ("gemm_epilogue", "bias_gelu_dropout") has their measured trade-offs and
``scripts/gelu_fit.py`` fits and checks the polynomials. ``widen`` is a 16-bit tensor's float32 (bf16 pairs by
a shift and an AND where ``WIDEN``), ``widen_after`` the second widening of one held packed through a reduction.
"""

from __future__ import annotations

import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def rcp(x, FAST: tl.constexpr):
    if FAST:
        return tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32,
                                         is_pure=True, pack=1)
    else:
        return 1.0 / x


@triton.jit
def exp2(x, FAST: tl.constexpr):
    if FAST:
        return tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32,
                                         is_pure=True, pack=1)
    else:
        return tl.exp2(x)


@triton.jit
def exp(x, FAST: tl.constexpr):
    """exp(x) as 2^(x log2 e); ``FAST``: one ``ex2.approx.ftz`` (tl.exp2 adds three instructions for
    subnormal results, which a softmax flushes to 0 anyway)."""
    return exp2(x * LOG2E, FAST)


@triton.jit
def widen(x, WIDEN: tl.constexpr = False):
    """x in float32. ``WIDEN`` (CUDA only: inline PTX) with bf16 x: each pair of elements straight from its 32-bit
    register, the low one by a shift and the high one by an AND, where the compiler's conversion spends a PRMT and
    a shift on one of the two (docs/kernels.md, "Aligned 16-bit rows"); other dtypes convert as usual."""
    if WIDEN:
        if x.dtype == tl.bfloat16:
            bits = tl.inline_asm_elementwise("{ shl.b32 $0, $2, 16; and.b32 $1, $2, 0xffff0000; }", "=r,=r,r",
                                             [x.to(tl.uint16, bitcast=True)], dtype=tl.uint32, is_pure=True, pack=2)
            return bits.to(tl.float32, bitcast=True)
    return x.to(tl.float32)


@triton.jit
def widen_after(x, dep, WIDEN: tl.constexpr = False):
    """x (a 16-bit tensor) widened to float32 by a conversion that depends on ``dep`` (float32, broadcast to
    x: a row's value computed after a reduction): x's bits XOR (dep is NaN), 0 unless the row's result is
    NaN anyway. A kernel that holds x as loaded through its reduction and widens it again after uses this
    for the second conversion: ptxas merges two plain conversions of one value and keeps the float32 copy
    in registers across the reduction (layer_norm's ``PACKED``; docs/kernels.md, "Aligned 16-bit rows")."""
    if WIDEN:
        if x.dtype == tl.bfloat16:  # the XOR inside the widening's PTX, on the packed pair: no unpacking before it
            flag = tl.broadcast_to((dep != dep).to(tl.uint16), x.shape)
            bits = tl.inline_asm_elementwise(
                "{ .reg .b32 t; xor.b32 t, $2, $3; shl.b32 $0, t, 16; and.b32 $1, t, 0xffff0000; }", "=r,=r,r,r",
                [x.to(tl.uint16, bitcast=True), flag], dtype=tl.uint32, is_pure=True, pack=2)
            return bits.to(tl.float32, bitcast=True)
    bits = x.to(tl.int16, bitcast=True) ^ (dep != dep).to(tl.int16)
    return bits.to(x.dtype, bitcast=True).to(tl.float32)


@triton.jit
def phi_scaled(x, s, log2_s, FAST: tl.constexpr, DEGREE: tl.constexpr = 7):
    """s * Phi(x), Phi the standard normal CDF, so that GELU(x) * s = x * phi_scaled(x, s, log2(s)).

    The form of gelu's degree-9 erfc fit (DEGREE 9: Phi(-|x|) = t * 2**(P(t) - w*w)) with the
    dropout scale s moved into the exponent's constant term (s * Phi(-|x|) = t * 2**(P(t)
    + log2(s) - w*w)) and into the reflection (s * Phi(|x|) = s - s * Phi(-|x|)): the scale
    costs no instruction. s = 0 (log2 s = -inf) gives 0, as GELU * 0 does. ``scripts/gelu_fit.py``
    fits P and checks it with the float32 pipeline emulated.
    """
    ax = tl.abs(x)
    t = rcp(1.0 + 0.35355339059327373 * ax, FAST)  # 1 / (1 + z/2), z = |x| / sqrt(2)
    if DEGREE == 5:
        # Unweighted minimax of P (scripts/gelu_fit.py "5 rel"), 2 FMAs fewer: max relative GELU
        # error 1.42e-5 on [-10, 10]; bf16 / fp16 outputs within 1 ulp of the correctly rounded
        # value everywhere checked, off it for 0.04% / 0.18% of inputs (degree 7: 0.01% / 0.02%).
        p = 0.33007541298866272 * t - 1.0231484174728394
        p = p * t + 0.68455159664154053
        p = p * t + 0.36708247661590576
        p = p * t + 1.4686834812164307
        p = p * t + (log2_s - 2.8272335529327393)
    else:
        # Degree 7 instead of erfcc's 9: a minimax fit of log2(Phi(-|x|) / t) + w * w on z in [0, 10],
        # weighted by 1 + 2z so the error goes where float32's rounding of w * w leaves room. Max
        # relative (absolute) GELU error against float64, float32 emulated: 1.031e-5 (3.84e-7) on
        # [-10, 10], 4.15e-6 on [-7, 7], equal to or below the degree-9 fit's 1.031e-5 and 4.18e-6.
        p = -0.29061277366264743 * t + 1.1621854899929596
        p = p * t - 1.5702150578606275
        p = p * t + 0.6121152188998823
        p = p * t - 0.10889426977729336
        p = p * t + 0.5822939935845977
        p = p * t + 1.4387150858074316
        p = p * t + (log2_s - 2.825590018722917)
    w = 0.8493218002880191 * ax  # w * w = z * z * log2(e)
    h = t * exp2(p - w * w, FAST)  # s * Phi(-|x|)
    return tl.where(x >= 0.0, s - h, h)


@triton.jit
def gelu(x, MODE: tl.constexpr, DEGREE: tl.constexpr = 9):
    """GELU of an fp32 tensor.

    MODE 0: exact (erf) form; 1: tanh approximation; 2: MODE 0 with PTX fast-math
    (``rcp.approx.ftz``, ``ex2.approx.ftz``), CUDA only; 3: MODE 1 with the same fast-math.
    DEGREE (modes 0 and 2): 9, the erfcc polynomial below; 7, ``phi_scaled``'s fit of the same
    accuracy with two FMAs fewer; 5, two fewer again, for 16-bit outputs only (within one
    bf16/fp16 ulp of the correctly rounded GELU; ``scripts/gelu_fit.py``).

    MODE 0 writes Phi(x) = 0.5 * erfc(-x / sqrt(2)) with the Chebyshev fit of erfc from
    Numerical Recipes (erfcc: erfc(z) = t * exp(-z*z + P(t)), t = 1 / (1 + z/2), P of
    degree 9, relative error under 1.2e-7 for every argument, so the tails stay
    accurate), in base 2 with the 0.5 of Phi folded into the exponent: one reciprocal,
    one exp2 and eleven FMAs. Against float64 GELU it is within 5.3e-6 relative
    (3.8e-7 absolute) on [-7, 7], closer than torch's own float32 GELU, which flushes to
    0 below x = -8.3. libdevice's erff costs about twice the instructions (it selects its
    polynomial's coefficients per element); MODE 2 also drops the range fix-ups that
    IEEE-style division and exp2 put around their MUFU instruction.
    MODE 1 writes 0.5 x (1 + tanh(u)) as x * sigmoid(2u), with one exp. MODE 3 writes the same
    quotient as x * rcp(1 + 2^(x (a + b x^2))), the constants -2 log2(e) sqrt(2/pi) (1, 0.044715)
    folded: two MUFU instructions and four FMAs, each approximation within ~2^-22 relative
    (sigmoid's tail below 2^-126 flushes to 0, which the output's rounding allows).
    All modes give +inf at +inf and NaN at -inf and NaN, as torch's CUDA kernels do.
    """
    if MODE == 1:
        u = 0.7978845608028654 * (x + 0.044715 * x * x * x)
        return x / (1.0 + tl.exp(-2.0 * u))
    elif MODE == 3:
        z = x * (-2.302208198144325 - 0.1029432395800235 * (x * x))  # -2 u log2(e)
        return x * rcp(1.0 + exp2(z, True), True)
    elif DEGREE != 9:
        return x * phi_scaled(x, 1.0, 0.0, MODE == 2, DEGREE)
    else:
        ax = tl.abs(x)
        t = rcp(1.0 + 0.35355339059327373 * ax, MODE == 2)  # 1 / (1 + z/2), z = |x| / sqrt(2)
        # log2(e) * erfcc's polynomial, minus 1 for the 0.5 in Phi = 0.5 * erfc.
        p = 0.246517298 * t - 1.18611495
        p = p * t + 2.14747446
        p = p * t - 1.63775315
        p = p * t + 0.402321582
        p = p * t - 0.26875686
        p = p * t + 0.139630057
        p = p * t + 0.539700616
        p = p * t + 1.4427292
        p = p * t - 2.82574822
        w = 0.8493218002880191 * ax  # w * w = z * z * log2(e)
        h = t * exp2(p - w * w, MODE == 2)  # Phi(-|x|)
        return x * tl.where(x >= 0.0, 1.0 - h, h)
