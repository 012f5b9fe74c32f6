"""The figures behind byte and bandwidth verdicts, on CPU: which kernel gets an op's bytes,
compulsory bytes of generated kernels, Triton launches (declared, TMA, unmodelled),
module weights in the default budget, unmodelled kernels in verdicts, per-repeat device
time. The same paths on a GPU: tests/test_gpu.py."""

from __future__ import annotations

import functools
import re
import types
import warnings

import pytest
import torch
import torch.nn.functional as F

from pytest_fusioncheck import (
    Budget,
    FusionAssertionError,
    FusionCheckWarning,
    FusionReport,
    Kernel,
    assert_bandwidth_bound_within,
    assert_hbm_bytes_within,
    profile,
)
from pytest_fusioncheck.sources.bytes_model import buffer_accesses, compulsory_bytes, launch_tensors, touched_elements, triton_launch_bytes
from pytest_fusioncheck.budget import callable_modules, default_budget
from pytest_fusioncheck.sources.kernels_cuda import attribute_op_bytes, copy_sizes_from_trace, copy_traffic
from pytest_fusioncheck.sources.time_device import per_rep_device_time

MiB = 2**20


# --------------------------------------------------------------------------- op bytes -> kernels


def _k(name, time_s, kind="kernel"):
    return Kernel(name=name, time_s=time_s, kind=kind)


def test_a_gemm_with_a_workspace_memset_gets_the_ops_bytes_and_the_memset_keeps_its_own():
    memset = _k("Memset (Device)", 0.8e-6, "copy")
    memset.bytes = 4096
    gemm = _k("nvjet_tst_128x256_64x4", 200e-6)
    attribute_op_bytes([memset, gemm], 448 * MiB)
    assert gemm.bytes == 448 * MiB
    assert memset.bytes == 4096


def test_a_split_k_gemm_and_its_reduce_put_the_ops_bytes_on_the_longer_kernel_and_0_on_the_reduce():
    main, reduce = _k("gemm_splitk", 90e-6), _k("splitKreduce_kernel", 5e-6)
    attribute_op_bytes([main, reduce], 1000)
    assert (main.bytes, reduce.bytes) == (1000, 0)
    attribute_op_bytes([reduce, main], 1000)  # launch order does not matter
    assert (main.bytes, reduce.bytes) == (1000, 0)


def test_a_multi_tensor_apply_op_shares_its_bytes_over_its_launches_by_device_time():
    # fused AdamW over six tensors: five launches of one kernel, each memory-bound on its chunk
    launches = [_k("multi_tensor_apply_kernel", t) for t in (100e-6, 100e-6, 120e-6, 80e-6, 100e-6)]
    memset = _k("Memset (Device)", 1e-6, "copy")
    memset.bytes = 64
    attribute_op_bytes(launches + [memset], 5000 * MiB)
    assert [k.bytes for k in launches] == [1000 * MiB, 1000 * MiB, 1200 * MiB, 800 * MiB, 1000 * MiB]
    assert sum(k.bytes for k in launches) == 5000 * MiB and memset.bytes == 64


def test_launches_of_another_kernel_than_the_longest_carry_0_and_the_split_adds_up_exactly():
    a, b, other = _k("chunk", 3e-6), _k("chunk", 3e-6), _k("tail_reduce", 1e-6)
    attribute_op_bytes([a, other, b], 1001)
    assert other.bytes == 0 and a.bytes + b.bytes == 1001 and abs(a.bytes - b.bytes) <= 1
    zero = [_k("k", 0.0), _k("k", 0.0)]
    attribute_op_bytes(zero, 10)  # no time known: equal shares
    assert [k.bytes for k in zero] == [5, 5]


def test_an_op_without_a_model_leaves_every_kernel_it_launched_unmodelled():
    a, b = _k("k0", 1e-6), _k("k1", 2e-6)
    attribute_op_bytes([a, b], None)
    assert a.bytes is None and b.bytes is None


