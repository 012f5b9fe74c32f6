"""Launch-bound regions replayed from a CUDA graph (issue 14, docs/launch_bound.md).

CPU tests pin what a user sees: the option and its validation, when a replay runs, the
report line and the JSON fields (with a faked measurement), and the note on CPU. The
`gpu` tests capture for real; run them on the device with

    PYTHONPATH=$PWD python3 -m pytest -p pytest_fusioncheck.plugin -m gpu tests/test_graph_replay.py -p no:randomly
"""

from __future__ import annotations

import json

import pytest
import torch
from conftest import PLUGIN_ARGS

from pytest_fusioncheck import FusionReport, Kernel, profile
from pytest_fusioncheck import capture, graph_replay, roofline, state
from pytest_fusioncheck.state import ReportLog
from pytest_fusioncheck.graph_replay import ALREADY_A_GRAPH, NO_CALLABLE, capture_failure, wanted

INNER = ("-p", "no:cacheprovider", "-p", "no:unraisableexception", *PLUGIN_ARGS)


def _settings(pytester, *args, ini=None):
    if ini is not None:
        pytester.makeini("[pytest]\n" + ini + "\n")
    return pytester.parseconfigure(*INNER, *args).stash[state.SETTINGS]


# --- the option ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, ini, mode",
    [
        ((), None, "off"),
        (("--fusion-graph-replay",), None, "auto"),
        (("--fusion-graph-replay=all",), None, "all"),
        (("--fusion-graph-replay", "off"), "fusioncheck_graph_replay = all", "off"),
        ((), "fusioncheck_graph_replay = auto", "auto"),
        ((), "fusioncheck_graph_replay =", "off"),  # an empty ini value: the default
        (("--fusion-graph-replay=AUTO",), None, "auto"),
    ],
)
def test_the_graph_replay_mode_is_off_by_default_auto_for_the_flag_alone_and_the_flag_wins_over_the_ini_key(pytester, args, ini, mode):
    assert _settings(pytester, *args, ini=ini).graph_replay == mode


@pytest.mark.parametrize(
    "args, ini, source",
    [(("--fusion-graph-replay=sometimes",), None, "--fusion-graph-replay"), ((), "fusioncheck_graph_replay = yes", "fusioncheck_graph_replay (ini file)")],
)
def test_a_graph_replay_mode_that_is_not_off_auto_or_all_is_refused_naming_where_it_came_from(pytester, args, ini, source):
    if ini is not None:
        pytester.makeini("[pytest]\n" + ini + "\n")
    with pytest.raises(pytest.UsageError) as info:
        pytester.parseconfigure(*INNER, *args)
    value = "'sometimes'" if args else "'yes'"
    assert str(info.value) == f"{source} must be 'off', 'auto' (launch-bound reports) or 'all', got {value}"


def test_help_shows_the_graph_replay_flag_with_its_optional_mode(pytester):
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", *PLUGIN_ARGS, "--help")
    result.stdout.fnmatch_lines(["*--fusion-graph-replay=?MODE?"])  # fnmatch: ? for the brackets
    text = "".join(result.stdout.str().split())
    assert "".join('"auto"(theflagalone:reportsthatarelaunch-bound)'.split()) in text


@pytest.mark.parametrize(
    "asked, mode, launch_bound, replay",
    [
        (True, "off", False, True),
        (False, "all", True, False),
        (None, "off", True, False),
        (None, "auto", True, True),
        (None, "auto", False, False),
        (None, "all", False, True),
    ],
)
def test_a_replay_runs_when_asked_per_call_else_by_the_session_mode(asked, mode, launch_bound, replay):
    assert wanted(asked, mode, launch_bound) is replay


def test_graph_replay_must_be_a_bool_or_none():
    with pytest.raises(TypeError, match=r"graph_replay must be True, False or None .*got 'yes'"):
        profile(torch.neg, torch.ones(2), graph_replay="yes")


# --- CPU: not available, said so, never an error ------------------------------------------


def test_on_cpu_a_replay_asked_for_is_a_note_and_none_in_the_json():
    report = profile(lambda x: x.exp().neg(), torch.ones(8), graph_replay=True)
    assert report.graph_time_s is None
    assert report.graph_note == "CUDA graphs need a GPU; this report is on cpu"
    assert "  note: CUDA graph replay not measured: CUDA graphs need a GPU; this report is on cpu" in str(report).splitlines()
    d = report.to_dict()
    assert d["graph_time_s"] is None and d["graph_recovered_share"] is None and d["graph_note"] == report.graph_note
    assert profile(lambda x: x.exp(), torch.ones(8)).graph_note is None  # not asked, outside pytest: off


