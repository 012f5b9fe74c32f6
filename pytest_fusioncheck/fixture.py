"""The ``fusion`` fixture object, the test's state, and the markers' verdicts.

Imported only by tests that use a fusion feature (``plugin.py`` stays torch-free). Per
test: ``TestState`` holds the validated markers, the device, the warm-up count and the
test's ``ReportLog`` (in ``item.stash``); ``test_call`` wraps the test call (Inductor's
byte hooks, a graph-break recorder, and in marker-only mode the profiler around the test
body); ``check`` holds every report against the markers and the baseline. At teardown
the plugin releases the test's log (``state.ReportLog.release``): tensors go, figures stay.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import pytest

from . import api, verdict
from .budget import Budget
from .options import Limits, MarkerError, names_timing, parse_limits
from .report import FusionReport
from .state import BREAKS, ITEM, SESSION, SETTINGS, ReportLog, Settings, record_report


def _settings(config: pytest.Config) -> Settings:
    return config.stash.get(SETTINGS, None) or Settings()


def worker_gpu(workerid: str | None, gpus: int) -> int | None:
    """The GPU a pytest-xdist worker profiles on: ``gw<i>`` takes GPU ``i mod gpus``;
    ``None`` outside xdist or with fewer than two GPUs (docs/integrations.md)."""
    if not workerid or gpus < 2 or not workerid.startswith("gw") or not workerid[2:].isdigit():
        return None
    return int(workerid[2:]) % gpus


def profiling_device(settings: Settings, config: pytest.Config | None = None) -> str:
    """The device a test profiles on: ``--fusion-device``, else CUDA when present; a test
    that asks for CUDA where there is none is skipped, not failed. ``cuda:<i>`` pins a GPU;
    under pytest-xdist on a host with several GPUs each worker takes its own."""
    from .capture import FusionCheckError, resolve_device

    try:
        device = resolve_device(settings.device if settings.device or not settings.require_gpu else "cuda")
    except FusionCheckError:
        import torch

        why = f"--fusion-device {settings.device or 'cuda'}: no CUDA GPU here (torch.cuda.is_available() is False, torch {torch.__version__})"
        if settings.require_gpu:
            pytest.fail(f"{why}; --fusion-require-gpu fails the test instead of skipping it", pytrace=False)
        raise _skip_at_test(f"{why}; --fusion-require-gpu makes this a failure")
    if device == "cuda":
        import torch

        pinned = settings.device.split(":", 1)[1] if settings.device and ":" in settings.device else None
        workerid = (getattr(config, "workerinput", None) or {}).get("workerid") if config is not None else None
        index = int(pinned) if pinned is not None else worker_gpu(workerid, torch.cuda.device_count())
        if index is not None and torch.cuda.current_device() != index:
            torch.cuda.set_device(index)  # tensors made with device=fusion.device land here
    return device


def _skip_at_test(reason: str) -> BaseException:
    """A skip whose reported location is the test, not this module's line."""
    try:
        return pytest.skip.Exception(reason, _use_item_location=True)
    except TypeError:  # a pytest without the keyword
        return pytest.skip.Exception(reason)


@dataclass
class TestState:
    """What the plugin knows about one running test."""

    __test__ = False  # not a test class, whatever its name says

    item: pytest.Item
    limits: Limits
    device: str
    warmup: int
    marker_only: bool
    log: ReportLog
    baseline_comparison: Any = None

    @classmethod
    def for_item(cls, item: pytest.Item, log: ReportLog | None = None) -> "TestState":
        problem = None
        try:
            limits = parse_limits(item)
        except MarkerError as exc:
            problem = str(exc)
        if problem is not None:  # outside the except block: no chained traceback
            pytest.fail(problem, pytrace=False)
        settings = _settings(item.config)
        device = profiling_device(settings, item.config)
        uses_fixture = "fusion" in getattr(item, "fixturenames", ())
        log = log if log is not None else ReportLog(test_id=item.nodeid, settings=settings, timing=functools.partial(names_timing, item))
        if limits.needs_timing(device):  # what the markers judge is timed at capture
            log.timing = True
        return cls(item, limits, device, settings.warmup, limits.profiled and not uses_fixture, log)


