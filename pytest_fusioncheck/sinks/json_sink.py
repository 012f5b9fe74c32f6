"""Report sink: every fusion report of the session as one JSON file (``--fusion-json``)."""

from __future__ import annotations

import json
import os
from typing import Any


class JsonSink:
    def __init__(self, path: str) -> None:
        self.path = path

    def write(self, collected: list[tuple[str, str, list[dict[str, Any]]]]) -> list[str]:
        """Atomically write ``{test id: [report dict, ...]}``; return the summary line."""
        payload = {nodeid: reports for nodeid, _, reports in collected}
        tmp = self.path + ".tmp"
        with open(tmp, "w") as fh:
            json.dump(payload, fh, indent=2, sort_keys=True, default=str)
        os.replace(tmp, self.path)
        return [f"fusioncheck: wrote {len(payload)} test(s) of reports to {self.path}"]
