"""Hardware byte counters from Nsight Compute (``--fusion-counters=ncu``).

torch.profiler's CUPTI-metrics path gives no counters on CUDA 13, so measured bytes come
from ``ncu``. Before the tests run, the plugin re-runs the selected fusion tests once in a
child pytest under ``ncu`` (``--clock-control none``: the clocks are left alone), keeping
only kernels inside the plugin's NVTX ranges (``fusioncheck:<seq>:<label>``, one per
profiled call), and reads DRAM bytes read + written per kernel from its CSV, which names
each kernel's range. The child also writes its reports as JSON, each with its ``seq``: a
report gets the kernels of its own range, and the parent fills ``Kernel.bytes_measured``
when the same report (same test, same index) is built during the test, provided ncu saw
as many kernels in the range as the profiler did.

Writes still in L2 when a kernel ends are not counted by DRAM counters (and ncu flushes
caches before each kernel, so every read is cold): compare on tensors several times the
60 MB L2.
"""

from __future__ import annotations

import csv
import glob
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Any

from ..ranges import NVTX_PREFIX

METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum")
# No trailing "/": the plugin's ranges are start/end ranges (process-wide, so kernels that
# autograd's device thread launches in a backward pass are inside them); "/" selects
# push/pop ranges, which are per thread.
NVTX_FILTER = f"regex:^{NVTX_PREFIX}.*"
CHILD_ENV = "FUSIONCHECK_NCU_CHILD"
_UNIT_SCALE = {
    "": 1, "byte": 1, "bytes": 1, "b": 1,
    "kbyte": 10**3, "mbyte": 10**6, "gbyte": 10**9, "tbyte": 10**12,
    "kibyte": 2**10, "mibyte": 2**20, "gibyte": 2**30,
}


class CountersError(RuntimeError):
    """Counters were asked for but cannot be collected (no ncu, no GPU, ncu failed)."""


@dataclass
class NcuKernel:
    """One kernel row of ncu's raw CSV page, with the plugin range it ran in."""

    index: int
    name: str
    read_bytes: int
    write_bytes: int
    range: str = ""

    @property
    def bytes(self) -> int:
        return self.read_bytes + self.write_bytes

    @property
    def seq(self) -> int | None:
        """The report sequence number from a ``fusioncheck:<seq>:<label>`` range."""
        if not self.range.startswith(NVTX_PREFIX):
            return None
        head = self.range[len(NVTX_PREFIX):].split(":", 1)[0]
        return int(head) if head.isdigit() else None

    @property
    def label(self) -> str:
        parts = self.range[len(NVTX_PREFIX):].split(":", 1)
        return parts[1] if len(parts) == 2 else ""


def _number(text: str, unit: str) -> int:
    cleaned = text.replace(",", "").replace('"', "").strip()
    if cleaned in ("", "n/a", "N/A"):
        raise ValueError(f"no value ({text!r})")
    scale = _UNIT_SCALE.get(unit.strip().lower())
    if scale is None:
        raise ValueError(f"unknown unit {unit!r}")
    return int(round(float(cleaned) * scale))


def _push_pop_range(cell: str) -> str:
    """The innermost fusioncheck range in one of ncu's NVTX columns, else ''.

    A push/pop cell reads ``<tid>  "<default domain>:fusioncheck:3:label:none:none:none:none:none:none"``,
    a start/stop cell ``"<id>:<default domain>:fusioncheck:3:label:none:..."``: (id,) domain,
    range name, then six payload/colour/message fields, which are split off the right so a
    label may hold colons (test ids do). A range the ``nvtx`` package opened carries its name
    as a registered message, which holds colons too
    (``...:fusioncheck:1:label:none:none:RGB:0xff:REGISTERED:fusioncheck:1:label``): the fields
    are then split off the right of what precedes the message.
    """
    found = ""
    for chunk in cell.split('"'):
        chunk = chunk.strip()
        start = chunk.find(NVTX_PREFIX)
        if start < 0:
            continue
        message = chunk.find(":" + NVTX_PREFIX, start + 1)
        if message > 0:  # the name again, as the message: the five fields before it end the name
            head = chunk[:message].rsplit(":", 5)[0]
        else:
            head = chunk.rsplit(":", 6)[0] if chunk.count(":") >= 7 else chunk
        found = head[start:]
    return found


