"""What an ATen op launches and moves, seen as it runs (``OpObserver``).

On CPU the observed ops *are* the kernel model (docs/bytes.md): each op that computes,
seen at the bottom of the Python dispatch stack; views, metadata ops and allocations
launch nothing and are skipped; ``.item()`` and cross-device transfers are copies. An op
that calls other ops internally (CPU ``addmm`` calls ``copy_``) is seen once, as the user
called it. On every device the observer gives each op its user ``file:line`` and its
modelled bytes (distinct input storages read, distinct output storages written), and
wraps it in a profiler range so CUDA kernels can be attributed to the op that launched it.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any

from . import _compat
from .budget import Touched, bytes_by_storage, distinct_bytes, storage_key
from .host_syncs import op_sync_reason
from .ranges import OP_RANGE_PREFIX
from .where import user_source

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
        "_record_function_enter",  # profiler ranges (a compiled graph's marker: bytes_model)
        "_record_function_enter_new",
        "_record_function_exit",
    }
)
# Ops that read a value back to the host: a device-to-host copy, not a kernel.
_HOST_READ_OPS = frozenset({"_local_scalar_dense", "item", "equal"})


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
    reads: dict = field(default_factory=dict)  # storage key -> bytes read there
    writes: dict = field(default_factory=dict)  # storage key -> bytes written there
    module: str | None = None  # the nn.Module path that ran it (module_path)
    flops: int | None = None  # op_flops: None when unknown, never 0 for unknown
    flops_estimated: bool = False  # True: one FLOP per element, not a formula
    dtype: str | None = None  # compute dtype (op_dtype): what the roofline's ceiling is
    sync: str | None = None  # why it synchronises a GPU with the host (host_syncs.op_sync_reason)

    @property
    def bytes(self) -> int | None:
        if self.read_bytes is None or self.write_bytes is None:
            return None
        return self.read_bytes + self.write_bytes


_KINDS: dict = {}


def _static_kind(func: Any) -> tuple[str, str | None]:
    """(op name, its kind when the arguments cannot change it, else None), cached per overload."""
    try:
        return _KINDS[func]
    except (KeyError, TypeError):
        pass
    packet = func.overloadpacket.__name__ if hasattr(func, "overloadpacket") else str(func)
    name = packet.split("::")[-1]
    schema = _compat.op_schema(func)
    if getattr(func, "is_view", False) or name in _NO_KERNEL_OPS:
        kind = "none"
    elif schema is not None and schema.returns and all(
        r.alias_info is not None and not r.alias_info.is_write for r in schema.returns
    ):
        kind = "none"  # returns views of its inputs (split, unbind, chunk, ...)
    elif name in _HOST_READ_OPS:
        kind = "copy"
    elif name in _COPY_OPS:
        kind = None  # host transfer, memcpy or kernel: decided by the arguments
    else:
        kind = "kernel"
    try:
        _KINDS[func] = (name, kind)
    except TypeError:
        pass
    return name, kind


_COPY_OPS = frozenset({"copy_", "_to_copy", "clone", "_copy_from", "to"})


def classify_op(func: Any, args: tuple, kwargs: dict) -> str:
    """'kernel', 'copy' or 'none' for an ATen overload about to run on ``args``."""
    import torch

    name, kind = _static_kind(func)
    if kind is not None:
        return kind
    tensors = _flat_tensors(args) + _flat_tensors(kwargs)
    if name in _COPY_OPS:
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


def flat_instances(obj: Any, cls: type | tuple[type, ...]) -> list:
    """Every ``cls`` instance inside ``obj``, through nested lists, tuples and dict values."""
    if isinstance(obj, cls):
        return [obj]
    if isinstance(obj, dict):
        return [x for v in obj.values() for x in flat_instances(v, cls)]
    if isinstance(obj, (list, tuple)):
        return [x for v in obj for x in flat_instances(v, cls)]
    return []


def _flat_tensors(obj: Any) -> list:
    import torch

    return flat_instances(obj, torch.Tensor)


def op_traffic(func: Any, args: tuple, kwargs: dict, out: Any) -> tuple[int, int]:
    """(bytes read, bytes written) of one op: distinct input and output storages.

    Arguments the schema marks as written (``out=`` buffers, the ``self`` of an in-place
    op) count as outputs; an in-place op's ``self`` is also read. Returned tensors that
    alias a written argument are not counted twice.
    """
    reads, writes = op_tensors(func, args, kwargs, out)
    return distinct_bytes(reads), distinct_bytes(writes)


def op_tensors(func: Any, args: tuple, kwargs: dict, out: Any) -> tuple[list, list]:
    """The tensors one op reads and writes (see ``op_traffic``)."""
    reads: list = []
    writes: list = []
    arguments = _schema_arguments(func)
    if arguments is not None:
        for i, (arg_name, written, kwarg_only) in enumerate(arguments):
            value = args[i] if i < len(args) else kwargs.get(arg_name)
            tensors = _flat_tensors(value)
            if written:
                writes += tensors
                if not kwarg_only:
                    reads += tensors  # in-place: read-modify-write
            else:
                reads += tensors
    else:
        reads = _flat_tensors(args) + _flat_tensors(kwargs)
    returned = _flat_tensors(out)
    name = getattr(getattr(func, "overloadpacket", None), "__name__", "")
    if name in _GATHER_OPS and returned:
        reads = _gather_reads(name, args, kwargs, returned)
    rule = _PARTIAL_TOUCH.get(name)
    if rule is not None:
        try:
            touched = rule(args, kwargs, returned)
        except Exception:  # arguments the rule does not know: the whole-storage figure stays
            touched = None
        if touched is not None:
            return touched
    if name in _WRITE_ONLY_SELF and writes:
        written = {id(t) for t in writes}
        reads = [t for t in reads if id(t) not in written]
    if writes:
        written_keys = {storage_key(t) for t in writes}
        writes += [t for t in returned if storage_key(t) not in written_keys]
    else:
        writes = returned
    return reads, writes


_SCHEMAS: dict = {}


def _schema_arguments(func: Any) -> list[tuple[str, bool, bool]] | None:
    """(name, written, keyword-only) of each schema argument of ``func``, cached per overload
    (the observer asks once per op call; BENCHMARKS.md, "Overhead of a profiled region")."""
    try:
        return _SCHEMAS[func]
    except (KeyError, TypeError):
        pass
    schema = _compat.op_schema(func)
    arguments = None
    if schema is not None:
        written = {a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write}
        arguments = [(a.name, a.name in written, a.kwarg_only) for a in schema.arguments]
    try:
        _SCHEMAS[func] = arguments
    except TypeError:  # an unhashable stand-in: not cached
        pass
    return arguments


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



# In-place ops that overwrite their ``self`` without reading it: fills, random fills,
# copies into it (docs/bytes.md, "Ops that touch part of a tensor").
_WRITE_ONLY_SELF = frozenset(
    {
        "fill_", "zero_", "copy_", "normal_", "uniform_", "random_", "exponential_", "geometric_",
        "log_normal_", "cauchy_", "bernoulli_", "_foreach_zero_", "_foreach_copy_", "index_fill_",
    }
)


def _arg(args: tuple, kwargs: dict, i: int, name: str, default: Any = None) -> Any:
    return args[i] if len(args) > i else kwargs.get(name, default)


def _nll_loss_forward(args: tuple, kwargs: dict, returned: list) -> tuple[list, list]:
    """``nll_loss_forward(self, target, weight, reduction, ignore_index)``: reads the
    targets and, of the log-probabilities and weights, one element per target."""
    logp, target, weight = args[0], args[1], _arg(args, kwargs, 2, "weight")
    reads = [target, Touched(logp, target.numel())]
    if weight is not None:
        reads.append(Touched(weight, target.numel()))
    return reads, returned


def _nll_loss_backward(args: tuple, kwargs: dict, returned: list) -> tuple[list, list]:
    """``nll_loss_backward(grad_output, self, target, weight, reduction, ignore_index,
    total_weight)``: writes a gradient the size of ``self`` (zeros, one element per target
    set), reading the output gradient, targets, weights per target and total weight; ``self``
    itself only gives the shape."""
    grad_out, target = args[0], args[2]
    weight, total = _arg(args, kwargs, 3, "weight"), _arg(args, kwargs, 6, "total_weight")
    reads = [grad_out, target] + ([Touched(weight, target.numel())] if weight is not None else [])
    return reads + ([total] if total is not None else []), returned


def _index_add(args: tuple, kwargs: dict, returned: list) -> tuple[list, list]:
    """``index_add_(self, dim, index, source)``: reads index and source, and reads and
    writes as much of ``self`` as ``source`` holds (the rows it adds into)."""
    target, index, source = args[0], args[2], args[3]
    part = Touched(target, source.numel())
    return [index, source, part], [part] + [t for t in returned if t is not target]


def _scatter(accumulate: bool):
    """``scatter_(self, dim, index, src | value)`` and ``scatter_add_`` / ``scatter_reduce_``:
    one element of ``self`` per index element, read too when the op accumulates; of a
    tensor ``src``, one element per index element."""

    def rule(args: tuple, kwargs: dict, returned: list) -> tuple[list, list]:
        target, index = args[0], args[2]
        src = _arg(args, kwargs, 3, "src")
        part = Touched(target, index.numel())
        reads = [index] + ([Touched(src, index.numel())] if hasattr(src, "numel") and hasattr(src, "dtype") else [])
        return reads + ([part] if accumulate or _arg(args, kwargs, 4, "reduce") is not None else []), [part]

    return rule


def _index_put(args: tuple, kwargs: dict, returned: list) -> tuple[list, list]:
    """``index_put_(self, indices, values, accumulate)``: reads the indices and values, and
    writes (reads too when accumulating) the elements the indices select: the indices'
    broadcast count times the size of the dimensions they leave whole (a boolean mask
    counts every element it covers: an upper bound)."""
    import torch

    target, indices, values = args[0], list(args[1]), args[2]
    accumulate = bool(_arg(args, kwargs, 3, "accumulate", False))
    given = [t for t in indices if t is not None]
    shapes = []
    indexed = 1
    dim = 0
    for t in indices:
        if t is None:
            dim += 1
            continue
        span = t.dim() if t.dtype == torch.bool else 1
        for d in range(dim, dim + span):
            indexed *= target.shape[d]
        shapes.append(t.shape if t.dtype != torch.bool else (t.numel(),))
        dim += span
    points = torch.broadcast_shapes(*shapes).numel() if shapes else 1
    part = Touched(target, points * (target.numel() // max(indexed, 1)))
    reads = given + [values] + ([part] if accumulate else [])
    return reads, [part]


def _embedding_bag(args: tuple, kwargs: dict, returned: list) -> tuple[list, list]:
    """``_embedding_bag(weight, indices, offsets, ...)``: reads the indices, offsets,
    per-sample weights and one row of the table per index."""
    weight, indices = args[0], args[1]
    row = weight.numel() // max(weight.shape[0], 1)
    rest = [t for t in list(args[2:]) + list(kwargs.values()) if hasattr(t, "untyped_storage")]
    return [indices, Touched(weight, indices.numel() * row)] + rest, returned


def _fused_optimizer(args: tuple, kwargs: dict, returned: list) -> tuple[list, list]:
    """``_fused_adam(w)_`` / ``_fused_sgd_``: the schema marks the gradients as written, but
    the kernel writes them back only to unscale them (``grad_scale`` given); else it reads
    them. Parameters and optimizer state are read and written; step counters read."""
    tensors = [_flat_tensors(a) for a in args]
    params, grads, states = tensors[0], tensors[1], [t for group in tensors[2:] for t in group]
    scaled = kwargs.get("grad_scale") is not None
    extra = [t for t in (kwargs.get("grad_scale"), kwargs.get("found_inf")) if t is not None]
    written = params + (grads if scaled else []) + [t for t in states if t.is_floating_point() and t.numel() > 1]
    return params + grads + states + extra, written


# Ops that touch part of a tensor they are given, by op name: fn(args, kwargs, returned)
# -> (reads, writes); docs/bytes.md lists each.
_PARTIAL_TOUCH: dict[str, Any] = {
    "nll_loss_forward": _nll_loss_forward,
    "nll_loss2d_forward": _nll_loss_forward,
    "nll_loss_backward": _nll_loss_backward,
    "nll_loss2d_backward": _nll_loss_backward,
    "index_add_": _index_add,
    "scatter_": _scatter(False),
    "scatter_add_": _scatter(True),
    "scatter_reduce_": _scatter(True),
    "index_put_": _index_put,
    "_index_put_impl_": _index_put,
    "_embedding_bag": _embedding_bag,
    "_embedding_bag_forward_only": _embedding_bag,
    "embedding_bag": _embedding_bag,
    "_fused_adam_": _fused_optimizer,
    "_fused_adamw_": _fused_optimizer,
    "_fused_sgd_": _fused_optimizer,
}


# --------------------------------------------------------------------------- FLOPs

# Ops that only move, select or fill data: 0 FLOP, a known figure (docs/roofline.md).
_ZERO_FLOP_OPS = frozenset(
    {
        "copy_", "_to_copy", "clone", "contiguous", "_copy_from", "_copy_from_and_resize",
        "cat", "stack", "index_select", "gather", "take", "index", "_unsafe_index",
        "embedding", "index_put", "index_put_", "_unsafe_index_put", "_index_put_impl_",
        "scatter", "scatter_", "select_scatter", "slice_scatter", "diagonal_scatter",
        "as_strided_scatter", "masked_scatter", "masked_scatter_", "masked_select",
        "fill", "fill_", "zero_", "zeros", "zeros_like", "ones", "ones_like", "full",
        "full_like", "new_zeros", "new_ones", "new_full", "scalar_tensor",
        "constant_pad_nd", "reflection_pad1d", "reflection_pad2d", "reflection_pad3d",
        "replication_pad1d", "replication_pad2d", "replication_pad3d",
        "repeat", "repeat_interleave", "roll", "flip", "tril", "triu", "tril_", "triu_",
        "masked_fill", "masked_fill_", "where", "expand_copy", "permute_copy",
        "transpose_copy", "t_copy", "view_copy", "unsqueeze_copy", "squeeze_copy",
        "narrow_copy", "slice_copy", "select_copy", "split_copy", "unbind_copy",
        "_reshape_copy", "pixel_shuffle", "pixel_unshuffle", "channel_shuffle",
        "native_channel_shuffle", "unfold_copy", "im2col", "col2im",
    }
)


def _mm_flops(a: Any, b: Any) -> int:
    return 2 * a.shape[0] * a.shape[-1] * (b.shape[-1] if b.dim() > 1 else 1)


# Matmul-class ops torch's registry lacks (or names differently): exact formulas, called
# as fn(args, kwargs, out). Aliases reuse torch's formula under another op's name.
_OWN_FORMULAS: dict[str, Any] = {
    "mv": lambda a, k, o: _mm_flops(a[0], a[1]),  # 2*M*N
    "addmv": lambda a, k, o: _mm_flops(a[1], a[2]),
    "dot": lambda a, k, o: 2 * a[0].numel(),
    "vdot": lambda a, k, o: 2 * a[0].numel(),
    "addbmm": lambda a, k, o: 2 * a[1].shape[0] * a[1].shape[1] * a[1].shape[2] * a[2].shape[2],
}
_ALIASES = {
    "_addmm_activation": "aten::addmm",  # addmm with a fused relu/gelu epilogue
    "_scaled_dot_product_flash_attention_for_cpu": "aten::_scaled_dot_product_flash_attention",
}
_ALIAS_ARITY = {"_addmm_activation": 3, "_scaled_dot_product_flash_attention_for_cpu": 3}

_FLOP_RULES: dict = {}


def _flop_rule(func: Any) -> tuple[str, Any]:
    """How one overload's FLOPs are found, cached per overload: ``("formula", fn)``,
    ``("zero", None)`` or ``("estimate", None)``."""
    try:
        return _FLOP_RULES[func]
    except (KeyError, TypeError):
        pass
    from ._compat import flop_formulas

    name = _static_kind(func)[0]
    qualified = getattr(_compat.op_schema(func), "name", None) or f"aten::{name}"
    if not qualified.startswith("aten::"):
        name = ""  # another namespace's op: only torch's registry may know it
    formulas = flop_formulas()
    rule: tuple[str, Any]
    if qualified in formulas:
        torch_formula = formulas[qualified]
        rule = ("formula", lambda a, k, o: torch_formula(*a, **k, out_val=o))
    elif name in _ALIASES and _ALIASES[name] in formulas:
        alias, arity = formulas[_ALIASES[name]], _ALIAS_ARITY[name]
        rule = ("formula", lambda a, k, o: alias(*a[:arity], out_val=o))
    elif name in _OWN_FORMULAS:
        rule = ("formula", _OWN_FORMULAS[name])
    elif name in _ZERO_FLOP_OPS:
        rule = ("zero", None)
    else:
        rule = ("estimate", None)
    try:
        _FLOP_RULES[func] = rule
    except TypeError:
        pass
    return rule


def op_flops(func: Any, args: tuple, kwargs: dict, out: Any, reads: list, writes: list) -> tuple[int | None, bool]:
    """``(FLOPs, estimated)`` of one computing op (docs/roofline.md).

    Matmul-class ops (mm, addmm, bmm, baddbmm, convolution, SDPA, ...) get the exact
    figure of torch's own formulas (``torch.utils.flop_counter``: 2*M*N*K for a GEMM; a
    bias add and a causal mask are not counted, as torch counts). Ops that only move or
    fill data get 0. Any other op that reads or writes floating-point tensors gets an
    *estimate*, one FLOP per element of the larger of its output and its largest input (an
    elementwise op's output, a reduction's input), flagged ``estimated``. Anything else
    (integer-only work, a formula that fails) is ``None``: unknown, never 0.
    """
    kind, formula = _flop_rule(func)
    if kind == "formula":
        try:
            value = formula(args, kwargs, out)
            return (int(value), False) if value is not None and value >= 0 else (None, False)
        except Exception:
            return None, False
    if kind == "zero":
        return 0, False
    floating_in = [t.numel() for t in reads if t.is_floating_point() or t.is_complex()]
    floating_out = [t.numel() for t in writes if t.is_floating_point() or t.is_complex()]
    if not floating_in and not floating_out:
        return None, False
    return max(sum(floating_out), max(floating_in, default=0)), True


def op_dtype(func: Any, reads: list, writes: list) -> str | None:
    """The dtype an op computes in (its first floating-point input, else output):
    ``"float32"``, ``"bfloat16"``, ... and ``"tf32"`` for a float32 matmul or convolution
    on CUDA when torch lets cuBLAS / cuDNN use TF32 (the ceiling is then TF32's)."""
    tensor = next((t for t in reads if t.is_floating_point()), None)
    if tensor is None:
        tensor = next((t for t in writes if t.is_floating_point()), None)
    if tensor is None:
        return None
    dtype = str(tensor.dtype).removeprefix("torch.")
    if dtype == "float32" and tensor.device.type == "cuda" and _flop_rule(func)[0] == "formula":
        import torch

        name = _static_kind(func)[0]
        try:
            conv = "conv" in name
            allowed = torch.backends.cudnn.allow_tf32 if conv else torch.backends.cuda.matmul.allow_tf32
        except Exception:
            allowed = False
        if allowed:
            return "tf32"
    return dtype


def module_names(roots: list[Any], names: dict[int, str] | None = None) -> dict[int, str]:
    """``id(module) -> path`` for every submodule of ``roots`` (``layers.2.mlp.down_proj``;
    a root itself is named by its class), added to ``names``; each parameter's id maps to
    its module's path too. A root that is a submodule
    of another root is named by its path in that one: roots are taken largest first."""
    names = {} if names is None else names
    unwrapped = [getattr(root, _compat.COMPILED_MODULE_ATTR, root) for root in roots]  # torch.compile's wrapper: its model
    sized = sorted(unwrapped, key=lambda m: -sum(1 for _ in m.modules()))
    for root in sized:
        if id(root) in names:
            continue  # already named inside a larger root
        for name, module in root.named_modules():
            # a compiled submodule's wrapper and the module it wraps share one path
            path = ".".join(part for part in name.split(".") if part != _compat.COMPILED_MODULE_ATTR) if name else ""
            names.setdefault(id(module), path or type(root).__name__)
            for param in module.parameters(recurse=False):  # whose gradient a backward accumulates
                names.setdefault(id(param), path or type(root).__name__)
    return names


# Frames whose ``self`` is the nn.Module being run: its forward, and nn.Module's call
# wrapper (which holds the module even when a decorator wraps the forward).
_MODULE_FRAMES = frozenset({"forward", "_call_impl", "_wrapped_call_impl"})


def module_path(names: dict[int, str], max_depth: int = 200, stop: Any = None) -> str | None:
    """The path of the innermost ``nn.Module`` running on the call stack: the module that
    launched the op being observed (docs/architecture.md, "Modules and lines").

    Paths are those of ``names`` (the modules the profiled callable captures, by
    ``module_names``); a module outside them is named inside the outermost module on the
    stack, the model the call ran (found without the caller passing it), and ``names`` is
    extended with that model's paths. The walk ends at the frame ``stop`` (the capture's
    own: nothing above it ran inside the profiled call)."""
    import torch

    frame = sys._getframe(1)
    depth = 0
    running: list = []  # innermost first
    while frame is not None and depth < max_depth:
        if frame.f_code.co_name in _MODULE_FRAMES:
            owner = frame.f_locals.get("self")
            if isinstance(owner, torch.nn.Module) and (not running or running[-1] is not owner):
                if id(owner) in names:
                    return names[id(owner)]
                running.append(owner)
        if frame is stop:
            break
        frame = frame.f_back
        depth += 1
    if not running:
        return None
    module_names([running[-1]], names)
    # a module outside the model's tree (a library's function wrapped as a module): the
    # innermost one inside it
    return next((names[id(m)] for m in running if id(m) in names), None)


class ForwardOps(dict):
    """Autograd sequence number -> (module path, source) of the forward op that recorded that
    node (or None: taken by an op that launches nothing), kept across captures so that a
    backward profiled apart from its forward still finds its origin. Sequence numbers grow
    per thread; past ``limit`` entries the oldest half is dropped."""

    def __init__(self, limit: int = 1 << 20) -> None:
        super().__init__()
        self.limit = limit

    def setdefault(self, key: int, value: Any = None) -> Any:
        if len(self) >= self.limit:
            for old in sorted(self)[: self.limit // 2]:
                del self[old]
        return super().setdefault(key, value)


FORWARD_OPS = ForwardOps()

_observer_class: Any = None


def make_op_observer(record_ranges: bool = True):
    """A ``TorchDispatchMode`` that records every ATen op (see ``OpRecord``).

    It declares ``ignore_compile_internals`` so that ``torch.compile`` keeps compiling
    under it: the mode is off while Dynamo and Inductor compile and on while the compiled
    code runs, where it sees the extern ops (``mm``, ``addmm``) Inductor calls. The class
    is built once per process (torch is imported late), an instance per capture.
    """
    global _observer_class
    if _observer_class is None:
        _observer_class = _build_observer_class()
    return _observer_class(record_ranges)


def _build_observer_class() -> Any:
    import torch

    from ._compat import TorchDispatchMode, backward_node, next_sequence_nr
    from .sources.bytes_model import resolve_stack, wrapper_origin

    from ._compat import fast_range as op_range

    class OpObserver(TorchDispatchMode):
        @classmethod
        def ignore_compile_internals(cls) -> bool:
            return True

        def __init__(self, record_ranges: bool) -> None:
            super().__init__()
            self.record_ranges = record_ranges
            self.records: list[OpRecord] = []
            self.paused = 0
            self.modules: dict[int, str] = {}  # id(module) -> its path in the profiled model
            self.param_reads: dict = {}  # storage key -> bytes, of the nn.Parameter objects ops read
            self.forward_ops = FORWARD_OPS  # a backward op's origin, across captures
            self.stop_frame: Any = None  # where the capture's callable was called from
            self.running: int | None = None  # the record whose op is executing (a custom op's Triton launches)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if self.paused:
                return func(*args, **kwargs)
            kind = classify_op(func, args, kwargs)
            node = backward_node()
            backward = node[0] if node is not None else None
            if kind == "none":
                if backward is None:
                    self._forward_op(None)
                return func(*args, **kwargs)
            index = len(self.records)
            op = str(func.overloadpacket.__name__) if hasattr(func, "overloadpacket") else str(func)
            origin = self.forward_ops.get(backward) if backward is not None else None
            if node is not None and origin is None and node[1] is not None:
                # a gradient accumulated into a parameter: the module that owns it
                origin = (self.modules.get(id(node[1])), None)
            source = (origin[1] if origin else None) or user_source(2)
            t0 = time.perf_counter_ns()
            self.running = index
            try:
                if self.record_ranges:
                    with op_range(f"{OP_RANGE_PREFIX}{index}"):
                        out = func(*args, **kwargs)
                else:
                    out = func(*args, **kwargs)
            finally:
                self.running = None
            wall = time.perf_counter_ns() - t0
            flops, estimated, dtype = None, False, None
            try:
                reads, writes = op_tensors(func, args, kwargs, out)
                storages = (bytes_by_storage(reads), bytes_by_storage(writes))
                params = [t for t in reads if isinstance(t, torch.nn.Parameter)]
                if params:
                    self.param_reads.update(bytes_by_storage(params))
                read_b, write_b = sum(storages[0].values()), sum(storages[1].values())
                if kind == "kernel":  # copies carry no FLOP figure
                    flops, estimated = op_flops(func, args, kwargs, out, reads, writes)
                    dtype = op_dtype(func, reads, writes)
            except Exception:  # exotic tensors (sparse, nested): unmodelled, count kept
                read_b, write_b, storages = None, None, ({}, {})
            namespace = getattr(func, "namespace", None) or "aten"  # a custom op keeps its own (mylib::fused)
            record = OpRecord(index, f"{namespace}::{op}", kind, read_b, write_b, source, wall, *storages)
            record.flops, record.flops_estimated, record.dtype = flops, estimated, dtype
            record.sync = op_sync_reason(op, args, kwargs)
            # an extern kernel of a compiled graph: the module its wrapper call ran for; a
            # backward op: its forward op's; else the module running on the stack
            if origin:
                record.module = origin[0]
            else:
                compiled = wrapper_origin(sys._getframe(1))
                if compiled is not None:
                    record.module = resolve_stack(compiled[0], self.modules)
                    record.source = compiled[1] or record.source
                else:
                    record.module = module_path(self.modules, stop=self.stop_frame)
            if backward is None:
                self._forward_op((record.module, source))
            self.records.append(record)
            return out

        def _forward_op(self, origin: tuple[str | None, str | None] | None) -> None:
            """Remember the module and line of the forward op that recorded the latest
            autograd node (the first op dispatched after the node was made is its op)."""
            seq = next_sequence_nr()
            if seq is not None and seq > 0:
                self.forward_ops.setdefault(seq - 1, origin)

    return OpObserver


@dataclass
class TritonLaunch:
    """One direct Triton launch seen by the launcher hook: name, modelled bytes, user line."""

    index: int
    name: str
    bytes: int | None
    source: str | None
    wall_ns: int = 0
    interpreted: bool = False
    flops: int | None = None  # what its launch_metadata declares, else unknown
    dtype: str | None = None  # its first floating-point tensor argument's dtype
    module: str | None = None  # the nn.Module running on the stack at the launch (module_path)
    inside_op: int | None = None  # the observed op (a custom op) whose implementation made the launch, if any
