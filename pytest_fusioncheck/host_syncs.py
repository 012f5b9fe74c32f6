"""Device-to-host synchronisations inside a profiled region, each with the line behind it.

A sync stalls the host until the GPU drains its queue: the launches after it cannot be
queued ahead, and under ``torch.compile`` the op that needs the value usually splits the
graph too. Two sources, one record (docs/host_syncs.md):

* on a GPU, the truth: the CUDA runtime's synchronising calls that Kineto recorded during
  the call (``cudaStreamSynchronize``, ``cudaDeviceSynchronize``, ...), each attributed to
  the ATen op range open on the calling thread (its op and user line), else to an explicit
  ``torch.cuda.synchronize`` / ``Stream.synchronize`` / ``Event.synchronize`` the capture
  saw (its line), else left without a line;
* on CPU, a model: the ATen ops that synchronise on a GPU (``op_sync_reason``), seen by
  the op observer. A CPU tensor's ``.cpu()``, ``.numpy()`` or ``.tolist()`` dispatches no
  op and is not seen; neither is an explicit CUDA synchronize.

No torch import at module level.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterable

from .ranges import OP_RANGE_PREFIX, SYNC_RANGE_PREFIX

_SCALAR = "reads a tensor's value into Python (.item(), int(), float(), bool() or an `if` on a tensor)"
_DATA_SIZED = "its output's size depends on the data, so the host waits for it"
# ATen op name -> why it synchronises on a GPU, whatever its arguments.
_ALWAYS = {
    "_local_scalar_dense": _SCALAR,
    "item": _SCALAR,
    "equal": "torch.equal returns a Python bool",
    "nonzero": _DATA_SIZED + " (nonzero, argwhere, torch.where(cond))",
    "masked_select": _DATA_SIZED,
    "_unique": _DATA_SIZED + " (unique)",
    "_unique2": _DATA_SIZED + " (unique)",
    "unique_dim": _DATA_SIZED + " (unique)",
    "unique_consecutive": _DATA_SIZED + " (unique_consecutive)",
    "unique_dim_consecutive": _DATA_SIZED + " (unique_consecutive)",
    "bincount": "its length is the largest value + 1, read by the host",
}
_COPIES = frozenset({"_to_copy", "copy_", "to", "_copy_from"})
# The CUDA runtime (and driver) calls that block the host until the device catches up.
SYNC_CALLS = frozenset(
    {
        "cudaDeviceSynchronize",
        "cudaStreamSynchronize",
        "cudaEventSynchronize",
        "cudaMemcpy",
        "cudaMemcpy2D",
        "cudaFree",
        "cuCtxSynchronize",
        "cuStreamSynchronize",
        "cuEventSynchronize",
        "cuMemcpyDtoH_v2",
    }
)
EXPLICIT = "an explicit synchronize (torch.cuda.synchronize, Stream.synchronize or Event.synchronize)"


@dataclass(frozen=True)
class HostSync:
    """One synchronisation: the op (or call) behind it, why it syncs, its user ``file:line``."""

    op: str
    reason: str
    source: str | None = None
    call: str | None = None  # the CUDA runtime call Kineto recorded (GPU); None on CPU

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        where = self.source or "(no user line: inside a library call)"
        call = f" [{self.call}]" if self.call else ""
        return f"{self.op} at {where}: {self.reason}{call}"


def _tensors(obj: Any) -> list:
    import torch

    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in _tensors(v)]
    return []


def op_sync_reason(name: str, args: tuple, kwargs: dict) -> str | None:
    """Why the ATen op ``name`` on these arguments synchronises a GPU with the host, or
    ``None``. A rule of what the op needs (a value or a size the host must read), the same
    on every device; on CPU it is the model of what a GPU would do."""
    if name in _ALWAYS:
        return _ALWAYS[name]
    if name == "repeat_interleave":
        repeats = args[1] if len(args) >= 2 else (args[0] if args else None)
        if kwargs.get("output_size") is None and _tensors(repeats):
            return "repeat_interleave with tensor repeats and no output_size sizes its output by the repeats"
        return None
    if name == "index" and len(args) >= 2:
        import torch

        if any(t.dtype in (torch.bool, torch.uint8) for t in _tensors(args[1])):
            return "indexing with a boolean mask (x[mask]) sizes its output by the mask"
        return None
    if name in _COPIES:
        tensors = _tensors(args[:2])
        if not tensors or kwargs.get("non_blocking") or (len(args) >= 3 and args[2] is True and name == "copy_"):
            return None
        if name == "copy_" and len(tensors) >= 2:
            src, dst = tensors[1].device.type, tensors[0].device.type
        else:
            import torch

            src = tensors[0].device.type
            target = kwargs.get("device")
            dst = torch.device(target).type if target is not None else src
        if src != "cpu" and dst == "cpu":
            return "copies a device tensor to the host (.cpu(), .numpy(), .tolist(), .to('cpu')) and waits for it"
    return None


def from_ops(records: Iterable[Any], sources: dict[int, str | None] | None = None) -> list[HostSync]:
    """The CPU model: every observed op with a sync reason (``OpRecord.sync``); ``sources``
    overrides an op's line by its index (``compiled_sources``)."""
    sources = sources or {}
    return [HostSync(r.op, r.sync, sources.get(r.index, r.source)) for r in records if getattr(r, "sync", None)]


