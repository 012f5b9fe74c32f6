"""host_syncs.py, the ``no_host_syncs`` marker and ``assert_no_host_syncs``; the
``max_recompiles`` marker (CPU; the GPU path's attribution on recorded event tuples)."""

from types import SimpleNamespace

import pytest
import torch

from pytest_fusioncheck import FusionAssertionError, assert_no_host_syncs, profile
from pytest_fusioncheck.host_syncs import EXPLICIT, compiled_sources, from_runtime, op_sync_reason
from pytest_fusioncheck.ranges import OP_RANGE_PREFIX, SYNC_RANGE_PREFIX


def _line(fn, text):
    import inspect

    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


# --------------------------------------------------------------------------- the op rule


@pytest.mark.parametrize(
    "name, args, kwargs, syncs",
    [
        ("_local_scalar_dense", (torch.ones(()),), {}, True),
        ("equal", (torch.ones(2), torch.ones(2)), {}, True),
        ("nonzero", (torch.ones(2),), {}, True),
        ("masked_select", (torch.ones(2), torch.ones(2, dtype=torch.bool)), {}, True),
        ("_unique2", (torch.ones(2),), {}, True),
        ("bincount", (torch.ones(2, dtype=torch.long),), {}, True),
        ("index", (torch.ones(4), [torch.ones(4, dtype=torch.bool)]), {}, True),
        ("index", (torch.ones(4), [torch.arange(2)]), {}, False),
        ("repeat_interleave", (torch.tensor([1, 2]),), {}, True),
        ("repeat_interleave", (torch.tensor([1, 2]),), {"output_size": 3}, False),
        ("repeat_interleave", (torch.ones(2), 3), {}, False),
        ("_to_copy", (torch.ones(2, device="meta"),), {"device": torch.device("cpu")}, True),
        ("_to_copy", (torch.ones(2, device="meta"),), {"device": torch.device("cpu"), "non_blocking": True}, False),
        ("_to_copy", (torch.ones(2),), {"dtype": torch.half}, False),
        ("copy_", (torch.ones(2), torch.ones(2, device="meta")), {}, True),
        ("copy_", (torch.ones(2, device="meta"), torch.ones(2)), {}, False),
        ("add", (torch.ones(2), torch.ones(2)), {}, False),
    ],
)
def test_op_sync_reason_names_the_ops_that_make_the_host_wait(name, args, kwargs, syncs):
    reason = op_sync_reason(name, args, kwargs)
    assert (reason is not None) == syncs, reason


# --------------------------------------------------------------------------- CPU model through profile


def item_then_scale(x):
    y = x * 2
    s = y.sum().item()
    return y / s


def mask_select(x):
    return x[x > 0].sum()


def branch_on_tensor(x):
    if (x > 0).any():
        return x * 2
    return x


def clean(x):
    return (x * 2).sum(dim=-1)


@pytest.mark.parametrize(
    "fn, text, op",
    [
        (item_then_scale, ".item()", "aten::_local_scalar_dense"),
        (mask_select, "x[x > 0]", "aten::index"),
        (branch_on_tensor, "if (x > 0)", "aten::_local_scalar_dense"),
    ],
)
def test_an_eager_sync_is_found_with_its_op_and_line(fn, text, op):
    report = profile(fn, torch.randn(32, 8), device="cpu")
    assert [(s.op, s.source.rsplit(":", 1)[1]) for s in report.host_syncs] == [(op, str(_line(fn, text)))]
    with pytest.raises(FusionAssertionError) as err:
        assert_no_host_syncs(report)
    message = str(err.value)
    assert "1 device-to-host synchronisation(s)" in message and "CPU model" in message
    assert f"{op} at " in message and f":{_line(fn, text)}: " in message


def test_a_region_without_syncs_passes_and_reports_none():
    report = profile(clean, torch.randn(32, 8), device="cpu")
    assert report.host_syncs == []
    assert assert_no_host_syncs(report) is report
    assert report.to_dict()["host_syncs"] == []


