"""Analytic HBM budgets: the fewest bytes a computation must move.

A budget is the yardstick every byte figure is compared with: each input read once,
each output written once, no intermediate ever leaving the chip. ``Budget.from_tensors``
derives one from tensors, counting each distinct storage once, so that passing the
same buffer twice (or two views of it) does not inflate the figure.

This module is pure arithmetic on tensor metadata; it imports torch only to recognise
tensors and never touches a device.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable

from . import _compat

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(value: Any) -> int:
    """Turn ``1024``, ``"128 MiB"`` or ``"1.5GB"`` into a byte count.

    Raises ``ValueError`` naming the accepted units for anything else (negative
    numbers, unknown units, booleans).
    """
    if isinstance(value, bool):
        raise ValueError(f"expected a byte count, got the boolean {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"a byte count cannot be negative, got {value}")
        return value
    if isinstance(value, float):
        if value < 0 or value != value:
            raise ValueError(f"a byte count must be a non-negative number, got {value}")
        return int(value)
    if isinstance(value, str):
        match = _SIZE_RE.match(value)
        if match:
            number, unit = match.groups()
            factor = _UNITS.get(unit.lower())
            if factor is not None:
                return int(float(number) * factor)
        raise ValueError(
            f"cannot read {value!r} as a byte count: use an int or a number with one of "
            "the units B, kB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024), "
            'e.g. "128 MiB"'
        )
    raise ValueError(f"expected a byte count (int or string such as '128 MiB'), got {type(value).__name__}")


def format_bytes(n: float | int | None) -> str:
    """Human-readable binary size: ``134217728 -> '128.0 MiB'``."""
    if n is None:
        return "-"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _tensor_extent(t: Any) -> tuple[int, int]:
    """Byte interval ``[start, end)`` of ``t`` inside its storage, and its logical size.

    The logical size is ``numel * itemsize`` capped by the span, so an expanded tensor
    (stride 0) counts the bytes that exist, and a strided slice counts its elements.
    """
    itemsize = t.element_size()
    start = t.storage_offset() * itemsize
    if t.numel() == 0:
        return (start, start), 0
    span_elems = 1 + sum((size - 1) * abs(stride) for size, stride in zip(t.shape, t.stride()))
    span = span_elems * itemsize
    return (start, start + span), min(span, t.numel() * itemsize)


def storage_key(t: Any) -> tuple[str, int]:
    """Identity of ``t``'s storage (its device and address; the object itself when it has none)."""
    storage = t.untyped_storage()
    return (_device_name(t.device), storage.data_ptr() or id(storage))


_SPARSE_PARTS = {
    "sparse_coo": ("_indices", "_values"),
    "sparse_csr": ("crow_indices", "col_indices", "values"),
    "sparse_bsr": ("crow_indices", "col_indices", "values"),
    "sparse_csc": ("ccol_indices", "row_indices", "values"),
    "sparse_bsc": ("ccol_indices", "row_indices", "values"),
}


def _strided_parts(t: Any) -> list[Any]:
    """The dense tensors that hold ``t``'s data: ``t`` itself, or a sparse tensor's index
    and value tensors (a sparse tensor has no storage of its own)."""
    layout = str(getattr(t, "layout", "torch.strided")).replace("torch.", "")
    if layout == "strided":
        return [t]
    parts = _SPARSE_PARTS.get(layout)
    if parts is None:
        return []
    return [getattr(t, name)() for name in parts]


class Touched:
    """The part of a tensor an op reaches: its first ``numel`` elements' worth of bytes in
    the tensor's storage (a scatter's target, the rows a loss gathers). Counted by
    ``bytes_by_storage`` under the tensor's own storage, so a later kernel that reads the
    tensor still chains with it (headroom.py)."""

    def __init__(self, base: Any, numel: int) -> None:
        self.base = base
        self.count = max(0, min(int(numel), base.numel()))
        self.dtype, self.device = base.dtype, base.device

    def numel(self) -> int:
        return self.count

    def element_size(self) -> int:
        return self.base.element_size()

    def is_floating_point(self) -> bool:
        return self.base.is_floating_point()

    def is_complex(self) -> bool:
        return self.base.is_complex()


