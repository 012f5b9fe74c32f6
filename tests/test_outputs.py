"""Session outputs: JSON of all reports, Chrome traces of failures, the roofline plot."""

import json

import pytest

FILE = """
import pytest, torch

def test_ok(fusion):
    fusion.profile(torch.softmax, torch.randn(32, 64), -1)

@pytest.mark.max_kernels(1)
def test_fails(fusion):
    fusion.profile(lambda x: x.exp().neg(), torch.randn(32, 64))
"""


def test_fusion_json_writes_every_report_of_the_session(run_pytest, pytester):
    pytester.makepyfile(test_j=FILE)
    result = run_pytest("--fusion-json", "reports.json")
    result.assert_outcomes(passed=1, failed=1)
    data = json.loads((pytester.path / "reports.json").read_text())
    assert sorted(data) == ["test_j.py::test_fails", "test_j.py::test_ok"]
    fails = data["test_j.py::test_fails"][0]
    assert fails["kernel_count"] == 2
    assert [k["op"] for k in fails["kernels"]] == ["aten::exp", "aten::neg"]
    assert fails["budget"]["total"] == 2 * 32 * 64 * 4
    result.stdout.fnmatch_lines(["*wrote 2 test(s) of reports to reports.json*"])


def test_trace_dir_gets_a_chrome_trace_for_each_failing_test_only(run_pytest, pytester):
    pytester.makepyfile(test_t=FILE)
    run_pytest("--fusion-trace-dir", "traces").assert_outcomes(passed=1, failed=1)
    traces = sorted(p.name for p in (pytester.path / "traces").iterdir())
    assert traces == ["test_t.py__test_fails.0.json"]
    trace = json.loads((pytester.path / "traces" / traces[0]).read_text())
    assert any("aten::exp" in e.get("name", "") for e in trace["traceEvents"])


def test_roofline_writes_a_plot(run_pytest, pytester):
    pytest.importorskip("matplotlib")
    pytester.makepyfile(test_r=FILE)
    run_pytest("--fusion-roofline", "roofline.png", "--fusion-peak-bandwidth", "2e10").assert_outcomes(passed=1, failed=1)
    assert (pytester.path / "roofline.png").stat().st_size > 1000
