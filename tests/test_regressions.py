"""The regression scenario end to end (issue 4): graph breaks, baselines, numerics in tests."""

import json

import pytest
import torch

CHAIN = """
import pytest, torch

def bias_gelu(x, b):
    y = x + b
    return torch.nn.functional.gelu(y)

def bias_print_gelu(x, b):
    y = x + b
    print("debug", y.shape)
    return torch.nn.functional.gelu(y)

@pytest.fixture(autouse=True)
def fresh():
    torch._dynamo.reset()

@pytest.mark.no_graph_breaks
@pytest.mark.max_kernels(1)
def test_clean(fusion):
    fusion.profile(torch.compile(bias_gelu), torch.randn(16, 32), torch.randn(32))

@pytest.mark.no_graph_breaks
def test_print_breaks_the_graph(fusion):
    fusion.profile(torch.compile(bias_print_gelu), torch.randn(16, 32), torch.randn(32))

@pytest.mark.max_kernels(1)
def test_print_splits_the_kernel(fusion):
    fusion.profile(torch.compile(bias_print_gelu), torch.randn(16, 32), torch.randn(32))
"""


def test_a_print_in_a_compiled_chain_fails_no_graph_breaks_and_max_kernels_naming_its_line(run_pytest, pytester):
    path = pytester.makepyfile(test_chain=CHAIN)
    print_line = next(i for i, line in enumerate(path.read_text().splitlines(), 1) if "print(" in line)
    result = run_pytest("--fusion-device", "cpu")
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines(
        [
            "*@pytest.mark.no_graph_breaks: 1 graph break(s) during test_chain.py::test_print_breaks_the_graph*",
            f"*Graph break at test_chain.py:{print_line}:*",
        ]
    )
    # max_kernels leads with the break, then the two kernels the print split the chain into
    result.stdout.fnmatch_lines(
        [
            "*test_print_splits_the_kernel*",
            f"*Graph break at test_chain.py:{print_line}:*",
            "*@pytest.mark.max_kernels(1): 2 kernels launched, limit 1*",
            "*0*cpp_fused_add_0*fused: add*",
            "*1*cpp_fused_gelu_0*fused: gelu*",
        ]
    )


BASELINED = """
import os, pytest, torch

N_OPS = int(os.environ.get("N_OPS", "2"))

def chain(x):
    for _ in range(N_OPS):
        x = x.neg()
    return x

@pytest.mark.parametrize("i", range(4))
def test_chain(fusion, i):
    fusion.profile(chain, torch.randn(8, 8))
"""


def _baseline(pytester):
    return json.loads((pytester.path / ".fusioncheck-baseline.json").read_text())


def test_a_baseline_is_written_compared_regressed_and_improved(run_pytest, pytester, monkeypatch):
    pytester.makepyfile(test_b=BASELINED)
    result = run_pytest("--fusion-update-baseline")
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["fusioncheck baseline wrote *"])
    entry = _baseline(pytester)["entries"]["test_b.py::test_chain[0]"]["cpu"]
    assert entry["kernel_count"] == 2 and entry["kernels"] == ["aten::neg", "aten::neg"]

    run_pytest("--fusion-baseline").assert_outcomes(passed=4)

    monkeypatch.setenv("N_OPS", "3")
    result = run_pytest("--fusion-baseline")
    result.assert_outcomes(failed=4)
    result.stdout.fnmatch_lines(["*kernels: 2 -> 3 (+1)*", "*+ aten::neg*"])

    monkeypatch.setenv("N_OPS", "1")
    result = run_pytest("--fusion-baseline")
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["*fusioncheck baseline improvements*", "*kernels: 2 -> 1 (-1)*"])


def test_a_corrupt_baseline_is_a_clear_error_and_is_left_as_it_was(run_pytest, pytester):
    pytester.makepyfile(test_b=BASELINED)
    corrupt = '{"format": "pytest-fusioncheck-baseline", "version": 1, "entries": {'
    (pytester.path / ".fusioncheck-baseline.json").write_text(corrupt)
    for args in (["--fusion-baseline"], ["--fusion-update-baseline"]):
        result = run_pytest(*args)
        assert result.ret != 0
        result.stderr.fnmatch_lines(["*.fusioncheck-baseline.json*"])
        assert (pytester.path / ".fusioncheck-baseline.json").read_text() == corrupt


def test_xdist_workers_results_are_merged_into_one_baseline(pytester):
    pytest.importorskip("xdist")
    from conftest import PLUGIN_ARGS

    pytester.makepyfile(test_b=BASELINED)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", *PLUGIN_ARGS, "-n", "2", "--fusion-update-baseline", timeout=300)
    result.assert_outcomes(passed=4)
    entries = _baseline(pytester)["entries"]
    assert sorted(entries) == [f"test_b.py::test_chain[{i}]" for i in range(4)]


COMPILED_CHAIN = """
import os, torch

def block(x):
    y = torch.nn.functional.gelu(x + 1)
    if os.environ.get("BREAK"):
        print("debug", y.shape)  # a graph break that adds no kernel of its own
    return y * 2

def test_compiled(fusion):
    fusion.profile(torch.compile(block), torch.randn(64, 64))
"""


def test_a_new_graph_break_fails_the_baseline_at_equal_kernels_and_leads_the_message(run_pytest, pytester, monkeypatch):
    pytester.makepyfile(test_c=COMPILED_CHAIN)
    run_pytest("--fusion-update-baseline").assert_outcomes(passed=1)
    entry = _baseline(pytester)["entries"]["test_c.py::test_compiled"]["cpu"]
    assert entry["graph_breaks"] == 0 and entry["versions"]["torch"] == torch.__version__
    monkeypatch.setenv("BREAK", "1")
    result = run_pytest("--fusion-baseline")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "graph breaks: 0 -> 1 (+1)" in out
    # the cause first: the break and its line, before the figures it moved
    assert out.index("Graph break at test_c.py:6") < out.index("fusion baseline regression for")


def test_a_regression_against_a_baseline_of_another_torch_says_so(run_pytest, pytester, monkeypatch):
    pytester.makepyfile(test_b=BASELINED)
    run_pytest("--fusion-update-baseline").assert_outcomes(passed=4)
    path = pytester.path / ".fusioncheck-baseline.json"
    document = json.loads(path.read_text())
    for by_device in document["entries"].values():
        by_device["cpu"]["versions"]["torch"] = "2.11.0"
    path.write_text(json.dumps(document))
    monkeypatch.setenv("N_OPS", "3")
    result = run_pytest("--fusion-baseline")
    result.assert_outcomes(failed=4)
    result.stdout.fnmatch_lines([f"*recorded with torch 2.11.0, running {torch.__version__}: the change may be the upgrade's*"])
