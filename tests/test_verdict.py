"""Verdicts: behaviour that mutation testing (docs/mutation.md) found no test pinning.

Each test states what a user reads when a fusion check passes or fails: which figure is
held against which limit, the exact message, what it leads with, what it warns about.
Reports are built by hand (no profiling), so every figure is known in advance.
"""

import warnings

import copy

import pytest
from conftest import PLUGIN_ARGS

from pytest_fusioncheck import Budget, FusionReport, Kernel, assert_hbm_bytes_within
from pytest_fusioncheck.graph_breaks import GraphBreak, Recompile
from pytest_fusioncheck.headroom import Chain
from pytest_fusioncheck.state import ReportLog, Settings
from pytest_fusioncheck.verdict import (
    FusionAssertionError,
    FusionCheckWarning,
    check_bandwidth,
    check_hbm_bytes,
    check_headroom,
    check_launch_overhead,
    check_max_kernels,
    failure_message,
    headroom_share,
)

KiB = 2**10


def _report(kernels=(), device="cpu", **fields):
    """A report with known figures; a peak bandwidth is always given so that nothing is measured."""
    fields.setdefault("peak_bandwidth", 1e9)
    return FusionReport(label="made", device=device, kernels=list(kernels), **fields)


def _kernels(*nbytes, measured=None):
    measured = measured or [None] * len(nbytes)
    return [Kernel(name=f"k{i}", op=f"aten::op{i}", bytes=b, bytes_measured=m) for i, (b, m) in enumerate(zip(nbytes, measured))]


def _log(counters="none", enforce_cpu_timing=False):
    return ReportLog(test_id="t", settings=Settings(counters=counters, enforce_cpu_timing=enforce_cpu_timing))


def _fails(check, *args, **kwargs):
    with pytest.raises(FusionAssertionError) as info:
        check(*args, **kwargs)
    return str(info.value)


# --- failure_message: what a failure leads with, and in which order -----------------------


def test_a_failure_leads_with_each_graph_break_once_then_recompiles_then_context_then_the_headline():
    """Catches breaks of the report or of the test's log lost or repeated, recompiles or
    context lines dropped, and the parts of the message reordered."""
    first = GraphBreak(reason="print", filename="model.py", lineno=3, code="print(x)")
    second = GraphBreak(reason="item", filename="model.py", lineno=7)
    report = _report(_kernels(8), graph_breaks=[first], recompiles=[Recompile("size changed", "f", "model.py:1"), "guard"])
    log = _log()
    log.graph_breaks += [first, second]
    log.context += [lambda: "", lambda: "baseline: +1 kernel"]
    lines = failure_message(report, "HEADLINE", ["detail 1", "detail 2"], log=log).splitlines()
    assert lines[:8] == [
        "Graph break at model.py:3: print  `print(x)`",
        "Graph break at model.py:7: item",
        "Recompiled: size changed",
        "Recompiled: guard",
        "baseline: +1 kernel",
        "HEADLINE",
        "detail 1",
        "detail 2",
    ]
    assert lines[8] == report.summary()
    assert "\n".join(lines[9:]) == report.table()


def test_a_failure_without_a_log_given_reads_the_current_tests_log(current):
    """Catches the current log ignored (its graph breaks missing from the message)."""
    current.graph_breaks.append(GraphBreak(reason="print", filename="m.py", lineno=1))
    assert failure_message(_report(), "HEADLINE").splitlines()[:2] == ["Graph break at m.py:1: print", "HEADLINE"]


def test_a_failure_ends_with_the_reports_notes():
    """Catches the notes (unmodelled kernels, warnings) left out or written without their prefix."""
    report = _report(_kernels(8, None), warnings=["timing is noisy"])
    lines = failure_message(report, "H", log=_log()).splitlines()
    assert lines[-2:] == [
        "note: timing is noisy",
        "note: 1 kernel(s) have no byte model (bytes '?': #1); modelled bytes are a lower bound",
    ]


