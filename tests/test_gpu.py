"""The plugin on a real GPU: kernel counts, bytes, bandwidth and graph breaks on CUDA.

Run on the device: ``PYTHONPATH=$PWD python3 -m pytest -p pytest_fusioncheck.plugin -m gpu tests/test_gpu.py``.
"""

import pytest
import torch

from pytest_fusioncheck import Budget, assert_bandwidth_bound_within, profile

pytestmark = pytest.mark.gpu

MiB = 2**20


def five_op_softmax(x):
    m = x.max(dim=-1, keepdim=True).values  # read MN ; write M
    z = x - m  # read MN + M ; write MN
    e = z.exp()  # read MN ; write MN
    s = e.sum(dim=-1, keepdim=True)  # read MN ; write M
    return e / s  # read MN + M ; write MN


def bias_gelu(x, b):
    return torch.nn.functional.gelu(x + b)


def bias_print_gelu(x, b):
    y = x + b
    print("debugging", y.shape)
    return torch.nn.functional.gelu(y)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_five_op_softmax_launches_five_kernels_on_cuda():
    report = profile(five_op_softmax, torch.randn(256, 1024, device="cuda"))
    assert report.kernel_count == 5, str(report)
    assert [k.op for k in report.kernels] == ["aten::max", "aten::sub", "aten::exp", "aten::sum", "aten::div"]
    assert all(k.source and k.source.startswith("tests/test_gpu.py:") for k in report.kernels)


def test_torch_softmax_launches_one_kernel_on_cuda():
    report = profile(lambda x: torch.softmax(x, -1), torch.randn(256, 1024, device="cuda"))
    assert report.kernel_count == 1, str(report)


def test_compiled_bias_gelu_is_one_triton_kernel_on_cuda():
    chain = torch.compile(bias_gelu)
    report = profile(chain, torch.randn(256, 1024, device="cuda"), torch.randn(1024, device="cuda"))
    assert report.kernel_count == 1, str(report)
    assert report.kernels[0].name.startswith("triton_"), str(report)
    assert report.kernels[0].bytes == 256 * 1024 * 4 * 2 + 1024 * 4, str(report)


def test_a_print_splits_the_compiled_chain_into_two_triton_kernels_and_names_the_line():
    chain = torch.compile(bias_print_gelu)
    report = profile(chain, torch.randn(256, 1024, device="cuda"), torch.randn(1024, device="cuda"))
    assert report.kernel_count == 2, str(report)
    assert all(k.name.startswith("triton_") for k in report.kernels), str(report)
    assert report.graph_breaks, "the print's graph break was not recorded"
    assert any(b.location.endswith(f"test_gpu.py:{bias_print_gelu.__code__.co_firstlineno + 2}") for b in report.graph_breaks)


def test_modelled_bytes_of_a_4096_square_softmax_are_512_mib_unfused_and_128_mib_fused():
    x = torch.randn(4096, 4096, device="cuda")
    unfused = profile(five_op_softmax, x)
    fused = profile(lambda t: torch.softmax(t, -1), x)
    assert abs(unfused.bytes - 512 * MiB) / (512 * MiB) < 0.01
    assert fused.bytes == 128 * MiB
    assert fused.budget.total == 128 * MiB


def test_a_large_copy_is_bandwidth_bound_and_the_five_op_softmax_is_not():
    x = torch.randn(64 * MiB, device="cuda")  # 256 MiB, several times the L2
    y = torch.empty_like(x)
    report = profile(torch.Tensor.copy_, y, x)
    report.budget = Budget.from_tensors(reads=[x], writes=[y])
    assert_bandwidth_bound_within(0.8, report=report)

    s = torch.randn(8192, 8192, device="cuda")
    unfused = profile(five_op_softmax, s)  # default budget: the fused one (read x, write y)
    with pytest.raises(AssertionError, match="of peak bandwidth < required 80%"):
        assert_bandwidth_bound_within(0.8, report=unfused)


def test_the_plugin_counts_the_same_kernels_under_pytest_on_cuda(pytester):
    from conftest import PLUGIN_ARGS

    pytester.makepyfile(
        """
import pytest, torch

def five(x):
    m = x.max(dim=-1, keepdim=True).values
    e = (x - m).exp()
    return e / e.sum(dim=-1, keepdim=True)

@pytest.mark.max_kernels(1)
def test_unfused(fusion):
    assert fusion.device == "cuda"
    fusion.profile(five, torch.randn(64, 64, device=fusion.device))

@pytest.mark.max_kernels(1)
def test_fused(fusion):
    fusion.profile(torch.softmax, torch.randn(64, 64, device=fusion.device), -1)
"""
    )
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", *PLUGIN_ARGS)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*5 kernels launched, limit 1*"])


def test_counters_fill_measured_bytes_from_ncu_within_ten_percent_of_the_model(pytester):
    from conftest import PLUGIN_ARGS

    pytester.makepyfile(
        """
import torch

def test_softmax_bytes(fusion):
    x = torch.randn(16384, 8192, device="cuda")  # 512 MiB: writes cannot hide in the L2
    r = fusion.profile(torch.softmax, x, -1)
    assert r.kernel_count == 1
    assert r.bytes_measured is not None, r.warnings
    assert abs(r.bytes_measured - r.bytes) / r.bytes < 0.10, str(r)
    fusion.assert_hbm_bytes_within(slack=1.1)
"""
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", *PLUGIN_ARGS, "--fusion-counters=ncu", "--fusion-report", timeout=400)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*1 kernel, 1.0 GiB modelled, * measured, budget 1.0 GiB*"])
    result.stdout.fnmatch_lines(["*fusioncheck: ncu measured 1 kernels in 1 test(s)*"])
