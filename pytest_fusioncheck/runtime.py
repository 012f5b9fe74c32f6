"""The work behind the plugin's hooks, imported only by tests that use a fusion feature.

``plugin.py`` stays thin (no torch import); this module parses and validates markers,
implements the ``fusion`` fixture object, runs marker-only tests under the profiler,
checks every report of a test against its markers, and feeds the session outputs
(terminal tables, JSON, baselines).
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import pytest

from . import api
from .budget import Budget, parse_bytes
from .report import FusionReport

GetOption = Callable[[pytest.Config, str], Any]


class MarkerError(ValueError):
    pass


@dataclass
class Limits:
    max_kernels: int | None = None
    max_kernels_by_device: dict[str, int] = field(default_factory=dict)
    has_max_kernels: bool = False
    max_hbm_bytes: int | None = None
    bandwidth_fraction: float | None = None
    no_graph_breaks: bool = False

    @property
    def profiled(self) -> bool:
        return self.has_max_kernels or self.max_hbm_bytes is not None or self.bandwidth_fraction is not None

    def kernel_limit(self, device: str) -> int | None:
        return self.max_kernels_by_device.get(device, self.max_kernels)


def _count(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise MarkerError(f"{what} must be a non-negative int, got {value!r}")
    return value


def parse_limits(item: pytest.Item) -> Limits:
    """Read and validate the fusion markers of ``item``; errors name the test and marker."""
    limits = Limits()

    def fail(marker: str, message: str) -> MarkerError:
        return MarkerError(f"{item.nodeid}: @pytest.mark.{marker}: {message}")

    mark = item.get_closest_marker("max_kernels")
    if mark is not None:
        limits.has_max_kernels = True
        unknown = set(mark.kwargs) - {"cpu", "cuda"}
        if unknown:
            raise fail("max_kernels", f"unknown keyword(s) {', '.join(sorted(unknown))}; accepted: cpu=, cuda=")
        if len(mark.args) > 1:
            raise fail("max_kernels", f"takes one positional count, got {len(mark.args)}: {mark.args!r}")
        try:
            if mark.args:
                limits.max_kernels = _count(mark.args[0], "n")
            for dev in ("cpu", "cuda"):
                if mark.kwargs.get(dev) is not None:
                    limits.max_kernels_by_device[dev] = _count(mark.kwargs[dev], f"{dev}=")
        except MarkerError as exc:
            raise fail("max_kernels", str(exc)) from None
        if limits.max_kernels is None and not limits.max_kernels_by_device:
            raise fail("max_kernels", "needs a count: max_kernels(n) or max_kernels(cpu=..., cuda=...)")
    mark = item.get_closest_marker("max_hbm_bytes")
    if mark is not None:
        if len(mark.args) != 1 or mark.kwargs:
            raise fail("max_hbm_bytes", f"takes exactly one byte count, got args={mark.args!r} kwargs={mark.kwargs!r}")
        try:
            limits.max_hbm_bytes = parse_bytes(mark.args[0])
        except ValueError as exc:
            raise fail("max_hbm_bytes", str(exc)) from None
    mark = item.get_closest_marker("bandwidth_bound")
    if mark is not None:
        if len(mark.args) != 1 or mark.kwargs:
            raise fail("bandwidth_bound", f"takes exactly one fraction, got args={mark.args!r} kwargs={mark.kwargs!r}")
        fraction = mark.args[0]
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1.5:
            raise fail("bandwidth_bound", f"fraction must be a number in (0, 1.5], got {fraction!r}")
        limits.bandwidth_fraction = float(fraction)
    mark = item.get_closest_marker("no_graph_breaks")
    if mark is not None:
        if mark.args or mark.kwargs:
            raise fail("no_graph_breaks", f"takes no arguments, got args={mark.args!r} kwargs={mark.kwargs!r}")
        limits.no_graph_breaks = True
    return limits


def _warmup(config: pytest.Config, get_option: GetOption) -> int:
    raw = get_option(config, "warmup")
    try:
        value = int(raw)
        if value < 0:
            raise ValueError
    except (TypeError, ValueError):
        raise pytest.UsageError(f"--fusion-warmup / fusioncheck_warmup must be a non-negative int, got {raw!r}") from None
    return value


def _peak(config: pytest.Config, get_option: GetOption) -> float | None:
    raw = get_option(config, "peak_bandwidth")
    if raw in (None, ""):
        return None
    text = str(raw).strip()
    try:
        if text.lower().endswith("/s"):
            value = float(parse_bytes(text[:-2]))
        else:
            value = float(text)
        if value <= 0:
            raise ValueError
    except ValueError:
        raise pytest.UsageError(
            f"--fusion-peak-bandwidth: cannot read {raw!r}; give bytes/s (4.25e12) or a rate such as '4250 GB/s'"
        ) from None
    return value


def configure_settings(config: pytest.Config, get_option: GetOption) -> None:
    s = api.settings
    s.enforce_cpu_timing = bool(get_option(config, "enforce_cpu_timing"))
    s.peak_bandwidth = _peak(config, get_option)
    s.counters = str(get_option(config, "counters") or "none")
    s.warmup = _warmup(config, get_option)
    s.device = get_option(config, "device") or None
    s.peak_cache = getattr(config, "cache", None)


def resolve_test_device(requested: str | None) -> str:
    import torch

    if requested in (None, "", "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested not in ("cuda", "cpu"):
        raise pytest.UsageError(f"--fusion-device must be 'cuda' or 'cpu', got {requested!r}")
    if requested == "cuda" and not torch.cuda.is_available():
        pytest.skip("--fusion-device cuda: no CUDA GPU here (torch.cuda.is_available() is False)")
    return requested


@dataclass
class ItemState:
    item: pytest.Item
    limits: Limits
    device: str
    warmup: int
    marker_only: bool
    log: api.ReportLog
    baseline_comparison: Any = None

    @classmethod
    def from_item(cls, item: pytest.Item, get_option: GetOption) -> "ItemState":
        try:
            limits = parse_limits(item)
        except MarkerError as exc:
            pytest.fail(str(exc), pytrace=False)
        configure_settings(item.config, get_option)
        device = resolve_test_device(api.settings.device)
        uses_fixture = "fusion" in getattr(item, "fixturenames", ())
        log = api.current_log()
        if log.test_id != item.nodeid:
            log = api.begin_test(item.nodeid)
        return cls(item, limits, device, api.settings.warmup, limits.profiled and not uses_fixture, log)


@contextlib.contextmanager
def test_context(item: pytest.Function, state: ItemState) -> Iterator[None]:
    """Around the test call: a graph-break recorder and, in marker-only mode, the profiler."""
    from .graph_breaks import GraphBreakRecorder

    original = item.obj
    if state.marker_only:
        from .capture import profile_call

        def profiled_test(*args: Any, **kwargs: Any) -> Any:
            for _ in range(state.warmup):
                original(*args, **kwargs)
            report = profile_call(original, args, kwargs, warmup=0, device=state.device, label=item.nodeid)
            report.source = report.source or _item_location(item)
            api.record_report(report)
            return None

        item.obj = profiled_test
    try:
        with GraphBreakRecorder() as recorder:
            yield
    finally:
        item.obj = original
        state.log.graph_breaks = list(getattr(recorder, "breaks", []))


def _item_location(item: pytest.Item) -> str:
    path, line, _ = item.location
    return f"{path}:{(line or 0) + 1}"


def _where(report: FusionReport) -> str:
    return report.label


def check_item(item: pytest.Item, state: ItemState) -> None:
    """Every report of the test against the test's markers (and the baseline)."""
    __tracebackhide__ = True
    limits = state.limits
    reports = state.log.reports
    if limits.no_graph_breaks:
        breaks = list(state.log.graph_breaks)
        for r in reports:
            breaks += [b for b in r.graph_breaks if b not in breaks]
        if breaks:
            from .graph_breaks import format_graph_breaks

            raise api.FusionAssertionError(
                f"@pytest.mark.no_graph_breaks: {len(breaks)} graph break(s) during {item.nodeid}\n" + format_graph_breaks(breaks)
            )
    if limits.profiled and not reports:
        raise api.FusionAssertionError(
            f"{item.nodeid}: fusion markers are set but the test profiled nothing; call fusion.profile(...) "
            "or open fusion.region(...), or drop the fusion fixture to profile the whole test body"
        )
    for report in reports:
        limit = limits.kernel_limit(report.device)
        if limit is not None:
            api.check_max_kernels(report, limit, where=f"@pytest.mark.max_kernels({limit})")
        if limits.max_hbm_bytes is not None:
            api.check_hbm_bytes(report, limits.max_hbm_bytes, "limit", f"@pytest.mark.max_hbm_bytes({limits.max_hbm_bytes})")
        if limits.bandwidth_fraction is not None:
            api.check_bandwidth(report, limits.bandwidth_fraction, f"@pytest.mark.bandwidth_bound({limits.bandwidth_fraction:g})")
    session = item.config.stash.get(_session_key(), None)
    if session is not None and reports:
        session.check_baseline(item, state)