def _many_kernels(n, module):
    return [Kernel(name=f"k{i}", op="aten::add", bytes=4, module=module) for i in range(n)]


@pytest.mark.parametrize(
    "n, module, shown", [(31, "layers.0.mlp", True), (30, "layers.0.mlp", False), (31, None, False), (31, "some", True)]
)
def test_a_long_report_with_modules_leads_its_table_with_the_per_module_summary(n, module, shown):
    """Catches the per-module summary shown for 30 kernels or fewer, or for kernels with no
    module, not shown for a long report where only some kernels know their module, or
    shown in place of the headline."""
    kernels = _many_kernels(n, None if module == "some" else module)
    if module == "some":
        kernels[-1].module = "head"
    report = _report(kernels)
    message = failure_message(report, "H", ["detail"], log=_log())
    assert message.splitlines()[:3] == ["H", "detail", report.summary()]
    assert ("\n".join(report.module_summary()) in message) is shown
    assert ("per module" in message) is shown


# --- check_max_kernels -------------------------------------------------------------------


def test_a_kernel_count_at_the_limit_passes_and_one_over_fails_with_count_limit_and_label():
    """Catches the limit applied as < (a count equal to the limit failing) and a wrong headline."""
    report = _report(_kernels(1, 2, 3))
    check_max_kernels(report, 3, log=_log())
    message = _fails(check_max_kernels, report, 2, log=_log())
    assert message.splitlines()[0] == "assert_max_kernels: 3 kernels launched, limit 2 (made)"
    assert _fails(check_max_kernels, report, 2, where="@pytest.mark.max_kernels(2)", log=_log()).startswith(
        "@pytest.mark.max_kernels(2): 3 kernels launched, limit 2 (made)\n"
    )


# --- check_hbm_bytes: which figure, which message ------------------------------------------


def test_bytes_at_the_limit_pass_and_over_it_fail_naming_figure_limit_excess_and_ratio():
    """Catches the limit applied as <, and a wrong excess, ratio or figure in the headline."""
    report = _report(_kernels(3 * KiB, 1 * KiB))
    check_hbm_bytes(report, 4 * KiB, "budget", "w", log=_log())
    message = _fails(check_hbm_bytes, report, 2 * KiB, "budget", "w", log=_log())
    assert message.splitlines()[0] == "w: 4.0 KiB modelled > budget 2.0 KiB (excess 2.0 KiB, 2.00x) (made)"


def test_bytes_over_a_zero_limit_fail_without_a_ratio():
    """Catches the zero-limit headline lost (a division by zero instead of the verdict)."""
    message = _fails(check_hbm_bytes, _report(_kernels(8)), 0, "limit", "w", log=_log())
    assert message.splitlines()[0] == "w: 8 B modelled > limit 0 B (made)"
    assert "  #0 k0: 8 B (-) aten::op0" in message.splitlines()


def test_with_counters_on_the_measured_bytes_are_checked_and_with_them_off_the_modelled_ones():
    """Catches the measured figure used with counters off, or ignored with them on."""
    report = _report(_kernels(100, 100, measured=[300, 300]))
    check_hbm_bytes(report, 200, "limit", "w", log=_log("none"))
    message = _fails(check_hbm_bytes, report, 200, "limit", "w", log=_log("ncu"))
    assert message.splitlines()[0] == "w: 600 B measured > limit 200 B (excess 400 B, 3.00x) (made)"
    assert message.splitlines()[1:4] == ["kernels by bytes (share of the budget):", "  #0 k0: 300 B (150%) aten::op0", "  #1 k1: 300 B (150%) aten::op1"]


