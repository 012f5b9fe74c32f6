"""Report sink: one self-contained HTML page of the session's reports (``--fusion-html``).

No scripts and no external assets: a file a CI job can keep as an artifact and anyone can
open. Per test: each report's summary line, its headroom and notes, a per-module summary
(models: repeated layers folded) and the full kernel table, which JSON aside is the only
place a 165-kernel model's every row is shown. Everything is escaped (kernel names hold
``<`` and ``>``).
"""

from __future__ import annotations

import html
import os
from typing import Any

from ..report import fold_modules

_STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 2em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.1em; margin-top: 2em; border-top: 1px solid #ccc; padding-top: 1em; }
table { border-collapse: collapse; margin: .5em 0 1em; } td, th { padding: 2px 8px; text-align: left; }
th { background: #eee; } tr:nth-child(even) td { background: #f8f8f8; } td.n { text-align: right; font-variant-numeric: tabular-nums; }
.summary { font-family: monospace; } .note { color: #555; } .failed { color: #b00; } .unmodelled { color: #b60; }
"""


def _bytes(n: Any) -> str:
    from ..budget import format_bytes

    return "?" if n is None else format_bytes(n)


def _time(s: Any) -> str:
    from ..report import format_time

    return format_time(s)


def render(collected: list[tuple[str, str, list[dict[str, Any]]]], failed: set[str] | None = None) -> str:
    """The page for ``[(test id, kernel tables as text, [report dict, ...])]``."""
    failed = failed or set()
    esc = html.escape
    out = [
        "<!doctype html><html><head><meta charset='utf-8'><title>fusioncheck report</title>",
        f"<style>{_STYLE}</style></head><body>",
        "<h1>fusioncheck: kernels, bytes and time per profiled test</h1>",
        "<table><tr><th>test</th><th>reports</th><th>kernels</th><th>modelled</th><th>budget</th><th>time</th></tr>",
    ]
    for i, (nodeid, _, reports) in enumerate(collected):
        cls = " class='failed'" if nodeid in failed else ""
        out.append(
            f"<tr><td><a href='#t{i}'{cls}>{esc(nodeid)}</a></td><td class='n'>{len(reports)}</td>"
            f"<td class='n'>{sum(r.get('kernel_count', 0) for r in reports)}</td>"
            f"<td class='n'>{esc(_bytes(sum(r.get('bytes') or 0 for r in reports)))}</td>"
            f"<td class='n'>{esc(_bytes(sum((r.get('budget') or {}).get('total') or 0 for r in reports)))}</td>"
            f"<td class='n'>{esc(_time(sum(r.get('time_s') or 0 for r in reports)))}</td></tr>"
        )
    out.append("</table>")
    for i, (nodeid, _, reports) in enumerate(collected):
        out.append(f"<h2 id='t{i}'{' class=failed' if nodeid in failed else ''}>{esc(nodeid)}</h2>")
        for r in reports:
            out.append(_report_section(r))
    out.append("</body></html>")
    return "\n".join(out)


def _report_section(r: dict[str, Any]) -> str:
    esc = html.escape
    parts = [
        f"<p class='summary'>[{esc(str(r.get('label')))}] on {esc(str(r.get('device_kind')))}: "
        f"{r.get('kernel_count')} kernels, {esc(_bytes(r.get('bytes')))} modelled"
        + (f" (<span class='unmodelled'>+{r['bytes_unmodelled']} unmodelled</span>)" if r.get("bytes_unmodelled") else "")
        + f", budget {esc(_bytes((r.get('budget') or {}).get('total')))}, time {esc(_time(r.get('time_s')))}"
        + (f", wall {esc(_time(r.get('wall_time_s')))}" if r.get("device") == "cuda" and r.get("wall_time_s") else "")
        + (f", {r['efficiency']:.0%} of peak" if r.get("efficiency") else "")
        + "</p>"
    ]
    for chain in r.get("headroom") or []:
        parts.append(
            f"<p class='note'>headroom: kernels {', '.join(map(str, chain['kernels']))} "
            f"({esc(', '.join(dict.fromkeys(op.removeprefix('aten::') for op in chain['ops'])))}) move "
            f"{esc(_bytes(chain['bytes']))} for a fused budget of {esc(_bytes(chain['fused_bytes']))}: "
            f"fusing saves {esc(_bytes(chain['excess']))}</p>"
        )
    for note in r.get("warnings") or []:
        parts.append(f"<p class='note'>note: {esc(str(note))}</p>")
    kernels = r.get("kernels") or []
    if any(k.get("module") for k in kernels):
        parts.append("<table><tr><th>module (layers folded)</th><th>kernels</th><th>time</th><th>modelled</th></tr>")
        for pattern, per, copies, seconds, nbytes in fold_modules((k.get("module"), k.get("time_s"), k.get("bytes")) for k in kernels):
            count = f"{per} x {copies}" if copies > 1 else str(per)
            parts.append(
                f"<tr><td>{esc(pattern)}</td><td class='n'>{count}</td><td class='n'>{esc(_time(seconds))}</td>"
                f"<td class='n'>{esc(_bytes(nbytes))}</td></tr>"
            )
        parts.append("</table>")
    show_measured = any(k.get("bytes_measured") is not None for k in kernels)
    parts.append(
        "<table><tr><th>#</th><th>kernel</th><th>time</th><th>bytes</th>"
        + ("<th>measured</th>" if show_measured else "")
        + "<th>op</th><th>module</th><th>source</th></tr>"
    )
    for i, k in [(str(i), k) for i, k in enumerate(kernels)] + [("copy", k) for k in r.get("copies") or []]:
        cls = " class='n unmodelled'" if k.get("bytes") is None else " class='n'"
        parts.append(
            f"<tr><td class='n'>{i}</td><td title='{esc(str(k.get('name')))}'>{esc(_short(str(k.get('name'))))}</td>"
            f"<td class='n'>{esc(_time(k.get('time_s')))}</td><td{cls}>{esc(_bytes(k.get('bytes')))}</td>"
            + (f"<td class='n'>{esc(_bytes(k.get('bytes_measured')))}</td>" if show_measured else "")
            + f"<td>{esc(str(k.get('op') or '-'))}</td><td>{esc(str(k.get('module') or '-'))}</td>"
            f"<td>{esc(str(k.get('source') or '-'))}</td></tr>"
        )
    parts.append("</table>")
    return "\n".join(parts)


def _short(name: str) -> str:
    from ..report import shorten_kernel_name

    return shorten_kernel_name(name, width=90)


class HtmlSink:
    def __init__(self, path: str) -> None:
        self.path = path
        self.failed: set[str] = set()  # test ids the session summary marks red

    def write(self, collected: list[tuple[str, str, list[dict[str, Any]]]]) -> list[str]:
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(render(collected, self.failed))
        os.replace(tmp, self.path)
        return [f"fusioncheck: HTML report of {len(collected)} test(s) written to {self.path}"]
