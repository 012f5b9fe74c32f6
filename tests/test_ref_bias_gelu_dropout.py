"""reference_kernels.bias_gelu_dropout: the one-pass chain against add, gelu, mask, mul.

The mask is a function of (seed, row, column) alone, so ``unfused`` rebuilds it with
``dropout_mask`` and the two agree element for element. Without a GPU the kernels run
under Triton's interpreter with tiles of at most 64 columns, so the shapes below span
several column tiles, ragged edges and partly used 8-column Philox groups.
"""

from __future__ import annotations

import inspect
import re
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from reference_kernels import bias_gelu_dropout as bgd
from reference_kernels import _bias_gelu_dropout_kernels as bgd_kernels

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# Fused (fp32 throughout, one rounding) against unfused (rounded after each of four ops).
TOLERANCES = {
    torch.float32: dict(atol=1e-5, rtol=1e-5),
    torch.float16: dict(atol=2e-3, rtol=2e-3),
    torch.bfloat16: dict(atol=1.6e-2, rtol=1.6e-2),
}

SHAPES = [
    (1, 1),  # one element, one partly used Philox group
    (3, 7),  # width under one 8-column group
    (37, 100),  # two column tiles, the second ragged; ragged last row tile
    (2, 5, 24),  # leading dims flattened into rows
    (4, 136),  # width a multiple of 8 but not of the tile
]


def inputs(shape, dtype, device=DEVICE):
    x = torch.randn(shape, device=device).mul_(2).to(dtype)
    bias = torch.randn(shape[-1], device=device).to(dtype)
    return x, bias


def poisoned_like(x):
    return torch.full(x.shape, float("nan"), dtype=x.dtype, device=x.device)


@pytest.fixture(params=bgd._VARIANTS)
def variant(request, monkeypatch):
    """Run the test with each kernel variant as the module default (lean, the default, and the first, measured one)."""
    monkeypatch.setattr(bgd, "_KERNEL_VARIANT", request.param)
    return request.param


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_fused_matches_the_unfused_chain_and_writes_every_element(shape, dtype, variant):
    x, bias = inputs(shape, dtype)
    out = poisoned_like(x)
    y = bgd.fused(x, bias, 0.1, seed=7, out=out)
    assert y is out
    assert not y.isnan().any(), "an output element was left unwritten"
    torch.testing.assert_close(y, bgd.unfused(x, bias, 0.1, seed=7), **TOLERANCES[dtype])


@pytest.mark.parametrize("shape", [(37, 100), (2, 5, 24)], ids=str)
def test_the_output_fused_allocates_itself_has_every_element_written(shape, variant, unwritten_reads_nan):
    x, bias = inputs(shape, torch.float32)
    y = bgd.fused(x, bias, 0.1, seed=7)
    assert not y.isnan().any(), "an output element was left unwritten"
    torch.testing.assert_close(y, bgd.unfused(x, bias, 0.1, seed=7), **TOLERANCES[torch.float32])


@pytest.mark.parametrize("p", [0.0, 0.5, 1.0])
def test_fused_matches_the_unfused_chain_at_the_edge_probabilities(p, variant):
    x, bias = inputs((37, 100), torch.float16)
    torch.testing.assert_close(bgd.fused(x, bias, p, seed=3), bgd.unfused(x, bias, p, seed=3),
                               **TOLERANCES[torch.float16])


def test_p_zero_is_plain_bias_gelu_and_p_one_zeroes_everything(variant):
    x, bias = inputs((37, 100), torch.float32)
    torch.testing.assert_close(bgd.fused(x, bias, 0.0, seed=1), F.gelu(x + bias), **TOLERANCES[torch.float32])
    assert torch.equal(bgd.fused(x, bias, 1.0, seed=1), torch.zeros_like(x))


def test_exact_gelu_is_float32_accurate_into_the_far_tails(variant):
    x = torch.linspace(-10, 10, 4001, device=DEVICE).view(1, -1)
    y = bgd.fused(x, torch.zeros(x.shape[-1], device=DEVICE), 0.0)
    exact = x.double() * 0.5 * torch.special.erfc(-x.double() / 2**0.5)  # no cancellation in the tails
    # At |x| = 10, exp(-x*x/2) turns float32's rounding of x*x into ~1e-5 relative: any float32 GELU has it.
    torch.testing.assert_close(y.double(), exact, atol=1e-30, rtol=2e-5)