def test_copies_count_device_to_device_twice_and_memsets_and_host_transfers_once():
    assert copy_traffic("Memcpy DtoD (Device -> Device)", 100) == 200
    assert copy_traffic("Memcpy HtoD (Pageable -> Device)", 100) == 100
    assert copy_traffic("Memset (Device)", 100) == 100
    assert copy_traffic("Memset (Device)", None) is None


def test_copy_sizes_come_from_the_traces_memcpy_and_memset_events_by_correlation():
    trace = {
        "traceEvents": [
            {"name": "Memset (Device)", "cat": "gpu_memset", "args": {"correlation": 21, "bytes": 4}},
            {"name": "cudaMemsetAsync", "cat": "cuda_runtime", "args": {"correlation": 21}},
            {"name": "Memcpy DtoD (Device -> Device)", "cat": "gpu_memcpy", "args": {"correlation": 45, "bytes": 1048576}},
            {"name": "k", "cat": "kernel", "args": {"correlation": 46}},
        ]
    }
    assert copy_sizes_from_trace(trace) == {21: 4, 45: 1048576}
    assert copy_sizes_from_trace({}) == {}


# --------------------------------------------------------------------------- compulsory bytes


def test_compulsory_bytes_count_reads_and_writes_once_and_in_place_both_ways():
    assert compulsory_bytes([("r", 100), ("w", 10), ("rw", 7)]) == 124
    with pytest.raises(ValueError, match="access must be"):
        compulsory_bytes([("x", 1)])


def _args(inputs=(), outputs=(), inplace=()):
    from collections import namedtuple

    Inplaced = namedtuple("Inplaced", "inner_name other_names")
    table = {}
    for i, names in enumerate(inplace):
        buf = Inplaced(f"in_out_ptr{i}", list(names))
        for n in names:
            table[n] = buf
    return types.SimpleNamespace(
        input_buffers={n: f"in_ptr{i}" for i, n in enumerate(inputs)},
        output_buffers={n: f"out_ptr{i}" for i, n in enumerate(outputs)},
        inplace_buffers=table,
    )


def test_an_in_place_buffer_the_kernel_produced_itself_is_written_once_not_read_back():
    # layer_norm + gelu: buf3 (the norm) is stored, then overwritten by the gelu (buf4)
    args = _args(inputs=["x", "w", "b"], outputs=["buf3"], inplace=[["buf3", "buf4"]])
    sizes = {"x": 100, "w": 1, "b": 1, "buf3": 100, "buf4": 100}
    got = buffer_accesses(args, sizes.__getitem__)
    assert sorted(got) == [("r", 1), ("r", 1), ("r", 100), ("w", 100)]
    assert compulsory_bytes(got) == 202  # Inductor's estimate would say 302


def test_a_triton_kernel_whose_output_table_dropped_the_produced_buffer_still_writes_it_once():
    # the same chain as Inductor's CUDA backend lays it out: buf0/buf1 (mean, rstd) removed,
    # buf3 in no table but the in-place one; the nodes say the kernel writes buf3
    args = _args(inputs=["x", "w", "b"], outputs=["buf0", "buf1"], inplace=[["buf3", "buf4"]])
    args.output_buffers = {k: "REMOVED" for k in args.output_buffers}
    sizes = {"x": 100, "w": 1, "b": 1, "buf3": 100, "buf4": 100}
    got = buffer_accesses(args, sizes.__getitem__, produced={"buf0", "buf1", "buf3", "buf4"})
    assert compulsory_bytes(got) == 202
    assert compulsory_bytes(buffer_accesses(args, sizes.__getitem__)) == 302  # without the nodes: read and written


def test_an_in_place_buffer_that_held_data_before_the_kernel_is_read_and_written():
    args = _args(inputs=["buf0"], inplace=[["buf0", "buf1"]])
    assert buffer_accesses(args, lambda n: 64) == [("rw", 64)]