SESSION = """
import torch

def test_profiles(fusion):
    fusion.profile(lambda x: x.exp().neg(), torch.ones(8))

def test_region(fusion):
    with fusion.region("block"):
        torch.ones(8).exp()
"""


@pytest.mark.parametrize("flag, noted", [("--fusion-graph-replay=all", True), ("--fusion-graph-replay", False)])
def test_the_session_option_on_cpu_notes_every_report_with_all_and_none_with_auto(run_pytest, pytester, flag, noted):
    """CPU reports are never launch-bound: ``auto`` replays none of them."""
    pytester.makepyfile(test_s=SESSION)
    result = run_pytest("--fusion-device=cpu", flag, "--fusion-json", "r.json")
    result.assert_outcomes(passed=2)
    data = json.loads((pytester.path / "r.json").read_text())
    notes = [r["graph_note"] for reports in data.values() for r in reports]
    assert notes == (["CUDA graphs need a GPU; this report is on cpu"] * 2 if noted else [None, None])
    assert all(r["graph_time_s"] is None for reports in data.values() for r in reports)


def test_fusion_profile_passes_graph_replay_through_and_the_terminal_table_shows_the_note(run_pytest, pytester):
    pytester.makepyfile(
        """
import torch

def test_asks(fusion):
    report = fusion.profile(torch.neg, torch.ones(8), graph_replay=True)
    assert report.graph_note.startswith("CUDA graphs need a GPU")
"""
    )
    result = run_pytest("--fusion-device=cpu", "--fusion-report")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*note: CUDA graph replay not measured: CUDA graphs need a GPU; this report is on cpu*"])


def test_the_decode_step_example_runs_with_its_long_reports_cut_to_the_top_kernels(run_pytest, pytester):
    """examples/test_decode_step.py as CI runs it: on CPU its GPU-only test is skipped with
    the reason, the others pass, and the eager step's table shows its top 10 rows only."""
    from pathlib import Path

    source = Path(__file__).resolve().parents[1] / "examples" / "test_decode_step.py"
    pytester.makepyfile(test_decode=source.read_text())
    result = run_pytest("--fusion-report", "-rs")
    if torch.cuda.is_available():
        result.assert_outcomes(passed=4)
        return
    result.assert_outcomes(passed=3, skipped=1)
    result.stdout.fnmatch_lines(["*launch overhead and CUDA graphs are GPU figures; on CPU the tests check kernel counts only*"])
    result.stdout.fnmatch_lines(["top 10 of 56 rows by time:", "*... 46 more rows not shown; every row: report.table()*"])


# --- the report, with a faked measurement ---------------------------------------------------


def _decode(graph_s=None, wall_s=15.1e-3, device="cuda", **fields):
    kernels = [Kernel(name=f"k{i}", time_s=2e-6, bytes=64) for i in range(50)]  # 100 us of device time
    return FusionReport(label="decode", device=device, device_name="H200", kernels=kernels, time_s=100e-6,
                        wall_time_s=wall_s, graph_time_s=graph_s, **fields)


def test_a_launch_bound_summary_gives_the_graph_time_beside_the_wall_time_and_what_it_recovers():
    report = _decode(graph_s=0.11e-3)
    assert report.summary().endswith(
        "time 100.0 us, wall 15.10 ms, launch-bound (99% of the wall time idle); "
        "replayed from a CUDA graph: 110.0 us a call vs 15.10 ms wall (recovers 100% of the idle time)"
    )
    assert report.graph_recovered_share == pytest.approx((15.1e-3 - 0.11e-3) / (15.1e-3 - 100e-6))


def test_the_recovered_share_is_of_the_idle_time_clamped_and_unknown_without_a_graph_or_an_overhead():
    assert _decode(graph_s=1.1e-3, wall_s=2.1e-3).graph_recovered_share == pytest.approx(0.5)
    assert _decode(graph_s=50e-6, wall_s=2.1e-3).graph_recovered_share == 1.0  # faster than the eager device time
    assert _decode(graph_s=3e-3, wall_s=2.1e-3).graph_recovered_share == 0.0
    assert _decode(graph_s=None).graph_recovered_share is None
    assert _decode(graph_s=1e-4, wall_s=100e-6).graph_recovered_share is None  # no overhead to recover
    assert _decode(graph_s=1e-4, device="cpu").graph_recovered_share is None


