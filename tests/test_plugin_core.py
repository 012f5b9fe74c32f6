"""Plugin behaviour as a user sees it: pytester runs of small user test files (CPU)."""

import pytest

FIVE_OP_SOFTMAX = """
import pytest, torch

def five_op_softmax(x):
    m = x.max(dim=-1, keepdim=True).values
    z = x - m
    e = z.exp()
    s = e.sum(dim=-1, keepdim=True)
    return e / s
"""


from conftest import PLUGIN_ARGS


def run(pytester, *args):
    return pytester.runpytest_inprocess("-p", "no:cacheprovider", *PLUGIN_ARGS, *args)


def test_five_op_softmax_counts_five_kernels_and_fails_max_kernels_1_listing_them(pytester):
    pytester.makepyfile(
        FIVE_OP_SOFTMAX
        + """
@pytest.mark.max_kernels(1)
def test_softmax_is_fused(fusion):
    report = fusion.profile(five_op_softmax, torch.randn(64, 128))
    assert report.kernel_count == 5
"""
    )
    result = run(pytester)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*@pytest.mark.max_kernels(1): 5 kernels launched, limit 1*",
            "*#*kernel*time*bytes*op*source*",
            "*0*aten::max*test_five_op_softmax_counts_five_kernels_and_fails_max_kernels_1_listing_them.py:4*",
            "*1*aten::sub*.py:5*",
            "*2*aten::exp*.py:6*",
            "*3*aten::sum*.py:7*",
            "*4*aten::div*.py:8*",
        ]
    )


def test_torch_softmax_passes_max_kernels_1(pytester):
    pytester.makepyfile(
        """
import pytest, torch

@pytest.mark.max_kernels(1)
def test_fused(fusion):
    report = fusion.profile(lambda x: torch.softmax(x, -1), torch.randn(64, 128))
    assert [k.op for k in report.kernels] == ["aten::_softmax"]
"""
    )
    run(pytester).assert_outcomes(passed=1)


def test_a_compiled_bias_gelu_chain_counts_one_inductor_kernel_on_cpu(pytester):
    pytester.makepyfile(
        """
import pytest, torch

def bias_gelu(x, b):
    return torch.nn.functional.gelu(x + b)

@pytest.mark.max_kernels(1)
def test_chain(fusion):
    chain = torch.compile(bias_gelu)
    report = fusion.profile(chain, torch.randn(32, 64), torch.randn(64))
    assert report.kernel_count == 1
    assert report.kernels[0].name.startswith("cpp_fused_add_gelu")
    assert report.kernels[0].op == "fused: add, gelu"
"""
    )
    run(pytester).assert_outcomes(passed=1)


def test_marker_only_mode_profiles_the_test_body_after_a_warmup_call(pytester):
    pytester.makepyfile(
        FIVE_OP_SOFTMAX
        + """
@pytest.fixture
def x():
    return torch.randn(8, 16)  # made in the fixture: not part of the profiled body

@pytest.mark.max_kernels(5)
def test_five_fit_in_five(x):
    with open("calls.txt", "a") as fh:  # a file, not module state: any test order
        fh.write("call\\n")
    five_op_softmax(x)

@pytest.mark.max_kernels(4)
def test_five_do_not_fit_in_four(x):
    five_op_softmax(x)

@pytest.mark.max_kernels(5)
def test_making_the_input_in_the_body_is_a_sixth_kernel():
    five_op_softmax(torch.randn(8, 16))
"""
    )
    result = run(pytester)
    result.assert_outcomes(passed=1, failed=2)
    assert (pytester.path / "calls.txt").read_text().split() == ["call", "call"]  # warm-up plus profiled
    result.stdout.fnmatch_lines(["*max_kernels(4): 5 kernels launched, limit 4*"])
    result.stdout.fnmatch_lines(["*max_kernels(5): 6 kernels launched, limit 5*", "*aten::randn*"])


