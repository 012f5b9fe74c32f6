"""Report sink: the committed baseline (``--fusion-baseline``, ``--fusion-update-baseline``).

Compares each test's kernel count and bytes with its entry (keyed by test id and device
kind; more kernels or bytes fail the test, fewer are reported as improvements), or queues
the test's record for the rewrite. Under pytest-xdist each worker hands its records to
the controller, which alone writes the file. The file logic itself is ``baseline.py``.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from .. import baseline
from ..verdict import FusionAssertionError


def test_breaks(reports: list[Any], graph_breaks: list[Any] = ()) -> list[Any]:
    """The test's graph breaks: those its reports saw and those of the whole test call, once each."""
    breaks = list(graph_breaks)
    for r in reports:
        breaks += [b for b in r.graph_breaks if b not in breaks]
    return breaks


def running_versions() -> dict[str, str]:
    """torch, Triton and CUDA versions of this run (those importable), for a record."""
    import sys

    out: dict[str, str] = {}
    torch = sys.modules.get("torch")
    if torch is not None:
        out["torch"] = str(torch.__version__)
        cuda = getattr(getattr(torch, "version", None), "cuda", None)
        if cuda:
            out["cuda"] = str(cuda)
    triton = sys.modules.get("triton")
    if triton is not None and getattr(triton, "__version__", None):
        out["triton"] = str(triton.__version__)
    return out


class BaselineSink:
    def __init__(self, path: str, rootpath: str, update: bool, strict: bool = False) -> None:
        self.path = path if os.path.isabs(path) else os.path.join(rootpath, path)
        self.update = update
        self.strict = strict
        if not update and not os.path.exists(self.path):
            raise pytest.UsageError(
                f"--fusion-baseline: {self.path} does not exist; check the path, or create the file "
                "with --fusion-update-baseline"
            )
        try:
            self.entries = baseline.load_baseline(self.path)
        except baseline.BaselineError as exc:
            raise pytest.UsageError(str(exc)) from None
        self.writer = baseline.BaselineWriter(self.path) if update else None
        self.improvements: list[str] = []
        self.missing: list[str] = []  # test ids with no entry for their device kind
        self.changes: list[str] = []  # same count and bytes, different kernels
        self.checked = 0  # tests compared with an entry
        self.regressed = 0

    @staticmethod
    def record_for(nodeid: str, reports: list[Any], graph_breaks: list[Any] = ()) -> dict[str, Any]:
        names = [k.name for r in reports for k in r.kernels]
        modules = baseline.module_counts(k.module for r in reports for k in r.kernels)
        return baseline.make_record(
            nodeid,
            reports[0].device_kind,
            names,
            bytes=sum(r.bytes for r in reports),
            kernel_count=sum(r.kernel_count for r in reports),
            graph_breaks=len(test_breaks(reports, graph_breaks)),
            recompiles=sum(len(r.recompiles) for r in reports),
            versions=running_versions(),
            **({"modules": modules} if modules else {}),  # models: kernels per module, so a failure names where they grew
        )

    def compare(self, item: pytest.Item, reports: list[Any], graph_breaks: list[Any] = ()) -> Any:
        """The test's comparison with its entry (``None`` while updating). A report whose count misses kernels
        (``FusionReport.counts_complete``: a CPU graph compiled before the hooks) is neither recorded nor compared:
        its lower count would read as an improvement, or go into the file."""
        __tracebackhide__ = True
        incomplete = [r for r in reports if not r.counts_complete]
        if incomplete:
            raise FusionAssertionError(
                f"fusion baseline: cannot record or compare {item.nodeid}: {incomplete[0].unseen_note()}\n(baseline "
                f"{self.path})")
        record = self.record_for(item.nodeid, reports, graph_breaks)
        if self.writer is not None:
            self.writer.add(record)
            return None
        comparison = baseline.compare(self.entries.get(item.nodeid, record["device_kind"]), record)
        if not comparison.new:
            self.checked += 1
            self.regressed += bool(comparison.regressed)
        if comparison.new:
            self.missing.append(f"{item.nodeid} ({record['device_kind']})")
        elif comparison.improved:  # only figures that went down
            self.improvements.append(f"{item.nodeid}: {comparison.describe()}")
        elif comparison.changed and not comparison.regressed:  # same figures, other kernels
            self.changes.append(f"{item.nodeid}: {comparison.describe()}")
        return comparison

    def check(self, comparison: Any, reports: list[Any], graph_breaks: list[Any] = ()) -> None:
        """Fail a regression, leading with its cause: the test's graph breaks and recompiles
        (reason, ``file:line``), then the kernel diff by module, then the kernel tables."""
        __tracebackhide__ = True
        if comparison is not None and comparison.new and self.strict:
            raise FusionAssertionError(
                f"{comparison.describe()}\n(--fusion-baseline-strict: every test needs an entry in {self.path})"
            )
        if comparison is not None and comparison.regressed:
            cause = []
            breaks = test_breaks(reports, graph_breaks)
            if breaks:
                from ..graph_breaks import format_graph_breaks

                cause.append(format_graph_breaks(breaks))
            cause += [str(rc) for r in reports for rc in r.recompiles]
            tables = "\n".join(str(r) for r in reports)
            raise FusionAssertionError(
                "\n".join(cause + [comparison.describe(), tables])
                + f"\n(baseline {self.path})"
            )

    def worker_output(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "fusioncheck_improvements": list(self.improvements),
            "fusioncheck_missing": list(self.missing),
            "fusioncheck_changes": list(self.changes),
            "fusioncheck_checked": [self.checked, self.regressed],
        }
        if self.writer is not None:
            out["fusioncheck_baseline"] = self.writer.worker_payload()
        return out

    def add_worker_output(self, worker_id: str, output: dict[str, Any]) -> None:
        payload = output.get("fusioncheck_baseline")
        if payload and self.writer is not None:
            self.writer.add_worker_payload(worker_id, payload)
        self.improvements += output.get("fusioncheck_improvements", [])
        self.missing += output.get("fusioncheck_missing", [])
        self.changes += output.get("fusioncheck_changes", [])
        checked, regressed = output.get("fusioncheck_checked", [0, 0])
        self.checked += checked
        self.regressed += regressed

    def flush(self) -> list[str]:
        """Write the queued records (updating only): the summary line."""
        if self.writer is None:
            return []
        return [self.writer.flush().describe()]  # "fusioncheck baseline wrote ...": one prefix

    def improvement_lines(self) -> list[str]:
        lines = []
        if self.writer is None:
            lines.append(
                f"fusioncheck baseline: {self.checked} test(s) checked against {self.path}: {self.regressed} regressed, "
                f"{len(self.improvements)} improved, {len(self.missing)} without an entry"
            )
        if self.missing:
            lines.append(
                f"fusioncheck baseline: {len(self.missing)} test(s) not in the baseline "
                "(--fusion-update-baseline records them; --fusion-baseline-strict fails them):"
            )
            lines += [f"  {nodeid}" for nodeid in sorted(self.missing)]
        if self.improvements:
            lines.append("fusioncheck baseline improvements (update the baseline to pin them):")
            lines += ["  " + line.replace("\n", "\n  ") for line in self.improvements]
        if self.changes:
            lines.append("fusioncheck baseline: other kernels, same count and bytes:")
            lines += ["  " + line.replace("\n", "\n  ") for line in self.changes]
        return lines
