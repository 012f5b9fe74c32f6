"""Settings and report logs: what a session and a test know, and where it is kept.

Inside pytest the session's ``Settings`` live in ``config.stash`` and each test's
``ReportLog`` in its ``item.stash`` (docs/architecture.md). The public ``assert_*``
helpers take no handle, so the log of the running test is also made *current* for the
test's duration through a context variable, and reset after it: two sessions in one
process (pytester in-process) never see each other's settings or reports. Outside pytest
every report goes to one process-wide log with default settings.

No torch import: the plugin loads this module into every pytest run.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass, field
from typing import Any, Callable

import pytest


class NoReportError(RuntimeError):
    """An assertion was called with ``report=None`` before anything was profiled."""


@dataclass
class Settings:
    """One session's choices, from its options (defaults outside pytest)."""

    enforce_cpu_timing: bool = False
    peak_bandwidth: float | None = None  # bytes/s; None: measured once per device
    counters: str = "none"  # "none" or "ncu"
    warmup: int = 1
    device: str | None = None
    peak_cache: Any = None  # pytest's cache, for the measured peak bandwidth
    measured: Any = None  # sources.bytes_ncu.Measured, with --fusion-counters=ncu
    trace_dir: str | None = None
    torch_logs: bool = False  # keep torch's DEBUG records in captured logs
    graph_replay: str = "off"  # "off", "auto" (launch-bound reports) or "all": CUDA-graph replays
    require_gpu: bool = False  # a cuda device without a GPU fails the test instead of skipping it
    peaks: dict[str, float] = field(default_factory=dict)  # peak bandwidth measured this session


@dataclass
class ReportLog:
    """The reports of one test (or of the process, outside pytest)."""

    test_id: str | None = None
    settings: Settings = field(default_factory=Settings)
    reports: list[Any] = field(default_factory=list)
    graph_breaks: list[Any] = field(default_factory=list)
    recompiles: list[Any] = field(default_factory=list)  # the whole test call's (graph_breaks.Recompile)
    context: list[Callable[[], str]] = field(default_factory=list)
    # What verdicts reported without failing (a CPU timing shortfall, a check a CPU cannot
    # make), by the report they judged: verdicts leave reports as capture made them.
    verdict_notes: dict[int, list[str]] = field(default_factory=dict)
    # Whether capture times calls again without the profiler (``capture.profile_call``):
    # outside pytest always; a test's log says what its markers and code ask for, or holds
    # the function that decides it, run at the test's first capture (``times_calls``).
    timing: bool | Callable[[], bool] = True

    def times_calls(self) -> bool:
        if callable(self.timing):
            self.timing = bool(self.timing())
        return self.timing

    def note(self, report: Any, text: str) -> None:
        """Record ``text`` against ``report`` (once)."""
        notes = self.verdict_notes.setdefault(id(report), [])
        if text not in notes:
            notes.append(text)

    def notes_for(self, report: Any) -> list[str]:
        return list(self.verdict_notes.get(id(report), ()))

    def latest(self) -> Any:
        __tracebackhide__ = True
        if not self.reports:
            where = f"test {self.test_id}" if self.test_id else "this process"
            raise NoReportError(
                f"no fusion report yet in {where}: call fusion.profile(...) / profile(...) or open "
                "fusion.region(...) before asserting, or pass report=..."
            )
        return self.reports[-1]

    def release(self) -> None:
        """Drop what keeps tensors alive (outputs, profiler events); the figures stay.
        Called at the test's teardown."""
        for report in self.reports:
            report.release()


_process_log = ReportLog()
_current: contextvars.ContextVar[ReportLog | None] = contextvars.ContextVar("fusioncheck_log", default=None)


def current_log() -> ReportLog:
    """The running test's log, else the process-wide one."""
    log = _current.get()
    return log if log is not None else _process_log


def activate(log: ReportLog) -> contextvars.Token:
    """Make ``log`` current (until ``deactivate`` with the token returned)."""
    return _current.set(log)


def deactivate(token: contextvars.Token) -> None:
    _current.reset(token)


def record_report(report: Any, log: ReportLog | None = None) -> None:
    """Append ``report`` (complete: capture filled it) to ``log`` (default: the current one)."""
    log = log if log is not None else current_log()
    log.reports.append(report)
    if log is _process_log and len(log.reports) > 1000:  # a long-lived process: keep the tail
        for old in log.reports[:-100]:
            old.release()
        del log.reports[:-100]


# pytest stash keys: the session's Settings and sinks; each test's log (with the token that
# made it current) and, for a test that uses a fusion feature, its state.
SETTINGS = pytest.StashKey[Settings]()
SESSION = pytest.StashKey[Any]()
LOG = pytest.StashKey["tuple[ReportLog, contextvars.Token]"]()
# The session's graph breaks, ``(GraphBreak, test id)`` in the order recorded: a later test
# that runs the same broken graphs from Dynamo's cache reports them too (graph_breaks.carried_over).
BREAKS = pytest.StashKey["list[tuple[Any, str]]"]()
ITEM = pytest.StashKey[Any]()
