"""Kernel source for CUDA: each device activity Kineto recorded in the profiled call.

Kernels count; memcpy/memset are copies. Each activity is attributed, through its launch's
correlation id, to the innermost ATen op range open on the launching thread (the op
observer's ``fusioncheck::op#<i>``), else to a directly launched Triton kernel of the same
name, else to the Inductor kernel it is. One op's traffic goes to its longest compute
kernel, and so do its FLOPs; a copy carries its own size (docs/bytes.md). Inductor's
generated kernels have no FLOP figure (``None``).
"""

from __future__ import annotations

from typing import Any

from .._compat import device_activity_kind, kineto_events
from ..ops import OpRecord, TritonLaunch
from ..ranges import GRAPH_RANGE_PREFIX, OP_RANGE_PREFIX, TRITON_RANGE_PREFIX
from ..report import Kernel
from .bytes_model import (
    generated_origin,
    inductor_kernel_bytes,
    inductor_kernel_estimate,
    inductor_kernel_flops,
    inductor_kernel_module,
    inductor_kernel_source,
)


class CudaKernels:
    """``KernelSource`` for ``device == "cuda"``."""

    def kernels(self, prof: Any, ops: list[OpRecord], triton: list[TritonLaunch], names: dict[int, str] | None = None) -> tuple[list[Kernel], list[Kernel]]:
        return cuda_kernels(prof, ops, triton, names)


def copy_traffic(name: str, nbytes: int | None) -> int | None:
    """HBM bytes of a memcpy/memset activity of ``nbytes``: a device-to-device copy reads
    and writes them, a memset or a host transfer touches device memory once."""
    if nbytes is None:
        return None
    if "DtoD" in name or "Device -> Device" in name or "PtoP" in name:
        return 2 * nbytes
    return nbytes


def copy_sizes_from_trace(trace: dict[str, Any]) -> dict[int, int]:
    """Correlation id -> bytes of each memcpy/memset in a Chrome trace (Kineto writes the
    size there, and torch's event API does not expose it)."""
    out: dict[int, int] = {}
    for ev in trace.get("traceEvents", []) or []:
        if ev.get("cat") not in ("gpu_memcpy", "gpu_memset"):
            continue
        args = ev.get("args") or {}
        size, corr = args.get("bytes"), args.get("correlation")
        if isinstance(size, (int, float)) and isinstance(corr, int) and size >= 0:
            out[corr] = int(size)
    return out


def _copy_sizes(prof: Any) -> dict[int, int]:
    """``copy_sizes_from_trace`` of the profiler's own trace (exported to a temporary file:
    done only for regions that launched copies)."""
    import json
    import tempfile

    with tempfile.TemporaryDirectory(prefix="fusioncheck-") as tmp:
        path = f"{tmp}/trace.json"
        try:
            prof.export_chrome_trace(path)
            with open(path) as fh:
                return copy_sizes_from_trace(json.load(fh))
        except Exception:  # no sizes: the copies stay unmodelled
            return {}


def attribute_op_bytes(activities: list[Kernel], op_bytes: int | None) -> Kernel | None:
    """Give one op's modelled traffic to the device activities it launched (the rule of
    ``docs/bytes.md``): copies (memset/memcpy) keep their own size; the op's bytes go to
    its longest compute kernel (the GEMM of a GEMM + memset, the main kernel of a split-K
    GEMM + reduce) and to every other launch of that same kernel (a multi-tensor apply's
    chunks, a chunked loop), shared in proportion to their device time (each launch is
    memory-bound on its share); compute kernels of another name carry 0, their traffic
    being inside that figure. The op's total is unchanged. An op that could not be
    modelled leaves its kernels unmodelled (``None``). Returns the longest kernel."""
    compute = [k for k in activities if k.kind != "copy"]
    if not compute:
        return None
    main = max(compute, key=lambda k: k.time_s)
    launches = [k for k in compute if k.name == main.name]
    shares = split_by_time(op_bytes, [k.time_s for k in launches]) if op_bytes is not None else [None] * len(launches)
    for k in compute:
        k.bytes = 0 if op_bytes is not None else None
    for k, share in zip(launches, shares):
        k.bytes = share
    return main


def split_by_time(total: int, times: list[float]) -> list[int]:
    """``total`` split over launches in proportion to ``times`` (equally when no time is
    known), in whole bytes that add up to ``total``."""
    if not times:
        return []
    weight = sum(times)
    fractions = [t / weight for t in times] if weight > 0 else [1 / len(times)] * len(times)
    shares = [int(total * f) for f in fractions]
    shares[max(range(len(times)), key=lambda i: fractions[i])] += total - sum(shares)
    return shares