def parse_ncu_csv(text: str) -> list[NcuKernel]:
    """Kernel rows from ``ncu --nvtx --csv --page raw`` output (``==PROF==`` lines skipped).

    Handles the units row ncu prints under the header (empty or not), thousands
    separators, ``Kbyte``/``Mbyte`` units, and reads each kernel's NVTX range (the
    start/stop column, else the push/pop one).
    Raises ``CountersError`` when the metric columns are missing.
    """
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    if not lines:
        return []
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    header = rows[0]
    try:
        name_col = header.index("Kernel Name")
        read_col = header.index(METRICS[0])
        write_col = header.index(METRICS[1])
    except ValueError as exc:
        raise CountersError(f"ncu CSV lacks a needed column ({exc}); header starts: {header[:8]}") from None
    id_col = header.index("ID") if "ID" in header else None
    start_col = next((i for i, h in enumerate(header) if "Start/Stop_Range" in h), None)
    nvtx_col = next((i for i, h in enumerate(header) if "Push/Pop_Range" in h), None)
    body = rows[1:]
    units = ["" for _ in header]
    if body and (id_col is not None and not body[0][id_col].strip()):  # the units row
        units = body[0] + [""] * (len(header) - len(body[0]))
        body = body[1:]
    kernels = []
    for i, row in enumerate(body):
        if len(row) <= max(read_col, write_col):
            continue
        try:
            read = _number(row[read_col], units[read_col])
            write = _number(row[write_col], units[write_col])
        except ValueError as exc:
            raise CountersError(f"ncu CSV row {i + 1} ({row[name_col][:60]!r}): {exc}") from None
        index = int(row[id_col]) if id_col is not None and row[id_col].strip().isdigit() else i
        rng = _push_pop_range(row[start_col]) if start_col is not None else ""
        if not rng and nvtx_col is not None:  # a push/pop range (files recorded before start/end ranges)
            rng = _push_pop_range(row[nvtx_col])
        kernels.append(NcuKernel(index, row[name_col], read, write, rng))
    return kernels


def find_ncu() -> str:
    """Path of the ``ncu`` executable, or a ``CountersError`` saying where it was looked for."""
    candidates = [os.environ.get("FUSIONCHECK_NCU"), shutil.which("ncu")]
    candidates += sorted(
        (os.path.join(root, "ncu") for root in glob.glob("/opt/nvidia/nsight-compute/*")), reverse=True
    )
    candidates += ["/usr/local/cuda/bin/ncu"]
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    raise CountersError(
        "--fusion-counters=ncu needs Nsight Compute's `ncu`: not on PATH, not in /opt/nvidia/nsight-compute "
        "or /usr/local/cuda/bin (set FUSIONCHECK_NCU=/path/to/ncu)"
    )


def ncu_command(ncu: str, log_file: str, child_argv: list[str]) -> list[str]:
    return [
        ncu,
        "--clock-control", "none",
        "--target-processes", "all",
        "--nvtx", "--nvtx-include", NVTX_FILTER,
        "--metrics", ",".join(METRICS),
        "--csv", "--page", "raw",
        "--log-file", log_file,
        *child_argv,
    ]


