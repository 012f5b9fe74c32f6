"""What a user reads when they hold the plugin wrong: bad arguments, options, ini keys, markers.

Each test asserts the message itself, so that a reworded or lost error is caught. The ini
tests also check that each ``fusioncheck_*`` key takes effect: an ignored key passes
silently otherwise. Inner test files record what ran in a file rather than in module
state, so that their verdicts do not depend on the order their tests run in.
"""

import re

import pytest
import torch

from pytest_fusioncheck import (
    Budget,
    FusionAssertionError,
    FusionCheckError,
    FusionReport,
    Region,
    assert_bandwidth_bound_within,
    assert_hbm_bytes_within,
    assert_max_kernels,
    profile,
)


def made_report(efficiency=1.0, budget=True):
    """A CPU report with known figures: no profiling, and no timing that varies by machine."""
    return FusionReport(
        label="made",
        device="cpu",
        budget=Budget(read_bytes=1000, write_bytes=0) if budget else None,
        time_s=1.0,
        peak_bandwidth=1000.0 / efficiency,
    )


# --------------------------------------------------------------------------- public API


@pytest.mark.parametrize(
    "assertion",
    [
        lambda report: assert_max_kernels(4, report=report),
        lambda report: assert_hbm_bytes_within(report=report),
        lambda report: assert_bandwidth_bound_within(0.5, report=report),
    ],
    ids=["assert_max_kernels", "assert_hbm_bytes_within", "assert_bandwidth_bound_within"],
)
def test_a_report_argument_that_is_not_a_fusion_report_is_a_type_error_naming_its_type(assertion):
    with pytest.raises(TypeError, match="report= must be a FusionReport, got dict"):
        assertion(made_report().to_dict())  # the JSON form, a plausible mix-up


@pytest.mark.parametrize("n", [-1, 2.5, True, "4"], ids=repr)
def test_a_kernel_limit_that_is_not_a_non_negative_int_is_a_value_error(n):
    with pytest.raises(ValueError, match=re.escape(f"assert_max_kernels: n must be a non-negative int, got {n!r}")):
        assert_max_kernels(n, report=made_report())


@pytest.mark.parametrize("slack", [0, -1.0, True], ids=repr)
def test_a_slack_that_is_not_a_positive_number_is_a_value_error(slack):
    with pytest.raises(ValueError, match=re.escape(f"assert_hbm_bytes_within: slack must be a positive number, got {slack!r}")):
        assert_hbm_bytes_within(slack=slack, report=made_report())


@pytest.mark.parametrize("fraction", [0, -0.5, 1.2, True], ids=repr)
def test_a_bandwidth_fraction_outside_zero_to_one_is_a_value_error(fraction):
    # 1.2 of a report at 100% efficiency would pass unnoticed on CPU if it were accepted
    with pytest.raises(ValueError, match=re.escape("fraction must be in (0, 1]") + ".*" + re.escape(f"got {fraction!r}")):
        assert_bandwidth_bound_within(fraction, report=made_report(efficiency=1.0))


def test_a_bandwidth_fraction_of_one_is_accepted():
    assert assert_bandwidth_bound_within(1, report=made_report(efficiency=1.0)).efficiency == 1.0


def test_a_byte_assertion_on_a_region_without_a_budget_asks_for_one():
    x = torch.randn(8)
    with Region("block", device="cpu") as region:
        x.neg()
    assert region.report.budget is None
    with pytest.raises(ValueError, match=re.escape("assert_hbm_bytes_within: report 'block' has no budget; pass budget=")):
        assert_hbm_bytes_within(report=region.report)
    assert_hbm_bytes_within("1 KiB", report=region.report)  # with one given, it checks


def test_a_bandwidth_assertion_with_unknown_efficiency_fails_saying_what_is_missing():
    with pytest.raises(FusionAssertionError, match=re.escape("efficiency unknown for made (no budget; not timed again")):
        assert_bandwidth_bound_within(0.5, report=made_report(budget=False))


def test_profiling_on_an_unsupported_device_names_the_device_and_the_supported_ones():
    calls = []
    with pytest.raises(FusionCheckError, match=re.escape("unsupported device 'mps': fusioncheck profiles 'cuda' and 'cpu'")):
        profile(lambda x: calls.append(x), torch.ones(2), device="mps")
    assert calls == []


def test_profiling_a_tensor_instead_of_a_callable_is_a_type_error():
    with pytest.raises(TypeError, match=re.escape("profile() needs a callable first, got Tensor")):
        profile(torch.ones(2).neg())  # the result of the call, not the function


@pytest.mark.parametrize("warmup", [-1, 1.5, "2", True], ids=repr)
def test_a_warmup_that_is_not_a_non_negative_int_is_a_value_error_before_anything_runs(warmup):
    calls = []
    with pytest.raises(ValueError, match=re.escape(f"warmup must be a non-negative int, got {warmup!r}")):
        profile(lambda x: calls.append(x), torch.ones(2), warmup=warmup)
    assert calls == []