def test_an_intermediate_only_the_kernel_itself_reads_is_not_compulsory_traffic():
    # the C++ backend keeps a wide softmax's exponentials (buf1) as an output argument
    args = _args(inputs=["x"], outputs=["buf0", "buf1", "buf2", "buf3"])
    sizes = {"x": 100, "buf0": 1, "buf1": 400, "buf2": 1, "buf3": 100}
    assert compulsory_bytes(buffer_accesses(args, sizes.__getitem__, internal={"buf0", "buf1", "buf2"})) == 200


def test_a_compiled_vocab_width_softmax_on_cpu_is_modelled_at_its_budget(fresh_dynamo):
    x = torch.randn(33, 50257, dtype=torch.float16)
    report = profile(torch.compile(lambda t: torch.softmax(t, -1)), x)
    assert report.kernel_count == 1 and report.bytes == report.budget.total == 2 * x.numel() * 2, str(report)


def test_a_mutated_graph_input_in_both_tables_is_read_once_and_written_once():
    args = _args(inputs=["arg0_1"], outputs=["arg0_1"])
    assert buffer_accesses(args, lambda n: 64) == [("rw", 64)]


def test_removed_arguments_are_not_counted():
    args = _args(inputs=["x"], outputs=["buf0", "buf1"])
    args.output_buffers["buf1"] = "REMOVED"
    assert sorted(buffer_accesses(args, lambda n: 8)) == [("r", 8), ("w", 8)]


def test_a_buffer_larger_than_the_iteration_space_counts_one_element_per_point_and_access_pattern():
    assert touched_elements(30522 * 768, 1, 512 * 768) == 512 * 768  # an embedding table, gathered
    assert touched_elements(8192 * 16384, 2, 8192 * 4096) == 2 * 8192 * 4096  # two slices of a wide input
    assert touched_elements(768, 1, 512 * 768) == 768  # a broadcast bias: all of it
    assert touched_elements(100, 0, 10) == 100  # unknown patterns: the whole buffer
    assert touched_elements(100, 1, 0) == 100  # unknown iteration space: the whole buffer


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_a_compiled_layer_norm_gelu_on_cpu_is_modelled_at_its_budget(fresh_dynamo):
    def ln_gelu(x, w, b):
        return F.gelu(F.layer_norm(x, (1024,), w, b))

    x, w, b = torch.randn(1024, 1024), torch.randn(1024), torch.randn(1024)
    report = profile(torch.compile(ln_gelu), x, w, b)
    assert report.kernel_count == 1, str(report)
    k = report.kernels[0]
    assert abs(k.bytes - report.budget.total) <= 0.01 * report.budget.total, str(report)
    assert k.bytes_estimate is not None
    assert_hbm_bytes_within(report=report, slack=1.01)


def test_a_compiled_in_place_multiply_reads_and_writes_its_input(fresh_dynamo):
    def mul_(x):
        x.mul_(2.0)
        return x

    x = torch.randn(1024, 1024)
    report = profile(torch.compile(mul_), x)
    assert report.bytes == 2 * x.numel() * 4, str(report)


def test_a_compiled_embedding_lookup_counts_the_rows_it_gathers_not_the_table(fresh_dynamo):
    table = torch.randn(30522, 256)
    ids = torch.randint(0, 30522, (4, 128))
    report = profile(torch.compile(lambda i, t: F.embedding(i, t) * 2.0), ids, table)
    rows = 4 * 128 * 256 * 4
    assert report.kernel_count == 1, str(report)
    assert report.bytes == rows + ids.numel() * 8 + rows, str(report)


# --------------------------------------------------------------------------- eager op bytes


def test_an_embedding_lookup_reads_the_rows_it_gathers_not_the_whole_table():
    table = torch.randn(30522, 64)
    ids = torch.randint(0, 30522, (8, 16))
    report = profile(F.embedding, ids, table)
    out = 8 * 16 * 64 * 4
    assert report.kernels[0].bytes == out + ids.numel() * 8 + out, str(report)


