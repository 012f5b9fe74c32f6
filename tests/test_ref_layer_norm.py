"""reference_kernels.layer_norm: forward and backward against torch, on every path.

Without a GPU the kernels run under Triton's interpreter (tests/conftest.py), so shapes
are small; ``max_row`` shrinks the on-chip row limit so that short rows take the wide-row
plans (forward: split or looped; backward: chunked). The plans with programs waiting on
each other (the backward's one-pass chunks, the forward's split slices) cannot run under
the interpreter: their tests carry the ``gpu`` marker.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import triton

from reference_kernels import _device, layer_norm
from reference_kernels._common import THREAD_MAX_REGS
from test_ref_held import compile_for_sm90

# The interpreter computes masked-off lanes with numpy, which warns about their nan.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
H200 = _device.DESCRIPTIONS["H200"]  # the GPU the plans' bands were measured on (docs/kernels.md, "Planning")
SMS = H200.sms


TUNED = _device.tuned("layer_norm", 90, layer_norm.DEFAULT_TUNING)


@pytest.fixture(autouse=True)
def sm90_bands(monkeypatch):
    """Every test here plans with the sm_90 file's bands (tuned/90.json) on any device and Triton: the widths the
    kernels' paths were measured at; a test moves a band with ``tune`` (to widths the interpreter runs)."""
    monkeypatch.setattr(layer_norm, "DEFAULT_TUNING", TUNED)
    monkeypatch.setattr(_device, "tuned_here", lambda device: False)


def held_shapes(monkeypatch, **choices) -> None:
    """This test's ``_layer_norm_held.SHAPES``: fields of ``Shapes`` over the sm_90 file's, by-key ones as dicts."""
    from reference_kernels import _layer_norm_held

    values = {k: tuple(sorted(v.items())) if isinstance(v, dict) else v for k, v in choices.items()}
    monkeypatch.setattr(_layer_norm_held, "SHAPES", dataclasses.replace(_layer_norm_held.SHAPES, **values))


def tune(monkeypatch, **choices) -> None:
    """This test's bands: ``layer_norm.Tuning`` fields, by-size ones as dicts ({2: ..., 4: ...}; None: none)."""
    def frozen(value):
        if isinstance(value, dict):
            return tuple(sorted((k, v) for k, v in value.items() if v is not None))
        return value

    fields = {f.name: f.default for f in dataclasses.fields(layer_norm.Tuning)}
    values = {k: (fields[k] if v is None and fields[k] == () else frozen(v)) for k, v in choices.items()}
    monkeypatch.setattr(layer_norm, "DEFAULT_TUNING", dataclasses.replace(layer_norm.DEFAULT_TUNING, **values))


def on(sms: int) -> _device.Device:
    """A device of ``sms`` SMs whose programs run one after another: plans small enough for the interpreter."""
    return dataclasses.replace(_device.INTERPRETER, sms=sms)
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# Backward kernels: the measured plans and the register-lean kernel (forced at every shape).
VARIANTS = ("measured", "lean")
# Against float64 torch, relative to the largest reference magnitude (outputs and grads).
TOLERANCES = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 2e-2}

SHAPES = [
    ((1, 1), None),  # one-wide row: y is the bias, dx is zero
    ((37, 3), None),  # narrow rows, several per program, ragged last program
    ((5, 7), None),  # width not a power of two
    ((2, 3, 64), None),  # leading dims flattened, power-of-two width
    ((9, 100), 32),  # wide-row plans, last chunk ragged
    ((6, 128), 32),  # wide-row plans, chunks fill the row exactly
    ((3, 1000), 16),  # wide-row plans, 63 chunks per row
]


def inputs(shape, dtype, device=DEVICE, pdtype=None):
    """x of ``dtype`` and its weight and bias of ``pdtype`` (default x's)."""
    n = shape[-1]
    x = (torch.randn(shape, device=device) * 3 + 1).to(dtype)
    weight = torch.randn(n, device=device).to(pdtype or dtype)
    bias = torch.randn(n, device=device).to(pdtype or dtype)
    return x, weight, bias


