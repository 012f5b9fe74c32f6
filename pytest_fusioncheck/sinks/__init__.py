"""Where reports go at the end of a session: the terminal, JSON, the baseline, a plot.

``SessionSinks`` is created at session start only when an option asks for one of them
(``--fusion-json``, ``--fusion-roofline``, ``--fusion-baseline`` / ``--fusion-update-
baseline``, ``--fusion-html``) and kept in ``config.stash``. Each sink reads the reports as plain data (the
dicts on the TestReports), so none holds a tensor. Traces of failing tests are written
as the test fails (``traces.py``); the kernel tables of ``--fusion-report`` come from
``terminal.py``. Adding a sink: docs/architecture.md.
"""

from __future__ import annotations

from typing import Any

import pytest

from ..options import DEFAULT_BASELINE, get_option


class SessionSinks:
    def __init__(self, config: pytest.Config) -> None:
        self.is_worker = hasattr(config, "workerinput")
        self.lines: list[str] = []
        self.files: list[Any] = []  # sinks with write(collected) -> lines
        json_path = get_option(config, "json")
        if json_path:
            from .json_sink import JsonSink

            self.files.append(JsonSink(json_path))
        html_path = get_option(config, "html")
        if html_path:
            from ..state import SETTINGS
            from .html_sink import HtmlSink

            self.files.append(HtmlSink(html_path, config.stash.get(SETTINGS, None)))
        plot_path = get_option(config, "roofline")
        if plot_path:
            from ..state import SETTINGS
            from .plot_sink import PlotSink

            self.files.append(PlotSink(plot_path, config.stash.get(SETTINGS, None)))
        update = bool(get_option(config, "update_baseline"))
        path = get_option(config, "baseline") or (DEFAULT_BASELINE if update else None)
        self.baseline = None
        if path:
            from .baseline_sink import BaselineSink

            self.baseline = BaselineSink(path, str(config.rootpath), update, bool(get_option(config, "baseline_strict")))

    @staticmethod
    def wanted(config: pytest.Config) -> bool:
        return any(get_option(config, n) for n in ("baseline", "update_baseline", "json", "roofline", "html")) or (
            get_option(config, "counters") not in (None, "", "none")
        )

    def add_worker_output(self, worker_id: str, output: dict[str, Any]) -> None:
        if self.baseline is not None:
            self.baseline.add_worker_output(worker_id, output)

    def finish(self, config: pytest.Config) -> None:
        if self.is_worker:
            if self.baseline is not None:
                config.workeroutput.update(self.baseline.worker_output())  # type: ignore[attr-defined]
            return
        if self.baseline is not None:
            self.lines += self.baseline.flush()

    def summary(self, terminalreporter: Any, collected: list[tuple[str, str, list[dict[str, Any]]]]) -> list[str]:
        if self.is_worker:
            return []
        lines = list(self.lines)
        failed = {getattr(rep, "nodeid", "") for rep in terminalreporter.stats.get("failed", [])}
        outcomes = {getattr(rep, "nodeid", ""): word for word in ("xfailed", "xpassed", "error", "failed")
                    for rep in terminalreporter.stats.get(word, [])}
        # Each failing test's failure as the terminal prints it (a call's over a teardown's).
        verdicts = {getattr(rep, "nodeid", ""): str(rep.longreprtext) for word in ("error", "failed")
                    for rep in terminalreporter.stats.get(word, []) if getattr(rep, "longrepr", None) is not None}
        for sink in self.files:
            if hasattr(sink, "failed"):
                sink.failed = failed
            if hasattr(sink, "outcomes"):
                sink.outcomes = outcomes
            if hasattr(sink, "verdicts"):
                sink.verdicts = verdicts
            lines += sink.write(collected)
        if self.baseline is not None:
            lines += self.baseline.improvement_lines()
        return lines
