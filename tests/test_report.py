"""Reports: behaviour that mutation testing (docs/mutation.md) found no test pinning.

Each test states what a user reads of a report: the kernel table, the summary line, the
notes, the per-module summary and the JSON fields. Reports are built by hand (no
profiling), so every figure is known in advance.
"""

import dataclasses

import pytest

from pytest_fusioncheck import Budget, FusionReport, Kernel
from pytest_fusioncheck.report import fold_modules, format_bandwidth, format_time, index_ranges, shorten_kernel_name


def _report(kernels=(), device="cpu", **fields):
    return FusionReport(label="made", device=device, kernels=list(kernels), **fields)


class _Chain:
    """Stands in for a headroom chain: what the report asks of one."""

    def __init__(self, text):
        self.text = text
        self.asked = []

    def describe(self, peak, time_s):
        self.asked.append((peak, time_s))
        return self.text

    def to_dict(self):
        return {"chain": self.text}


# --- format_time, format_bandwidth, shorten_kernel_name --------------------------------


@pytest.mark.parametrize(
    "seconds, text",
    [(None, "-"), (2.5, "2.50 s"), (1.0, "1.00 s"), (0.999, "999.00 ms"), (1e-3, "1.00 ms"), (5e-6, "5.0 us"), (1.25e-6, "1.2 us")],
)
def test_format_time_picks_the_unit_at_its_boundaries(seconds, text):
    """Catches a unit boundary moved (`>=` into `>`), a wrong scale or a wrong precision."""
    assert format_time(seconds) == text


@pytest.mark.parametrize("rate, text", [(None, "-"), (0.0, "-"), (1.5e12, "1500 GB/s"), (2.4e9, "2 GB/s"), (3.5e9, "4 GB/s"),
                                        (2.7e8, "270 MB/s"), (4e5, "0 MB/s")])
def test_format_bandwidth_is_in_gb_per_second_and_a_dash_when_unknown(rate, text):
    """Catches decimal GB turned into another unit, or an unknown or zero rate printed as a number."""
    assert format_bandwidth(rate) == text


@pytest.mark.parametrize(
    "name, short",
    [
        ("void at::native::f<int, a<b>>(float, c<d>)", "f<…>"),
        ("ns::kernel(int)", "kernel"),
        ("void kernel<3>", "kernel<…>"),
        ("  triton_poi_fused_add_0  ", "triton_poi_fused_add_0"),
        ("plain(name)", "plain(name)"),
        ("void a::b", "void a::b"),
        ("static void ns::k<1>(int)", "k<…>"),
        ("x" * 61, "x" * 59 + "…"),
        ("x" * 60, "x" * 60),
        ("   ", "   "),
    ],
)
def test_shorten_kernel_name_strips_templates_arguments_and_namespaces_only_of_cxx_names(name, short):
    """Catches nested brackets closed early, a C++ name not recognised (by `void ` or `::`),
    a name without brackets or without C++ markers rewritten, the cut at 60 characters off
    by one, and a name that shortens to nothing shown empty."""
    assert shorten_kernel_name(name) == short


def test_shorten_kernel_name_cuts_at_the_width_asked_for():
    """Catches the width argument ignored."""
    assert shorten_kernel_name("abcdefghij", width=5) == "abcd…"
    assert Kernel(name="void ns::k<1>(int)").short_name == "k<…>"


# --- fold_modules and module_summary -----------------------------------------------------


def test_fold_modules_folds_layer_indices_and_orders_by_time():
    """Catches an index inside a name folded (`layer10x`), a leading or trailing index not
    folded, kernels of a missing module dropped, copies or counts miscounted, a missing time
    or byte figure not read as 0, and rows not ordered by most time first."""
    rows = fold_modules(
        [
            ("layers.0.mlp", 1.0, 10),
            ("layers.0.mlp", 1.0, None),
            ("layers.1.mlp", 1.0, 10),
            ("layers.1.mlp", None, 10),
            ("0.attn", 0.5, 1),
            ("1.attn", 0.5, 1),
            ("layer10x.fc", 4.0, 2),
            (None, 0.25, 3),
            ("blocks.12", 0.1, 4),
        ]
    )
    assert rows == [
        ("layer10x.fc", 1, 1, 4.0, 2),
        ("layers.*.mlp", 2, 2, 3.0, 30),
        ("*.attn", 1, 2, 1.0, 2),
        ("(no module)", 1, 1, 0.25, 3),
        ("blocks.*", 1, 1, 0.1, 4),
    ]


