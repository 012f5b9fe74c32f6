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
from dataclasses import dataclass
from typing import Any, Iterable

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
    return (str(t.device), storage.data_ptr() or id(storage))


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


def distinct_bytes(tensors: Iterable[Any]) -> int:
    """Bytes of ``tensors`` with each storage region counted once.

    Tensors on different storages add up. Tensors sharing a storage count the union of
    their byte intervals, but never more than the sum of their own logical sizes (so
    strided slices with gaps are not charged for the gaps). A sparse tensor counts its
    index and value tensors.
    """
    return sum(bytes_by_storage(tensors).values())


def bytes_by_storage(tensors: Iterable[Any]) -> dict[tuple[str, int], int]:
    """``storage_key`` -> the distinct bytes ``tensors`` touch in that storage (``distinct_bytes``
    is their sum; headroom chains match producers and consumers by these keys)."""
    by_storage: dict[tuple[str, int], list[tuple[tuple[int, int], int]]] = {}
    for tensor in tensors:
        for t in _strided_parts(tensor):
            by_storage.setdefault(storage_key(t), []).append(_tensor_extent(t))
    totals = {}
    for key, extents in by_storage.items():
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


def callable_modules(fn: Any) -> list[Any]:
    """The ``nn.Module`` objects a callable is or wraps: a module, a compiled module or
    function (``_orig_mod``, ``_torchdynamo_orig_callable``), a bound method's
    ``__self__``, a ``functools.partial``'s function and bound arguments."""
    import functools

    import torch

    found: list[Any] = []
    stack, seen = [fn], set()
    while stack:
        obj = stack.pop()
        if obj is None or id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.nn.Module):
            found.append(obj)
            continue
        if isinstance(obj, functools.partial):
            stack += [obj.func, *obj.args, *obj.keywords.values()]
            continue
        for attr in ("_orig_mod", "_torchdynamo_orig_callable", "__self__", "__wrapped__"):
            inner = getattr(obj, attr, None)
            if inner is not None and not isinstance(inner, type):
                stack.append(inner)
    return found


def default_budget(args: Any, kwargs: Any, output: Any, fn: Any = None) -> Budget:
    """Tensor arguments, and the parameters and buffers of the callable's modules and of
    module arguments, read once; returned tensors written once."""
    modules = callable_modules(fn) if fn is not None else []
    label = "default: args" + (" and module weights" if modules else "") + " read once, outputs written once"
    return Budget.from_tensors(reads=[args, kwargs, modules], writes=[output], label=label)
