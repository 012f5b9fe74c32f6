"""The reference kernels under torch.compile: each public call is its subject's opaque op (``reference_kernels::*``),
so a compiled model that calls one neither breaks its graph nor traces into the launch path, computes what the
eager call computes, and the plugin counts the op's kernels, not the op besides them.

Without a GPU the ops run their kernels under Triton's interpreter (tests/conftest.py), small shapes."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

from pytest_fusioncheck import profile
from reference_kernels import attention, bias_gelu_dropout, gemm_epilogue, layer_norm, softmax

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's masked-off lanes

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _inputs(*shapes, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(s, generator=g).to(DEVICE, dtype) for s in shapes]


# (subject, a model's use of it, its inputs, the kernel-name prefix its launches carry)
CASES = {
    "softmax": (lambda x: softmax.fused(x) * 2, lambda: _inputs((4, 96)), "_softmax"),
    "layer_norm": (lambda x, w, b: layer_norm.fused(x, w, b) * 2, lambda: _inputs((4, 96), (96,), (96,)), "_layer_norm"),
    "bias_gelu_dropout": (lambda x, b: bias_gelu_dropout.fused(x, b, 0.1, 3) + 1, lambda: _inputs((4, 96), (96,)),
                          "_bias_gelu_dropout"),
    "gemm_epilogue": (lambda a, w, b: gemm_epilogue.fused(a, w, b) + 1, lambda: _inputs((8, 32), (32, 16), (16,)),
                      "_gemm"),
    "attention": (lambda q, k, v: attention.fused(q, k, v, causal=True) * 2, lambda: _inputs(*[(1, 2, 37, 64)] * 3),
                  "_attention"),
}


@pytest.mark.parametrize("subject", sorted(CASES))
def test_a_compiled_call_matches_the_eager_one_without_a_graph_break_and_counts_its_kernels_once(subject):
    fn, make, prefix = CASES[subject]
    args = make()
    expected = fn(*args)
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(fn)
    report = profile(compiled, *args)
    torch.testing.assert_close(compiled(*args), expected, atol=1e-5, rtol=1e-5)
    assert not counters["graph_break"], dict(counters["graph_break"])
    # the op's launches are the kernels: ours, or the library's where the GEMM's plan timed cuBLAS faster (on CUDA)
    ours = [k for k in report.kernels if k.name.startswith(prefix) or k.op == f"reference_kernels::{subject}"]
    assert ours, str(report)
    assert not [k for k in report.kernels if k.name.endswith("::" + subject)], str(report)
    assert report.counts_complete, report.notes()


def test_a_compiled_training_step_through_the_fused_layer_norm_gives_the_eager_gradients():
    x, w, b = (t.requires_grad_() for t in _inputs((4, 96), (96,), (96,)))

    def step(x, w, b):
        return (layer_norm.fused(x, w, b) ** 2).sum()

    step(x, w, b).backward()
    eager = [t.grad.clone() for t in (x, w, b)]
    for t in (x, w, b):
        t.grad = None
    torch._dynamo.reset()
    counters.clear()
    torch.compile(step)(x, w, b).backward()  # the backward op, traced from the autograd.Function
    assert not counters["graph_break"], dict(counters["graph_break"])
    for got, want in zip((x.grad, w.grad, b.grad), eager):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_a_compiled_call_writes_out_and_refuses_plan_overrides():
    (x,) = _inputs((4, 96))
    out = torch.empty_like(x)
    torch._dynamo.reset()
    got = torch.compile(lambda x, out: softmax.fused(x, out=out))(x, out)
    torch.testing.assert_close(out, softmax.fused(x))
    assert got.data_ptr() == out.data_ptr()
    torch._dynamo.reset()
    with pytest.raises(Exception, match="max_row= is for eager calls"):
        torch.compile(lambda x: softmax.fused(x, max_row=32), fullgraph=True)(x)


def _op_cases():
    """(op, arguments) of every op the subjects define, small enough for the interpreter."""
    x, w, b, dy = _inputs((4, 32), (32,), (32,), (4, 32))
    _, mean, rstd = layer_norm.forward(x, w, b)
    q = _inputs((1, 2, 16, 64))[0]
    ops = torch.ops.reference_kernels
    return {
        "softmax": (ops.softmax.default, (x,)),
        "layer_norm": (ops.layer_norm.default, (x, w, b, 1e-5)),
        "layer_norm_backward": (ops.layer_norm_backward.default, (dy, x, w, mean, rstd, None)),
        "bias_gelu_dropout": (ops.bias_gelu_dropout.default, (x, b, 0.1, 3, "none")),
        "gemm_epilogue": (ops.gemm_epilogue.default, (x, *_inputs((32, 16), (16,)), "gelu", None, "none")),
        "attention": (ops.attention.default, (q, q, q, True, None)),
    }


@pytest.mark.parametrize("name", ["softmax", "layer_norm", "layer_norm_backward", "bias_gelu_dropout", "gemm_epilogue",
                                  "attention"])
def test_every_op_passes_torch_library_opcheck(name):
    """Schema, fake outputs, autograd registration and AOT dispatch agree with what the op computes."""
    op, args = _op_cases()[name]
    results = torch.library.opcheck(op, args)
    assert set(results.values()) == {"SUCCESS"}, results


@pytest.mark.parametrize("name", ["softmax", "layer_norm", "layer_norm_backward", "bias_gelu_dropout", "gemm_epilogue",
                                  "attention", "no_backward"])
def test_every_op_lets_autograd_fall_through_to_its_implementation(name):
    """No Python kernel between the dispatcher and the op's implementation (a compiled graph's call would pay ~3 us for
    one on CI's host, benchmarks/bench_ops.py): what autograd records is the public call's (the cases below)."""
    table = torch._C._dispatch_dump(f"reference_kernels::{name}")
    autograd = [line for line in table.splitlines() if line.startswith("Autograd")]
    assert autograd and all("fallthrough" in line for line in autograd), table


# (subject, a call whose first argument a model's parameter may be, its other inputs, the name its backward error
# says, the kernel-name prefix its launches carry)
NO_BACKWARD = {
    "softmax": (lambda p: softmax.fused(p), lambda: (), "softmax", "_softmax"),
    "layer_norm.forward with max_row": (lambda p, x: layer_norm.forward(x, p, p, max_row=128)[0],
                                        lambda: _inputs((4, 96)), "layer_norm.forward", "_layer_norm"),
    "bias_gelu_dropout": (lambda p, x: bias_gelu_dropout.fused(x, p, 0.1, 3), lambda: _inputs((4, 96)),
                          "bias_gelu_dropout", "_bias_gelu_dropout"),
    "gemm_epilogue": (lambda p, x: gemm_epilogue.fused(x, p.view(96, 1).expand(96, 16).contiguous()),
                      lambda: _inputs((8, 96)), "gemm_epilogue", "_gemm"),
    "attention": (lambda p, x: attention.fused(x, x, p.view(1, 1, 96, 1).expand(1, 2, 96, 64)), lambda: _inputs(
        (1, 2, 96, 64)), "attention", "_attention"),
}


@pytest.mark.parametrize("subject,compiled", [
    pytest.param(s, c, id=f"{s}-{'compiled' if c else 'eager'}") for s in sorted(NO_BACKWARD) for c in (False, True)
    if not (c and "max_row" in s)])  # plan overrides are eager only (..._refuses_plan_overrides)
def test_a_call_with_no_backward_runs_on_a_parameter_and_raises_only_when_a_gradient_reaches_it(subject, compiled):
    """A model whose weights require grad calls an inference kernel outside torch.no_grad(): the forward runs (a
    compiled one too: it used to fail to compile), and a backward through the call raises, naming it; the eager
    output used to take no gradient silently."""
    fn, make, name, prefix = NO_BACKWARD[subject]
    param = torch.nn.Parameter(_inputs((96,))[0])
    others = make()
    torch._dynamo.reset()
    call = torch.compile(fn) if compiled else fn
    report = profile(call, param, *others)  # the plugin through it (compiled inside): its kernels counted, none unseen
    # ours, or cuBLAS's where the GEMM's plan timed the library faster (on CUDA: gemmSN_NN_kernel, sm90_xmma_gemm_...)
    ours = [k for k in report.kernels if k.name.startswith(prefix) or (prefix == "_gemm" and "gemm" in k.name)]
    assert ours, str(report)
    assert report.counts_complete, report.notes()
    with torch.no_grad():
        expected = fn(param, *others)
    got = call(param, *others)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert got.requires_grad
    with pytest.raises(RuntimeError, match=f"{name}.* has no backward"):
        got.sum().backward()
    assert param.grad is None
    with torch.no_grad():
        assert not call(param, *others).requires_grad
    plain = param.detach()
    assert not call(plain, *others).requires_grad


def test_the_layer_norm_backward_differentiates_once():
    """layer_norm.fused has a backward; a double backward through the backward kernel raises, naming it."""
    x, w, b = (t.requires_grad_() for t in _inputs((4, 96), (96,), (96,)))
    (gx,) = torch.autograd.grad(layer_norm.fused(x, w, b).pow(2).sum(), x, create_graph=True)
    assert gx.requires_grad
    with pytest.raises(RuntimeError, match="layer_norm.backward has no backward"):
        gx.sum().backward()


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_layer_norm_forward_differentiates_where_autograd_asks_as_the_fused_layer_norm_does(compiled):
    x, w, b = (t.requires_grad_() for t in _inputs((4, 96), (96,), (96,)))
    (layer_norm.fused(x, w, b) ** 2).sum().backward()
    expected = [t.grad.clone() for t in (x, w, b)]
    for t in (x, w, b):
        t.grad = None
    torch._dynamo.reset()
    fn = lambda x, w, b: (layer_norm.forward(x, w, b)[0] ** 2).sum()  # noqa: E731
    (torch.compile(fn) if compiled else fn)(x, w, b).backward()
    for got, want in zip((x.grad, w.grad, b.grad), expected):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
