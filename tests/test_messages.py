"""What the plugin prints for the smaller cases a user meets (pytester runs, CPU): stale
baseline entries, a CUDA device without a GPU, plugin frames in tracebacks, Triton
without a driver, an unenforced CPU timing verdict under ``-q``."""

import pytest
import torch

TWO_TESTS = """
import pytest, torch

@pytest.mark.max_kernels(4)
def test_a(fusion):
    fusion.profile(lambda x: x * 2, torch.randn(8))

@pytest.mark.max_kernels(4)
def test_b(fusion):
    fusion.profile(lambda x: x + 2, torch.randn(8))
"""


def test_deselected_tests_are_not_stale_and_a_removed_test_is(run_pytest, pytester):
    path = pytester.makepyfile(test_two=TWO_TESTS)
    run_pytest("--fusion-device=cpu", "--fusion-update-baseline").assert_outcomes(passed=2)
    result = run_pytest("--fusion-device=cpu", "--fusion-update-baseline", "-k", "test_a")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*fusioncheck baseline left unchanged*1 entry of tests not selected this session kept*"])
    result.stdout.no_fnmatch_line("* stale (*")
    path.write_text(TWO_TESTS.split("@pytest.mark.max_kernels(4)\ndef test_b")[0])
    result = run_pytest("--fusion-device=cpu", "--fusion-update-baseline")
    result.stdout.fnmatch_lines(["*1 stale (no longer collected from their files, kept):*", "  test_two.py::test_b"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_cuda_without_a_gpu_skips_at_the_test_line_and_require_gpu_fails(run_pytest, pytester):
    pytester.makepyfile(test_dev="""
import pytest, torch

@pytest.mark.max_kernels(4)
def test_on_cuda(fusion):
    fusion.profile(lambda x: x * 2, torch.randn(8, device=fusion.device))
""")
    result = run_pytest("--fusion-device=cuda", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED [[]1[]] test_dev.py:*: --fusion-device cuda: no CUDA GPU here*--fusion-require-gpu*"])
    result.stdout.no_fnmatch_line("*fixture.py*")
    for args in (["--fusion-device=cuda", "--fusion-require-gpu"], ["--fusion-require-gpu"]):
        result = run_pytest(*args)
        result.assert_outcomes(errors=1)
        result.stdout.fnmatch_lines(["*--fusion-device cuda: no CUDA GPU here*--fusion-require-gpu fails the test instead of skipping it*"])


def test_an_error_in_the_profiled_function_shows_the_users_frames_not_the_plugins(run_pytest, pytester):
    pytester.makepyfile(test_err="""
def broken(x):
    return x.no_such_method()

def test_profile_raises(fusion):
    import torch
    fusion.profile(broken, torch.randn(4))

def test_assert_without_a_report(fusion):
    fusion.assert_max_kernels(1)
""")
    result = run_pytest("--fusion-device=cpu")
    result.assert_outcomes(failed=2)
    out = result.stdout.str()
    assert "x.no_such_method()" in out and "AttributeError" in out
    assert "no fusion report yet in test test_err.py::test_assert_without_a_report" in out
    for frame in ("capture.py:", "fixture.py:", "state.py:", "api.py:", "self = ReportLog("):
        assert frame not in out, frame


def test_triton_without_a_driver_gets_a_hint_naming_the_interpreter(run_pytest, pytester):
    pytester.makepyfile(test_triton="""
def test_launch():
    raise RuntimeError("0 active drivers ([]). There should only be one.")
""")
    result = run_pytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*fusioncheck hint*", "*TRITON_INTERPRET=1*"])


def test_an_unenforced_cpu_bandwidth_verdict_prints_one_line_under_quiet(run_pytest, pytester):
    pytester.makepyfile(test_bw="""
import pytest, torch

@pytest.mark.bandwidth_bound(0.99)
def test_slow(fusion):
    fusion.profile(lambda x: x * 2, torch.randn(64))
""")
    result = run_pytest("--fusion-device=cpu", "--fusion-peak-bandwidth=1e15", "-q")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "*fusioncheck: 1 timing verdict(s) on CPU fell short, reported, not enforced (--fusion-enforce-cpu-timing enforces them):",
            "  test_bw.py::test_slow: @pytest.mark.bandwidth_bound(0.99): *of peak bandwidth < required 99%*",
        ]
    )


def test_a_launch_overhead_verdict_a_cpu_cannot_check_prints_one_line_under_quiet(run_pytest, pytester):
    pytester.makepyfile(test_launch="""
import pytest, torch

@pytest.mark.max_launch_overhead(0.1)
def test_launches(fusion):
    fusion.profile(lambda x: x * 2, torch.randn(64))
""")
    result = run_pytest("--fusion-device=cpu", "-q")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "fusioncheck: 1 timing verdict(s) need a GPU and were not checked:",
            "  test_launch.py::test_launches: @pytest.mark.max_launch_overhead(0.1): launch overhead is a GPU figure; not checked on cpu",
        ]
    )


def test_a_baseline_check_says_how_many_tests_it_checked(run_pytest, pytester):
    pytester.makepyfile(test_two=TWO_TESTS)
    run_pytest("--fusion-device=cpu", "--fusion-update-baseline").assert_outcomes(passed=2)
    result = run_pytest("--fusion-device=cpu", "--fusion-baseline", "-q")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["fusioncheck baseline: 2 test(s) checked against *.fusioncheck-baseline.json: 0 regressed, 0 improved, 0 without an entry"])


def test_a_budget_above_the_modelled_bytes_by_more_than_the_l2_warns_naming_both():
    from pytest_fusioncheck.roofline import budget_over_modelled

    MiB = 2**20
    text = budget_over_modelled(200 * MiB, 100 * MiB, 0, 60 * MiB)
    assert "budget 200.0 MiB is 100.0 MiB above the 100.0 MiB the kernels were modelled to move" in text
    assert "60 MiB L2" in text
    assert budget_over_modelled(150 * MiB, 100 * MiB, 0, 60 * MiB) is None  # within the L2
    assert budget_over_modelled(200 * MiB, 100 * MiB, 1, 60 * MiB) is None  # a kernel unmodelled: no figure to compare
    assert budget_over_modelled(200 * MiB, 100 * MiB, 0, 0) is None  # no L2 known (CPU)