def test_a_compiled_item_behind_a_graph_break_is_found_at_the_model_line():
    torch._dynamo.reset()
    report = profile(torch.compile(item_then_scale), torch.randn(32, 8), device="cpu")
    assert report.graph_breaks, "the .item() breaks the graph under default Dynamo settings"
    assert [s.source.rsplit(":", 1)[1] for s in report.host_syncs] == [str(_line(item_then_scale, ".item()"))]


def scalar_sized(x):
    y = x * 2
    n = int(y.sum().item()) % 5 + 1
    return y.new_zeros(n), y


def test_a_scalar_captured_in_a_compiled_graph_is_found_at_the_model_line():
    """capture_scalar_outputs: no graph break; Inductor's wrapper reads the scalar with
    .item() at the compiled frame's def line: the graph's FX node gives the model's line."""
    torch._dynamo.reset()
    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        report = profile(torch.compile(scalar_sized), torch.randn(32, 8), device="cpu")
    assert report.graph_breaks == []
    assert [(s.op, s.source.rsplit(":", 1)[1]) for s in report.host_syncs] == [
        ("aten::_local_scalar_dense", str(_line(scalar_sized, ".item()")))
    ]
    torch._dynamo.reset()


# --------------------------------------------------------------------------- GPU attribution (recorded tuples)


def _record(index, op="aten::_local_scalar_dense", source="model.py:7", sync="reads a value"):
    return SimpleNamespace(index=index, op=op, source=source, sync=sync)


def test_runtime_syncs_go_to_the_op_open_on_the_thread_once_per_op():
    markers = [(100, 200, 1, f"{OP_RANGE_PREFIX}0"), (300, 400, 1, f"{OP_RANGE_PREFIX}1")]
    calls = [
        ("cudaMemcpyAsync", 110, 1),  # not a sync call
        ("cudaStreamSynchronize", 120, 1),
        ("cudaStreamSynchronize", 150, 1),  # the same op again: one record
        ("cudaLaunchKernel", 310, 1),
    ]
    ops = {0: _record(0), 1: _record(1, op="aten::add", sync=None)}
    syncs = from_runtime(calls, markers, ops, {}, (0, 1000))
    assert [(s.op, s.source, s.call) for s in syncs] == [("aten::_local_scalar_dense", "model.py:7", "cudaStreamSynchronize")]


def test_runtime_syncs_of_an_op_without_a_cpu_rule_still_count_and_say_which_call():
    markers = [(100, 200, 1, f"{OP_RANGE_PREFIX}0")]
    syncs = from_runtime([("cudaStreamSynchronize", 150, 1)], markers, {0: _record(0, op="aten::custom", sync=None)}, {}, None)
    assert len(syncs) == 1 and syncs[0].op == "aten::custom" and "cudaStreamSynchronize" in syncs[0].reason


def test_explicit_synchronize_takes_its_line_and_the_captures_own_syncs_are_outside_the_window():
    markers = [(100, 200, 1, f"{SYNC_RANGE_PREFIX}0")]
    calls = [("cudaDeviceSynchronize", 150, 1), ("cudaDeviceSynchronize", 5000, 1)]  # the second: after the call
    syncs = from_runtime(calls, markers, {}, {0: "train.py:12"}, (0, 1000))
    assert [(s.op, s.source, s.reason) for s in syncs] == [("synchronize", "train.py:12", EXPLICIT)]


def test_a_sync_on_another_thread_is_not_given_to_this_threads_op_and_is_kept_without_a_line():
    markers = [(100, 200, 1, f"{OP_RANGE_PREFIX}0")]
    syncs = from_runtime([("cudaEventSynchronize", 150, 2)], markers, {0: _record(0)}, {}, (0, 1000))
    assert len(syncs) == 1 and syncs[0].source is None and syncs[0].op == "cudaEventSynchronize"
    assert "no user line" in str(syncs[0])


def test_compiled_sources_give_each_scalar_read_of_a_graph_call_the_graphs_line_in_order():
    records = [_record(0, source="model.py:1"), _record(1, source="model.py:1"), _record(2, source="eager.py:3")]
    reads = {7: [("aten::_local_scalar_dense", "model.py:10"), ("aten::_local_scalar_dense", "model.py:11")]}
    out = compiled_sources({0: 110, 1: 120, 2: 900}, [(100, 200, 7)], records, lambda g: list(reads.get(g, [])))
    assert out == {0: "model.py:10", 1: "model.py:11"}


