"""The regression this plugin exists for: a debugging print inside a compiled chain.

The first test is the code as it should be; the second is the same code after someone
added a ``print``. It is marked ``xfail(strict=True)`` so the demo passes while showing
the failure a CI run would report: the graph break with its line, and the chain split
into two kernels.
"""

import pytest
import torch

from pytest_fusioncheck import FusionAssertionError


def bias_gelu(x, b):
    y = x + b
    return torch.nn.functional.gelu(y)


def bias_gelu_with_debug_print(x, b):
    y = x + b
    print("y stats", y.shape)
    return torch.nn.functional.gelu(y)


@pytest.fixture
def inputs(fusion):
    return torch.randn(1024, 1024, device=fusion.device), torch.randn(1024, device=fusion.device)


@pytest.mark.no_graph_breaks
@pytest.mark.max_kernels(1)
def test_bias_gelu_is_one_kernel(fusion, inputs):
    fusion.profile(torch.compile(bias_gelu), *inputs)
    fusion.assert_hbm_bytes_within()


@pytest.mark.xfail(strict=True, raises=FusionAssertionError, reason="the demo of a regression: a print splits the fused kernel")
@pytest.mark.max_kernels(1)
def test_a_debug_print_splits_the_kernel(fusion, inputs):
    fusion.profile(torch.compile(bias_gelu_with_debug_print), *inputs)