def test_fold_modules_gives_an_uneven_pattern_its_total_as_one_copy():
    """Catches kernels that do not split evenly over copies divided anyway."""
    rows = fold_modules([("l.0", 1.0, 1), ("l.0", 1.0, 1), ("l.1", 1.0, 1)])
    assert rows == [("l.*", 3, 1, 3.0, 3)]


def test_the_module_summary_shows_counts_copies_time_and_bytes_and_how_many_rows_it_hid():
    """Catches the heading, the `x copies` part (shown for one copy), `kernel` pluralised
    wrongly, the row limit or the count of hidden rows wrong."""
    kernels = [Kernel(name="k", time_s=2e-3, bytes=2048, module=f"m{i}.layers.{j}") for i in range(3) for j in range(2)]
    report = _report(kernels)
    assert report.module_summary(max_rows=2) == [
        "per module (repeated structure folded):",
        "  m0.layers.*: 1 kernel x 2, 4.00 ms, 4.0 KiB",
        "  m1.layers.*: 1 kernel x 2, 4.00 ms, 4.0 KiB",
        "  ... 1 more",
    ]
    assert report.module_summary(max_rows=3)[-1] == "  m2.layers.*: 1 kernel x 2, 4.00 ms, 4.0 KiB"
    single = _report([Kernel(name="k", time_s=1.0, bytes=1, module="head")])
    assert single.module_summary() == ["per module (repeated structure folded):", "  head: 1 kernel, 1.00 s, 1 B"]
    pair = _report([Kernel(name="k", time_s=1.0, bytes=1, module="head") for _ in range(2)])
    assert pair.module_summary()[1] == "  head: 2 kernels, 2.00 s, 2 B"


def test_the_module_summary_shows_twelve_rows_by_default():
    """Catches the default row limit changed."""
    report = _report([Kernel(name="k", time_s=1.0 + i, module=f"m{i}") for i in range(13)])
    lines = report.module_summary()
    assert len(lines) == 14 and lines[-1] == "  ... 1 more"


# --- figures -----------------------------------------------------------------------------


def test_byte_and_time_figures_sum_kernels_and_count_the_unmodelled():
    """Catches copies counted in the bytes, an unmodelled kernel counted as modelled, device
    time without the copies, and measured bytes given when a kernel has none."""
    kernels = [Kernel(name="a", bytes=100, time_s=1.0), Kernel(name="b", bytes=None, time_s=2.0), Kernel(name="c", bytes=0, time_s=0.5)]
    report = _report(kernels, copies=[Kernel(name="copy", kind="copy", bytes=1000, time_s=4.0)])
    assert report.kernel_count == 3
    assert report.bytes == 100
    assert report.bytes_unmodelled == 1
    assert report.unmodelled_kernels == [1]
    assert report.kernel_time_s == 3.5
    assert report.device_time_s == 7.5
    assert report.bytes_measured is None
    assert _report().bytes_measured is None
    measured = _report([Kernel(name="a", bytes_measured=5), Kernel(name="b", bytes_measured=7)])
    assert measured.bytes_measured == 12
    partly = _report([Kernel(name="a", bytes_measured=5), Kernel(name="b")])
    assert partly.bytes_measured is None


def test_release_drops_the_output_and_trace_and_keeps_the_figures():
    """Catches one of the two references kept alive after release."""
    report = _report([Kernel(name="a", bytes=4)], output=object(), trace=object())
    report.release()
    assert (report.output, report.trace) == (None, None)
    assert report.bytes == 4


