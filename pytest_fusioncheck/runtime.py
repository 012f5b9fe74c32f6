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
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
            raise fail("bandwidth_bound", f"fraction must be a number in (0, 1] (a share of peak bandwidth), got {fraction!r}")
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
    s.trace_dir = get_option(config, "trace_dir") or None
    if s.device not in (None, "", "auto", "cuda", "cpu"):
        raise pytest.UsageError(f"{_where(config, 'device')} must be 'cuda' or 'cpu', got {s.device!r}")
    if s.counters not in ("none", "ncu"):
        raise pytest.UsageError(f"{_where(config, 'counters')} must be 'none' or 'ncu', got {s.counters!r}")


def _where(config: pytest.Config, name: str) -> str:
    """Where an option's value came from, as the user wrote it: the flag or the ini key."""
    if config.getoption("fusion_" + name, None) is not None:
        return "--fusion-" + name.replace("_", "-")
    return f"fusioncheck_{name} (ini file)"


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
        problem = None
        try:
            limits = parse_limits(item)
        except MarkerError as exc:
            problem = str(exc)
        if problem is not None:  # outside the except block: no chained traceback
            pytest.fail(problem, pytrace=False)
        # Again per test (pytest_configure did it once): the settings are process-wide, and
        # an in-process pytester session in between would have left its own.
        configure_settings(item.config, get_option)
        device = resolve_test_device(api.settings.device)
        from .bytes_model import install_inductor_hooks

        install_inductor_hooks()  # before the test compiles anything
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
    recorder = None
    try:
        with GraphBreakRecorder() as recorder:
            yield
    finally:
        item.obj = original
        state.log.graph_breaks = list(getattr(recorder, "breaks", None) or [])


def _item_location(item: pytest.Item) -> str:
    path, line, _ = item.location
    return f"{path}:{(line or 0) + 1}"


