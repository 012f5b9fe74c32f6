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
    ours = [k for k in report.kernels if k.name.startswith(prefix)]
    assert ours, str(report)  # the op's launches are the kernels
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
    torch.compile(step)(x, w, b).backward()  # the backward op through register_autograd
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