def test_a_report_holds_no_callable_that_could_time_it_later():
    """Catches a timer closure (over the call's inputs) back on the report: capture times a
    call or does not; nothing measures after it returns (docs/bytes.md, "Time")."""
    report = _report([Kernel(name="a", bytes=4)], budget=Budget(read_bytes=4), time_s=1.0, peak_bandwidth=4.0)
    assert not any(callable(getattr(report, f.name)) for f in dataclasses.fields(report))
    assert "timer" not in {f.name for f in dataclasses.fields(report)}


def test_launch_overhead_is_wall_time_less_device_time_on_cuda_only():
    """Catches the overhead given on CPU or with an unknown time, or a negative overhead."""
    assert _report(device="cuda", time_s=1.0, wall_time_s=4.0).launch_overhead_s == 3.0
    assert _report(device="cuda", time_s=5.0, wall_time_s=4.0).launch_overhead_s == 0.0
    assert _report(device="cpu", time_s=1.0, wall_time_s=4.0).launch_overhead_s is None
    assert _report(device="cuda", time_s=None, wall_time_s=4.0).launch_overhead_s is None
    assert _report(device="cuda", time_s=1.0, wall_time_s=None).launch_overhead_s is None
    assert _report(device="cuda", time_s=1.0, wall_time_s=4.0).launch_overhead_share == 0.75
    assert _report(device="cuda", time_s=0.0, wall_time_s=0.0).launch_overhead_share is None
    assert _report(device="cpu", time_s=1.0, wall_time_s=4.0).launch_overhead_share is None


def test_timed_figures_are_the_medians_when_the_call_was_timed_else_the_profiled_calls():
    """Catches efficiency or the launch overhead taken from the profiled call when a median
    exists, `time_s` overwritten by the median, or the medians used without a median time."""
    budget = Budget(read_bytes=600, write_bytes=400)
    timed = _report(device="cuda", budget=budget, time_s=8.0, wall_time_s=40.0, peak_bandwidth=1000.0,
                    median_time_s=4.0, median_wall_time_s=5.0, median_source="median device time of 10 runs, L2 flushed")
    assert timed.timed == (4.0, 5.0, "median device time of 10 runs, L2 flushed")
    assert (timed.efficiency, timed.launch_overhead_s, timed.launch_overhead_share) == (0.25, 1.0, 0.2)
    assert (timed.time_s, timed.wall_time_s) == (8.0, 40.0)
    untimed = _report(device="cuda", budget=budget, time_s=8.0, wall_time_s=40.0, peak_bandwidth=1000.0, time_source="p")
    assert untimed.timed == (8.0, 40.0, "p")
    assert (untimed.efficiency, untimed.launch_overhead_s) == (0.125, 32.0)
    assert "time 4.00 s (median)" in timed.summary() and "time 8.00 s," in untimed.summary()


def _tiny(n, each, wall, device="cuda"):
    kernels = [Kernel(name="k", time_s=each) for _ in range(n)]
    return _report(kernels, device=device, time_s=n * each, wall_time_s=wall)


def test_launch_bound_needs_more_than_half_the_wall_time_idle_and_kernels_under_ten_us():
    """Catches the idle share compared with `>=` or another fraction, the per-kernel time
    compared with `<=`, `and` turned into `or`, the mean taken over something else, and a
    region with no kernels or no wall time called launch-bound."""
    assert _tiny(4, 1e-6, 1e-5).launch_bound  # 60% idle, 1 us each
    assert not _tiny(4, 1e-6, 8e-6).launch_bound  # exactly 50% idle
    assert not _tiny(2, 10e-6, 1e-4).launch_bound  # exactly 10 us each
    assert _tiny(2, 9e-6, 1e-4).launch_bound
    assert not _tiny(2, 20e-6, 1e-3).launch_bound  # idle, but long kernels
    assert not _tiny(4, 1e-6, 4.1e-6).launch_bound  # short kernels, device busy
    assert not _tiny(4, 1e-6, 1e-3, device="cpu").launch_bound
    assert not _report(device="cuda", time_s=1e-6, wall_time_s=1.0).launch_bound


