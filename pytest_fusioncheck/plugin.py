"""pytest entry point: options, markers, the ``fusion`` fixture and the hooks.

Loaded into every pytest run of the environment (entry point ``fusioncheck``), so it
imports neither torch nor triton: hooks return early for tests that use no fusion
feature and import ``runtime`` (which does the work) only when one does.
"""

from __future__ import annotations

from typing import Any

import pytest

# name -> (help, kind, default). One text serves the CLI option and its ini key.
OPTIONS: dict[str, tuple[str, str, Any]] = {
    "device": ('device to profile on: "cuda" or "cpu" (default: cuda when a GPU is present, else cpu)', "string", None),
    "warmup": ("unprofiled calls before the profiled one (default 1)", "string", "1"),
    "peak_bandwidth": ('peak memory bandwidth in bytes/s, e.g. 4.25e12 or "4250 GB/s" (default: measured once per device with a large copy)', "string", None),
    "counters": ('hardware byte counters: "none" (default) or "ncu" (re-run the selected tests under Nsight Compute)', "string", "none"),
    "baseline": ("compare kernel counts and bytes with a committed baseline JSON file (default path .fusioncheck-baseline.json)", "string", None),
    "update_baseline": ("write the baseline file at the end of the session (atomically)", "bool", False),
    "json": ("write every fusion report of the session to this JSON file", "string", None),
    "trace_dir": ("write Chrome traces of failing profiled regions into this directory", "string", None),
    "roofline": ("write a roofline plot (PNG/SVG) of the session's kernels to this path", "string", None),
    "report": ("print the kernel table of every profiled test in the terminal summary", "bool", False),
    "enforce_cpu_timing": ("enforce bandwidth assertions on CPU too (default: reported only)", "bool", False),
}
DEFAULT_BASELINE = ".fusioncheck-baseline.json"

MARKERS = (
    "max_kernels(n, *, cpu=None, cuda=None): every fusion report of the test has at most n kernels "
    "(a per-device value wins); without the fusion fixture the test body itself is profiled",
    'max_hbm_bytes(n): modelled (or measured, with counters on) HBM bytes at most n; int or string such as "128 MiB"',
    "bandwidth_bound(fraction): every report reaches at least this fraction of peak bandwidth "
    "(enforced on GPUs; reported on CPU)",
    "no_graph_breaks: any TorchDynamo graph break during the test fails it, naming each break's reason and file:line",
)
FUSION_MARKERS = ("max_kernels", "max_hbm_bytes", "bandwidth_bound", "no_graph_breaks")

ITEM_STATE = pytest.StashKey["Any"]()
SESSION_STATE = pytest.StashKey["Any"]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("fusioncheck", "kernel-fusion regression checks (pytest-fusioncheck)")
    for name, (help_text, kind, default) in OPTIONS.items():
        flag = "--fusion-" + name.replace("_", "-")
        if name == "baseline":
            group.addoption(flag, action="store", nargs="?", const=DEFAULT_BASELINE, default=None, metavar="PATH", help=help_text)
        elif kind == "bool":
            group.addoption(flag, action="store_true", default=None, help=help_text)
        else:
            group.addoption(flag, action="store", default=None, help=help_text)
        parser.addini(f"fusioncheck_{name}", help_text, type="bool" if kind == "bool" else "string", default=default)


def get_option(config: pytest.Config, name: str) -> Any:
    """Command line over ini over default: the one precedence rule for every option."""
    value = config.getoption("fusion_" + name)
    if value is not None:
        return value
    return config.getini(f"fusioncheck_{name}")


def pytest_configure(config: pytest.Config) -> None:
    for line in MARKERS:
        config.addinivalue_line("markers", line)
    config.stash[SESSION_STATE] = None
    from . import runtime  # light: no torch; validates the options once, up front

    runtime.configure_settings(config, get_option)


def _uses_fusion(item: pytest.Item) -> bool:
    if "fusion" in getattr(item, "fixturenames", ()):
        return True
    return any(item.get_closest_marker(m) is not None for m in FUSION_MARKERS)


def pytest_sessionstart(session: pytest.Session) -> None:
    config = session.config
    if any(get_option(config, n) for n in ("baseline", "update_baseline", "json", "roofline")) or (
        get_option(config, "counters") not in (None, "", "none")
    ):
        from . import runtime

        config.stash[SESSION_STATE] = runtime.SessionState.from_config(config, get_option)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Validate fusion markers before any fixture runs, so bad arguments fail at setup."""
    from . import api

    api.begin_test(item.nodeid)
    if not _uses_fusion(item):
        return
    from . import runtime

    item.stash[ITEM_STATE] = runtime.ItemState.from_item(item, get_option)


def pytest_runtest_teardown(item: pytest.Item) -> None:
    from . import api

    api.end_test()


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function):
    """Wrap the test call: record graph breaks, then check every report against the markers."""
    state = pyfuncitem.stash.get(ITEM_STATE, None)
    if state is None:
        return (yield)
    from . import runtime

    with runtime.test_context(pyfuncitem, state):
        result = yield
    try:
        runtime.check_item(pyfuncitem, state)
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
    state = item.stash.get(ITEM_STATE, None)
    if state is not None and call.when == "call":
        from . import runtime

        runtime.attach_reports(item, state, report)
    return report


@pytest.fixture
def fusion(request: pytest.FixtureRequest):
    """Profile callables and regions of this test and assert on their kernels and bytes."""
    from . import runtime

    state = request.node.stash.get(ITEM_STATE, None)
    if state is None:  # requested indirectly (getfixturevalue): set up on demand
        state = runtime.ItemState.from_item(request.node, get_option)
        request.node.stash[ITEM_STATE] = state
    return runtime.Fusion(request.node, state)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if not get_option(config, "report") and config.stash.get(SESSION_STATE, None) is None:
        return
    from . import runtime

    runtime.terminal_summary(terminalreporter, config, get_option)


def pytest_collection_finish(session: pytest.Session) -> None:
    """With ``--fusion-counters=ncu``, measure the selected tests under ncu before they run."""
    state = session.config.stash.get(SESSION_STATE, None)
    if state is not None and state.counters == "ncu":
        state.collect_counters(session, _uses_fusion)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """pytest-xdist controller: collect a worker's baseline records."""
    state = node.config.stash.get(SESSION_STATE, None)
    if state is not None:
        state.add_worker_output(node.gateway.id, getattr(node, "workeroutput", {}) or {})


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    state = session.config.stash.get(SESSION_STATE, None)
    if state is not None:
        state.finish(session)