@dataclass
class Measured:
    """Measured bytes per kernel, by test id, then by report index within the test."""

    by_test: dict[str, list[list[int] | None]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def kernel_bytes(self, test_id: str, report_index: int) -> list[int] | None:
        reports = self.by_test.get(test_id)
        if reports is None or report_index >= len(reports):
            return None
        return reports[report_index]


def group_by_seq(kernels: list[NcuKernel]) -> dict[int, list[NcuKernel]]:
    groups: dict[int, list[NcuKernel]] = {}
    for k in kernels:
        if k.seq is not None:
            groups.setdefault(k.seq, []).append(k)
    return groups


def match(kernels: list[NcuKernel], child_reports: dict[str, list[dict[str, Any]]]) -> Measured:
    """Give each of the child's reports the ncu kernels of its NVTX range (by ``seq``).

    Under ncu, CUPTI belongs to ncu and the child's profiler sees no device kernels, so
    the kernel-for-kernel check happens in the parent: ``api._fill_measured`` compares
    ncu's count for the range with the profiler's count of the same report.
    """
    groups = group_by_seq(kernels)
    out = Measured()
    used: set[int] = set()
    for test_id, reports in child_reports.items():
        values: list[list[int] | None] = []
        for rep in reports:
            seq = rep.get("seq")
            chunk = groups.get(seq, []) if seq is not None else []
            used.add(seq)
            values.append([k.bytes for k in chunk])
        out.by_test[test_id] = values
    orphans = sorted(set(groups) - used)
    if orphans:
        out.problems.append(f"ncu saw kernels in {len(orphans)} range(s) no report claims: seq {orphans[:10]}")
    return out


def collect(nodeids: list[str], rootdir: str, extra_args: list[str] | None = None, timeout: float = 3600) -> Measured:
    """Run ``nodeids`` once under ncu in a child pytest and return the measured bytes."""
    import torch

    if not torch.cuda.is_available():
        raise CountersError("--fusion-counters=ncu needs a CUDA GPU; torch.cuda.is_available() is False")
    ncu = find_ncu()
    with tempfile.TemporaryDirectory(prefix="fusioncheck-ncu-") as tmp:
        log_file = os.path.join(tmp, "ncu.csv")
        json_file = os.path.join(tmp, "reports.json")
        child = [
            sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
            "--fusion-counters=none", f"--fusion-json={json_file}", "--fusion-device=cuda",
            *(extra_args or []), *nodeids,
        ]
        env = dict(os.environ, **{CHILD_ENV: "1"})
        proc = subprocess.run(ncu_command(ncu, log_file, child), cwd=rootdir, env=env, capture_output=True, text=True, timeout=timeout)
        if not os.path.exists(log_file) or not os.path.exists(json_file):
            raise CountersError(
                f"ncu run failed (exit {proc.returncode}); its output ends:\n{(proc.stdout + proc.stderr)[-3000:]}"
            )
        with open(log_file) as fh:
            kernels = parse_ncu_csv(fh.read())
        with open(json_file) as fh:
            child_reports = json.load(fh)
    return match(kernels, child_reports)


def fill_measured(report: Any, measured: Measured, test_id: str, index: int) -> None:
    """Give each kernel of ``report`` (the ``index``-th of ``test_id``) its ncu bytes,
    provided ncu saw as many kernels in the report's range as the profiler did; else
    leave them empty and say so on the report."""
    values = measured.kernel_bytes(test_id, index)
    if values is None or len(values) != report.kernel_count:
        seen = "no kernels" if values is None else f"{len(values)} kernels"
        report.warnings.append(
            f"counters: ncu measured {seen} for this report, the profiler counted {report.kernel_count}; "
            "measured bytes left empty"
        )
        return
    for kernel, value in zip(report.kernels, values):
        kernel.bytes_measured = value


class NcuBytes:
    """``ByteSource`` with ``--fusion-counters=ncu``: measured bytes from the ncu pre-run."""

    def __init__(self, measured: Measured) -> None:
        self.measured = measured

    def fill(self, report: Any, test_id: str, index: int) -> None:
        fill_measured(report, self.measured, test_id, index)


def collect_for_session(config: Any, nodeids: list[str], settings: Any) -> list[str]:
    """Before the tests run: measure ``nodeids`` under ncu once (a child pytest) and keep
    the figures in ``settings.measured``; the summary lines. Not in the ncu child itself."""
    import pytest

    if os.environ.get(CHILD_ENV) or not nodeids:
        return []
    extra = [f"--fusion-warmup={settings.warmup}"]
    if not config.pluginmanager.has_plugin("fusioncheck"):  # loaded with -p, not by entry point
        extra = ["-p", "pytest_fusioncheck.plugin", *extra]
    try:
        measured = collect(nodeids, str(config.rootpath), extra)
    except CountersError as exc:
        raise pytest.UsageError(f"--fusion-counters=ncu: {exc}") from None
    settings.measured = measured
    lines = [f"fusioncheck: ncu measured {sum(len(k) for r in measured.by_test.values() for k in r if k)} kernels in {len(measured.by_test)} test(s)"]
    return lines + [f"fusioncheck: counters: {p}" for p in measured.problems]