def test_a_region_inside_another_region_says_captures_cannot_nest_and_the_outer_one_still_reports(fusion):
    x = torch.ones(4, device=fusion.device)
    with fusion.region("outer") as outer:
        with pytest.raises(FusionCheckError, match="captures cannot nest"):
            with fusion.region("inner"):
                pass
        x.neg()
    assert outer.report.kernel_count == 1
    assert fusion.reports == [outer.report]


# --------------------------------------------------------------------------- command line


@pytest.mark.parametrize("value", ["-1", "abc"])
def test_a_bad_fusion_warmup_on_the_command_line_is_a_usage_error_naming_the_option(run_pytest, pytester, value):
    pytester.makepyfile("def test_x():\n    pass\n")
    result = run_pytest(f"--fusion-warmup={value}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*--fusion-warmup / fusioncheck_warmup must be a non-negative int, got '{value}'*"])


def test_an_unknown_fusion_device_on_the_command_line_is_a_usage_error_naming_the_option(run_pytest, pytester):
    pytester.makepyfile("def test_x():\n    pass\n")
    result = run_pytest("--fusion-device=tpu")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--fusion-device must be 'cuda', 'cuda:<index>' or 'cpu', got 'tpu'*"])


def test_an_unknown_fusioncheck_device_in_the_ini_file_is_a_usage_error_naming_the_ini_key(run_pytest, pytester):
    pytester.makeini("[pytest]\nfusioncheck_device = tpu\n")
    pytester.makepyfile("def test_x():\n    pass\n")
    result = run_pytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*fusioncheck_device (ini file) must be 'cuda', 'cuda:<index>' or 'cpu', got 'tpu'*"])


# --------------------------------------------------------------------------- options and ini keys take effect

COUNTED = """
import pytest, torch

def note(what):
    with open("calls.txt", "a") as fh:
        fh.write(what + "\\n")

@pytest.mark.max_kernels(5)
def test_marker_only_body():
    note("body")
    torch.ones(4).neg()

def test_fusion_profile(fusion):
    fusion.profile(lambda x: note("fn") or x.neg(), torch.ones(4, device=fusion.device))
"""


@pytest.mark.parametrize(
    "args, ini, runs",
    [
        (["--fusion-warmup=2"], None, 3),
        ([], "fusioncheck_warmup = 3", 4),
        (["--fusion-warmup=0"], "fusioncheck_warmup = 3", 1),  # the command line wins
    ],
    ids=["command line", "ini", "command line over ini"],
)
def test_the_warmup_option_and_ini_key_set_how_often_a_body_runs_before_its_profiled_call(run_pytest, pytester, args, ini, runs):
    if ini:
        pytester.makeini(f"[pytest]\n{ini}\n")
    pytester.makepyfile(COUNTED)
    run_pytest(*args).assert_outcomes(passed=2)
    calls = (pytester.path / "calls.txt").read_text().split()
    assert (calls.count("body"), calls.count("fn")) == (runs, runs)


def test_fusioncheck_device_in_the_ini_file_picks_the_device_and_the_command_line_wins(run_pytest, pytester):
    pytester.makeini("[pytest]\nfusioncheck_device = cuda\n")
    pytester.makepyfile("def test_device(fusion):\n    print('fusion.device is', fusion.device)\n")
    result = run_pytest("-rsP")
    if torch.cuda.is_available():
        result.assert_outcomes(passed=1)
        result.stdout.fnmatch_lines(["fusion.device is cuda"])
    else:  # the ini asks for a GPU this machine lacks
        result.assert_outcomes(skipped=1)
        result.stdout.fnmatch_lines(["*--fusion-device cuda: no CUDA GPU here*"])
    result = run_pytest("-rsP", "--fusion-device=cpu")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["fusion.device is cpu"])


def test_fusioncheck_report_in_the_ini_file_prints_the_kernel_tables(run_pytest, pytester):
    pytester.makepyfile("import torch\n\ndef test_one(fusion):\n    fusion.profile(torch.neg, torch.ones(4, device=fusion.device))\n")
    result = run_pytest()
    result.assert_outcomes(passed=1)
    result.stdout.no_fnmatch_line("*fusioncheck kernel tables*")
    pytester.makeini("[pytest]\nfusioncheck_report = true\n")
    result = run_pytest()
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*fusioncheck kernel tables*", "*test_one*1 kernel*", "*aten::neg*"])


SLOW_ON_CPU = """
import pytest, torch

@pytest.mark.bandwidth_bound(0.5)
def test_neg(fusion):
    fusion.profile(torch.neg, torch.randn(256, 256))
"""