# --------------------------------------------------------------------------- markers (pytester)

SYNC_FILE = """
import pytest, torch

def scaled(x):
    y = x * 2
    return y / y.sum().item()

@pytest.mark.no_host_syncs
def test_item(fusion):
    fusion.profile(scaled, torch.randn(16, 8))

@pytest.mark.no_host_syncs
def test_clean(fusion):
    fusion.profile(lambda x: x * 2, torch.randn(16, 8))

@pytest.mark.no_host_syncs
def test_body_without_fixture():
    x = torch.randn(16, 8)
    if x.sum() > 0:
        x = x * 2

def test_method(fusion):
    fusion.profile(scaled, torch.randn(16, 8))
    fusion.assert_no_host_syncs()
"""


def test_no_host_syncs_fails_each_test_with_a_sync_naming_its_line_and_passes_a_clean_one(run_pytest, pytester):
    path = pytester.makepyfile(test_syncs=SYNC_FILE)
    lines = path.read_text().splitlines()
    item_line = next(i for i, line in enumerate(lines, 1) if ".item()" in line)
    if_line = next(i for i, line in enumerate(lines, 1) if "if x.sum()" in line)
    result = run_pytest("--fusion-device=cpu")
    result.assert_outcomes(failed=3, passed=1)
    out = result.stdout.str()
    assert "test_syncs.py::test_clean PASSED" in out or "1 passed" in out
    result.stdout.fnmatch_lines(
        [
            "*@pytest.mark.no_host_syncs: 1 device-to-host synchronisation(s) in test_syncs.py::test_item*CPU model*",
            f"*aten::_local_scalar_dense at test_syncs.py:{item_line}: reads a tensor's value into Python*",
        ]
    )
    result.stdout.fnmatch_lines([f"*aten::_local_scalar_dense at test_syncs.py:{if_line}:*"])
    result.stdout.fnmatch_lines(["*assert_no_host_syncs: 1 device-to-host synchronisation(s)*"])


RECOMPILE_FILE = """
import pytest, torch

@pytest.mark.max_recompiles(0)
def test_shape_change():
    double = torch.compile(lambda x: x * 2, backend="eager")
    double(torch.randn(4))
    double(torch.randn(8))

@pytest.mark.max_recompiles(0)
def test_one_shape():
    double = torch.compile(lambda x: x * 3, backend="eager")
    double(torch.randn(3, 3))
    double(torch.randn(3, 3))

@pytest.mark.max_recompiles(1)
def test_allowed_one():
    double = torch.compile(lambda x: x * 4, backend="eager")
    double(torch.randn(2, 5))
    double(torch.randn(2, 6))

shared = torch.compile(lambda x: x - 1, backend="eager")

def test_warms_the_shared_function():
    shared(torch.randn(5))

@pytest.mark.max_recompiles(0)
def test_shared_function_at_a_new_rank():
    shared(torch.randn(5, 5))
"""


def test_max_recompiles_fails_a_shape_change_naming_the_guard_and_passes_otherwise(run_pytest, pytester):
    path = pytester.makepyfile(test_recompiles=RECOMPILE_FILE)
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if "x * 2" in text)
    result = run_pytest("--fusion-device=cpu", "-p", "no:randomly")
    result.assert_outcomes(failed=2, passed=3)
    result.stdout.fnmatch_lines(
        [
            "*@pytest.mark.max_recompiles(0): 1 recompilation(s) during test_recompiles.py::test_shape_change, limit 0*",
            f"*Recompiled <lambda> (test_recompiles.py:{line}): tensor 'x' size mismatch at index 0. expected 4, actual 8",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "*max_recompiles(0): 1 recompilation(s) during test_recompiles.py::test_shared_function_at_a_new_rank*",
            "*rank mismatch*[[]first compiled before this test*",
            "note: 1 of them recompile a function first compiled before this test*",
        ]
    )


# --------------------------------------------------------------------------- on a GPU (the device tool)