def compiled_sources(
    op_starts: dict[int, int],
    graph_calls: list[tuple[int, int, Any]],
    records: Iterable[Any],
    graph_host_reads: Callable[[Any], list[tuple[str, str | None]]],
) -> dict[int, str | None]:
    """The user line of each scalar a compiled graph reads into the host: Inductor's wrapper
    calls ``.item()`` on a buffer (``u0 = buf1.item()``), which the op observer sees at the
    compiled frame's ``def`` line; the graph's own FX node knows the model's line. ``op_starts``:
    op index -> start ns; ``graph_calls``: (start, end, graph) of each graph call."""
    out: dict[int, str | None] = {}
    queues: dict[tuple[int, int], list[tuple[str, str | None]]] = {}
    for r in records:
        if not getattr(r, "sync", None) or r.index not in op_starts:
            continue
        t = op_starts[r.index]
        call = next(((a, b, g) for a, b, g in graph_calls if a <= t <= b), None)
        if call is None:
            continue
        queue = queues.setdefault((call[0], call[1]), graph_host_reads(call[2]))
        for i, (op, source) in enumerate(queue):
            if op == r.op:
                out[r.index] = source
                del queue[i]
                break
    return out


def from_runtime(
    calls: list[tuple[str, int, int]],
    markers: list[tuple[int, int, int, str]],
    ops: dict[int, Any],
    explicit: dict[int, str | None],
    window: tuple[int, int] | None,
) -> list[HostSync]:
    """The GPU truth. ``calls``: (runtime call name, start ns, thread) of each Kineto CPU
    event; ``markers``: (start, end, thread, name) of the plugin's ranges; ``ops``: op
    index -> ``OpRecord``; ``explicit``: sync-range index -> user line; ``window``: the
    profiled call's (start, end), syncs outside it (the capture's own) left out. One
    ``HostSync`` per op or explicit call, however many runtime calls it made."""
    out: list[HostSync] = []
    seen: set[tuple[str, int]] = set()
    for name, start, thread in sorted(calls, key=lambda c: c[1]):
        if name not in SYNC_CALLS or (window is not None and not window[0] <= start <= window[1]):
            continue
        op_index = sync_index = None
        for m_start, m_end, m_thread, label in markers:
            if m_thread != thread or not m_start <= start <= m_end:
                continue
            if label.startswith(OP_RANGE_PREFIX):
                op_index = int(label[len(OP_RANGE_PREFIX):])  # markers sorted by start: innermost last
            elif label.startswith(SYNC_RANGE_PREFIX):
                sync_index = int(label[len(SYNC_RANGE_PREFIX):])
        if op_index is not None and op_index in ops:
            key = ("op", op_index)
            record = ops[op_index]
            sync = HostSync(record.op, getattr(record, "sync", None) or f"the op calls {name}", record.source, name)
        elif sync_index is not None:
            key = ("explicit", sync_index)
            sync = HostSync("synchronize", EXPLICIT, explicit.get(sync_index), name)
        else:
            key = ("call", start)
            sync = HostSync(name, "a CUDA synchronisation outside any ATen op the capture saw", None, name)
        if key not in seen:
            seen.add(key)
            out.append(sync)
    return out


def format_host_syncs(syncs: list[HostSync]) -> str:
    return "\n".join(f"  {s}" for s in syncs)


def from_profiler(
    prof: Any, device: str, records: list[Any], explicit: dict[int, str | None],
    graph_host_reads: Callable[[Any], list[tuple[str, str | None]]],
) -> list[HostSync]:
    """The host syncs of a finished profile: ``from_runtime`` on a GPU, ``from_ops`` on CPU,
    each op's line corrected by ``compiled_sources``."""
    from ._compat import kineto_events
    from .ranges import CALL_RANGE, GRAPH_RANGE_PREFIX

    calls: list[tuple[str, int, int]] = []
    markers: list[tuple[int, int, int, str]] = []
    graph_calls: list[tuple[int, int, Any]] = []
    op_starts: dict[int, int] = {}
    window = None
    if not any(getattr(r, "sync", None) for r in records) and device != "cuda":
        return []
    for e in kineto_events(prof):
        name = e.name()
        if name.startswith(OP_RANGE_PREFIX):
            op_starts[int(name[len(OP_RANGE_PREFIX):])] = e.start_ns()
            markers.append((e.start_ns(), e.end_ns(), e.start_thread_id(), name))
        elif name.startswith(GRAPH_RANGE_PREFIX):
            token = name[len(GRAPH_RANGE_PREFIX):]
            graph_calls.append((e.start_ns(), e.end_ns(), int(token) if token.isdigit() else token))
        elif name == CALL_RANGE:
            window = (e.start_ns(), e.end_ns())
        elif name.startswith(SYNC_RANGE_PREFIX):
            markers.append((e.start_ns(), e.end_ns(), e.start_thread_id(), name))
        elif name in SYNC_CALLS:
            calls.append((name, e.start_ns(), e.start_thread_id()))
    sources = compiled_sources(op_starts, graph_calls, records, graph_host_reads)
    if device != "cuda":
        return from_ops(records, sources)
    markers.sort()
    ops = {r.index: r for r in records}
    for index, source in sources.items():
        ops[index] = _with_source(ops[index], source)
    return from_runtime(calls, markers, ops, explicit, window)


def _with_source(record: Any, source: str | None) -> Any:
    import copy

    record = copy.copy(record)
    record.source = source
    return record
