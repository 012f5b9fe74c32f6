"""Fit and check the polynomial of the exact (erf) GELU in reference_kernels/_math.py (``phi_scaled``).

`phi_scaled` writes Phi(-|x|) = t * 2**(P(t) - w*w), t = 1 / (1 + z/2), z = |x| / sqrt(2),
w*w = z*z*log2(e), so P fits f(t) = log2(Phi(-|x|) / t) + w*w = log2(erfcx(z)) - 1 - log2(t)
for z in [0, 10] (t in [1/6, 1]). For each degree this script
  1. fits P by weighted minimax (Lawson's iteratively reweighted least squares on a dense
     Chebyshev grid in z, Chebyshev basis in t, float64) for each objective: `rel`, the error of
     f in log2 units unweighted, which times ln 2 is the relative GELU error of exact arithmetic
     (for x < 0; less for x > 0), and `log2`, that error times 1 + 2z (the shipped fit's);
     the coefficients are rounded to float32 one by one, each refitting the rest;
  2. evaluates GELU(x) = x * Phi(x) with the kernel's float32 pipeline emulated in numpy (every
     operation rounded to float32, an FMA rounded once, rcp and exp2 correctly rounded) against
     float64 GELU 0.5 * x * erfc(-x / sqrt(2)): max relative error (where |GELU| > 1e-30) and
     max absolute error, and, after rounding both to bf16 / fp16 (nearest even), how many
     elements differ from the rounded reference (`!=`, out of the 2M or 1M inputs) and by how
     many ulps at most;
  3. does the same for the shipped degree-7 coefficients (`shipped 7`), whose figures (1.031e-5
     relative, 3.84e-7 absolute on [-10, 10]) check the emulation, and for the correctly rounded
     float32 GELU (`f32 CR`), the floor of any float32 pipeline.
Prints a markdown table, the lowest degree within 1 ulp, and the coefficients (float32 values,
highest degree first, as in the kernel).

    /work/venv/bin/python scripts/gelu_fit.py [--degree 4 5 6 7] [--objective rel log2]

(about 30 s on 2 cores). The N(0, 9) draws reach |x| ~ 16, past the fit's |x| <= 10 sqrt(2).
"""
import argparse

import numpy as np
import torch

F32, F64 = np.float32, np.float64
T_MIN = 1.0 / 6.0  # t at z = 10
C_D = 0.35355339059327373  # 1 / (2 sqrt(2)): 1 + C_D |x| = 1 + z/2
C_W = 0.8493218002880191  # sqrt(log2(e) / 2): (C_W |x|)**2 = z*z*log2(e)
SHIPPED = [-0.29061277366264743, 1.1621854899929596, -1.5702150578606275, 0.6121152188998823,
           -0.10889426977729336, 0.5822939935845977, 1.4387150858074316, -2.825590018722917]
SHIPPED_CHECK = (1.031e-5, 3.84e-7)  # quoted max relative / absolute error on [-10, 10]
FORMATS = {"bf16": (8, -126), "fp16": (11, -14)}  # significand bits, least normal exponent


# --------------------------------------------------------------------------- fit
def target(z):
    """f = log2(Phi(-|x|) / t) + z*z*log2(e), through erfcx so that nothing underflows."""
    t = 1.0 / (1.0 + 0.5 * z)
    erfcx = torch.special.erfcx(torch.from_numpy(z)).numpy()
    return t, np.log2(erfcx) - 1.0 - np.log2(t)


def lawson(a, f, weight, iters, tol=2e-3):
    """Coefficients c minimising max |weight * (a @ c - f)|, and that maximum.

    Lawson: weighted least squares whose point weights are multiplied by the error each round.
    sqrt(sum u e^2) (u summing to 1) bounds the minimax error from below; stop when the
    best maximum is within tol of it."""
    u = np.full(len(f), 1.0 / len(f))
    best, best_c, lower = np.inf, None, 0.0
    for _ in range(iters):
        s = np.sqrt(u) * weight
        c = np.linalg.lstsq(a * s[:, None], f * s, rcond=None)[0]
        e = np.abs(weight * (a @ c - f))
        lower = max(lower, float(np.sqrt(np.sum(u * e * e))))
        if e.max() < best:
            best, best_c = float(e.max()), c
        if best <= lower * (1.0 + tol):
            break
        u = u * e
        u /= u.sum()
    return best_c, best


