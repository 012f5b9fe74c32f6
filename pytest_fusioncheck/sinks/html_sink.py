"""Report sink: one self-contained HTML page of the session's reports (``--fusion-html``).

No scripts and no external assets: a file a CI job can keep as an artifact and anyone can
open. The session's roofline (inline SVG, when matplotlib is installed) heads it; failing
tests come first. Per test: its verdict (a failing test's failure as the terminal prints
it), each report's summary line, modelled
bytes against the budget as a bar, a strip of its kernels in launch order (widths by time,
the launch gaps as one hatched share), graph breaks and recompiles with their source lines,
headroom and notes, a per-module summary (models: repeated layers folded) and the full kernel
table, which JSON aside is the only place a 165-kernel model's every row is shown. Everything
is escaped (kernel names hold ``<`` and ``>``). ``tests/test_html_report.py`` loads the page
in headless Chromium when it is installed, and checks that it fits a 1400 px window: long
cells (kernel names, ops, modules, sources) are cut with an ellipsis, their full text on hover.
"""

from __future__ import annotations

import html
import os
from typing import Any

from ..report import fold_modules, format_graph_replay, index_ranges

_STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 2em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.1em; margin-top: 2em; border-top: 1px solid #ccc; padding-top: 1em; }
table { border-collapse: collapse; margin: .5em 0 1em; } td, th { padding: 2px 8px; text-align: left; }
th { background: #eee; } tr:nth-child(even) td { background: #f8f8f8; } td.n { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.summary { font-family: monospace; } .note { color: #555; } .failed { color: #b00; } .unmodelled { color: #b60; }
.verdict { font-weight: bold; } .verdict.failed, .verdict.error { color: #b00; } .verdict.passed { color: #070; }
.verdict.xfailed, .verdict.xpassed { color: #776; } td.id { max-width: 60em; overflow-wrap: anywhere; }
.caption { color: #777; font-size: .85em; margin: .1em 0; }
.bar { position: relative; width: 32em; height: 1.1em; background: #eee; margin: .3em 0; }
.bar div { position: absolute; top: 0; bottom: 0; left: 0; } .bar .budget { border-right: 2px solid #222; }
.bar .modelled { background: #69c; opacity: .8; } .bar.over .modelled { background: #c66; }
.strip { display: flex; width: 48em; height: 1.4em; margin: .3em 0 1em; border: 1px solid #ccc; }
.strip div { height: 100%; border-right: 1px solid #fff; min-width: 1px; }
.strip .gap { background: repeating-linear-gradient(45deg, #ddd, #ddd 4px, #f4f4f4 4px, #f4f4f4 8px); }
.break { font-family: monospace; color: #8a4b00; }
pre.why { white-space: pre-wrap; overflow-wrap: anywhere; background: #fdf3f3; border-left: 3px solid #b00;
  padding: .5em 1em; font-size: 12px; max-width: 110em; }
td.t { max-width: 16em; overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
td.t.name { max-width: 22em; } td.t.op { max-width: 10em; }
"""
# Kernel colours in the strip, by kind: copies grey, kernels cycling through a few hues.
_HUES = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#9c755f")


def _bytes(n: Any) -> str:
    from ..budget import format_bytes

    return "?" if n is None else format_bytes(n)


def _time(s: Any) -> str:
    from ..report import format_time

    return format_time(s)


def render(collected: list[tuple[str, str, list[dict[str, Any]]]], failed: set[str] | None = None,
           outcomes: dict[str, str] | None = None, roofline: str | None = None,
           verdicts: dict[str, str] | None = None) -> str:
    """The page for ``[(test id, kernel tables as text, [report dict, ...])]``; ``failed`` the
    test ids that failed, ``outcomes`` other verdicts by test id (``xfailed``, ``error``, ...),
    ``roofline`` the session's roofline as SVG markup (``roofline_svg``) or a line saying why none,
    ``verdicts`` the failure text of failing tests by test id (pytest's ``longreprtext``)."""
    failed = set(failed or ()) | {n for n, word in (outcomes or {}).items() if word in ("failed", "error")}
    words = {n: (outcomes or {}).get(n) or ("failed" if n in failed else "passed") for n, _, _ in collected}
    esc = html.escape
    collected = sorted(collected, key=lambda entry: entry[0] not in failed)  # failing tests first, stable
    n_failed = sum(1 for nodeid, _, _ in collected if nodeid in failed)
    out = [
        "<!doctype html><html><head><meta charset='utf-8'><title>fusioncheck report</title>",
        f"<style>{_STYLE}</style></head><body>",
        "<h1>fusioncheck: kernels, bytes and time per profiled test</h1>",
        f"<p>{len(collected)} profiled test(s), <span class='failed'>{n_failed} failed</span>.</p>",
        "<table id='tests'><tr><th>test</th><th>verdict</th><th>reports</th><th>kernels</th><th>modelled</th>"
        "<th>budget</th><th>time</th></tr>",
    ]
    for i, (nodeid, _, reports) in enumerate(collected):
        cls = " class='failed'" if nodeid in failed else ""
        out.append(
            f"<tr><td class='id'><a href='#t{i}'{cls}>{esc(nodeid)}</a></td>{_verdict(words[nodeid])}<td class='n'>{len(reports)}</td>"
            f"<td class='n'>{sum(r.get('kernel_count', 0) for r in reports)}</td>"
            f"<td class='n'>{esc(_bytes(sum(r.get('bytes') or 0 for r in reports)))}</td>"
            f"<td class='n'>{esc(_bytes(sum((r.get('budget') or {}).get('total') or 0 for r in reports)))}</td>"
            f"<td class='n'>{esc(_time(sum(r.get('time_s') or 0 for r in reports)))}</td></tr>"
        )
    out.append("</table>")
    if roofline:
        out.append("<h2 id='roofline'>roofline of the session's kernels</h2>")
        out.append(roofline if roofline.lstrip().startswith("<svg") else f"<p class='note'>{esc(roofline)}</p>")
    for i, (nodeid, _, reports) in enumerate(collected):
        out.append(f"<h2 id='t{i}'{' class=failed' if nodeid in failed else ''}>{esc(nodeid)}</h2>")
        out.append(f"<p>{_verdict(words[nodeid], 'span')}</p>")
        if (verdicts or {}).get(nodeid):
            out.append(f"<pre class='why'>{esc(verdicts[nodeid])}</pre>")
        for r in reports:
            out.append(_report_section(r))
    out.append("</body></html>")
    return "\n".join(out)


def _verdict(word: str, tag: str = "td") -> str:
    return f"<{tag} class='verdict {word}'>{word}</{tag}>"


def _bytes_bar(r: dict[str, Any]) -> str:
    """Modelled bytes against the budget: a bar scaled to the larger, the budget as a line."""
    modelled, budget = r.get("bytes"), (r.get("budget") or {}).get("total")
    if not modelled or not budget:
        return ""
    top = max(modelled, budget)
    over = " over" if modelled > budget else ""
    return (
        f"<div class='bar{over}' title='modelled {html.escape(_bytes(modelled))} against a budget of "
        f"{html.escape(_bytes(budget))} ({modelled / budget:.2f}x)'>"
        f"<div class='modelled' style='width:{100 * modelled / top:.1f}%'></div>"
        f"<div class='budget' style='width:{100 * budget / top:.1f}%'></div></div>"
        f"<p class='caption'>modelled bytes {modelled / budget:.2f}x the budget (the line)</p>"
    )


def _time_strip(r: dict[str, Any]) -> str:
    """The kernels in launch order, widths by time; on a GPU the wall time the device sat idle
    (launch gaps) as one hatched share at the end. Not a timeline: gaps are not placed."""
    kernels = [k for k in (r.get("kernels") or []) + (r.get("copies") or []) if k.get("time_s")]
    busy = sum(k["time_s"] for k in kernels)
    if not kernels or busy <= 0:
        return ""
    wall = r.get("wall_time_s") if r.get("device") == "cuda" else None
    gap = max(0.0, wall - busy) if wall else 0.0
    total = busy + gap
    cells = []
    for i, k in enumerate(kernels):
        colour = "#999" if k.get("kind") == "copy" else _HUES[i % len(_HUES)]
        title = f"{i}: {_short(str(k.get('name')))}, {_time(k['time_s'])}, {_bytes(k.get('bytes'))}"
        cells.append(f"<div style='flex:{k['time_s'] / total:.6f};background:{colour}' title='{html.escape(title)}'></div>")
    if gap > 0:
        cells.append(f"<div class='gap' style='flex:{gap / total:.6f}' title='{html.escape(f'launch gaps: {_time(gap)}')}'></div>")
    caption = "kernels in launch order, widths by time (hover for each)" + ("; hatched: launch gaps" if gap > 0 else "")
    return "<div class='strip'>" + "".join(cells) + f"</div><p class='caption'>{caption}</p>"


def _breaks(r: dict[str, Any]) -> list[str]:
    esc = html.escape
    lines = []
    for b in r.get("graph_breaks") or []:
        where = b.get("location") if isinstance(b, dict) else None
        reason = b.get("reason") if isinstance(b, dict) else str(b)
        lines.append(f"<p class='break'>graph break at {esc(str(where or '?'))}: {esc(str(reason))}</p>")
    for c in r.get("recompiles") or []:
        text = f"recompiled {c.get('function')} ({c.get('location')}): {c.get('reason')}" if isinstance(c, dict) else str(c)
        lines.append(f"<p class='break'>{esc(text)}</p>")
    for h in r.get("host_syncs") or []:
        text = f"host sync: {h.get('op')} at {h.get('source') or '?'}: {h.get('reason')}" if isinstance(h, dict) else str(h)
        lines.append(f"<p class='break'>{esc(text)}</p>")
    return lines


def _launch_lines(r: dict[str, Any]) -> list[str]:
    """The launch-bound verdict and the CUDA-graph replay figure (or why there is none)."""
    esc = html.escape
    lines = []
    wall = _timed(r)[1]
    if r.get("launch_bound"):
        share = (r.get("launch_overhead_s") or 0) / wall if wall else 0.0
        lines.append(f"<p class='note launch'>launch-bound: {share:.0%} of the wall time the GPU was idle</p>")
    if r.get("graph_time_s") is not None:
        text = format_graph_replay(r["graph_time_s"], wall, r.get("graph_recovered_share"))
        lines.append(f"<p class='note launch'>{esc(text)}</p>")
    elif r.get("graph_note"):
        lines.append(f"<p class='note launch'>no CUDA-graph replay: {esc(str(r['graph_note']))}</p>")
    return lines


def _timed(r: dict[str, Any]) -> tuple[Any, Any]:
    """``(time, wall time)`` the verdicts used: the medians when the call was timed
    (``FusionReport.timed``), else the profiled call's."""
    if r.get("median_time_s") is not None:
        return r["median_time_s"], r.get("median_wall_time_s")
    return r.get("time_s"), r.get("wall_time_s")


def _report_section(r: dict[str, Any]) -> str:
    esc = html.escape
    time_s, wall = _timed(r)
    parts = [
        f"<p class='summary'>[{esc(str(r.get('label')))}] on {esc(str(r.get('device_kind')))}: "
        f"{r.get('kernel_count')} kernels, {esc(_bytes(r.get('bytes')))} modelled"
        + (f" (<span class='unmodelled'>+{r['bytes_unmodelled']} unmodelled</span>)" if r.get("bytes_unmodelled") else "")
        + f", budget {esc(_bytes((r.get('budget') or {}).get('total')))}, time {esc(_time(time_s))}"
        + (" (median)" if r.get("median_time_s") is not None else "")
        + (f", wall {esc(_time(wall))}" if r.get("device") == "cuda" and wall else "")
        + (f", {r['efficiency']:.0%} of peak" if r.get("efficiency") else "")
        + "</p>",
        _bytes_bar(r),
        _time_strip(r),
        *_breaks(r),
    ]
    parts.extend(_launch_lines(r))
    for chain in r.get("headroom") or []:
        where = f"{chain['module']}: " if chain.get("module") else ""
        copies = f" ({chain['copies']} copies of this chain in the region)" if (chain.get("copies") or 1) > 1 else ""
        parts.append(
            f"<p class='note'>headroom: {esc(where)}kernels {esc(index_ranges(chain['kernels']))} "
            f"({esc(', '.join(dict.fromkeys(op.removeprefix('aten::') for op in chain['ops'])))}) move "
            f"{esc(_bytes(chain['bytes']))} for a fused budget of {esc(_bytes(chain['fused_bytes']))}: "
            f"fusing saves {esc(_bytes(chain['excess']))}{copies}</p>"
        )
    for note in (r.get("warnings") or []) + (r.get("verdict_notes") or []):
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
            f"<tr><td class='n'>{i}</td>{_cell(str(k.get('name')), 'name', _short(str(k.get('name'))))}"
            f"<td class='n'>{esc(_time(k.get('time_s')))}</td><td{cls}>{esc(_bytes(k.get('bytes')))}</td>"
            + (f"<td class='n'>{esc(_bytes(k.get('bytes_measured')))}</td>" if show_measured else "")
            + _cell(str(k.get("op") or "-"), "op") + _cell(str(k.get("module") or "-"))
            + _cell(str(k.get("source") or "-")) + "</tr>"
        )
    parts.append("</table>")
    return "\n".join(parts)


def _cell(text: str, kind: str = "", shown: str | None = None) -> str:
    """A table cell cut to its column's width with an ellipsis (CSS), the whole text on hover."""
    esc = html.escape
    return f"<td class='t{(' ' + kind) if kind else ''}' title='{esc(text)}'>{esc(text if shown is None else shown)}</td>"


def _short(name: str) -> str:
    from ..report import shorten_kernel_name

    return shorten_kernel_name(name, width=90)


def roofline_svg(collected: list[tuple[str, str, list[dict[str, Any]]]], settings: Any = None) -> str:
    """The session's roofline (docs/roofline.md) as inline SVG markup, or why there is none."""
    import tempfile

    from .plot import roofline_plot

    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "roofline.svg")
            shown, _ = roofline_plot(collected, path, settings)
            text = open(path, encoding="utf-8").read()
    except ImportError as exc:
        return f"no roofline ({exc}): pip install 'pytest-fusioncheck[plot]' (matplotlib)"
    if not shown:
        return "no roofline: no kernel has FLOPs, bytes and time"
    return text[text.index("<svg"):]


class HtmlSink:
    def __init__(self, path: str, settings: Any = None) -> None:
        self.path = path
        self.settings = settings  # for the roofline's ceilings (measured peak bandwidth)
        self.failed: set[str] = set()  # test ids the session summary marks red
        self.outcomes: dict[str, str] = {}  # other verdicts by test id: xfailed, xpassed, error
        self.verdicts: dict[str, str] = {}  # failing tests' failure text, as the terminal prints it

    def write(self, collected: list[tuple[str, str, list[dict[str, Any]]]]) -> list[str]:
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(render(collected, self.failed, self.outcomes, roofline_svg(collected, self.settings), self.verdicts))
        os.replace(tmp, self.path)
        return [f"fusioncheck: HTML report of {len(collected)} test(s) written to {self.path}"]