def test_a_failure_lists_the_eight_largest_kernels_by_bytes_with_their_share_of_the_limit():
    """Catches the kernel list unsorted, sorted the wrong way, cut at another length, or with
    wrong shares, sizes or sources."""
    sizes = [10, 80, 30, 50, 20, 90, 40, 70, 60, 5]
    kernels = _kernels(*sizes)
    kernels[5].source = "model.py:12"
    report = _report(kernels)
    message = _fails(check_hbm_bytes, report, 100, "limit", "w", log=_log())
    assert message.splitlines()[1:11] == [
        "kernels by bytes (share of the budget):",
        "  #5 k5: 90 B (90%) aten::op5 model.py:12",
        "  #1 k1: 80 B (80%) aten::op1",
        "  #7 k7: 70 B (70%) aten::op7",
        "  #8 k8: 60 B (60%) aten::op8",
        "  #3 k3: 50 B (50%) aten::op3",
        "  #6 k6: 40 B (40%) aten::op6",
        "  #2 k2: 30 B (30%) aten::op2",
        "  #4 k4: 20 B (20%) aten::op4",
        report.summary(),
    ]


def test_with_counters_on_kernels_are_ranked_by_measured_bytes_and_show_them():
    """Catches the ranking by modelled bytes when measured ones exist."""
    kernels = _kernels(100, 10, measured=[5, 50])
    message = _fails(check_hbm_bytes, _report(kernels), 10, "limit", "w", log=_log("ncu"))
    assert message.splitlines()[1:4] == ["kernels by bytes (share of the budget):", "  #1 k1: 50 B (500%) aten::op1", "  #0 k0: 5 B (50%) aten::op0"]


def test_with_counters_off_a_failure_shows_modelled_bytes_even_where_measured_ones_exist():
    """Catches measured bytes shown in a verdict that checked modelled ones."""
    message = _fails(check_hbm_bytes, _report(_kernels(100, measured=[300])), 10, "limit", "w", log=_log("none"))
    assert message.splitlines()[:3] == [
        "w: 100 B modelled > limit 10 B (excess 90 B, 10.00x) (made)",
        "kernels by bytes (share of the budget):",
        "  #0 k0: 100 B (1000%) aten::op0",
    ]


def test_with_counters_on_but_a_kernel_unmeasured_the_modelled_bytes_are_checked():
    """Catches a partial measurement taken for the region's figure, or a kernel without a
    measurement shown without its modelled bytes."""
    message = _fails(check_hbm_bytes, _report(_kernels(100, 40, measured=[None, 30])), 10, "limit", "w", log=_log("ncu"))
    assert message.splitlines()[:4] == [
        "w: 140 B modelled > limit 10 B (excess 130 B, 14.00x) (made)",
        "kernels by bytes (share of the budget):",
        "  #0 k0: 100 B (1000%) aten::op0",
        "  #1 k1: 30 B (300%) aten::op1",
    ]


def test_an_unmodelled_kernel_in_a_failure_shows_a_question_mark_and_ranks_as_zero_bytes():
    """Catches an unmodelled kernel shown as 0 B or with a made-up size, or ranked above a
    kernel that moved a byte."""
    kernels = [
        Kernel(name="odd", op="aten::b", bytes=None),
        Kernel(name="none", op="aten::c", bytes=0),
        Kernel(name="tiny", op="aten::d", bytes=1),
        Kernel(name="big", op="aten::a", bytes=200),
    ]
    message = _fails(check_hbm_bytes, _report(kernels), 100, "limit", "w", log=_log())
    assert message.splitlines()[1:6] == [
        "kernels by bytes (share of the budget):",
        "  #3 big: 200 B (200%) aten::a",
        "  #2 tiny: 1 B (1%) aten::d",
        "  #0 odd: ? (0%) aten::b",
        "  #1 none: 0 B (0%) aten::c",
    ]


def test_a_region_where_no_kernel_has_a_byte_model_fails_even_under_a_large_limit():
    """Catches an unmodelled region passing as 0 bytes, and a reworded way out."""
    report = _report(_kernels(None, None))
    message = _fails(check_hbm_bytes, report, 10**9, "budget", "w", log=_log())
    assert message.splitlines()[0] == (
        "w: cannot check bytes against budget 953.7 MiB: none of the 2 kernel(s) of made has a byte model. "
        "Pass measured bytes (--fusion-counters=ncu), or declare the bytes of hand-written Triton kernels in "
        "their launch_metadata (docs/bytes.md)"
    )


