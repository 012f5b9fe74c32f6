"""pytest-benchmark and fusioncheck in one call: timings with the fusion figures beside them.

``fusion.benchmark(fn, *args)`` profiles the call (kernels, bytes, budget, device time),
then times it with pytest-benchmark (each call synchronised on a GPU) and stores the
fusion figures in the benchmark's ``extra_info``: ``pytest examples --benchmark-json=b.json``
writes them next to the timings, and ``pytest-benchmark compare`` shows them.
"""

import pytest
import torch

pytest.importorskip("pytest_benchmark")


def bias_gelu(x, b):
    return torch.nn.functional.gelu(x + b)


@pytest.mark.max_kernels(1)
def test_the_compiled_bias_gelu_is_one_kernel_and_its_timing_carries_the_figures(fusion, benchmark):
    rows = 16384 if fusion.device == "cuda" else 256
    x = torch.randn(rows, 4096, device=fusion.device)
    b = torch.randn(4096, device=fusion.device)
    chain = torch.compile(bias_gelu)
    report = fusion.benchmark(chain, x, b)
    assert benchmark.extra_info["fusioncheck.kernels"] == report.kernel_count == 1
    fusion.assert_hbm_bytes_within(slack=1.01)
