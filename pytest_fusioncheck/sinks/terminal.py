"""Report sink: the terminal summary (``--fusion-report`` kernel tables, session lines).

Reads the reports from the TestReports' ``user_properties`` (plain data), so it works
the same under pytest-xdist, where the controller never saw the report objects.
"""

from __future__ import annotations

from typing import Any


def collected_reports(terminalreporter: Any) -> list[tuple[str, str, list[dict[str, Any]]]]:
    """``(test id, kernel tables as text, report dicts)`` of every test that profiled."""
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


def write_tables(terminalreporter: Any, collected: list[tuple[str, str, list[dict[str, Any]]]]) -> None:
    terminalreporter.write_sep("=", "fusioncheck kernel tables")
    for _, text, _ in collected:
        terminalreporter.write_line(text)


def write_lines(terminalreporter: Any, lines: list[str]) -> None:
    if lines:
        terminalreporter.write_sep("-", "fusioncheck")
    for line in lines:
        terminalreporter.write_line(line)


UNENFORCED = "reported, not enforced"
UNCHECKED = "not checked on "  # verdict.check_launch_overhead off a GPU


def unenforced_lines(collected: list[tuple[str, str, list[dict[str, Any]]]]) -> list[str]:
    """One line per CPU timing verdict that fell short but was reported, not enforced
    (``verdict.check_bandwidth``), and one per timing verdict a CPU cannot check (launch
    overhead), from the reports' ``verdict_notes``: shown under ``-q`` too, so a shortfall
    or a skipped check is never silent."""
    short, unchecked = [], []
    for nodeid, _, reports in collected:
        for r in reports:
            for warning in r.get("verdict_notes") or []:
                if UNENFORCED in warning:
                    short.append(f"{nodeid}: {warning.split(' [')[0]}")
                elif UNCHECKED in warning:
                    unchecked.append(f"{nodeid}: {warning}")
    lines = []
    if short:
        lines += [f"fusioncheck: {len(short)} timing verdict(s) on CPU fell short, reported, not enforced "
                  "(--fusion-enforce-cpu-timing enforces them):"] + [f"  {line}" for line in short]
    if unchecked:
        lines += [f"fusioncheck: {len(unchecked)} timing verdict(s) need a GPU and were not checked:"] + [f"  {line}" for line in unchecked]
    return lines
