"""The session's roofline (``--fusion-roofline=PATH``, PNG or SVG by the extension).

One point per kernel whose FLOPs, bytes and time are known: x = arithmetic intensity
(FLOP per HBM byte: measured bytes where counters ran, else modelled), y = achieved
FLOP/s (FLOPs over the kernel's time), colour by test, size by time; filled where the
FLOPs are exact (matmul-class ops, declared Triton FLOPs), hollow where they are the
one-per-element estimate. Ceilings: the bandwidth slope (``bandwidth_slope``: the peak
the reports were measured against, else ``roofline.known_peak_bandwidth``; the legend says
which) and the peak FLOP/s of each dtype the points compute in (``roofline.peak_flops``), their
ridge points marked. The top kernels by time are numbered and listed under the plot; a
footnote counts the kernels left out and why (docs/roofline.md). Needs matplotlib.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..budget import format_bytes
from ..report import format_time, shorten_kernel_name

MAX_LABELS = 8
MAX_DTYPES = 3
MAX_LEGEND_TESTS = 10


@dataclass
class Point:
    test: str
    kernel: str
    op: str
    module: str | None
    flops: int
    bytes: int
    time_s: float
    estimated: bool
    dtype: str | None
    device_kind: str

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes

    @property
    def flops_per_s(self) -> float:
        return self.flops / self.time_s


@dataclass
class Left:
    """Kernels not on the plot, by reason."""

    no_flops: int = 0  # FLOPs unknown (generated kernels, integer work)
    zero_flops: int = 0  # 0 FLOP: data movement, a GEMM's extra kernels
    no_bytes_or_time: int = 0  # FLOPs known, but no bytes or no time

    @property
    def total(self) -> int:
        return self.no_flops + self.zero_flops + self.no_bytes_or_time

    def lines(self) -> list[str]:
        out = []
        if self.no_flops:
            out.append(
                f"{self.no_flops} kernel{'s' if self.no_flops != 1 else ''} without FLOP counts not shown "
                "(Inductor-generated kernels, Triton kernels declaring no FLOPs, integer work)"
            )
        if self.zero_flops:
            out.append(f"{self.zero_flops} kernel{'s' if self.zero_flops != 1 else ''} with 0 FLOP not shown (copies, data movement)")
        if self.no_bytes_or_time:
            n = self.no_bytes_or_time
            out.append(f"{n} kernel{'s' if n != 1 else ''} with FLOPs but no modelled bytes or time not shown")
        return out


def kernel_points(collected: list[tuple[str, str, list[dict[str, Any]]]]) -> tuple[list[Point], Left]:
    """The plottable kernels of ``[(test id, text, [report dict, ...])]`` and the count of
    those left out. Copies are not kernels and are not counted."""
    points: list[Point] = []
    left = Left()
    for nodeid, _, reports in collected:
        for r in reports:
            for k in r.get("kernels") or []:
                flops = k.get("flops")
                nbytes = k.get("bytes_measured") if k.get("bytes_measured") is not None else k.get("bytes")
                seconds = k.get("time_s")
                if flops is None:
                    left.no_flops += 1
                elif flops <= 0:
                    left.zero_flops += 1
                elif not nbytes or not seconds or seconds <= 0:
                    left.no_bytes_or_time += 1
                else:
                    points.append(
                        Point(
                            test=nodeid,
                            kernel=str(k.get("name") or ""),
                            op=str(k.get("op") or ""),
                            module=k.get("module"),
                            flops=int(flops),
                            bytes=int(nbytes),
                            time_s=float(seconds),
                            estimated=bool(k.get("flops_estimated")),
                            dtype=k.get("dtype"),
                            device_kind=_device_kind(r),
                        )
                    )
    return points, left


@dataclass
class Ceilings:
    device_kind: str
    bandwidth: tuple[float, str] | None
    compute: dict[str, tuple[float, str]]  # dtype -> (FLOP/s, where from)
    missing: list[str]  # dtypes without a known peak

    def ridge(self, dtype: str) -> float | None:
        if self.bandwidth is None or dtype not in self.compute:
            return None
        return self.compute[dtype][0] / self.bandwidth[0]


def _device_kind(report: dict[str, Any]) -> str:
    return str(report.get("device_kind") or report.get("device") or "cpu")


def bandwidth_slope(collected: list[tuple[str, str, list[dict[str, Any]]]], device_kind: str, settings: Any = None) -> tuple[float, str] | None:
    """``(bytes/s, where from)`` of ``device_kind``'s slope: the peak its reports' verdicts
    were measured against (their ``peak_bandwidth``; the largest where they differ), else
    what ``roofline.known_peak_bandwidth`` knows: the override, the cache, a datasheet
    default (docs/roofline.md, "The ceilings")."""
    from ..roofline import known_peak_bandwidth

    measured = [float(r["peak_bandwidth"]) for _, _, reports in collected for r in reports
                if r.get("peak_bandwidth") and _device_kind(r) == device_kind]
    return known_peak_bandwidth(device_kind, settings, max(measured, default=None))


def slope_label(bandwidth: tuple[float, str]) -> str:
    """The legend's words for the slope: which figure it is ("measured peak 4.25 TB/s",
    "datasheet 4.8 TB/s (no measured peak)")."""
    value, where = bandwidth
    figure = _si(value, "B/s")
    if where.startswith("measured"):
        return f"measured peak {figure}{where.removeprefix('measured')}"  # "(cached)" from an earlier session
    if where.endswith("not measured"):  # "datasheet default, ...", "nominal default, ..." (CPU)
        return f"{where.split()[0]} {figure} (no measured peak)"
    return f"peak {figure} ({where})"


def ceilings(device_kind: str, dtypes: list[str], settings: Any = None, bandwidth: tuple[float, str] | None = None) -> Ceilings:
    """The bandwidth slope (``bandwidth_slope``) and the compute ceilings of ``dtypes`` on ``device_kind``."""
    from ..roofline import peak_flops

    compute, missing = {}, []
    for dtype in dtypes:
        peak = peak_flops(device_kind, dtype)
        if peak is None:
            missing.append(dtype)
        else:
            compute[dtype] = peak
    return Ceilings(device_kind, bandwidth, compute, missing)


def _si(value: float, unit: str) -> str:
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= factor:
            return f"{value / factor:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def _short_test(nodeid: str, width: int = 48) -> str:
    short = nodeid.split("::", 1)[1] if "::" in nodeid else nodeid
    return short if len(short) <= width else "…" + short[-(width - 1) :]


def _roof(c: Ceilings, dtype: str, intensity: float) -> float | None:
    """The attainable FLOP/s at ``intensity`` under ``dtype``'s roof (either part may be missing)."""
    caps = []
    if c.bandwidth is not None:
        caps.append(c.bandwidth[0] * intensity)
    if dtype in c.compute:
        caps.append(c.compute[dtype][0])
    return min(caps) if caps else None


