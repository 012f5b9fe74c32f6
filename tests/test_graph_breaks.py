"""Graph breaks and recompilations are recorded with Dynamo's reason and the user's line.

Graph breaks are a Dynamo matter, so all but one test compile with backend="eager" (Dynamo
tracing only, about a second on CPU); one runs the bias+GELU chain through Inductor.
"""

import inspect
import json
import logging
import os
import subprocess
import sys
import traceback

import pytest
import torch
import torch.nn.functional as F

from pytest_fusioncheck import graph_breaks as gb
from pytest_fusioncheck.graph_breaks import (
    GraphBreak,
    GraphBreakRecorder,
    assert_no_graph_breaks,
    find_graph_breaks,
    format_graph_breaks,
)


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def line_of(fn, text):
    """Absolute line number of the first line of ``fn``'s source that contains ``text``."""
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, line in enumerate(lines) if text in line)


def bias_gelu(x, b):
    y = x + b
    return F.gelu(y)


def bias_print_gelu(x, b):
    y = x + b
    print(y.shape)
    return F.gelu(y)


def bias_item_gelu(x, b):
    y = x + b
    scale = y.amax().item()
    return F.gelu(y) * scale


def branch_on_tensor(x, b):
    y = x + b
    if y.sum() > 0:
        return F.gelu(y)
    return y


def print_in_loop(x, b):
    for _ in range(2):
        x = x + b
        print(x.shape)
    return F.gelu(x)


