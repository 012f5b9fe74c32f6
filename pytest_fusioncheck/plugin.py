"""pytest entry point: options, markers, the ``fusion`` fixture and the hooks.

Loaded into every pytest run of the environment (entry point ``fusioncheck``), so it
imports neither torch nor triton: hooks return early for tests that use no fusion
feature and import ``fixture`` (which does the work) only when one does. State lives in
stashes (``state.py``): the session's settings and sinks in ``config.stash``, each test's
state in ``item.stash``, released at its teardown.
"""

from __future__ import annotations

import functools

from typing import Any

import pytest

from . import options, state


TRITON_CPU_HINT = (
    "Triton found no GPU driver. On a machine without a GPU, Triton kernels run under its interpreter: "
    "set TRITON_INTERPRET=1 in the environment before triton is imported (e.g. TRITON_INTERPRET=1 pytest ...), "
    "and pass CPU tensors; or run these tests on a GPU machine."
)


def pytest_addoption(parser: pytest.Parser) -> None:
    options.add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    """Register the markers and validate every option once, up front (a usage error)."""
    for line in options.MARKERS:
        config.addinivalue_line("markers", line)
    config.stash[state.SETTINGS] = options.settings_from_config(config)
    config.stash[state.SESSION] = None


def pytest_sessionstart(session: pytest.Session) -> None:
    from .sinks import SessionSinks

    if SessionSinks.wanted(session.config):
        session.config.stash[state.SESSION] = SessionSinks(session.config)


def _baseline_writer(config: pytest.Config) -> Any:
    sinks = config.stash.get(state.SESSION, None)
    sink = sinks.baseline if sinks is not None else None
    return sink.writer if sink is not None else None


def pytest_deselected(items: list[pytest.Item]) -> None:
    """Deselected tests (``-k``, ``-m``) are collected: their baseline entries are not stale."""
    if items:
        writer = _baseline_writer(items[0].config)
        if writer is not None:
            writer.mark_collected(item.nodeid for item in items)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Tell the baseline writer what was collected; with ``--fusion-counters=ncu``, measure
    the selected tests under ncu before they run."""
    config = session.config
    settings = config.stash[state.SETTINGS]
    sinks = config.stash.get(state.SESSION, None)
    writer = _baseline_writer(config)
    if writer is not None:
        writer.mark_collected(item.nodeid for item in session.items)
    if settings.counters != "ncu" or sinks is None or sinks.is_worker:
        return
    from .sources.bytes_ncu import collect_for_session

    nodeids = [item.nodeid for item in session.items if options.uses_fusion(item)]
    sinks.lines += collect_for_session(config, nodeids, settings)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Give the test its own report log (current while it runs) and, for a test that uses
    a fusion feature, validate its markers before any fixture runs."""
    log = state.ReportLog(test_id=item.nodeid, settings=item.config.stash[state.SETTINGS],
                          timing=functools.partial(options.names_timing, item))  # read at the test's first capture
    item.stash[state.LOG] = (log, state.activate(log))
    if options.uses_fusion(item):
        from .fixture import TestState

        item.stash[state.ITEM] = TestState.for_item(item, log)


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    """Release the test's reports (their figures went to its TestReport) and its log."""
    test_state = item.stash.get(state.ITEM, None)
    if test_state is not None:
        test_state.log.release()
        del item.stash[state.ITEM]
    log, token = item.stash.get(state.LOG, (None, None))
    if log is not None:
        log.release()
        state.deactivate(token)
        del item.stash[state.LOG]


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function):
    """Wrap the test call: record graph breaks, then check every report against the markers."""
    test_state = pyfuncitem.stash.get(state.ITEM, None)
    if test_state is None:
        return (yield)
    from . import fixture

    with fixture.test_call(pyfuncitem, test_state):
        result = yield
    try:
        fixture.check(pyfuncitem, test_state)
    except AssertionError as exc:  # a marker's verdict: the message is the whole story
        exc.fusioncheck_verdict = True  # type: ignore[attr-defined]  (makereport shows the message alone)
        raise
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    excinfo = call.excinfo
    if excinfo is not None and getattr(excinfo.value, "fusioncheck_verdict", False) and report.failed:
        report.longrepr = str(excinfo.value)  # the verdict, not the plugin's frames
    if excinfo is not None and report.failed and isinstance(excinfo.value, RuntimeError) and "active drivers" in str(excinfo.value):
        report.sections.append(("fusioncheck hint", TRITON_CPU_HINT))
    test_state = item.stash.get(state.ITEM, None)
    if test_state is not None and call.when == "call":
        from .fixture import attach_reports

        attach_reports(item, test_state, report)
    return report


@pytest.fixture
def fusion(request: pytest.FixtureRequest):
    """Profile callables and regions of this test and assert on their kernels and bytes."""
    from .fixture import Fusion, TestState

    item = request.node
    test_state = item.stash.get(state.ITEM, None)
    if test_state is None:  # requested indirectly (getfixturevalue): set up on demand
        log, _ = item.stash.get(state.LOG, (None, None))
        test_state = TestState.for_item(item, log)
        item.stash[state.ITEM] = test_state
    return Fusion(item, test_state, request)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    report_tables = options.get_option(config, "report")
    sinks = config.stash.get(state.SESSION, None)
    if hasattr(config, "workerinput"):
        return
    from .sinks import terminal

    collected = terminal.collected_reports(terminalreporter)
    if report_tables and collected:
        terminal.write_tables(terminalreporter, collected)
    lines = sinks.summary(terminalreporter, collected) if sinks is not None else []
    terminal.write_lines(terminalreporter, lines + terminal.unenforced_lines(collected))


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """pytest-xdist controller: collect a worker's baseline records."""
    sinks = node.config.stash.get(state.SESSION, None)
    if sinks is not None:
        sinks.add_worker_output(node.gateway.id, getattr(node, "workeroutput", {}) or {})


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    sinks = session.config.stash.get(state.SESSION, None)
    if sinks is not None:
        sinks.finish(session.config)