def distinct_bytes(tensors: Iterable[Any]) -> int:
    """Bytes of ``tensors`` with each storage region counted once.

    Tensors on different storages add up. Tensors sharing a storage count the union of
    their byte intervals, but never more than the sum of their own logical sizes (so
    strided slices with gaps are not charged for the gaps). A sparse tensor counts its
    index and value tensors.
    """
    return sum(bytes_by_storage(tensors).values())


_DEVICE_NAMES: dict = {}  # torch.device -> str(device): formatting one costs ~0.3 us an op tensor


def _device_name(device: Any) -> str:
    try:
        return _DEVICE_NAMES[device]
    except KeyError:
        name = _DEVICE_NAMES[device] = str(device)
        return name


def _fast_extent(t: Any) -> tuple[tuple[str, int], tuple[int, int], int] | None:
    """``(storage_key, extent, logical)`` of a plain strided tensor without Python-level
    shape arithmetic (contiguous: its span is its size), else None (the general path)."""
    if type(t) is Touched or t.layout is not _STRIDED[0]:
        return None
    storage = t.untyped_storage()
    key = (_device_name(t.device), storage.data_ptr() or id(storage))
    itemsize = t.element_size()
    start = t.storage_offset() * itemsize
    numel = t.numel()
    if numel == 0:
        return key, (start, start), 0
    if t.is_contiguous():
        nbytes = numel * itemsize
        return key, (start, start + nbytes), nbytes
    extent, logical = _tensor_extent(t)
    return key, extent, logical


_STRIDED: list = []


def bytes_by_storage(tensors: Iterable[Any]) -> dict[tuple[str, int], int]:
    """``storage_key`` -> the distinct bytes ``tensors`` touch in that storage (``distinct_bytes``
    is their sum; headroom chains match producers and consumers by these keys)."""
    if not _STRIDED:
        import torch

        _STRIDED.append(torch.strided)
    by_storage: dict[tuple[str, int], list[tuple[tuple[int, int], int]]] = {}
    for tensor in tensors:
        if isinstance(tensor, Touched):
            start = tensor.base.storage_offset() * tensor.element_size()
            nbytes = tensor.count * tensor.element_size()
            by_storage.setdefault(storage_key(tensor.base), []).append(((start, start + nbytes), nbytes))
            continue
        fast = _fast_extent(tensor) if hasattr(tensor, "layout") else None
        if fast is not None:
            by_storage.setdefault(fast[0], []).append((fast[1], fast[2]))
            continue
        for t in _strided_parts(tensor):
            by_storage.setdefault(storage_key(t), []).append(_tensor_extent(t))
    totals = {}
    for key, extents in by_storage.items():
        if len(extents) == 1:  # one tensor on this storage: its own span, capped by its size
            (start, end), logical = extents[0]
            totals[key] = min(end - start if end > start else 0, logical)
            continue
        intervals = sorted(iv for iv, _ in extents if iv[1] > iv[0])
        union = 0
        cur_start = cur_end = None
        for start, end in intervals:
            if cur_end is None or start > cur_end:
                if cur_end is not None:
                    union += cur_end - cur_start
                cur_start, cur_end = start, end
            else:
                cur_end = max(cur_end, end)
        if cur_end is not None:
            union += cur_end - cur_start
        totals[key] = min(union, sum(logical for _, logical in extents))
    return totals


def iter_tensors(obj: Any) -> Iterable[Any]:
    """Every tensor inside ``obj``: tensors, (named) tuples, lists, dicts, modules."""
    import torch

    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, torch.nn.Module):
        yield from obj.parameters()
        yield from obj.buffers()
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from iter_tensors(v)
    elif isinstance(obj, (list, tuple, set, frozenset)):
        for v in obj:
            yield from iter_tensors(v)