def test_measured_bytes_check_a_region_whose_kernels_have_no_byte_model_and_do_not_warn():
    """Catches unmodelled kernels refused or warned about when counters measured every kernel."""
    report = _report(_kernels(None, None, measured=[10, 20]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_hbm_bytes(report, 30, "limit", "w", log=_log("ncu"))


def test_a_pass_with_some_kernels_unmodelled_warns_naming_them():
    """Catches the lower-bound warning lost (also at the limit itself) or reworded."""
    report = _report(_kernels(*([8] + [None] * 11)))
    with pytest.warns(FusionCheckWarning) as record:
        assert_hbm_bytes_within(8, report=report)
    (warning,) = record
    assert str(warning.message) == (
        "assert_hbm_bytes_within: 8 B modelled <= limit 8 B (made), but 11 of 12 kernels have no byte model "
        "(#1, #2, #3, #4, #5, #6, #7, #8, #9, #10): the figure is a lower bound"
    )


def test_the_lower_bound_warning_points_at_the_callers_line():
    """Catches the warning attributed to the plugin's own code (or to pytest's) instead of
    the test that called the assertion. Left out of the mutation run (pyproject.toml's
    ``-k``): mutmut's trampolines add two frames between the assertion and the check."""
    with pytest.warns(FusionCheckWarning) as record:
        assert_hbm_bytes_within(8, report=_report(_kernels(8, None)))
    (warning,) = record
    assert warning.filename == __file__


def test_a_fully_modelled_pass_does_not_warn():
    """Catches the lower-bound warning given when every kernel is modelled."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_hbm_bytes(_report(_kernels(8)), 8, "limit", "w", log=_log())


def test_a_byte_check_without_a_log_reads_the_current_tests_settings(current):
    """Catches the current test's settings ignored (counters on, modelled bytes checked)."""
    current.settings.counters = "ncu"
    report = _report(_kernels(1, measured=[100]))
    assert _fails(check_hbm_bytes, report, 10, "limit", "w").startswith("w: 100 B measured > limit 10 B")


# --- check_bandwidth -----------------------------------------------------------------------


def _bandwidth_report(device="cpu", efficiency=0.5):
    return _report(device=device, budget=Budget(read_bytes=4 * 10**6, write_bytes=0), time_s=2e-3, median_time_s=1e-3,
                   peak_bandwidth=4e9 / efficiency, median_source="median of 5 runs")


def test_an_efficiency_equal_to_the_fraction_passes():
    """Catches the fraction applied as > (a report exactly at it failing)."""
    report = _bandwidth_report("cuda", efficiency=0.5)
    check_bandwidth(report, 0.5, "w", log=_log())
    assert report.warnings == []


def test_a_gpu_bandwidth_shortfall_fails_with_budget_time_rate_and_peak():
    """Catches a wrong figure in the headline, or a GPU shortfall reported instead of failing."""
    message = _fails(check_bandwidth, _bandwidth_report("cuda", efficiency=0.25), 0.5, "w", log=_log())
    assert message.splitlines()[0] == (
        "w: 25.0% of peak bandwidth < required 50% (made): budget 3.8 MiB in 1.00 ms (median of 5 runs) = 4 GB/s "
        "against peak 16 GB/s"
    )


def test_an_efficiency_above_the_copy_roofline_fails_on_a_gpu_naming_the_budget_or_the_peak():
    """An impossible figure (a budget of 10**15 bytes on a 2 MiB softmax) must not pass."""
    message = _fails(check_bandwidth, _bandwidth_report("cuda", efficiency=1.5), 0.9, "w", log=_log())
    assert message.splitlines()[0].startswith("w: 150.0% of peak bandwidth is above the copy roofline (made): the budget or the peak is wrong")
    check_bandwidth(_bandwidth_report("cuda", efficiency=1.02), 0.9, "w", log=_log())  # at the margin: passes


def test_an_efficiency_above_the_roofline_is_a_warning_on_cpu_and_where_the_budget_fits_in_cache():
    cpu, log = _bandwidth_report("cpu", efficiency=3.0), _log()
    check_bandwidth(cpu, 0.9, "w", log=log)
    assert cpu.warnings == [] and len(log.notes_for(cpu)) == 1 and "above the copy roofline" in log.notes_for(cpu)[0]
    cached, log = _bandwidth_report("cuda", efficiency=3.0), _log()
    cached.warnings.append("budget 3.8 MiB is under 4x the 60 MiB L2: timings may measure the cache, not HBM; use larger inputs")
    check_bandwidth(cached, 0.9, "w", log=log)
    assert "above the copy roofline" in log.notes_for(cached)[-1]


def test_a_cpu_bandwidth_shortfall_is_a_note_unless_cpu_timing_is_enforced():
    """Catches a CPU shortfall failing by default, lost, or not failing when enforced."""
    report, log = _bandwidth_report("cpu", efficiency=0.25), _log()
    check_bandwidth(report, 0.5, "w", log=log)
    assert log.notes_for(report) == [
        "w: 25.0% of peak bandwidth < required 50% (made): budget 3.8 MiB in 1.00 ms (median of 5 runs) = 4 GB/s "
        "against peak 16 GB/s [CPU timing: reported, not enforced; --fusion-enforce-cpu-timing enforces it]"
    ]
    assert report.warnings == []  # verdicts leave the report as capture made it
    enforced, log = _bandwidth_report("cpu", efficiency=0.25), _log(enforce_cpu_timing=True)
    assert _fails(check_bandwidth, enforced, 0.5, "w", log=log).startswith("w: 25.0% of peak")
    assert log.notes_for(enforced) == []


def test_outside_pytest_a_reported_verdict_is_also_a_python_warning():
    from pytest_fusioncheck.state import ReportLog

    report = _bandwidth_report("cpu", efficiency=0.25)
    with pytest.warns(UserWarning, match="fusioncheck: w: 25.0% of peak bandwidth < required 50%"):
        check_bandwidth(report, 0.5, "w", log=ReportLog())


def test_a_bandwidth_check_without_a_log_reads_the_current_tests_settings(current):
    """Catches the current test's --fusion-enforce-cpu-timing ignored."""
    current.settings.enforce_cpu_timing = True
    assert _fails(check_bandwidth, _bandwidth_report("cpu", efficiency=0.25), 0.5, "w").startswith("w: 25.0% of peak")


def test_verdicts_leave_the_report_as_capture_made_it(current):
    """Catches a verdict that fills a figure (a peak bandwidth, a time, a warning) into the
    report it judges: verdicts are (report, limit) -> pass or fail (docs/architecture.md)."""
    current.settings.peak_bandwidth = 1e12
    reports = [
        _bandwidth_report("cpu", efficiency=0.25), _bandwidth_report("cuda", efficiency=0.95),
        _report(_kernels(1000), device="cuda", headroom=[_chain(10**6)], peak_bandwidth=None, time_s=4e-6),
        _launch_report(), _report(device="cuda", time_s=1e-3),
    ]
    for report in reports:
        before = copy.deepcopy(report)
        for check, limit in ((check_bandwidth, 0.5), (check_headroom, 0.9), (check_launch_overhead, 0.9)):
            try:
                check(report, limit, "w")
            except FusionAssertionError:
                pass
        assert report == before


def test_a_timing_verdict_on_an_untimed_report_judges_the_profiled_call_and_says_so():
    """Catches a report without a median judged silently (or not judged): the note names
    the figure judged; a timed report gets no such note."""
    untimed, log = _report(device="cuda", budget=Budget(read_bytes=4 * 10**6), time_s=1e-3, peak_bandwidth=8e9,
                           time_source="device time of the profiled call"), _log()
    check_bandwidth(untimed, 0.5, "w", log=log)
    assert log.notes_for(untimed) == [
        "w judged the device time of the profiled call: not timed again (a region never is; a profiled call is when the "
        "test's markers or code name a timing assertion or figure: docs/bytes.md, \"Time\")"
    ]
    timed, log = _bandwidth_report("cuda", efficiency=0.9), _log()
    check_bandwidth(timed, 0.5, "w", log=log)
    assert log.notes_for(timed) == []


def test_a_bandwidth_check_without_a_budget_says_the_efficiency_is_unknown():
    """Catches a report without a budget passing, and a reworded reason."""
    report = _report(device="cuda", time_s=1e-3)
    assert _fails(check_bandwidth, report, 0.5, "w", log=_log()).splitlines()[0] == (
        "w: efficiency unknown for made (no budget; not timed again (a region never is; a profiled "
        "call is when the test's markers or code name a timing assertion or figure: docs/bytes.md, \"Time\"))"
    )


# --- headroom ------------------------------------------------------------------------------


def _chain(excess, first=0):
    return Chain(kernels=[first, first + 1], ops=["aten::add", "aten::gelu"], source="model.py:5", bytes=2 * excess, fused_bytes=excess)


def test_cpu_headroom_is_the_chains_excess_over_the_modelled_bytes():
    """Catches the share taken over another figure, or of one chain only."""
    report = _report(_kernels(600, 400), headroom=[_chain(100), _chain(50, first=2)])
    assert headroom_share(report) == (pytest.approx(0.15), "of its modelled bytes")
    assert headroom_share(_report(headroom=[_chain(100)])) == (0.0, "of its modelled bytes")


def test_gpu_headroom_is_the_time_the_excess_costs_at_peak_over_the_device_time():
    """Catches the GPU share computed from bytes, or with peak bandwidth and time swapped."""
    report = _report(_kernels(1000), device="cuda", headroom=[_chain(10**6)], peak_bandwidth=1e12, time_s=4e-6)
    assert headroom_share(report) == (pytest.approx(0.25), "of its device time")
    untimed = _report(_kernels(1000), device="cuda", headroom=[_chain(100)], peak_bandwidth=1e12)
    assert headroom_share(untimed) == (pytest.approx(0.1), "of its modelled bytes")


def test_a_gpu_headroom_check_says_it_judged_the_profiled_call_only_when_it_judged_a_time():
    """Catches the untimed note given where the share fell back to bytes (no peak: nothing timed)."""
    by_time, log = _report(_kernels(1000), device="cuda", headroom=[_chain(10**6)], peak_bandwidth=1e12, time_s=4e-6), _log()
    check_headroom(by_time, 0.5, "w", log=log)
    assert [n.split(":")[0] for n in log.notes_for(by_time)] == ["w judged the kernels"]
    by_bytes, log = _report(_kernels(1000), device="cuda", headroom=[_chain(100)], peak_bandwidth=None, time_s=4e-6), _log()
    check_headroom(by_bytes, 0.5, "w", log=log)
    assert log.notes_for(by_bytes) == []


def test_headroom_at_the_fraction_passes_and_over_it_fails_listing_each_chain():
    """Catches the fraction applied as <, a headline or chain list reworded or dropped, and a
    CPU chain given a share of the region's (wall) time."""
    report = _report(_kernels(6000, 4000), headroom=[_chain(1000), _chain(500, first=2)], time_s=1e-6)
    check_headroom(report, 0.15, "w", log=_log())
    message = _fails(check_headroom, report, 0.1, "w", log=_log())
    assert message.splitlines()[:4] == [
        "w: fusing the region's memory-bound chains would save 15% of its modelled bytes > allowed 10% (made)",
        "chains (largest saving first):",
        "  kernels 0-1 (add, gelu; model.py:5) move 2.0x their fused budget: fusing them saves 1000 B, ~1.0 us",
        "  kernels 2-3 (add, gelu; model.py:5) move 2.0x their fused budget: fusing them saves 500 B, ~0.5 us",
    ]


def test_a_gpu_headroom_failure_gives_each_chains_share_of_the_region_time():
    """Catches the region time left out of the GPU chain lines (or given on CPU)."""
    report = _report(_kernels(1000), device="cuda", headroom=[_chain(10**6)], peak_bandwidth=1e12, time_s=4e-6)
    message = _fails(check_headroom, report, 0.2, "w", log=_log())
    assert message.splitlines()[2] == "  kernels 0-1 (add, gelu; model.py:5) move 2.0x their fused budget: fusing them saves 976.6 KiB, ~1.0 us (25% of this region)"


# --- check_launch_overhead -----------------------------------------------------------------


def _launch_report(device="cuda", time_s=250e-6, wall_s=1e-3):
    return _report(_kernels(0, 0, 0, 0), device=device, time_s=2 * time_s, wall_time_s=5 * (wall_s or 0), median_time_s=time_s,
                   median_wall_time_s=wall_s, median_source="median device time", peak_bandwidth=1e12)


def test_launch_overhead_at_the_fraction_passes_and_over_it_fails_with_wall_device_and_launches():
    """Catches the fraction applied as >=, and a headline or advice reworded or dropped."""
    check_launch_overhead(_launch_report(), 0.75, "w", log=_log())
    message = _fails(check_launch_overhead, _launch_report(), 0.5, "w", log=_log())
    assert message.splitlines()[:2] == [
        "w: 75% of the wall time is launch overhead > allowed 50% (made): wall 1.00 ms, device 250.0 us, 4 launches",
        "fewer launches (fusion, torch.compile) or a CUDA graph (torch.compile(mode='reduce-overhead')) recovers it; "
        "graph_replay=True (or --fusion-graph-replay) measures what a graph recovers",
    ]


def test_a_launch_overhead_failure_gives_the_measured_graph_time_or_why_there_is_none():
    """Catches the graph replay's time, its recovered share, or the reason it was not
    measured left out of the advice (the reason is then a note, not repeated)."""
    measured = _launch_report()
    measured.graph_time_s = 0.5e-3  # wall 1 ms, device 250 us: recovers 2/3 of the idle time
    message = _fails(check_launch_overhead, measured, 0.5, "w", log=_log())
    assert message.splitlines()[1] == (
        "replayed from a CUDA graph the call takes 500.0 us (recovers 67% of the idle time): "
        "torch.compile(mode='reduce-overhead') or torch.cuda.graphs would recover it; so would fewer launches (fusion)"
    )
    slower = _launch_report()
    slower.graph_time_s = 2e-3  # the replay slower than the eager wall time: recovers nothing, not all
    message = _fails(check_launch_overhead, slower, 0.5, "w", log=_log())
    assert message.splitlines()[1].startswith("replayed from a CUDA graph the call takes 2.00 ms (recovers 0% of the idle time): ")
    refused = _launch_report()
    refused.graph_note = "the call synchronises with the host"
    lines = _fails(check_launch_overhead, refused, 0.5, "w", log=_log()).splitlines()
    assert lines[1] == "fewer launches (fusion, torch.compile) or a CUDA graph (torch.compile(mode='reduce-overhead')) recovers it"
    assert "note: CUDA graph replay not measured: the call synchronises with the host" in lines


def test_launch_overhead_on_cpu_is_a_note_naming_the_device():
    """Catches a CPU report checked (and failed) on a GPU-only figure, or the note lost."""
    report, log = _launch_report(device="cpu"), _log()
    check_launch_overhead(report, 0.01, "w", log=log)
    assert log.notes_for(report) == ["w: launch overhead is a GPU figure; not checked on cpu"] and report.warnings == []


def test_launch_overhead_without_a_wall_time_fails_saying_it_is_unknown():
    """Catches a GPU report without timings passing the check unseen."""
    report = _launch_report(wall_s=None)
    assert _fails(check_launch_overhead, report, 0.5, "w", log=_log()).splitlines()[0] == (
        "w: launch overhead unknown for made (no wall or device time)"
    )


# --- what a failing test shows ---------------------------------------------------------------

FAILING_CHECKS = """
import pytest
from conftest import PLUGIN_ARGS
from pytest_fusioncheck import Budget, FusionReport, Kernel
from pytest_fusioncheck.headroom import Chain
from pytest_fusioncheck.state import ReportLog, Settings
from pytest_fusioncheck import verdict

LOG = ReportLog(settings=Settings(enforce_cpu_timing=True))


def report(**fields):
    fields.setdefault("peak_bandwidth", 1e9)
    return FusionReport(label="made", device=fields.pop("device", "cpu"), kernels=[Kernel(name="k", bytes=100)], **fields)


def test_kernels():
    verdict.check_max_kernels(report(), 0, log=LOG)


def test_bytes():
    verdict.check_hbm_bytes(report(), 10, "limit", "w", log=LOG)


def test_bandwidth():
    verdict.check_bandwidth(report(budget=Budget(read_bytes=10), time_s=1.0), 0.5, "w", log=LOG)


def test_headroom():
    chain = Chain(kernels=[0], ops=["aten::add"], source=None, bytes=100, fused_bytes=10)
    verdict.check_headroom(report(headroom=[chain]), 0.1, "w", log=LOG)


def test_launch_overhead():
    verdict.check_launch_overhead(report(device="cuda", time_s=1e-6, wall_time_s=1e-3), 0.5, "w", log=LOG)
"""


def test_a_failing_check_shows_the_users_line_and_hides_the_plugins_own_frames(pytester):
    """Catches a check's ``__tracebackhide__`` dropped: the failure would show verdict.py's
    source instead of ending at the test's own line."""
    pytester.makepyfile(FAILING_CHECKS)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:unraisableexception", *PLUGIN_ARGS)
    result.assert_outcomes(failed=5)
    output = result.stdout.str()
    assert "verdict.py" not in output
    for line in ["check_max_kernels(report(), 0", "check_hbm_bytes(report(), 10", "check_bandwidth(report(budget", "check_headroom(report(headroom", "check_launch_overhead(report(device"]:
        assert f">       verdict.{line}" in output, line


def _unmeasured(report):
    report.peak_bandwidth = None
    return report


@pytest.mark.parametrize(
    "check",
    [
        lambda log: check_max_kernels(_report(_kernels(8)), 0, log=log),
        lambda log: check_hbm_bytes(_report(_kernels(None)), 10, "limit", "w", log=log),
        lambda log: check_hbm_bytes(_report(_kernels(100)), 10, "limit", "w", log=log),
        lambda log: check_bandwidth(_unmeasured(_report(budget=Budget(read_bytes=10))), 0.5, "w", log=log),
        lambda log: check_bandwidth(_unmeasured(_report(budget=Budget(read_bytes=10), time_s=1.0)), 0.5, "w", log=log),
        lambda log: check_headroom(_report(_kernels(100), headroom=[_chain(50)]), 0.1, "w", log=log),
        lambda log: check_launch_overhead(_unmeasured(_launch_report(wall_s=None)), 0.5, "w", log=log),
        lambda log: check_launch_overhead(_unmeasured(_launch_report()), 0.5, "w", log=log),
    ],
    ids=["max_kernels", "bytes unmodelled", "bytes over", "bandwidth unknown", "bandwidth short", "headroom",
         "launch unknown", "launch over"],
)
def test_every_failure_uses_the_log_it_was_given_for_settings_and_what_changed(check):
    """Catches a check that drops the log it was given (the marker path passes the test's
    log) for the current one: its context lines missing, its peak bandwidth or its
    --fusion-enforce-cpu-timing ignored."""
    log = ReportLog(test_id="t", settings=Settings(enforce_cpu_timing=True, peak_bandwidth=1e9))
    log.context.append(lambda: "what changed: +1 kernel against the baseline")
    with pytest.raises(FusionAssertionError) as info:
        check(log)
    lines = str(info.value).splitlines()
    assert lines[0] == "what changed: +1 kernel against the baseline"
    assert lines[1].startswith(("assert_max_kernels: ", "w: ")) and "made" in lines[1]