def test_the_cuda_kernel_range_adds_one_per_gemm_op_on_cpu_only():
    """Catches a GEMM op missing from the list, other ops counted, or the range widened on CUDA."""
    ops = ["aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addbmm", "aten::matmul", "aten::linear"]
    ops += ["aten::_addmm_activation", "aten::addmv", "aten::mv", "aten::add", "mm", ""]
    kernels = [Kernel(name="k", op=op) for op in ops]
    assert _report(kernels).cuda_kernel_range == (13, 23)
    assert _report(kernels, device="cuda").cuda_kernel_range == (13, 13)


def test_efficiency_is_the_budget_at_peak_over_the_time_and_none_when_a_figure_is_missing():
    """Catches the ratio inverted, or given without a budget, a time or a peak bandwidth."""
    budget = Budget(read_bytes=600, write_bytes=400)
    assert _report(budget=budget, time_s=4.0, peak_bandwidth=1000.0).efficiency == 0.25
    assert _report(budget=None, time_s=4.0, peak_bandwidth=1000.0).efficiency is None
    assert _report(budget=budget, time_s=None, peak_bandwidth=1000.0).efficiency is None
    assert _report(budget=budget, time_s=4.0, peak_bandwidth=None).efficiency is None


def test_the_device_kind_carries_the_gpu_name_only_on_cuda():
    """Catches the device or its name not passed to the baseline key."""
    assert _report(device="cuda", device_name="NVIDIA H200").device_kind == "cuda:NVIDIA H200"
    assert _report(device="cpu", device_name="x").device_kind == "cpu"


# --- the table ---------------------------------------------------------------------------


def test_the_table_aligns_columns_and_lists_copies_after_the_kernels():
    """Catches a column dropped or misaligned (numbers right, text left), placeholders for a
    missing op, source or bytes, and copies not marked `copy` or listed first."""
    kernels = [
        Kernel(name="void ns::add<1>(int)", time_s=2e-6, bytes=4096, op="aten::add", source="t.py:3"),
        Kernel(name="triton_poi_0", time_s=1.5e-3, bytes=None),
    ]
    copies = [Kernel(name="Memcpy HtoD", kind="copy", time_s=1.0, bytes=12)]
    assert _report(kernels, copies=copies).table().splitlines() == [
        "     #  kernel           time    bytes  op         source",
        "     0  add<…>         2.0 us  4.0 KiB  aten::add  t.py:3",
        "     1  triton_poi_0  1.50 ms        ?  -          -",
        "  copy  Memcpy HtoD    1.00 s     12 B  -          -",
    ]


def test_the_table_shows_measured_bytes_and_modules_only_when_some_kernel_has_them():
    """Catches the measured or module column shown when no kernel has one, hidden when one
    has, a missing value not shown as `-`, or the measured column left-aligned."""
    kernels = [Kernel(name="a", bytes=8, bytes_measured=2048, op="o", module="m.0"), Kernel(name="bb", bytes=8)]
    assert _report(kernels).table().splitlines() == [
        "  #  kernel    time  bytes  measured  op  module  source",
        "  0  a       0.0 us    8 B   2.0 KiB  o   m.0     -",
        "  1  bb      0.0 us    8 B         -  -   -       -",
    ]
    copy_module = _report([Kernel(name="a")], copies=[Kernel(name="c", module="m")])
    assert copy_module.table().splitlines()[0].split() == ["#", "kernel", "time", "bytes", "op", "module", "source"]


def test_an_empty_region_says_no_kernels_and_a_long_table_says_how_many_rows_it_hid():
    """Catches the empty table's text, the row limit off by one, or the hidden count wrong."""
    assert _report().table() == "  (no kernels launched)"
    report = _report([Kernel(name=f"k{i}") for i in range(5)])
    lines = report.table(max_rows=3).splitlines()
    assert len(lines) == 5 and lines[-1] == "  ... 2 more rows" and lines[-2].split()[0] == "2"
    assert "more rows" not in report.table(max_rows=5)
    many = _report([Kernel(name="k") for _ in range(61)]).table().splitlines()
    assert len(many) == 62 and many[-1] == "  ... 1 more rows"


