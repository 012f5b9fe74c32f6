"""A transformer MLP block, eager and compiled: the kernel counts to pin in CI."""

import itertools

import pytest
import torch


class MLP(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = torch.nn.LayerNorm(d)
        self.up = torch.nn.Linear(d, 4 * d)
        self.down = torch.nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


@pytest.fixture
def block(fusion):
    torch.manual_seed(0)
    return MLP(256).to(fusion.device)


@pytest.fixture
def x(fusion):
    return torch.randn(64, 256, device=fusion.device)


EAGER_OPS = ["aten::native_layer_norm", "aten::addmm", "aten::gelu", "aten::addmm", "aten::add"]


# On the H200, cuBLAS runs the second GEMM (64x256x1024) as split-K: a GEMM plus a reduce.
@pytest.mark.max_kernels(cpu=5, cuda=6)
def test_eager_mlp_launches_norm_gemm_gelu_gemm_add(fusion, block, x):
    report = fusion.profile(block, x)
    ops = [k.op for k in report.kernels]
    if fusion.device == "cpu":
        assert ops == EAGER_OPS
    else:  # a GEMM may launch several kernels (split-K: GEMM + reduce), each attributed to its addmm
        assert [op for op, _ in itertools.groupby(ops)] == EAGER_OPS, str(report)


@pytest.mark.no_graph_breaks
# Compiled, the bias adds fuse into the Triton kernels after each GEMM; on the H200 the
# first mm runs as two cuBLAS kernels and the second as split-K (GEMM + reduce).
@pytest.mark.max_kernels(cpu=5, cuda=7)
def test_compiled_mlp_fuses_the_elementwise_work_around_the_gemms(fusion, block, x):
    compiled = torch.compile(block)
    with torch.no_grad():
        fusion.profile(compiled, x)
        fusion.assert_matches_reference(compiled, block, x, rtol=1e-4, atol=1e-4)