def _session_key():
    from .plugin import SESSION_STATE

    return SESSION_STATE


def attach_reports(item: pytest.Item, state: ItemState, rep: pytest.TestReport) -> None:
    """Put the test's reports on its TestReport (travels through xdist to the controller)."""
    reports = state.log.reports
    if not reports:
        return
    rep.user_properties.append(("fusioncheck", [r.to_dict() for r in reports]))
    rep.user_properties.append(("fusioncheck_text", "\n".join(str(r) for r in reports)))
    if rep.failed:
        trace_dir = api.settings_trace_dir if hasattr(api, "settings_trace_dir") else None
        if trace_dir:
            export_traces(item, reports, trace_dir)


def export_traces(item: pytest.Item, reports: list[FusionReport], trace_dir: str) -> None:
    os.makedirs(trace_dir, exist_ok=True)
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in item.nodeid)
    for i, r in enumerate(reports):
        prof = getattr(r, "_prof", None)
        if prof is not None:
            prof.export_chrome_trace(os.path.join(trace_dir, f"{safe}.{i}.json"))


class Fusion:
    """The ``fusion`` fixture: profile callables and regions, assert on their reports."""

    def __init__(self, item: pytest.Item, state: ItemState) -> None:
        self._item = item
        self._state = state

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

    def profile(self, fn: Callable[..., Any], *args: Any, warmup: int | None = None, budget: Budget | None = None, **kwargs: Any) -> FusionReport:
        """``warmup`` unprofiled calls (default ``--fusion-warmup``), then one profiled call."""
        from .capture import profile_call

        report = profile_call(
            fn, args, kwargs,
            warmup=self._state.warmup if warmup is None else warmup,
            device=self.device,
            label=self._label(),
            budget=budget,
        )
        api.record_report(report)
        return report

    def region(self, label: str = "region"):
        """``with fusion.region("attn") as r:`` profiles the block once; ``r.report`` after."""
        from .capture import Region

        return Region(self._label(label), device=self.device, on_report=api.record_report)

    def _report(self, report: FusionReport | None) -> FusionReport | None:
        return report

    def assert_max_kernels(self, n: int, report: FusionReport | None = None) -> FusionReport:
        __tracebackhide__ = True
        return api.assert_max_kernels(n, report=report)

    def assert_hbm_bytes_within(self, budget: Any = None, slack: float = 1.0, report: FusionReport | None = None) -> FusionReport:
        __tracebackhide__ = True
        return api.assert_hbm_bytes_within(budget, slack=slack, report=report)

    def assert_bandwidth_bound_within(self, fraction: float, report: FusionReport | None = None) -> FusionReport:
        __tracebackhide__ = True
        return api.assert_bandwidth_bound_within(fraction, report=report)

    def assert_matches_reference(self, fused_fn: Callable[..., Any], reference_fn: Callable[..., Any], *args: Any, rtol: float | None = None, atol: float | None = None, **kwargs: Any) -> Any:
        __tracebackhide__ = True
        return api.assert_matches_reference(fused_fn, reference_fn, *args, rtol=rtol, atol=atol, **kwargs)

    def assert_no_graph_breaks(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        __tracebackhide__ = True
        return api.assert_no_graph_breaks(fn, *args, **kwargs)


def _collected(terminalreporter: Any) -> list[tuple[str, str, list[dict]]]:
    out = []
    seen = set()
    for reports in terminalreporter.stats.values():
        for rep in reports:
            if getattr(rep, "when", None) != "call" or rep.nodeid in seen:
                continue
            props = dict(getattr(rep, "user_properties", []) or [])
            if "fusioncheck" in props:
                seen.add(rep.nodeid)
                out.append((rep.nodeid, props.get("fusioncheck_text", ""), props["fusioncheck"]))
    return sorted(out)


def terminal_summary(terminalreporter: Any, config: pytest.Config, get_option: GetOption) -> None:
    collected = _collected(terminalreporter)
    if get_option(config, "report") and collected:
        terminalreporter.write_sep("=", "fusioncheck kernel tables")
        for nodeid, text, _ in collected:
            terminalreporter.write_line(text)
    session = config.stash.get(_session_key(), None)
    if session is not None:
        session.summary(terminalreporter, collected)


class SessionState:
    """Session outputs: JSON of all reports, baselines, counters (filled in by later modules)."""

    def __init__(self, config: pytest.Config, get_option: GetOption) -> None:
        self.config = config
        self.json_path = get_option(config, "json")
        self.lines: list[str] = []

    @classmethod
    def from_config(cls, config: pytest.Config, get_option: GetOption) -> "SessionState":
        return cls(config, get_option)

    def check_baseline(self, item: pytest.Item, state: ItemState) -> None:
        return None

    def summary(self, terminalreporter: Any, collected: list[tuple[str, str, list[dict]]]) -> None:
        if self.json_path:
            payload = {nodeid: reports for nodeid, _, reports in collected}
            tmp = self.json_path + ".tmp"
            with open(tmp, "w") as fh:
                json.dump(payload, fh, indent=2, sort_keys=True, default=str)
            os.replace(tmp, self.json_path)
            self.lines.append(f"fusioncheck: wrote {len(payload)} test(s) of reports to {self.json_path}")
        for line in self.lines:
            terminalreporter.write_line(line)

    def finish(self, session: pytest.Session) -> None:
        return None