def problem(objective, points):
    """The fit's grid in t, its target f and its weight."""
    z = 5.0 * (1.0 - np.cos(np.linspace(0.0, np.pi, points)))  # Chebyshev-Lobatto on [0, 10]
    t, f = target(z)
    return t, f, (1.0 + 2.0 * z if objective == "log2" else np.ones_like(z))


def fit(degree, prob, iters):
    """Monomial coefficients of P in t, highest first, as float32 values, and the minimax error
    with float64 coefficients.

    The coefficients are rounded to float32 one at a time, constant term first, each after
    refitting the higher ones to what the rounded lower ones leave: on [1/6, 1], t * q(t) absorbs
    most of a constant, so only the last, t**degree's, rounding is left whole (rounding them all
    at once costs degree 7 a quarter of its accuracy)."""
    t, f, weight = prob
    s = (2.0 * t - 1.0 - T_MIN) / (1.0 - T_MIN)  # t on [1/6, 1] -> s on [-1, 1]
    fixed, err64 = [], None  # lowest first
    for k in range(degree + 1):
        # the rest is t**k * q(t), q in Chebyshev polynomials of s; t**k's coefficient is q(0)
        basis = t[:, None] ** k * np.polynomial.chebyshev.chebvander(s, degree - k)
        c, err = lawson(basis, f - np.polyval(fixed[::-1], t), weight, iters)
        err64 = err if err64 is None else err64
        fixed.append(float(F32(np.polynomial.Chebyshev(c, domain=[T_MIN, 1.0])(0.0))))
    return fixed[::-1], err64


def fit_error(coeffs, prob):
    """max weighted |P(t) - f(t)| on the grid, in float64."""
    t, f, weight = prob
    return float(np.max(weight * np.abs(np.polyval(coeffs, t) - f)))


# --------------------------------------------------------------------------- float32 pipeline
def fma(a, b, c):
    """a * b + c rounded once to float32 (the float32 product is exact in float64)."""
    return (a.astype(F64) * b + c).astype(F32)


def gelu_f32(x, coeffs):
    """The kernel's GELU on float32 x, operation by operation (scale s = 1; 1 + C_D |x| is an
    FMA, as Triton contracts it)."""
    ax = np.abs(x)
    t = F32(1.0) / fma(ax, F64(F32(C_D)), 1.0)
    c = [F64(F32(v)) for v in coeffs]
    p = fma(t, c[0], c[1])
    for v in c[2:]:
        p = fma(p, t, v)
    w = F32(C_W) * ax
    h = t * np.exp2(fma(-w, w.astype(F64), p).astype(F64)).astype(F32)  # Phi(-|x|)
    return x * np.where(x >= 0, F32(1.0) - h, h)


def gelu_f64(x):
    """float64 GELU of float32 x."""
    xd = torch.from_numpy(x.astype(F64))
    return (0.5 * xd * torch.special.erfc(-xd / np.sqrt(2.0))).numpy()


# --------------------------------------------------------------------------- 16-bit rounding
def round_to(v, fmt):
    """float64 v rounded to nearest even in bf16 / fp16 (subnormals included, no overflow here)."""
    bits, emin = FORMATS[fmt]
    q = np.maximum(np.frexp(v)[1] - 1, emin) - (bits - 1)  # exponent of v's quantum
    return np.ldexp(np.rint(np.ldexp(v, -q)), q)


def ulp_index(r, fmt):
    """Position of an exactly representable value on the format's grid, monotone in value."""
    bits = (r.astype(F32).view(np.uint32) >> 16 if fmt == "bf16" else r.astype(np.float16).view(np.uint16))
    bits = bits.astype(np.int64)
    return np.where(bits & 0x8000, -(bits & 0x7FFF), bits)


# --------------------------------------------------------------------------- evaluation
def inputs(seed):
    """The input sets, float32."""
    return {
        "2M on [-10, 10]": np.linspace(-10.0, 10.0, 2_000_000).astype(F32),
        "2M N(0, 9)": (3.0 * np.random.default_rng(seed).standard_normal(2_000_000)).astype(F32),
        "1M on [-7, 7]": np.linspace(-7.0, 7.0, 1_000_000).astype(F32),
    }


def reference(x):
    """float64 GELU and its bf16 / fp16 grid positions."""
    ref = gelu_f64(x)
    return ref, {fmt: ulp_index(round_to(ref, fmt), fmt) for fmt in FORMATS}