def attribute_op_flops(activities: list[Kernel], main: Kernel | None, op: OpRecord) -> None:
    """Give one op's FLOPs to the kernels its bytes went to (``attribute_op_bytes``'s
    ``main`` and its other launches, by device time); its other compute kernels carry 0 (their work is inside that figure), or
    ``None`` when the op's FLOPs are unknown. Every kernel of the op gets its dtype."""
    launches = [k for k in activities if k.kind != "copy" and main is not None and k.name == main.name]
    shares = dict(zip(map(id, launches), split_by_time(op.flops, [k.time_s for k in launches]))) if op.flops is not None else {}
    for k in activities:
        if k.kind == "copy":
            continue
        k.flops = shares.get(id(k), 0) if op.flops is not None else None
        k.flops_estimated = op.flops_estimated
        k.dtype = op.dtype


def cuda_kernels(prof: Any, ops: list[OpRecord], triton: list[TritonLaunch], names: dict[int, str] | None = None) -> tuple[list[Kernel], list[Kernel]]:
    """Device activities from Kineto, each attributed to the op or Triton launch behind it;
    a generated kernel's figures are those of the graph whose wrapper call launched it
    (the ``fusioncheck::graph#`` range around the launch)."""
    from torch.autograd import DeviceType

    events = kineto_events(prof)
    launches: dict[int, Any] = {}
    markers: list[tuple[int, int, int, str]] = []
    device_events = []
    for e in events:
        name = e.name()
        if e.device_type() == DeviceType.CUDA:
            device_events.append(e)
        elif name.startswith((OP_RANGE_PREFIX, TRITON_RANGE_PREFIX, GRAPH_RANGE_PREFIX)):
            markers.append((e.start_ns(), e.end_ns(), e.start_thread_id(), name))
        elif e.correlation_id():
            launches[e.correlation_id()] = e
    markers.sort()
    by_index = {op.index: op for op in ops}
    triton_queue: dict[str, list[TritonLaunch]] = {}
    for launch in triton:
        triton_queue.setdefault(launch.name, []).append(launch)

    def innermost(launch_event: Any, prefix: str) -> str | None:
        """The innermost range of ``prefix`` open on the launching thread at the launch."""
        if launch_event is None:
            return None
        t, tid = launch_event.start_ns(), launch_event.start_thread_id()
        best = None
        for start, end, thread, name in markers:
            if start > t:
                break
            if thread == tid and start <= t <= end and name.startswith(prefix):
                best = name
        return best[len(prefix):] if best else None

    def innermost_op(launch_event: Any) -> OpRecord | None:
        index = innermost(launch_event, OP_RANGE_PREFIX)
        return by_index.get(int(index)) if index is not None else None

    kernels: list[Kernel] = []
    copies: list[Kernel] = []
    by_op: dict[int, list[Kernel]] = {}
    sizes: dict[int, int] | None = None
    for e in sorted(device_events, key=lambda ev: ev.start_ns()):
        kind = device_activity_kind(e)
        if kind is None:
            continue
        name = e.name()
        is_copy = kind == "copy"
        launch_event = launches.get(e.linked_correlation_id())
        op = innermost_op(launch_event)
        k = Kernel(name=name, time_s=e.duration_ns() * 1e-9, kind="copy" if is_copy else "kernel", start_ns=e.start_ns())
        if is_copy:  # its size is only in the exported trace (torch's events lack it)
            if sizes is None:
                sizes = _copy_sizes(prof)
            k.bytes = copy_traffic(name, sizes.get(e.linked_correlation_id(), sizes.get(e.correlation_id())))
        queue = triton_queue.get(name)
        if op is not None:
            k.op, k.source, k.module = op.op, op.source, op.module
            by_op.setdefault(op.index, []).append(k)
            if queue and not is_copy and queue[0].inside_op == op.index:  # a custom op's launch: the op stands for it
                launch = queue.pop(0)
                k.module = k.module or launch.module
        elif queue and not is_copy:
            launch = queue.pop(0)
            k.op, k.source, k.bytes, k.module = "triton", launch.source, launch.bytes, launch.module
            k.flops, k.dtype = launch.flops, launch.dtype
        elif not is_copy:
            graph_token = innermost(launch_event, GRAPH_RANGE_PREFIX)
            graph = int(graph_token) if graph_token is not None else None
            est = inductor_kernel_bytes(name, graph)
            if est is not None or name.startswith("triton_"):
                k.op, k.bytes = generated_origin(name, graph), est
                k.bytes_estimate = inductor_kernel_estimate(name, graph)
                k.module = inductor_kernel_module(name, graph, names)
                k.source = inductor_kernel_source(name, graph)
                k.flops, k.flops_estimated = inductor_kernel_flops(name, graph)
        (copies if is_copy else kernels).append(k)
    for index, group in by_op.items():
        main = attribute_op_bytes(group, by_index[index].bytes)
        attribute_op_flops(group, main, by_index[index])
        if main is not None:  # the op's storages, for fusion headroom
            main.reads, main.writes = by_index[index].reads, by_index[index].writes
    return kernels, copies