def test_a_marker_on_a_test_that_launches_nothing_counts_zero_kernels(pytester):
    pytester.makepyfile(
        """
import pytest

@pytest.mark.max_kernels(0)
def test_nothing():
    assert 1 + 1 == 2
"""
    )
    run(pytester).assert_outcomes(passed=1)


def test_per_device_max_kernels_wins_over_the_plain_count(pytester):
    pytester.makepyfile(
        FIVE_OP_SOFTMAX
        + """
@pytest.mark.max_kernels(1, cpu=5)
def test_cpu_value_wins(fusion):
    fusion.profile(five_op_softmax, torch.randn(8, 16))

@pytest.mark.max_kernels(cuda=1)
def test_no_cpu_value_is_unchecked_on_cpu(fusion):
    fusion.profile(five_op_softmax, torch.randn(8, 16))
"""
    )
    run(pytester, "--fusion-device", "cpu").assert_outcomes(passed=2)


@pytest.mark.parametrize(
    "marker, message",
    [
        ("max_kernels(-1)", "*test_bad.py::test_bad: @pytest.mark.max_kernels: n must be a non-negative int, got -1*"),
        ("max_kernels('four')", "*@pytest.mark.max_kernels: n must be a non-negative int, got 'four'*"),
        ("max_kernels(1, gpu=2)", "*@pytest.mark.max_kernels: unknown keyword(s) gpu; accepted: cpu=, cuda=*"),
        ("max_kernels()", "*@pytest.mark.max_kernels: needs a count*"),
        ("max_hbm_bytes('12 parsecs')", "*@pytest.mark.max_hbm_bytes: cannot read '12 parsecs' as a byte count*"),
        ("bandwidth_bound(2)", "*@pytest.mark.bandwidth_bound: fraction must be a number in (0, 1] (a share of peak bandwidth), got 2*"),
        ("no_graph_breaks(True)", "*@pytest.mark.no_graph_breaks: takes no arguments*"),
    ],
)
def test_bad_marker_arguments_fail_at_setup_naming_the_test_and_the_marker(pytester, marker, message):
    pytester.makepyfile(
        test_bad=f"""
import pytest

@pytest.mark.{marker}
def test_bad(fusion):
    raise AssertionError("the body must not run")
"""
    )
    result = run(pytester)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([message])
    result.stdout.no_fnmatch_line("*the body must not run*")


def test_strict_markers_accepts_every_fusion_marker(pytester):
    pytester.makepyfile(
        """
import pytest

@pytest.mark.max_kernels(3)
@pytest.mark.max_hbm_bytes("1 MiB")
@pytest.mark.no_graph_breaks
def test_marked():
    pass

@pytest.mark.bandwidth_bound(0.5)
def test_bw():
    pass
"""
    )
    run(pytester, "--strict-markers").assert_outcomes(passed=2)


def test_help_lists_every_option_and_markers_lists_every_marker(pytester):
    result = pytester.runpytest_inprocess(*PLUGIN_ARGS, "--help")
    result.stdout.fnmatch_lines(
        [
            "*kernel-fusion regression checks*",
            "*--fusion-device*",
            "*--fusion-warmup*",
            "*--fusion-peak-bandwidth*",
            "*--fusion-counters*",
            "*--fusion-baseline*",
            "*--fusion-update-baseline*",
            "*--fusion-json*",
            "*--fusion-trace-dir*",
            "*--fusion-roofline*",
            "*--fusion-report*",
            "*--fusion-enforce-cpu-timing*",
            "*fusioncheck_device*",
        ]
    )
    markers = pytester.runpytest_inprocess(*PLUGIN_ARGS, "--markers")
    markers.stdout.fnmatch_lines(
        [
            "*max_kernels(n, [*], cpu=None, cuda=None)*",
            "*max_hbm_bytes(n)*",
            "*bandwidth_bound(fraction)*",
            "*no_graph_breaks*",
        ]
    )


