"""Verdicts: a figure against its limit, and the message a person reads when it fails.

Every check raises ``FusionAssertionError`` (an ``AssertionError``) whose message leads
with what changed (graph breaks, recompiles, kernels added against the baseline), then the
figure against its limit, then the kernel table and its notes. The checks take the
report's ``ReportLog`` (its settings: counters, CPU timing) and default to the current one.
"""

from __future__ import annotations

import warnings

from .budget import format_bytes
from .report import FusionReport, format_bandwidth, format_time
from .state import ReportLog, Settings, current_log


class FusionAssertionError(AssertionError):
    """A fusion check failed; the message carries the kernel table."""


class FusionCheckWarning(UserWarning):
    """A verdict passed on figures it could not fully check (e.g. unmodelled kernels)."""


def _what_changed(report: FusionReport, log: ReportLog) -> list[str]:
    lines: list[str] = []
    breaks = list(report.graph_breaks)
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


def failure_message(report: FusionReport, headline: str, details: list[str] | None = None, log: ReportLog | None = None) -> str:
    """What changed, the headline figure against its limit, details, the kernel table (of
    a long report: its per-module summary and top kernels), notes."""
    log = log if log is not None else current_log()
    parts = _what_changed(report, log) + [headline] + (details or [])
    parts.append(report.summary())
    parts += report.details()  # a long report: per-module summary and the top kernels (report.py)
    for note in report.notes() + log.notes_for(report):
        parts.append(f"note: {note}")
    return "\n".join(parts)


def _report_without_failing(report: FusionReport, text: str, log: ReportLog) -> None:
    """A verdict that is reported, not enforced: on the log, against ``report`` (pytest's
    summary and the report's outputs show it); outside pytest also a Python warning."""
    log.note(report, text)
    if log.test_id is None:
        warnings.warn(f"fusioncheck: {text}", stacklevel=3)


def _require_complete_counts(report: FusionReport, where: str, log: ReportLog | None) -> None:
    """A count or byte verdict on a CPU report that misses kernels (``FusionReport.counts_complete``) would pass on
    a lower bound: it fails, saying why."""
    __tracebackhide__ = True
    if not report.counts_complete:
        raise FusionAssertionError(failure_message(
            report, f"{where}: cannot check {report.label}: its kernels miss those of graphs compiled before "
                    "fusioncheck's hooks (note below)", log=log))


def check_max_kernels(report: FusionReport, n: int, where: str = "assert_max_kernels", log: ReportLog | None = None) -> None:
    __tracebackhide__ = True
    _require_complete_counts(report, where, log)
    if report.kernel_count > n:
        raise FusionAssertionError(
            failure_message(report, f"{where}: {report.kernel_count} kernels launched, limit {n} ({report.label})", log=log)
        )


def _bytes_figure(report: FusionReport, settings: Settings) -> tuple[int, str]:
    measured = report.bytes_measured
    if settings.counters != "none" and measured is not None:
        return measured, "measured"
    return report.bytes, "modelled"


def _per_kernel_excess(report: FusionReport, budget_total: int, settings: Settings) -> list[str]:
    rows = sorted(enumerate(report.kernels), key=lambda ik: -(ik[1].bytes_measured or ik[1].bytes or 0))
    lines = ["kernels by bytes (share of the budget):"]
    for i, k in rows[:8]:
        nbytes = k.bytes_measured if settings.counters != "none" and k.bytes_measured is not None else k.bytes
        share = f"{(nbytes or 0) / budget_total:.0%}" if budget_total else "-"
        shown = "?" if nbytes is None else format_bytes(nbytes)
        lines.append(f"  #{i} {k.short_name}: {shown} ({share}) {k.op} {k.source or ''}".rstrip())
    return lines