@pytest.mark.parametrize(
    "args, ini, enforced",
    [
        ([], None, False),
        (["--fusion-enforce-cpu-timing"], None, True),
        ([], "fusioncheck_enforce_cpu_timing = true", True),
    ],
    ids=["not enforced", "enforced by the option", "enforced by the ini key"],
)
def test_a_cpu_bandwidth_shortfall_is_reported_and_fails_only_where_cpu_timing_is_enforced(run_pytest, pytester, args, ini, enforced):
    if ini:
        pytester.makeini(f"[pytest]\n{ini}\n")
    pytester.makepyfile(SLOW_ON_CPU)
    # nothing on a CPU reaches 1e15 B/s
    result = run_pytest("--fusion-device=cpu", "--fusion-peak-bandwidth=1e15", "--fusion-report", *args)
    shortfall = "*@pytest.mark.bandwidth_bound(0.5): *% of peak bandwidth < required 50% (*test_neg*)*"
    if enforced:
        result.assert_outcomes(failed=1)
        result.stdout.fnmatch_lines([shortfall])
        result.stdout.no_fnmatch_line("*reported, not enforced*")
    else:
        result.assert_outcomes(passed=1)
        result.stdout.fnmatch_lines(
            [shortfall + "[[]CPU timing: reported, not enforced; --fusion-enforce-cpu-timing enforces it]*"]
        )


# --------------------------------------------------------------------------- markers


@pytest.mark.parametrize(
    "marker, problem",
    [
        ("max_kernels(-1)", "n must be a non-negative int, got -1"),
        ("max_kernels('x')", "n must be a non-negative int, got 'x'"),
        ("max_hbm_bytes('12 parsecs')", "cannot read '12 parsecs' as a byte count"),
        ("bandwidth_bound(0)", "fraction must be a number in (0, 1]*got 0"),
        ("no_graph_breaks(1)", "takes no arguments, got args=(1,)"),
        ("no_host_syncs(1)", "takes no arguments, got args=(1,)"),
        ("max_recompiles", "takes exactly one count, got args=()"),
        ("max_recompiles(-1)", "n must be a non-negative int, got -1"),
    ],
)
def test_a_bad_marker_argument_on_a_test_without_the_fixture_errors_at_setup_naming_test_and_marker(run_pytest, pytester, marker, problem):
    pytester.makepyfile(
        test_bad=f"""
import pytest

@pytest.mark.{marker}
def test_bad():
    raise AssertionError("the body must not run")
"""
    )
    result = run_pytest()
    result.assert_outcomes(errors=1)
    name = marker.split("(")[0]
    result.stdout.fnmatch_lines([f"test_bad.py::test_bad: @pytest.mark.{name}: {problem}*"])
    result.stdout.no_fnmatch_line("*the body must not run*")


def test_a_bad_marker_argument_is_reported_once_without_a_chained_traceback(run_pytest, pytester):
    pytester.makepyfile(
        test_bad="""
import pytest

@pytest.mark.max_kernels(-1)
def test_bad():
    pass
"""
    )
    result = run_pytest()
    result.assert_outcomes(errors=1)
    message = "test_bad.py::test_bad: @pytest.mark.max_kernels: n must be a non-negative int, got -1"
    assert result.stdout.lines.count(message) == 1
    assert "During handling of the above exception" not in result.stdout.str()


def test_no_graph_breaks_alone_fails_a_test_whose_compiled_function_prints_naming_the_line(run_pytest, pytester):
    path = pytester.makepyfile(
        test_only_marker="""
import pytest, torch

def bias_print_gelu(x, b):
    y = x + b
    print("debug", y.shape)
    return torch.nn.functional.gelu(y)

@pytest.mark.no_graph_breaks
def test_print():
    torch.compile(bias_print_gelu)(torch.randn(16, 32), torch.randn(32))
"""
    )
    print_line = next(i for i, line in enumerate(path.read_text().splitlines(), 1) if "print(" in line)
    result = run_pytest("--fusion-device=cpu")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*@pytest.mark.no_graph_breaks: 1 graph break(s) during test_only_marker.py::test_print*",
            f"Graph break at test_only_marker.py:{print_line}: *print*",
        ]
    )


def test_a_marker_verdict_is_a_fusion_assertion_error_that_xfail_raises_can_name(run_pytest, pytester):
    pytester.makepyfile(
        """
import pytest, torch
from pytest_fusioncheck import FusionAssertionError

@pytest.mark.xfail(strict=True, raises=FusionAssertionError)
@pytest.mark.max_kernels(1)
def test_two_kernels(fusion):
    fusion.profile(lambda x: x.exp().neg(), torch.randn(4, device=fusion.device))
"""
    )
    run_pytest().assert_outcomes(xfailed=1)