@dataclass(frozen=True)
class Budget:
    """The analytic minimum HBM traffic of a computation, in bytes."""

    read_bytes: int = 0
    write_bytes: int = 0
    label: str = ""

    def __post_init__(self) -> None:
        for name in ("read_bytes", "write_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"Budget.{name} must be a non-negative int, got {value!r}")

    @property
    def total(self) -> int:
        return self.read_bytes + self.write_bytes

    @classmethod
    def from_tensors(cls, reads: Iterable[Any] = (), writes: Iterable[Any] = (), label: str = "") -> "Budget":
        """Each distinct storage in ``reads`` read once, each in ``writes`` written once.

        ``reads`` and ``writes`` may hold tensors, nested tuples/lists/dicts of tensors
        and ``nn.Module`` objects (their parameters and buffers).
        """
        return cls(
            read_bytes=distinct_bytes(iter_tensors(list(reads))),
            write_bytes=distinct_bytes(iter_tensors(list(writes))),
            label=label,
        )

    def __add__(self, other: "Budget") -> "Budget":
        if not isinstance(other, Budget):
            return NotImplemented
        label = " + ".join(x for x in (self.label, other.label) if x)
        return Budget(self.read_bytes + other.read_bytes, self.write_bytes + other.write_bytes, label)

    def __str__(self) -> str:
        what = f"{self.label}: " if self.label else ""
        return f"{what}{format_bytes(self.total)} (read {format_bytes(self.read_bytes)}, write {format_bytes(self.write_bytes)})"

    def to_dict(self) -> dict[str, Any]:
        return {"read_bytes": self.read_bytes, "write_bytes": self.write_bytes, "total": self.total, "label": self.label}


# How far ``find_captures`` follows references from the callable: hops through closures,
# globals, defaults, containers and plain objects' attributes (docs/bytes.md, "The default
# budget"), and how many objects it looks at in all.
_CAPTURE_DEPTH = 6
_CAPTURE_OBJECTS = 20000
_WRAPPER_ATTRS = ("__wrapped__", "__self__", "__func__")  # and torch.compile's (_compat.compiled_inner)


def _wrapped(obj: Any, attr: str) -> Any:
    try:
        return getattr(obj, attr, None)
    except Exception:  # a property that raises
        return None


@dataclass
class Captures:
    """What a profiled callable uses besides its arguments: the ``nn.Module`` objects, the
    tensors and the optimizers it is, wraps or reaches (``find_captures``)."""

    modules: list = field(default_factory=list)
    tensors: list = field(default_factory=list)
    optimizers: list = field(default_factory=list)

    def parameters(self) -> list:
        """Every parameter of the modules and optimizers (each object once)."""
        out, seen = [], set()
        for m in self.modules:
            for p in m.parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    out.append(p)
        for opt in self.optimizers:
            for group in getattr(opt, "param_groups", []) or []:
                for p in group.get("params", []):
                    if id(p) not in seen:
                        seen.add(id(p))
                        out.append(p)
        return out

    def optimizer_state(self) -> list:
        """The tensors of the optimizers' per-parameter state (``exp_avg``, ``step``, ...)."""
        return list(iter_tensors([list(getattr(opt, "state", {}).values()) for opt in self.optimizers]))

    def snapshot(self, args: Any = ()) -> "TensorSnapshot":
        """Every tensor the call can read, with its version, before the call (see ``TensorSnapshot``)."""
        tensors = list(iter_tensors([args, self.modules, self.tensors])) + self.optimizer_state()
        params = self.parameters()
        tensors += params
        grads = {id(p): (p.grad, _compat.tensor_version(p.grad)) for p in params if p.grad is not None}
        arg_ids = {id(t) for t in iter_tensors(args)}
        return TensorSnapshot({id(t): (t, _compat.tensor_version(t)) for t in tensors}, params, grads, self, arg_ids)


@dataclass
class TensorSnapshot:
    """Tensors a call can reach and their version counters, taken before the call, so that
    the default budget can tell what the call wrote: a tensor whose version moved was
    written in place; a gradient is written when it is new or moved; a gradient that is
    still the parameter's after the call was read (accumulated into, or stepped with)."""

    versions: dict
    params: list
    grads: dict
    captures: Captures
    arg_ids: set = field(default_factory=set)

    def reads(self, read: set | None = None) -> list:
        """What the call can read: every tensor found and the gradients it kept. With
        ``read`` (the storage keys the call's ops read, when every kernel of the call was an
        observed op), a captured tensor (not an argument, a module's or an optimizer's) that
        no op read is left out: a fill or an overwrite of a captured buffer reads nothing."""
        kept = [g for p in self.params if (g := self.grads.get(id(p), (None, 0))[0]) is not None and p.grad is g]
        found = [t for t, _ in self.versions.values()] + kept
        if read is None:
            return found
        droppable = {id(t) for t in self.captures.tensors} - self.arg_ids
        return [t for t in found if id(t) not in droppable or storage_key(t) in read]

    def writes(self, written: set | frozenset = frozenset()) -> list:
        """What the call wrote: tensors whose version moved or whose storage is in ``written``
        (the storage keys the observed ops wrote: a foreach op under a dispatch mode leaves
        the version counter alone), new or moved gradients, and optimizer state it made."""
        moved = [t for t, version in self.versions.values() if _compat.tensor_version(t) != version or storage_key(t) in written]
        for p in self.params:
            grad = p.grad
            if grad is None:
                continue
            before = self.grads.get(id(p))
            if before is None or before[0] is not grad or before[1] != _compat.tensor_version(grad) or storage_key(grad) in written:
                moved.append(grad)
        known = {id(t) for t, _ in self.versions.values()}
        moved += [t for t in self.captures.optimizer_state() if id(t) not in known]  # state made by this call
        return moved


def _is_user_class(cls: type) -> bool:
    """Whether ``cls`` is defined in user code (``where.is_internal``), so that its instances'
    attributes are worth following (a user's trainer object holds the model and optimizer)."""
    import inspect

    from .where import is_internal

    try:
        return not is_internal(inspect.getfile(cls))
    except (TypeError, OSError):
        return False


def _code_names(code: Any) -> list[str]:
    """Global names a function's code (and the code of functions nested in it) refers to."""
    names, stack = [], [code]
    while stack:
        c = stack.pop()
        names += list(c.co_names)
        stack += [k for k in c.co_consts if hasattr(k, "co_names")]
    return names


def find_captures(fn: Any, extra: Any = ()) -> Captures:
    """The modules, tensors and optimizers ``fn`` is, wraps or closes over, whatever its form.

    Followed, to ``_CAPTURE_DEPTH`` hops: compiled wrappers (``_orig_mod``,
    ``_torchdynamo_orig_callable``), ``__wrapped__``, a bound method's ``__self__`` and
    function, ``functools.partial`` functions and arguments, a function's closure cells,
    default arguments and the globals its code names, containers, and the attributes of
    objects of user-defined classes. ``extra`` (the call's arguments) is searched the same
    way, so a module passed as an argument counts. Modules, tensors and optimizers are
    leaves: their own contents are taken whole (parameters and buffers; param groups and
    state). Torch's, pytest's and this plugin's own objects are not entered.
    """
    import functools
    import types

    import torch

    found = Captures()
    stack: list[tuple[Any, int]] = [(extra, 0), (fn, 0)]
    seen: set[int] = set()
    while stack and len(seen) < _CAPTURE_OBJECTS:
        obj, depth = stack.pop()
        if obj is None or id(obj) in seen or depth > _CAPTURE_DEPTH:
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            found.tensors.append(obj)
            continue
        if isinstance(obj, torch.nn.Module):
            found.modules.append(obj)
            continue
        if isinstance(obj, torch.optim.Optimizer):
            found.optimizers.append(obj)
            continue
        if isinstance(obj, (str, bytes, int, float, complex, bool, type, types.ModuleType)):
            continue
        nxt = depth + 1
        if isinstance(obj, functools.partial):
            stack += [(v, nxt) for v in (obj.func, *obj.args, *obj.keywords.values())]
            continue
        if isinstance(obj, dict):
            stack += [(v, nxt) for v in obj.values()]
            continue
        if isinstance(obj, (list, tuple, set, frozenset)):
            stack += [(v, nxt) for v in obj]
            continue
        for inner in [_wrapped(obj, attr) for attr in _WRAPPER_ATTRS] + [_compat.compiled_inner(obj)]:
            if inner is not None and not isinstance(inner, type):
                stack.append((inner, nxt))
        if isinstance(obj, types.FunctionType):
            from .where import is_internal

            if is_internal(obj.__code__.co_filename):
                continue  # torch's own wrappers: only their wrapper attributes above
            cells = [c.cell_contents for c in (obj.__closure__ or ()) if _cell_filled(c)]
            defaults = list(obj.__defaults__ or ()) + list((obj.__kwdefaults__ or {}).values())
            module_globals = obj.__globals__
            named = [module_globals[n] for n in _code_names(obj.__code__) if n in module_globals]
            stack += [(v, nxt) for v in cells + defaults + named]
        elif not isinstance(obj, types.MethodType) and _is_user_class(type(obj)):
            try:
                attrs = list(vars(obj).values())
            except TypeError:
                attrs = []
            stack += [(v, nxt) for v in attrs]
    return found


def _cell_filled(cell: Any) -> bool:
    try:
        cell.cell_contents
    except ValueError:  # a cell not yet assigned
        return False
    return True


def callable_modules(fn: Any) -> list[Any]:
    """The ``nn.Module`` objects a callable is, wraps or closes over (``find_captures``)."""
    return find_captures(fn).modules


def default_budget(
    args: Any, kwargs: Any, output: Any, fn: Any = None, snapshot: TensorSnapshot | None = None,
    written: set | frozenset = frozenset(), read: set | None = None,
) -> Budget:
    """What the call uses, read once; what it returns or updates, written once.

    Reads: the tensor arguments, the tensors the callable captures, the parameters and
    buffers of its modules and of module arguments, its optimizers' parameters and state,
    and the gradients it kept. Writes: the returned tensors and, with a ``snapshot`` taken
    before the call, every reachable tensor the call updated in place or created as a
    gradient (``TensorSnapshot``). Each distinct storage once.
    """
    if snapshot is None:
        captures = find_captures(fn, (args, kwargs)) if fn is not None else find_captures(None, (args, kwargs))
        snapshot = captures.snapshot((args, kwargs))
    captures = snapshot.captures
    reads, updated = snapshot.reads(read), snapshot.writes(written)
    arg_tensors = {id(t) for t in iter_tensors((args, kwargs))}
    parts = ["args"]
    arg_modules = {id(m) for m in flat_modules((args, kwargs))}
    if any(id(m) not in arg_modules for m in captures.modules) or captures.modules:
        parts.append("module weights")
    if any(id(t) not in arg_tensors for t in captures.tensors):
        parts.append("captured tensors")
    if captures.optimizers:
        parts.append("optimizer state")
    if any(p.grad is not None for p in snapshot.params):
        parts.append("gradients")
    what = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    written = "outputs and updated tensors" if updated else "outputs"
    label = f"default: {what} read once, {written} written once"
    return Budget.from_tensors(reads=reads, writes=[output, updated], label=label)


def flat_modules(obj: Any) -> list[Any]:
    """``nn.Module`` objects inside nested lists, tuples and dict values of ``obj``."""
    import torch

    if isinstance(obj, torch.nn.Module):
        return [obj]
    if isinstance(obj, dict):
        return [m for v in obj.values() for m in flat_modules(v)]
    if isinstance(obj, (list, tuple)):
        return [m for v in obj for m in flat_modules(v)]
    return []
