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


def test_fusion_html_writes_one_escaped_page_with_every_tests_kernel_table(run_pytest, pytester):
    from html.parser import HTMLParser

    pytester.makepyfile(
        """
import pytest, torch

class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = torch.nn.LayerNorm(8)
    def forward(self, x):
        return torch.nn.functional.gelu(self.ln(x) + 1)

def five(x):
    m = x.max(dim=-1, keepdim=True).values
    e = (x - m).exp()
    return e / e.sum(dim=-1, keepdim=True)

def test_model(fusion):
    fusion.profile(Block(), torch.randn(4, 8))

@pytest.mark.max_kernels(1)
def test_unfused(fusion):
    fusion.profile(five, torch.randn(4, 8))
"""
    )
    result = run_pytest("--fusion-html", "report.html")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*fusioncheck: HTML report of 2 test(s) written to report.html*"])
    page = (pytester.path / "report.html").read_text()

    class Cells(HTMLParser):
        def __init__(self):
            super().__init__()
            self.rows, self.tags = 0, []

        def handle_starttag(self, tag, attrs):
            self.tags.append(tag)
            self.rows += tag == "tr"

    cells = Cells()
    cells.feed(page)
    assert "script" not in cells.tags  # self-contained, nothing to run
    assert cells.rows >= 2 + 1 + 5 + 3  # index rows, the model's module table, both kernel tables
    assert "<td>ln</td>" in page and "<td>Block</td>" in page  # the per-module summary
    assert "class='failed'" in page and "test_unfused" in page
    assert "headroom: kernels 0-4 (max, sub, exp, sum, div)" in page


def test_the_html_page_escapes_kernel_names_and_sources():
    from pytest_fusioncheck.sinks.html_sink import render

    report = {
        "label": "x", "device": "cuda", "device_kind": "cuda:H200", "kernel_count": 1, "bytes": 8,
        "kernels": [{"name": "void k<float, 4>(<script>alert(1)</script>)", "time_s": 1e-6, "bytes": None,
                     "op": "aten::add", "source": "t.py:1", "module": None}],
    }
    page = render([("t.py::test<x>", "", [report])], failed={"t.py::test<x>"})
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert "t.py::test&lt;x&gt;" in page and "class='n unmodelled'>?</td>" in page