class BiasPrintGelu(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.bias = torch.nn.Parameter(torch.zeros(8))

    def forward(self, x):
        y = x + self.bias
        print(y.shape)
        return F.gelu(y)


def inputs():
    return torch.randn(4, 8), torch.randn(8)


def record(fn, backend="eager"):
    compiled = torch.compile(fn, backend=backend)
    with GraphBreakRecorder() as recorder:
        out = compiled(*inputs())
    return recorder, out


def graph_break_logger_state():
    names = sorted(
        n for n in logging.root.manager.loggerDict if n.startswith("torch") and "graph_breaks" in n
    )
    names += ["torch", "torch._dynamo"]
    return {
        n: (logging.getLogger(n).level, logging.getLogger(n).propagate, list(logging.getLogger(n).handlers))
        for n in names
    }


def test_compiled_bias_gelu_chain_has_no_graph_breaks_under_inductor():
    recorder, out = record(bias_gelu, backend="inductor")
    assert recorder.graph_breaks == []
    assert recorder.recompiles == []
    assert out.shape == (4, 8)


def test_a_print_inside_the_chain_is_recorded_at_its_own_line(monkeypatch):
    monkeypatch.chdir(ROOT)
    recorder, _ = record(bias_print_gelu)

    (graph_break,) = recorder.graph_breaks
    line = line_of(bias_print_gelu, "print(")
    assert graph_break.filename == __file__
    assert graph_break.lineno == line
    assert graph_break.location == f"tests/test_graph_breaks.py:{line}"
    assert graph_break.code == "print(y.shape)"
    assert graph_break.function == "bias_print_gelu"
    assert "print" in graph_break.reason
    assert "Hint" not in graph_break.reason and len(graph_break.reason) <= 240


def test_an_item_call_is_recorded_as_a_tensor_item_break_at_its_line():
    recorder, _ = record(bias_item_gelu)

    (graph_break,) = recorder.graph_breaks
    assert graph_break.lineno == line_of(bias_item_gelu, ".item()")
    assert "Tensor.item()" in graph_break.reason
    assert graph_break.code == "scale = y.amax().item()"


def test_branching_on_a_tensor_reads_as_data_dependent_branching():
    recorder, _ = record(branch_on_tensor)

    (graph_break,) = recorder.graph_breaks
    assert graph_break.lineno == line_of(branch_on_tensor, "if y.sum()")
    assert "data-dependent" in graph_break.reason.lower()
    assert "generic_jump" not in graph_break.reason


def test_a_break_inside_a_loop_is_reported_with_the_whole_frame_run_eagerly():
    recorder, _ = record(print_in_loop)

    (graph_break,) = recorder.graph_breaks
    assert graph_break.lineno == line_of(print_in_loop, "print(")
    assert graph_break.frame_skipped
    assert "eagerly" in format_graph_breaks([graph_break])


def test_assert_no_graph_breaks_returns_none_for_a_clean_chain():
    assert assert_no_graph_breaks(bias_gelu, *inputs()) is None


def test_assert_no_graph_breaks_names_reason_location_source_and_graph_count(monkeypatch):
    monkeypatch.chdir(ROOT)
    line = line_of(bias_print_gelu, "print(")
    with pytest.raises(AssertionError) as failure:
        assert_no_graph_breaks(torch.compile(bias_print_gelu, backend="eager"), *inputs())

    message = str(failure.value)
    assert "bias_print_gelu was split into 2 graphs by 1 graph break" in message
    assert f"Graph break at tests/test_graph_breaks.py:{line}: " in message
    assert "`print(y.shape)`" in message


def test_a_function_compiled_and_cached_before_recording_still_yields_its_breaks():
    compiled = torch.compile(bias_print_gelu, backend="eager")
    compiled(*inputs())
    with GraphBreakRecorder() as cached_call:
        compiled(*inputs())
    assert cached_call.graph_breaks == []  # served from Dynamo's cache: nothing compiled

    (graph_break,) = find_graph_breaks(compiled, *inputs())
    assert graph_break.lineno == line_of(bias_print_gelu, "print(")

    with GraphBreakRecorder() as after:
        compiled(*inputs())
    assert after.graph_breaks == [] and after.recompiles == []  # the user's cache is intact


def test_find_graph_breaks_looks_inside_a_compiled_module():
    (graph_break,) = find_graph_breaks(torch.compile(BiasPrintGelu(), backend="eager"), torch.randn(4, 8))
    assert graph_break.lineno == line_of(BiasPrintGelu.forward, "print(")
    assert graph_break.function == "forward"


def test_recorder_reports_a_recompilation_with_dynamos_guard_reason():
    def double(x):
        return x * 2

    compiled = torch.compile(double, backend="eager")
    with GraphBreakRecorder() as recorder:
        compiled(torch.randn(4))
        compiled(torch.randn(4, 4))

    (recompile,) = recorder.recompiles
    assert recompile.function == "double"
    assert "rank mismatch" in recompile.reason
    assert recompile.location.endswith(f":{double.__code__.co_firstlineno}")


def test_recorder_restores_logging_state_when_the_block_raises_and_when_nested():
    before = graph_break_logger_state()
    outer = GraphBreakRecorder().__enter__()
    inner = GraphBreakRecorder().__enter__()
    outer.__exit__(None, None, None)  # out of order on purpose
    assert graph_break_logger_state() != before  # inner still listens
    inner.__exit__(None, None, None)
    assert graph_break_logger_state() == before

    with pytest.raises(ZeroDivisionError):
        with GraphBreakRecorder():
            1 / 0
    assert graph_break_logger_state() == before


def test_recorder_prints_nothing_of_its_own(capfd):
    record(print_in_loop)
    err = capfd.readouterr().err
    assert "Graph break in user code" not in err


def test_format_graph_breaks_leads_with_location_reason_and_source(monkeypatch):
    monkeypatch.chdir(ROOT)
    breaks = [
        GraphBreak("Failed to trace builtin operator `print`", os.path.join(ROOT, "tests", "t.py"), 12, "print(y)", "f"),
        GraphBreak("Unsupported Tensor.item() call", "/elsewhere/m.py", 3, "", "g"),
    ]
    assert format_graph_breaks(breaks).splitlines() == [
        f"Graph break at {os.path.join('tests', 't.py')}:12: Failed to trace builtin operator `print`  `print(y)`",
        "Graph break at /elsewhere/m.py:3: Unsupported Tensor.item() call",
    ]
    assert format_graph_breaks([]) == ""
    assert json.loads(json.dumps(breaks[0].to_dict()))["location"] == os.path.join("tests", "t.py") + ":12"


def test_short_reason_keeps_dynamos_headline_and_first_sentence_without_hints():
    text = (
        "Unsupported Tensor.item() call with capture_scalar_outputs=False\n"
        "  Explanation: Dynamo does not support tracing `Tensor.item()`. Second sentence.\n"
        "  Hint: Set `torch._dynamo.config.capture_scalar_outputs = True`\n"
    )
    assert gb._short_reason(text) == (
        "Unsupported Tensor.item() call with capture_scalar_outputs=False: "
        "Dynamo does not support tracing `Tensor.item()`."
    )
    assert len(gb._short_reason("x" * 1000)) == 240


def test_innermost_user_frame_skips_torch_and_plugin_frames():
    torch_file = os.path.join(os.path.dirname(torch.__file__), "nn", "modules", "module.py")
    stack = [
        traceback.FrameSummary("/work/model.py", 10, "forward", line="y = self.act(x)"),
        traceback.FrameSummary("/work/layers.py", 5, "torch_dynamo_resume_in_act_at_4", line="print(x)"),
        traceback.FrameSummary(torch_file, 1700, "_call_impl", line=""),
        traceback.FrameSummary(gb.__file__, 1, "helper", line=""),
    ]
    frame = gb._innermost_user_frame(stack)
    assert (frame.filename, frame.lineno) == ("/work/layers.py", 5)
    assert gb._graph_break("r", frame).function == "act"


def test_importing_the_module_does_not_import_torch():
    code = "import sys, pytest_fusioncheck.graph_breaks; sys.exit('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def log_record(message, args=(), exc=None):
    exc_info = (type(exc), exc, None) if exc is not None else None
    return logging.LogRecord("torch._dynamo.x.__graph_breaks", logging.DEBUG, __file__, 1, message, args, exc_info)


@pytest.mark.parametrize(
    "record",
    [
        log_record(
            "Graph break in user code at /work/m.py:7\nGraph Break Reason: Encountered graph break when "
            "attempting to trace CALL:\n\nFailed to trace builtin operator\n  Explanation: No `print`.\n\n"
            "User code traceback:\n  File ..."
        ),
        log_record(
            "Graph break (user stack suppressed due to duplicate graph break) in user code at %s:%s\n"
            "Graph Break Reason: %s",
            ("/work/m.py", 7, "Failed to trace builtin operator\n  Explanation: No `print`."),
        ),
    ],
    ids=["first-time", "duplicate"],
)
def test_graph_break_log_lines_are_read_in_both_of_dynamos_formats(record):
    graph_break = gb._from_log_record(record)
    assert (graph_break.filename, graph_break.lineno) == ("/work/m.py", 7)
    assert graph_break.reason == "Failed to trace builtin operator: No `print`."
    assert not graph_break.frame_skipped


def test_a_skip_logged_with_its_exception_is_located_from_the_exceptions_user_stack():
    cause = Exception()
    cause.msg = "Failed to trace builtin operator\n  Explanation: No `print`."
    error = Exception("graph break in loop")
    error.real_stack = [traceback.FrameSummary("/work/m.py", 9, "loop", line="print(i)")]
    error.__cause__ = cause
    record = log_record("Graph break: torch.compile cannot properly resume from this graph break", exc=error)

    graph_break = gb._from_log_record(record)
    assert (graph_break.filename, graph_break.lineno) == ("/work/m.py", 9)
    assert graph_break.frame_skipped and graph_break.function == "loop"
    assert graph_break.reason == "Failed to trace builtin operator: No `print`."


# --- a break seen in one test, run again by a later one from Dynamo's cache -----------------

BLOCK_MODULE = """
import torch


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 16)
        self.fc2 = torch.nn.Linear(16, 16)

    def forward(self, x):
        h = torch.nn.functional.gelu(self.fc1(x))
        print("between")
        return x + self.fc2(h) * 2
"""

ORDER_TESTS = """
import pytest, torch
from blockmod import Block

torch.manual_seed(0)
block = torch.compile(Block())

@pytest.mark.no_graph_breaks
def test_first(fusion):
    fusion.profile(block, torch.randn(8, 16))

@pytest.mark.no_graph_breaks
def test_second(fusion):
    fusion.profile(block, torch.randn(8, 16))

@pytest.mark.no_graph_breaks
def test_uncompiled(fusion):
    fusion.profile(Block(), torch.randn(8, 16))
"""


@pytest.mark.parametrize("order", ["first then second", "second then first"])
def test_every_test_that_runs_a_broken_compiled_function_reports_its_break_in_either_order(run_pytest, pytester, order):
    pytester.makepyfile(blockmod=BLOCK_MODULE, test_order=ORDER_TESTS)
    pytester.syspathinsert()
    ids = ["test_order.py::test_first", "test_order.py::test_second"]
    if order != "first then second":
        ids.reverse()
    result = run_pytest("-p", "no:randomly", *ids, "test_order.py::test_uncompiled")
    result.assert_outcomes(failed=2, passed=1)  # the uncompiled call carries nothing over
    name = ids[0].split("::")[1]
    result.stdout.fnmatch_lines([
        "*Graph break at blockmod.py:12: *print*",
        f"*(recorded when this code was first compiled, in test_order.py::{name}; its broken graphs ran here)",
    ])


def test_carried_over_needs_a_generated_kernel_inside_the_broken_function(tmp_path):
    from pytest_fusioncheck.graph_breaks import GraphBreak, carried_over
    from pytest_fusioncheck.report import FusionReport, Kernel

    source = tmp_path / "m.py"
    source.write_text("def f(x):\n    y = x + 1\n    print(y)\n    return y * 2\n\n\ndef g(x):\n    return x\n")
    brk = GraphBreak(reason="print", filename=str(source), lineno=3)
    seen = [(brk, "t.py::a")]
    where = gb.relpath(str(source))

    def report(*kernels):
        return FusionReport(label="r", kernels=list(kernels), device="cpu")

    compiled = Kernel(name="cpp_fused_mul_0", op="fused: mul", source=f"{where}:4")
    assert [b.first_seen for b in carried_over(seen, [report(compiled)], "t.py::b")] == ["t.py::a"]
    assert carried_over(seen, [report(compiled)], "t.py::a") == []  # the test that recorded it
    assert carried_over(seen, [report(compiled)], "t.py::b", recorded=[brk]) == []  # recorded again: once
    eager = Kernel(name="aten::mul", op="aten::mul", source=f"{where}:4")
    assert carried_over(seen, [report(eager)], "t.py::b") == []
    elsewhere = Kernel(name="cpp_fused_0", op="fused: add", source=f"{where}:8")  # in g, not in f
    assert carried_over(seen, [report(elsewhere)], "t.py::b") == []
    from pytest_fusioncheck.graph_breaks import Recompile

    own_graphs = [Recompile(reason="size mismatch", function="f", location=f"{where}:1")]  # b traced f anew
    assert carried_over(seen, [report(compiled)], "t.py::b", recompiled=own_graphs) == []