# --- the summary line --------------------------------------------------------------------


def test_the_summary_counts_kernels_and_copies_in_singular_and_plural():
    """Catches `kernel`/`copy` pluralised wrongly, or copies mentioned when there are none."""
    one = _report([Kernel(name="a", bytes=4)], copies=[Kernel(name="c")])
    assert one.summary() == "[made] on cpu: 1 kernel, 1 copy, 4 B modelled, time -"
    two = _report([Kernel(name="a"), Kernel(name="b")], copies=[Kernel(name="c"), Kernel(name="d")], time_s=0.5)
    assert two.summary() == "[made] on cpu: 2 kernels, 2 copies, 0 B (+2 unmodelled) modelled, time 500.00 ms"
    assert _report().summary() == "[made] on cpu: 0 kernels, 0 B modelled, time -"


def test_the_summary_gives_measured_bytes_budget_wall_time_and_efficiency():
    """Catches measured bytes, the budget, the wall time (CUDA only) or the efficiency left
    out or formatted wrongly."""
    kernels = [Kernel(name="a", bytes=2048, bytes_measured=4096, time_s=0.5)]
    report = _report(
        kernels, device="cuda", device_name="H", budget=Budget(read_bytes=1024), time_s=0.5, wall_time_s=0.6, peak_bandwidth=4096.0
    )
    assert report.summary() == (
        "[made] on cuda:H: 1 kernel, 2.0 KiB modelled, 4.0 KiB measured, budget 1.0 KiB, time 500.00 ms, "
        "wall 600.00 ms, 50% of 0 MB/s"
    )
    cpu = _report(kernels, time_s=0.5, wall_time_s=0.6)
    assert "wall" not in cpu.summary()
    no_wall = _report(kernels, device="cuda", time_s=0.5)
    assert "wall" not in no_wall.summary()


def test_the_summary_says_launch_bound_with_the_idle_share():
    """Catches the launch-bound remark missing, shown when not launch-bound, or its share wrong."""
    assert _tiny(4, 1e-6, 1e-5).summary().endswith("wall 10.0 us, launch-bound (60% of the wall time idle)")
    assert "launch-bound" not in _tiny(4, 1e-6, 8e-6).summary()


def test_a_cpu_report_with_generated_kernels_says_cuda_may_launch_more():
    gemm = Kernel(name="aten::mm", op="aten::mm")
    fused = Kernel(name="cpp_fused_add_0", op="fused: add")
    assert _report([gemm, fused]).summary().endswith(
        "on CUDA 2-3 kernels (1 GEMM(s) may add a split-K reduce; more where Inductor's CUDA backend splits a C++ kernel)")
    assert _report([fused]).summary().endswith("on CUDA 1 kernel (more where Inductor's CUDA backend splits a C++ kernel)")
    assert "Inductor's CUDA backend" not in _report([fused], device="cuda").summary()


def test_the_summary_of_a_cpu_report_with_gemms_gives_the_cuda_kernel_range():
    """Catches the split-K range left out, shown with no GEMM, or with the wrong figures."""
    report = _report([Kernel(name="a", op="aten::mm"), Kernel(name="b", op="aten::addmm"), Kernel(name="c", op="aten::add")])
    assert report.summary().endswith("time -, on CUDA 3-5 kernels (2 GEMM(s) may add a split-K reduce)")
    assert "split-K" not in _report([Kernel(name="c", op="aten::add")]).summary()


# --- notes -------------------------------------------------------------------------------


