"""What counts as a kernel: records, name shortening, and the CPU-side op observer.

A ``Kernel`` is one launch in a profiled region. Where launches come from depends on
the device (see ``capture.py``):

* CUDA: every device kernel Kineto saw; memcpy/memset are *copies*, kept apart.
* CPU: a model of what a GPU would launch. Each Inductor-generated C++ kernel (Inductor's
  kernel profiling turned on) plus each eager ATen op that computes, observed by
  ``OpObserver`` at the bottom of the Python dispatch stack. Views, metadata ops and
  allocations launch nothing and are skipped; ``.item()`` and cross-device transfers are
  copies. An op that calls other ops internally (CPU ``addmm`` calls ``copy_`` and
  ``resolve_conj``) is seen once, as the user called it, because the observer sees only
  what reaches the dispatcher from above it.

``OpObserver`` also gives every op its user ``file:line`` and the logical bytes it moves
(distinct input storages read, distinct output storages written), on any device, and
wraps each op in a profiler range so CUDA kernels can be attributed to the op that
launched them.
"""

from __future__ import annotations

import os
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))

OP_RANGE_PREFIX = "fusioncheck::op#"

# Ops that only describe, alias or allocate memory: no kernel on any device.
_NO_KERNEL_OPS = frozenset(
    {
        "empty",
        "empty_like",
        "empty_strided",
        "empty_permuted",
        "new_empty",
        "new_empty_strided",
        "resize_",
        "resize_as_",
        "set_",
        "detach",
        "detach_",
        "alias",
        "lift",
        "lift_fresh",
        "lift_fresh_copy",
        "resolve_conj",
        "resolve_neg",
        "conj",
        "_conj",
        "_neg_view",
        "sym_size",
        "sym_stride",
        "sym_numel",
        "sym_storage_offset",
        "is_same_size",
        "is_nonzero",
        "_has_compatible_shallow_copy_type",
        "record_stream",
        "_unsafe_view",
        "_reshape_alias",
        "as_strided",
        "view",
        "_to_copy_meta",
        "profiler::_record_function_enter",
        "profiler::_record_function_enter_new",
        "profiler::_record_function_exit",
    }
)
# Ops that read a value back to the host: a device-to-host copy, not a kernel.
_HOST_READ_OPS = frozenset({"_local_scalar_dense", "item", "equal"})


@dataclass
class Kernel:
    """One launch in a profiled region.

    ``time_s`` is device time on CUDA and wall time of the op on CPU; ``bytes`` is the
    modelled HBM traffic (``None`` when nothing could be modelled: *unmodelled*, never
    0); ``bytes_measured`` comes from hardware counters when they are on; ``op`` is the
    ATen op that launched it or the origin of a generated kernel; ``source`` the user
    ``file:line``; ``bytes_estimate`` is Inductor's own figure for a generated kernel,
    kept where the compulsory model (``bytes``) differs from it (``docs/bytes.md``).
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

    @property
    def short_name(self) -> str:
        return shorten_kernel_name(self.name)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("start_ns", None)
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


_INDUCTOR_CPU_KERNEL = re.compile(r"^(?:graph_\d+_)?(cpp_\w+)$")
_GENERATED_PREFIX = re.compile(r"^(?:graph_\d+_)?(?:cpp|triton)_(?:poi|per|red|tem|spl|mix|unk|fused)?_?")


def inductor_cpu_kernel(name: str) -> str | None:
    """The kernel name if ``name`` is an Inductor C++ kernel's profiler event, else None."""
    m = _INDUCTOR_CPU_KERNEL.match(name)
    return m.group(1) if m else None


def generated_origin(name: str) -> str:
    """``triton_poi_fused_add_gelu_0`` -> ``fused: add, gelu`` (the ops Inductor fused).

    Uses the ATen ops Inductor recorded for the kernel at code generation; falls back
    to reading them off the kernel's name (ambiguous where op names hold underscores).
    """
    from .bytes_model import inductor_kernel_origins

    origins = inductor_kernel_origins(name)
    if origins:
        return "fused: " + ", ".join(origins)
    base = re.sub(r"_\d+$", "", name)
    m = re.match(r"^(?:graph_\d+_)?(?:cpp|triton)_(?:(?:poi|per|red|tem|spl|mix|unk)_)?fused_?(.*)$", base)
    if not m:
        return "generated"
    ops = [p for p in re.split(r"_(?=[a-z])", m.group(1)) if p]
    return "fused: " + ", ".join(ops) if ops else "generated"