def test_an_op_whose_traffic_cannot_be_modelled_is_unmodelled_not_zero(monkeypatch):
    import pytest_fusioncheck.ops as kernels

    def broken(*a, **k):
        raise RuntimeError("exotic tensor")

    monkeypatch.setattr(kernels, "op_tensors", broken)
    report = profile(torch.add, torch.ones(4), torch.ones(4))
    assert report.kernels[0].bytes is None
    assert report.bytes_unmodelled == 1
    assert "?" in report.table()
    assert "have no byte model" in str(report)


def test_sparse_arguments_count_their_indices_and_values():
    s = torch.sparse_coo_tensor(torch.tensor([[0, 1], [1, 0]]), torch.tensor([1.0, 2.0]), (2, 2))
    assert Budget.from_tensors(reads=[s]).total == 2 * 2 * 8 + 2 * 4


# --------------------------------------------------------------------------- unmodelled in verdicts


def _report(*kernel_bytes, budget=100):
    kernels = [Kernel(name=f"k{i}", time_s=1e-3, bytes=b, op="triton") for i, b in enumerate(kernel_bytes)]
    return FusionReport(label="r", device="cpu", kernels=kernels, budget=Budget(read_bytes=budget))


def test_a_byte_assertion_on_a_region_with_no_modelled_kernel_fails_and_says_why():
    report = _report(None, None)
    with pytest.raises(FusionAssertionError) as info:
        assert_hbm_bytes_within(report=report)
    message = str(info.value)
    assert "cannot check bytes against budget 100 B: none of the 2 kernel(s) of r has a byte model" in message
    assert re.search(r"\n +0 +k0 +1.00 ms +\? +triton", message), message


def test_a_byte_assertion_that_passes_with_some_kernels_unmodelled_warns_that_the_figure_is_a_lower_bound():
    report = _report(40, None)
    with pytest.warns(FusionCheckWarning, match=r"1 of 2 kernels have no byte model \(#1\): the figure is a lower bound"):
        assert_hbm_bytes_within(report=report)


def test_a_byte_assertion_on_a_fully_modelled_region_passes_silently():
    report = _report(40, 60)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_hbm_bytes_within(report=report)


def test_a_failing_byte_assertion_with_unmodelled_kernels_notes_them():
    with pytest.raises(FusionAssertionError, match=r"(?s)1 kernel\(s\) have no byte model.*lower bound"):
        assert_hbm_bytes_within(report=_report(400, None))


def test_bandwidth_fraction_above_one_is_refused():
    with pytest.raises(ValueError, match=r"fraction must be in \(0, 1\]"):
        assert_bandwidth_bound_within(1.5, report=_report(1))


# --------------------------------------------------------------------------- triton launches


def test_declared_bytes_win_then_tensors_then_unmodelled():
    t = torch.empty(10)
    assert triton_launch_bytes({"bytes": 7}, [t]) == 7
    assert triton_launch_bytes({"name": "x"}, [t]) == 40
    assert triton_launch_bytes(None, []) is None
    assert triton_launch_bytes({"bytes": True}, [t]) == 40  # a bool is not a byte count


def test_tma_descriptors_open_up_to_the_tensor_they_describe():
    x, y = torch.empty(16), torch.empty(8)
    desc = types.SimpleNamespace(base=x, shape=[16], block_shape=[8])
    old_style = types.SimpleNamespace(tensor=y)
    assert launch_tensors([desc, old_style, 3, "s"]) == [x, y]


@pytest.mark.skipif(torch.cuda.is_available(), reason="Triton's interpreter runs only without a GPU here; test_gpu.py launches for real")
def test_an_interpreted_triton_launch_gets_bytes_its_launch_metadata_declares_from_kernel_name():
    import triton
    import triton.language as tl

    seen = []

    def meta(grid, kernel, args):
        seen.append(kernel.name)
        return {"name": f"{kernel.name}[n={args['n']}]", "bytes": 1000 + args["BLOCK"]}

    @triton.jit(launch_metadata=meta)
    def _double(x_ptr, y_ptr, n, BLOCK: tl.constexpr = 16):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)

    x = torch.randn(64)
    y = torch.empty_like(x)
    report = profile(lambda: _double[(4,)](x, y, x.numel()))
    assert seen and seen[0] == "_double"
    assert report.kernels[0].bytes == 1016, str(report)  # the unpassed BLOCK default was filled in
    assert torch.equal(y, 2 * x)