def test_dropped_elements_are_exactly_zero_and_kept_ones_are_scaled_by_one_over_one_minus_p(variant):
    x = torch.rand(37, 100, device=DEVICE) + 0.5  # gelu(x + 0) > 0 everywhere: a zero means dropped
    bias = torch.zeros(100, device=DEVICE)
    y = bgd.fused(x, bias, 0.25, seed=11)
    keep = bgd.dropout_mask(x.shape, 0.25, seed=11, device=DEVICE)
    assert torch.equal(y != 0, keep)
    torch.testing.assert_close(y[keep], F.gelu(x)[keep] / 0.75, **TOLERANCES[torch.float32])


def test_the_same_seed_gives_the_same_output_and_another_seed_another_mask(variant):
    x, bias = inputs((37, 100), torch.bfloat16)
    first, again = bgd.fused(x, bias, 0.3, seed=5), bgd.fused(x, bias, 0.3, seed=5)
    assert torch.equal(first, again)
    other = bgd.fused(x, bias, 0.3, seed=6)
    assert not torch.equal(first == 0, other == 0)


def test_the_mask_does_not_depend_on_the_launch_tiles_or_the_counter_width(variant):
    x, bias = inputs((37, 100), torch.float32)
    default = bgd.fused(x, bias, 0.5, seed=9)
    assert torch.equal(default, bgd._launch(x, bias, 0.5, 9, config=(1, 16, 1)))
    assert torch.equal(default, bgd._launch(x, bias, 0.5, 9, config=(8, 32, 1)))
    assert torch.equal(default, bgd._launch(x, bias, 0.5, 9, config=(2, 128, 1)))  # a whole row in one tile
    assert torch.equal(default, bgd._launch(x, bias, 0.5, 9, wide=True))  # int64 Philox counters
    if variant == "lean":  # one program walking all 37 row tiles, and one program a row tile
        assert torch.equal(default, bgd._launch(x, bias, 0.5, 9, config=(1, 64, 1), programs=1))
        assert torch.equal(default, bgd._launch(x, bias, 0.5, 9, config=(4, 64, 1), programs=10))
        # 10 ragged row tiles over 3 programs: the prefetch past the last tile is clamped, unused
        assert torch.equal(default, bgd._launch(x, bias, 0.5, 9, config=(4, 64, 1), programs=3))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("p", [0.1, 0.7, 1 - 2**-18])  # the last one rounds to "drop everything"
def test_the_lean_kernel_drops_exactly_the_elements_the_measured_one_drops(dtype, p):
    x = torch.rand(37, 100, device=DEVICE).add_(0.5).to(dtype)  # gelu(x + 0) > 0: a zero means dropped
    bias = torch.zeros(100, device=DEVICE, dtype=dtype)
    measured = bgd._launch(x, bias, p, 13, variant="measured")
    lean = bgd._launch(x, bias, p, 13, variant="lean")
    assert torch.equal(lean != 0, measured != 0)
    assert torch.equal(lean != 0, bgd.dropout_mask(x.shape, p, 13, device=DEVICE))
    torch.testing.assert_close(lean, measured, **TOLERANCES[dtype])


def ulps_apart(a, b):
    """Distance in representable 16-bit values (sign-magnitude bits mapped to an ordered integer)."""
    def ordered(t):
        bits = t.view(torch.int16).to(torch.int32)
        return torch.where(bits < 0, -(bits & 0x7FFF), bits)  # -0 and +0 both 0
    return (ordered(a) - ordered(b)).abs()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_the_degree_5_gelu_fit_stays_within_one_ulp_of_the_exact_gelu_for_16_bit_outputs(dtype):
    x = torch.linspace(-10, 10, 40001, device=DEVICE).to(dtype).view(1, -1)  # the fit's range, one row
    bias = torch.zeros(x.shape[-1], device=DEVICE, dtype=dtype)
    x64 = x.double()
    exact = (0.5 * x64 * torch.special.erfc(-x64 / 2**0.5)).to(dtype)  # erfc keeps the far tail (1 + erf loses it)
    for degree in (5, 7):
        y = bgd._launch(x, bias, 0.0, 0, variant="lean", gelu_degree=degree)
        apart = ulps_apart(y, exact)
        assert apart.max().item() <= 1, f"degree {degree}: {apart.max().item()} ulps from the exact GELU"


def test_the_gelu_degree_applies_to_16_bit_outputs_only_and_is_checked():
    x, bias = inputs((8, 64), torch.float32)
    assert torch.equal(bgd._launch(x, bias, 0.3, 5, variant="lean", gelu_degree=5),
                       bgd._launch(x, bias, 0.3, 5, variant="lean", gelu_degree=7))  # fp32: always 7
    xh, bh = x.abs().add(0.5).bfloat16(), bias.abs().bfloat16()  # gelu > 0: a zero means dropped
    y5 = bgd._launch(xh, bh, 0.3, 5, variant="lean", gelu_degree=5)
    assert torch.equal(y5 != 0, bgd.dropout_mask(x.shape, 0.3, 5, device=DEVICE))  # the same mask
    torch.testing.assert_close(y5, bgd.unfused(xh, bh, 0.3, seed=5), **TOLERANCES[torch.bfloat16])
    with pytest.raises(ValueError, match="degree 6"):
        bgd._launch(x, bias, 0.3, 5, variant="lean", gelu_degree=6)


