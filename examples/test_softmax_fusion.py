"""A softmax written five ways, and what the plugin says about each.

Run with ``make demo`` (or ``pytest examples --fusion-report``) to see every kernel table.
"""

import pytest
import torch

from pytest_fusioncheck import FusionAssertionError


def softmax_five_ops(x):
    m = x.max(dim=-1, keepdim=True).values  # read MN ; write M
    z = x - m  # read MN + M ; write MN
    e = z.exp()  # read MN ; write MN
    s = e.sum(dim=-1, keepdim=True)  # read MN ; write M
    return e / s  # read MN + M ; write MN


@pytest.fixture
def x(fusion):
    rows = 8192 if fusion.device == "cuda" else 512  # on a GPU: 128 MiB, twice the L2
    return torch.randn(rows, 4096, device=fusion.device)


@pytest.mark.max_kernels(1)
@pytest.mark.bandwidth_bound(0.5)
def test_torch_softmax_is_one_kernel_at_the_byte_budget(fusion, x):
    fusion.profile(torch.softmax, x, -1)
    fusion.assert_hbm_bytes_within()  # default budget: read x once, write y once


@pytest.mark.no_graph_breaks
@pytest.mark.max_kernels(1)
def test_compiling_the_five_ops_fuses_them(fusion, x):
    compiled = torch.compile(softmax_five_ops)
    fusion.profile(compiled, x)
    fusion.assert_hbm_bytes_within(slack=1.01)
    fusion.assert_matches_reference(compiled, softmax_five_ops, x)


@pytest.mark.xfail(strict=True, raises=FusionAssertionError, reason="the demo of a failure: five kernels, four times the bytes")
@pytest.mark.max_kernels(1)
def test_the_eager_five_op_softmax_is_not_fused(fusion, x):
    fusion.profile(softmax_five_ops, x)
    fusion.assert_hbm_bytes_within()
