"""Numerics: a fused kernel must compute what its unfused reference computes.

Fusing a chain changes the order and precision of the arithmetic (an fp32 accumulator
instead of a bf16 round trip per op, a different reduction tree), so a fused kernel is
never bit-identical to its reference. ``assert_matches_reference`` runs the reference in
float64 on copies of the inputs taken before the fused call, and compares every output
with a tolerance chosen by the dtype of the *fused* output (``TOLERANCES``). On failure
the message carries the figures a kernel engineer reads first: max abs and relative
error, relative L2 error, the worst element with both values, and how many elements
are off.

torch is imported inside the functions: importing this module costs nothing.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import numbers
from dataclasses import dataclass
from typing import Any, Callable

__all__ = [
    "TOLERANCES",
    "NumericsMismatch",
    "NumericsResult",
    "OutputComparison",
    "assert_matches_reference",
    "tolerance_for",
]


class _DtypeTable(dict):
    """A dict keyed by dtype name (``"bfloat16"``) that also accepts ``torch.bfloat16``.

    Keys are names so that the table exists without importing torch.
    """

    @staticmethod
    def _key(key: Any) -> str:
        return str(key).removeprefix("torch.")

    def __getitem__(self, key: Any) -> tuple[float, float]:
        return super().__getitem__(self._key(key))

    def __setitem__(self, key: Any, value: tuple[float, float]) -> None:
        super().__setitem__(self._key(key), value)

    def __contains__(self, key: object) -> bool:
        return super().__contains__(self._key(key))

    def get(self, key: Any, default: Any = None) -> Any:
        return super().get(self._key(key), default)


#: Default ``(rtol, atol)`` by the dtype of the fused output; an element passes when
#: ``|fused - ref| <= atol + rtol * |ref|`` with ``ref`` computed in float64.
#: Integer and bool outputs are compared exactly; complex outputs use the row of their
#: component dtype; other floating dtypes (float8) have no default and need explicit
#: ``rtol`` and ``atol``. docs/numerics.md gives the reasoning behind each row.
TOLERANCES: dict[Any, tuple[float, float]] = _DtypeTable(
    {
        "float64": (1e-7, 1e-7),
        "float32": (1e-5, 1e-5),
        "float16": (2e-3, 1e-3),
        "bfloat16": (1.6e-2, 1e-2),
    }
)

_COMPLEX_COMPONENT = {"complex128": "float64", "complex64": "float32", "complex32": "float16"}


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def _kind(dtype: Any) -> str:
    if dtype.is_complex:
        return "complex"
    if dtype.is_floating_point:
        return "floating point"
    if _dtype_name(dtype) == "bool":
        return "bool"
    return "integer"


def tolerance_for(dtype: Any) -> tuple[float, float]:
    """The default ``(rtol, atol)`` for an output of ``dtype`` (a ``torch.dtype``).

    ``(0.0, 0.0)`` (exact) for integer and bool dtypes. Raises ``ValueError`` for a
    floating dtype the table does not cover, asking for explicit tolerances.
    """
    name = _dtype_name(dtype)
    name = _COMPLEX_COMPONENT.get(name, name)
    if name in TOLERANCES:
        return TOLERANCES[name]
    if not (dtype.is_floating_point or dtype.is_complex):
        return (0.0, 0.0)
    raise ValueError(
        f"no default tolerance for outputs of dtype {dtype}: pass rtol= and atol= to "
        f"assert_matches_reference (TOLERANCES covers {', '.join(sorted(TOLERANCES))})"
    )


def _resolve_tolerances(dtype: Any, rtol: float | None, atol: float | None) -> tuple[float, float, str]:
    if rtol is not None and atol is not None:
        return rtol, atol, "explicit rtol and atol"
    kind = _kind(dtype)
    table = "exact comparison for bool outputs" if kind == "bool" else (
        "exact comparison for integer outputs" if kind == "integer" else f"TOLERANCES[{dtype}]"
    )
    if kind in ("bool", "integer"):
        default = (0.0, 0.0)
    else:
        try:
            default = tolerance_for(dtype)
        except ValueError:
            missing = " and ".join(n for n, v in (("rtol", rtol), ("atol", atol)) if v is None)
            raise ValueError(
                f"no default tolerance for outputs of dtype {dtype}: pass {missing} explicitly"
            ) from None
    if rtol is None and atol is None:
        return default[0], default[1], table
    if rtol is None:
        return default[0], atol, f"explicit atol, rtol from {table}"
    return rtol, default[1], f"explicit rtol, atol from {table}"


def _check_tolerance(name: str, value: Any) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value >= 0 or math.isinf(value):
        raise ValueError(f"assert_matches_reference: {name} must be a finite number >= 0, got {value!r}")


# --- float64 copies of the inputs ---------------------------------------------------


def _reference_copy(obj: Any, memo: dict[int, Any]) -> Any:
    """A float64 copy of ``obj`` for the reference: tensors, modules and containers.

    ``memo`` keeps aliasing: the same tensor passed twice gives the same copy twice.
    Anything else (numbers, strings, dtypes, callables) is passed through as is.
    """
    import torch

    key = id(obj)
    if key in memo:
        return memo[key]
    if isinstance(obj, torch.Tensor):
        result = obj.detach().clone()
        if result.is_floating_point():
            result = result.to(torch.float64)
        elif result.is_complex():
            result = result.to(torch.complex128)
        if obj.requires_grad and (result.is_floating_point() or result.is_complex()):
            result.requires_grad_(True)
    elif isinstance(obj, torch.nn.Module):
        try:
            result = copy.deepcopy(obj)
        except Exception as exc:
            raise TypeError(
                f"assert_matches_reference: cannot deep-copy the {type(obj).__name__} argument to run "
                f"the reference in float64 ({exc}); pass a float64 module built for the reference inside "
                "reference_fn instead"
            ) from exc
        result = result.double()
    elif isinstance(obj, tuple) and hasattr(obj, "_fields"):
        result = type(obj)(*(_reference_copy(v, memo) for v in obj))
    elif isinstance(obj, (tuple, list)):
        items = [_reference_copy(v, memo) for v in obj]
        result = type(obj)(items) if type(obj) in (tuple, list) else _rebuild(obj, items)
    elif isinstance(obj, dict):
        items = {k: _reference_copy(v, memo) for k, v in obj.items()}
        result = items if type(obj) is dict else _rebuild(obj, items)
    else:
        result = obj
    memo[key] = result
    return result


def _rebuild(original: Any, items: Any) -> Any:
    """A container of ``original``'s type holding ``items``, falling back to the plain type."""
    try:
        clone = copy.copy(original)
        if isinstance(original, dict):
            clone.clear()
            clone.update(items)
        else:
            clone[:] = items
        return clone
    except Exception:
        if isinstance(original, dict):
            return dict(items)
        return tuple(items) if isinstance(original, tuple) else list(items)


