"""Modelled bytes, budgets and the byte/bandwidth assertions (CPU)."""

import pytest
import torch

from pytest_fusioncheck import Budget, FusionAssertionError, assert_bandwidth_bound_within, assert_hbm_bytes_within, profile
from pytest_fusioncheck.budget import distinct_bytes, format_bytes, parse_bytes
from pytest_fusioncheck.ops import op_traffic

MiB = 2**20


def five_op_softmax(x):
    m = x.max(dim=-1, keepdim=True).values
    z = x - m
    e = z.exp()
    s = e.sum(dim=-1, keepdim=True)
    return e / s


@pytest.fixture(scope="module")
def square():
    return torch.randn(4096, 4096)


def test_the_five_op_4096_square_softmax_models_512_mib_within_one_percent(square):
    report = profile(five_op_softmax, square)
    assert report.kernel_count == 5
    assert abs(report.bytes - 512 * MiB) / (512 * MiB) < 0.01
    assert report.bytes > 512 * MiB  # the row vectors add a little


def test_torch_softmax_models_128_mib_and_the_default_budget_is_128_mib(square):
    report = profile(lambda x: torch.softmax(x, -1), square)
    assert report.bytes == 128 * MiB
    assert report.budget.total == 128 * MiB
    assert report.budget.read_bytes == report.budget.write_bytes == 64 * MiB


def test_the_default_budget_counts_module_parameters_and_each_storage_once():
    lin = torch.nn.Linear(8, 8)
    x = torch.randn(2, 8)
    report = profile(lambda m, a, b: m(a) + b, lin, x, x)  # x passed twice: read once
    params = (8 * 8 + 8) * 4
    assert report.budget.read_bytes == params + x.numel() * 4
    assert report.budget.write_bytes == 2 * 8 * 4


def test_a_compiled_chains_bytes_equal_inductors_own_estimate():
    from torch._inductor import metrics

    torch._dynamo.reset()
    metrics.reset()
    torch._logging.set_logs(inductor_metrics=True)
    try:
        chain = torch.compile(lambda x, b: torch.nn.functional.gelu(x + b))
        report = profile(chain, torch.randn(64, 128), torch.randn(128))
    finally:
        torch._logging.set_logs()
    assert report.kernel_count == 1
    assert metrics.num_bytes_accessed > 0
    assert report.bytes == metrics.num_bytes_accessed
    assert report.bytes == (64 * 128 * 2 + 128) * 4  # read x, b; write y


def test_in_place_ops_read_and_write_self_and_out_buffers_are_written_only():
    x, y, out = torch.randn(16), torch.randn(16), torch.empty(16)
    assert op_traffic(torch.ops.aten.add_.Tensor, (x, y), {}, x) == (128, 64)
    assert op_traffic(torch.ops.aten.add.out, (x, y), {"out": out}, out) == (128, 64)
    assert op_traffic(torch.ops.aten.add.Tensor, (x, x), {}, torch.empty(16)) == (64, 64)


def test_distinct_bytes_counts_views_of_one_storage_once_and_expanded_tensors_by_storage():
    base = torch.randn(100)
    assert distinct_bytes([base, base[:50], base[10:20]]) == 400
    assert distinct_bytes([base[:50], base[50:]]) == 400
    assert distinct_bytes([torch.randn(1, 16).expand(1000, 16)]) == 64
    assert distinct_bytes([torch.randn(8, 8)[:, 0]]) == 32  # a strided column: its elements


def test_budget_arithmetic_and_validation():
    a = Budget(read_bytes=10, write_bytes=5, label="a")
    b = Budget(read_bytes=1, write_bytes=2)
    assert (a + b).total == 18 and (a + b).read_bytes == 11
    assert Budget.from_tensors(reads=[torch.empty(4)], writes=[torch.empty(2, dtype=torch.float16)]).total == 20
    with pytest.raises(ValueError, match="read_bytes must be a non-negative int"):
        Budget(read_bytes=-1)
    assert "15 B" in str(a)


