"""The HTML session report (``--fusion-html``): its content from report data, and the page as
a browser shows it (headless Chromium, when installed: ``apt-get install chromium``)."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
from html.parser import HTMLParser

import pytest

from pytest_fusioncheck.sinks.html_sink import render


def _report(label: str, kernels: list[tuple[str, float, int | None]], budget: int | None = None, **extra) -> dict:
    return {
        "label": label, "device": extra.pop("device", "cpu"), "device_kind": "cpu", "kernel_count": len(kernels),
        "bytes": sum(b or 0 for _, _, b in kernels),
        "budget": {"total": budget} if budget else None,
        "kernels": [{"name": n, "time_s": t, "bytes": b, "op": n, "source": "t.py:1", "module": None} for n, t, b in kernels],
        **extra,
    }


def test_failing_tests_come_first_with_their_verdict_and_the_rest_keep_their_order():
    page = render(
        [("t.py::a", "", [_report("a", [("k", 1e-6, 8)])]),
         ("t.py::b", "", [_report("b", [("k", 1e-6, 8)])]),
         ("t.py::c", "", [_report("c", [("k", 1e-6, 8)])])],
        failed={"t.py::c"},
    )
    index = page[page.index("<table id='tests'>"):page.index("</table>")]
    assert [m for m in re.findall(r"t\.py::(\w)</a>", index)] == ["c", "a", "b"]
    assert "<td class='verdict failed'>failed</td>" in index and index.count("verdict passed") == 2
    assert "1 failed" in page
    expected = render([("t.py::a", "", [_report("a", [("k", 1e-6, 8)])]), ("t.py::d", "", [_report("d", [("k", 1e-6, 8)])])],
                      outcomes={"t.py::a": "xfailed", "t.py::d": "error"})
    assert "<td class='verdict xfailed'>xfailed</td>" in expected  # a demo of a failure is not "passed"
    assert expected.index("t.py::d</a>") < expected.index("t.py::a</a>")  # an error counts as failing


def test_modelled_bytes_are_drawn_against_the_budget_and_over_budget_is_marked():
    over = render([("t.py::x", "", [_report("x", [("a", 1e-6, 300), ("b", 1e-6, 300)], budget=200)])])
    assert "class='bar over'" in over and "3.00x the budget" in over
    assert "width:100.0%" in over and "width:33.3%" in over  # modelled fills the bar, budget at a third
    within = render([("t.py::x", "", [_report("x", [("a", 1e-6, 100)], budget=200)])])
    assert "class='bar'" in within and "0.50x the budget" in within
    none = render([("t.py::x", "", [_report("x", [("a", 1e-6, 100)])])])
    assert "class='bar" not in none  # no budget: no bar


def test_the_kernel_strip_has_one_cell_a_kernel_by_time_and_a_gpus_launch_gaps_as_one_share():
    kernels = [("k0", 3e-6, 8), ("k1", 1e-6, 8)]
    cpu = render([("t.py::x", "", [_report("x", kernels)])])
    strip = re.search(r"<div class='strip'>(.*?)</div></div>", cpu).group(0)
    assert strip.count("flex:") == 2 and "flex:0.750000" in strip and "flex:0.250000" in strip
    gpu = render([("t.py::x", "", [_report("x", kernels, device="cuda", wall_time_s=8e-6)])])
    strip = re.search(r"<div class='strip'>(.*?)</div></div>", gpu).group(0)
    assert strip.count("flex:") == 3 and "class='gap' style='flex:0.500000'" in strip  # 4 us busy in 8 us


def test_a_launch_bound_report_says_so_with_its_graph_replay_or_why_there_is_none():
    kernels = [("k0", 3e-6, 8), ("k1", 1e-6, 8)]
    replayed = render([("t.py::x", "", [_report("x", kernels, device="cuda", wall_time_s=100e-6, launch_bound=True,
                                                 launch_overhead_s=96e-6, graph_time_s=5e-6,
                                                 graph_recovered_share=95 / 96)])])
    assert "launch-bound: 96% of the wall time the GPU was idle" in replayed
    assert "replayed from a CUDA graph: 5.0 us a call vs 100.0 us wall (recovers 99% of the idle time)" in replayed
    refused = render([("t.py::x", "", [_report("x", kernels, device="cuda", wall_time_s=100e-6, launch_bound=True,
                                                launch_overhead_s=96e-6, graph_note="the call synchronises: .item()")])])
    assert "no CUDA-graph replay: the call synchronises: .item()" in refused and "replayed from" not in refused
    quiet = render([("t.py::x", "", [_report("x", kernels)])])
    assert "launch-bound" not in quiet and "CUDA-graph" not in quiet


def test_headroom_lists_its_kernels_as_runs():
    chain = {"kernels": [0, 1, 2, 3, 7, 9, 10], "ops": ["aten::add", "aten::mul"], "bytes": 300, "fused_bytes": 100,
             "excess": 200}
    page = render([("t.py::x", "", [_report("x", [("k", 1e-6, 8)], headroom=[chain])])])
    assert "headroom: kernels 0-3, 7, 9-10 (add, mul) move" in page


def test_a_chain_with_modules_is_named_by_its_module_and_counts_its_copies():
    chain = {"kernels": [4, 5], "ops": ["aten::pow", "aten::mean"], "bytes": 300, "fused_bytes": 100, "excess": 200,
             "module": "model.layers.0.input_layernorm", "copies": 4}
    page = render([("t.py::x", "", [_report("x", [("k", 1e-6, 8)], headroom=[chain])])])
    assert "headroom: model.layers.0.input_layernorm: kernels 4-5 (pow, mean) move" in page
    assert "(4 copies of this chain in the region)" in page


def test_a_failing_test_shows_its_failure_text_escaped_and_a_passing_one_none():
    text = "E   FusionAssertionError: @pytest.mark.max_kernels(1): 3 kernels > 1\nE   <kernel table>"
    page = render([("t.py::bad", "", [_report("b", [("k", 1e-6, 8)])]), ("t.py::ok", "", [_report("o", [("k", 1e-6, 8)])])],
                  failed={"t.py::bad"}, verdicts={"t.py::bad": text})
    assert page.count("<pre class='why'>") == 1
    why = page[page.index("<pre class='why'>"):]
    assert why.index("max_kernels(1): 3 kernels &gt; 1") < why.index("&lt;kernel table&gt;") < why.index("t.py::ok")


def test_long_kernel_cells_are_cut_with_their_whole_text_on_hover():
    name = "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8>(Params<" + "x" * 200 + ">)"
    report = _report("x", [(name, 1e-6, 8)])
    report["kernels"][0]["source"] = "/very/long/path/" * 10 + "modeling_llama.py:123"
    page = render([("t.py::x", "", [report])])
    assert f"<td class='t name' title='{name.replace('<', '&lt;').replace('>', '&gt;')}'>" in page
    assert "title='" + "/very/long/path/" * 10 + "modeling_llama.py:123'" in page
    assert "td.t { max-width:" in page and "text-overflow: ellipsis" in page


def test_the_roofline_heads_the_page_inline_or_a_line_says_why_not():
    kernels = [("k", 1e-6, 8)]
    page = render([("t.py::x", "", [_report("x", kernels)])], roofline="<svg xmlns='http://www.w3.org/2000/svg'></svg>")
    assert page.index("<h2 id='roofline'>") < page.index("<svg") < page.index("<h2 id='t0'")
    page = render([("t.py::x", "", [_report("x", kernels)])], roofline="no roofline: no kernel has FLOPs, bytes and time")
    assert "<p class='note'>no roofline: no kernel has FLOPs, bytes and time</p>" in page


def test_graph_breaks_and_recompiles_are_listed_with_their_lines():
    report = _report("x", [("k", 1e-6, 8)], graph_breaks=[{"reason": "print()", "location": "m.py:12"}],
                     recompiles=[{"function": "f", "location": "m.py:3", "reason": "x.size()[0] == 4"}])
    page = render([("t.py::x", "", [report])])
    assert "graph break at m.py:12: print()" in page
    assert "recompiled f (m.py:3): x.size()[0] == 4" in page


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
FILE = """
import pytest, torch