def check_hbm_bytes(report: FusionReport, limit: int, what: str, where: str, log: ReportLog | None = None) -> None:
    """``limit`` against the report's bytes. Unmodelled kernels never pass quietly: a
    region with no modelled kernel fails (nothing was checked), and a pass over a region
    with some unmodelled kernels warns (``FusionCheckWarning``) that its figure is a
    lower bound."""
    __tracebackhide__ = True
    log = log if log is not None else current_log()
    _require_complete_counts(report, where, log)
    figure, kind = _bytes_figure(report, log.settings)
    missing = report.unmodelled_kernels if kind == "modelled" else []
    if missing and len(missing) == report.kernel_count:
        raise FusionAssertionError(
            failure_message(
                report,
                f"{where}: cannot check bytes against {what} {format_bytes(limit)}: none of the "
                f"{report.kernel_count} kernel(s) of {report.label} has a byte model. Pass measured bytes "
                "(--fusion-counters=ncu), or declare the bytes of hand-written Triton kernels in their "
                "launch_metadata (docs/bytes.md)",
                log=log,
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
        details = _per_kernel_excess(report, limit, log.settings)
        raise FusionAssertionError(
            failure_message(
                report,
                f"{where}: {format_bytes(figure)} {kind} > {what} {format_bytes(limit)} "
                f"(excess {format_bytes(excess)}, {figure / limit:.2f}x) ({report.label})" if limit else
                f"{where}: {format_bytes(figure)} {kind} > {what} 0 B ({report.label})",
                details,
                log=log,
            )
        )


# Said by a timing verdict that judged a report capture did not time (docs/bytes.md, "Time").
UNTIMED = (
    "not timed again (a region never is; a profiled call is when the test's markers or code name a timing "
    "assertion or figure: docs/bytes.md, \"Time\")"
)


def _untimed(report: FusionReport, where: str, log: ReportLog) -> None:
    """Say so when a timing verdict judges a report that has no median time."""
    if report.median_time_s is None and report.time_s is not None:
        log.note(report, f"{where} judged the {report.time_source}: {UNTIMED}")


def check_bandwidth(report: FusionReport, fraction: float, where: str, log: ReportLog | None = None) -> None:
    __tracebackhide__ = True
    log = log if log is not None else current_log()
    eff = report.efficiency
    if eff is None:
        missing = [what for what, value in (("budget", report.budget), ("time", report.timed[0]), ("peak bandwidth", report.peak_bandwidth)) if not value]
        untimed = f"; {UNTIMED}" if report.median_time_s is None else ""
        raise FusionAssertionError(
            failure_message(report, f"{where}: efficiency unknown for {report.label} (no {', no '.join(missing)}{untimed})", log=log)
        )
    _untimed(report, where, log)
    if eff > ABOVE_ROOF:
        _above_the_roof(report, eff, where, log)
        return
    if eff >= fraction:
        return
    time_s, _, what = report.timed
    headline = (
        f"{where}: {eff:.1%} of peak bandwidth < required {fraction:.0%} ({report.label}): "
        f"budget {format_bytes(report.budget.total if report.budget else None)} in {format_time(time_s)} "
        f"({what}) = {format_bandwidth((report.budget.total / time_s) if report.budget and time_s else None)} "
        f"against peak {format_bandwidth(report.peak_bandwidth)}"
    )
    if report.device == "cpu" and not log.settings.enforce_cpu_timing:
        _report_without_failing(report, headline + " [CPU timing: reported, not enforced; --fusion-enforce-cpu-timing enforces it]", log)
        return
    raise FusionAssertionError(failure_message(report, headline, log=log))


# An efficiency above this is not a kernel beating the copy roofline: the budget is larger
# than what the call can move, or the peak bandwidth is low (docs/roofline.md).
ABOVE_ROOF = 1.02


def _above_the_roof(report: FusionReport, eff: float, where: str, log: ReportLog) -> None:
    """Fail an efficiency above ``ABOVE_ROOF`` on a GPU (an impossible figure must not
    pass), unless the budget fits in cache (then the warning capture added to a timed report
    explains it) or the device is a CPU (timing reported, not enforced)."""
    __tracebackhide__ = True
    headline = (
        f"{where}: {eff:.1%} of peak bandwidth is above the copy roofline ({report.label}): the budget or the peak "
        f"is wrong: budget {format_bytes(report.budget.total if report.budget else None)} in {format_time(report.timed[0])} "
        f"against peak {format_bandwidth(report.peak_bandwidth)} (pass the call's own budget=, or --fusion-peak-bandwidth)"
    )
    cached = any("under 4x the" in w for w in report.warnings)
    if report.device == "cpu" or cached:
        _report_without_failing(report, headline, log)
        return
    raise FusionAssertionError(failure_message(report, headline, log=log))


def headroom_share(report: FusionReport) -> tuple[float, str]:
    """The avoidable share of the region: on a GPU the time fusing its chains would save
    over its device time; on CPU (deterministic) their excess bytes over its bytes."""
    excess = sum(c.excess for c in report.headroom)
    time_s = report.timed[0]
    if report.device == "cuda" and report.peak_bandwidth and time_s:
        return sum(c.saving_s(report.peak_bandwidth) for c in report.headroom) / time_s, "of its device time"
    return (excess / report.bytes if report.bytes else 0.0), "of its modelled bytes"


def check_headroom(report: FusionReport, fraction: float, where: str, log: ReportLog | None = None) -> None:
    __tracebackhide__ = True
    log = log if log is not None else current_log()
    share, what = headroom_share(report)
    if what == "of its device time":
        _untimed(report, where, log)
    if share <= fraction:
        return
    from .headroom import distinct

    lines = [c.describe(report.peak_bandwidth, report.time_s if report.device == "cuda" else None)
             for c in distinct(report.headroom)]  # a repeated layer's copies: one line that counts them
    raise FusionAssertionError(
        failure_message(
            report,
            f"{where}: fusing the region's memory-bound chains would save {share:.0%} {what} > allowed {fraction:.0%} ({report.label})",
            ["chains (largest saving first):"] + [f"  {line}" for line in lines],
            log=log,
        )
    )


def check_launch_overhead(report: FusionReport, fraction: float, where: str, log: ReportLog | None = None) -> None:
    """Wall time not covered by device time, over the wall time, at most ``fraction``
    (GPU; on CPU there is no device time apart from the wall time: reported, not enforced)."""
    __tracebackhide__ = True
    log = log if log is not None else current_log()
    if report.device != "cuda":
        _report_without_failing(report, f"{where}: launch overhead is a GPU figure; not checked on {report.device}", log)
        return
    _untimed(report, where, log)
    share = report.launch_overhead_share
    if share is None:
        raise FusionAssertionError(failure_message(report, f"{where}: launch overhead unknown for {report.label} (no wall or device time)", log=log))
    if share > fraction:
        if report.graph_time_s is not None:
            graph = (
                f"replayed from a CUDA graph the call takes {format_time(report.graph_time_s)} "
                f"(recovers {report.graph_recovered_share or 0:.0%} of the idle time): "
                "torch.compile(mode='reduce-overhead') or torch.cuda.graphs would recover it; so would fewer launches (fusion)"
            )
        else:
            graph = (
                "fewer launches (fusion, torch.compile) or a CUDA graph (torch.compile(mode='reduce-overhead')) recovers it"
                + ("" if report.graph_note else "; graph_replay=True (or --fusion-graph-replay) measures what a graph recovers")
            )
        raise FusionAssertionError(
            failure_message(
                report,
                f"{where}: {share:.0%} of the wall time is launch overhead > allowed {fraction:.0%} ({report.label}): "
                f"wall {format_time(report.timed[1])}, device {format_time(report.timed[0])}, {report.kernel_count} launches",
                [graph],
                log=log,
            )
        )


def check_no_host_syncs(report: FusionReport, where: str = "assert_no_host_syncs", log: ReportLog | None = None) -> None:
    """No device-to-host synchronisation in the report: measured on a GPU (the CUDA
    runtime's synchronising calls), modelled on CPU (ops that sync on a GPU; docs/host_syncs.md)."""
    __tracebackhide__ = True
    if not report.host_syncs:
        return
    from .host_syncs import format_host_syncs

    how = "measured: CUDA runtime calls" if report.device == "cuda" else "CPU model: ops that synchronise on a GPU"
    raise FusionAssertionError(
        failure_message(
            report,
            f"{where}: {len(report.host_syncs)} device-to-host synchronisation(s) in {report.label} ({how})",
            [format_host_syncs(report.host_syncs)],
            log=log,
        )
    )


def check_max_recompiles(recompiles: list, n: int, where: str, test_id: str) -> None:
    """At most ``n`` TorchDynamo recompilations during the test, each named by its guard."""
    __tracebackhide__ = True
    if len(recompiles) > n:
        lines = [f"  {r}" for r in recompiles]
        earlier = sum(1 for r in recompiles if getattr(r, "earlier", False))
        if earlier:
            lines.append(
                f"note: {earlier} of them recompile a function first compiled before this test, so the count depends on "
                "what ran before; compile the function inside the test (or call torch._dynamo.reset() in a fixture) "
                "for a count of this test alone"
            )
        raise FusionAssertionError(f"{where}: {len(recompiles)} recompilation(s) during {test_id}, limit {n}\n" + "\n".join(lines))