def _marker_size(seconds: float, t_max: float) -> float:
    """Scatter size (points squared: the marker's diameter squared) by time: area ~ sqrt(time)."""
    return 14 + 300 * math.sqrt(seconds / t_max)


def _label_offsets(ax: Any, fig: Any, labelled: list[Point], points: list[Point], t_max: float, texts: list[Any]) -> list[tuple[float, float]]:
    """Offsets (points) for the numbered labels of ``labelled``: each takes the first of
    rings of candidate places, nearest first, whose box overlaps no label placed before
    it, none of ``texts`` (the ceilings' labels), no marker of ``points``, and stays inside
    the axes (a leader line joins it to its point). Greedy, in display space; a crowded
    label takes the nearest place clear of other labels."""
    to_pt = 72.0 / fig.dpi
    ax_box = ax.get_window_extent()
    renderer = fig.canvas.get_renderer()
    blocked = [t.get_window_extent(renderer) for t in texts]

    def disc(p: Point) -> tuple[float, float, float]:
        x, y = ax.transData.transform((p.intensity, p.flops_per_s))
        return x, y, math.sqrt(_marker_size(p.time_s, t_max)) / 2 / to_pt  # centre, radius (px)

    markers = [disc(p) for p in points]
    half = 6 / to_pt  # a label's half width, px (one digit at 8 pt, with its box)
    taken: list[tuple[float, float]] = []
    out = []
    for p in labelled:
        x, y, r = disc(p)
        best = fallback = None
        for distance in (10, 18, 28, 40, 55, 75):
            for angle in range(45, 405, 30):
                lx = x + math.cos(math.radians(angle)) * (distance / to_pt + r)
                ly = y + math.sin(math.radians(angle)) * (distance / to_pt + r)
                inside = ax_box.x0 + half < lx < ax_box.x1 - half and ax_box.y0 + half < ly < ax_box.y1 - half
                free = inside and all(abs(lx - tx) > 2 * half or abs(ly - ty) > 2 * half for tx, ty in taken)
                free = free and not any(
                    b.x0 - half < lx < b.x1 + half and b.y0 - half < ly < b.y1 + half for b in blocked
                )
                if free and fallback is None:
                    fallback = (lx, ly)
                if free and all(math.hypot(lx - cx, ly - cy) > cr + half for cx, cy, cr in markers):
                    best = (lx, ly)
                    break
            if best is not None:
                break
        best = best or fallback or (x + 14 / to_pt + r, y + 14 / to_pt + r)
        taken.append(best)
        out.append(((best[0] - x) * to_pt, (best[1] - y) * to_pt))
    return out


