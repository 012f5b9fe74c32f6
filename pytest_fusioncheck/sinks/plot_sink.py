"""Report sink: the roofline plot of the session (``--fusion-roofline``)."""

from __future__ import annotations

from typing import Any


class PlotSink:
    def __init__(self, path: str) -> None:
        self.path = path

    def write(self, collected: list[tuple[str, str, list[dict[str, Any]]]]) -> list[str]:
        from .plot import roofline_plot

        try:
            roofline_plot([r for _, _, reports in collected for r in reports], self.path)
        except ImportError as exc:
            return [f"fusioncheck: no roofline plot ({exc}); pip install 'pytest-fusioncheck[plot]' (matplotlib)"]
        return [f"fusioncheck: roofline plot written to {self.path}"]