def test_a_triton_warmup_compile_in_a_region_is_not_recorded_as_a_launch():
    """``JITFunction.warmup`` compiles without launching (the split walk reads registers from it)."""
    from pytest_fusioncheck.capture import _Recorders

    rec = _Recorders("cpu", "region")
    calls = []

    def original(jitfn, *args, grid, warmup, **kwargs):
        calls.append(warmup)
        return "compiled"

    jitfn = types.SimpleNamespace(__name__="_k")
    assert rec.triton_launch(jitfn, original, (torch.empty(4),), {}, (1,), True, False) == "compiled"
    assert calls == [True] and rec.triton == []


# --------------------------------------------------------------------------- default budget


class _Lin(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 4)
        self.register_buffer("scale", torch.ones(4))

    def forward(self, x):
        return self.lin(x) * self.scale


WEIGHTS = (8 * 4 + 4 + 4) * 4


@pytest.mark.parametrize(
    "wrap",
    [
        pytest.param(lambda m: m, id="module"),
        pytest.param(lambda m: m.forward, id="bound method"),
        pytest.param(lambda m: functools.partial(lambda mod, x: mod(x), m), id="partial over the module"),
        pytest.param(lambda m: torch.compile(m), id="compiled module"),
        pytest.param(lambda m: torch.compile(m.forward), id="compiled bound method"),
    ],
)
def test_the_default_budget_holds_the_weights_of_the_module_a_callable_is_or_wraps(wrap, fresh_dynamo):
    module = _Lin()
    x = torch.randn(16, 8)
    report = profile(wrap(module), x)
    assert report.budget.total == x.numel() * 4 + WEIGHTS + 16 * 4 * 4, str(report.budget)
    assert "module weights" in report.budget.label


def test_module_arguments_and_plain_functions():
    module = _Lin()
    x = torch.randn(16, 8)
    out = module(x)
    assert default_budget((module, x), {}, out).total == WEIGHTS + x.numel() * 4 + out.numel() * 4
    assert default_budget((x,), {}, out, fn=torch.relu).total == x.numel() * 4 + out.numel() * 4
    assert callable_modules(torch.relu) == []
    assert callable_modules(functools.partial(torch.add, other=module)) == [module]


# --------------------------------------------------------------------------- device time per repeat


def test_device_time_per_repeat_sums_the_activities_launched_inside_each_repeat():
    reps = [(100, 200), (300, 400)]
    launches = {1: 110, 2: 150, 3: 310}
    activities = [(1, 1000, 5), (2, 1010, 7), (3, 2000, 11), (99, 350, 2)]  # 99: a graph node, by its own start
    assert per_rep_device_time(reps, launches, activities) == pytest.approx([12e-9, 13e-9])


def test_repeats_that_launched_nothing_and_activities_outside_every_repeat_are_dropped():
    assert per_rep_device_time([(0, 10), (20, 30)], {1: 5, 2: 50}, [(1, 0, 4), (2, 0, 9)]) == pytest.approx([4e-9])
    assert per_rep_device_time([(0, 10)], {}, []) == []


class _Event:
    def __init__(self, name, activity=None, annotation=False):
        self._name, self._activity, self._annotation = name, activity, annotation

    def name(self):
        return self._name

    def activity_type(self):
        if self._activity is None:
            raise AttributeError("activity_type")  # torch 2.11's events have none
        return self._activity

    def is_user_annotation(self):
        return self._annotation