# --- results ------------------------------------------------------------------------


def _fmt(x: float | complex | int | bool) -> str:
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, complex):
        return f"{x:.8g}"
    if isinstance(x, int):
        return str(x)
    return f"{x:.8g}"


@dataclass(frozen=True)
class OutputComparison:
    """How one output tensor compares with the reference (both ``ok`` and failing)."""

    path: str
    shape: tuple[int, ...]
    dtype: str
    numel: int
    mismatches: int
    max_abs_error: float
    max_rel_error: float
    rel_l2_error: float
    rtol: float
    atol: float
    tolerance_source: str
    reference_dtype: str = "float64"
    nonfinite_mismatches: int = 0
    nan_where_reference_has_none: int = 0
    worst_index: tuple[int, ...] | None = None
    worst_fused: Any = None
    worst_reference: Any = None
    worst_reference_as_fused_dtype: Any = None
    worst_allowed: float | None = None

    @property
    def ok(self) -> bool:
        return self.mismatches == 0

    def describe(self) -> str:
        pct = 100.0 * self.mismatches / self.numel if self.numel else 0.0
        lines = [
            f"{self.path}: shape {self.shape}, dtype torch.{self.dtype} (reference: torch.{self.reference_dtype})",
            f"  mismatched elements: {self.mismatches} of {self.numel} ({pct:.3g}%)",
        ]
        if self.nonfinite_mismatches:
            lines.append(
                f"  non-finite mismatches: {self.nonfinite_mismatches} (NaN where the reference has none: "
                f"{self.nan_where_reference_has_none}); the errors below are over the elements finite in both"
            )
        lines += [
            f"  max abs error:       {_fmt(self.max_abs_error)}",
            f"  max rel error:       {_fmt(self.max_rel_error)}",
            f"  relative L2 error:   {_fmt(self.rel_l2_error)}  (||fused - ref|| / ||ref||)",
        ]
        if self.worst_index is not None:
            index = f"[{', '.join(str(i) for i in self.worst_index)}]" if self.worst_index else " (0-d)"
            as_dtype = ""
            if self.worst_reference_as_fused_dtype is not None:
                as_dtype = f" (as {self.dtype}: {_fmt(self.worst_reference_as_fused_dtype)})"
            allowed = f", allowed |diff| {self.worst_allowed:.4g}" if self.worst_allowed is not None else ""
            lines.append(
                f"  worst element:       {self.path}{index}: fused {_fmt(self.worst_fused)}, "
                f"reference {_fmt(self.worst_reference)}{as_dtype}{allowed}"
            )
        lines.append(f"  tolerances:          rtol={self.rtol:g}, atol={self.atol:g} ({self.tolerance_source})")
        return "\n".join(lines)