def test_notes_lead_with_the_top_headroom_chain_then_warnings_then_unmodelled_kernels():
    """Catches the headroom note missing, describing another chain, given the wrong time
    (CPU time is not device time), the count of further chains wrong, or notes reordered."""
    first, second, third = _Chain("fuse a+b"), _Chain("x"), _Chain("y")
    report = _report([Kernel(name="a")], headroom=[first, second, third], warnings=["w1", "w2"], peak_bandwidth=7.0, time_s=3.0)
    assert report.notes() == [
        "headroom: fuse a+b (+2 more chain(s))",
        "w1",
        "w2",
        "1 kernel(s) have no byte model (bytes '?': #0); modelled bytes are a lower bound",
    ]
    assert first.asked == [(7.0, None)] and second.asked == []
    cuda = _report([Kernel(name="a", bytes=1)], device="cuda", headroom=[first], peak_bandwidth=7.0, time_s=3.0)
    assert cuda.notes() == ["headroom: fuse a+b"]
    assert first.asked[-1] == (7.0, 3.0)
    two = _report([Kernel(name="a", bytes=1)], headroom=[first, second])
    assert two.notes() == ["headroom: fuse a+b (+1 more chain(s))"]


def test_the_unmodelled_note_lists_the_kernels_as_runs_of_indices():
    """Catches the indices listed one by one, a run broken or merged wrongly, or the note
    given for a kernel that has a model (even of 0 bytes)."""
    eleven = _report([Kernel(name="k") for _ in range(11)]).notes()
    assert eleven == ["11 kernel(s) have no byte model (bytes '?': #0-10); modelled bytes are a lower bound"]
    gaps = _report([Kernel(name="k", bytes=None if i in (0, 2, 3, 5) else 1) for i in range(6)]).notes()
    assert gaps == ["4 kernel(s) have no byte model (bytes '?': #0, 2-3, 5); modelled bytes are a lower bound"]
    assert _report([Kernel(name="k", bytes=0)]).notes() == []


@pytest.mark.parametrize(
    "indices, text",
    [
        ([], ""),
        ([4], "4"),
        ([0, 1], "0-1"),
        ([3, 1, 2, 2], "1-3"),
        ([0, 2, 4], "0, 2, 4"),
        ([0, 1, 2, 3, 4, 5, 6, 11, 12, 13, 14, 15, 16, 17, 22], "0-6, 11-17, 22"),
        (list(range(0, 12, 2)), "0, 2, 4, 6, 8, 10"),  # six runs: all shown
        (list(range(0, 14, 2)), "0, 2, 4, 6, 8, 10, ... (7 in all)"),
    ],
)
def test_index_ranges_compress_runs_and_cut_after_six_of_them(indices, text):
    """Catches a run's end off by one, duplicates or order kept, or the cut after six runs
    (and its count of indices) wrong."""
    assert index_ranges(indices) == text
    assert index_ranges(list(range(0, 8, 2)), max_groups=2) == "0, 2, ... (4 in all)"


def test_a_generated_kernel_whose_estimate_differs_by_more_than_five_percent_is_noted():
    """Catches the 5% threshold moved or compared with `>=`, the note for a kernel without an
    estimate or without a model, or the wrong kernel index or figures."""
    kernels = [
        Kernel(name="t0", bytes=1000, bytes_estimate=1050),  # exactly 5%: no note
        Kernel(name="t1", bytes=1000, bytes_estimate=1051),
        Kernel(name="t2", bytes=1000, bytes_estimate=949),
        Kernel(name="t3", bytes=None, bytes_estimate=5000),
        Kernel(name="t4", bytes=1000, bytes_estimate=None),
        Kernel(name="t5", bytes=0, bytes_estimate=1),  # 5% of at least 1 byte
    ]
    notes = _report(kernels).notes()
    assert notes[1:] == [
        "#1 t1: compulsory 1000 B, Inductor's estimate 1.0 KiB (counts in-kernel re-reads; docs/bytes.md)",
        "#2 t2: compulsory 1000 B, Inductor's estimate 949 B (counts in-kernel re-reads; docs/bytes.md)",
        "#5 t5: compulsory 0 B, Inductor's estimate 1 B (counts in-kernel re-reads; docs/bytes.md)",
    ]
    assert notes[0].startswith("1 kernel(s) have no byte model (bytes '?': #3)")


# --- str and to_dict ---------------------------------------------------------------------