class _ScaledBlock(torch.nn.Module):
    def __init__(self, sync: str = "") -> None:
        super().__init__()
        self.fc = torch.nn.Linear(256, 256)
        self.sync = sync

    def forward(self, x):
        y = torch.nn.functional.gelu(self.fc(x))
        if self.sync == "item":
            y = y / y.abs().max().item()
        elif self.sync == "cpu":
            y = y + float(y.mean().cpu())
        return y * 2


@pytest.mark.gpu
@pytest.mark.parametrize("sync, text", [("item", ".item()"), ("cpu", ".cpu()")])
def test_on_a_gpu_a_compiled_models_item_and_cpu_are_measured_syncs_at_their_lines(sync, text):
    torch._dynamo.reset()
    model = torch.compile(_ScaledBlock(sync).cuda())
    report = profile(model, torch.randn(64, 256, device="cuda"))
    lines = {s.source.rsplit(":", 1)[1] for s in report.host_syncs if s.source}
    assert str(_line(_ScaledBlock.forward, text)) in lines, report.host_syncs
    assert all(s.call for s in report.host_syncs), "measured on a GPU: each names its CUDA call"
    with pytest.raises(FusionAssertionError, match="measured: CUDA runtime calls"):
        assert_no_host_syncs(report)


@pytest.mark.gpu
def test_on_a_gpu_a_clean_compiled_model_and_an_explicit_synchronize():
    torch._dynamo.reset()
    model = torch.compile(_ScaledBlock().cuda())
    x = torch.randn(64, 256, device="cuda")
    assert profile(model, x).host_syncs == []

    def step(t):
        y = model(t)
        torch.cuda.synchronize()
        return y

    syncs = profile(step, x).host_syncs
    assert [(s.op, s.source.rsplit(":", 1)[1]) for s in syncs] == [("synchronize", str(_line(step, "synchronize()")))]


@pytest.mark.gpu
def test_on_a_gpu_the_cpu_model_agrees_with_the_measured_syncs():
    x = torch.randn(32, 8, device="cuda")
    for fn in (item_then_scale, mask_select, branch_on_tensor, clean):
        measured = [(s.op, s.source) for s in profile(fn, x).host_syncs]
        modelled = [(s.op, s.source) for s in profile(fn, x.cpu(), device="cpu").host_syncs]
        assert measured == modelled, fn.__name__


GPU_RECOMPILE_FILE = """
import pytest, torch

model = torch.compile(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU()).cuda())

@pytest.mark.max_recompiles(0)
def test_one_shape(fusion):
    fusion.profile(model, torch.randn(16, 64, device="cuda"))
    fusion.profile(model, torch.randn(16, 64, device="cuda"))

@pytest.mark.max_recompiles(0)
def test_new_batch(fusion):
    fusion.profile(model, torch.randn(24, 64, device="cuda"))
"""


@pytest.mark.gpu
def test_on_a_gpu_max_recompiles_fails_an_inductor_models_shape_change_and_passes_its_one_shape(run_pytest, pytester):
    pytester.makepyfile(test_gpu_recompiles=GPU_RECOMPILE_FILE)
    result = run_pytest("--fusion-device=cuda", "-p", "no:randomly")
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines(
        ["*max_recompiles(0): 1 recompilation(s) during test_gpu_recompiles.py::test_new_batch*", "*size mismatch at index 0*"]
    )


def _scaled_after_item(x):
    scale = x.abs().max().item()
    return x / scale


def test_a_recompile_of_the_code_after_a_graph_break_names_the_break_and_why_each_value_recompiles():
    from pytest_fusioncheck.graph_breaks import GraphBreakRecorder

    torch._dynamo.reset()
    fn = torch.compile(_scaled_after_item, backend="eager")
    with GraphBreakRecorder() as rec:
        fn(torch.ones(4))
        fn(torch.ones(4) * 3)  # a new .item() value: the code after the break recompiles
    (recompile,) = rec.recompiles
    assert recompile.resumed and recompile.function == "_scaled_after_item"
    assert recompile.location.endswith(f"test_host_syncs.py:{_line(_scaled_after_item, '.item()')}")
    text = str(recompile)
    assert text.startswith("Recompiled the rest of _scaled_after_item after its graph break (")
    assert "   " not in recompile.reason and "as a Python constant: each new value recompiles" in text
    assert " in torch_dynamo_resume" not in recompile.reason, recompile.reason