@dataclass(frozen=True)
class NumericsResult:
    """What ``assert_matches_reference`` returns on success: the errors of every output."""

    outputs: tuple[OutputComparison, ...]

    @property
    def max_abs_error(self) -> float:
        return max((o.max_abs_error for o in self.outputs), default=0.0)

    @property
    def max_rel_error(self) -> float:
        return max((o.max_rel_error for o in self.outputs), default=0.0)

    @property
    def rel_l2_error(self) -> float:
        return max((o.rel_l2_error for o in self.outputs), default=0.0)

    def __str__(self) -> str:
        return "\n".join(o.describe() for o in self.outputs)


class NumericsMismatch(AssertionError):
    """Raised by ``assert_matches_reference``; ``.problems`` lists each failing path."""

    def __init__(self, message: str, problems: list[str], comparisons: tuple[OutputComparison, ...]):
        super().__init__(message)
        self.problems = problems
        self.comparisons = comparisons


# --- comparison ---------------------------------------------------------------------


def _flat_index(i: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    index = []
    for size in reversed(shape):
        index.append(i % size)
        i //= size
    return tuple(reversed(index))


def _compare_tensors(fused: Any, ref: Any, path: str, rtol: float | None, atol: float | None) -> tuple[OutputComparison | None, str | None]:
    import torch

    if tuple(fused.shape) != tuple(ref.shape):
        return None, (
            f"{path}: shape mismatch: fused {tuple(fused.shape)} (torch.{_dtype_name(fused.dtype)}), "
            f"reference {tuple(ref.shape)} (torch.{_dtype_name(ref.dtype)})"
        )
    kind_f, kind_r = _kind(fused.dtype), _kind(ref.dtype)
    if kind_f != kind_r:
        return None, (
            f"{path}: dtype mismatch: fused is {fused.dtype} ({kind_f}), "
            f"the reference returned {ref.dtype} ({kind_r})"
        )
    rtol_, atol_, source = _resolve_tolerances(fused.dtype, rtol, atol)

    f = fused.detach()
    r = ref.detach()
    if r.device != f.device:
        r = r.to(f.device)
    wide = torch.complex128 if kind_f == "complex" else torch.float64
    fd = f.to(wide)
    rd = r.to(wide)
    numel = f.numel()

    nan_f, nan_r = torch.isnan(fd), torch.isnan(rd)
    inf_any = torch.isinf(fd) | torch.isinf(rd)
    finite = ~(nan_f | nan_r | inf_any)
    zero = torch.zeros((), dtype=torch.float64, device=fd.device)
    diff = torch.where(finite, (fd - rd).abs(), zero)
    ref_abs = torch.where(finite, rd.abs(), zero)
    allowed = atol_ + rtol_ * ref_abs
    if kind_f in ("bool", "integer") and rtol_ == 0 and atol_ == 0:
        close = f == r  # exact, without a detour through float64 (int64 beyond 2**53)
        diff = torch.where(close, zero, torch.where(diff == 0, torch.ones_like(diff), diff))
    else:
        close = (finite & (diff <= allowed)) | (nan_f & nan_r) | (inf_any & ~nan_f & ~nan_r & (fd == rd))
    mismatch = ~close
    mismatches = int(mismatch.sum())

    if numel:
        max_abs = float(diff.max())
        nonzero = ref_abs > 0
        if bool(nonzero.any()):
            max_rel = float((diff[nonzero] / ref_abs[nonzero]).max())
        else:
            max_rel = math.inf if max_abs > 0 else 0.0
        ref_norm = float(torch.linalg.vector_norm(ref_abs))
        diff_norm = float(torch.linalg.vector_norm(diff))
        rel_l2 = diff_norm / ref_norm if ref_norm > 0 else (0.0 if diff_norm == 0 else math.inf)
    else:
        max_abs = max_rel = rel_l2 = 0.0
    nan_extra = int((nan_f & ~nan_r).sum())

    worst_index = worst_fused = worst_ref = worst_as = worst_allowed = None
    if mismatches:
        flat_mismatch = mismatch.reshape(-1)
        nonfinite_bad = flat_mismatch & ~finite.reshape(-1)
        if bool(nonfinite_bad.any()):
            flat = int(nonfinite_bad.nonzero()[0, 0])
        else:
            score = diff.reshape(-1) / allowed.reshape(-1) if atol_ > 0 or rtol_ > 0 else diff.reshape(-1)
            score = torch.where(flat_mismatch, torch.nan_to_num(score, posinf=math.inf), -1.0)
            flat = int(torch.argmax(score))
        worst_index = _flat_index(flat, tuple(f.shape))
        worst_fused = f.reshape(-1)[flat].item()
        worst_ref = r.reshape(-1)[flat].item()
        if kind_f in ("floating point", "complex") and r.dtype != f.dtype:
            worst_as = r.reshape(-1)[flat].to(f.dtype).item()
        if finite.reshape(-1)[flat]:
            worst_allowed = float(allowed.reshape(-1)[flat])

    comparison = OutputComparison(
        path=path,
        shape=tuple(f.shape),
        dtype=_dtype_name(f.dtype),
        numel=numel,
        mismatches=mismatches,
        max_abs_error=max_abs,
        max_rel_error=max_rel,
        rel_l2_error=rel_l2,
        rtol=rtol_,
        atol=atol_,
        tolerance_source=source,
        reference_dtype=_dtype_name(ref.dtype),
        nonfinite_mismatches=int((mismatch & ~finite).sum()),
        nan_where_reference_has_none=nan_extra,
        worst_index=worst_index,
        worst_fused=worst_fused,
        worst_reference=worst_ref,
        worst_reference_as_fused_dtype=worst_as,
        worst_allowed=worst_allowed,
    )
    return comparison, (comparison.describe() if mismatches else None)


def _type_name(x: Any) -> str:
    import torch

    if isinstance(x, torch.Tensor):
        return f"a tensor of shape {tuple(x.shape)}"
    if isinstance(x, dict):
        return f"a dict with keys {sorted(map(repr, x))}"
    if isinstance(x, (list, tuple)):
        return f"a {type(x).__name__} of length {len(x)}"
    return f"{type(x).__name__} {x!r}"


def _as_tensor(x: Any) -> Any:
    import torch

    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, bool):
        return torch.tensor(x)
    if isinstance(x, numbers.Integral):
        return torch.tensor(int(x), dtype=torch.int64)
    if isinstance(x, numbers.Real):
        return torch.tensor(float(x), dtype=torch.float64)
    if isinstance(x, numbers.Complex):
        return torch.tensor(complex(x), dtype=torch.complex128)
    return None