def test_a_region_that_is_not_launch_bound_still_shows_its_graph_time():
    report = _decode(graph_s=120e-6, wall_s=150e-6)
    assert not report.launch_bound
    assert report.summary().endswith("wall 150.0 us, replayed from a CUDA graph: 120.0 us a call vs 150.0 us wall (recovers 60% of the idle time)")


def test_the_json_carries_the_graph_time_its_recovered_share_and_note():
    d = _decode(graph_s=1.1e-3, wall_s=2.1e-3).to_dict()
    assert d["graph_time_s"] == 1.1e-3 and d["graph_recovered_share"] == pytest.approx(0.5) and d["graph_note"] is None
    assert json.loads(json.dumps(d))["graph_time_s"] == 1.1e-3


def test_a_replayed_call_is_timed_first_then_replayed_and_compared_with_the_timed_wall_time(monkeypatch):
    """On a GPU the graph time is compared with the median unprofiled wall time: a replay
    times the call even where the test asked for no timing, before replaying it (faked
    here: no GPU); `time_s` and `wall_time_s` stay the profiled call's."""
    calls = []
    monkeypatch.setattr(capture._compat, "graph_launches", lambda prof: 0)
    monkeypatch.setattr(roofline, "peak_bandwidth", lambda *a: 1e12)
    monkeypatch.setattr(roofline, "l2_cache_size", lambda: 0)
    monkeypatch.setattr(roofline, "median_time", lambda fn, args, kwargs, device: calls.append("timer") or (100e-6, 10, 2e-3, "median device time"))
    monkeypatch.setattr(graph_replay, "replay_time", lambda fn, args, kwargs: calls.append(("replay", fn, args)) or (40e-6, None))
    report = _decode(wall_s=9e-3)
    fn = object()
    capture._time_and_replay(report, ReportLog(timing=False), None, True, None, (fn, (1,), {}))
    assert calls == ["timer", ("replay", fn, (1,))]
    assert (report.median_wall_time_s, report.graph_time_s, report.graph_note, report.wall_time_s) == (2e-3, 40e-6, None, 9e-3)
    calls.clear()
    untimed = _decode(wall_s=9e-3)
    capture._time_and_replay(untimed, ReportLog(timing=False), None, False, None, (fn, (1,), {}))
    assert calls == [] and untimed.median_time_s is None


def test_a_call_that_already_replays_a_graph_or_a_with_region_gets_the_reason_not_a_capture(monkeypatch):
    monkeypatch.setattr(graph_replay, "replay_time", lambda *a: pytest.fail("no capture expected"))
    monkeypatch.setattr(capture._compat, "graph_launches", lambda prof: 3)
    monkeypatch.setattr(roofline, "peak_bandwidth", lambda *a: 1e12)
    monkeypatch.setattr(roofline, "l2_cache_size", lambda: 0)
    monkeypatch.setattr(roofline, "median_time", lambda *a: (90e-6, 10, 120e-6, "median device time"))
    compiled = _decode()
    capture._time_and_replay(compiled, ReportLog(timing=False), None, True, None, (object(), (), {}))
    assert compiled.graph_note == ALREADY_A_GRAPH and compiled.graph_time_s is None
    assert compiled.median_wall_time_s == 120e-6  # timed: the wall time of its own graph replays
    region = _decode()
    assert not capture._replay_wanted(region, ReportLog(), True, None) and region.graph_note == NO_CALLABLE
    skipped = _decode()
    assert not capture._replay_wanted(skipped, ReportLog(), False, object()) and skipped.graph_note is None


@pytest.mark.parametrize(
    "error, reason",
    [
        (RuntimeError("called a synchronizing CUDA operation"), "the call synchronises with the host (.item()"),
        (RuntimeError("CUDA error: operation not permitted when stream is capturing"), "the call does something a CUDA-graph capture cannot record (RuntimeError: CUDA error: operation not permitted when stream is capturing)"),
        (ValueError("bad shape"), "the capture failed: ValueError: bad shape"),
    ],
)
def test_a_failed_capture_is_named_by_its_first_error(error, reason):
    assert capture_failure(error).startswith(reason)
    try:  # capture_end raises again over the call's own error: the first one names the cause
        try:
            raise error
        except Exception:
            raise RuntimeError("CUDA error: operation failed due to a previous error during capture")
    except RuntimeError as chained:
        assert capture_failure(chained).startswith(reason)