def test_str_of_a_long_report_is_summary_module_summary_top_kernels_then_notes():
    """Catches a part missing, in another order, every row shown, or notes without their
    `  note: ` prefix; text(full=True) shows every row."""
    kernels = [Kernel(name="k", bytes=None, module="layers.0")] + [Kernel(name="k", bytes=1, module="layers.1") for _ in range(30)]
    report = _report(kernels, warnings=["careful"])
    notes = ["  note: careful", "  note: " + report.notes()[1]]
    assert str(report).splitlines() == [report.summary(), *report.module_summary(), *report.top_table(), *notes]
    assert report.text(full=True).splitlines() == [report.summary(), *report.module_summary(), *report.table(max_rows=None).splitlines(), *notes]
    short = _report([Kernel(name="k", bytes=1)])
    assert str(short) == short.summary() + "\n" + short.table() == short.text(full=True)


def test_the_top_table_ranks_rows_by_time_and_says_how_many_rows_it_left_out_and_where_they_are():
    """Catches rows ranked the other way, ties out of launch order, copies left out of the
    ranking, the original indices lost, or the closing line's count or pointers wrong."""
    kernels = [Kernel(name=f"k{i}", time_s=(i % 5) * 1e-6, bytes=i) for i in range(12)]
    copies = [Kernel(name="Memcpy", kind="copy", time_s=1.0, bytes=8)]
    report = _report(kernels, device="cuda", copies=copies)
    lines = report.top_table(3)
    assert lines[0] == "top 3 of 13 rows by device time:"
    assert [line.split()[:2] for line in lines[2:5]] == [["copy", "Memcpy"], ["4", "k4"], ["9", "k9"]]
    assert lines[-1] == "  ... 10 more rows not shown; every row: report.table() or report.text(full=True), --fusion-json, --fusion-html"
    assert _report(kernels).top_rows(1)[1] == "time"  # CPU: the ops' wall time
    untimed = _report([Kernel(name=f"k{i}", bytes=i) for i in range(4)])
    top, by = untimed.top_rows(2)
    assert by == "modelled bytes" and [k.name for _, k in top] == ["k3", "k2"]
    assert _report(kernels[:2]).top_table(3) == _report(kernels[:2]).table().splitlines()  # nothing to leave out
    assert _report(kernels[:3]).top_table(3) == _report(kernels[:3]).table().splitlines()  # exactly n: all of them


def test_the_top_rows_keep_launch_order_in_ties_and_rank_unmodelled_rows_as_zero_bytes():
    """Catches ties ordered by the row's label (as text, "10" before "9") instead of its
    index, and an unmodelled kernel ranked as if it moved bytes."""
    tied = _report([Kernel(name=f"k{i}", time_s=1e-6) for i in range(12)])
    assert [k.name for _, k in tied.top_rows(3)[0]] == ["k0", "k1", "k2"]
    untimed = _report([Kernel(name="unmodelled", bytes=None), Kernel(name="zero", bytes=0), Kernel(name="one", bytes=1)])
    assert [k.name for _, k in untimed.top_rows(3)[0]] == ["one", "unmodelled", "zero"]


def test_details_cut_a_long_report_to_its_top_rows_and_a_short_one_with_many_copies_at_sixty_rows():
    """Catches `details()` showing every row by default, or the 60-row cut of a short
    report's table (30 kernels and 31 copies) moved or dropped."""
    long = _report([Kernel(name=f"k{i}", time_s=i * 1e-6, module="layers.0") for i in range(31)])
    assert long.details() == [*long.module_summary(), *long.top_table()]
    assert long.details(full=True) == [*long.module_summary(), *long.table(max_rows=None).splitlines()]
    copies = [Kernel(name="Memcpy", kind="copy", bytes=8) for _ in range(31)]
    short = _report([Kernel(name=f"k{i}", bytes=1) for i in range(30)], copies=copies)
    assert short.details() == short.table(max_rows=60).splitlines()
    assert short.details()[-1] == "  ... 1 more rows" and len(short.details()) == 1 + 60 + 1  # header, rows, cut
    assert short.details(full=True) == short.table(max_rows=None).splitlines()  # header and 61 rows, no cut
    assert "more rows" not in short.details(full=True)[-1]