#: How many records (objects walked by their members) one path may pass through.
_MAX_RECORD_DEPTH = 8


def _members(obj: Any) -> dict[str, Any] | None:
    """The named members of a record (docs/numerics.md, "Records"), or None for no record.

    A dataclass's fields; otherwise an object's public, non-callable instance attributes,
    sorted by name.
    """
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: getattr(obj, f.name, None) for f in dataclasses.fields(obj)}
    attrs = getattr(obj, "__dict__", None)
    if not isinstance(attrs, dict):
        return None
    return {k: v for k, v in sorted(attrs.items()) if not k.startswith("_") and not callable(v)}


def _holds_tensor(obj: Any, depth: int, seen: set[int]) -> bool:
    """Whether a tensor is reachable from ``obj`` through containers and at most ``depth`` records."""
    import torch

    if isinstance(obj, torch.Tensor):
        return True
    if id(obj) in seen:
        return False
    seen.add(id(obj))
    if isinstance(obj, dict):
        values = obj.values()
    elif isinstance(obj, (list, tuple)):
        values = obj
    else:
        members = _members(obj) if depth > 0 else None
        if not members:
            return False
        values, depth = members.values(), depth - 1
    return any(_holds_tensor(v, depth, seen) for v in values)


def _compare(fused: Any, ref: Any, path: str, rtol: float | None, atol: float | None,
             comparisons: list[OutputComparison], problems: list[str],
             walked: tuple[tuple[int, int], ...] = ()) -> None:
    """Compare ``fused`` with ``ref`` at ``path``; ``walked``: the id pairs of the records on the path."""
    import torch

    def step(f: Any, r: Any, sub: str, records: tuple[tuple[int, int], ...] = walked) -> None:
        _compare(f, r, sub, rtol, atol, comparisons, problems, records)

    if isinstance(fused, torch.Tensor) or isinstance(ref, torch.Tensor):
        f, r = _as_tensor(fused), _as_tensor(ref)
        if f is None or r is None:
            problems.append(f"{path}: structure mismatch: fused returned {_type_name(fused)}, "
                            f"the reference returned {_type_name(ref)}")
            return
        comparison, problem = _compare_tensors(f, r, path, rtol, atol)
        if comparison is not None:
            comparisons.append(comparison)
        if problem is not None:
            problems.append(problem)
    elif isinstance(fused, dict) and isinstance(ref, dict):
        # A dataclass that is a mapping (transformers' ModelOutput) is compared by its keys,
        # which leave out its None fields, and its keys are spelled as attributes.
        as_fields = dataclasses.is_dataclass(fused) and dataclasses.is_dataclass(ref)
        _compare_members(fused, ref, path, "keys", problems)
        for k in ref:
            if k in fused:
                step(fused[k], ref[k], f"{path}.{k}" if as_fields and isinstance(k, str) else f"{path}[{k!r}]")
    elif isinstance(fused, (list, tuple)) and isinstance(ref, (list, tuple)):
        if len(fused) != len(ref):
            problems.append(f"{path}: structure mismatch: fused returned {_type_name(fused)}, "
                            f"the reference returned {_type_name(ref)}")
            return
        fields = getattr(ref, "_fields", None)
        names = fields if fields is not None and getattr(fused, "_fields", None) == fields else None
        for i, (f, r) in enumerate(zip(fused, ref)):
            step(f, r, f"{path}.{names[i]}" if names else f"{path}[{i}]")
    elif isinstance(fused, (bool, numbers.Number)) and isinstance(ref, (bool, numbers.Number)):
        step(_as_tensor(fused), _as_tensor(ref), path)
    elif fused is None and ref is None:
        return
    elif isinstance(fused, torch.dtype) and isinstance(ref, torch.dtype):
        if _kind(fused) != _kind(ref):  # the reference is float64 by design: compare kinds, as for tensors
            problems.append(f"{path}: dtype mismatch: fused is {fused} ({_kind(fused)}), "
                            f"the reference returned {ref} ({_kind(ref)})")
    elif (type(fused) is type(ref) and len(walked) < _MAX_RECORD_DEPTH
          and _holds_tensor((fused, ref), _MAX_RECORD_DEPTH - len(walked), set())):
        if (id(fused), id(ref)) in walked:
            return  # a cycle: this pair is being compared further up the path
        f_members, r_members = _members(fused), _members(ref)
        _compare_members(f_members, r_members, path, "attributes", problems)
        for name, r in r_members.items():
            if name in f_members:
                step(f_members[name], r, f"{path}.{name}", walked + ((id(fused), id(ref)),))
    elif not _plain_equal(fused, ref):
        problems.append(f"{path}: structure mismatch: fused returned {_type_name(fused)}, "
                        f"the reference returned {_type_name(ref)}")