def _is_internal_file(filename: str) -> bool:
    if filename.startswith("<"):
        return True
    path = os.path.abspath(filename)
    if path.startswith(_PACKAGE_DIR + os.sep):
        return True
    parts = path.replace("\\", "/").split("/")
    internal = {"torch", "_pytest", "pluggy", "triton", "torchinductor", "functorch"}
    if any(p in internal for p in parts[:-1]):
        return True
    if any(p.startswith("torchinductor_") for p in parts):
        return True
    return os.path.basename(path) in {"contextlib.py", "threading.py", "runpy.py", "functools.py"}


def user_source(start_depth: int = 1, max_depth: int = 200) -> str | None:
    """The innermost user frame's ``file:line`` (path relative to the cwd when under it)."""
    try:
        frame = sys._getframe(start_depth)
    except ValueError:
        return None
    depth = 0
    while frame is not None and depth < max_depth:
        filename = frame.f_code.co_filename
        if not _is_internal_file(filename):
            return f"{relpath(filename)}:{frame.f_lineno}"
        frame = frame.f_back
        depth += 1
    return None


def relpath(filename: str) -> str:
    path = os.path.abspath(filename)
    cwd = os.getcwd()
    if path.startswith(cwd + os.sep):
        return os.path.relpath(path, cwd)
    return filename


@dataclass
class OpRecord:
    """One ATen op seen by ``OpObserver``."""

    index: int
    op: str
    kind: str  # "kernel", "copy" or "none"
    read_bytes: int | None  # None: the op's traffic could not be modelled
    write_bytes: int | None
    source: str | None
    wall_ns: int = 0

    @property
    def bytes(self) -> int | None:
        if self.read_bytes is None or self.write_bytes is None:
            return None
        return self.read_bytes + self.write_bytes


def classify_op(func: Any, args: tuple, kwargs: dict) -> str:
    """'kernel', 'copy' or 'none' for an ATen overload about to run on ``args``."""
    import torch

    packet = func.overloadpacket.__name__ if hasattr(func, "overloadpacket") else str(func)
    name = packet.split("::")[-1]
    if getattr(func, "is_view", False) or name in _NO_KERNEL_OPS:
        return "none"
    schema = getattr(func, "_schema", None)
    if schema is not None and schema.returns and all(
        r.alias_info is not None and not r.alias_info.is_write for r in schema.returns
    ):
        return "none"  # returns views of its inputs (split, unbind, chunk, ...)
    if name in _HOST_READ_OPS:
        return "copy"
    tensors = [a for a in _flat_tensors(args) + _flat_tensors(kwargs)]
    if name in ("copy_", "_to_copy", "clone", "_copy_from", "to"):
        devices = {t.device.type for t in tensors}
        if name == "_to_copy" and kwargs.get("device") is not None:
            devices.add(torch.device(kwargs["device"]).type)
        if len(devices) > 1:
            return "copy"  # host <-> device transfer
        if name == "copy_" and len(tensors) >= 2:
            dst, src = tensors[0], tensors[1]
            if dst.dtype == src.dtype and dst.is_contiguous() and src.is_contiguous() and dst.shape == src.shape:
                return "copy"  # a plain memcpy on CUDA
        if name == "clone" and tensors and tensors[0].is_contiguous():
            fmt = kwargs.get("memory_format")
            if fmt in (None, torch.preserve_format, torch.contiguous_format):
                return "copy"
    return "kernel"


def _flat_tensors(obj: Any) -> list:
    import torch

    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in _flat_tensors(v)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in _flat_tensors(v)]
    return []