@pytest.mark.parametrize("n, shown", [(31, True), (30, False)])
def test_a_report_of_more_than_thirty_kernels_shows_the_top_ten_rows_only(n, shown):
    """Catches the threshold moved or compared with `>=`, or a long table shown whole."""
    report = _report([Kernel(name=f"k{i}", time_s=i * 1e-6) for i in range(n)])
    text = str(report)
    assert ("top 10 of" in text) is shown
    assert len([line for line in text.splitlines() if line.strip().startswith(("k", "0", "1", "2", "3"))]) >= 10
    assert (len(text.splitlines()) < 16) is shown


@pytest.mark.parametrize("n, module, shown", [(31, "m", True), (30, "m", False), (2, "m", False), (31, None, False)])
def test_str_leads_with_the_module_summary_only_for_more_than_thirty_kernels_with_modules(n, module, shown):
    """Catches the module summary shown for 30 kernels or fewer, or for kernels without a module."""
    report = _report([Kernel(name="k", bytes=1, module=module) for _ in range(n)])
    assert ("per module" in str(report)) is shown


def test_kernel_to_dict_gives_every_public_field_and_no_private_one():
    """Catches a public field dropped, or the start time or read/write maps leaked."""
    k = Kernel(name="n", time_s=1.0, bytes=2, bytes_measured=3, op="o", source="s", kind="copy", bytes_estimate=4,
               start_ns=9, module="m", reads={1: 2}, writes={3: 4}, flops=5, flops_estimated=True, dtype="tf32")
    assert k.to_dict() == {
        "name": "n", "time_s": 1.0, "bytes": 2, "bytes_measured": 3, "op": "o", "source": "s", "kind": "copy",
        "bytes_estimate": 4, "module": "m", "flops": 5, "flops_estimated": True, "dtype": "tf32",
    }


def test_report_to_dict_gives_every_figure():
    """Catches a field dropped, renamed or filled from the wrong figure, and graph breaks
    without a `to_dict` not written as text."""

    class _Break:
        def to_dict(self):
            return {"reason": "print"}

    kernels = [Kernel(name="a", bytes=10, bytes_measured=20, time_s=1e-6, op="aten::mm")]
    chain = _Chain("c")
    report = FusionReport(
        label="L", device="cuda", device_name="G", kernels=kernels, copies=[Kernel(name="c")], budget=Budget(read_bytes=8),
        time_s=1e-6, time_source="events", peak_bandwidth=8e6, graph_breaks=[_Break(), "text break"], recompiles=["r"],
        host_syncs=[_Break()], source="t.py:1", warnings=["w"], seq=7, wall_time_s=1e-5, headroom=[chain],
    )
    assert report.to_dict() == {
        "label": "L",
        "device": "cuda",
        "device_kind": "cuda:G",
        "kernel_count": 1,
        "kernels": [kernels[0].to_dict()],
        "copies": [Kernel(name="c").to_dict()],
        "bytes": 10,
        "bytes_unmodelled": 0,
        "bytes_measured": 20,
        "budget": Budget(read_bytes=8).to_dict(),
        "time_s": 1e-6,
        "time_source": "events",
        "wall_time_s": 1e-5,
        "median_time_s": None,
        "median_wall_time_s": None,
        "median_source": None,
        "launch_overhead_s": pytest.approx(9e-6),
        "cuda_kernel_range": [1, 1],
        "launch_bound": True,
        "graph_time_s": None,
        "graph_recovered_share": None,
        "graph_note": None,
        "peak_bandwidth": 8e6,
        "efficiency": pytest.approx(1.0),
        "graph_breaks": [{"reason": "print"}, "text break"],
        "recompiles": ["r"],
        "host_syncs": [{"reason": "print"}],
        "source": "t.py:1",
        "warnings": ["w"],
        "headroom": [{"chain": "c"}],
        "seq": 7,
    }
    assert _report().to_dict()["budget"] is None