@pytest.mark.parametrize(
    "text, value",
    [(1024, 1024), ("128 MiB", 128 * MiB), ("1.5GB", 1_500_000_000), ("2 KiB", 2048), ("7", 7), ("1e3 B", 1000)],
)
def test_byte_strings_parse(text, value):
    assert parse_bytes(text) == value


@pytest.mark.parametrize("bad", ["12 parsecs", "", "MiB", -3, True, None, "1.5 XB"])
def test_bad_byte_strings_give_a_clear_error(bad):
    with pytest.raises(ValueError, match="byte count"):
        parse_bytes(bad)


def test_format_bytes_picks_binary_units():
    assert format_bytes(128 * MiB) == "128.0 MiB"
    assert format_bytes(512) == "512 B"


def test_assert_hbm_bytes_within_names_the_kernels_that_move_the_excess(square):
    report = profile(five_op_softmax, square)
    with pytest.raises(FusionAssertionError) as info:
        assert_hbm_bytes_within()
    message = str(info.value)
    assert "assert_hbm_bytes_within: 512.1 MiB modelled > budget 128.0 MiB (excess 384.1 MiB, 4.00x)" in message
    assert "kernels by bytes (share of the budget):" in message
    assert "aten::sub: 128.0 MiB (100%)" in message
    assert_hbm_bytes_within(slack=4.01, report=report)
    assert_hbm_bytes_within("600 MiB")


def test_bandwidth_on_cpu_is_reported_not_enforced(square):
    report = profile(five_op_softmax, square)
    report.peak_bandwidth = 1e15  # nothing on a CPU reaches this
    assert_bandwidth_bound_within(0.9)
    assert report.efficiency is not None and report.efficiency < 0.9
    from pytest_fusioncheck.state import current_log

    assert any("reported, not enforced" in note for note in current_log().notes_for(report))
    assert "median wall time of" in report.median_source and report.time_source == "wall time of the profiled call's kernels"


MARKED = """
import pytest, torch

def five(x):
    m = x.max(dim=-1, keepdim=True).values
    e = (x - m).exp()
    return e / e.sum(dim=-1, keepdim=True)

@pytest.mark.max_hbm_bytes("1 MiB")
def test_fits(fusion):
    fusion.profile(torch.softmax, torch.randn(256, 256), -1)   # 512 KiB

@pytest.mark.max_hbm_bytes("1 MiB")
def test_does_not_fit(fusion):
    fusion.profile(five, torch.randn(256, 256))               # ~2 MiB

@pytest.mark.bandwidth_bound(0.99)
def test_cpu_timing_is_not_enforced(fusion):
    fusion.profile(five, torch.randn(256, 256))
"""


def test_max_hbm_bytes_passes_and_fails_with_the_per_kernel_excess(run_pytest, pytester):
    pytester.makepyfile(MARKED)
    result = run_pytest("--fusion-peak-bandwidth", "1e15")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*@pytest.mark.max_hbm_bytes(1048576): 2.0 MiB modelled > limit 1.0 MiB (excess 1.0 MiB, 2.01x)*",
            "*kernels by bytes (share of the budget):*",
            "*#1 aten::sub: 513.0 KiB (50%)*",
        ]
    )


def test_enforce_cpu_timing_makes_a_slow_cpu_kernel_fail(run_pytest, pytester):
    pytester.makepyfile(MARKED)
    result = run_pytest("--fusion-peak-bandwidth", "1e15", "--fusion-enforce-cpu-timing", "-k", "not_enforced")
    result.assert_outcomes(failed=1, deselected=2)
    result.stdout.fnmatch_lines(["*bandwidth_bound(0.99): *% of peak bandwidth < required 99%*"])


def test_a_bad_peak_bandwidth_option_is_a_usage_error(run_pytest, pytester):
    pytester.makepyfile(MARKED)
    result = run_pytest("--fusion-peak-bandwidth", "fast")
    assert result.ret != 0
    result.stderr.fnmatch_lines(["*--fusion-peak-bandwidth: cannot read 'fast'*"])
