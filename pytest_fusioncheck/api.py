"""Public assertions and the log of reports they apply to.

``assert_max_kernels(4)`` with no ``report=`` checks the latest report of the running
test. The plugin opens a fresh ``ReportLog`` for every test (so a report never leaks
into the next test); outside pytest, ``profile()`` records into a process-wide log.

Every failure raises ``FusionAssertionError`` (an ``AssertionError``) whose message
leads with what changed (graph breaks, kernels added against the baseline), then the
figure against its limit, then the kernel table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from .budget import Budget, format_bytes, parse_bytes
from .report import FusionReport, format_bandwidth, format_time


class FusionAssertionError(AssertionError):
    """A fusion check failed; the message carries the kernel table."""


class NoReportError(RuntimeError):
    """An assertion was called with ``report=None`` before anything was profiled."""


class FusionCheckWarning(UserWarning):
    """A verdict passed on figures it could not fully check (e.g. unmodelled kernels)."""


@dataclass
class Settings:
    """Session-wide choices the plugin sets from its options."""

    enforce_cpu_timing: bool = False
    peak_bandwidth: float | None = None
    counters: str = "none"
    warmup: int = 1
    device: str | None = None
    peak_cache: Any = None  # pytest cache, for measured peak bandwidth
    measured: Any = None  # counters.Measured, with --fusion-counters=ncu
    trace_dir: str | None = None


settings = Settings()


@dataclass
class ReportLog:
    """The reports of one test (or of the process, outside pytest)."""

    test_id: str | None = None
    reports: list[FusionReport] = field(default_factory=list)
    graph_breaks: list[Any] = field(default_factory=list)
    context: list[Callable[[], str]] = field(default_factory=list)

    def latest(self) -> FusionReport:
        if not self.reports:
            where = f"test {self.test_id}" if self.test_id else "this process"
            raise NoReportError(
                f"no fusion report yet in {where}: call fusion.profile(...) / profile(...) or open "
                "fusion.region(...) before asserting, or pass report=..."
            )
        return self.reports[-1]


_process_log = ReportLog()
_current: ReportLog | None = None


def begin_test(test_id: str) -> ReportLog:
    global _current
    _current = ReportLog(test_id=test_id)
    return _current


def end_test() -> None:
    global _current
    _current = None


def current_log() -> ReportLog:
    return _current if _current is not None else _process_log


def record_report(report: FusionReport) -> None:
    log = current_log()
    if settings.measured is not None and log.test_id is not None:
        _fill_measured(report, log.test_id, len(log.reports))
    log.reports.append(report)
    if len(log.reports) > 1000 and log is _process_log:  # a long-lived process: keep the tail
        del log.reports[:-100]


def _fill_measured(report: FusionReport, test_id: str, index: int) -> None:
    values = settings.measured.kernel_bytes(test_id, index)
    if values is None or len(values) != report.kernel_count:
        seen = "no kernels" if values is None else f"{len(values)} kernels"
        report.warnings.append(
            f"counters: ncu measured {seen} for this report, the profiler counted {report.kernel_count}; "
            "measured bytes left empty"
        )
        return
    for kernel, value in zip(report.kernels, values):
        kernel.bytes_measured = value


def _resolve(report: FusionReport | None) -> FusionReport:
    if report is not None:
        if not isinstance(report, FusionReport):
            raise TypeError(f"report= must be a FusionReport, got {type(report).__name__}")
        return report
    return current_log().latest()


def _what_changed(report: FusionReport) -> list[str]:
    lines: list[str] = []
    breaks = list(report.graph_breaks)
    log = current_log()
    for b in log.graph_breaks:
        if b not in breaks:
            breaks.append(b)
    if breaks:
        try:
            from .graph_breaks import format_graph_breaks

            lines.append(format_graph_breaks(breaks))
        except ImportError:  # pragma: no cover
            lines += [f"Graph break: {b}" for b in breaks]
    for rc in report.recompiles:
        lines.append(f"Recompiled: {getattr(rc, 'reason', rc)}")
    for extra in log.context:
        text = extra()
        if text:
            lines.append(text)
    return lines


def failure_message(report: FusionReport, headline: str, details: list[str] | None = None) -> str:
    parts = _what_changed(report) + [headline] + (details or [])
    parts.append(report.summary())
    parts.append(report.table())
    for note in report.notes():
        parts.append(f"note: {note}")
    return "\n".join(parts)


def check_max_kernels(report: FusionReport, n: int, where: str = "assert_max_kernels") -> None:
    if report.kernel_count > n:
        raise FusionAssertionError(
            failure_message(report, f"{where}: {report.kernel_count} kernels launched, limit {n} ({report.label})")
        )


def assert_max_kernels(n: int, report: FusionReport | None = None) -> FusionReport:
    """The report launched at most ``n`` kernels (memcpy/memset not counted)."""
    __tracebackhide__ = True
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"assert_max_kernels: n must be a non-negative int, got {n!r}")
    report = _resolve(report)
    check_max_kernels(report, n)
    return report


def _bytes_figure(report: FusionReport) -> tuple[int, str]:
    measured = report.bytes_measured
    if settings.counters != "none" and measured is not None:
        return measured, "measured"
    return report.bytes, "modelled"


def _per_kernel_excess(report: FusionReport, budget_total: int) -> list[str]:
    rows = sorted(enumerate(report.kernels), key=lambda ik: -(ik[1].bytes_measured or ik[1].bytes or 0))
    lines = ["kernels by bytes (share of the budget):"]
    for i, k in rows[:8]:
        nbytes = k.bytes_measured if settings.counters != "none" and k.bytes_measured is not None else k.bytes
        share = f"{(nbytes or 0) / budget_total:.0%}" if budget_total else "-"
        shown = "?" if nbytes is None else format_bytes(nbytes)
        lines.append(f"  #{i} {k.short_name}: {shown} ({share}) {k.op} {k.source or ''}".rstrip())
    return lines


def check_hbm_bytes(report: FusionReport, limit: int, what: str, where: str) -> None:
    """``limit`` against the report's bytes. Unmodelled kernels never pass quietly: a
    region with no modelled kernel fails (nothing was checked), and a pass over a region
    with some unmodelled kernels warns (``FusionCheckWarning``) that its figure is a
    lower bound."""
    import warnings

    figure, kind = _bytes_figure(report)
    missing = report.unmodelled_kernels if kind == "modelled" else []
    if missing and len(missing) == report.kernel_count:
        raise FusionAssertionError(
            failure_message(
                report,
                f"{where}: cannot check bytes against {what} {format_bytes(limit)}: none of the "
                f"{report.kernel_count} kernel(s) of {report.label} has a byte model. Pass measured bytes "
                "(--fusion-counters=ncu), or declare the bytes of hand-written Triton kernels in their "
                "launch_metadata (docs/bytes.md)",
            )
        )
    if figure <= limit and missing:
        warnings.warn(
            FusionCheckWarning(
                f"{where}: {format_bytes(figure)} {kind} <= {what} {format_bytes(limit)} ({report.label}), but "
                f"{len(missing)} of {report.kernel_count} kernels have no byte model (#{', #'.join(map(str, missing[:10]))}): "
                "the figure is a lower bound"
            ),
            stacklevel=3,
        )
    if figure > limit:
        excess = figure - limit
        details = _per_kernel_excess(report, limit)
        raise FusionAssertionError(
            failure_message(
                report,
                f"{where}: {format_bytes(figure)} {kind} > {what} {format_bytes(limit)} "
                f"(excess {format_bytes(excess)}, {figure / limit:.2f}x) ({report.label})" if limit else
                f"{where}: {format_bytes(figure)} {kind} > {what} 0 B ({report.label})",
                details,
            )
        )


def assert_hbm_bytes_within(budget: Budget | int | str | None = None, slack: float = 1.0, report: FusionReport | None = None) -> FusionReport:
    """HBM bytes (modelled, or measured with counters on) at most ``budget * slack``.

    ``budget`` is a ``Budget``, a byte count (int or ``"128 MiB"``), or ``None`` for the
    report's own budget (its arguments read once and outputs written once by default).
    """
    __tracebackhide__ = True
    if isinstance(slack, bool) or not isinstance(slack, (int, float)) or slack <= 0:
        raise ValueError(f"assert_hbm_bytes_within: slack must be a positive number, got {slack!r}")
    report = _resolve(report)
    if budget is None:
        if report.budget is None:
            raise ValueError(f"assert_hbm_bytes_within: report {report.label!r} has no budget; pass budget=")
        total, what = report.budget.total, "budget"
    elif isinstance(budget, Budget):
        total, what = budget.total, "budget"
    else:
        total, what = parse_bytes(budget), "limit"
    limit = int(total * slack)
    what = f"{what} x {slack:g}" if slack != 1.0 else what
    check_hbm_bytes(report, limit, what, "assert_hbm_bytes_within")
    return report


def check_bandwidth(report: FusionReport, fraction: float, where: str) -> None:
    from . import roofline

    roofline.ensure_efficiency(report)
    eff = report.efficiency
    if eff is None:
        raise FusionAssertionError(
            failure_message(report, f"{where}: efficiency unknown for {report.label} (no budget, time or peak bandwidth)")
        )
    if eff >= fraction:
        return
    headline = (
        f"{where}: {eff:.1%} of peak bandwidth < required {fraction:.0%} ({report.label}): "
        f"budget {format_bytes(report.budget.total if report.budget else None)} in {format_time(report.time_s)} "
        f"({report.time_source}) = {format_bandwidth((report.budget.total / report.time_s) if report.budget and report.time_s else None)} "
        f"against peak {format_bandwidth(report.peak_bandwidth)}"
    )
    if report.device == "cpu" and not settings.enforce_cpu_timing:
        report.warnings.append(headline + " [CPU timing: reported, not enforced; --fusion-enforce-cpu-timing enforces it]")
        return
    raise FusionAssertionError(failure_message(report, headline))


def assert_bandwidth_bound_within(fraction: float, report: FusionReport | None = None) -> FusionReport:
    """Efficiency (budget bytes / peak bandwidth / time) is at least ``fraction``.

    Enforced on GPUs. On CPU the shortfall is reported as a note on the report, not
    raised, unless ``--fusion-enforce-cpu-timing``.
    """
    __tracebackhide__ = True
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
        raise ValueError(f"assert_bandwidth_bound_within: fraction must be in (0, 1] (a share of peak bandwidth), got {fraction!r}")
    report = _resolve(report)
    check_bandwidth(report, float(fraction), "assert_bandwidth_bound_within")
    return report


def assert_matches_reference(fused_fn: Callable[..., Any], reference_fn: Callable[..., Any], *args: Any, rtol: float | None = None, atol: float | None = None, **kwargs: Any) -> Any:
    """Outputs of ``fused_fn`` match ``reference_fn`` run on float64 copies of the inputs."""
    __tracebackhide__ = True
    from .numerics import NumericsMismatch
    from .numerics import assert_matches_reference as _impl

    try:
        return _impl(fused_fn, reference_fn, *args, rtol=rtol, atol=atol, **kwargs)
    except NumericsMismatch as exc:
        log = current_log()
        if not log.reports:
            raise
        message = f"{exc}\nlatest fusion report of this test:\n{log.reports[-1]}"
    raise FusionAssertionError(message)


def assert_no_graph_breaks(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    """``fn(*args)`` compiles to one graph: each break is listed with reason and ``file:line``."""
    __tracebackhide__ = True
    from .graph_breaks import assert_no_graph_breaks as _impl

    return _impl(fn, *args, **kwargs)