def test_plugin_import_does_not_import_torch(pytester):
    pytester.makepyfile(
        """
import sys

def test_no_torch():
    assert "torch" not in sys.modules
"""
    )
    result = pytester.runpytest_subprocess(*PLUGIN_ARGS)
    result.assert_outcomes(passed=1)


def test_a_callable_that_raises_reaches_the_user_unchanged(pytester):
    pytester.makepyfile(
        """
import pytest, torch

class Boom(Exception):
    pass

def explode(x):
    raise Boom("from the user's code")

def test_raises(fusion):
    with pytest.raises(Boom, match="from the user's code"):
        fusion.profile(explode, torch.ones(2), warmup=0)
    # the profiler was closed: a second profile works
    assert fusion.profile(torch.neg, torch.ones(2)).kernel_count == 1
"""
    )
    run(pytester).assert_outcomes(passed=1)


def test_profiling_while_another_profiler_is_active_is_a_clear_error(pytester):
    pytester.makepyfile(
        """
import pytest, torch
from pytest_fusioncheck import ProfilerBusyError

def test_busy(fusion):
    with torch.profiler.profile():
        with pytest.raises(ProfilerBusyError, match="another torch.profiler session is active"):
            fusion.profile(torch.neg, torch.ones(2))
"""
    )
    run(pytester).assert_outcomes(passed=1)


def test_fusion_device_cuda_without_a_gpu_skips_with_a_clear_reason(pytester):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    pytester.makepyfile(
        """
def test_needs_gpu(fusion):
    raise AssertionError("must not run")
"""
    )
    result = run(pytester, "--fusion-device", "cuda", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*--fusion-device cuda: no CUDA GPU here*"])


def test_an_assertion_before_any_profile_says_there_is_no_report(pytester):
    pytester.makepyfile(
        """
import pytest
from pytest_fusioncheck import assert_max_kernels, NoReportError

def test_early(fusion):
    with pytest.raises(NoReportError, match="no fusion report yet in test .*test_early"):
        assert_max_kernels(1)
"""
    )
    run(pytester).assert_outcomes(passed=1)


def test_fusion_report_prints_each_profiled_tests_table(pytester):
    pytester.makepyfile(
        """
import torch

def test_one(fusion):
    fusion.profile(lambda x: torch.softmax(x, -1), torch.randn(4, 8))
"""
    )
    result = run(pytester, "--fusion-report")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*fusioncheck kernel tables*", "*test_one*1 kernel*", "*aten::_softmax*"])


def test_markers_check_every_report_of_the_test_not_only_the_last(pytester):
    pytester.makepyfile(
        FIVE_OP_SOFTMAX
        + """
@pytest.mark.max_kernels(1)
def test_first_report_breaks_the_limit(fusion):
    fusion.profile(five_op_softmax, torch.randn(4, 8))
    fusion.profile(torch.neg, torch.randn(4, 8))
"""
    )
    result = run(pytester)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*5 kernels launched, limit 1*"])


def test_a_region_profiles_its_block_once(pytester):
    pytester.makepyfile(
        """
import pytest, torch

@pytest.mark.max_kernels(2)
def test_region(fusion):
    x = torch.randn(8, 8)
    with fusion.region("two ops") as r:
        y = (x * 2).relu()
    assert r.report.kernel_count == 2
    assert [k.op for k in r.report.kernels] == ["aten::mul", "aten::relu"]
    assert fusion.reports == [r.report]
"""
    )
    run(pytester).assert_outcomes(passed=1)


def test_markers_set_but_nothing_profiled_is_a_clear_failure(pytester):
    pytester.makepyfile(
        """
import pytest

@pytest.mark.max_kernels(2)
def test_forgot(fusion):
    pass
"""
    )
    result = run(pytester)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*fusion markers are set but the test profiled nothing*"])
