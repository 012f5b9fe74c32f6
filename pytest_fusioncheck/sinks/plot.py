"""Roofline plot of a session's kernels (``--fusion-roofline=PATH``).

Each profiled report is one point: modelled bytes on the x axis, achieved bandwidth
(bytes / time) on the y axis, against the device's peak bandwidth as a horizontal roof.
A fused chain sits near the roof; an unfused one sits low and to the right (more bytes
for the same work). Needs matplotlib (optional dependency).
"""

from __future__ import annotations

from typing import Any


def roofline_plot(reports: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    peaks = set()
    for r in reports:
        t, b = r.get("time_s"), r.get("bytes")
        if not t or not b:
            continue
        ax.scatter([b], [b / t / 1e9], s=18)
        ax.annotate(str(r.get("label", ""))[-40:], (b, b / t / 1e9), fontsize=6)
        if r.get("peak_bandwidth"):
            peaks.add((r["device_kind"], r["peak_bandwidth"]))
    for kind, peak in sorted(peaks):
        ax.axhline(peak / 1e9, linestyle="--", linewidth=1)
        ax.annotate(f"peak {kind}: {peak / 1e9:.0f} GB/s", (1, peak / 1e9), xycoords=("axes fraction", "data"), ha="right", fontsize=7)
    ax.set_xscale("log")
    ax.set_xlabel("modelled HBM bytes per call")
    ax.set_ylabel("achieved GB/s (modelled bytes / time)")
    ax.set_title("fusioncheck roofline")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
