"""``FusionReport`` and ``Kernel``: what one profiled region did, and how it is shown.

The kernel table is the heart of every failure message: index, kernel name (shortened),
device time, modelled bytes (and measured bytes when counters are on), the ATen op or
generated kernel's origin, and the user ``file:line`` that launched it. A report of more
than ``LONG_REPORT`` kernels reads at the size of a screen: the per-module summary, then
the ``TOP_KERNELS`` kernels by time, and a line saying where every row is (``table()``,
``text(full=True)``, the JSON and the HTML report).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

from .budget import Budget, format_bytes

# More kernels than this: the text of a report (str(), failure messages, --fusion-report)
# shows the per-module summary and the TOP_KERNELS kernels by time, not every row.
LONG_REPORT = 30
TOP_KERNELS = 10


def device_kind(device_type: str, device_name: str | None = None) -> str:
    """The key of a device in baselines and reports: ``"cpu"``, or ``"cuda:NVIDIA H200"``
    with a name. Kernel counts depend on the GPU model (Inductor picks different kernels
    per architecture), so GPU entries carry the device name; CPU entries do not."""
    device_type = device_type.split(":", 1)[0]
    if device_type == "cpu" or not device_name:
        return device_type
    return f"{device_type}:{device_name}"


@dataclass
class Kernel:
    """One launch in a profiled region.

    ``time_s`` is device time on CUDA and wall time of the op on CPU; ``bytes`` is the
    modelled HBM traffic (``None`` when nothing could be modelled: *unmodelled*, never
    0); ``bytes_measured`` comes from hardware counters when they are on; ``op`` is the
    ATen op that launched it or the origin of a generated kernel; ``source`` the user
    ``file:line``; ``bytes_estimate`` is Inductor's own figure for a generated kernel,
    kept where the compulsory model (``bytes``) differs from it (``docs/bytes.md``).
    ``flops`` is the floating-point work of the launch (``None`` when unknown, never 0
    for unknown: Inductor-generated kernels, Triton kernels declaring none); exact for
    matmul-class ops, one FLOP per element when ``flops_estimated`` (docs/roofline.md).
    ``dtype`` is what the op computes in (``"tf32"`` for a TF32 GEMM), for the roofline's
    compute ceiling.
    """

    name: str
    time_s: float = 0.0
    bytes: int | None = None
    bytes_measured: int | None = None
    op: str = ""
    source: str | None = None
    kind: str = "kernel"  # "kernel" or "copy"
    bytes_estimate: int | None = None  # Inductor's own estimate of a generated kernel
    start_ns: int = field(default=0, repr=False)
    module: str | None = None  # the nn.Module path that launched it, when known
    # Storage key -> bytes, of the op behind the kernel: what fusion headroom chains by.
    reads: dict = field(default_factory=dict, repr=False, compare=False)
    writes: dict = field(default_factory=dict, repr=False, compare=False)
    flops: int | None = None  # floating-point operations; None: unknown
    flops_estimated: bool = False  # one FLOP per element, not an exact formula
    dtype: str | None = None  # the compute dtype, when known

    @property
    def short_name(self) -> str:
        return shorten_kernel_name(self.name)

    @property
    def generated(self) -> bool:
        """An Inductor-generated kernel (C++ or Triton): its op names the ops it fused
        (``sources.bytes_model.generated_origin``)."""
        return self.op.startswith("fused") or self.op == "generated"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for private in ("start_ns", "reads", "writes"):
            d.pop(private, None)
        return d


def _strip_brackets(text: str, open_: str, close: str) -> str:
    out, depth = [], 0
    for ch in text:
        if ch == open_:
            if depth == 0:
                out.append(open_ + "…")
            depth += 1
        elif ch == close and depth:
            depth -= 1
            if depth == 0:
                out.append(close)
        elif depth == 0:
            out.append(ch)
    return "".join(out)


def shorten_kernel_name(name: str, width: int = 60) -> str:
    """A CUDA C++ kernel signature cut to something a table can show.

    ``void at::native::vectorized_elementwise_kernel<4, at::native::...>(int, ...)``
    becomes ``vectorized_elementwise_kernel<…>``; generated names such as
    ``triton_per_fused__softmax_0`` pass through. Long results are cut with ``…``.
    """
    short = name.strip()
    cxx = short.startswith("void ") or "::" in short
    if cxx and ("(" in short or "<" in short):
        short = _strip_brackets(short, "<", ">")
        short = _strip_brackets(short, "(", ")")
        short = re.sub(r"\(…\)$", "", short).strip()
        short = short.split(" ")[-1] if " " in short else short
        short = short.split("::")[-1] if "::" in short else short
    if len(short) > width:
        short = short[: width - 1] + "…"
    return short or name[:width]


def format_time(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} us"


def format_bandwidth(bytes_per_s: float | None) -> str:
    """GB/s to the unit; under 1 GB/s in MB/s (a CPU's slow region never reads "0 GB/s")."""
    if not bytes_per_s:
        return "-"
    if bytes_per_s < 1e9:
        return f"{bytes_per_s / 1e6:.0f} MB/s"
    return f"{bytes_per_s / 1e9:.0f} GB/s"


def format_graph_replay(graph_time_s: float, wall_time_s: float | None, recovered_share: float | None) -> str:
    """The graph-replay figure as reports print it (the summary line, the HTML page)."""
    text = f"replayed from a CUDA graph: {format_time(graph_time_s)} a call vs {format_time(wall_time_s)} wall"
    if recovered_share is not None:
        text += f" (recovers {recovered_share:.0%} of the idle time)"
    return text


def index_ranges(indices: Any, max_groups: int = 6) -> str:
    """Kernel indices as runs: ``[0, 1, 2, 3, 7, 9, 10]`` -> ``0-3, 7, 9-10``; after
    ``max_groups`` runs the rest is cut: ``0-6, 11-17, ... (35 in all)``."""
    runs: list[list[int]] = []
    for i in sorted(set(indices)):
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    text = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs[:max_groups])
    if len(runs) > max_groups:
        text += f", ... ({len(set(indices))} in all)"
    return text