@contextlib.contextmanager
def test_call(item: pytest.Function, state: TestState) -> Iterator[None]:
    """Around the test call: Inductor's byte hooks (the test compiles here), a graph-break
    recorder and, in marker-only mode, the profiler around the test body."""
    from .graph_breaks import GraphBreakRecorder, carried_over
    from .sources.bytes_model import inductor_hooks

    original = item.obj
    if state.marker_only:
        from .capture import profile_call

        def profiled_test(*args: Any, **kwargs: Any) -> Any:
            for _ in range(state.warmup):
                original(*args, **kwargs)
            report = profile_call(original, args, kwargs, warmup=0, device=state.device, label=item.nodeid, source=_item_location(item))
            record_report(report, state.log)
            return None

        item.obj = profiled_test
    recorder = None
    try:
        with inductor_hooks(), GraphBreakRecorder() as recorder, _quiet_torch_logs(item, state.log.settings):
            yield
    finally:
        item.obj = original
        recorded = list(getattr(recorder, "breaks", None) or [])
        recompiles = list(getattr(recorder, "recompiles", None) or [])
        seen = item.config.stash.setdefault(BREAKS, [])
        earlier = carried_over(seen, state.log.reports, item.nodeid, recorded, recompiles)
        seen += [(b, item.nodeid) for b in recorded]
        state.log.graph_breaks = recorded + earlier
        state.log.recompiles = recompiles


class _TorchDebugFilter(logging.Filter):
    """Drops torch's DEBUG records (Dynamo's and Inductor's traces run to thousands of
    lines) so that a failing test's captured log leaves the kernel table readable."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno < logging.INFO and (record.name == "torch" or record.name.startswith("torch.")))


@contextlib.contextmanager
def _quiet_torch_logs(item: pytest.Item, settings: Settings) -> Iterator[None]:
    """While the test runs, pytest's log capture skips torch's DEBUG records, unless
    ``--fusion-torch-logs``."""
    plugin = item.config.pluginmanager.get_plugin("logging-plugin")
    handlers = [getattr(plugin, name, None) for name in ("caplog_handler", "report_handler")] if plugin else []
    handlers = [h for h in handlers if h is not None]
    if settings.torch_logs or not handlers:
        yield
        return
    flt = _TorchDebugFilter()
    for h in handlers:
        h.addFilter(flt)
    try:
        yield
    finally:
        for h in handlers:
            h.removeFilter(flt)


def _item_location(item: pytest.Item) -> str:
    path, line, _ = item.location
    return f"{path}:{(line or 0) + 1}"


def check(item: pytest.Item, state: TestState) -> None:
    """Every report of the test against the test's markers (and the baseline)."""
    __tracebackhide__ = True
    limits = state.limits
    log = state.log
    reports = log.reports
    sinks = item.config.stash.get(SESSION, None)
    baseline = sinks.baseline if sinks is not None else None
    if baseline is not None and reports:
        state.baseline_comparison = baseline.compare(item, reports, log.graph_breaks)
        comparison = state.baseline_comparison
        if comparison is not None and comparison.regressed:
            log.context.append(comparison.describe)
    if limits.no_graph_breaks:
        breaks = list(log.graph_breaks)
        for r in reports:
            breaks += [b for b in r.graph_breaks if b not in breaks]
        if breaks:
            from .graph_breaks import format_graph_breaks

            raise verdict.FusionAssertionError(
                f"@pytest.mark.no_graph_breaks: {len(breaks)} graph break(s) during {item.nodeid}\n" + format_graph_breaks(breaks)
            )
    if limits.max_recompiles is not None:
        verdict.check_max_recompiles(log.recompiles, limits.max_recompiles, f"@pytest.mark.max_recompiles({limits.max_recompiles})", item.nodeid)
    if limits.profiled and not reports:
        raise verdict.FusionAssertionError(
            f"{item.nodeid}: fusion markers are set but the test profiled nothing; call fusion.profile(...) "
            "or open fusion.region(...), or drop the fusion fixture to profile the whole test body"
        )
    for report in reports:
        limit = limits.kernel_limit(report.device)
        if limit is not None:
            verdict.check_max_kernels(report, limit, where=f"@pytest.mark.max_kernels({limit})", log=log)
        if limits.max_hbm_bytes is not None:
            verdict.check_hbm_bytes(report, limits.max_hbm_bytes, "limit", f"@pytest.mark.max_hbm_bytes({limits.max_hbm_bytes})", log=log)
        if limits.bandwidth_fraction is not None:
            verdict.check_bandwidth(report, limits.bandwidth_fraction, f"@pytest.mark.bandwidth_bound({limits.bandwidth_fraction:g})", log=log)
        if limits.launch_fraction is not None:
            verdict.check_launch_overhead(report, limits.launch_fraction, f"@pytest.mark.max_launch_overhead({limits.launch_fraction:g})", log=log)
        if limits.no_host_syncs:
            verdict.check_no_host_syncs(report, "@pytest.mark.no_host_syncs", log=log)
        if limits.headroom_fraction is not None:
            verdict.check_headroom(report, limits.headroom_fraction, f"@pytest.mark.fusion_headroom({limits.headroom_fraction:g})", log=log)
    if reports:
        fill_benchmark_extra_info(item, state)
    if baseline is not None and reports:
        baseline.check(state.baseline_comparison, reports, log.graph_breaks)