def check_item(item: pytest.Item, state: ItemState) -> None:
    """Every report of the test against the test's markers (and the baseline)."""
    __tracebackhide__ = True
    limits = state.limits
    reports = state.log.reports
    session = item.config.stash.get(_session_key(), None)
    if session is not None and reports:
        state.baseline_comparison = session.compare_baseline(item, state)
        comparison = state.baseline_comparison
        if comparison is not None and comparison.regressed:
            state.log.context.append(comparison.describe)
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
        trace_dir = api.settings.trace_dir
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
    """Session-wide outputs and inputs: JSON of all reports, baselines, counters, roofline.

    Created at session start only when one of those options is on. Under pytest-xdist each
    worker has one too: workers hand their baseline records to the controller through
    ``workeroutput``, and only the controller writes files.
    """

    def __init__(self, config: pytest.Config, get_option: GetOption) -> None:
        from . import baseline

        self.config = config
        self.json_path = get_option(config, "json")
        self.roofline_path = get_option(config, "roofline")
        self.lines: list[str] = []
        self.is_worker = hasattr(config, "workerinput")
        self.counters = str(get_option(config, "counters") or "none")
        from .counters import CHILD_ENV

        if os.environ.get(CHILD_ENV):  # the child run under ncu measures nothing itself
            self.counters = "none"
        self.update = bool(get_option(config, "update_baseline"))
        path = get_option(config, "baseline")
        if self.update and not path:
            path = baseline.DEFAULT_PATH
        self.baseline_path = None
        self.baseline = None
        self.writer = None
        if path:
            self.baseline_path = path if os.path.isabs(path) else os.path.join(str(config.rootpath), path)
            try:
                self.baseline = baseline.load_baseline(self.baseline_path)
            except baseline.BaselineError as exc:
                raise pytest.UsageError(str(exc)) from None
            if self.update:
                self.writer = baseline.BaselineWriter(self.baseline_path)
        self.improvements: list[str] = []

    @classmethod
    def from_config(cls, config: pytest.Config, get_option: GetOption) -> "SessionState":
        return cls(config, get_option)

    # -- counters -------------------------------------------------------------------
    def collect_counters(self, session: pytest.Session, uses_fusion: Callable[[pytest.Item], bool]) -> None:
        if self.counters != "ncu" or self.is_worker:
            return
        from . import counters

        nodeids = [item.nodeid for item in session.items if uses_fusion(item)]
        if not nodeids:
            return
        extra = [f"--fusion-warmup={api.settings.warmup}"]
        if not self.config.pluginmanager.has_plugin("fusioncheck"):  # loaded with -p, not by entry point
            extra = ["-p", "pytest_fusioncheck.plugin", *extra]
        try:
            measured = counters.collect(nodeids, str(self.config.rootpath), extra)
        except counters.CountersError as exc:
            raise pytest.UsageError(f"--fusion-counters=ncu: {exc}") from None
        api.settings.measured = measured
        api.settings.counters = "ncu"
        self.lines.append(f"fusioncheck: ncu measured {sum(len(k) for r in measured.by_test.values() for k in r)} kernels in {len(measured.by_test)} test(s)")
        self.lines += [f"fusioncheck: counters: {p}" for p in measured.problems]

    # -- baselines -------------------------------------------------------------------
    def record_for(self, item: pytest.Item, reports: list[FusionReport]) -> dict[str, Any]:
        from . import baseline

        names = [k.name for r in reports for k in r.kernels]
        return baseline.make_record(
            item.nodeid,
            reports[0].device_kind,
            names,
            bytes=sum(r.bytes for r in reports),
            kernel_count=sum(r.kernel_count for r in reports),
        )

    def compare_baseline(self, item: pytest.Item, state: "ItemState") -> Any:
        """The test's comparison with its baseline entry (``None`` without a baseline)."""
        from . import baseline

        reports = state.log.reports
        if self.baseline is None or not reports:
            return None
        record = self.record_for(item, reports)
        if self.writer is not None:
            self.writer.add(record)
            return None
        comparison = baseline.compare(self.baseline.get(item.nodeid, record["device_kind"]), record)
        if comparison.changed and not comparison.regressed:
            self.improvements.append(f"{item.nodeid}: {comparison.describe()}")
        return comparison

    def check_baseline(self, item: pytest.Item, state: "ItemState") -> None:
        comparison = state.baseline_comparison
        if comparison is not None and comparison.regressed:
            tables = "\n".join(str(r) for r in state.log.reports)
            raise api.FusionAssertionError(
                f"{comparison.describe()}\n{tables}\n"
                f"(baseline {self.baseline_path}; run with --fusion-update-baseline to accept the change)"
            )

    # -- session end ------------------------------------------------------------------
    def add_worker_output(self, worker_id: str, output: dict[str, Any]) -> None:
        payload = output.get("fusioncheck_baseline")
        if payload and self.writer is not None:
            self.writer.add_worker_payload(worker_id, payload)
        self.improvements += output.get("fusioncheck_improvements", [])

    def finish(self, session: pytest.Session) -> None:
        if self.is_worker:
            out = self.config.workeroutput  # type: ignore[attr-defined]
            if self.writer is not None:
                out["fusioncheck_baseline"] = self.writer.worker_payload()
            out["fusioncheck_improvements"] = list(self.improvements)
            return
        if self.writer is not None:
            result = self.writer.flush()
            self.lines.append("fusioncheck baseline: " + result.describe())

    def summary(self, terminalreporter: Any, collected: list[tuple[str, str, list[dict]]]) -> None:
        if self.is_worker:
            return
        if self.json_path:
            payload = {nodeid: reports for nodeid, _, reports in collected}
            tmp = self.json_path + ".tmp"
            with open(tmp, "w") as fh:
                json.dump(payload, fh, indent=2, sort_keys=True, default=str)
            os.replace(tmp, self.json_path)
            self.lines.append(f"fusioncheck: wrote {len(payload)} test(s) of reports to {self.json_path}")
        if self.roofline_path:
            from .plot import roofline_plot

            try:
                roofline_plot([r for _, _, reports in collected for r in reports], self.roofline_path)
                self.lines.append(f"fusioncheck: roofline plot written to {self.roofline_path}")
            except ImportError as exc:
                self.lines.append(f"fusioncheck: no roofline plot ({exc}); pip install matplotlib")
        if self.improvements:
            self.lines.append("fusioncheck baseline improvements (update the baseline to pin them):")
            self.lines += ["  " + line.replace("\n", "\n  ") for line in self.improvements]
        if self.lines:
            terminalreporter.write_sep("-", "fusioncheck")
        for line in self.lines:
            terminalreporter.write_line(line)