# --- on a GPU ---------------------------------------------------------------------------------


def small_chain(x):
    """Eighty tiny elementwise kernels: the device idles between their launches."""
    for _ in range(40):
        x = x * 1.0001 + 0.5
    return x


def syncs_with_the_host(x):
    y = small_chain(x)
    if y.sum().item() > 0:  # a host synchronisation: no CUDA graph can capture it
        y = y + 1
    return y


@pytest.fixture
def fresh():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
    assert torch.cuda.current_stream() == torch.cuda.default_stream()  # no capture stream left current


@pytest.mark.gpu
def test_a_chain_of_small_kernels_replays_from_a_graph_faster_than_its_eager_wall_time(fresh):
    report = profile(small_chain, torch.randn(1024, device="cuda"), graph_replay=True)
    assert report.graph_note is None and report.graph_time_s is not None, str(report)
    assert report.median_source.startswith("median device time"), report.median_source  # a replay times the call
    assert report.graph_time_s < 0.8 * report.median_wall_time_s, str(report)
    assert report.graph_recovered_share is not None and report.graph_recovered_share > 0.3, str(report)
    assert "replayed from a CUDA graph: " in report.summary()


@pytest.mark.gpu
def test_a_call_that_calls_item_gets_a_reason_and_the_next_profile_replays(fresh):
    x = torch.randn(1024, device="cuda")
    refused = profile(syncs_with_the_host, x, graph_replay=True)
    assert refused.graph_time_s is None and "synchronises with the host" in (refused.graph_note or ""), str(refused)
    after = profile(small_chain, x, graph_replay=True)
    assert after.graph_note is None and after.graph_time_s is not None, str(after)


@pytest.mark.gpu
def test_a_capture_that_fails_inside_the_call_leaves_stream_allocator_and_errors_clean(fresh):
    """Past the sync check (called directly): ``.item()`` during the capture invalidates it."""
    x = torch.randn(1024, device="cuda")
    side = torch.cuda.Stream()
    graph, output, why = graph_replay._capture(syncs_with_the_host, (x,), {}, side)
    assert graph is None and output is None and why, why
    assert torch.cuda.current_stream() == torch.cuda.default_stream()
    assert not torch.cuda.is_current_stream_capturing()
    y = small_chain(x)  # plain work runs, and its result is right
    torch.cuda.synchronize()
    assert torch.isfinite(y).all()
    torch.cuda.empty_cache()  # asserts that no capture is under way in the allocator: the pool was ended
    seconds, note = graph_replay.replay_time(small_chain, (x,), {})
    assert note is None and seconds is not None and seconds > 0


@pytest.mark.gpu
def test_a_reduce_overhead_callable_is_said_to_be_a_graph_already_and_the_next_profile_works(fresh):
    x = torch.randn(1024, device="cuda")
    compiled = torch.compile(small_chain, mode="reduce-overhead")
    report = profile(compiled, x, warmup=3, graph_replay=True)
    assert report.graph_note == ALREADY_A_GRAPH, str(report)
    eager = profile(small_chain, x, graph_replay=True)
    assert eager.graph_time_s is not None, str(eager)


@pytest.mark.gpu
def test_auto_replays_a_launch_bound_test_and_the_json_and_message_carry_the_graph_time(run_pytest, pytester):
    pytester.makepyfile(
        test_graph="""
import pytest, torch

def chain(x):
    for _ in range(40):
        x = x * 1.0001 + 0.5
    return x

@pytest.mark.max_launch_overhead(0.01)
def test_launch_bound(fusion):
    fusion.profile(chain, torch.randn(1024, device="cuda"))
"""
    )
    result = run_pytest("--fusion-graph-replay", "--fusion-json", "r.json")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*launch overhead > allowed 1%*", "replayed from a CUDA graph the call takes *"])
    (report,) = json.loads((pytester.path / "r.json").read_text())["test_graph.py::test_launch_bound"]
    assert report["graph_time_s"] is not None and report["graph_time_s"] < report["wall_time_s"], report