def attach_reports(item: pytest.Item, state: TestState, rep: pytest.TestReport) -> None:
    """Put the test's reports on its TestReport as plain data (it travels through xdist to
    the controller, and the session's sinks read it there); traces of a failing test."""
    reports = state.log.reports
    if not reports:
        return
    for i, r in enumerate(reports):  # short figures for JUnit XML (it reads the item's properties)
        prefix = "fusioncheck" if len(reports) == 1 else f"fusioncheck[{i}]"
        figures = [
            (f"{prefix}.kernels", r.kernel_count),
            (f"{prefix}.bytes", r.bytes),
            (f"{prefix}.bytes_unmodelled", r.bytes_unmodelled),
            (f"{prefix}.budget", r.budget.total if r.budget else None),
            (f"{prefix}.efficiency", None if r.efficiency is None else round(r.efficiency, 4)),
            (f"{prefix}.time_s", r.time_s),
            (f"{prefix}.wall_time_s", r.wall_time_s),
            (f"{prefix}.median_time_s", r.median_time_s),
            (f"{prefix}.median_wall_time_s", r.median_wall_time_s),
            (f"{prefix}.graph_time_s", r.graph_time_s),
        ]
        item.user_properties += [(name, value) for name, value in figures if value is not None]  # JUnit writes None as 'None'
    notes = [state.log.notes_for(r) for r in reports]  # what verdicts reported without failing
    rep.user_properties.append(("fusioncheck", [{**r.to_dict(), "verdict_notes": n} for r, n in zip(reports, notes)]))
    rep.user_properties.append(("fusioncheck_text", "\n".join(
        str(r) + "".join(f"\nnote: {note}" for note in n) for r, n in zip(reports, notes))))
    if rep.failed and state.log.settings.trace_dir:
        from .sinks.traces import export_traces

        export_traces(item.nodeid, reports, state.log.settings.trace_dir)


def benchmark_extra_info(reports: list[FusionReport]) -> dict[str, Any]:
    """The fusion figures pytest-benchmark stores beside its timings (``extra_info``): of
    the latest report, and the kernel count of every report."""
    r = reports[-1]
    return {
        "fusioncheck.device": r.device_kind,
        "fusioncheck.kernels": r.kernel_count,
        "fusioncheck.kernels_per_report": [x.kernel_count for x in reports],
        "fusioncheck.bytes": r.bytes,
        "fusioncheck.bytes_unmodelled": r.bytes_unmodelled,
        "fusioncheck.bytes_measured": r.bytes_measured,
        "fusioncheck.budget": r.budget.total if r.budget else None,
        "fusioncheck.efficiency": r.efficiency,
        "fusioncheck.time_s": r.time_s,
        "fusioncheck.time_source": r.time_source,
        "fusioncheck.wall_time_s": r.wall_time_s,
        "fusioncheck.median_time_s": r.median_time_s,
        "fusioncheck.median_wall_time_s": r.median_wall_time_s,
        "fusioncheck.median_source": r.median_source,
        "fusioncheck.launch_overhead_s": r.launch_overhead_s,
        "fusioncheck.graph_time_s": r.graph_time_s,
    }


def fill_benchmark_extra_info(item: pytest.Item, state: TestState) -> None:
    """A test that uses both ``benchmark`` and ``fusion``: its fusion figures go into the
    benchmark's ``extra_info`` (so ``pytest-benchmark compare`` and its JSON carry them)."""
    bench = getattr(item, "funcargs", {}).get("benchmark")
    if bench is not None and state.log.reports and hasattr(bench, "extra_info"):
        bench.extra_info.update(benchmark_extra_info(state.log.reports))