_GEMM_OPS = frozenset(
    f"aten::{op}" for op in ("mm", "addmm", "bmm", "baddbmm", "addbmm", "matmul", "linear", "_addmm_activation", "addmv", "mv")
)


def fold_modules(kernels: Any) -> list[tuple[str, int, int, float, int]]:
    """``(pattern, kernels per copy, copies, time, bytes)`` per module from
    ``(module, time_s, bytes)`` triples: layer indices fold into ``*``
    (``layers.3.mlp`` -> ``layers.*.mlp``), most time first. A pattern whose kernels do not
    split evenly over its copies gives its total with one copy."""
    folded: dict[str, dict[str, Any]] = {}
    for module, seconds, nbytes in kernels:
        module = module or "(no module)"
        pattern = re.sub(r"(?<=\.)\d+(?=\.|$)|^\d+(?=\.|$)", "*", module)
        e = folded.setdefault(pattern, {"n": 0, "copies": set(), "time": 0.0, "bytes": 0})
        e["n"] += 1
        e["copies"].add(module)
        e["time"] += seconds or 0.0
        e["bytes"] += nbytes or 0
    rows = []
    for pattern, e in sorted(folded.items(), key=lambda item: -item[1]["time"]):
        copies = len(e["copies"])
        even = e["n"] % copies == 0
        rows.append((pattern, e["n"] // copies if even else e["n"], copies if even else 1, e["time"], e["bytes"]))
    return rows


def _modelled(nbytes: int | None) -> str:
    """A table cell for modelled bytes: ``?`` for an unmodelled kernel, never ``0 B``."""
    return "?" if nbytes is None else format_bytes(nbytes)


@dataclass
class FusionReport:
    """One profiled call or region (README.md, "What you get")."""

    label: str
    device: str
    kernels: list[Kernel] = field(default_factory=list)
    copies: list[Kernel] = field(default_factory=list)
    budget: Budget | None = None
    # The profiled call's own figures (docs/bytes.md, "Time"): device time (GPU) or its
    # kernels' wall time (CPU), and its wall time under the profiler.
    time_s: float | None = None
    time_source: str = "kernels"
    peak_bandwidth: float | None = None
    device_name: str = ""
    graph_breaks: list[Any] = field(default_factory=list)
    recompiles: list[Any] = field(default_factory=list)
    # Device-to-host synchronisations in the call (host_syncs.py): measured on a GPU, modelled on CPU.
    host_syncs: list[Any] = field(default_factory=list)
    source: str | None = None
    warnings: list[str] = field(default_factory=list)
    seq: int = 0
    wall_time_s: float | None = None
    # The call timed again without the profiler when the caller asked for timing: the median
    # device time (GPU; L2 flushed) or wall time (CPU) and the median synchronised wall time,
    # with what the median is; None when the call was not timed (a region, or timing off).
    median_time_s: float | None = None
    median_wall_time_s: float | None = None
    median_source: str | None = None
    output: Any = field(default=None, repr=False, compare=False)
    # Chains of memory-bound kernels and what fusing each would save (headroom.py).
    headroom: list[Any] = field(default_factory=list)
    # The profiler session, kept only to export Chrome traces (--fusion-trace-dir).
    trace: Any = field(default=None, repr=False, compare=False)
    # The call replayed from a CUDA graph (graph_replay.py, docs/launch_bound.md): seconds
    # a replay, or None with the reason in graph_note when it was asked for and not measured.
    graph_time_s: float | None = None
    graph_note: str | None = None
    # Calls of compiled graphs compiled before fusioncheck's hooks opened, on CPU, where the profiler does not see
    # their kernels (``counts_complete``; docs/architecture.md, "Graphs compiled earlier").
    unseen_graphs: int = 0

    def release(self) -> None:
        """Drop what keeps tensors or profiler events alive; every figure stays."""
        self.output = None
        self.trace = None

    @property
    def kernel_count(self) -> int:
        return len(self.kernels)

    @property
    def counts_complete(self) -> bool:
        """Whether every kernel the call ran is in ``kernels``: not so on CPU where a graph compiled before the
        hooks ran (Inductor's C++ kernels reach the profiler only when compiled under them)."""
        return not (self.device == "cpu" and self.unseen_graphs)

    def unseen_note(self) -> str | None:
        """What a graph compiled before the hooks costs this (CPU) report, and what to do."""
        if not self.unseen_graphs:
            return None
        return (f"{self.unseen_graphs} call(s) of graphs compiled before fusioncheck's hooks opened: on CPU their "
                "kernels never reach the profiler, so the kernels and bytes here miss them; compile inside the "
                "profiled call or the test (torch._dynamo.reset() before the first call)")

    @property
    def bytes(self) -> int:
        """Modelled HBM bytes: the sum over kernels (copies excluded)."""
        return sum(k.bytes or 0 for k in self.kernels)

    @property
    def bytes_unmodelled(self) -> int:
        """How many kernels have no byte model (``bytes`` is then a lower bound)."""
        return sum(1 for k in self.kernels if k.bytes is None)

    @property
    def bytes_measured(self) -> int | None:
        """DRAM bytes from hardware counters, or ``None`` when counters were off."""
        measured = [k.bytes_measured for k in self.kernels]
        if not measured or any(m is None for m in measured):
            return None
        return sum(measured)  # type: ignore[arg-type]

    @property
    def kernel_time_s(self) -> float:
        return sum(k.time_s for k in self.kernels)

    @property
    def device_time_s(self) -> float:
        """Device time of the profiled call: its kernels' and copies' durations, summed."""
        return sum(k.time_s for k in self.kernels) + sum(k.time_s for k in self.copies)

    @property
    def timed(self) -> tuple[float | None, float | None, str]:
        """``(time, wall time, what they are)`` that efficiency and the timing verdicts use:
        the medians when the call was timed, else the profiled call's own figures."""
        if self.median_time_s is not None:
            return self.median_time_s, self.median_wall_time_s, self.median_source or "median"
        return self.time_s, self.wall_time_s, self.time_source

    @property
    def launch_overhead_s(self) -> float | None:
        """Wall time not covered by device time (GPU only; ``None`` when unknown)."""
        time_s, wall_s, _ = self.timed
        if self.device != "cuda" or wall_s is None or time_s is None:
            return None
        return max(0.0, wall_s - time_s)

    @property
    def launch_overhead_share(self) -> float | None:
        """Launch overhead over the wall time (GPU only; ``None`` when unknown)."""
        overhead = self.launch_overhead_s
        wall_s = self.timed[1]
        if overhead is None or not wall_s:
            return None
        return overhead / wall_s

    @property
    def launch_bound(self) -> bool:
        """Kernels of under ~10 us each and the device idle most of the wall time: the
        region pays for launches, not bytes (a CUDA graph or fewer kernels helps)."""
        share = self.launch_overhead_share
        if share is None or not self.kernels:
            return False
        return share > 0.5 and (self.kernel_time_s / len(self.kernels)) < 10e-6

    @property
    def graph_recovered_share(self) -> float | None:
        """The share of the launch overhead (wall - device time) that replaying the call
        from a CUDA graph recovers: ``(wall - graph) / (wall - device)``, in [0, 1]; ``None``
        without a graph time or an overhead."""
        overhead, wall_s = self.launch_overhead_s, self.timed[1]
        if self.graph_time_s is None or not overhead or wall_s is None:
            return None
        return min(1.0, max(0.0, (wall_s - self.graph_time_s) / overhead))

    @property
    def cuda_kernel_range(self) -> tuple[int, int]:
        """The CUDA kernel counts a CPU report stands for: each GEMM op may gain a cuBLAS
        split-K reduce kernel on a GPU (docs/bytes.md). ``(n, n)`` on CUDA."""
        n = self.kernel_count
        if self.device == "cuda":
            return n, n
        return n, n + sum(1 for k in self.kernels if k.op in _GEMM_OPS)

    @property
    def unmodelled_kernels(self) -> list[int]:
        """Indices of the kernels with no byte model."""
        return [i for i, k in enumerate(self.kernels) if k.bytes is None]

    @property
    def efficiency(self) -> float | None:
        """(budget bytes / peak bandwidth) / time: 1.0 is a kernel at the copy roofline.

        Computed when read from the figures capture left: the median time when the call
        was timed, else the profiled call's (``timed``); ``None`` without a budget, a time
        or a peak bandwidth. Reading it never measures anything."""
        time_s = self.timed[0]
        if not self.budget or not time_s or not self.peak_bandwidth:
            return None
        return (self.budget.total / self.peak_bandwidth) / time_s

    @property
    def device_kind(self) -> str:
        """Baseline key: ``"cpu"`` or ``"cuda:<device name>"`` (``device_kind``)."""
        return device_kind(self.device, self.device_name)

    def _entries(self) -> list[tuple[str, Kernel]]:
        """Every row of the table: ``(index, kernel)``, copies (``"copy"``) after the kernels."""
        return [(str(i), k) for i, k in enumerate(self.kernels)] + [("copy", k) for k in self.copies]

    def _render(self, entries: list[tuple[str, Kernel]]) -> list[str]:
        """Table lines (header first) of ``entries``; the columns are the report's, whichever rows are shown."""
        show_measured = any(k.bytes_measured is not None for k in self.kernels)
        show_module = any(k.module for k in self.kernels + self.copies)
        headers = ["#", "kernel", "time", "bytes"] + (["measured"] if show_measured else []) + ["op"]
        headers += (["module"] if show_module else []) + ["source"]
        rows = []
        for i, k in entries:
            row = [i, k.short_name, format_time(k.time_s), _modelled(k.bytes)]
            if show_measured:
                row.append(format_bytes(k.bytes_measured))
            row.append(k.op or "-")
            if show_module:
                row.append(k.module or "-")
            rows.append(row + [k.source or "-"])
        widths = [max(len(h), *(len(r[c]) for r in rows)) for c, h in enumerate(headers)]
        right = {0, 2, 3, 4} if show_measured else {0, 2, 3}
        lines = []
        for row in [headers] + rows:
            cells = [cell.rjust(w) if c in right else cell.ljust(w) for c, (cell, w) in enumerate(zip(row, widths))]
            lines.append("  " + "  ".join(cells).rstrip())
        return lines

    def table(self, *, max_rows: int | None = 60) -> str:
        """The kernel table in launch order, copies listed after the kernels; at most
        ``max_rows`` rows (``None``: every row)."""
        entries = self._entries()
        if not entries:
            return "  (no kernels launched)"
        hidden = 0
        if max_rows is not None and len(entries) > max_rows:
            hidden = len(entries) - max_rows
            entries = entries[:max_rows]
        lines = self._render(entries)
        if hidden:
            lines.append(f"  ... {hidden} more rows")
        return "\n".join(lines)

    def top_rows(self, n: int = TOP_KERNELS) -> tuple[list[tuple[str, Kernel]], str]:
        """The ``n`` rows (kernels and copies) that took the most time, and what ranked them:
        ``"device time"`` on CUDA, ``"time"`` on CPU, ``"modelled bytes"`` when no row has a
        time (ties keep launch order)."""
        entries = self._entries()
        if any(k.time_s for _, k in entries):
            key, by = (lambda k: k.time_s or 0.0), ("device time" if self.device == "cuda" else "time")
        else:
            key, by = (lambda k: k.bytes or 0), "modelled bytes"
        ranked = sorted(enumerate(entries), key=lambda item: (-key(item[1][1]), item[0]))
        return [entry for _, entry in ranked[:n]], by

    def top_table(self, n: int = TOP_KERNELS) -> list[str]:
        """The ``n`` rows that took the most time, most first, under a heading, and a line
        saying how many rows are left out and where every row is."""
        entries = self._entries()
        if len(entries) <= n:
            return self.table(max_rows=None).splitlines()
        top, by = self.top_rows(n)
        lines = [f"top {n} of {len(entries)} rows by {by}:"] + self._render(top)
        lines.append(
            f"  ... {len(entries) - n} more rows not shown; every row: report.table() or "
            "report.text(full=True), --fusion-json, --fusion-html"
        )
        return lines

    def details(self, full: bool = False) -> list[str]:
        """What follows the summary line. A report of more than ``LONG_REPORT`` kernels
        leads with the per-module summary (when its kernels have modules) and, unless
        ``full``, shows only the ``TOP_KERNELS`` rows by time; others show the table."""
        lines: list[str] = []
        long = self.kernel_count > LONG_REPORT
        if long and any(k.module for k in self.kernels):
            lines += self.module_summary()
        if long and not full:
            return lines + self.top_table()
        return lines + self.table(max_rows=None if full else 60).splitlines()

    def summary(self) -> str:
        parts = [f"{self.kernel_count} kernel{'s' if self.kernel_count != 1 else ''}"]
        if self.copies:
            parts.append(f"{len(self.copies)} cop{'ies' if len(self.copies) != 1 else 'y'}")
        bytes_text = format_bytes(self.bytes)
        if self.bytes_unmodelled:
            bytes_text += f" (+{self.bytes_unmodelled} unmodelled)"
        parts.append(f"{bytes_text} modelled")
        if self.bytes_measured is not None:
            parts.append(f"{format_bytes(self.bytes_measured)} measured")
        if self.budget is not None:
            parts.append(f"budget {format_bytes(self.budget.total)}")
        time_s, wall_s, _ = self.timed
        parts.append(f"time {format_time(time_s)}" + (" (median)" if self.median_time_s is not None else ""))
        if self.device == "cuda" and wall_s is not None:
            parts.append(f"wall {format_time(wall_s)}")
            graph = None
            if self.graph_time_s is not None:
                graph = format_graph_replay(self.graph_time_s, wall_s, self.graph_recovered_share)
            if self.launch_bound:
                parts.append(f"launch-bound ({self.launch_overhead_share:.0%} of the wall time idle)" + (f"; {graph}" if graph else ""))
            elif graph:
                parts.append(graph)
        if self.efficiency is not None:
            parts.append(f"{self.efficiency:.0%} of {format_bandwidth(self.peak_bandwidth)}")
        lo, hi = self.cuda_kernel_range
        more = ""
        if self.device == "cpu" and any(k.name.startswith("cpp_fused") for k in self.kernels):
            # not a bound: Triton fuses less than C++ (docs/bytes.md, "Known misses")
            more = "; more where Inductor's CUDA backend splits a C++ kernel"
        if hi > lo:
            parts.append(f"on CUDA {lo}-{hi} kernels ({hi - lo} GEMM(s) may add a split-K reduce{more})")
        elif more:
            parts.append(f"on CUDA {lo} kernel{'s' if lo != 1 else ''} ({more.removeprefix('; ')})")
        where = f"{self.device_kind}"
        return f"[{self.label}] on {where}: " + ", ".join(parts)

    def notes(self) -> list[str]:
        """Warnings, plus what a reader of the table needs: unmodelled kernels, and
        generated kernels whose compulsory bytes differ from Inductor's estimate."""
        out = []
        if self.headroom:
            chains = [c for c in self.headroom if getattr(c, "leads", True)]  # a repeated layer's copies: one line
            out.append("headroom: " + chains[0].describe(self.peak_bandwidth, self.timed[0] if self.device == "cuda" else None))
            if len(chains) > 1:
                out[-1] += f" (+{len(chains) - 1} more chain(s))"
        out += self.warnings
        if self.unseen_graphs:
            out.append(self.unseen_note())
        if self.graph_note:
            out.append(f"CUDA graph replay not measured: {self.graph_note}")
        missing = self.unmodelled_kernels
        if missing:
            out.append(f"{len(missing)} kernel(s) have no byte model (bytes '?': #{index_ranges(missing)}); modelled bytes are a lower bound")
        for i, k in enumerate(self.kernels):
            if k.bytes_estimate is not None and k.bytes is not None and abs(k.bytes_estimate - k.bytes) > 0.05 * max(k.bytes, 1):
                out.append(
                    f"#{i} {k.short_name}: compulsory {format_bytes(k.bytes)}, Inductor's estimate "
                    f"{format_bytes(k.bytes_estimate)} (counts in-kernel re-reads; docs/bytes.md)"
                )
        return out

    def module_summary(self, max_rows: int = 12) -> list[str]:
        """Kernels, device time and modelled bytes per module, repeated structure folded
        (``layers.*.mlp: 4 kernels x 2``), most time first: what leads a long report."""
        rows = fold_modules((k.module, k.time_s, k.bytes) for k in self.kernels)
        lines = ["per module (repeated structure folded):"]
        for pattern, per, copies, seconds, nbytes in rows[:max_rows]:
            count = f"{per} kernel{'s' if per != 1 else ''}" + (f" x {copies}" if copies > 1 else "")
            lines.append(f"  {pattern}: {count}, {format_time(seconds)}, {format_bytes(nbytes)}")
        if len(rows) > max_rows:
            lines.append(f"  ... {len(rows) - max_rows} more")
        return lines

    def text(self, full: bool = False) -> str:
        """The summary line, ``details(full)`` and the notes: ``str(report)`` is
        ``text()``; ``text(full=True)`` lists every row of a long report."""
        lines = [self.summary(), *self.details(full)]
        lines += [f"  note: {w}" for w in self.notes()]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: every figure and every kernel (the output tensor is left out)."""

        def _gb(obj: Any) -> Any:
            return obj.to_dict() if hasattr(obj, "to_dict") else str(obj)

        return {
            "label": self.label,
            "device": self.device,
            "device_kind": self.device_kind,
            "kernel_count": self.kernel_count,
            "kernels": [k.to_dict() for k in self.kernels],
            "copies": [k.to_dict() for k in self.copies],
            "bytes": self.bytes,
            "bytes_unmodelled": self.bytes_unmodelled,
            "bytes_measured": self.bytes_measured,
            "budget": self.budget.to_dict() if self.budget else None,
            "time_s": self.time_s,
            "time_source": self.time_source,
            "wall_time_s": self.wall_time_s,
            "median_time_s": self.median_time_s,
            "median_wall_time_s": self.median_wall_time_s,
            "median_source": self.median_source,
            "launch_overhead_s": self.launch_overhead_s,
            "cuda_kernel_range": list(self.cuda_kernel_range),
            "launch_bound": self.launch_bound,
            "graph_time_s": self.graph_time_s,
            "graph_recovered_share": self.graph_recovered_share,
            "graph_note": self.graph_note,
            "peak_bandwidth": self.peak_bandwidth,
            "efficiency": self.efficiency,
            "graph_breaks": [_gb(g) for g in self.graph_breaks],
            "recompiles": [_gb(r) for r in self.recompiles],
            "host_syncs": [_gb(h) for h in self.host_syncs],
            "source": self.source,
            "warnings": list(self.warnings),
            "headroom": [c.to_dict() for c in self.headroom],
            "seq": self.seq,
        }