def _compare_members(fused: dict[Any, Any], ref: dict[Any, Any], path: str, what: str, problems: list[str]) -> None:
    """Report the keys (or attributes) that only one side has."""
    missing = [k for k in ref if k not in fused]
    extra = [k for k in fused if k not in ref]
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"{what} only in the reference: {', '.join(map(repr, missing))}")
        if extra:
            parts.append(f"{what} only in the fused output: {', '.join(map(repr, extra))}")
        problems.append(f"{path}: structure mismatch: {'; '.join(parts)}")


def _plain_equal(a: Any, b: Any) -> bool:
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:
        return False


def assert_matches_reference(
    fused_fn: Callable[..., Any],
    reference_fn: Callable[..., Any],
    *args: Any,
    rtol: float | None = None,
    atol: float | None = None,
    **kwargs: Any,
) -> NumericsResult:
    """Check that ``fused_fn(*args, **kwargs)`` matches ``reference_fn`` run in float64.

    Float64 copies of the inputs are taken first (floating tensors cast, other tensors
    cloned, ``nn.Module`` arguments deep-copied and ``.double()``'d, through nested
    tuples, lists and dicts); then ``fused_fn`` runs on the original arguments and
    ``reference_fn`` on the copies. Each output (a tensor, or tuples/lists/dicts of
    them; dataclasses, named tuples, model outputs and objects such as KV caches are
    walked too, docs/numerics.md "Records") passes where ``|fused - ref| <= atol + rtol * |ref|``, computed in float64,
    with ``rtol``/``atol`` from ``TOLERANCES`` by the fused output's dtype unless given.
    A NaN passes only where the reference has a NaN too; an inf only where the
    reference has the same inf.

    Returns a ``NumericsResult``; raises ``NumericsMismatch`` (an ``AssertionError``)
    describing every output that differs.
    """
    __tracebackhide__ = True
    _check_tolerance("rtol", rtol)
    _check_tolerance("atol", atol)
    memo: dict[int, Any] = {}
    ref_args = _reference_copy(args, memo)
    ref_kwargs = _reference_copy(kwargs, memo)
    import torch

    if isinstance(reference_fn, torch.nn.Module):  # a module reference runs in float64 too
        reference_fn = _reference_copy(reference_fn, memo)

    fused_out = fused_fn(*args, **kwargs)
    try:
        ref_out = reference_fn(*ref_args, **ref_kwargs)
    except Exception as exc:
        exc.add_note("(raised by reference_fn, which assert_matches_reference runs on float64 copies of the inputs)")
        raise

    comparisons: list[OutputComparison] = []
    problems: list[str] = []
    _compare(fused_out, ref_out, "out", rtol, atol, comparisons, problems)
    if problems:
        n = len(problems)
        header = (
            "assert_matches_reference: the fused output does not match the reference"
            if n == 1
            else f"assert_matches_reference: {n} outputs do not match the reference"
        )
        raise NumericsMismatch(header + "\n" + "\n".join(problems), problems, tuple(comparisons))
    return NumericsResult(tuple(comparisons))
