"""The tools people already use: pytest-benchmark, JUnit XML, baselines in CI, captured
logs; and the traps a new user fell into (issue 13), each as the user would see it."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

FIVE = """
import pytest, torch

def five(x):
    m = x.max(dim=-1, keepdim=True).values
    e = (x - m).exp()
    return e / e.sum(dim=-1, keepdim=True)
"""


# --------------------------------------------------------------------------- baselines


def test_a_baseline_path_that_does_not_exist_is_a_usage_error(run_pytest, pytester):
    pytester.makepyfile(FIVE + "\ndef test_a(fusion):\n    fusion.profile(five, torch.randn(8, 8))\n")
    result = run_pytest("--fusion-baseline=baselines/typo.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--fusion-baseline: */baselines/typo.json does not exist; check the path, or create the file with --fusion-update-baseline*"])
    run_pytest("--fusion-baseline=baselines.json", "--fusion-update-baseline").assert_outcomes(passed=1)
    assert (pytester.path / "baselines.json").exists()


TWO = FIVE + """
def test_recorded(fusion):
    fusion.profile(five, torch.randn(8, 8))

def test_new(fusion):
    fusion.profile(torch.softmax, torch.randn(8, 8), -1)
"""


def test_tests_without_an_entry_are_listed_as_not_in_the_baseline_and_fail_when_strict(run_pytest, pytester):
    pytester.makepyfile(test_base=FIVE + "\ndef test_recorded(fusion):\n    fusion.profile(five, torch.randn(8, 8))\n")
    run_pytest("--fusion-update-baseline").assert_outcomes(passed=1)
    pytester.makepyfile(test_base=TWO)
    result = run_pytest("--fusion-baseline")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*1 test(s) not in the baseline*", "*test_base.py::test_new (cpu)*"])
    result.stdout.no_fnmatch_line("*baseline improvements*")
    strict = run_pytest("--fusion-baseline", "--fusion-baseline-strict")
    strict.assert_outcomes(passed=1, failed=1)
    strict.stdout.fnmatch_lines(["*no entry for test_base.py::test_new on cpu*", "*--fusion-baseline-strict*"])


def test_the_strict_baseline_has_an_ini_key(run_pytest, pytester):
    pytester.makepyfile(test_base=FIVE + "\ndef test_recorded(fusion):\n    fusion.profile(five, torch.randn(8, 8))\n")
    run_pytest("--fusion-update-baseline").assert_outcomes(passed=1)
    pytester.makepyfile(test_base=TWO)
    pytester.makeini("[pytest]\nfusioncheck_baseline = .fusioncheck-baseline.json\nfusioncheck_baseline_strict = true\n")
    run_pytest().assert_outcomes(passed=1, failed=1)


def test_only_figures_that_went_down_are_improvements(run_pytest, pytester):
    pytester.makepyfile(test_base=FIVE + "\ndef test_recorded(fusion):\n    fusion.profile(five, torch.randn(8, 8))\n")
    run_pytest("--fusion-update-baseline").assert_outcomes(passed=1)
    pytester.makepyfile(test_base=FIVE + "\ndef test_recorded(fusion):\n    fusion.profile(torch.softmax, torch.randn(8, 8), -1)\n")
    result = run_pytest("--fusion-baseline")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*baseline improvements*", "*kernels: 5 -> 1 (-4)*"])
    result.stdout.no_fnmatch_line("*not in the baseline*")


# --------------------------------------------------------------------------- failure output


def test_a_failing_assertion_method_shows_the_verdict_not_the_plugins_source(run_pytest, pytester):
    pytester.makepyfile(FIVE + "\ndef test_bytes(fusion):\n    fusion.profile(five, torch.randn(64, 64))\n    fusion.assert_hbm_bytes_within()\n")
    result = run_pytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*assert_hbm_bytes_within: * modelled > budget *"])
    text = result.stdout.str()
    assert "def check_hbm_bytes" not in text and "verdict.py" not in text and "api.py" not in text, text


LOGS = FIVE + """
import logging

def test_logs(fusion):
    trace = logging.getLogger("torch.__trace")  # as configured where its records reach pytest
    saved = trace.propagate, trace.level
    trace.propagate, trace.level = True, logging.DEBUG
    try:
        trace.debug("TORCH-DEBUG-RECORD")
    finally:
        trace.propagate, trace.level = saved
    logging.getLogger("mymodel").debug("USER-DEBUG-RECORD")
    fusion.profile(five, torch.randn(8, 8))
    assert False, "fail to show the captured log"