def test_device_activities_are_classified_in_one_place_for_kernels_and_device_time():
    from pytest_fusioncheck._compat import device_activity_kind

    assert device_activity_kind(_Event("triton_poi_fused_add_0")) == "kernel"
    assert device_activity_kind(_Event("k", "concurrent_kernel")) == "kernel"
    assert device_activity_kind(_Event("Memset (Device)")) == "copy"
    assert device_activity_kind(_Event("x", "gpu_memcpy")) == "copy"
    assert device_activity_kind(_Event("fusioncheck::rep#0")) is None
    assert device_activity_kind(_Event("my_range", "gpu_user_annotation")) is None
    assert device_activity_kind(_Event("my_range", annotation=True)) is None
    assert device_activity_kind(_Event("cudaDeviceSynchronize", "cuda_sync")) is None


# --- when capture times a call (docs/bytes.md, "Time") ----------------------------------------

TIMING = """
import pytest, torch
from pytest_fusioncheck import assert_bandwidth_bound_within

X = torch.randn(256, 256)
TIMED = {}


def double(x):
    return x * 2


def judge(fusion):
    fusion.assert_bandwidth_bound_within(0.01)


def test_counts_only(fusion):
    report = fusion.profile(double, X)
    TIMED["counts_only"] = getattr(report, "median" + "_time_s") is None  # spelled out, the name would ask for timing


def test_asserts_in_its_body(fusion):
    report = fusion.profile(double, X)
    assert_bandwidth_bound_within(0.01)
    TIMED["asserts_in_its_body"] = getattr(report, "median" + "_time_s")


def test_asserts_through_a_helper(fusion):
    report = fusion.profile(double, X)
    judge(fusion)
    TIMED["asserts_through_a_helper"] = getattr(report, "median" + "_time_s")


def test_reads_a_figure_in_a_lambda(fusion):
    report = fusion.profile(double, X)
    TIMED["reads_a_figure_in_a_lambda"] = (lambda r: r.efficiency)(report) and getattr(report, "median" + "_time_s")


@pytest.mark.bandwidth_bound(0.01)
def test_marked(fusion):
    TIMED["marked"] = fusion.profile(double, X).peak_bandwidth


@pytest.mark.fusion_headroom(0.99)
def test_headroom_on_cpu(fusion):
    TIMED["headroom_on_cpu"] = getattr(fusion.profile(double, X), "median" + "_time_s") is None


def test_the_figures():
    assert TIMED.pop("counts_only") is True and TIMED.pop("headroom_on_cpu") is True  # untimed: the profiled call's own
    assert all(TIMED.values()) and len(TIMED) == 4, TIMED
"""


def test_capture_times_a_call_where_the_test_judges_or_reads_a_timed_figure_and_only_there(run_pytest, pytester):
    """Catches timing skipped where a marker, an assertion in the body or a helper of the
    module, or a figure read in a lambda needs it (the verdict would judge one profiled
    call), and timing run for a test that only counts (CPU headroom is bytes: untimed)."""
    pytester.makepyfile(test_timing=TIMING)
    result = run_pytest("--fusion-device=cpu", "-p", "no:randomly")
    result.assert_outcomes(passed=7)


def test_outside_pytest_a_call_is_always_timed():
    """Catches the process-wide log (outside pytest) left untimed: `profile(...).efficiency`
    there has no test code to say it is needed."""
    from pytest_fusioncheck.state import ReportLog

    assert ReportLog().timing is True


def test_an_untimed_report_takes_only_the_sessions_peak_override_whatever_ran_before(current):
    """Catches an untimed report given a peak an earlier test measured (its efficiency would
    then depend on test order), the override ignored, or a region re-run (it cannot be)."""
    from pytest_fusioncheck.capture import Region, profile_call

    log = current
    log.timing = False
    log.settings.peaks["cpu:any"] = 5e9  # measured earlier in the session
    report = profile_call(lambda t: t * 2, (torch.randn(64),), {}, device="cpu")
    assert (report.median_time_s, report.peak_bandwidth, report.efficiency) == (None, None, None)
    log.settings.peak_bandwidth = 7e9
    with Region("block", device="cpu") as region:
        torch.randn(64) * 2
    assert region.report.median_time_s is None and region.report.time_s is not None
    assert region.report.peak_bandwidth == 7e9