def assert_forward_matches(x, weight, bias, y, mean, rstd):
    """Every output and statistic written (poisoned with nan before) and as torch's: y to x's dtype's tolerance, mean and
    rstd as float32 from x."""
    assert not y.isnan().any() and not mean.isnan().any() and not rstd.isnan().any()
    expected = F.layer_norm(x.float(), (x.shape[-1],), weight.float(), bias.float()).to(x.dtype)
    assert_close(y, expected, x.dtype, "y")
    xf = x.float()
    torch.testing.assert_close(mean, xf.mean(-1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(rstd, 1 / (xf.var(-1, unbiased=False) + 1e-5).sqrt(), rtol=1e-4, atol=0)


def torch_reference(x, weight, bias, dy, eps=1e-5):
    """float64 layer norm and its gradients, by torch autograd."""
    leaves = [t.detach().double().requires_grad_() for t in (x, weight, bias)]
    y = F.layer_norm(leaves[0], (x.shape[-1],), leaves[1], leaves[2], eps)
    return (y, *torch.autograd.grad(y, leaves, dy.double()))


def assert_close(actual, expected, dtype, what, inputs=None):
    """Error relative to max(|reference|, 1); with ``inputs=(x, weight, dy)`` also relative to
    the size of what the result is computed from. dx subtracts terms as large as rstd * |weight * dy|,
    so their float32 rounding, amplified by rstd (316 for a constant row at eps=1e-5), is the floor
    even where dx is 0. dbias (dweight) sums a column of dy (dy * x-hat) over the rows: a sum of M
    random terms is sqrt(M) * their rms in size, and its rounding scales with that even when the
    terms cancel to a small total (a 1-wide fp32 input of 2**20 rows: |dbias| 4, rounding 2.5e-4)."""
    scale = max(expected.abs().max().item(), 1.0)
    if inputs is not None and what in ("dx", "dweight", "dbias"):
        x, weight, dy = (t.double() for t in inputs)
        mean = x.mean(-1, keepdim=True)
        rstd = (x.var(-1, unbiased=False, keepdim=True) + 1e-5).rsqrt()
        if what == "dx":
            scale = max(scale, (rstd * weight * dy).abs().max().item())
        else:
            terms = dy if what == "dbias" else dy * (x - mean) * rstd
            scale = max(scale, (terms.shape[0] * terms.pow(2).mean(0)).sqrt().max().item())
    error = (actual.double() - expected).abs().max().item() / scale
    assert error <= TOLERANCES[dtype], f"{what}: error {error:.3g} relative to max |ref| {scale:.3g}"


def fused_with_grads(x, weight, bias, dy, **plan):
    leaves = [t.detach().requires_grad_() for t in (x, weight, bias)]
    y = layer_norm.fused(*leaves, **plan)
    return (y, *torch.autograd.grad(y, leaves, dy))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape, max_row", SHAPES, ids=str)
def test_forward_and_backward_match_torch_autograd(shape, max_row, dtype, variant):
    x, weight, bias = inputs(shape, dtype)
    dy = torch.randn(shape, device=DEVICE).to(dtype)
    ours = fused_with_grads(x, weight, bias, dy, max_row=max_row, bwd_variant=variant)
    for what, a, e in zip(("y", "dx", "dweight", "dbias"), ours, torch_reference(x, weight, bias, dy)):
        assert a.dtype == dtype and a.shape == e.shape
        assert_close(a, e, dtype, what, inputs=(x, weight, dy))


@pytest.mark.parametrize("shape, max_row", [((37, 3), None), ((9, 100), 32)], ids=["rows", "chunked"])
def test_forward_writes_every_output_element_and_returns_row_statistics(shape, max_row):
    x, weight, bias = inputs(shape, torch.float32)
    out = torch.full(shape, float("nan"), device=DEVICE)
    y, mean, rstd = layer_norm.forward(x, weight, bias, out=out, max_row=max_row)
    assert y is out and not y.isnan().any(), "an output element was left unwritten"
    torch.testing.assert_close(mean, x.mean(-1))
    torch.testing.assert_close(rstd, torch.rsqrt(x.var(-1, unbiased=False) + 1e-5))
    assert_close(y, torch_reference(x, weight, bias, torch.zeros_like(x))[0], torch.float32, "y")


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("shape, max_row", [((37, 3), None), ((9, 100), 32)], ids=["rows", "chunked"])
def test_every_output_that_forward_and_backward_allocate_is_written(shape, max_row, variant, unwritten_reads_nan):
    x, weight, bias = inputs(shape, torch.float32)
    dy = torch.randn(shape, device=DEVICE)
    y, mean, rstd = layer_norm.forward(x, weight, bias, max_row=max_row)
    dx, dw, db = layer_norm.backward(dy, x, weight, mean, rstd, max_row=max_row, variant=variant)
    for what, t in zip(("y", "mean", "rstd", "dx", "dweight", "dbias"), (y, mean, rstd, dx, dw, db)):
        assert not t.isnan().any(), f"{what}: an element was left unwritten"
    for what, a, e in zip(("y", "dx", "dweight", "dbias"), (y, dx, dw, db), torch_reference(x, weight, bias, dy)):
        assert_close(a, e, torch.float32, what, inputs=(x, weight, dy))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_unfused_matches_torch_layer_norm(dtype):
    x, weight, bias = inputs((7, 50), dtype)
    dy = torch.zeros_like(x)
    assert_close(layer_norm.unfused(x.float(), weight.float(), bias.float()), torch_reference(x, weight, bias, dy)[0], torch.float32, "y")


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("shape, max_row", [((300, 40), None), ((48, 40), 16)], ids=["rows", "chunked"])
def test_dweight_and_dbias_are_bitwise_identical_run_to_run(shape, max_row, variant):
    x, weight, bias = inputs(shape, torch.float32)
    dy = torch.randn_like(x)
    first = fused_with_grads(x, weight, bias, dy, max_row=max_row, bwd_variant=variant)
    second = fused_with_grads(x, weight, bias, dy, max_row=max_row, bwd_variant=variant)
    for a, b in zip(first, second):
        assert torch.equal(a, b)


@pytest.mark.parametrize("groups_per_split", [1, 3, 1000], ids=["one share a split", "ragged splits", "one level"])
def test_the_share_sums_are_right_and_bitwise_identical_with_either_level_count(groups_per_split, monkeypatch):
    monkeypatch.setattr(layer_norm, "_DWDB_GROUPS_PER_SPLIT", groups_per_split)
    shares = torch.randn(2, 11, 300, device=DEVICE)  # 11 shares of 300 columns: two column blocks of 256
    outs = []
    for _ in range(2):
        dw, db = torch.full((2, 300), float("nan"), device=DEVICE).unbind(0)
        layer_norm._sum_shares(shares[0], shares[1], dw, db)
        outs.append((dw, db))
    for got, part in zip(outs[0], shares):
        torch.testing.assert_close(got, part.double().sum(0).float(), atol=1e-5, rtol=1e-5)
    assert all(torch.equal(a, b) for a, b in zip(*outs))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("max_row", [None, 8], ids=["rows", "chunked"])
def test_nan_and_inf_rows_come_out_as_torch_layer_norm_gives_them(max_row, variant):
    x, weight, bias = inputs((4, 40), torch.float32)
    x[0, 3] = float("nan")
    x[1, 5] = float("inf")
    x[2, :] = -float("inf")
    dy = torch.randn_like(x)
    ours = fused_with_grads(x, weight, bias, dy, max_row=max_row, bwd_variant=variant)
    leaves = [t.detach().requires_grad_() for t in (x, weight, bias)]
    expected_y = F.layer_norm(leaves[0], (40,), leaves[1], leaves[2], 1e-5)
    expected = (expected_y, *torch.autograd.grad(expected_y, leaves, dy))
    for what, a, e in zip(("y", "dx", "dweight", "dbias"), ours, expected):
        torch.testing.assert_close(a, e, equal_nan=True, atol=1e-4, rtol=1e-4, msg=lambda m: f"{what}: {m}")


def test_a_constant_row_normalises_to_the_bias():
    x, weight, bias = inputs((3, 20), torch.float32)
    x[1] = 7.0
    torch.testing.assert_close(layer_norm.fused(x, weight, bias)[1], bias)


def test_fuseds_plan_overrides_reach_its_backward_and_forwards_statistics_take_no_gradient(monkeypatch):
    # the options one argument of the Function, y alone its output for fused (Function.apply: Python an argument)
    x, weight, bias = (t.requires_grad_() for t in inputs((6, 40), torch.float32))
    seen = []
    real = layer_norm.backward
    monkeypatch.setattr(layer_norm, "backward", lambda *a, **k: seen.append(k) or real(*a, **k))
    y = layer_norm.fused(x, weight, bias, max_row=16, one_pass=False, bwd_variant="measured")
    assert isinstance(y, torch.Tensor) and y.grad_fn is not None
    y.sum().backward()
    assert seen == [dict(bias_dtype=torch.float32, max_row=16, one_pass=False, variant="measured")]
    y2, mean, rstd = layer_norm.forward(x, weight, bias)
    assert y2.requires_grad and not mean.requires_grad and not rstd.requires_grad
    torch.testing.assert_close(y2, F.layer_norm(x, (40,), weight, bias), rtol=1e-4, atol=1e-4)


def test_fused_builds_no_autograd_node_where_nothing_is_differentiated(monkeypatch):
    # the Function cost ~9 us of host a call (CI's host) on inputs no gradient reaches: inference, no_grad
    x, weight, bias = inputs((6, 40), torch.float32)
    expected = F.layer_norm(x, (40,), weight, bias)

    def no_function(*args):
        raise AssertionError("an autograd Function where nothing is differentiated")

    with monkeypatch.context() as m:
        m.setattr(layer_norm._LayerNormFunction, "apply", no_function)
        y = layer_norm.fused(x, weight, bias)
        assert y.grad_fn is None and not y.requires_grad
        torch.testing.assert_close(y, expected, rtol=1e-4, atol=1e-4)
        with torch.no_grad():
            weight.requires_grad_(True)
            assert not layer_norm.fused(x, weight, bias).requires_grad
    y = layer_norm.fused(x, weight, bias)  # weight requires grad, grad mode on: the Function's node
    assert y.grad_fn is not None and "LayerNormFunction" in type(y.grad_fn).__name__
    y.sum().backward()
    assert weight.grad is not None and weight.grad.shape == weight.shape


def test_fused_in_inference_replays_allocating_only_its_output():
    # mean and rstd are written and read by nothing: the record's own, passed again (~3.6 us of host a call, H100 machine)
    from reference_kernels import _launch

    _launch.forget()
    weight, bias = inputs((6, 40), torch.float32)[1:]
    for i in range(4):
        x = inputs((2, 3, 40), torch.float32)[0]
        y = layer_norm.fused(x, weight, bias)
        torch.testing.assert_close(y, F.layer_norm(x, (40,), weight, bias), rtol=1e-4, atol=1e-4)
    assert layer_norm.FORWARD_CALLS.last == "replayed"
    entry = next(iter(layer_norm.FORWARD_CALLS.table.values()))
    assert [isinstance(a, tuple) for a in entry.allocs] == [True, False, False]  # y made again; mean, rstd kept
    torch.testing.assert_close(entry.allocs[1], x.mean(-1), rtol=1e-5, atol=1e-5)  # the last replay wrote them
    _, mean, rstd = layer_norm.forward(x, weight, bias)  # the statistics returned: another key, its own each call
    torch.testing.assert_close(mean, x.mean(-1), rtol=1e-5, atol=1e-5)


def test_non_contiguous_input_and_gradient_are_handled():
    base, weight, bias = inputs((20, 16), torch.float32)
    x = base[::2]  # row stride twice the width: read in place
    dy = torch.randn(16, 10, device=DEVICE).t()  # transposed: copied
    ours = fused_with_grads(x, weight, bias, dy)
    for what, a, e in zip(("y", "dx", "dweight", "dbias"), ours, torch_reference(x, weight, bias, dy)):
        assert_close(a, e, torch.float32, what, inputs=(x, weight, dy))


def test_a_gradient_of_a_sum_expanded_to_stride_zero_is_handled():
    x, weight, bias = inputs((5, 12), torch.float32)
    x.requires_grad_()
    layer_norm.fused(x, weight, bias).sum().backward()
    expected = torch_reference(x, weight, bias, torch.ones_like(x))[1]
    assert_close(x.grad, expected, torch.float32, "dx")


@pytest.mark.parametrize(
    "make, error, words",
    [
        (lambda x, w, b: (x.to(torch.int32), w, b), TypeError, "x has dtype int32"),
        (lambda x, w, b: (x, w[:-1], b), ValueError, r"weight has shape \(11,\)"),
        (lambda x, w, b: (x, w, b.view(3, 4)), ValueError, "bias must have 1 dimension"),
        (lambda x, w, b: (x, w, None), TypeError, "bias must be a torch.Tensor"),
        (lambda x, w, b: (x[0, 0], w, b), ValueError, "x must have at least 1 dimension"),
    ],
    ids=["int-input", "short-weight", "2d-bias", "no-bias", "scalar-input"],
)
def test_bad_input_raises_a_clear_error(make, error, words):
    x, weight, bias = inputs((4, 12), torch.float32)
    with pytest.raises(error, match=words):
        layer_norm.fused(*make(x, weight, bias))


def test_a_gradient_of_the_wrong_shape_is_refused():
    x, weight, bias = inputs((4, 12), torch.float32)
    y, mean, rstd = layer_norm.forward(x, weight, bias)
    with pytest.raises(ValueError, match="dy has shape"):
        layer_norm.backward(torch.ones(4, 11, device=DEVICE), x, weight, mean, rstd)


def test_a_cpu_tensor_is_refused_when_the_interpreter_is_off(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    x, weight, bias = inputs((2, 3), torch.float32, device="cpu")
    with pytest.raises(ValueError, match="CUDA"):
        layer_norm.fused(x, weight, bias)


@pytest.mark.parametrize("in_launch", [True, False], ids=["shares summed in its launch", "by _sum_shares"])
@pytest.mark.parametrize("prefetch", [False, True], ids=["loads in step", "next block prefetched"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "shape, block_m, n_groups",
    [((37, 3), 8, 3), ((50, 100), 1, 4), ((64, 256), 4, 16), ((5, 4096), 1, 2), ((70, 300), 1, 70)],
    ids=str,  # groups of 16, 16, 5 rows; 13 a group, the last ragged; one block a group; wide rows; past one split
)
def test_the_rows_backward_walks_its_row_groups_with_or_without_prefetch(shape, block_m, n_groups, dtype, prefetch,
                                                                         in_launch, monkeypatch):
    if not in_launch:
        monkeypatch.setattr(layer_norm, "_SUM_HERE_BYTES", 0)
    x, weight, bias = inputs(shape, dtype)
    dy = torch.randn(shape, device=DEVICE).to(dtype)
    _, mean, rstd = layer_norm.forward(x, weight, bias)
    plan = layer_norm._Plan("rows", block_m, triton.next_power_of_2(shape[1]), 4, n_groups, prefetch=prefetch)
    dx = torch.full_like(x, float("nan"))
    dw = torch.full_like(weight, float("nan"))
    db = torch.full_like(bias, float("nan"))
    layer_norm._backward_launch(dy, x, weight, mean, rstd, dx, dw, db, plan)
    _, *expected = torch_reference(x, weight, bias, dy)
    for what, a, e in zip(("dx", "dweight", "dbias"), (dx, dw, db), expected):
        assert not a.isnan().any(), f"{what} left unwritten"
        assert_close(a, e, dtype, what, inputs=(x, weight, dy))


def _kernels_launched(call) -> list[str]:
    """The Triton kernels ``call()`` launches, by name, in order."""
    from pytest_fusioncheck import _compat

    seen = []

    def on_launch(jitfn, original, args, kwargs, grid, warmup, interpreted):
        seen.append(jitfn.__name__)
        return original(jitfn, *args, grid=grid, warmup=warmup, **kwargs)

    with _compat.triton_launch_hook(on_launch):
        call()
    return seen


def _backward_launches(dy, x, weight, mean, rstd, plan) -> tuple[list[str], tuple]:
    """The kernels a backward plan launches, by name, and its (dx, dw, db), every element NaN until written."""
    grads = tuple(torch.full_like(t, float("nan")) for t in (x, weight, weight))
    return _kernels_launched(lambda: layer_norm._backward_launch(dy, x, weight, mean, rstd, *grads, plan)), grads


@pytest.mark.parametrize("n_groups", [1, 3, 8], ids=lambda g: f"{g} groups")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_rows_backward_sums_few_shares_in_its_one_launch_deterministically(n_groups, dtype, monkeypatch):
    # few rows (a training step's last micro-batch, a test's): the last group to finish adds the shares, so the call
    # launches once (one group: its shares are the sums); past _SUM_HERE_BYTES, _sum_shares launches again
    shape = (16, 300)  # 3 groups: 6, 6, 4 rows
    x, weight, bias = inputs(shape, dtype)
    dy = torch.randn(shape, device=DEVICE).to(dtype)
    _, mean, rstd = layer_norm.forward(x, weight, bias)
    plan = layer_norm._Plan("rows", 1, 512, 4, n_groups)
    _, *expected = torch_reference(x, weight, bias, dy)
    got = []
    for limit in (layer_norm._SUM_HERE_BYTES, layer_norm._SUM_HERE_BYTES, n_groups * shape[1] * 8 - 1):
        monkeypatch.setattr(layer_norm, "_SUM_HERE_BYTES", limit)
        kernels, grads = _backward_launches(dy, x, weight, mean, rstd, plan)
        assert kernels[0] == "_layer_norm_bwd_kernel", kernels
        assert len(kernels) == (1 if limit >= n_groups * shape[1] * 8 else 2), (limit, kernels)
        for what, a, e in zip(("dx", "dweight", "dbias"), grads, expected):
            assert not a.isnan().any(), f"{what} left unwritten"
            assert_close(a, e, dtype, what, inputs=(x, weight, dy))
        got.append(grads)
    assert all(torch.equal(a, b) for a, b in zip(*got[:2])), "summed in the launch: not the same bits twice"


@pytest.mark.parametrize("n_groups", [1, 32, 33, 100], ids=lambda g: f"{g} shares")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_the_shares_are_summed_in_one_launch_in_a_fixed_order(n_groups, dtype):
    # past one split of shares (_DWDB_GROUPS_PER_SPLIT), each column block's last split to arrive adds the splits'
    # sums in the same launch; 300 columns: a ragged last column block
    gen = torch.Generator(device=DEVICE).manual_seed(n_groups)
    dw_part, db_part = (torch.randn(n_groups, 300, device=DEVICE, generator=gen) for _ in range(2))
    got = []
    for _ in range(2):
        dw, db = (torch.full((300,), float("nan"), device=DEVICE, dtype=dtype) for _ in range(2))
        assert _kernels_launched(lambda: layer_norm._sum_shares(dw_part, db_part, dw, db)) == ["_layer_norm_dwdb_kernel"]
        got.append((dw, db))
    for a, part in zip(got[0], (dw_part, db_part)):
        want = part.double().sum(0)
        torch.testing.assert_close(a.double(), want, atol=1e-4 * n_groups ** 0.5, rtol=TOLERANCES[dtype])
    assert all(torch.equal(a, b) for a, b in zip(*got)), "not the same bits twice"


def test_replayed_backwards_that_sum_their_shares_in_launch_arrive_on_a_fresh_count_each_call(monkeypatch):
    # the arrivals' count is kept scratch, zeroed (_launch._Scratch): a pool of two, so the replays below take both
    # slices and then a refilled pool; a count left at its last arrival would leave dweight and dbias unwritten
    from reference_kernels import _launch

    monkeypatch.setattr(_launch, "_KEPT_BYTES", 2 * _launch._rounded(4))
    x, weight, bias = inputs((40, 300), torch.float32)
    dy = torch.randn(x.shape, device=DEVICE)
    _, mean, rstd = layer_norm.forward(x, weight, bias)
    plan = layer_norm._layer_norm_settings(*x.shape, 4, backward=True, device=_device.of(x.device), phased_ok=True,
                                           flat_ok=True, packed=False)
    assert plan.mode == "rows" and plan.n_groups > 1 and layer_norm._shares_summed_in_launch(plan.n_groups, 300), plan
    first = layer_norm.backward(dy, x, weight, mean, rstd)
    _, *expected = torch_reference(x, weight, bias, dy)
    for what, a, e in zip(("dweight", "dbias"), first[1:], expected[1:]):
        assert_close(a, e, torch.float32, what, inputs=(x, weight, dy))
    for _ in range(6):
        got = layer_norm.backward(dy, x, weight, mean, rstd)
        assert all(torch.equal(a, b) for a, b in zip(got, first))
    assert layer_norm.BACKWARD_CALLS.last == "replayed"


def test_only_16_bit_backward_rows_wider_than_2048_prefetch_where_it_measured_faster():
    # the rows plan where rows do not lie flat (contiguous 4096-wide 16-bit rows take the flat plan)
    settings = functools.partial(layer_norm._layer_norm_settings, flat_ok=False)
    assert settings(32768, 4096, 2, backward=True, device=H200).prefetch  # bf16 4096: 87% against 74%
    assert settings(32768, 2064, 2, backward=True, device=H200).prefetch
    assert not settings(32768, 2048, 2, backward=True, device=H200).prefetch
    assert not settings(131072, 1024, 2, backward=True, device=H200).prefetch  # 68% against 81%
    assert not settings(32768, 4096, 4, backward=True, device=H200).prefetch  # fp32: 90% against 93%
    assert not settings(32768, 4096, 2, device=H200).prefetch  # forward plans never do
    assert not settings(32768, 4096, 2, backward=True, device=H200, max_row=4096).prefetch  # tests' plans


def test_settings_split_rows_into_groups_that_fill_the_gpu():
    plan = layer_norm._layer_norm_settings(131072, 1024, 4, backward=True, device=H200)
    assert plan.mode == "rows" and plan.n_groups == SMS * layer_norm._BWD_PROGRAMS_PER_SM
    half = layer_norm._layer_norm_settings(131072, 1024, 2, backward=True, device=H200)
    assert (half.block_m, half.num_warps) == (1, layer_norm._BWD_NARROW_WARPS)
    assert half.n_groups * half.num_warps == SMS * layer_norm.RESIDENT_WARPS  # the resident warps, a row a step
    # a 16-bit row a step only where it fills 4 warps' 16-byte vectors (513-1024); narrower rows fill the rows tile
    # (bf16 64: 18 -> 89% of copy on the H100)
    narrow = [layer_norm._layer_norm_settings(131072, n, 2, backward=True, device=H200)
              for n in (64, 256, 512, 513, 1000)]
    assert [(p.block_m, p.num_warps) for p in narrow] == [(64, 8), (16, 8), (8, 8), (1, 4), (1, 4)]
    wide = layer_norm._layer_norm_settings(2048, 65536, 4, backward=True, device=H200)
    assert wide.n_groups * (65536 // wide.block_n) <= SMS * layer_norm._BWD_PROGRAMS_PER_SM
    narrow = layer_norm._layer_norm_settings(3, 16, 4, backward=True, device=H200)
    assert narrow.n_groups == 1  # never more groups than row blocks


@pytest.mark.parametrize("width", [1024, 4096, 16384, 65536])
@pytest.mark.parametrize("elem_size", [4, 2], ids=["fp32", "bf16"])
def test_lean_plans_fit_their_register_cap_and_fill_the_gpu_without_outgrowing_it(width, elem_size):
    sm = SMS
    plan = layer_norm._layer_norm_settings(2**27 // width, width, elem_size, backward=True, device=H200, variant="lean")
    assert (plan.variant, plan.block_m) == ("lean", 1)
    assert plan.block_n * elem_size == 16 * 32 * plan.num_warps  # one 16-byte vector a thread and tensor
    threads = 32 * plan.num_warps
    resident = min(2048 // threads, 65536 // (plan.max_regs * threads))
    assert resident >= 1 and resident * plan.num_warps >= 16  # at least half the SM's warp slots
    chunks = -(-width // plan.block_n)
    chunked = "two_pass" if layer_norm.interpreting() else "one_pass"
    widest = layer_norm._BWD_ROWS_TILE  # whole rows up to the rows plan's tile, chunks past it
    assert plan.mode == ("rows" if width <= widest else chunked)
    assert sm * resident - chunks < plan.n_groups * chunks <= sm * resident  # one wave, all co-resident


def test_the_lean_backward_takes_over_only_where_it_measured_faster():
    settings = lambda width, size: layer_norm._layer_norm_settings(8192, width, size, backward=True, device=H200,  # noqa: E731
                                                                   flat_ok=False)  # 16-bit 4096: flat where rows lie flat
    # past the rows plan's tile, every dtype and width (fp32 past 16384: 16400 43 -> 59%, 32768 40 -> 63% on the H100)
    widths = [(1024, 4), (4096, 4), (3072, 2), (4096, 2), (16384, 4), (16400, 4), (65536, 4), (16384, 2), (65536, 2)]
    assert [settings(n, s).variant for n, s in widths] == [
        "measured", "measured", "measured", "measured", "lean", "lean", "lean", "lean", "lean",
    ]
    forced = lambda width, size: layer_norm._layer_norm_settings(8192, width, size, backward=True,  # noqa: E731
                                                                 device=H200, variant="measured")
    assert all(forced(n, s).variant == "measured" for n, s in widths)
    assert layer_norm._layer_norm_settings(8192, 128, 4, device=H200).variant == "measured"  # forward untouched
    with pytest.raises(ValueError, match="unknown backward variant 'fast'"):
        layer_norm._layer_norm_settings(8192, 128, 4, backward=True, variant="fast")


def _comment_terms(fn) -> list[tuple[str, str]]:
    return re.findall(r"# read (.+?) elements ; write (.+?) elements", inspect.getsource(fn))


def _evaluate(expression: str, **dims: int) -> int:
    total = 0
    for term in expression.split("+"):
        coefficient, letters = re.fullmatch(r"\s*(\d*)([A-Z]+)\s*", term).groups()
        value = int(coefficient or 1)
        for letter in letters:
            value *= dims[letter]
        total += value
    return total


def test_unfused_traffic_is_the_sum_of_the_unfused_line_comments():
    m, n = 6, 10
    x = torch.empty(m, n, dtype=torch.bfloat16)
    terms = _comment_terms(layer_norm.unfused)
    assert len(terms) == 9, "one comment per op"
    traffic = layer_norm.unfused_traffic(x)
    assert traffic.read_bytes == sum(_evaluate(r, M=m, N=n) for r, _ in terms) * 2
    assert traffic.write_bytes == sum(_evaluate(w, M=m, N=n) for _, w in terms) * 2


def test_budgets_count_each_tensor_once():
    m, n = 8, 1024
    x = torch.empty(m, n, dtype=torch.bfloat16)
    weight = torch.empty(n, dtype=torch.float32)
    forward = layer_norm.budget(x, weight, weight)
    assert forward.read_bytes == m * n * 2 + 2 * n * 4  # x, weight, bias
    assert forward.write_bytes == m * n * 2 + 2 * m * 4  # y, float32 mean and rstd
    backward = layer_norm.budget(x, weight, weight, backward=True)
    assert backward.read_bytes == 2 * m * n * 2 + n * 4 + 2 * m * 4  # x, dy, weight, mean, rstd
    assert backward.write_bytes == m * n * 2 + 2 * n * 4  # dx, dweight, dbias
    assert layer_norm.budget(x).total == 2 * m * n * 2 + 2 * n * 2 + 8 * m  # weight and bias in x's dtype


@pytest.mark.gpu
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "shape, max_row",
    [
        ((3000, 1000), 128),  # 8 waiting chunks per row, many row groups
        ((64, 4099), 64),  # 65 chunks, the last one 3 wide
        ((16, 65536), None),  # default plan at the widest anchor
        ((5, 100003), None),  # default plan past it, ragged
    ],
    ids=str,
)
def test_one_pass_chunked_plan_matches_torch_and_is_deterministic(shape, max_row, dtype, variant):
    x, weight, bias = inputs(shape, dtype)
    dy = torch.randn(shape, device=DEVICE).to(dtype)
    expected = torch_reference(x, weight, bias, dy)
    first = fused_with_grads(x, weight, bias, dy, max_row=max_row, one_pass=True, bwd_variant=variant)
    for what, a, e in zip(("y", "dx", "dweight", "dbias"), first, expected):
        assert_close(a, e, dtype, what, inputs=(x, weight, dy))
    again = fused_with_grads(x, weight, bias, dy, max_row=max_row, one_pass=True, bwd_variant=variant)
    for a, b in zip(first, again):
        assert torch.equal(a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("n", [1, 255, 1024, 4096, 4097, 8192, 16384, 65536, 100003])
def test_default_plans_match_torch_across_widths(n, variant, dtype):
    shape = (max(1, 2**20 // n), n)
    x, weight, bias = inputs(shape, dtype)
    dy = torch.randn(shape, device=DEVICE).to(dtype)
    ours = fused_with_grads(x, weight, bias, dy, bwd_variant=variant)
    for what, a, e in zip(("y", "dx", "dweight", "dbias"), ours, torch_reference(x, weight, bias, dy)):
        assert_close(a, e, dtype, what, inputs=(x, weight, dy))


@pytest.mark.gpu
def test_the_two_pass_backward_matches_on_the_gpu_too():
    x, weight, bias = inputs((40, 70000), torch.float32)
    dy = torch.randn_like(x)
    ours = fused_with_grads(x, weight, bias, dy, one_pass=False)
    for what, a, e in zip(("y", "dx", "dweight", "dbias"), ours, torch_reference(x, weight, bias, dy)):
        assert_close(a, e, torch.float32, what, inputs=(x, weight, dy))


@pytest.mark.parametrize(
    "wide, expected_mode",
    [(None, "split"), ("looped", "looped")],
    ids=["split (the fp32 default)", "looped"],
)
def test_each_wide_row_forward_plan_matches_torch_on_ragged_rows(wide, expected_mode):
    x, weight, bias = inputs((5, 333), torch.float32)
    x += 100.0  # a large mean against the spread: the shifted sums must not cancel
    plan = layer_norm._layer_norm_settings(5, 333, 4, max_row=64, wide=wide)
    assert plan.mode == expected_mode
    y, mean, rstd = torch.empty_like(x), torch.empty(5, device=x.device), torch.empty(5, device=x.device)
    layer_norm._forward_launch(x, weight, bias, y, mean, rstd, 1e-5, plan)
    torch.testing.assert_close(y, F.layer_norm(x, (333,), weight, bias, 1e-5), atol=1e-4, rtol=1e-4)
    if wide is None:  # the public path plans the same
        torch.testing.assert_close(layer_norm.fused(x, weight, bias, max_row=64), y, atol=0, rtol=0)


# The split forward with one slice a row (the wide-row default, softmax's walk): under the
# interpreter 3 programs walk several rows each; slices waiting on each other run on the GPU only.
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "shape, max_row",
    [
        ((7, 333), 64),  # six steps a row, the last one 13 wide; 7 rows over 3 programs
        ((1, 70), 16),  # one row: programs without a tile
        ((4, 60), 48),  # one 64-wide step a row: held in registers for pass two (HOLD)
        ((11, 60), 48),  # held, 11 rows over 3 programs: each loads its next row before its reductions (EARLY)
    ],
    ids=str,
)
def test_the_split_forward_with_one_slice_a_row_writes_every_output_and_matches_torch(shape, max_row, dtype):
    x, weight, bias = inputs(shape, dtype)
    x += 50.0
    plan = layer_norm._layer_norm_settings(*shape, x.element_size(), max_row=max_row, wide="split")
    assert (plan.mode, plan.group) == ("split", 1)
    y = torch.full_like(x, float("nan"))
    mean = torch.full(shape[:1], float("nan"), device=DEVICE)
    rstd = torch.full_like(mean, float("nan"))
    layer_norm._forward_launch(x, weight, bias, y, mean, rstd, 1e-5, plan)
    assert not (y.isnan().any() or mean.isnan().any() or rstd.isnan().any()), "an output was left unwritten"
    expected, _, _, _ = torch_reference(x, weight, bias, torch.zeros_like(x))
    assert_close(y, expected, dtype, "y")
    x64 = x.double()
    torch.testing.assert_close(mean.double(), x64.mean(-1), atol=1e-6 * 50, rtol=1e-6)
    torch.testing.assert_close(rstd.double(), 1 / (x64.var(-1, unbiased=False) + 1e-5).sqrt(), atol=0, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1000, 4097, 8192, 12345, 16383,  # rows, stream, rows, stream, stream
                               8320, 9216, 11008, 12288, 16384])  # the rows plan on a 16384 block
def test_fp32_rows_with_a_massive_activation_in_column_0_keep_fp32_accuracy_on_every_plan(n):
    # x[row, 0] is every plan's shift: the shifted one-pass sums alone lose ~N float32 ulps of the variance
    # (docs/kernels.md, "Statistics"); fp32 rows past 16384 in slices still do
    gen = torch.Generator().manual_seed(n)
    x = torch.randn((512, n), generator=gen).to(DEVICE)
    x[:, 0] = 3000.0
    weight, bias = (torch.randn(n, generator=gen).to(DEVICE) for _ in range(2))
    y, _, _ = layer_norm.forward(x, weight, bias)
    expected = torch_reference(x, weight, bias, torch.zeros_like(x))[0]
    error = ((y.double() - expected).abs().max() / expected.abs().max()).item()
    assert error <= TOLERANCES[torch.float32], error  # one-pass sums: ~1e-4 (test_a_held_fp32_row_whose_shift_...)


def test_wide_forward_gives_nan_rows_as_torch_does():
    x, weight, bias = inputs((4, 40), torch.float32)
    x[0, 0] = float("nan")  # the shift itself
    x[1, 30] = float("nan")
    x[2, 5] = float("inf")
    y = layer_norm.fused(x, weight, bias, max_row=8)
    assert layer_norm._layer_norm_settings(4, 40, 4, max_row=8).mode == "split"
    expected = F.layer_norm(x, (40,), weight, bias, 1e-5)
    torch.testing.assert_close(y, expected, equal_nan=True, atol=1e-4, rtol=1e-4)
    assert y[:3].isnan().all() and not y[3].isnan().any()


def test_settings_pick_the_measured_wide_forward_plans(monkeypatch):
    monkeypatch.setattr(layer_norm, "interpreting", lambda: False)
    P = layer_norm._Plan
    settings = layer_norm._layer_norm_settings
    # fp32: split, each slice one step held in registers, 32 elements a thread
    assert settings(2048, 65536, 4) == P("split", 1, 4096, 4, group=16, per_sm=4)  # 16 KiB slices
    assert settings(512, 262144, 4) == P("split", 1, 16384, 16, group=16, per_sm=1)  # 64 KiB: 16 a row at most
    assert settings(100, 20000, 4) == P("split", 1, 4096, 4, group=5, per_sm=4)  # the last slice ragged
    assert settings(4, 1 << 22, 4) == P("split", 1, 4096, 8, group=16, per_sm=3)  # slices too big to hold
    assert settings(2048, 65536, 2) == P("looped", 1, 4096, 16)  # 16-bit rows: one program a row
    assert settings(2048, 65536, 2, wide="split") == P("split", 1, 8192, 8, group=8, per_sm=3)
    # up to MAX_ROW: whole rows, a row a program, 32 elements a thread on 4 to 16 warps
    assert settings(2048, 16384, 4) == P("rows", 1, 16384, 16)
    assert [settings(2048, n, 4) for n in (8208, 9216, 11520)] == [P("rows", 1, 16384, 16)] * 3
    assert settings(2048, 8192, 4) == P("rows", 1, 8192, 8)
    assert settings(2048, 16384, 2) == P("rows", 1, 16384, 16)
    assert settings(2048, 16384, 4, max_row=16384).mode == "rows"  # tests' max_row keeps the rows plan
    monkeypatch.setattr(layer_norm, "interpreting", lambda: True)
    assert settings(2048, 65536, 4).group == 1  # nothing to wait for under the interpreter
    with pytest.raises(ValueError, match="interpreter"):
        settings(2048, 65536, 4, wide="split")
    with pytest.raises(ValueError, match="unknown wide-row plan 'two_pass'"):
        settings(2048, 65536, 4, wide="two_pass")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "shape, block_n, group",
    [
        ((3000, 1000), 128, 4),  # 8 steps a row in 4 slices, thousands of waiting rows
        ((64, 4099), 64, 3),  # 65 steps: slices of 22, 22 and 21, the last step 3 wide
        ((40, 9000), 1024, 9),  # one step a slice (held in registers), the last step 808 wide
        ((2048, 65536), None, None),  # the default at the widest anchor
        ((3, 262144 + 5), None, None),  # past it, ragged
    ],
    ids=str,
)
def test_split_forward_waiting_on_its_peers_matches_torch_every_time(shape, block_n, group, dtype):
    x, weight, bias = inputs(shape, dtype)
    x[1, 7] = float("nan")
    if block_n is None:
        plan = layer_norm._layer_norm_settings(*shape, x.element_size(), wide="split")
    else:
        plan = layer_norm._layer_norm_settings(*shape, x.element_size(), max_row=block_n, wide="split")._replace(group=group)
    assert plan.mode == "split" and plan.group > 1
    expected = F.layer_norm(x.double(), (shape[1],), weight.double(), bias.double(), 1e-5)
    for _ in range(3):  # a missing wait or fence shows up as a result that changes
        y = torch.full_like(x, float("nan"))
        mean = torch.full(shape[:1], float("nan"), device=DEVICE)
        rstd = torch.full_like(mean, float("nan"))
        layer_norm._forward_launch(x, weight, bias, y, mean, rstd, 1e-5, plan)
        assert y[1].isnan().all() and not y[0].isnan().any() and not y[2:].isnan().any()
        keep = torch.ones(shape[0], dtype=torch.bool, device=DEVICE)
        keep[1] = False
        assert_close(y[keep], expected[keep], dtype, "y")
        x64 = x[keep].double()
        torch.testing.assert_close(mean[keep].double(), x64.mean(-1), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(rstd[keep].double(), 1 / (x64.var(-1, unbiased=False) + 1e-5).sqrt(), atol=0, rtol=1e-4)


# Rows that do not start 16-byte aligned (reference_kernels/_ragged.py, docs/kernels.md "Ragged
# rows"): every row at its own phase, rows of a wider tensor, outputs at odd offsets. Outputs are
# poisoned with nan, so an edge element or vector left unwritten fails, and compared with float64.
RAGGED = [
    (40, 13),  # bf16: 8 a vector, every phase 0..7 among the rows; rows shorter than two vectors
    (9, 3),  # rows inside one vector, some straddling two
    (7, 50),  # a body of whole vectors between the edges
    (3, 2051),  # one row a program, 2051 + 7 virtual columns: a 4096 block
]
# Rows plans only (the split walk's 8-wide steps take minutes under the interpreter at these widths)
RAGGED_PIECES = [
    (9, 2049),  # two pieces (2048 + a vector, _row_pieces) at every phase
    (9, 7001),  # three pieces (4096 + 2048 + 1024) at every phase
]


def _poisoned(shape, dtype):
    return torch.full(shape, float("nan"), dtype=dtype, device=DEVICE)


def _check_forward(x, weight, bias, y, mean, rstd, dtype):
    assert not (y.isnan().any() or mean.isnan().any() or rstd.isnan().any()), "an output element was left unwritten"
    assert_close(y, torch_reference(x, weight, bias, torch.zeros_like(x))[0], dtype, "y")
    x64 = x.double()
    torch.testing.assert_close(mean.double(), x64.mean(-1), atol=1e-5 * x64.abs().max().item(), rtol=1e-5)
    torch.testing.assert_close(rstd.double(), 1 / (x64.var(-1, unbiased=False) + 1e-5).sqrt(), atol=0, rtol=1e-4)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape, plan", [(shape, plan) for shape in RAGGED
                                         for plan in ("rows", "rows, scalar", "split walk, held", "split walk, steps")]
                         + [(shape, plan) for shape in RAGGED_PIECES for plan in ("rows", "rows, scalar")], ids=str)
def test_forward_rows_at_every_phase_match_torch_and_write_every_element(shape, plan, dtype, monkeypatch):
    x, weight, bias = inputs(shape, dtype)
    if plan == "rows":  # aligned vectors at every width (normally from PHASED_ROWS_MIN_COLS)
        monkeypatch.setattr(layer_norm, "PHASED_ROWS_MIN_COLS", 1)
        monkeypatch.setattr(layer_norm, "_PHASED_MIN_ELEM_SIZE", 1)  # 16-bit rows too
        chosen = layer_norm._layer_norm_settings(*shape, x.element_size())
        assert chosen.mode == "rows" and chosen.block_n >= shape[1] + 16 // x.element_size() - 1
    elif plan == "rows, scalar":
        monkeypatch.setattr(layer_norm, "PHASED_ROWS_MIN_COLS", 1 << 30)
        chosen = layer_norm._layer_norm_settings(*shape, x.element_size())
    else:  # one step a row held (HOLD, EARLY), or 8-wide steps walked twice
        chosen = layer_norm._layer_norm_settings(*shape, x.element_size(), max_row=8, wide="split")
        if plan == "split walk, held":
            chosen = chosen._replace(block_n=triton.next_power_of_2(shape[1] + 7))
    y, mean, rstd = _poisoned(shape, dtype), _poisoned(shape[:1], torch.float32), _poisoned(shape[:1], torch.float32)
    layer_norm._forward_launch(x, weight, bias, y, mean, rstd, 1e-5, chosen)
    _check_forward(x, weight, bias, y, mean, rstd, dtype)


@pytest.mark.parametrize("threshold", [1, 1 << 30], ids=["aligned vectors", "scalar"])
@pytest.mark.parametrize("offset, width", [(3, 40), (4, 41), (0, 37), (1, 44)],
                         ids=["odd phase", "same phase, wider stride", "wider stride", "aligned width, odd phase"])
def test_forward_on_rows_of_a_wider_tensor_reads_in_place_or_from_a_copy_and_matches(offset, width, threshold,
                                                                                     monkeypatch):
    monkeypatch.setattr(layer_norm, "PHASED_ROWS_MIN_COLS", threshold)
    monkeypatch.setattr(layer_norm, "_PHASED_MIN_ELEM_SIZE", 1)
    big, _, _ = inputs((7, 48), torch.float32)
    _, weight, bias = inputs((1, width), torch.float32)
    x = big[:, offset:offset + width]
    before = big.clone()
    out = _poisoned(x.shape, torch.float32)
    y, mean, rstd = layer_norm.forward(x, weight, bias, out=out)
    assert y is out and torch.equal(big, before), "the input was written"
    _check_forward(x, weight, bias, y, mean, rstd, torch.float32)
    y, *_ = layer_norm.forward(x, weight, bias, max_row=8, )  # the split walk on the same rows
    assert_close(y, torch_reference(x, weight, bias, torch.zeros_like(x))[0], torch.float32, "y")


@pytest.mark.parametrize("max_row", [None, 8], ids=["rows", "split walk"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
def test_forward_into_an_out_at_an_odd_offset_writes_every_element_and_nothing_before(dtype, max_row, monkeypatch):
    monkeypatch.setattr(layer_norm, "PHASED_ROWS_MIN_COLS", 1)
    monkeypatch.setattr(layer_norm, "_PHASED_MIN_ELEM_SIZE", 1)  # 16-bit rows too
    x, weight, bias = inputs((5, 21), dtype)
    buf = _poisoned((5 * 21 + 3,), dtype)
    out = buf[3:].view(5, 21)
    y, mean, rstd = layer_norm.forward(x, weight, bias, out=out, max_row=max_row)
    assert buf[:3].isnan().all(), "written before out"
    _check_forward(x, weight, bias, y, mean, rstd, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
# 64: aligned rows forced onto the phased kernel (VEC 1); 80: aligned, in two pieces (64 + 16)
@pytest.mark.parametrize("shape", RAGGED + [(6, 64), (5, 80)], ids=str)
def test_the_phased_backward_matches_torch_at_every_phase_and_writes_every_element(shape, dtype, unwritten_reads_nan):
    x, weight, bias = inputs(shape, dtype)
    dy = torch.randn(shape, device=DEVICE).to(dtype)
    _, mean, rstd = layer_norm.forward(x, weight, bias)
    variant = None if layer_norm._phased_backward(shape[1], x.element_size()) else "phased"
    plan = layer_norm._layer_norm_settings(*shape, x.element_size(), backward=True, device=on(3), variant=variant)
    assert plan.variant == "phased" and (plan.n_groups % (16 // x.element_size()) == 0 or shape[1] % 16 == 0)
    dx, dw, db = layer_norm.backward(dy, x, weight, mean, rstd, variant=variant)
    _, *expected = torch_reference(x, weight, bias, dy)
    for what, a, e in zip(("dx", "dweight", "dbias"), (dx, dw, db), expected):
        assert not a.isnan().any(), f"{what} left unwritten"
        assert_close(a, e, dtype, what, inputs=(x, weight, dy))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [768, 1040, 1280, 2048, 2049, 3328, 3584, 4097, 4112, 4608, 5120, 6144, 6656, 7001, 7168, 8191,
                               8192])
def test_the_pipelined_phased_backward_matches_torch_and_is_deterministic_at_model_widths(n, dtype):
    shape = (2**21 // n, n)
    x, weight, bias = inputs(shape, dtype)
    dy = torch.randn(shape, device=DEVICE).to(dtype)
    _, mean, rstd = layer_norm.forward(x, weight, bias)
    plan = layer_norm._layer_norm_settings(*shape, x.element_size(), backward=True, device=H200, variant="phased")
    assert plan.stages > 1
    first = layer_norm.backward(dy, x, weight, mean, rstd, variant="phased")
    _, *expected = torch_reference(x, weight, bias, dy)
    for what, a, e in zip(("dx", "dweight", "dbias"), first, expected):
        assert_close(a, e, dtype, what, inputs=(x, weight, dy))
    for a, b in zip(first, layer_norm.backward(dy, x, weight, mean, rstd, variant="phased")):
        assert torch.equal(a, b)


def test_two_pieces_that_give_every_thread_lanes_of_both_take_one_block_reduction():
    # docs/kernels.md, "layer_norm: backward": 5120 = 4096 + 1024 on 512 threads, 1280 = 1024 + 256 on 128; a second
    # piece narrower than the threads (4112 = 4096 + 16) keeps a reduction of its own, and so do pieces of more than a
    # 16-byte vector a thread (2048 + 512 on 128 threads) and fp32 pieces (1280 = 1024 + 256 on 256 threads lost 89 -> 83%)
    merge = layer_norm._merge_pieces
    assert [merge(4096, 1024, 16, 2), merge(4096, 2048, 16, 2), merge(1024, 256, 4, 2), merge(4096, 16, 16, 2),
            merge(64, 16, 4, 2), merge(8192, 0, 32, 2), merge(2048, 512, 4, 2), merge(1024, 256, 8, 4),
            merge(4096, 2048, 16, 2, 1024), merge(4096, 2048, 16, 2, 256)] == [512, 512, 128, 0, 0, 0, 0, 0, 512, 0]


def test_a_16_bit_row_read_as_words_takes_its_tail_in_them_and_a_third_piece_a_row_ahead():
    # a tail in words: a 16-bit row read as words whose one piece stops short of the launch's width
    tail = layer_norm._tail_in_words
    assert [tail(1024, 0, 1025, 8), tail(1024, 8, 1025, 8), tail(2048, 0, 1025, 8), tail(1024, 0, 1024, 1),
            tail(32, 0, 27, 8)] == [True, False, False, False, True]
    assert layer_norm._layer_norm_settings(8192, 1025, 2, backward=True, device=H200).max_regs == 96  # the plan agrees
    # a row ahead: a 16-bit third piece of under two lanes a thread only (6656's 512 on 512 threads, not 7168's 1024)
    ahead = layer_norm._phased_ahead
    assert [ahead(512, 16, 2), ahead(1024, 16, 2), ahead(0, 16, 2), ahead(512, 16, 4)] == [True, False, False, False]


@pytest.mark.parametrize("shape, pieces", [((11, 80), (64, 16)), ((37, 27), (32, 0))], ids=["64 + 16", "32 and words"])
def test_the_phased_backward_in_two_pieces_or_with_a_tail_in_words_matches_torch(shape, pieces):
    x, weight, bias = inputs(shape, torch.bfloat16)
    x[3] += 50.0
    dy = torch.randn(shape, device=DEVICE).bfloat16()
    _, mean, rstd = layer_norm.forward(x, weight, bias)
    plan = layer_norm._Plan("rows", 1, pieces[0], 4, 8, "phased", stages=3, block_t=pieces[1])
    dx, dw, db = (torch.full_like(t, float("nan")) for t in (x, weight, bias))
    layer_norm._backward_launch(dy, x, weight, mean, rstd, dx, dw, db, plan)
    _, *expected = torch_reference(x, weight, bias, dy)
    for what, a, e in zip(("dx", "dweight", "dbias"), (dx, dw, db), expected):
        assert_close(a, e, torch.bfloat16, what, inputs=(x, weight, dy))


@pytest.mark.parametrize("merge", [True, False], ids=["one reduction", "one a piece"])
def test_the_backward_in_two_merged_pieces_matches_torch(merge, monkeypatch):
    rule = layer_norm._merge_pieces  # both kernel paths at this width: the rule's, and a reduction a piece
    monkeypatch.setattr(layer_norm, "_merge_pieces", lambda *a: rule(*a) if merge else 0)
    shape = (11, 1280)
    x, weight, bias = inputs(shape, torch.bfloat16)
    x[3] += 50.0
    dy = torch.randn(shape, device=DEVICE).bfloat16()
    _, mean, rstd = layer_norm.forward(x, weight, bias)
    plan = layer_norm._layer_norm_settings(*shape, 2, backward=True, device=on(2), variant="phased")
    assert (plan.block_n, plan.block_t, plan.num_warps) == (1024, 256, 4)
    dx, dw, db = (torch.full_like(t, float("nan")) for t in (x, weight, bias))
    layer_norm._backward_launch(dy, x, weight, mean, rstd, dx, dw, db, plan)
    _, *expected = torch_reference(x, weight, bias, dy)
    for what, a, e in zip(("dx", "dweight", "dbias"), (dx, dw, db), expected):
        assert_close(a, e, torch.bfloat16, what, inputs=(x, weight, dy))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("n, pieces", [(80, (64, 16)), (96, (64, 32)), (4352, (4096, 256))], ids=["64 + 16", "64 + 32", "4096 + 256"])
def test_aligned_16_bit_backward_rows_in_two_pieces_match_torch(n, pieces, dtype, monkeypatch):
    # the band moved down to widths the interpreter runs: the pieces' sums, shares and dx against torch
    tune(monkeypatch, phased_bwd_aligned_pieces_16bit=((16, 8192),))
    shape = (11, n)
    x, weight, bias = inputs(shape, dtype)
    x[3] += 50.0  # a row far from zero: x-hat from the forward's mean, not from x
    dy = torch.randn(shape, device=DEVICE).to(dtype)
    _, mean, rstd = layer_norm.forward(x, weight, bias)
    plan = layer_norm._layer_norm_settings(*shape, x.element_size(), backward=True, device=on(2), variant="phased")
    assert (plan.block_n, plan.block_t) == pieces
    dx, dw, db = (torch.full_like(t, float("nan")) for t in (x, weight, bias))
    layer_norm._backward_launch(dy, x, weight, mean, rstd, dx, dw, db, plan)
    _, *expected = torch_reference(x, weight, bias, dy)
    for what, a, e in zip(("dx", "dweight", "dbias"), (dx, dw, db), expected):
        assert not a.isnan().any(), f"{what} left unwritten"
        assert_close(a, e, dtype, what, inputs=(x, weight, dy))


def test_only_aligned_rows_in_pieces_take_their_first_piece_without_masks():
    full = layer_norm._full_first
    # (block_n, block_t, n_cols, vec, prefetch, ahead): pieces of an aligned row; one piece; rows at several phases;
    # prefetch; a third piece a row ahead (6656 lost 80 -> 76%)
    assert [full(64, 16, 80, 1, False, False), full(4096, 2048, 7168, 1, False, False), full(64, 0, 64, 1, False, False),
            full(64, 16, 80, 8, False, False), full(64, 16, 80, 1, True, False),
            full(4096, 2048, 6656, 1, False, True)] == [True, True, False, False, False, False]


@pytest.mark.parametrize("full", [True, False], ids=["first piece unmasked", "masked"])
@pytest.mark.parametrize("dtype, n, pieces", [(torch.float32, 80, (64, 16, 0)), (torch.bfloat16, 80, (64, 16, 0)),
                                              (torch.bfloat16, 1664, (1024, 512, 512))],
                         ids=["fp32 64 + 16", "bf16 64 + 16", "bf16 1024 + 512 + 512"])
def test_the_backward_with_an_unmasked_first_piece_matches_torch(dtype, n, pieces, full, monkeypatch):
    taken = []
    rule = layer_norm._full_first  # both kernel paths at these widths: the rule's (unmasked), and masked
    monkeypatch.setattr(layer_norm, "_full_first", lambda *a: taken.append(rule(*a) and full) or taken[-1])
    x, weight, bias = inputs((11, n), dtype)
    x[3] += 50.0
    dy = torch.randn(x.shape, device=DEVICE).to(dtype)
    _, mean, rstd = layer_norm.forward(x, weight, bias)
    _, *expected = torch_reference(x, weight, bias, dy)
    for groups in (4, 16):  # rows left over for some programs; more programs than rows
        plan = layer_norm._Plan("rows", 1, pieces[0], 4, groups, "phased", stages=3, block_t=pieces[1], block_u=pieces[2])
        dx, dw, db = (torch.full_like(t, float("nan")) for t in (x, weight, bias))
        layer_norm._backward_launch(dy, x, weight, mean, rstd, dx, dw, db, plan)
        for what, a, e in zip(("dx", "dweight", "dbias"), (dx, dw, db), expected):
            assert not a.isnan().any(), f"{what} left unwritten"
            assert_close(a, e, dtype, what, inputs=(x, weight, dy))
    assert taken == [full, full]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("n, pieces", [(1408, (1024, 256, 128)), (1664, (1024, 512, 128))], ids=["1024 + 256 + 128",
                                                                                               "1024 + 512 + 128"])
@pytest.mark.parametrize("ahead", [True, False], ids=["third piece a row ahead", "third piece in step"])
def test_aligned_16_bit_backward_rows_in_three_merged_pieces_match_torch(n, pieces, dtype, ahead, monkeypatch):
    # the three-piece band moved down to widths the interpreter runs (4 warps: 128 threads divide every piece; the
    # third piece's one lane a thread goes a row ahead, AHEAD)
    tune(monkeypatch, phased_bwd_aligned_three_pieces_16bit=((1281, 2047),))
    rule = layer_norm._phased_ahead  # both kernel paths at these widths: the rule's (a row ahead), and in step
    monkeypatch.setattr(layer_norm, "_phased_ahead", lambda *a: rule(*a) and ahead)
    assert layer_norm._phased_ahead(pieces[2], 4, 2) == ahead
    shape = (11, n)
    x, weight, bias = inputs(shape, dtype)
    x[3] += 50.0
    dy = torch.randn(shape, device=DEVICE).to(dtype)
    _, mean, rstd = layer_norm.forward(x, weight, bias)
    plan = layer_norm._layer_norm_settings(*shape, x.element_size(), backward=True, device=on(2), variant="phased")
    assert (plan.block_n, plan.block_t, plan.block_u, plan.num_warps) == (*pieces, 4)
    assert layer_norm._merge_pieces(*pieces[:2], 4, x.element_size(), pieces[2]) == 128
    _, *expected = torch_reference(x, weight, bias, dy)
    for groups in (plan.n_groups, 3, 16):  # rows left over for some programs; more programs than rows
        dx, dw, db = (torch.full_like(t, float("nan")) for t in (x, weight, bias))
        layer_norm._backward_launch(dy, x, weight, mean, rstd, dx, dw, db, plan._replace(n_groups=groups))
        for what, a, e in zip(("dx", "dweight", "dbias"), (dx, dw, db), expected):
            assert not a.isnan().any(), f"{what} left unwritten"
            assert_close(a, e, dtype, what, inputs=(x, weight, dy))


@pytest.mark.parametrize("prefetch, stages, pieces", [(False, 1, (64, 0)), (True, 1, (64, 0)), (False, 3, (64, 0)), (False, 3, (32, 8)),
                                                     (False, 3, (32, 0))],
                         ids=["loads in step", "next row prefetched", "pipelined through shared memory", "in two pieces",
                              "the last vector in words"])
@pytest.mark.parametrize("n_groups", [8, 16, 64], ids=["every row of a phase in one program", "two", "more programs than rows"])
def test_the_phased_backward_walks_its_rows_with_any_multiple_of_vec_programs(n_groups, prefetch, stages, pieces):
    x, weight, bias = inputs((37, 27), torch.bfloat16)  # 27 + 7 virtual columns: 32 + 8 in pieces
    dy = torch.randn(x.shape, device=DEVICE).bfloat16()
    _, mean, rstd = layer_norm.forward(x, weight, bias)
    plan = layer_norm._Plan("rows", 1, pieces[0], 4, n_groups, "phased", prefetch=prefetch, stages=stages, block_t=pieces[1])
    dx, dw, db = (torch.full_like(t, float("nan")) for t in (x, weight, bias))
    layer_norm._backward_launch(dy, x, weight, mean, rstd, dx, dw, db, plan)
    _, *expected = torch_reference(x, weight, bias, dy)
    for what, a, e in zip(("dx", "dweight", "dbias"), (dx, dw, db), expected):
        assert_close(a, e, torch.bfloat16, what, inputs=(x, weight, dy))
    # a count that is not a multiple of VEC is rounded down to one (12 -> 8; 3 -> 8, the least)
    for odd in (12, 3):
        dx2, dw2, db2 = (torch.full_like(t, float("nan")) for t in (x, weight, bias))
        layer_norm._backward_launch(dy, x, weight, mean, rstd, dx2, dw2, db2, plan._replace(n_groups=odd))
        for what, a, e in zip(("dx", "dweight", "dbias"), (dx2, dw2, db2), expected):
            assert_close(a, e, torch.bfloat16, what, inputs=(x, weight, dy))


@pytest.mark.parametrize("x_offset, dy_offset", [(1, 1), (1, 0), (0, 2)], ids=["same phase", "x unaligned", "dy unaligned"])
def test_the_phased_backward_on_slices_at_different_phases_matches_torch(x_offset, dy_offset, monkeypatch):
    tune(monkeypatch, phased_bwd_min_cols={2: 1, 4: 1})
    assert layer_norm._layer_norm_settings(9, 50, 4, backward=True).variant == "phased"
    big_x, weight, bias = inputs((9, 60), torch.float32)
    big_dy = torch.randn(9, 60, device=DEVICE)
    x, dy = big_x[:, x_offset:x_offset + 50], big_dy[:, dy_offset:dy_offset + 50]
    weight, bias = weight[:50], bias[:50]
    before = (big_x.clone(), big_dy.clone())
    ours = fused_with_grads(x, weight, bias, dy)
    assert torch.equal(big_x, before[0]) and torch.equal(big_dy, before[1]), "an input was written"
    for what, a, e in zip(("y", "dx", "dweight", "dbias"), ours, torch_reference(x, weight, bias, dy)):
        assert_close(a, e, torch.float32, what, inputs=(x, weight, dy))


def test_a_gradient_in_another_dtype_than_x_takes_the_plain_backward():
    x, weight, bias = inputs((6, 50), torch.bfloat16)
    dy = torch.randn(6, 50, device=DEVICE)  # float32 against bf16 x: no common phase in elements
    _, mean, rstd = layer_norm.forward(x, weight, bias)
    assert layer_norm._layer_norm_settings(6, 50, 2, backward=True, phased_ok=False).variant != "phased"
    dx, dw, db = layer_norm.backward(dy, x, weight, mean, rstd)
    _, *expected = torch_reference(x, weight, bias, dy)
    for what, a, e in zip(("dx", "dweight", "dbias"), (dx, dw, db), expected):
        assert_close(a, e, torch.bfloat16, what, inputs=(x, weight, dy))


def test_phased_rows_reads_in_place_where_every_phase_agrees_and_copies_where_not():
    from reference_kernels._ragged import phased_rows

    a, b = torch.randn(4, 64, device=DEVICE), torch.randn(4, 64, device=DEVICE)
    r = phased_rows((a, b), (torch.empty_like(a),))
    assert (r.vec, r.phase, r.write_outs) == (1, 0, (None,)) and r.reads[0] is a  # Triton's own specialisation
    big = torch.randn(2, 4, 60, device=DEVICE)
    a, b = big[0, :, 1:51], big[1, :, 1:51]  # both at phase 1, stride 60 = 50 + 10 against an output of stride 50
    r = phased_rows((a, b), (torch.empty(4, 50, device=DEVICE),))
    assert r.phase == 0 and r.read_strides == (50, 50) and r.write_outs == (None,)  # inputs copied
    a, b = big[0, :, 4:56], big[1, :, 4:56]  # phase 0, stride 60 = 52 + 8: in place
    r = phased_rows((a, b), (torch.empty(4, 52, device=DEVICE),))
    assert (r.vec, r.phase, r.read_strides) == (4, 0, (60, 60)) and r.reads[1].data_ptr() == b.data_ptr()
    buf = torch.full((4 * 50 + 1,), float("nan"), device=DEVICE)
    out = buf[1:].view(4, 50)
    a = torch.randn(4, 50, device=DEVICE)
    r = phased_rows((a,), (out,))  # an output at phase 1: written to a fresh tensor, copied by finish()
    assert r.write_outs[0] is out and r.write_rows[0] is not out and r.reads[0].data_ptr() == a.data_ptr()
    r.write_rows[0].copy_(a)
    r.finish()
    assert torch.equal(out, a)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(3, 4112), (2, 2064), (2, 8704)], ids=str)
def test_aligned_forward_rows_in_pieces_write_every_element_and_match_torch(shape, dtype):
    assert layer_norm._row_pieces(shape[1], 1)[1] > 0  # more than one piece
    x, weight, bias = inputs(shape, dtype)
    y, mean, rstd = _poisoned(shape, dtype), _poisoned(shape[:1], torch.float32), _poisoned(shape[:1], torch.float32)
    layer_norm._forward_launch(x, weight, bias, y, mean, rstd, 1e-5, layer_norm._layer_norm_settings(*shape, x.element_size()))
    _check_forward(x, weight, bias, y, mean, rstd, dtype)


def test_aligned_forward_rows_take_their_power_of_two_whole_but_a_16_bit_sliver():
    # just above a power of two of at most 4096: whole (1040: 66 -> 75% of copy bf16), unless 16-bit and the pieces
    # past the first hold at most 1/128 of it (1028 = 1024 + 8 lanes, 2064 = 2048 + 16: pieces measured faster)
    assert layer_norm._row_pieces(1040, 1) == (2048, 0, 0)
    assert layer_norm._row_pieces(1100, 4, packed=True) == (2048, 0, 0)
    assert layer_norm._row_pieces(2080, 1) == (4096, 0, 0)
    assert layer_norm._row_pieces(1028, 4, packed=True) == (1024, 8, 0)
    assert layer_norm._row_pieces(2064, 1) == (2048, 16, 0)
    assert layer_norm._row_pieces(1028, 4, packed=True, elem_size=4) == (2048, 0, 0)  # fp32: whole (94 -> 97%)
    assert layer_norm._row_pieces(2064, 1, elem_size=4) == (4096, 0, 0)
    assert layer_norm._row_pieces(4112, 1) == (4096, 16, 0)  # wider powers of two keep the waste rule
    # fp32: whole up to 8192 lanes (4224-4480 71-88 -> 90-91%; 4112, 4160 92 -> 94% on the H100 against a sliver)
    assert [layer_norm._row_pieces(n, 1, elem_size=4) for n in (4112, 4160, 4224, 4352, 4480)] == [(8192, 0, 0)] * 5
    assert layer_norm._row_pieces(4224, 1) == (4096, 128, 0)  # 16-bit: the waste rule
    assert layer_norm._row_pieces(1100, 4) == (1024, 128, 0)  # unaligned, not packed: pieces cover every phase


def test_forward_rows_pieces_cover_every_phase():
    assert layer_norm._row_pieces(4097, 4) == (4096, 4, 0)  # 4097 + 3 virtual columns
    assert layer_norm._row_pieces(4097, 8) == (4096, 8, 0)
    assert layer_norm._row_pieces(4089, 8) == (4096, 0, 0)  # 4089 + 7 fits the power of two
    assert layer_norm._row_pieces(12345, 8) == (8192, 4096, 64)
    assert layer_norm._row_pieces(5120, 1) == (8192, 0, 0)  # aligned: only just above a power of two
    assert layer_norm._row_pieces(12800, 1) == (16384, 0, 0)
    assert layer_norm._row_pieces(4112, 1) == (4096, 16, 0)
    assert layer_norm._row_pieces(8704, 1) == (8192, 512, 0)
    assert layer_norm._row_pieces(7000, 1) == (4096, 2048, 1024)  # Triton's scalar path: ragged
    assert layer_norm._row_pieces(255, 1) == (256, 0, 0)  # narrow rows: one piece
    for n in range(1, 20000, 89):
        for vec in (1, 4, 8):
            assert sum(layer_norm._row_pieces(n, vec)) >= n + vec - 1, (n, vec)


def test_the_backward_takes_the_pipelined_phased_plan_where_it_measured_faster(monkeypatch):
    # The H200 sweep (docs/kernels.md, "layer_norm: backward"): whole rows walked by persistent
    # programs with the next rows in flight through shared memory won for unaligned rows from 1025
    # columns, aligned rows from 4097 (fp32 4608-8192: 51-61% -> 80%+), 16-bit aligned rows of
    # 768-2048 and fp32 ones of 1025-4095; it lost at 16-bit 3072, and rows past 8192 columns do not
    # fit its registers (8191 does, as 8192 + a tail of 8: 35% -> 45% in bf16). Rows that lie flat take the flat
    # plan where it measured faster (test_the_backward_lays_rows_flat_where_its_tile_uses_more_lanes); these are
    # the plans of rows that do not.
    settings = functools.partial(layer_norm._layer_norm_settings, flat_ok=False)
    P = layer_norm._Plan
    cases = [(2049, 4), (4097, 4), (8189, 4), (1025, 4), (1025, 2), (4097, 2), (7001, 2), (4608, 2), (8192, 4), (768, 2),
             (2048, 2), (1280, 4), (3072, 4), (1023, 4), (8704, 2), (1024, 4), (4096, 4), (3072, 2), (512, 2), (999, 2)]
    bwd = [settings(8192, n, s, backward=True, device=H200) for n, s in cases]
    assert [p.variant for p in bwd] == ["phased"] * 13 + ["measured", "lean", "measured", "measured", "measured",
                                                          "measured", "measured"]
    assert (settings(8192, 8191, 2, backward=True).block_n, settings(8192, 8191, 2, backward=True).block_t) == (8192, 8)
    with pytest.raises(ValueError, match="holds whole rows up to 8192 columns"):
        settings(8192, 10000, 2, backward=True, variant="phased")  # 8192 + 2048: a tail past 1024
    # unaligned rows (and fp32 ones under 4096) in two pieces where their power of two masks 12.5% of the
    # lanes: 4097 + 3 on 4096 + 4 lanes, one 32-warp program an SM, two rows in flight
    assert bwd[1] == P("rows", 1, 4096, 32, SMS, "phased", 64, stages=3, block_t=4)
    assert (bwd[11].block_n, bwd[11].block_t) == (1024, 256)  # fp32 1280
    # 16-bit aligned rows of 1025-1280 and 4097-6144 in two pieces on the first one's warps:
    # 4608 = 4096 + 512 at 64 registers (two programs an SM); 5136-6144 = 4096 + 2048 at 128 (one an SM)
    assert bwd[7] == P("rows", 1, 4096, 16, 264, "phased", 64, stages=3, block_t=512)
    assert settings(8192, 6144, 2, backward=True, device=H200) == P("rows", 1, 4096, 16, SMS, "phased", 128, stages=3,
                                                                     block_t=2048)
    assert settings(8192, 4112, 2, backward=True).block_t == 16  # 4096 + 16
    assert settings(8192, 1280, 2, backward=True, device=H200) == P("rows", 1, 1024, 4, SMS * 8, "phased", 64, stages=3,
                                                                     block_t=256)  # 1024 + 256 on 4 warps
    assert settings(8192, 1536, 2, backward=True).block_t == 0  # 1024 + 512 lost: one 2048-lane tile
    # past 6144: three pieces where the third merges on the first's 512 threads (6656 = 4096 + 2048 + 512, 7168 = ..
    # + 1024: one 16-warp program an SM at 128 registers), else the 8192-lane tile (6160 and 6400: a third piece of 16
    # or 256 lanes; 7680: 4096 + 2048 + 2048 is no narrower)
    three = {n: settings(8192, n, 2, backward=True, device=H200) for n in (6656, 7168, 6160, 6400, 7680)}
    assert {n: (p.block_n, p.block_t, p.block_u, p.num_warps, p.max_regs) for n, p in three.items()} == {
        6656: (4096, 2048, 512, 16, 128), 7168: (4096, 2048, 1024, 16, 128), 6160: (8192, 0, 0, 32, 64),
        6400: (8192, 0, 0, 32, 64), 7680: (8192, 0, 0, 32, 64)}
    assert three[7168].n_groups == SMS and settings(8192, 7168, 4, backward=True).block_u == 0  # fp32: one tile
    # and 3073-3584 on the first piece's 256 threads (3328 = 2048 + 1024 + 256, 3584 .. + 512: two 8-warp programs an SM
    # at 128 registers), phased though past the aligned band; 3200's 128 lanes do not merge (the rows plan), nor do
    # 1281-2047's three pieces go (1664 79 -> 55%)
    three = {n: settings(8192, n, 2, backward=True, device=H200) for n in (3328, 3584, 3200, 1664)}
    assert {n: (p.variant, p.block_n, p.block_t, p.block_u, p.num_warps, p.max_regs) for n, p in three.items()} == {
        3328: ("phased", 2048, 1024, 256, 8, 128), 3584: ("phased", 2048, 1024, 512, 8, 128),
        3200: ("measured", 4096, 0, 0, 8, None), 1664: ("phased", 2048, 0, 0, 8, 64)}
    assert three[3584].n_groups == 264
    with monkeypatch.context() as patch:  # three pieces only merged
        patch.setattr(layer_norm, "_merge_pieces", lambda *a: 0)
        assert settings(8192, 7168, 2, backward=True).block_u == 0
    assert (settings(8192, 4608, 4, backward=True).block_n, settings(8192, 4608, 4, backward=True).block_t) == (8192, 0)
    # 16-bit unaligned rows: whole with the edges read as words, the widest phase's last vector among them up to
    # 4096 lanes (4097 = 4096 + a vector); wider, a one-vector tail piece (8191 = 8192 + 8, above)
    assert (bwd[5].block_n, bwd[5].block_t) == (4096, 0)
    assert [(p.block_n, p.block_t) for p in (settings(8192, 5121, 2, backward=True), settings(8192, 5121, 4, backward=True))] == [
        (8192, 0), (4096, 2048)]
    # 16-bit, aligned: 132 programs (a multiple of 8 only where rows start at several phases: 128 then)
    assert settings(8192, 8192, 2, backward=True, device=H200).n_groups == SMS and bwd[5].n_groups == 128  # 4097: 16 warps
    # a power of two and its tail in words spilled at 64 registers: up to 96, the programs an SM that fit (4097: one of
    # 16 warps, 2049: two of 8, 1025: five of 4, in a multiple of 8); rows on one tile, or a tail piece, keep 64
    tail = {n: settings(8192, n, 2, backward=True, device=H200) for n in (1025, 2049, 4097, 1500, 3001, 8191)}
    assert {n: (p.max_regs, p.n_groups) for n, p in tail.items()} == {
        1025: (96, 656), 2049: (96, 264), 4097: (96, 128), 1500: (64, 528), 3001: (64, 264), 8191: (64, 128)}
    assert settings(8192, 1025, 4, backward=True).max_regs == 64  # fp32: 1024 + 4 in pieces
    assert bwd[9] == P("rows", 1, 1024, 4, SMS * 8, "phased", 64, stages=3)  # 768 bf16: 8 programs of 4 warps an SM
    assert settings(8192, 4097, 4, backward=True, max_row=256).variant != "phased"  # tests' chunked plans
    assert settings(8192, 255, 2, backward=True).variant == "measured"  # narrow rows: many a step
    assert settings(8192, 4097, 4) == P("rows", 1, 8192, 16, max_regs=64)  # 16 elements a thread
    assert settings(8192, 12345, 4) == P("rows", 1, 16384, 32, max_regs=64)  # not the held plan: it spills
    assert settings(8192, 16383, 4).mode == "split"  # 16384 + 2: past the rows plan's block
    for n in (999, 1023):  # 16-bit rows under 1025: Triton's scalar path in the plain rows plan
        assert settings(8192, n, 2).max_regs is None and settings(8192, n, 2).mode == "rows"
    tune(monkeypatch, phased_bwd_tail_max_regs=None)
    assert settings(8192, 1025, 2, backward=True, device=H200).max_regs == 64


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [1025, 2049, 4097, 7001, 8191, 10468, 12345, 16377, 16383])
def test_the_forward_matches_torch_at_ragged_model_widths(n, dtype):
    # packed rows (the streamed and held plans) and a column slice at another phase (the rows plan)
    x, weight, bias = inputs((1000, n + 1), dtype)
    for rows in (x[:, :n].contiguous(), x[:, 1:]):
        y, mean, rstd = layer_norm.forward(rows, weight[:n], bias[:n])
        _check_forward(rows, weight[:n], bias[:n], y, mean, rstd, dtype)


def test_aligned_16_bit_rows_take_the_plans_that_measured_faster():
    # H200 sweep (docs/kernels.md, "layer_norm: forward", "Aligned 16-bit rows")
    settings = layer_norm._layer_norm_settings
    P = layer_norm._Plan
    # past 8192: one tile, JOINT statistics (_forward_launch)
    assert [settings(8192, n, 2, device=H200).mode for n in (8704, 9216, 9472)] == ["rows"] * 3
    joint = layer_norm._joint_tile  # on one tile: bf16 from 8193, fp16 from 6145 (its 8192-lane tile)
    assert [joint(n, torch.bfloat16) for n in (4608, 6656, 8192, 9472)] == [False, False, False, True]
    assert [joint(n, torch.float16) for n in (4608, 6144, 6656, 8192, 9472)] == [False, False, True, True, True]
    assert settings(8192, 8704, 2, max_row=256) == P("looped", 1, 256, 16)  # tests' wide-row plan: a program a row
    # 4097-8192: two pieces where the second has 1024 lanes or more
    pieces = layer_norm._aligned_16bit_pieces
    assert [pieces(n) for n in (4864, 5120, 5632, 6144)] == [(4096, 1024, 0)] * 2 + [(4096, 2048, 0)] * 2
    assert [pieces(n) for n in (4096, 4608, 6656, 8192, 9216)] == [None] * 5
    # 257-2047 with lanes masked: twice the rows of the tile a program (768 on 1024 lanes, 1280 / 1536 on 2048)
    rows = {n: settings(8192, n, 2, device=H200)[1:4] for n in (384, 768, 1024, 1280, 1536, 2048, 2560)}
    assert rows == {384: (8, 512, 4), 768: (4, 1024, 4), 1024: (2, 1024, 4), 1280: (2, 2048, 4),
                    1536: (2, 2048, 4), 2048: (1, 2048, 4), 2560: (1, 4096, 4)}
    assert settings(8192, 1280, 4, device=H200)[1] == 1, "fp32 keeps one row of 2048 lanes"
    assert settings(1, 1280, 2, device=H200)[1] == 1, "no more rows than the input has"
    # aligned rows (a multiple of 16 columns) take it: 2000 and 1040 on 4096 lanes a program, two rows; unaligned
    # ones keep their plan (999 and 1000: two rows of 1024 lanes on the 2048 tile; 2008: one)
    assert [settings(8192, n, 2, device=H200)[1] for n in (999, 1000, 2000, 2008, 1040)] == [2, 2, 2, 1, 2]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("n", [112, 96], ids=["one tile", "two pieces"])
def test_joint_statistics_match_torch_with_an_outlier_as_the_shift_and_nan_rows(n, dtype, monkeypatch):
    # JOINT: one reduction of (x - x[row, 0], its square) a piece; made to run at narrow widths; x held packed,
    # widened again after the reduction, through the NaN-mean dependency the NaN rows take
    tune(monkeypatch, joint_16bit_min_cols=1)
    tune(monkeypatch, joint_fp16_min_cols=1)
    tune(monkeypatch, aligned_pieces_16bit=(1, 1 << 20), aligned_pieces_min_lanes=16)
    assert (layer_norm._aligned_16bit_pieces(n) or (0, 0))[1] == (32 if n == 96 else 0)
    x, weight, bias = inputs((37, n), dtype)  # several rows a program, the last program ragged
    x[3, 0] = 60.0  # the shift far from the row's mean
    x[5] = 0.5  # a constant row: zero variance
    for out in (None, _poisoned((37, n), dtype)):
        y, mean, rstd = layer_norm.forward(x, weight, bias, out=out)
        _check_forward(x, weight, bias, y, mean, rstd, dtype)
    x[7, 9] = float("nan")
    x[8, 0] = float("inf")  # in the shift
    y = layer_norm.fused(x, weight, bias)
    expected = F.layer_norm(x.float(), (n,), weight.float(), bias.float(), 1e-5)
    assert y[7].isnan().all() and y[8].isnan().all()
    torch.testing.assert_close(y.float(), expected, equal_nan=True, atol=0.1, rtol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("n", [272, 320, 384, 768, 1040, 1104, 1280, 1536, 2000, 2304, 4352, 4608, 4864, 5120, 5632, 6144, 8704,
                               8960, 9216, 9472, 11008, 12288, 16384])
def test_the_aligned_16_bit_plans_match_torch_at_model_widths(n, dtype):
    x, weight, bias = inputs((1000, n), dtype)
    x[0, 0] = 40.0  # the shift far from the row's mean
    y, mean, rstd = layer_norm.forward(x, weight, bias)
    _check_forward(x, weight, bias, y, mean, rstd, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [768, 1280, 2064, 2560, 3072, 4112, 4128, 4160, 4224, 5120, 6144, 7168, 8192, 12288,
                               16384], ids=lambda n: str(n))  # 2064 / 4112: 16-lane second pieces
def test_bf16_widened_by_a_shift_writes_the_bits_the_compilers_conversion_does(n, monkeypatch):
    # the rows kernel's bf16 pairs widened by inline PTX (one tile, pieces, JOINT pieces with x held packed and
    # widened again after the reduction, JOINT on one tile), at every width here whether or not its band takes it,
    # against the compiler's conversion: the same float32 values, so the same bits out, NaN and inf rows included
    # (widen_after's dependency on the mean)
    x, weight, bias = inputs((300, n), torch.bfloat16)
    x[1, 0] = 40.0
    x[2, 5] = float("nan")
    x[3, 0] = float("inf")
    out = {}
    for bands in (None, ((1, 1 << 20),)):
        tune(monkeypatch, rows_widen_bands=bands)
        assert layer_norm._rows_widen(x, n) == (bands is not None)
        assert layer_norm._layer_norm_settings(300, n, 2, device=H200).mode == "rows"
        out[bands is not None] = layer_norm.forward(x, weight, bias)
    for a, b in zip(out[False], out[True]):
        bits = torch.int16 if a.dtype == torch.bfloat16 else torch.int32
        assert torch.equal(a.view(bits), b.view(bits))
    assert out[True][0][2].isnan().all() and out[True][0][3].isnan().all()
    _check_forward(x[4:], weight, bias, out[True][0][4:], out[True][1][4:], out[True][2][4:], torch.bfloat16)


def test_bf16_is_widened_by_a_shift_in_its_bands_on_cuda_only():
    # inline PTX: never under the interpreter or on the CPU, and only bf16 has the shift-and-AND form
    bands = layer_norm.DEFAULT_TUNING.rows_widen_bands
    widths = (768, 1024, 1280, 2560, 4160, 4224, 5120, 8192, 12288, 16384)
    assert [any(lo <= n <= hi for lo, hi in bands) for n in widths] \
        == [False, False, True, True, True, False, False, False, True, True]
    assert not layer_norm._rows_widen(torch.empty(4, 16, dtype=torch.bfloat16), 2560)
    if torch.cuda.is_available():
        bf16 = torch.empty(4, 16, dtype=torch.bfloat16, device="cuda")
        assert layer_norm._rows_widen(bf16, 2560) != layer_norm.interpreting()
        assert not layer_norm._rows_widen(bf16, 8192)
        assert not layer_norm._rows_widen(bf16, 1500), "aligned rows only (packed 1500 lost)"
        assert not layer_norm._rows_widen(bf16.half(), 2560)


# the rows kernel's launches widened (scripts/rows_sass.py cases): one 4096-lane tile, two JOINT pieces with x held
# packed under the plan's 64-register cap, and the JOINT 16384-lane tile (whose second widening stays the compiler's)
WIDEN_SHAPES = ["bf16:2560:4096:4", "bf16:5120:4096+1024:4:joint:packed:r64", "bf16:12288:16384:8:joint:packed"]


def test_bf16_widened_by_a_shift_compiles_for_sm90_to_fewer_instructions_on_no_more_registers():
    # what the widening is for, checked without a GPU: the compiler's bf16 conversion extracts the high element with a
    # PRMT and shifts it; the widening's shift and AND take fewer instructions, without adding registers or stack (its
    # second widening in the PTX took the JOINT tile from 78 to 112 registers, so that one stays the compiler's)
    cases = [c for shape in WIDEN_SHAPES for c in (shape, shape + ":widen")] + ["fp16:2560:4096:4"]
    out = compile_for_sm90(Path(__file__).resolve().parents[1] / "scripts" / "rows_sass.py", cases, gluon=False)
    assert set(out) == set(cases)
    for shape in WIDEN_SHAPES:
        plain, widened = out[shape], out[shape + ":widen"]
        assert widened["widening_and"] and not plain["widening_and"], (plain, widened)
        if plain["instructions"] is None:  # no cuobjdump / nvdisasm in this Triton build: the compile is all there is
            continue
        assert widened["instructions"] < plain["instructions"] and widened["prmt"] < plain["prmt"], (plain, widened)
        assert widened["registers"] <= plain["registers"] + 2 and widened["stack"] == plain["stack"], (plain, widened)
    if out["fp16:2560:4096:4"]["instructions"] is not None:  # bf16 widened as cheaply as fp16 converts
        assert out["bf16:2560:4096:4:widen"]["instructions"] <= out["fp16:2560:4096:4"]["instructions"] + 8, out


def test_the_backward_summing_its_shares_in_launch_compiles_for_sm90_to_one_released_arrival_and_an_acquire():
    # what the GPU runs, checked without one (scripts/rows_sass.py): the arrival one release RMW (every share store
    # ordered before it), the last program's acquire before its reads, which go to L2 as 16-byte vectors (aligned
    # rows); the plain rows kernel takes no atomic; no stack either way. The shares' sum past one split the same, its
    # reads a float a thread (256 columns on 8 warps)
    cases = ["bwd:bf16:4096:8:1", "bwd:bf16:4096:8:1:sum", "bwd:fp32:1024:4:1:sum", "dwdb:256:8", "dwdb:256:8:splits"]
    out = compile_for_sm90(Path(__file__).resolve().parents[1] / "scripts" / "rows_sass.py", cases, gluon=False)
    assert out["bwd:bf16:4096:8:1"]["atomics"] == out["dwdb:256:8"]["atomics"] == 0, out
    for case in ("bwd:bf16:4096:8:1:sum", "bwd:fp32:1024:4:1:sum", "dwdb:256:8:splits"):
        r = out[case]
        assert r["atomics"] == r["releases"] == r["acquires"] == 1 and r["l2_loads"] > 0, r
        assert case.startswith("dwdb") or r["l2_loads"] == r["l2_vector_loads"], r
    assert all(r["stack"] in (0, None) for r in out.values()), out


@pytest.mark.gpu
@pytest.mark.parametrize("n", [9216, 10240, 11008, 12288, 16384])
def test_the_fp32_aligned_plans_match_torch_at_model_widths(n):
    assert layer_norm._layer_norm_settings(1000, n, 4, device=H200).mode == "rows"  # a row a program
    torch.manual_seed(n)
    x, weight, bias = inputs((1000, n), torch.float32)
    x[0, 0] = 40.0  # the shift 13 deviations from the row's mean: its one-pass sums lose ~1e-5 of y (seeded: it
    # read 1.08e-5 against the 1e-5 once; docs/kernels.md, "Statistics", and the massive-activation test's xfails)
    y, mean, rstd = layer_norm.forward(x, weight, bias)
    _check_forward(x, weight, bias, y, mean, rstd, torch.float32)


# ------------------------------------------------------------------ the flat backward (_layer_norm_bwd_flat_kernel)


def _small_flat(monkeypatch):
    """Segments of 16 lanes in tiles of 128 (or 64): windows of whole rows that the interpreter runs quickly."""
    monkeypatch.setattr(layer_norm, "_FLAT_BWD_SEGMENT", 16)
    monkeypatch.setattr(layer_norm, "_FLAT_BWD_TILE", 128)


def _flat_backward_checked(x, weight, bias, dy, plan):
    """The flat kernel's gradients into NaN-filled outputs, checked against torch and for unwritten elements."""
    _, mean, rstd = layer_norm.forward(x, weight, bias)
    dx, dw, db = (torch.full_like(t, float("nan")) for t in (x, weight, bias))
    layer_norm._backward_launch(dy, x, weight, mean, rstd, dx, dw, db, plan)
    _, *expected = torch_reference(x, weight, bias, dy)
    for what, a, e in zip(("dx", "dweight", "dbias"), (dx, dw, db), expected):
        assert not a.isnan().any(), f"{what} left unwritten"
        assert_close(a, e, x.dtype, what, inputs=(x, weight, dy))
    return dx, dw, db


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
# (rows, width): 48 = 3 segments, two rows a window, the last window half empty; 80 = 5 segments, one row a
# window; 16 = one segment, four rows a window on the smaller tile (six windows); 112 = 7 segments of the 8
@pytest.mark.parametrize("shape", [(11, 48), (7, 80), (21, 16), (3, 112)], ids=str)
@pytest.mark.parametrize("n_groups", [1, 2, 8],
                         ids=["one program walks every window", "two", "more programs than windows"])
def test_the_flat_backward_matches_torch_and_writes_every_element(shape, n_groups, dtype, monkeypatch):
    _small_flat(monkeypatch)
    x, weight, bias = inputs(shape, dtype)
    x[2] += 50.0  # a row far from zero: x-hat from the forward's mean, not from x
    dy = torch.randn(shape, device=DEVICE).to(dtype)
    plan = layer_norm._layer_norm_settings(*shape, x.element_size(), backward=True, device=on(2), variant="flat")
    seg, k, r, segments = layer_norm._flat_shape(shape[1])
    assert (plan.variant, plan.block_n, plan.block_m) == ("flat", seg, r) and seg * k == shape[1] and r * k <= segments
    plan = plan._replace(n_groups=n_groups)
    first = _flat_backward_checked(x, weight, bias, dy, plan)
    again = _flat_backward_checked(x, weight, bias, dy, plan)
    for a, b in zip(first, again):
        assert torch.equal(a, b), "the flat backward is not bitwise deterministic"


def test_the_flat_shape_fills_the_tile_with_whole_rows():
    shape = layer_norm._flat_shape
    assert shape(1536) == (256, 6, 5, 32)  # five rows of six segments: 30 of 32 in use
    assert shape(768) == (256, 3, 5, 16)  # the 4096-lane tile: the same share of lanes, five rows
    assert shape(2560) == (256, 10, 3, 32)
    assert shape(4096) == (256, 16, 2, 32)  # not the 4096-lane tile: one row there
    assert shape(1280) == (256, 5, 3, 16)
    assert shape(1600) == (64, 25, 2, 64)  # segments of 64 (1600 = 25 x 64), at most 64 a tile
    with pytest.raises(ValueError, match="the flat plan holds rows of up to 64 segments of 64 lanes, not 4160 columns"):
        shape(4160)  # 65 segments of 64
    with pytest.raises(ValueError, match="not 8448 columns"):
        shape(8448)  # 33 segments of 256 past the 8192-lane tile


def test_the_backward_lays_rows_flat_where_its_tile_uses_more_lanes():
    settings = layer_norm._layer_norm_settings
    flat = {n: settings(16384, n, 2, backward=True, device=H200).variant == "flat" for n in range(256, 8193, 64)}
    # 768, 1280, 1536, 2304 and 2560 use 30, 30, 30, 27 and 30 of 32 segments, against 75, 62 (1024 + 256 in pieces),
    # 75, 56 and 62% of their powers of two; 4096 measured faster than the rows plan at the same share
    assert [n for n, f in flat.items() if f] == [768, 1280, 1536, 2304, 2560, 4096]
    assert not any(layer_norm._flat_backward(n, 4) for n in range(256, 8193, 64))
    assert settings(16384, 1536, 2, backward=True, device=H200) == layer_norm._Plan(
        "rows", 5, 256, 32, SMS, "flat", 64, stages=3)  # one 32-warp program an SM, five rows a window
    assert settings(16384, 1536, 4, backward=True).variant != "flat"  # fp32 keeps its plans
    assert settings(16384, 1600, 2, backward=True).variant != "flat"  # not a multiple of 256 columns
    assert settings(16384, 1536, 2, backward=True, flat_ok=False).variant == "phased"
    assert settings(16384, 1536, 2, backward=True, phased_ok=False).variant != "flat"  # dy in another dtype
    assert settings(16384, 1536, 2, backward=True, max_row=512).variant != "flat"  # the tests' chunked plans


@pytest.mark.parametrize("make", ["sliced", "offset", "transposed"])
def test_the_backward_on_rows_that_do_not_lie_flat_keeps_its_plan_and_matches_torch(make, monkeypatch):
    _small_flat(monkeypatch)
    tune(monkeypatch, flat_bwd_16bit=(16, 4096), flat_bwd_min_gain=-1.0)  # flat wherever the layout allows it
    _, weight, bias = inputs((9, 48), torch.bfloat16)
    big = (torch.randn(9, 64, device=DEVICE) * 3 + 1).bfloat16()
    x = {"sliced": big[:, :48], "offset": big.view(-1)[1:1 + 9 * 48].view(9, 48),
         "transposed": big[:, :48].t().contiguous().t()}[make]
    dy = torch.randn(9, 48, device=DEVICE).bfloat16()
    assert not layer_norm._flat_layout(x) and layer_norm._flat_layout(dy)
    with pytest.raises(ValueError, match="contiguous rows from 16-byte aligned addresses"):
        forced = layer_norm._layer_norm_settings(9, 48, 2, backward=True, variant="flat")
        _flat_backward_checked(x, weight, bias, dy, forced)
    ours = fused_with_grads(x, weight, bias, dy)
    for what, a, e in zip(("y", "dx", "dweight", "dbias"), ours, torch_reference(x, weight, bias, dy)):
        assert_close(a, e, torch.bfloat16, what, inputs=(x, weight, dy))
    assert layer_norm._layer_norm_settings(9, 48, 2, backward=True).variant == "flat"  # the same rows, contiguous


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("n", [768, 1024, 1280, 1536, 2304, 2560, 3072, 4096])
def test_the_flat_backward_matches_torch_and_is_deterministic_at_model_widths(n, dtype):
    shape = (2**21 // n + 3, n)  # a last window part empty
    x, weight, bias = inputs(shape, dtype)
    x[1] += 50.0
    dy = torch.randn(shape, device=DEVICE).to(dtype)
    plan = layer_norm._layer_norm_settings(*shape, x.element_size(), backward=True, device=H200, variant="flat")
    first = _flat_backward_checked(x, weight, bias, dy, plan)
    for a, b in zip(first, _flat_backward_checked(x, weight, bias, dy, plan)):
        assert torch.equal(a, b)


# ------------------------------------------------------------------ packed unaligned rows (a compile-time width)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [1028, 1500], ids=["4 x 257", "4 x 375"])
def test_packed_unaligned_rows_take_the_rows_plan_at_a_compile_time_width_and_match_torch(n, dtype):
    settings = functools.partial(layer_norm._layer_norm_settings, 64, n, torch.tensor([], dtype=dtype).element_size())
    fwd, bwd = settings(device=H200, packed=True), settings(backward=True, device=H200, packed=True)
    assert (fwd.mode, bwd.mode, bwd.variant) == ("rows", "rows", "measured")
    # rows that do not lie packed keep the phased backward
    assert settings(backward=True, device=H200).variant == "phased"
    assert not any(layer_norm._packed_rows(w) for w in (1024, 1030, 1031, 2052))  # aligned, 2 x odd, odd, past the band
    big = (torch.randn(5, n + 4, device=DEVICE) * 3 + 1).to(dtype)
    _, weight, bias = inputs((5, n), dtype)
    for x in (big[:, :n].contiguous(), big[:, :n]):  # packed, and rows of a wider tensor
        x[1] += 50.0
        dy = torch.randn(5, n, device=DEVICE).to(dtype)
        x2, dx2 = x, torch.empty_like(x, memory_format=torch.contiguous_format)
        assert layer_norm._packed_width(x2, dy, dx2) == (n if x.is_contiguous() else 0)
        for what, a, e in zip(("y", "dx", "dweight", "dbias"), fused_with_grads(x, weight, bias, dy),
                              torch_reference(x, weight, bias, dy)):
            assert_close(a, e, dtype, what, inputs=(x, weight, dy))


def test_packed_forward_rows_are_held_as_aligned_rows_are():
    pieces, tile = layer_norm._row_pieces, layer_norm._forward_rows_tile
    # a compile-time width: the row's power of two unless that masks 45% (1028: 1024 + 4), not pieces for every phase
    assert [pieces(n, 1, packed=True) for n in (600, 1500, 1028)] == [(1024, 0, 0), (2048, 0, 0), (1024, 4, 0)]
    assert [pieces(n, 1) for n in (600, 1500)] == [(512, 128, 0), (1024, 512, 0)]
    # 16-bit rows that mask lanes take the masked-rows tile (two or more rows a program) at a multiple of 4 when packed
    assert tile(600, 2, packed=True) == tile(608, 2) == 2 * layer_norm.ROWS_TILE
    assert tile(600, 2) == tile(602, 2, packed=True) == tile(600, 4, packed=True) == layer_norm.ROWS_TILE
    assert layer_norm._layer_norm_settings(4096, 600, 2, packed=True).block_m == 4
    x, weight, bias = inputs((7, 600), torch.bfloat16)  # four rows a program, the last program's rows ragged
    dy = torch.randn(7, 600, device=DEVICE).bfloat16()
    for what, a, e in zip(("y", "dx", "dweight", "dbias"), fused_with_grads(x, weight, bias, dy),
                          torch_reference(x, weight, bias, dy)):
        assert_close(a, e, torch.bfloat16, what, inputs=(x, weight, dy))


# The forward's held plan (_layer_norm_held): rows of N not a multiple of 16 held in shared memory by a Gluon kernel,
# with the weight and bias copied once a program at its rows' phase. It runs on CUDA GPUs only (Gluon has no
# interpreter): on CPU its rule and its fallbacks, on the GPU the kernel.


def test_the_forward_holds_rows_in_shared_memory_only_at_the_widths_where_it_measured_faster(monkeypatch):
    from reference_kernels import _layer_norm_held

    rule = layer_norm._held_default
    # 16-bit: from 513 (rows of two 512-element segments or more: 333, on one, lost), but the widths the packed rows
    # plan takes (1000, 1100, 1500: a multiple of 4 under 2048) and the even ones under 1025 (514, 998, 1022: pairs)
    assert [n for n in (333, 512, 513, 514, 777, 998, 999, 1000, 1022, 1023, 1025, 1026, 1100, 1500, 1501, 2049, 2300,
                        3001, 4097, 5120, 5121, 7001, 8191, 12345, 16384, 17000, 33000) if rule(n, 2)] == [
        513, 777, 999, 1023, 1025, 1026, 1501, 2049, 2300, 3001, 4097, 5121, 7001, 8191, 12345, 17000, 33000]
    # fp32: from 16385 (narrower ragged fp32 rows stream: _stream_band)
    assert [n for n in (4097, 4200, 8191, 12345, 16383, 16384, 16385, 17000, 24000) if rule(n, 4)] == [16385, 17000]
    # aligned 16-bit rows in their band, 8193-11008 (9216 on nine 1024-element segments: no slack before a row); fp32 not
    assert [n for n in (4096, 5120, 8192, 8208, 8704, 9216, 10240, 10256, 11008, 11024, 11264, 12288) if rule(n, 2)] == [
        8208, 8704, 9216, 10240, 10256, 11008]
    assert not rule(9216, 4)
    assert _layer_norm_held.fwd_shape(9216, 2, 6) == (4, 1024, 9, 4)  # 9217: ten segments, three an SM, so 8 warps
    assert _layer_norm_held.fwd_shape(9217, 2, 6) == (8, 2048, 5, 3)
    tune(monkeypatch, held_fwd_min_cols=None)
    assert not rule(17000, 2) and rule(8704, 2)
    tune(monkeypatch, held_fwd_aligned_bands=None)
    assert not rule(8704, 2)
    # shared memory a column: the row's element, the weight's and the bias's (a bf16 weight and an fp32 bias: 8 bytes;
    # both bf16: 6, two programs an SM at 12345)
    x, w, b = torch.empty(4, 12345, dtype=torch.bfloat16), torch.empty(12345, dtype=torch.bfloat16), torch.empty(12345)
    assert _layer_norm_held.col_bytes(x, w, b) == 2 + 2 + 4
    assert _layer_norm_held.per_sm(12345, 2, 6) == 2 and _layer_norm_held.per_sm(12345, 2, 12) == 1
    assert _layer_norm_held.per_sm(50257, 2, 6) == 0  # 300 KiB: over what one block may take
    # 4-warp programs on 1024-element segments where four or more fit an SM, else 8 warps on 2048
    assert [_layer_norm_held.fwd_shape(n, 2, 6) for n in (5121, 8191, 10468, 12345)] == [
        (4, 1024, 6, 6), (4, 1024, 9, 4), (8, 2048, 6, 3), (8, 2048, 7, 2)]
    assert _layer_norm_held.fwd_shape(17000, 4, 12) == (8, 2048, 9, 1)  # fp32 rows with fp32 parameters
    # rows under 2100: 2-warp programs on 512-element segments
    assert [_layer_norm_held.fwd_shape(n, 2, 6) for n in (1025, 2049, 2100)] == [
        (2, 512, 3, 16), (2, 512, 5, 13), (4, 1024, 3, 8)]
    held_shapes(monkeypatch, fwd_narrow=None)
    assert _layer_norm_held.fwd_shape(5121, 2, 6) == (8, 2048, 3, 4)
    # 16-bit rows take their statistics in one pass (sums of x - x[row, 0] and of its square); fp32 keeps two
    assert _layer_norm_held.fwd_joint(2) and not _layer_norm_held.fwd_joint(4)


def test_the_forward_runs_its_other_plans_where_the_held_kernel_cannot(monkeypatch):
    from reference_kernels import _layer_norm_held

    # off CUDA (here; available() is False without a GPU), and for tensors it does not take (on the GPU: a column slice)
    if not torch.cuda.is_available():
        assert not _layer_norm_held.available()
    monkeypatch.setattr(_layer_norm_held, "available", lambda *args: True)
    tune(monkeypatch, held_fwd_min_cols={2: 8, 4: 8})
    calls = []
    monkeypatch.setattr(_layer_norm_held, "launch", lambda *args: calls.append(args))
    x, weight, bias = inputs((6, 41), torch.float32)
    y, mean, rstd = layer_norm.forward(x[:, 1:], weight[1:], bias[1:])  # a column slice: not packed
    assert not calls
    expected = F.layer_norm(x[:, 1:], (40,), weight[1:], bias[1:])
    assert_close(y, expected, torch.float32, "y")


def test_the_held_layer_norm_launcher_refuses_tensors_it_cannot_take_with_a_clear_error():
    from reference_kernels import _layer_norm_held

    x, weight, bias = inputs((3, 40), torch.float32, device="cpu")
    with pytest.raises(ValueError, match="packed, 16-byte aligned CUDA rows"):
        _layer_norm_held.launch(x, weight, bias, torch.empty_like(x), torch.empty(3), torch.empty(3), 1e-5, SMS)


HELD_FWD = [(torch.bfloat16, 1025), (torch.float16, 2049), (torch.bfloat16, 3001), (torch.float16, 4300), (torch.bfloat16, 5121), (torch.float16, 8191),
            (torch.bfloat16, 10468), (torch.float16, 12345), (torch.bfloat16, 17000), (torch.bfloat16, 33000),
            (torch.float32, 6500), (torch.float32, 17000), (torch.float32, 16385),
            (torch.bfloat16, 8704), (torch.float16, 10240), (torch.bfloat16, 11008),
            (torch.bfloat16, 5128),  # aligned; 16-byte rows, not 16-column
            (torch.bfloat16, 777), (torch.float16, 999), (torch.bfloat16, 1023)]  # under 1025: two and three segments


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 3, 301])
@pytest.mark.parametrize("dtype, n", HELD_FWD, ids=str)
def test_the_held_forward_matches_torch_and_writes_every_output_and_statistic(monkeypatch, dtype, n, rows):
    from reference_kernels import _layer_norm_held

    # the held kernel at widths the streamed one takes too (fp32 6500: held from 4200 here, streamed by the tuned file)
    tune(monkeypatch, stream_fwd_bands=None, held_fwd_min_cols={2: 513, 4: 4200})
    x, weight, bias = inputs((rows, n), dtype)
    assert layer_norm._held_forward(x, weight, bias, torch.empty_like(x))
    out = torch.full_like(x, float("nan"))
    y, mean, rstd = layer_norm.forward(x, weight, bias, out=out)
    assert_forward_matches(x, weight, bias, y, mean, rstd)
    assert _layer_norm_held.per_sm(n, x.element_size(), _layer_norm_held.col_bytes(x, weight, bias)) > 0


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, n", [(torch.bfloat16, 3001), (torch.float16, 8191), (torch.bfloat16, 8704),
                                      (torch.bfloat16, 12345), (torch.float32, 17000)], ids=str)
def test_the_held_forward_writes_every_row_once(dtype, n):
    # 1001 rows: the persistent programs' walks end at different rows, some phases with a row fewer
    x, weight, bias = inputs((1001, n), dtype)
    assert layer_norm._held_forward(x, weight, bias, torch.empty_like(x))
    out = torch.full_like(x, float("nan"))
    y, mean, rstd = layer_norm.forward(x, weight, bias, out=out)
    assert_close(y, F.layer_norm(x.float(), (n,), weight.float(), bias.float()).to(dtype), dtype, "y")
    torch.testing.assert_close(mean, x.float().mean(-1), rtol=1e-5, atol=1e-5)


def test_the_held_forward_launcher_sizes_its_grid_to_the_programs_that_fit(monkeypatch, recorded_kernel):
    # as many persistent programs as shared memory fits, a multiple of VEC (one phase a program)
    from reference_kernels import _layer_norm_held

    monkeypatch.setattr(_layer_norm_held, "_layer_norm_fwd_held_kernel", recorded_kernel, raising=False)  # no Gluon: absent
    monkeypatch.setattr(_layer_norm_held, "fits", lambda *args: True)
    x = torch.empty(5000, 12345, dtype=torch.bfloat16)
    w = torch.empty(12345, dtype=torch.bfloat16)
    _layer_norm_held.launch(x, w, w, torch.empty_like(x), torch.empty(5000), torch.empty(5000), 1e-5, SMS)
    (grid, kwargs), = recorded_kernel.launches
    per_sm = _layer_norm_held.fwd_shape(12345, 2, 6)[3]  # two an SM
    assert grid == (per_sm * SMS // 8 * 8,) and grid[0] % 8 == 0
    assert kwargs["VEC"] == 8


@pytest.mark.gpu
def test_the_held_forward_takes_float32_parameters_for_16_bit_rows_and_falls_back_on_a_column_slice():
    x = (torch.randn(64, 12345 + 8, device="cuda") * 3 + 1).bfloat16()
    weight, bias = torch.randn(12345, device="cuda"), torch.randn(12345, device="cuda")  # fp32, as under autocast
    packed = x[:, :12345].contiguous()
    assert layer_norm._held_forward(packed, weight, bias, torch.empty_like(packed))
    expected = F.layer_norm(packed.float(), (12345,), weight, bias).bfloat16()
    assert_close(layer_norm.forward(packed, weight, bias)[0], expected, torch.bfloat16, "y, packed")
    sliced = x[:, 3:3 + 12345]
    assert not layer_norm._held_forward(sliced, weight, bias, torch.empty_like(packed))
    expected = F.layer_norm(sliced.float(), (12345,), weight, bias).bfloat16()
    assert_close(layer_norm.forward(sliced, weight, bias)[0], expected, torch.bfloat16, "y, sliced")


# Rows too wide for the held plan streamed past the held weight and bias (_layer_norm_held.launch_stream): each row held
# in registers as loaded, the next one loaded behind the output pass. On CPU its shape, its rule and its fallbacks; on
# the GPU the kernel.


def test_the_streamed_forward_holds_the_weight_and_bias_in_shared_memory_and_the_row_in_registers(monkeypatch):
    from reference_kernels import _layer_norm_held

    segments = _layer_norm_held.stream_segments
    # 16-bit rows, 16-bit parameters (4 bytes a column): the weight and bias on 2048-element segments in shared memory
    # (50257: 25 segments, 200 KiB), the row (and the next) in registers; to 28 segments (57337 with a row's seven
    # elements of slack), past which the weight and bias do not fit
    assert segments(50257, 2, 4) == 25
    assert segments(57337, 2, 4) == 28
    assert segments(57338, 2, 4) == 0 and segments(74988, 2, 4) == 0
    assert segments(40960, 2, 4) == 20  # aligned rows: no slack before a row
    # fp32 rows (8 bytes a thread more a segment) to 12 segments (24576), past which the row spilled
    assert segments(24576, 4, 8) == 12 and segments(24577, 4, 8) == 0
    # bf16 rows with fp32 parameters (as under autocast): 8 bytes a column, to 14 segments of shared memory
    assert segments(24001, 2, 8) == 12 and segments(28672, 2, 8) == 14 and segments(28673, 2, 8) == 0
    held_shapes(monkeypatch, stream_max_segments={2: 20})
    assert segments(40960, 2, 4) == 20 and segments(40961, 2, 4) == 0
    assert segments(20000, 4, 8) == 0  # no limit for fp32 rows: not taken
    held_shapes(monkeypatch, stream_max_segments={})
    assert segments(40960, 2, 4) == 0
    w, b = torch.empty(10, dtype=torch.bfloat16), torch.empty(10)
    assert _layer_norm_held.wb_bytes(w, b) == 2 + 4


def test_narrower_streamed_rows_take_several_programs_an_sm_of_the_fewest_warps_that_hold_them_in_the_fewest_slots(
        monkeypatch):
    from reference_kernels import _layer_norm_held

    shape = _layer_norm_held.stream_shape
    # one 16-byte vector a thread a segment (16-bit: 256 elements a warp), at most six segments; of the warps that hold a
    # row so, the fewest slots, and on a tie the fewest warps; as many programs as 32 warps an SM at 64 registers a
    # thread, 80 for rows of five or six segments, but two where the warps allow
    assert shape(999, 2, 4) == (2, 512, 2, 16, 64)
    assert shape(2560, 2, 4) == (2, 512, 5, 12, 80)  # five 512-element segments, no slot empty (its tile: 4096 lanes)
    assert shape(5120, 2, 4) == (4, 1024, 5, 6, 80)
    assert shape(12288, 2, 4) == (8, 2048, 6, 3, 80)  # 16 warps on three 4096-element segments hold as many slots
    assert shape(16384, 2, 4) == (16, 4096, 4, 2, 64)
    # one warp for rows of up to three 256-element segments (Shapes.stream_narrow_max_segments_by_warps), 32 programs an SM; a
    # tie of slots goes to the fewer warps (384: two of 256 against one of 512); four of them not (777: 2 warps)
    assert shape(384, 2, 4) == (1, 256, 2, 32, 64)
    assert shape(555, 2, 4) == (1, 256, 3, 32, 64)
    assert shape(777, 2, 4) == (2, 512, 2, 16, 64)
    assert shape(4097, 2, 4) == (4, 1024, 5, 6, 80)  # a ragged row takes its slack before the start: 4104 slots
    assert shape(7001, 4, 8) == (16, 2048, 4, 2, 64)  # fp32: 128 elements a warp
    assert shape(9001, 4, 8) == (16, 2048, 5, 2, 64)  # two programs on 64 registers, not one on 80
    assert shape(1025, 4, 8) == (2, 256, 5, 12, 80)
    # 16-warp programs take up to eight segments (Shapes.stream_narrow_max_segments_by_warps): fp32 12345 on seven 2048-element
    # ones, two programs an SM, not four 4096-element ones on one 32-warp program; 16384 on eight, one an SM as shared
    # memory holds its weight and bias (128 KiB), on a tie of slots the fewer warps
    assert shape(12345, 4, 8) == (16, 2048, 7, 2, 64)
    assert shape(16384, 4, 8) == (16, 2048, 8, 1, 128)
    assert shape(16383, 4, 8) == (32, 4096, 5, 1, 64)  # its slack before the start: 16386 slots, nine of 2048
    assert shape(12345, 2, 4) == (16, 4096, 4, 2, 64)  # 16-bit rows: no seventh segment under 16385 columns
    # up to Shapes.stream_narrow_max_cols; wider rows keep one STREAM_WARPS program an SM on the whole register file
    assert shape(16385, 2, 4) == (_layer_norm_held.STREAM_WARPS, 2048, 9, 1, THREAD_MAX_REGS)
    held_shapes(monkeypatch, stream_narrow_max_segments_by_warps={1: 3})
    assert shape(12345, 4, 8) == (32, 4096, 4, 1, 64)
    assert shape(16384, 4, 8) == (32, 4096, 4, 1, 64)
    monkeypatch.setattr(_layer_norm_held, "RESIDENT_WARPS", 16)
    assert shape(999, 2, 4) == (2, 512, 2, 8, 128)
    assert shape(16384, 4, 8) == (32, 4096, 4, 1, 64)  # never fewer than one program
    held_shapes(monkeypatch, stream_narrow_max_segments=2)
    assert shape(2560, 2, 4) == (8, 2048, 2, 2, 128)
    monkeypatch.setattr(_layer_norm_held, "STREAM_NARROW_WARPS", (2,))
    assert shape(2560, 2, 4) is None  # no warps hold the row in two segments
    # programs an SM as shared memory holds the weight and bias: fp32 parameters of bf16 rows (8 bytes a column)
    monkeypatch.setattr(_layer_norm_held, "STREAM_NARROW_WARPS", (2, 4, 8, 16, 32))
    held_shapes(monkeypatch, stream_narrow_max_segments=6)
    monkeypatch.setattr(_layer_norm_held, "RESIDENT_WARPS", 64)
    held_shapes(monkeypatch, stream_narrow_regs={})
    assert shape(12288, 2, 8) == (8, 2048, 6, 2, 128)  # 96 KiB a program: two an SM, not eight
    x = torch.empty(4, 12288, dtype=torch.bfloat16)
    assert _layer_norm_held.fits_stream(x, torch.empty(12288), torch.empty(12288), x) == (
        x.is_cuda and _layer_norm_held.packed_rows(x))


def test_narrower_rows_are_streamed_before_the_held_plan_in_their_bands(monkeypatch):
    from reference_kernels import _layer_norm_held

    band = layer_norm._stream_band
    # 16-bit: rows of 257-16383 (not 255, nor the packed rows' multiples of 4, nor the rows plan's even pairs under
    # 1025 but on one-warp programs, to ~761) whose streamed shape has at most five segments and eight warps (not 2600
    # or 3001: six of 512; 12345: 16 warps)
    assert [n for n in (255, 258, 259, 333, 514, 555, 750, 762, 777, 778, 998, 999, 1000, 1022, 1023, 1025, 1027, 2049,
                        2600, 3001, 4200, 8192, 10001, 12345) if band(n, 2)] == [
        258, 259, 333, 514, 555, 750, 777, 999, 1023, 1025, 1027, 2049, 4200, 10001]
    assert _layer_norm_held.stream_shape(750, 2, 4).warps == 1 and _layer_norm_held.stream_shape(762, 2, 4).warps == 2
    tune(monkeypatch, stream_fwd_even_max_warps=0)
    assert not band(258, 2) and not band(750, 2) and band(259, 2)
    tune(monkeypatch, stream_fwd_16bit_most=(6, 16))
    assert band(3001, 2) and band(12345, 2)
    # fp32: rows of no multiple of 16 columns from 1025 to 16383, but packed rows under 2048
    assert [n for n in (1023, 1025, 1500, 1501, 3001, 6001, 8189, 8190, 8191, 9001, 12288, 16383, 16385) if band(n, 4)] == [
        1025, 1501, 3001, 6001, 8189, 8190, 8191, 9001, 16383]
    tune(monkeypatch, stream_fwd_bands=None)
    assert not band(999, 2) and not band(4097, 4)
    # the forward streams a banded row before it asks the held plan, and asks it where the streamed kernel cannot run
    tune(monkeypatch, stream_fwd_bands={2: ((513, 1025),)})
    monkeypatch.setattr(_layer_norm_held, "available", lambda *args: True)
    calls = []
    monkeypatch.setattr(_layer_norm_held, "launch_stream", lambda *args: calls.append("stream"))
    monkeypatch.setattr(_layer_norm_held, "launch", lambda *args: calls.append("held"))
    monkeypatch.setattr(_layer_norm_held, "fits", lambda *args: True)
    x, weight, bias = inputs((4, 999), torch.bfloat16)
    monkeypatch.setattr(_layer_norm_held, "fits_stream", lambda *args: True)
    layer_norm.forward(x, weight, bias)
    monkeypatch.setattr(_layer_norm_held, "fits_stream", lambda *args: False)
    layer_norm.forward(x, weight, bias)
    assert calls == ["stream", "held"]


def test_fp32_aligned_forward_rows_load_weight_and_bias_first_from_2048_on_blocks_they_fill(monkeypatch):
    # _params_first (docs/kernels.md, "fp32 aligned rows against Liger's shape"): fp32 rows of a multiple of 16 on one
    # piece from 2048 that fill 0.7 of a block of up to 4096 (2112-2368 lost), 7/8 of the 8192 block (5120 and 6144
    # lost); 16-bit, unaligned vectors, pieces no
    pick = lambda n, size=4, vec=1, pieces=None: layer_norm._params_first(
        n, pieces or (layer_norm.next_power_of_2(n), 0, 0), size, vec)
    widths = (1024, 1536, 2000, 2048, 2112, 2368, 2560, 2816, 2880, 3000, 3072, 4096, 5120, 6144, 7168, 7680, 8192)
    assert [n for n in widths if pick(n)] == [2048, 2880, 3072, 4096, 7168, 7680, 8192]
    assert not pick(4096, size=2) and not pick(4096, vec=4) and not pick(5120, pieces=(4096, 1024, 0))
    tune(monkeypatch, fwd_params_first=None)
    assert not any(pick(n) for n in widths)


def test_aligned_rows_in_pieces_keep_their_blocks_warps_only_where_the_pieces_past_the_first_are_short(
        monkeypatch, recorded_kernel):
    # aligned_pieces_block_warps_tails (128-512 lanes): bf16 4176-4224 = 4096 + 128 on the 8192 block's 8 warps, not the
    # first piece's 4; shorter tails (4112, 4160), rows read as unaligned vectors (vec > 1), JOINT pieces and tails past
    # the range keep theirs
    monkeypatch.setattr(layer_norm, "_layer_norm_fwd_kernel", recorded_kernel)

    def warps(n):
        x = torch.empty(3, n, dtype=torch.bfloat16)
        w = torch.empty(n, dtype=torch.bfloat16)
        plan = layer_norm._layer_norm_settings(3, n, 2, device=H200)
        recorded_kernel.launches.clear()
        layer_norm._forward_launch(x, w, w, torch.empty_like(x), torch.empty(3), torch.empty(3), 1e-5, plan)
        (_, kwargs), = recorded_kernel.launches
        return kwargs["BLOCK_T"], kwargs["num_warps"]

    widths = (4112, 4160, 4176, 4224, 4352)
    assert [warps(n) for n in widths] == [(16, 4), (64, 4), (128, 8), (128, 8), (256, 8)]
    tune(monkeypatch, aligned_pieces_block_warps_tails=(64, 128))
    assert [warps(n) for n in widths] == [(16, 4), (64, 8), (128, 8), (128, 8), (256, 4)]
    tune(monkeypatch, aligned_pieces_block_warps_tails=None)
    assert [warps(n) for n in widths] == [(16, 4), (64, 4), (128, 4), (128, 4), (256, 4)]
    tune(monkeypatch, aligned_pieces_block_warps_tails=(128, 512))
    assert layer_norm._block_warps((4096, 128, 0), 1, False) and not layer_norm._block_warps((4096, 128, 0), 8, False)
    assert layer_norm._block_warps((4096, 256, 256), 1, False) and not layer_norm._block_warps((4096, 512, 64), 1, False)
    assert not layer_norm._block_warps((4096, 128, 0), 1, True) and not layer_norm._block_warps((8192, 0, 0), 1, False)


@pytest.mark.parametrize("n", [2048, 3072, 7168])
def test_fp32_rows_loading_weight_and_bias_first_match_torch(n, monkeypatch):
    x, weight, bias = inputs((3, n), torch.float32)
    seen = []
    params_first = layer_norm._params_first
    monkeypatch.setattr(layer_norm, "_params_first", lambda *args: seen.append(params_first(*args)) or seen[-1])
    y, mean, rstd = layer_norm.forward(x, weight, bias)
    assert seen == [True]
    assert_forward_matches(x, weight, bias, y, mean, rstd)


def test_the_forward_streams_rows_only_from_its_widths_on_a_machine_that_runs_the_held_kernels(monkeypatch):
    from reference_kernels import _layer_norm_held

    x, weight, bias = inputs((4, 50257), torch.bfloat16, device="cpu")
    y = torch.empty_like(x)
    if not torch.cuda.is_available():
        assert not layer_norm._stream_forward(x, weight, bias, y)  # no GPU: the held kernels do not run
    monkeypatch.setattr(_layer_norm_held, "available", lambda *args: True)
    monkeypatch.setattr(_layer_norm_held, "fits_stream", lambda *args: True)
    assert layer_norm._stream_forward(x, weight, bias, y)
    # rows of N a multiple of 16 in their own band: 16-bit past 32768 (the other plans were faster at 24576 and
    # 32768); fp32 aligned rows not (the rows plan faster at 8193-16384)
    aligned = [n for n in (24576, 32768, 32784, 40960, 49152) if layer_norm._stream_forward(x[:, :n], weight, bias, y)]
    assert aligned == [32784, 40960, 49152]
    x32 = torch.empty(2, 24576)
    widths = (8192, 8208, 9216, 9728, 9744, 16384, 24576)
    streamed = lambda: [n for n in widths if layer_norm._stream_forward(x32[:, :n], x32[0, :n], x32[0, :n], x32[:, :n])]
    assert streamed() == []
    tune(monkeypatch, stream_fwd_aligned_min_cols={2: 32769, 4: 8193})
    assert streamed() == [8208, 9216, 9728, 9744, 16384, 24576]
    # or from a width where the rows plan's power-of-two block would hold at most a share of lanes: not 8192 or 16384
    # (all used), nor 24576, past the narrow streamed shape
    tune(monkeypatch, stream_fwd_aligned_min_cols={2: 32769}, stream_fwd_aligned_max_use={4: (8193, 0.75)})
    assert streamed() == [8208, 9216, 9728, 9744]
    assert not layer_norm._stream_forward(x32[:, :4160], x32[0, :4160], x32[0, :4160], x32[:, :4160])  # under 8193
    tune(monkeypatch, stream_fwd_aligned_max_use={4: (4097, 0.75)})
    assert layer_norm._stream_forward(x32[:, :4160], x32[0, :4160], x32[0, :4160], x32[:, :4160])
    wider = torch.empty(2, 12304)  # 12304 of 16384 lanes: over 0.75
    assert not layer_norm._stream_forward(wider, wider[0], wider[0], wider)
    assert not layer_norm._stream_forward(x[:, :9216], weight[:9216], bias[:9216], y[:, :9216])  # 16-bit: no share
    assert layer_norm._stream_forward(x32[:, :24001], x32[0], x32[0], x32)
    tune(monkeypatch, stream_fwd_min_cols={2: 60000})
    assert not layer_norm._stream_forward(x, weight, bias, y)
    tune(monkeypatch, stream_fwd_min_cols=None)
    assert not layer_norm._stream_forward(x, weight, bias, y)


def test_the_forward_runs_its_other_plans_where_the_streamed_kernel_cannot(monkeypatch):
    from reference_kernels import _layer_norm_held

    monkeypatch.setattr(_layer_norm_held, "available", lambda *args: True)
    tune(monkeypatch, held_fwd_min_cols=None)
    tune(monkeypatch, stream_fwd_min_cols={2: 8, 4: 8})
    calls = []
    launch = _layer_norm_held.launch_stream
    monkeypatch.setattr(_layer_norm_held, "launch_stream", lambda *args: calls.append(args))
    x, weight, bias = inputs((6, 41), torch.float32)
    y, _, _ = layer_norm.forward(x[:, 1:], weight[1:], bias[1:])  # a column slice (and CPU tensors): not taken
    assert not calls
    assert_close(y, F.layer_norm(x[:, 1:], (40,), weight[1:], bias[1:]), torch.float32, "y")
    with pytest.raises(ValueError, match="streamed layer norm takes packed, 16-byte aligned CUDA rows"):
        launch(x[:, 1:], weight[1:], bias[1:], torch.empty_like(x[:, 1:]), torch.empty(6), torch.empty(6), 1e-5, SMS)


def test_the_streamed_forward_launcher_gives_each_phase_its_programs_and_the_kernel_its_shape(monkeypatch,
                                                                                              recorded_kernel):
    from reference_kernels import _layer_norm_held

    monkeypatch.setattr(_layer_norm_held, "_layer_norm_fwd_stream_kernel", recorded_kernel, raising=False)  # no Gluon
    monkeypatch.setattr(_layer_norm_held, "fits_stream", lambda *args: True)
    for rows, grid in ((5000, 128), (3, 8)):  # one program an SM, a multiple of VEC; no more than the rows need
        x = torch.empty(rows, 50257, dtype=torch.bfloat16)
        w = torch.empty(50257, dtype=torch.bfloat16)
        recorded_kernel.launches.clear()
        _layer_norm_held.launch_stream(x, w, w, torch.empty_like(x), torch.empty(rows), torch.empty(rows), 1e-5, SMS)
        (got, kwargs), = recorded_kernel.launches
        assert got == (grid,)
        assert (kwargs["NSEG"], kwargs["VEC"], kwargs["BLOCK"]) == (25, 8, 2048)
        assert kwargs["num_warps"] == _layer_norm_held.STREAM_WARPS and kwargs["maxnreg"] == 255
    x = torch.empty(40, 22001)
    recorded_kernel.launches.clear()
    _layer_norm_held.launch_stream(x, x[0], x[0], torch.empty_like(x), torch.empty(40), torch.empty(40), 1e-5, SMS)
    (got, kwargs), = recorded_kernel.launches
    assert got == (40,) and (kwargs["NSEG"], kwargs["VEC"]) == (11, 4)
    # narrower rows: stream_shape's programs an SM (12 of 2 warps at 2560), a multiple of VEC, and its registers
    x = torch.empty(5000, 2560, dtype=torch.bfloat16)
    recorded_kernel.launches.clear()
    _layer_norm_held.launch_stream(x, x[0], x[0], torch.empty_like(x), torch.empty(5000), torch.empty(5000), 1e-5, SMS)
    (got, kwargs), = recorded_kernel.launches
    assert got == (1584,)
    assert (kwargs["BLOCK"], kwargs["NSEG"], kwargs["num_warps"], kwargs["maxnreg"]) == (512, 5, 2, 80)


STREAM_FWD = [(torch.bfloat16, torch.bfloat16, 37409), (torch.float16, torch.float16, 50257),
              (torch.bfloat16, torch.bfloat16, 52899), (torch.bfloat16, torch.bfloat16, 40960),
              (torch.float32, torch.float32, 22001), (torch.float32, torch.float32, 24001),
              (torch.bfloat16, torch.float32, 24001), (torch.float16, torch.float16, 57337)]  # the widest


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 3, 301])
@pytest.mark.parametrize("dtype, pdtype, n", STREAM_FWD, ids=str)
def test_the_streamed_forward_matches_torch_and_writes_every_output_and_statistic(dtype, pdtype, n, rows):
    x = (torch.randn(rows, n, device="cuda") * 2 + 3).to(dtype)
    weight = torch.randn(n, device="cuda").to(pdtype)
    bias = torch.randn(n, device="cuda").to(pdtype)
    assert not layer_norm._held_forward(x, weight, bias, torch.empty_like(x))
    assert layer_norm._stream_forward(x, weight, bias, torch.empty_like(x))
    out = torch.full_like(x, float("nan"))
    y, mean, rstd = layer_norm.forward(x, weight, bias, out=out)
    assert_forward_matches(x, weight, bias, y, mean, rstd)


# Narrower rows on the streamed forward (_layer_norm_held.stream_shape's several programs an SM), launched directly at
# every shape it can take: aligned and ragged 16-bit and fp32 rows, one segment to eight (fp32 on 16 warps), fp32
# parameters of bf16 rows.
STREAM_NARROW = [(torch.bfloat16, torch.bfloat16, 384), (torch.float16, torch.float16, 1600),
                 (torch.bfloat16, torch.bfloat16, 2560), (torch.float16, torch.float16, 5120),
                 (torch.bfloat16, torch.bfloat16, 12288), (torch.bfloat16, torch.float32, 12288),
                 (torch.bfloat16, torch.bfloat16, 16384), (torch.bfloat16, torch.bfloat16, 999),
                 (torch.float16, torch.float16, 4097), (torch.bfloat16, torch.bfloat16, 16383),
                 (torch.float32, torch.float32, 1025), (torch.float32, torch.float32, 12288),
                 (torch.float32, torch.float32, 12345), (torch.float32, torch.float32, 16384),
                 (torch.float32, torch.float32, 9001), (torch.bfloat16, torch.bfloat16, 555),
                 (torch.float16, torch.float16, 1023), (torch.float32, torch.float32, 15001),
                 (torch.bfloat16, torch.bfloat16, 514), (torch.float16, torch.float16, 258)]  # even, one warp


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 3, 301, 5000])
@pytest.mark.parametrize("dtype, pdtype, n", STREAM_NARROW, ids=str)
def test_narrower_streamed_rows_match_torch_and_write_every_output_and_statistic(dtype, pdtype, n, rows):
    from reference_kernels import _layer_norm_held

    x, weight, bias = inputs((rows, n), dtype, pdtype=pdtype)
    y = torch.full_like(x, float("nan"))
    mean = torch.full((rows,), float("nan"), device="cuda")
    rstd = torch.full((rows,), float("nan"), device="cuda")
    assert _layer_norm_held.stream_shape(n, x.element_size(), _layer_norm_held.wb_bytes(weight, bias)).per_sm > 1 or (
        x.element_size() == 4 and n > 8192)
    _layer_norm_held.launch_stream(x, weight, bias, y, mean, rstd, 1e-5, torch.cuda.get_device_properties(0).multi_processor_count)
    assert_forward_matches(x, weight, bias, y, mean, rstd)


# The backward's held plan: x and dy held in shared memory with the weight (at the program's phase) and the program's
# float32 dweight/dbias shares, summed afterwards as every plan's shares are (_sum_shares).


def test_the_backward_holds_rows_in_shared_memory_only_where_the_phased_plan_does_not_take_them(monkeypatch):
    from reference_kernels import _layer_norm_held

    rule = functools.partial(layer_norm._held_bwd_default, t=TUNED)
    monkeypatch.setattr(_layer_norm_held, "tuned_triton", lambda: True)  # the Triton its register choices came from
    # 16-bit ragged rows under the phased plan's first width (1025) from 257, but the packed rows' widths (a multiple of
    # 4: the rows plan's compile-time width)
    assert [n for n in (255, 256, 257, 258, 322, 332, 333, 777, 998, 999, 1000, 1004, 1023) if rule(n, 2)] == [
        257, 258, 322, 333, 777, 998, 999, 1023]
    # past it, only rows wider than the phased plan holds (8192 lanes and a tail): 9001 on
    widths = (1025, 1030, 1900, 2049, 3001, 3072, 4097, 6001, 7001, 8191, 8192, 9001, 12345, 16383)
    assert [n for n in widths if rule(n, 2)] == [9001, 12345, 16383]
    assert not any(rule(n, 4) for n in (1025, 3001, 8191, 9001))  # fp32: not taken
    assert not any(rule(n, 2) for n in (1600, 3072, 5120, 10240))  # aligned rows: never
    # where the phased plan starts later (its default: past the rows plan's 4096), the held plan takes the rows before
    assert rule(3001, 2, t=dataclasses.replace(TUNED, phased_bwd_min_cols=((2, 4097), (4, 4097))))
    assert not rule(3001, 2, t=dataclasses.replace(TUNED, held_bwd_bands=()))
    assert not layer_norm._held_bwd_default(999, 2, layer_norm.Tuning())  # the defaults hold no row
    # bf16 widened by a shift or an AND in ragged rows; in aligned rows (compiled apart) from six segments
    widen = _layer_norm_held.bwd_widen
    assert [n for n in (2300, 3001, 3072, 5120, 5121, 6144) if widen(_layer_norm_held.bwd_shape(n, 2, 2), n)] == [
        2300, 3001, 5121, 6144]
    held_shapes(monkeypatch, bwd_reg_shares={3: 128})
    monkeypatch.setattr(_layer_norm_held, "tuned_triton", lambda: False)  # another Triton: in shared memory too
    assert not _layer_norm_held.bwd_shape(3001, 2, 2).reg_shares
    monkeypatch.setattr(_layer_norm_held, "tuned_triton", lambda: True)
    assert _layer_norm_held.bwd_shape(3001, 2, 2).reg_shares
    held_shapes(monkeypatch, bwd_reg_shares={1: 96, 2: 96, 3: 128, 4: 168, 5: 168, 6: 255})
    # the shape: 4 warps, segments of 1024 16-bit elements, two rows held at once where they fit (one past 12288
    # with 16-bit weights), programs an SM from shared memory and, with the shares in registers, from the registers
    # they need (Shapes.bwd_reg_shares: 3001's three segments 128 a thread, four programs; 5113's five 168, three), the
    # register file shared by them
    assert _layer_norm_held.bwd_shape(1025, 2, 2) == (2, 512, 3, 2, 8, 128, True)  # up to three 512-element segments
    assert _layer_norm_held.bwd_shape(1530, 2, 2) == (4, 1024, 2, 2, 5, 96, True)
    assert _layer_norm_held.bwd_shape(3001, 2, 2) == (4, 1024, 3, 2, 4, 128, True)
    assert _layer_norm_held.bwd_shape(5113, 2, 2) == (4, 1024, 5, 2, 3, 168, True)
    assert _layer_norm_held.bwd_shape(6001, 2, 2) == (4, 1024, 6, 2, 2, 255, True)
    assert _layer_norm_held.bwd_shape(7001, 2, 2) == (4, 1024, 7, 2, 1, 255, False)  # shares in shared memory
    assert _layer_norm_held.bwd_shape(12345, 2, 2) == (4, 1024, 13, 1, 1, 255, False)
    assert _layer_norm_held.bwd_shape(3001, 4, 4) == (4, 1024, 3, 2, 3, 168, True)  # fp32: two 16-byte vectors a thread
    assert _layer_norm_held.bwd_shape(16383, 2, 2).per_sm == 0
    assert _layer_norm_held.bwd_shape(333, 2, 2) == (2, 512, 1, 2, 10, 96, True)  # the narrowest: 2 warps still
    held_shapes(monkeypatch, bwd_reg_shares={})  # none in registers: 8 bytes more a column
    assert _layer_norm_held.bwd_shape(3001, 2, 2) == (4, 1024, 3, 2, 4, 128, False)
    assert _layer_norm_held.bwd_shape(5113, 2, 2) == (4, 1024, 5, 2, 2, 255, False)
    x, w = torch.empty(4, 3001, dtype=torch.bfloat16), torch.empty(3001, dtype=torch.bfloat16)
    # the programs: a multiple of the vector (one phase each), no more than the rows need
    assert _layer_norm_held.backward_programs(torch.empty(10000, 3001, dtype=torch.bfloat16), w, SMS) == 528
    assert _layer_norm_held.backward_programs(x, w, SMS) == 8


def test_the_backward_runs_its_other_plans_where_the_held_kernel_cannot(monkeypatch):
    from reference_kernels import _layer_norm_held

    if not torch.cuda.is_available():
        assert not _layer_norm_held.available()
    monkeypatch.setattr(_layer_norm_held, "available", lambda *args: True)
    tune(monkeypatch, held_bwd_bands={2: (8, 100), 4: (8, 100)})
    calls = []
    monkeypatch.setattr(_layer_norm_held, "launch_backward", lambda *args: calls.append(args))
    x, weight, bias = inputs((6, 41), torch.float32)
    dy = torch.randn_like(x)
    _, mean, rstd = layer_norm.forward(x[:, 1:], weight[1:], bias[1:])
    dx, dw, db = layer_norm.backward(dy[:, 1:], x[:, 1:], weight[1:], mean, rstd)  # a column slice: not packed
    assert not calls
    for what, a, e in zip(("dx", "dweight", "dbias"), (dx, dw, db),
                          torch_reference(x[:, 1:], weight[1:], bias[1:], dy[:, 1:])[1:]):
        assert_close(a, e, torch.float32, what, inputs=(x[:, 1:], weight[1:], dy[:, 1:]))


def test_the_held_backward_launcher_refuses_tensors_it_cannot_take_with_a_clear_error():
    from reference_kernels import _layer_norm_held

    x, weight, _ = inputs((3, 40), torch.float32, device="cpu")
    with pytest.raises(ValueError, match="packed, 16-byte aligned CUDA rows of x, dy and dx"):
        _layer_norm_held.launch_backward(x, x, weight, torch.empty(3), torch.empty(3), torch.empty_like(x), SMS)


HELD_BWD = [(torch.bfloat16, 1025), (torch.float16, 2049), (torch.bfloat16, 3001), (torch.bfloat16, 4097),
            (torch.float16, 5121), (torch.bfloat16, 8191), (torch.bfloat16, 12345), (torch.bfloat16, 6144),
            (torch.float32, 3001), (torch.float32, 1000),
            (torch.float16, 3072), (torch.bfloat16, 5120), (torch.bfloat16, 8176), (torch.bfloat16, 5128),
            (torch.bfloat16, 1600), (torch.bfloat16, 333), (torch.float16, 999), (torch.bfloat16, 1023),  # as above
            (torch.float16, 258), (torch.bfloat16, 322), (torch.bfloat16, 555)]


@pytest.fixture
def held_at_every_width(monkeypatch):
    """The held backward at whatever width a test gives it (its rule takes a few bands), aligned rows and fp32 too."""
    monkeypatch.setattr(layer_norm, "_held_bwd_default", lambda n_cols, elem_size, t=None: True)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 3, 301, 4099])
@pytest.mark.parametrize("dtype, n", HELD_BWD, ids=str)
def test_the_held_backward_matches_torch_and_writes_every_gradient(held_at_every_width, dtype, n, rows):
    x, weight, bias = inputs((rows, n), dtype)
    dy = torch.randn_like(x)
    _, mean, rstd = layer_norm.forward(x, weight, bias)
    assert layer_norm._held_backward(dy, x, weight, torch.empty_like(x))
    dx, dw, db = layer_norm.backward(dy, x, weight, mean, rstd)
    assert not dx.isnan().any() and not dw.isnan().any() and not db.isnan().any()
    for what, a, e in zip(("dx", "dweight", "dbias"), (dx, dw, db), torch_reference(x, weight, bias, dy)[1:]):
        assert_close(a, e, dtype, what, inputs=(x, weight, dy))


@pytest.mark.gpu
def test_the_held_backward_takes_float32_weights_and_keeps_a_neighbours_inf_out_of_a_row(held_at_every_width):
    # 16-bit rows with float32 parameters (autocast); then rows holding inf and nan at their ends, which the
    # aligned-down copies carry into their neighbours' shared memory: only the rows that hold them come out non-finite
    n = 4097
    x = (torch.randn(64, n, device="cuda") * 3 + 1).bfloat16()
    weight, bias = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    dy = torch.randn_like(x)
    _, mean, rstd = layer_norm.forward(x, weight, bias)
    assert layer_norm._held_backward(dy, x, weight, torch.empty_like(x))
    dx, dw, db = layer_norm.backward(dy, x, weight, mean, rstd, bias_dtype=torch.float32)
    for what, a, e in zip(("dx", "dweight", "dbias"), (dx, dw, db), torch_reference(x, weight, bias, dy)[1:]):
        assert_close(a, e, torch.bfloat16, what, inputs=(x, weight, dy))
    x[10, -1], dy[10, -1], x[20, 0], dy[20, 0] = float("inf"), float("nan"), float("nan"), float("inf")
    dx = layer_norm.backward(dy, x, weight, mean, rstd)[0]
    finite = dx.isfinite().all(-1)
    assert finite.sum() == 62 and not finite[10] and not finite[20]