"""


def test_torch_debug_records_stay_out_of_a_fusion_tests_captured_log_unless_asked(run_pytest, pytester):
    pytester.makepyfile(LOGS)
    result = run_pytest("--log-level=DEBUG")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*Captured log call*", "DEBUG    mymodel:*USER-DEBUG-RECORD"])
    result.stdout.no_fnmatch_line("DEBUG    torch.__trace:*")
    kept = run_pytest("--log-level=DEBUG", "--fusion-torch-logs")
    kept.stdout.fnmatch_lines(["DEBUG    torch.__trace:*TORCH-DEBUG-RECORD"])


# --------------------------------------------------------------------------- CI-visible figures


def test_junit_xml_carries_each_fusion_tests_figures(run_pytest, pytester):
    pytester.makepyfile(FIVE + "\ndef test_a(fusion):\n    fusion.profile(five, torch.randn(8, 8))\n")
    run_pytest("--junitxml=out.xml").assert_outcomes(passed=1)
    props = {p.get("name"): p.get("value") for p in ET.parse(pytester.path / "out.xml").iter("property")}
    assert props["fusioncheck.kernels"] == "5"
    assert int(props["fusioncheck.bytes"]) > 0 and props["fusioncheck.bytes_unmodelled"] == "0"
    assert int(props["fusioncheck.budget"]) == 2 * 8 * 8 * 4


# --------------------------------------------------------------------------- pytest-benchmark


BENCH = FIVE + """
def test_bench(fusion, benchmark):
    report = fusion.benchmark(five, torch.randn(64, 64))
    assert report.kernel_count == 5
    assert benchmark.stats is not None and benchmark.stats.stats.rounds >= 1

def test_both_fixtures(fusion, benchmark):
    fusion.profile(torch.softmax, torch.randn(64, 64), -1)
    benchmark(torch.softmax, torch.randn(64, 64), -1)
"""


def test_fusion_benchmark_times_with_pytest_benchmark_and_stores_the_fusion_figures(run_pytest, pytester, monkeypatch):
    pytest.importorskip("pytest_benchmark")
    pytester.makepyfile(BENCH)
    # pytest-benchmark turns itself off inside an xdist worker (this suite run with -n): the inner run is not one
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    result = run_pytest("--benchmark-json=bench.json", "--benchmark-min-rounds=2", "--benchmark-max-time=0.05")
    result.assert_outcomes(passed=2)
    stored = {b["name"]: b["extra_info"] for b in json.loads((pytester.path / "bench.json").read_text())["benchmarks"]}
    assert stored["test_bench"]["fusioncheck.kernels"] == 5
    assert stored["test_bench"]["fusioncheck.budget"] == 2 * 64 * 64 * 4
    assert stored["test_bench"]["fusioncheck.time_s"] > 0 and "median wall time" in stored["test_bench"]["fusioncheck.median_source"]
    assert stored["test_both_fixtures"]["fusioncheck.kernels"] == 1  # filled in for a plain benchmark(...) too


def test_fusion_benchmark_without_pytest_benchmark_says_which_extra_to_install(run_pytest, pytester):
    pytester.makepyfile(FIVE + "\ndef test_bench(fusion):\n    fusion.benchmark(five, torch.randn(8, 8))\n")
    result = run_pytest("-p", "no:benchmark")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*fusion.benchmark needs the pytest-benchmark plugin: pip install 'pytest-fusioncheck[[]benchmark[]]'"])
    result.stdout.no_fnmatch_line("*raise FusionCheckError*")


# --------------------------------------------------------------------------- several GPUs


def test_each_xdist_worker_takes_its_own_gpu_round_robin():
    from pytest_fusioncheck.fixture import worker_gpu

    assert [worker_gpu(f"gw{i}", 2) for i in range(4)] == [0, 1, 0, 1]
    assert worker_gpu("gw5", 8) == 5
    assert worker_gpu("gw1", 1) is None  # one GPU: nothing to choose
    assert worker_gpu(None, 4) is None  # not under xdist
    assert worker_gpu("master", 4) is None


def test_a_worker_profiles_on_its_gpu_and_cuda_index_pins_one(monkeypatch):
    import types

    import torch

    from pytest_fusioncheck.fixture import profiling_device
    from pytest_fusioncheck.state import Settings

    chosen = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    worker = types.SimpleNamespace(workerinput={"workerid": "gw3"})
    assert profiling_device(Settings(), worker) == "cuda" and chosen == [1]
    assert profiling_device(Settings(device="cuda:1"), None) == "cuda" and chosen == [1, 1]
    assert profiling_device(Settings(device="cpu"), worker) == "cpu" and chosen == [1, 1]


def test_counters_under_xdist_are_refused_with_the_reason(run_pytest, pytester):
    pytest.importorskip("xdist")
    pytester.makepyfile("def test_x():\n    pass\n")
    result = run_pytest("-n", "2", "--fusion-counters=ncu")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--fusion-counters ncu does not run under pytest-xdist (-n)*drop -n*"])


def test_a_compiled_sequentials_kernels_name_the_users_line_not_torchs_container():
    import torch

    from pytest_fusioncheck import profile

    torch._dynamo.reset()
    seq = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU())
    report = profile(torch.compile(seq), torch.randn(4, 16))
    generated = [k for k in report.kernels if k.name.startswith("cpp_")]
    assert generated and all(k.source and k.source.startswith("tests/test_integrations.py:") for k in generated), str(report)
    torch._dynamo.reset()


def test_junit_xml_leaves_out_figures_a_report_does_not_have(run_pytest, pytester):
    pytester.makepyfile(FIVE + "\ndef test_a(fusion):\n    fusion.profile(five, torch.randn(8, 8))\n")
    run_pytest("--junitxml=out.xml").assert_outcomes(passed=1)
    props = {p.get("name"): p.get("value") for p in ET.parse(pytester.path / "out.xml").iter("property")}
    assert "fusioncheck.graph_time_s" not in props  # no replay asked for: absent, not the string 'None'
    assert "None" not in props.values()