def five(x):
    m = x.max(dim=-1, keepdim=True).values
    e = (x - m).exp()
    return e / e.sum(dim=-1, keepdim=True)

def test_ok(fusion):
    fusion.profile(torch.softmax, torch.randn(32, 64), -1)

@pytest.mark.max_kernels(1)
def test_split(fusion):
    fusion.profile(five, torch.randn(32, 64))

@pytest.mark.xfail(strict=True, reason="a demo of a failure")
@pytest.mark.max_kernels(1)
def test_demo(fusion):
    fusion.profile(lambda x: x.exp().neg(), torch.randn(8, 8))

def test_compiled_break(fusion):
    def f(x):
        y = x.exp()
        print("between")
        return y.neg()
    fusion.profile(torch.compile(f), torch.randn(8, 8))
"""


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium not installed (apt-get install chromium): "
                                               "the HTML report's browser check is skipped")
def test_the_html_report_renders_in_a_browser_with_every_test_failing_first_and_no_console_errors(run_pytest, pytester):
    import torch

    torch._dynamo.reset()
    pytester.makepyfile(test_h=FILE)
    result = run_pytest("--fusion-html", "report.html")
    result.assert_outcomes(passed=2, failed=1, xfailed=1)
    page = pytester.path / "report.html"
    common = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--allow-file-access-from-files"]
    shown = subprocess.run([*common, "--enable-logging=stderr", "--v=0", "--dump-dom", page.as_uri()],
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr[-2000:]
    console = [line for line in shown.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    assert not console, console

    class Dom(HTMLParser):
        def __init__(self):
            super().__init__()
            self.h2: list[str] = []
            self._in_h2 = False

        def handle_starttag(self, tag, attrs):
            self._in_h2 = tag == "h2"

        def handle_data(self, data):
            if self._in_h2:
                self.h2.append(data)
                self._in_h2 = False

    dom = Dom()
    dom.feed(shown.stdout)  # the DOM the browser built, not the file's text
    tests = [h for h in dom.h2 if h.startswith("test_h.py::")]
    assert tests[0] == "test_h.py::test_split", dom.h2  # the failing test first
    assert sorted(tests) == ["test_h.py::test_compiled_break", "test_h.py::test_demo", "test_h.py::test_ok", "test_h.py::test_split"]
    assert "<span class=\"verdict xfailed\">xfailed</span>" in shown.stdout
    assert "graph break at test_h.py:" in shown.stdout
    # the failing test's verdict, as the terminal printed it
    assert "@pytest.mark.max_kernels(1)" in shown.stdout and "kernels" in result.stdout.str()
    # the page fits a 1400 px window: the browser measures it (a copy of the page with a one-line script)
    measured = pytester.path / "measured.html"
    measured.write_text(page.read_text().replace(
        "</body>", "<script>document.title = 'width ' + document.documentElement.scrollWidth</script></body>"))
    fit = subprocess.run([*common, "--window-size=1400,900", "--dump-dom", measured.as_uri()],
                         capture_output=True, text=True, timeout=120)
    width = int(re.search(r"<title>width (\d+)</title>", fit.stdout).group(1))
    assert width <= 1400, width
    if importlib.util.find_spec("matplotlib"):  # the session's roofline, inline
        roof = shown.stdout[shown.stdout.index("id=\"roofline\""):]
        assert "<svg" in roof[:2000] and "ridge" in roof, roof[:500]
    shot = pytester.path / "report.png"
    subprocess.run([*common, "--window-size=1280,1600", f"--screenshot={shot}", page.as_uri()],
                   capture_output=True, text=True, timeout=120, check=True)
    assert shot.stat().st_size > 10_000  # a rendered page, not a blank one