def errors(got, ref, ref_idx):
    """Max relative and absolute error of got; per 16-bit format, (elements off, max ulps off)."""
    got = got.astype(F64)
    diff = np.abs(got - ref)
    big = np.abs(ref) > 1e-30
    row = {"rel": float(np.max(diff[big] / np.abs(ref[big]))),
           "abs": float(diff.max())}
    for fmt, idx in ref_idx.items():
        ulps = np.abs(ulp_index(round_to(got, fmt), fmt) - idx)
        row[fmt] = (int(np.count_nonzero(ulps)), int(ulps.max()))
    return row


def output(x, ref, coeffs):
    """The emulated kernel's GELU, or with coeffs None the correctly rounded float32 GELU."""
    return ref.astype(F32) if coeffs is None else gelu_f32(x, coeffs)


def table(candidates, data):
    """Print one row per candidate and input set; return the rows by (candidate, input set)."""
    print("| P | inputs | max rel | max abs | bf16 != | bf16 max ulp | fp16 != | fp16 max ulp |")
    print("|---|---|---|---|---|---|---|---|")
    results = {}
    for label, x in data.items():
        ref, ref_idx = reference(x)
        for name, coeffs in candidates.items():
            r = results[name, label] = errors(output(x, ref, coeffs), ref, ref_idx)
            print(f"| {name} | {label} | {r['rel']:.4g} | {r['abs']:.3g} | {r['bf16'][0]} | {r['bf16'][1]} "
                  f"| {r['fp16'][0]} | {r['fp16'][1]} |")
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--degree", type=int, nargs="+", action="extend", help="degrees to fit (default 4 5 6 7)")
    ap.add_argument("--objective", choices=["rel", "log2"], nargs="+", action="extend",
                    help="rel: max error of f, i.e. relative GELU error; log2: (1 + 2z) times it, the "
                         "shipped fit's (default both)")
    ap.add_argument("--points", type=int, default=40000, help="grid points in z")
    ap.add_argument("--iters", type=int, default=1000, help="Lawson iterations at most")
    ap.add_argument("--seed", type=int, default=0, help="seed of the N(0, 9) draws")
    args = ap.parse_args()
    degrees = sorted(set(args.degree or [4, 5, 6, 7]))
    objectives = list(dict.fromkeys(args.objective or ["rel", "log2"]))

    shipped = [float(F32(v)) for v in SHIPPED]
    candidates = {}
    print(f"max fit error on {args.points} points, float64 / float32 coefficients:")
    for objective in objectives:
        prob = problem(objective, args.points)
        for d in degrees:
            coeffs, err = fit(d, prob, args.iters)
            candidates[f"{d} {objective}"] = coeffs
            print(f"  degree {d}, {objective}: {err:.4g} / {fit_error(coeffs, prob):.4g}")
        print(f"  shipped 7, {objective}: - / {fit_error(shipped, prob):.4g}")
    candidates["shipped 7"] = SHIPPED
    candidates["f32 CR"] = None
    print()
    data = inputs(args.seed)
    results = table(candidates, data)

    rel, ab = (results["shipped 7", next(iter(data))][k] for k in ("rel", "abs"))
    ok = f"{rel:.4g}" == f"{SHIPPED_CHECK[0]:.4g}" and f"{ab:.3g}" == f"{SHIPPED_CHECK[1]:.3g}"
    print(f"\nshipped degree 7 on [-10, 10]: {rel:.4g} / {ab:.3g}, quoted {SHIPPED_CHECK[0]:.4g} / "
          f"{SHIPPED_CHECK[1]:.3g}: {'emulation matches' if ok else 'MISMATCH: the emulation differs'}")
    for objective in objectives:
        within = [d for d in degrees if all(results[f"{d} {objective}", label][fmt][1] <= 1
                                            for label in data for fmt in FORMATS)]
        print(f"lowest degree within 1 bf16 and fp16 ulp on every input set, {objective}: "
              f"{within[0] if within else 'none'}")
    print("\ncoefficients (float32 values, highest degree first):")
    for name, coeffs in candidates.items():
        if coeffs is not None and name != "shipped 7":
            print(f"P{name.replace(' ', '_').upper()} = [{', '.join(f'{v:.17g}' for v in coeffs)}]")


if __name__ == "__main__":
    main()
