"""Report sink: Chrome traces of a failing test's profiled regions (``--fusion-trace-dir``)."""

from __future__ import annotations

import os
from typing import Any


def export_traces(nodeid: str, reports: list[Any], trace_dir: str) -> list[str]:
    """Write ``<test id>.<i>.json`` for each report that kept its profiler session."""
    os.makedirs(trace_dir, exist_ok=True)
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in nodeid)
    written = []
    for i, report in enumerate(reports):
        if report.trace is not None:
            path = os.path.join(trace_dir, f"{safe}.{i}.json")
            report.trace.export_chrome_trace(path)
            written.append(path)
    return written