def test_an_unknown_kernel_variant_is_refused():
    x, bias = inputs((4, 16), torch.float32)
    with pytest.raises(ValueError, match="unknown kernel variant"):
        bgd._launch(x, bias, 0.1, 0, variant="fastest")


@triton.jit
def _philox_pair_kernel(out_ptr, seed, BLOCK: tl.constexpr, WIDE: tl.constexpr, LEAN: tl.constexpr,
                        FAST: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    counter = offs.to(tl.int64) * 0x1_0000_0001 + 7 if WIDE else offs * 977 + 13
    if LEAN:
        ours = bgd_kernels._philox4x32(seed, counter, 10, FAST)
    else:
        ours = bgd_kernels._philox4x32(seed, counter, 10)
    theirs = tl.randint4x(seed, counter, 10)
    for i in tl.static_range(4):
        tl.store(out_ptr + i * BLOCK + offs, ours[i].to(tl.int64))
        tl.store(out_ptr + (4 + i) * BLOCK + offs, theirs[i].to(tl.int64))


@pytest.mark.parametrize("lean", [False, True], ids=["measured", "lean"])
@pytest.mark.parametrize("wide", [False, True], ids=["int32-counters", "int64-counters"])
def test_our_philox_draws_the_same_bits_as_triton_randint4x(wide, lean):
    out = torch.empty(8, 64, dtype=torch.int64, device=DEVICE)
    # FAST (the lean kernel's inline-PTX products) only compiles for CUDA.
    _philox_pair_kernel[(1,)](out, 2**40 + 12345, BLOCK=64, WIDE=wide, LEAN=lean, FAST=lean and DEVICE == "cuda")
    assert torch.equal(out[:4], out[4:])
    assert out[:4].unique().numel() > 250


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_keep_rate_is_one_minus_p_in_every_column_lane_and_neighbours_are_independent(p):
    keep = bgd.dropout_mask((64, 1024), p, seed=123, device=DEVICE).float()
    n = keep.numel()
    assert abs(keep.mean().item() - (1 - p)) < 5 * (p * (1 - p) / n) ** 0.5
    # Each of the 8 columns sharing a Philox counter takes a different 16-bit slice.
    lanes = keep.view(64, 128, 8).mean(dim=(0, 1))
    assert (lanes - (1 - p)).abs().max() < 5 * (p * (1 - p) / (n / 8)) ** 0.5
    left, right = keep[:, :-1].flatten(), keep[:, 1:].flatten()
    assert abs(torch.corrcoef(torch.stack([left, right]))[0, 1].item()) < 0.03


def test_rows_with_a_stride_are_read_in_place_and_layouts_without_a_rows_view_are_refused(variant):
    big, bias = inputs((20, 64), torch.float16)
    x = big[:, :40]  # row stride 64
    torch.testing.assert_close(bgd.fused(x, bias[:40], 0.2, seed=2), bgd.fused(x.contiguous(), bias[:40], 0.2, seed=2))
    with pytest.raises(ValueError, match="unit stride"):
        bgd.fused(big.t(), torch.zeros(20, device=DEVICE, dtype=torch.float16))
    with pytest.raises(ValueError, match="no \\(rows, 8\\) view"):
        bgd.fused(torch.randn(4, 6, 8, device=DEVICE).transpose(0, 1), torch.zeros(8, device=DEVICE))


def test_empty_input_gives_an_empty_output():
    x, bias = inputs((0, 16), torch.float32)
    assert bgd.fused(x, bias, 0.1).shape == (0, 16)


# The interpreter computes with numpy, which warns when inf * 0 makes the nan asked for.
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_nan_and_minus_inf_come_out_nan_whether_kept_or_dropped_as_in_torch(variant):
    x, bias = inputs((8, 64), torch.float32)
    x[0, :] = float("nan")
    x[1, :] = -float("inf")  # gelu(-inf) = -inf * 0 = nan in torch
    y, ref = bgd.fused(x, bias, 0.5, seed=4), bgd.unfused(x, bias, 0.5, seed=4)
    assert y[:2].isnan().all()
    assert torch.equal(y.isnan(), ref.isnan())


@pytest.mark.gpu
def test_plus_inf_stays_inf_when_kept_as_torch_cuda_gives(variant):
    # torch's CPU GELU returns nan for +inf; its CUDA kernel and ours return +inf.
    x, bias = inputs((8, 64), torch.float32)
    x[2, :] = float("inf")
    y, ref = bgd.fused(x, bias, 0.5, seed=4), bgd.unfused(x, bias, 0.5, seed=4)
    assert torch.equal(y.isnan(), ref.isnan()) and torch.equal(y.isinf(), ref.isinf())


@pytest.mark.gpu
def test_a_large_bf16_input_matches_with_the_gpu_tiles(variant):
    x, bias = inputs((1024, 8192), torch.bfloat16)
    torch.testing.assert_close(bgd.fused(x, bias, 0.1, seed=42), bgd.unfused(x, bias, 0.1, seed=42),
                               **TOLERANCES[torch.bfloat16])


# --------------------------------------------------------------------------- bad input


def test_bad_input_raises_a_clear_error():
    x, bias = inputs((4, 16), torch.float16)
    cases = [
        ((x.to(torch.int32), bias), {}, TypeError, "dtype int32"),
        ((x, bias.float()), {}, TypeError, "bias has dtype float32"),
        ((x, bias[:8]), {}, ValueError, r"bias must have shape \(16,\)"),
        ((x, bias[None]), {}, ValueError, "bias must have 1 dimension"),
        ((x[0, 0], bias), {}, ValueError, "at least 1 dimension"),
        ((x, bias, -0.1), {}, ValueError, r"p must be a number in \[0, 1\]"),
        ((x, bias, 1.5), {}, ValueError, r"p must be a number in \[0, 1\]"),
        ((x, bias, "0.1"), {}, ValueError, r"p must be a number in \[0, 1\]"),
        ((x, bias, 0.1, -1), {}, ValueError, "seed must be an int"),
        ((x, bias, 0.1, 1.5), {}, ValueError, "seed must be an int"),
        ((x, bias), {"approximate": "fast"}, ValueError, "unknown approximate"),
        ((x, bias), {"out": x.t()}, ValueError, "out must be a contiguous"),
        (([1.0], bias), {}, TypeError, "must be a torch.Tensor"),
    ]
    for args, kwargs, error, message in cases:
        with pytest.raises(error, match=message):
            bgd.fused(*args, **kwargs)
    with pytest.raises(ValueError, match=r"p must be a number in \[0, 1\]"):
        bgd.dropout_mask((4, 16), 2.0, seed=0, device=DEVICE)


def test_cpu_tensors_are_refused_when_the_interpreter_is_off(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    x, bias = inputs((4, 16), torch.float32, device="cpu")
    with pytest.raises(ValueError, match="CUDA"):
        bgd.fused(x, bias)


# --------------------------------------------------------------------------- budget


def traffic(fn, dims, elt):
    """Bytes read and written by the lines of fn carrying '# read ... ; write ...' comments."""

    def count(side):  # "MN + N elements + MN bytes": terms up to a unit take that unit
        total = pending = 0
        for coef, letters, unit in re.findall(r"(\d*)([A-Z]+)|(elements|bytes)", side):
            if unit:
                total, pending = total + pending * (elt if unit == "elements" else 1), 0
                continue
            value = int(coef or 1)
            for letter in letters:
                value *= dims[letter]
            pending += value
        return total

    reads = writes = 0
    for line in inspect.getsource(fn).splitlines():
        m = re.search(r"# (?:read (.*?) ; )?write (.*)$", line)
        if m:
            reads += count(m.group(1)) if m.group(1) else 0
            writes += count(m.group(2))
    return reads, writes


def test_unfused_traffic_comments_add_up_to_five_passes():
    M, N = 1000, 300
    reads, writes = traffic(bgd.unfused, dict(M=M, N=N), elt=2)
    assert reads == 2 * (4 * M * N + N) + M * N  # four element passes, the bias, the bool mask
    assert writes == 2 * 4 * M * N + M * N


def test_budget_is_one_read_of_x_and_bias_and_one_write_of_y():
    x = torch.empty(64, 128, 1024, device="meta", dtype=torch.bfloat16)
    bias = torch.empty(1024, device="meta", dtype=torch.bfloat16)
    got = bgd.budget(x, bias)
    assert (got.read_bytes, got.write_bytes) == (2 * (x.numel() + 1024), 2 * x.numel())
    reads, writes = traffic(bgd.unfused, dict(M=64 * 128, N=1024), elt=2)
    assert reads + writes > 4 * got.total


def test_launch_metadata_declares_the_budget_bytes():
    x, bias = inputs((12, 40), torch.bfloat16)
    meta = bgd_kernels._launch_metadata((1,), SimpleNamespace(name="k"), dict(M=12, N=40, y_ptr=x))
    assert meta["bytes"] == bgd.budget(x, bias).total
