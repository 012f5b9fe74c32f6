"""The reference kernels as a user would pin them: one kernel, at the byte budget, right.

On a GPU the Triton kernels run for real; without one they run under Triton's
interpreter (small shapes), where each launch counts as one kernel.
"""

import pytest
import torch

from reference_kernels import SUBJECTS, load


def inputs(name, device):
    big = device == "cuda"
    torch.manual_seed(0)
    if name == "softmax":
        return (torch.randn(8192 if big else 64, 4096 if big else 1000, device=device),), {}
    if name == "layer_norm":
        n = 4096 if big else 1000
        x = torch.randn(8192 if big else 64, n, device=device)
        return (x, torch.randn(n, device=device), torch.randn(n, device=device)), {}
    if name == "gemm_epilogue":
        m, n, k = (4096, 4096, 4096) if big else (64, 80, 96)
        a = torch.randn(m, k, device=device, dtype=torch.bfloat16)
        b = torch.randn(k, n, device=device, dtype=torch.bfloat16)
        return (a, b), {"bias": torch.randn(n, device=device, dtype=torch.bfloat16), "activation": "gelu"}
    if name == "attention":
        shape = (2, 8, 2048, 64) if big else (1, 2, 40, 64)
        dtype = torch.bfloat16 if big else torch.float32
        q, k, v = (torch.randn(shape, device=device, dtype=dtype) for _ in range(3))
        return (q, k, v), {"causal": True}
    x = torch.randn(8192 if big else 64, 8192 if big else 256, device=device, dtype=torch.bfloat16)
    return (x, torch.randn(x.shape[-1], device=device, dtype=torch.bfloat16)), {"p": 0.1, "seed": 1234}


@pytest.mark.parametrize("name", SUBJECTS)
@pytest.mark.max_kernels(1)
def test_the_fused_kernel_is_one_launch_within_its_byte_budget_and_matches_the_unfused_code(fusion, name):
    subject = load(name)
    args, kwargs = inputs(name, fusion.device)
    with torch.no_grad():
        fusion.profile(subject.fused, *args, **kwargs)
        fusion.assert_hbm_bytes_within(subject.budget(*args, **kwargs), slack=1.01)
        fusion.assert_matches_reference(subject.fused, subject.unfused, *args, **kwargs)


@pytest.mark.parametrize("name", ["softmax", "layer_norm", "attention"])
def test_the_unfused_code_moves_what_its_line_comments_add_up_to(fusion, name):
    subject = load(name)
    args, kwargs = inputs(name, fusion.device)
    with torch.no_grad():
        report = fusion.profile(subject.unfused, *args, **kwargs)
    assert report.kernel_count > 1
    expected = subject.unfused_traffic(*args, **kwargs).total
    assert abs(report.bytes - expected) <= 0.01 * expected, str(report)
