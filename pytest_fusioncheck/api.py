"""The public assertions (``from pytest_fusioncheck import assert_*``), thin over ``verdict``.

With ``report=None`` an assertion applies to the latest report of the running test (the
plugin makes each test's log current for its duration; ``state.py``), or of the process
outside pytest. Arguments are validated here, with messages that name the function.
"""

from __future__ import annotations

from typing import Any, Callable

from .budget import Budget, parse_bytes
from .report import FusionReport
from .state import current_log
from .verdict import FusionAssertionError, check_bandwidth, check_hbm_bytes, check_headroom, check_max_kernels, check_no_host_syncs


def _resolve(report: FusionReport | None) -> FusionReport:
    __tracebackhide__ = True
    if report is not None:
        if not isinstance(report, FusionReport):
            raise TypeError(f"report= must be a FusionReport, got {type(report).__name__}")
        return report
    return current_log().latest()


def assert_max_kernels(n: int, report: FusionReport | None = None) -> FusionReport:
    """The report launched at most ``n`` kernels (memcpy/memset not counted)."""
    __tracebackhide__ = True
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"assert_max_kernels: n must be a non-negative int, got {n!r}")
    report = _resolve(report)
    check_max_kernels(report, n)
    return report


def assert_hbm_bytes_within(budget: Budget | int | str | None = None, slack: float = 1.0, report: FusionReport | None = None) -> FusionReport:
    """HBM bytes (modelled, or measured with counters on) at most ``budget * slack``.

    ``budget`` is a ``Budget``, a byte count (int or ``"128 MiB"``), or ``None`` for the
    report's own budget (its arguments and module weights read once, outputs written once).
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


def assert_bandwidth_bound_within(fraction: float, report: FusionReport | None = None) -> FusionReport:
    """Efficiency (budget bytes / peak bandwidth / device time) is at least ``fraction``.

    Enforced on GPUs. On CPU the shortfall is reported as a note on the report, not
    raised, unless ``--fusion-enforce-cpu-timing``.
    """
    __tracebackhide__ = True
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
        raise ValueError(f"assert_bandwidth_bound_within: fraction must be in (0, 1] (a share of peak bandwidth), got {fraction!r}")
    report = _resolve(report)
    check_bandwidth(report, float(fraction), "assert_bandwidth_bound_within")
    return report


def assert_fusion_headroom_within(fraction: float, report: FusionReport | None = None) -> FusionReport:
    """What fusing the region's memory-bound chains would save is at most ``fraction``: of
    its device time on a GPU, of its modelled bytes on CPU (deterministic)."""
    __tracebackhide__ = True
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 <= fraction <= 1:
        raise ValueError(f"assert_fusion_headroom_within: fraction must be in [0, 1], got {fraction!r}")
    report = _resolve(report)
    check_headroom(report, float(fraction), "assert_fusion_headroom_within")
    return report


def assert_no_host_syncs(report: FusionReport | None = None) -> FusionReport:
    """No device-to-host synchronisation in the report (``.item()``, ``.cpu()``,
    ``nonzero``, an explicit synchronize): measured on a GPU, modelled on CPU
    (docs/host_syncs.md). A failure lists each sync with its op and user line."""
    __tracebackhide__ = True
    report = _resolve(report)
    check_no_host_syncs(report)
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
