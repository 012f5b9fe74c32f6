"""Report sink: the roofline of the session's kernels (``--fusion-roofline``, docs/roofline.md)."""

from __future__ import annotations

from typing import Any


class PlotSink:
    def __init__(self, path: str, settings: Any = None) -> None:
        self.path = path
        self.settings = settings  # the session's Settings: peak-bandwidth override, measured peaks, cache

    def write(self, collected: list[tuple[str, str, list[dict[str, Any]]]]) -> list[str]:
        from .plot import roofline_plot

        try:
            shown, left = roofline_plot(collected, self.path, self.settings)
        except ImportError as exc:
            return [f"fusioncheck: no roofline plot ({exc}); pip install 'pytest-fusioncheck[plot]' (matplotlib)"]
        missing = f"; {left.total} without FLOPs, bytes or time not shown" if left.total else ""
        return [f"fusioncheck: roofline of {shown} kernel(s) written to {self.path}{missing}"]
