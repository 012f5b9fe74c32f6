"""bias_gelu_dropout's Triton kernels: Philox-4x32 draws (``tl.randint4x``'s stream, bit for bit), the keep mask, the
measured and lean kernels and the mask's own kernel. The mask's definition, the plans and the launches are
``bias_gelu_dropout``'s (its module docstring)."""

from __future__ import annotations

import triton
import triton.language as tl

from ._math import gelu, phi_scaled, widen


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