class Fusion:
    """The ``fusion`` fixture: profile callables and regions, assert on their reports."""

    def __init__(self, item: pytest.Item, state: TestState, request: pytest.FixtureRequest | None = None) -> None:
        self._item = item
        self._state = state
        self._request = request

    def benchmark(self, fn: Callable[..., Any], *args: Any, warmup: int | None = None, budget: Budget | None = None, **kwargs: Any) -> FusionReport:
        """Profile ``fn(*args)`` (a report, as ``profile``), time it with pytest-benchmark's
        ``benchmark`` fixture, each call synchronised on a GPU so the timer sees the device
        work, and put the fusion figures (device time, efficiency) in ``benchmark.extra_info``."""
        __tracebackhide__ = True
        from .capture import FusionCheckError, synchronize

        try:
            bench = self._request.getfixturevalue("benchmark") if self._request is not None else None
        except pytest.FixtureLookupError:
            bench = None
        if bench is None:
            raise FusionCheckError(
                "fusion.benchmark needs the pytest-benchmark plugin: pip install 'pytest-fusioncheck[benchmark]'"
            )
        report = self._profile(fn, args, kwargs, warmup, budget, None, timing=True)  # device time and efficiency too
        device = self.device

        def synchronised() -> Any:
            out = fn(*args, **kwargs)
            synchronize(device)
            return out

        bench(synchronised)
        bench.extra_info.update(benchmark_extra_info(self._state.log.reports))
        return report

    @property
    def device(self) -> str:
        return self._state.device

    @property
    def reports(self) -> list[FusionReport]:
        return self._state.log.reports

    def _label(self, what: str | None = None) -> str:
        n = len(self.reports)
        base = self._item.nodeid + (f"[{what}]" if what else "")
        return base if n == 0 else f"{base}#{n}"

    def profile(
        self, fn: Callable[..., Any], *args: Any, warmup: int | None = None, budget: Budget | None = None,
        graph_replay: bool | None = None, **kwargs: Any,
    ) -> FusionReport:
        """``warmup`` unprofiled calls (default ``--fusion-warmup``), then one profiled call;
        ``graph_replay=True`` also times the call replayed from a CUDA graph (default:
        ``--fusion-graph-replay``; docs/launch_bound.md)."""
        __tracebackhide__ = True
        return self._profile(fn, args, kwargs, warmup, budget, graph_replay)

    def _profile(
        self, fn: Callable[..., Any], args: tuple, kwargs: dict, warmup: int | None, budget: Budget | None,
        graph_replay: bool | None, timing: bool | None = None,
    ) -> FusionReport:
        __tracebackhide__ = True
        from .capture import profile_call

        report = profile_call(
            fn, args, kwargs,
            warmup=self._state.warmup if warmup is None else warmup,
            device=self.device,
            label=self._label(),
            budget=budget,
            graph_replay=graph_replay,
            timing=timing,
        )
        record_report(report, self._state.log)
        return report

    def region(self, label: str = "region"):
        """``with fusion.region("attn") as r:`` profiles the block once; ``r.report`` after."""
        from .capture import Region

        log = self._state.log
        return Region(self._label(label), device=self.device, on_report=lambda r: record_report(r, log))

    def assert_max_kernels(self, n: int, report: FusionReport | None = None) -> FusionReport:
        __tracebackhide__ = True
        return api.assert_max_kernels(n, report=report)

    def assert_hbm_bytes_within(self, budget: Any = None, slack: float = 1.0, report: FusionReport | None = None) -> FusionReport:
        __tracebackhide__ = True
        return api.assert_hbm_bytes_within(budget, slack=slack, report=report)

    def assert_bandwidth_bound_within(self, fraction: float, report: FusionReport | None = None) -> FusionReport:
        __tracebackhide__ = True
        return api.assert_bandwidth_bound_within(fraction, report=report)

    def assert_fusion_headroom_within(self, fraction: float, report: FusionReport | None = None) -> FusionReport:
        __tracebackhide__ = True
        return api.assert_fusion_headroom_within(fraction, report=report)

    def assert_matches_reference(self, fused_fn: Callable[..., Any], reference_fn: Callable[..., Any], *args: Any, rtol: float | None = None, atol: float | None = None, **kwargs: Any) -> Any:
        __tracebackhide__ = True
        return api.assert_matches_reference(fused_fn, reference_fn, *args, rtol=rtol, atol=atol, **kwargs)

    def assert_no_graph_breaks(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        __tracebackhide__ = True
        return api.assert_no_graph_breaks(fn, *args, **kwargs)

    def assert_no_host_syncs(self, report: FusionReport | None = None) -> FusionReport:
        __tracebackhide__ = True
        return api.assert_no_host_syncs(report=report)


def state_of(item: pytest.Item) -> TestState | None:
    return item.stash.get(ITEM, None)
