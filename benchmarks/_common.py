"""Timing, table and output helpers shared by the benchmark scripts (GPU only).

Times are device times (``device_ms``): calls replayed from a CUDA graph, so the Python
launch path is not timed; where a graph cannot be captured, CUDA events around each call
with the L2 flushed between runs (``bench_ms``, ``triton.testing.do_bench``). Bandwidth is
compared with a device-to-device copy of the same size timed the same way in the same run,
counting bytes read plus bytes written. Every script takes ``--out DIR``: what it prints
also goes to ``DIR/<script>.txt``.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
from pathlib import Path
from typing import Callable, TextIO

import torch


def bench_ms(fn, warmup_ms: int = 25, rep_ms: int = 100) -> float:
    """Median milliseconds of ``fn()`` (CUDA events, L2 flushed between runs)."""
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))


def device_ms(fn, calls: int = 10, reps: int = 5) -> tuple[float, str]:
    """(milliseconds a call, timer): ``calls`` calls captured in a CUDA graph, replayed ``reps`` times.

    A graph replays the kernels back to back without the Python launch path, so the kernels are
    timed, not the host: ``bench_ms`` times each call from the host, and a 65 us kernel behind
    ~50 us of Python launch code reads 30% slow (the layer-norm backward's two launches read 46-69%
    of copy there against 89-92% in a graph, H200). Inputs over twice the L2 keep consecutive calls
    from finding theirs there. Falls back to ``bench_ms`` (timer "events") where capture fails.
    """
    from reference_kernels._common import graph_device_ms

    fn()
    try:
        return graph_device_ms(lambda _: fn(), [None] * calls, replays=reps), "graph"
    except Exception as exc:  # e.g. an anchor that synchronises: capture is refused
        torch.cuda.synchronize()
        return bench_ms(fn, 10, 50), f"events ({type(exc).__name__}: {str(exc)[:80]})"


def copy_gbps(nbytes: int, device: str = "cuda") -> float:
    """GB/s (read + write) of a device-to-device copy moving ``nbytes`` in total: the faster of the
    graph-replayed time (``device_ms``) and host events around each copy (``bench_ms``).

    A copy is one ``cudaMemcpyAsync``, which a CUDA graph records as a memcpy node; on the H200
    (torch 2.11, CUDA 13) those replayed 512 MiB copies at 2750 GB/s where events around the same
    copies read ~4150, as do the graph's 128-256 MiB and 768 MiB copies, so a graph-only roofline
    put fp32 kernels at 150% of copy. The copy's host path is a few microseconds against its
    hundreds, so events time it fairly; the faster figure is the roofline.
    """
    n = max(nbytes // 2, 1)
    src = torch.empty(n, dtype=torch.uint8, device=device).random_()
    dst = torch.empty_like(src)
    ms = min(device_ms(lambda: dst.copy_(src))[0], bench_ms(lambda: dst.copy_(src), 10, 50))
    return 2 * n / (ms * 1e-3) / 1e9


def gbps(nbytes: int, ms: float) -> float:
    return nbytes / (ms * 1e-3) / 1e9


def header() -> str:
    """One line naming the GPU, the software and the date, for BENCHMARKS.md."""
    import triton

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    return (
        f"{gpu}, torch {torch.__version__}, triton {triton.__version__}, "
        f"Python {platform.python_version()}, {datetime.date.today().isoformat()}"
    )


def markdown_table(headers: list[str], rows: list[list[object]]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


ANCHORS = ("torch", "compile", "liger")

# Liger-Kernel's functions that the benchmarks time, by subject: (module, names).
_LIGER_OPS = {
    "softmax": ("liger_kernel.ops.softmax", ("_softmax_forward",)),
    "layer_norm": ("liger_kernel.ops.layer_norm", ("layer_norm_forward", "layer_norm_backward")),
}


def liger_ops(subject: str) -> tuple | None:
    """Liger-Kernel's functions for ``subject`` ("softmax": (forward,); "layer_norm": (forward,
    backward)), or None when Liger-Kernel is not installed (an optional anchor: its column reads n/a)."""
    import importlib

    module, names = _LIGER_OPS[subject]
    try:
        mod = importlib.import_module(module)
    except ImportError:
        return None
    return tuple(getattr(mod, name) for name in names)


def bandwidth_headers(impls: list[str]) -> list[str]:
    """Columns of a bandwidth table: GB/s and % of copy per implementation, then ours/best anchor."""
    cols = ["dtype", "shape", "copy GB/s"]
    for name in impls:
        cols += [f"{name} GB/s", f"{name} %copy"]
    if "ours" in impls and any(a in impls for a in ANCHORS):
        cols.append("ours / best anchor")
    return cols


def bandwidth_row(rec: dict, impls: list[str]) -> list[object]:
    """One row from a record ``{"dtype", "shape", "copy_gbps", "gbps": {impl: GB/s}}``."""
    copy = rec["copy_gbps"]
    row: list[object] = [rec["dtype"], rec["shape"], f"{copy:.0f}"]
    for name in impls:
        rate = rec["gbps"].get(name)
        row += ["n/a", "n/a"] if rate is None else [f"{rate:.0f}", f"{100 * rate / copy:.0f}%"]
    anchors = [rec["gbps"][a] for a in ANCHORS if rec["gbps"].get(a)]
    if "ours" in impls and anchors:
        ours = rec["gbps"].get("ours")
        row.append("n/a" if ours is None else f"{ours / max(anchors):.2f}x")
    return row


OUT_HELP = "also write what this script prints (and its JSON, where it has one) under DIR, created if missing"


def add_out_option(parser: argparse.ArgumentParser, default: str = "") -> None:
    parser.add_argument("--out", metavar="DIR", default=default, help=OUT_HELP)


class _Tee:
    """A text stream that writes to several streams (the terminal and a log file)."""

    def __init__(self, *streams: TextIO):
        self._streams = streams

    def write(self, text: str) -> int:
        for stream in self._streams:
            stream.write(text)
        return len(text)

    def flush(self) -> None:
        for stream in self._streams:
            stream.flush()

    def __getattr__(self, name: str):  # isatty, fileno, encoding, ...: the terminal's
        return getattr(self._streams[0], name)


def write_output_to(out_dir: str, script: str) -> Path | None:
    """With ``--out DIR``: from now on, copy stdout and stderr to ``DIR/<script's stem>.txt``.

    Returns DIR (created if missing), or None when ``out_dir`` is empty.
    """
    if not out_dir:
        return None
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    log = open(out / f"{Path(script).stem}.txt", "w", buffering=1)
    sys.stdout = _Tee(sys.stdout, log)
    sys.stderr = _Tee(sys.stderr, log)
    return out


def require_cuda(script: str) -> None:
    """Exit with a plain message where torch sees no CUDA GPU: the benchmarks time kernels on one, and without it
    torch fails deep inside the first CUDA call with a message about its build."""
    if not torch.cuda.is_available():
        raise SystemExit(f"{Path(script).name} times kernels on a CUDA GPU: torch {torch.__version__} sees none here")


def json_path(args: argparse.Namespace, out: Path | None, script: str) -> str:
    """Where a bandwidth benchmark writes its JSON: ``--json``, else ``DIR/<script>.json`` with ``--out``."""
    return args.json or (str(out / f"{Path(script).stem}.json") if out else "")


def bandwidth_cli(description: str, extra: "Callable[[argparse.ArgumentParser], None] | None" = None):
    """Options shared by the bandwidth benchmarks; returns (args, widths, impls, timing)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="shorter timing runs")
    parser.add_argument("--widths", default="", help="comma-separated row widths to keep (default: all)")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    if extra is not None:
        extra(parser)
    parser.add_argument("--impls", default="ours,torch,compile,liger")
    parser.add_argument("--sweep", action="store_true", help="also time launch-plan variants of ours")
    parser.add_argument("--json", default="", help="write every figure to this file (default with --out: DIR/<script>.json)")
    add_out_option(parser)
    args = parser.parse_args()
    require_cuda(parser.prog)
    widths = {int(w) for w in args.widths.split(",") if w}
    timing = dict(calls=5, reps=3) if args.quick else dict(calls=10, reps=5)  # device_ms's
    return args, widths, args.impls.split(","), timing


def time_impls(rec: dict, fns: dict, impls: list[str], nbytes: int, timing: dict, where: str) -> None:
    """Fill ``rec["gbps"][name]`` for each implementation: GB/s, or None when absent or failing.

    An anchor failing at a shape is a result (n/a in the table), not a crash.
    """
    for name in impls:
        if name not in fns:
            rec["gbps"][name] = None
            continue
        try:
            ms, rec.setdefault("timer", {})[name] = device_ms(fns[name], **timing)
            rec["gbps"][name] = gbps(nbytes, ms)
        except Exception as exc:
            print(f"  {name} failed at {where}: {type(exc).__name__}: {exc}"[:300], flush=True)
            rec["gbps"][name] = None