def op_traffic(func: Any, args: tuple, kwargs: dict, out: Any) -> tuple[int, int]:
    """(bytes read, bytes written) of one op: distinct input and output storages.

    Arguments the schema marks as written (``out=`` buffers, the ``self`` of an in-place
    op) count as outputs; an in-place op's ``self`` is also read. Returned tensors that
    alias a written argument are not counted twice.
    """
    from .budget import distinct_bytes

    reads: list = []
    writes: list = []
    schema = getattr(func, "_schema", None)
    written_names: set[str] = set()
    if schema is not None:
        for arg in schema.arguments:
            if arg.alias_info is not None and arg.alias_info.is_write:
                written_names.add(arg.name)
        for i, arg in enumerate(schema.arguments):
            value = args[i] if i < len(args) else kwargs.get(arg.name)
            tensors = _flat_tensors(value)
            if arg.name in written_names:
                writes += tensors
                if not arg.kwarg_only:
                    reads += tensors  # in-place: read-modify-write
            else:
                reads += tensors
    else:
        reads = _flat_tensors(args) + _flat_tensors(kwargs)
    returned = _flat_tensors(out)
    name = getattr(getattr(func, "overloadpacket", None), "__name__", "")
    if name in _GATHER_OPS and returned:
        reads = _gather_reads(name, args, kwargs, returned)
    if writes:
        written_keys = {_storage_id(t) for t in writes}
        writes += [t for t in returned if _storage_id(t) not in written_keys]
    else:
        writes = returned
    return distinct_bytes(reads), distinct_bytes(writes)


# Ops that read only the rows/elements they gather from their source, not the whole
# source: an embedding lookup touches len(indices) rows of a vocab-sized table.
_GATHER_OPS = frozenset({"embedding", "index_select", "gather", "take", "index"})


def _gather_reads(name: str, args: tuple, kwargs: dict, returned: list) -> list:
    """Reads of a gather: its index tensors plus, from the source, no more than it returns.

    Returned as tensors for ``distinct_bytes``: the index tensors themselves, and a stand-in
    with the returned tensors' size for the gathered part of the source (capped by the
    source's size, so a gather that returns more than the source holds reads the source).
    """
    import torch

    tensors = _flat_tensors(args) + _flat_tensors(kwargs)
    if not tensors:
        return []
    source = tensors[0]  # every op in _GATHER_OPS takes its source first
    indices = [t for t in tensors[1:] if not t.is_floating_point() and not t.is_complex()]
    gathered = sum(t.numel() * t.element_size() for t in returned)
    source_bytes = source.numel() * source.element_size()
    if gathered >= source_bytes:
        return [source] + indices
    stand_in = torch.empty(gathered, dtype=torch.uint8, device="meta")
    return indices + [stand_in]


def _storage_id(t: Any) -> tuple:
    return (str(t.device), t.untyped_storage().data_ptr())


def make_op_observer(record_ranges: bool = True):
    """A ``TorchDispatchMode`` that records every ATen op (see ``OpRecord``).

    It declares ``ignore_compile_internals`` so that ``torch.compile`` keeps compiling
    under it: the mode is off while Dynamo and Inductor compile and on while the compiled
    code runs, where it sees the extern ops (``mm``, ``addmm``) Inductor calls.
    """
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class OpObserver(TorchDispatchMode):
        @classmethod
        def ignore_compile_internals(cls) -> bool:
            return True

        def __init__(self) -> None:
            super().__init__()
            self.records: list[OpRecord] = []
            self.paused = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if self.paused:
                return func(*args, **kwargs)
            kind = classify_op(func, args, kwargs)
            if kind == "none":
                return func(*args, **kwargs)
            index = len(self.records)
            op = str(func.overloadpacket.__name__) if hasattr(func, "overloadpacket") else str(func)
            source = user_source(2)
            t0 = time.perf_counter_ns()
            if record_ranges:
                with torch.profiler.record_function(f"{OP_RANGE_PREFIX}{index}"):
                    out = func(*args, **kwargs)
            else:
                out = func(*args, **kwargs)
            wall = time.perf_counter_ns() - t0
            try:
                read_b, write_b = op_traffic(func, args, kwargs, out)
            except Exception:  # exotic tensors (sparse, nested): unmodelled, count kept
                read_b, write_b = None, None
            self.records.append(OpRecord(index, f"aten::{op}", kind, read_b, write_b, source, wall))
            return out

    return OpObserver()