def roofline_plot(collected: list[tuple[str, str, list[dict[str, Any]]]], path: str, settings: Any = None) -> tuple[int, Left]:
    """Draw the roofline of the session's kernels to ``path`` (PNG or SVG by extension);
    returns ``(kernels plotted, kernels left out)``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.ticker import EngFormatter

    points, left = kernel_points(collected)
    devices = sorted({p.device_kind for p in points}) or sorted(
        {_device_kind(r) for _, _, reports in collected for r in reports}
    ) or ["cpu"]
    roofs: list[Ceilings] = []
    for device in devices:
        mine = [p for p in points if p.device_kind == device]
        by_time: dict[str, float] = {}
        for p in mine:
            by_time[p.dtype or "float32"] = by_time.get(p.dtype or "float32", 0.0) + p.time_s
        dtypes = sorted(by_time, key=lambda d: -by_time[d])[:MAX_DTYPES] or ["float32"]
        roofs.append(ceilings(device, dtypes, settings, bandwidth_slope(collected, device, settings)))

    # Axis ranges: every point, every ridge, a decade of margin.
    xs = [p.intensity for p in points]
    ys = [p.flops_per_s for p in points]
    ridges = [r for c in roofs for d in c.compute if (r := c.ridge(d)) is not None]
    peaks = [v for c in roofs for v, _ in c.compute.values()]
    x_lo = min(xs + ridges + [1.0]) / 4
    x_hi = max(xs + ridges + [10.0]) * 4
    y_hi = max(ys + peaks + [1e9]) * 3
    y_lo = min(ys) / 4 if ys else y_hi / 1e5

    ranked = sorted(points, key=lambda p: -p.time_s)
    labelled = ranked[:MAX_LABELS]
    key_lines = []
    for i, p in enumerate(labelled, 1):
        where = f" ({p.module})" if p.module else ""
        c = next(c for c in roofs if c.device_kind == p.device_kind)
        roof = _roof(c, p.dtype or "float32", p.intensity)
        share = ""
        if roof:
            fraction = p.flops_per_s / roof
            share = f", {fraction:.0%} of roof" if fraction >= 0.1 else f", {fraction:.1%} of roof" if fraction >= 0.001 else ", <0.1% of roof"
        est = " (est.)" if p.estimated else ""
        key_lines.append(
            f"{i}. {_short_test(p.test, 40)}: {shorten_kernel_name(p.kernel, 40)}{where}  "
            f"{format_time(p.time_s)}, {_si(p.flops, 'FLOP')}{est}, {format_bytes(p.bytes)}, "
            f"{p.intensity:.3g} FLOP/B, {_si(p.flops_per_s, 'FLOP/s')}{share}"
        )
    ceiling_lines = []
    for c in roofs:
        head = f"{c.device_kind}: " if len(roofs) > 1 else ""
        bw = f"bandwidth {_si(c.bandwidth[0], 'B/s')} ({c.bandwidth[1]})" if c.bandwidth else "bandwidth unknown (pass --fusion-peak-bandwidth)"
        comp = "; ".join(f"{d} {_si(v, 'FLOP/s')} ({src})" for d, (v, src) in c.compute.items())
        miss = f"; no peak FLOP/s known for {', '.join(c.missing)} on this device" if c.missing else ""
        ceiling_lines.append(f"ceilings: {head}{bw}; {comp or 'no compute ceiling known'}{miss}")
    foot = left.lines() or ["every kernel of the session is shown"]
    text_lines = key_lines + [""] * bool(key_lines) + ceiling_lines + foot

    line_h = 0.19  # inches per text line under the plot
    text_h = 0.35 + line_h * len(text_lines)
    fig = plt.figure(figsize=(10, 5.4 + text_h))
    plot_frac = 5.4 / (5.4 + text_h)
    ax = fig.add_axes((0.09, 1 - plot_frac + 0.55 / (5.4 + text_h), 0.62, plot_frac - 0.85 / (5.4 + text_h)))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(x_lo, x_hi)
    ax.set_ylim(y_lo, y_hi)
    ax.yaxis.set_major_formatter(EngFormatter(unit="FLOP/s", sep=" "))
    ax.grid(True, which="major", linewidth=0.4, alpha=0.5)

    styles = ["-", "--", ":"]
    ceiling_texts: list[Any] = []
    for ci, c in enumerate(roofs):
        style = styles[ci % len(styles)]
        tag = f" {c.device_kind}" if len(roofs) > 1 else ""
        top_ridge = max([r for d in c.compute if (r := c.ridge(d)) is not None] or [x_hi])
        if c.bandwidth is not None:
            bw = c.bandwidth[0]
            (line,) = ax.plot([x_lo, top_ridge], [bw * x_lo, bw * top_ridge], color="black", linewidth=1.4, linestyle=style)
            line.set_gid(f"ceiling-bandwidth{ci}")
            # The slope's label runs along the line, just above it, where it is in view.
            x_t = min(max(x_lo * 1.6, y_lo * 1.6 / bw), top_ridge / 6)
            (x0, y0), (x1, y1) = ax.transData.transform([(x_t, bw * x_t), (x_t * 2, bw * x_t * 2)])
            ceiling_texts.append(ax.annotate(
                f"{_si(bw, 'B/s')}{tag}",
                (x_t, bw * x_t),
                xytext=(0, 4),
                textcoords="offset points",
                fontsize=8,
                rotation=math.degrees(math.atan2(y1 - y0, x1 - x0)),
                rotation_mode="anchor",
                ha="left",
                va="bottom",
                gid=f"label-bandwidth{ci}",
            ))
        groups: dict[float, list[str]] = {}  # dtypes sharing a peak share one line
        for dtype, (peak, _) in c.compute.items():
            groups.setdefault(peak, []).append(dtype)
        for peak, dtypes in sorted(groups.items(), key=lambda kv: -kv[0]):
            name = "/".join(dtypes)
            ridge = c.ridge(dtypes[0])
            start = ridge if ridge is not None else x_lo
            (line,) = ax.plot([start, x_hi], [peak, peak], color="dimgray", linewidth=1.2, linestyle=style)
            line.set_gid(f"ceiling-compute-{'-'.join(dtypes)}{ci}")
            ridge_text = f", ridge {ridge:.3g} FLOP/B" if ridge is not None else ""
            ceiling_texts.append(ax.annotate(
                f"{name} peak {_si(peak, 'FLOP/s')}{ridge_text}{tag}",
                (1.0, peak),
                xycoords=("axes fraction", "data"),
                xytext=(-4, 3),
                textcoords="offset points",
                fontsize=7.5,
                ha="right",
                va="bottom",
                bbox={"boxstyle": "round,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.75},
                zorder=7,
                gid=f"label-compute-{'-'.join(dtypes)}{ci}",
            ))
            if ridge is not None:
                mark = ax.scatter([ridge], [peak], marker="D", s=28, color="black", zorder=6)
                mark.set_gid(f"ridge-{'-'.join(dtypes)}{ci}")

    tests = list(dict.fromkeys(p.test for p in ranked))
    cmap = plt.get_cmap("tab10" if len(tests) <= 10 else "tab20")
    colour = {t: cmap(i % cmap.N) for i, t in enumerate(tests)}
    t_max = max((p.time_s for p in points), default=1.0)
    for i, p in enumerate(ranked):
        size = _marker_size(p.time_s, t_max)
        face = "none" if p.estimated else colour[p.test]
        sc = ax.scatter([p.intensity], [p.flops_per_s], s=size, facecolors=face, edgecolors=colour[p.test], linewidths=1.2, alpha=0.85, zorder=5)
        sc.set_gid(f"kernel-{i}")
    offsets = _label_offsets(ax, fig, labelled, ranked, t_max, ceiling_texts)
    for i, (p, offset) in enumerate(zip(labelled, offsets), 1):
        ax.annotate(
            str(i),
            (p.intensity, p.flops_per_s),
            xytext=offset,
            textcoords="offset points",
            fontsize=8,
            fontweight="bold",
            ha="center",
            va="center",
            bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.85},
            arrowprops={"arrowstyle": "-", "color": "gray", "linewidth": 0.6, "shrinkA": 0, "shrinkB": 2},
            zorder=8,
            gid=f"label-kernel-{i}",
        )
    if not points:
        ax.text(0.5, 0.5, "no kernel with a FLOP count, bytes and time", transform=ax.transAxes, ha="center", fontsize=10)

    bytes_kind = "measured" if any(
        k.get("bytes_measured") is not None for _, _, reports in collected for r in reports for k in r.get("kernels") or []
    ) else "modelled"
    ax.set_xlabel(f"arithmetic intensity (FLOP per {bytes_kind} HBM byte)")
    ax.set_ylabel("achieved FLOP/s (FLOPs / kernel time)")
    shown = f"{len(points)} kernel{'s' if len(points) != 1 else ''} of {len(tests)} test{'s' if len(tests) != 1 else ''}"
    ax.set_title(f"fusioncheck roofline: {', '.join(devices)}, {shown}", fontsize=10)

    handles = [
        Line2D([], [], marker="o", linestyle="", color=colour[t], markersize=6, label=_short_test(t))
        for t in tests[:MAX_LEGEND_TESTS]
    ]
    if len(tests) > MAX_LEGEND_TESTS:
        handles.append(Line2D([], [], linestyle="", label=f"... {len(tests) - MAX_LEGEND_TESTS} more tests"))
    handles += [  # the slope says which bandwidth it is: measured, or a datasheet's
        Line2D([], [], color="black", linewidth=1.4, linestyle=styles[ci % len(styles)],
               label=(f"{c.device_kind}: " if len(roofs) > 1 else "") + slope_label(c.bandwidth))
        for ci, c in enumerate(roofs) if c.bandwidth is not None
    ]
    handles += [
        Line2D([], [], marker="o", linestyle="", color="gray", markersize=6, label="exact FLOPs"),
        Line2D([], [], marker="o", linestyle="", markerfacecolor="none", markeredgecolor="gray", markersize=6, label="estimated (1 FLOP/element)"),
        Line2D([], [], marker="D", linestyle="", color="black", markersize=5, label="ridge point"),
    ]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=7, frameon=False, title="colour: test, size: time", title_fontsize=7)

    top = (text_h - 0.15) / (5.4 + text_h)
    for i, line in enumerate(text_lines):
        fig.text(0.02, top - i * line_h / (5.4 + text_h), line, fontsize=7.5, family="monospace", va="top", gid=f"note-{i}")

    with matplotlib.rc_context({"svg.fonttype": "none"}):
        fig.savefig(path, dpi=130, bbox_inches="tight", pad_inches=0.15)
    plt.close(fig)
    return len(points), left
