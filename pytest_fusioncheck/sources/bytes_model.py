"""Where modelled bytes come from for kernels the op observer cannot see.

Eager ATen ops get their bytes from ``ops.op_traffic`` (distinct input and output
storages, observed as the op runs). Two other sources live here:

* Inductor-generated kernels: their *compulsory* bytes, taken at code generation from the
  kernel's argument table, the same rule for Triton (CUDA) and C++ (CPU) kernels: each
  buffer the kernel reads counted once, each buffer it writes counted once, an in-place
  buffer once each way. That is the DRAM traffic of a kernel whose re-reads stay on chip
  (a looped reduction's second pass over a row is served by the cache), see
  ``docs/bytes.md``. Inductor's own estimate (``estimate_kernel_num_bytes()``, what its
  benchmark harness reports as ``kernel_num_gb``) is kept beside it as
  ``Kernel.bytes_estimate``. Codegen is skipped when a graph comes from Inductor's
  on-disk cache, so ``inductor_hooks`` also turns the FX graph and AOTAutograd caches
  off while it is open: recompiling costs time, but every kernel then has a figure.
* Triton kernels launched directly: the ``"bytes"`` their ``launch_metadata`` declares,
  else the distinct bytes of their tensor arguments and of the tensors behind their TMA
  descriptors; a launch with neither is unmodelled (``None``). Their FLOPs are only what
  the metadata declares (``"flops"``), else unknown.
"""

from __future__ import annotations

import contextlib
import re
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Iterator

from .. import _compat
from ..ranges import GRAPH_RANGE_PREFIX

@dataclass
class KernelFigures:
    """What code generation knew of one generated kernel of one graph."""

    bytes: int | None = None  # compulsory bytes
    estimate: int | None = None  # Inductor's own estimate
    # the nn_module_stack (stack_entries) of each call site Inductor generated it for
    stacks: list = field(default_factory=list)
    origins: list = field(default_factory=list)  # ATen ops it was fused from
    flops: tuple | None = None  # (FLOPs, estimated)
    source: str | None = None  # the model's file:line of its ops (FX stack traces)

    def module(self, names: dict[int, str] | None = None) -> str | None:
        """The module path its ops came from (``resolve_stack`` with ``names``); a kernel
        reused at several call sites gets their paths' common form (``merge_module_paths``)."""
        path = None
        for i, entries in enumerate(self.stacks):
            one = resolve_stack(entries, names)
            if one is None:
                continue
            path = one if i == 0 or path is None else merge_module_paths(path, one)
        return path


class InductorKernels:
    """Figures of Inductor-generated kernels keyed by (graph, kernel name): kernel names
    restart in every graph (``triton_poi_fused_add_mul_0`` in two graphs is two kernels),
    so a launch is looked up under the graph its wrapper call ran in (``graph_range``
    markers), the latest graph of that name standing in where the graph is not known."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_graph: dict[tuple[Any, str], KernelFigures] = {}
        self._latest: dict[str, KernelFigures] = {}
        self._host_reads: dict[Any, list[tuple[str, str | None]]] = {}

    def get(self, name: str, graph: Any = None) -> KernelFigures | None:
        with self._lock:
            if graph is not None and (graph, name) in self._by_graph:
                return self._by_graph[(graph, name)]
            return self._latest.get(name)

    def record(self, names: list[str], graph: Any, figures: KernelFigures) -> None:
        """Remember ``figures`` for ``names`` in ``graph``. A kernel Inductor reuses at several
        call sites of one graph gets their modules' common path (``merge_module_paths``)."""
        with self._lock:
            for n in names:
                previous = self._by_graph.get((graph, n)) if graph is not None else None
                entry = KernelFigures(**vars(figures))
                if previous is not None:
                    entry.stacks = previous.stacks + figures.stacks
                if graph is not None:
                    self._by_graph[(graph, n)] = entry
                self._latest[n] = entry


    def record_host_reads(self, graph: Any, reads: list[tuple[str, str | None]]) -> None:
        """The ops of ``graph`` that read a device value into the host ((op, user line)):
        a scalar captured in the graph (``capture_scalar_outputs``), which Inductor's GPU
        wrapper reads with ``.item()`` and its CPU code reads in place (host_syncs.py)."""
        with self._lock:
            self._host_reads[graph] = list(reads)

    def host_reads(self, graph: Any) -> list[tuple[str, str | None]]:
        with self._lock:
            return list(self._host_reads.get(graph, ()))


KERNELS = InductorKernels()


def graph_host_reads(graph: Any) -> list[tuple[str, str | None]]:
    return KERNELS.host_reads(graph)


def _figure(name: str, graph: Any, attr: str) -> Any:
    entry = KERNELS.get(name, graph)
    return getattr(entry, attr) if entry is not None else None


def inductor_kernel_bytes(name: str, graph: Any = None) -> int | None:
    """The compulsory bytes of a generated kernel, by its name as the profiler shows it."""
    return _figure(name, graph, "bytes")


def inductor_kernel_estimate(name: str, graph: Any = None) -> int | None:
    """Inductor's own byte estimate of a generated kernel (``None`` if it gave none)."""
    return _figure(name, graph, "estimate")


def inductor_kernel_module(name: str, graph: Any = None, names: dict[int, str] | None = None) -> str | None:
    """The ``nn.Module`` path a generated kernel's ops came from (``mlp.c_fc``), if recorded;
    ``names`` (``ops.module_names``) spells it as the profiled model's ``named_modules``."""
    entry = KERNELS.get(name, graph)
    return entry.module(names) if entry is not None else None


def inductor_kernel_source(name: str, graph: Any = None) -> str | None:
    """The model's ``file:line`` a generated kernel's ops were traced from, if recorded."""
    return _figure(name, graph, "source")


def inductor_kernel_flops(name: str, graph: Any = None) -> tuple[int | None, bool]:
    """(FLOPs, estimated) of a generated kernel (docs/roofline.md), ``(None, False)`` if unknown."""
    return _figure(name, graph, "flops") or (None, False)


def inductor_kernel_origins(name: str, graph: Any = None) -> list[str]:
    """The ATen ops a generated kernel was fused from (``["add", "gelu"]``), if recorded."""
    return list(_figure(name, graph, "origins") or [])


def _record(names: list[str], nbytes: int | None, origins: list[str] | None = None, estimate: int | None = None,
            stack: tuple | None = None, scope: Any = None, flops: tuple[int, bool] | None = None,
            source: str | None = None) -> None:
    """Remember what codegen knows of kernels ``names`` in the graph ``scope``."""
    KERNELS.record(names, scope, KernelFigures(
        bytes=int(nbytes) if nbytes is not None else None, estimate=int(estimate) if estimate is not None else None,
        stacks=[stack] if stack else [], origins=list(origins or []), flops=flops, source=source,
    ))


def compulsory_bytes(buffers: list[tuple[str, int]]) -> int:
    """Sum of ``(access, nbytes)`` with access ``"r"``, ``"w"`` or ``"rw"``: each way once.

    The pure arithmetic behind the compulsory rule (``docs/bytes.md``): a buffer read
    counts its size once however often the kernel loads it, a written one once, an
    in-place one twice (read, then written).
    """
    total = 0
    for access, nbytes in buffers:
        if access not in ("r", "w", "rw"):
            raise ValueError(f"access must be 'r', 'w' or 'rw', got {access!r}")
        total += nbytes * (2 if access == "rw" else 1)
    return total


def kernel_arg_buffers(args: Any, nodes: Any = ()) -> list[tuple[str, int]]:
    """``(access, nbytes)`` of each buffer in an Inductor kernel's argument table.

    ``args`` is a ``KernelArgs`` (``input_buffers``, ``output_buffers``,
    ``inplace_buffers``); sizes come from the graph being lowered (``V.graph``), with
    symbolic sizes at their hints. Removed arguments (buffers fused away) are skipped.
    ``nodes`` are the kernel's scheduler nodes: a buffer larger than the kernel's
    iteration space (a gathered embedding table, a sliced input) counts only what the
    kernel's distinct access patterns can reach (``touched_elements``).
    """
    graph = _compat.codegen_graph()
    hint = graph.sizevars.optimization_hint
    accesses, points = _access_patterns(nodes, hint)
    produced = {dep.name for node in nodes or () for dep in getattr(getattr(node, "read_writes", None), "writes", ())}
    internal = _internal_buffers(args, nodes)

    def size(name: str) -> int:
        numel = int(hint(graph.get_numel(name), fallback=0))
        patterns = accesses.get(name, ())
        count = 0 if _WHOLE in patterns else len(patterns)
        return touched_elements(numel, count, points) * _compat.inductor_dtype_size(graph.get_dtype(name))

    return buffer_accesses(args, size, produced, internal)


def _internal_buffers(args: Any, nodes: Any) -> set[str]:
    """Output buffers that only this kernel's own nodes read and that are not the graph's
    outputs: the C++ backend keeps such an intermediate (a wide row's exponentials in a
    softmax) as an argument where the Triton backend removes it; it never leaves the
    kernel's working set, so it is not compulsory traffic. Unknown: none are internal."""
    try:
        graph = _compat.codegen_graph()
        members: set[str] = set()
        for node in nodes or ():
            for part in getattr(node, "get_nodes", lambda: [node])():
                if hasattr(part, "get_name"):
                    members.add(part.get_name())
        outputs = set(graph.get_output_names())
        name_to_buf = graph.scheduler.name_to_buf
        internal = set()
        for name in getattr(args, "output_buffers", {}) or {}:
            buf = name_to_buf.get(name)
            if buf is None or name in outputs or not buf.users:
                continue
            users = {getattr(u.node, "get_name", lambda: None)() for u in buf.users}
            if users <= members:
                internal.add(name)
        return internal
    except Exception:
        return set()


_WHOLE = "<whole buffer>"


def touched_elements(buffer_numel: int, patterns: int, points: int) -> int:
    """Elements of a buffer a kernel can touch: all of it, unless it is larger than the
    kernel's iteration space (``points``), when each distinct access pattern reaches at
    most one element per point. Unknown patterns or points: the whole buffer."""
    if points <= 0 or patterns <= 0 or buffer_numel <= points:
        return buffer_numel
    return min(buffer_numel, patterns * points)


def _access_patterns(nodes: Any, hint: Any) -> tuple[dict[str, set], int]:
    """Buffer name -> distinct access indices over ``nodes``, and the kernel's iteration
    space (the largest product of a node's loop sizes)."""
    accesses: dict[str, set] = {}
    points = 0
    for node in nodes or ():
        rw = getattr(node, "read_writes", None)
        if rw is None:
            continue  # loop markers of a Triton node schedule
        for dep in list(rw.reads) + list(rw.writes):
            try:
                index = dep.index
            except Exception:  # StarDep / WeakDep: no index, so the whole buffer
                index = _WHOLE
            accesses.setdefault(dep.name, set()).add(index)
        group = getattr(node, "group", None)
        try:
            points = max(points, _product(group[1], hint) if group is not None else 0)
        except Exception:  # an iteration space we cannot size: leave points as they are
            continue
    return accesses, points


def _product(sizes: Any, hint: Any) -> int:
    """Product of loop sizes, nested as Inductor groups them (``((64, 64), ())`` on CPU)."""
    if isinstance(sizes, (tuple, list)):
        total = 1
        for part in sizes:
            total *= _product(part, hint)
        return total
    return int(hint(sizes, fallback=0))


def buffer_accesses(args: Any, size: Any, produced: set[str] | None = None, internal: set[str] = frozenset()) -> list[tuple[str, int]]:
    """The compulsory-rule reading of an argument table (see ``kernel_arg_buffers``).

    An in-place buffer whose first name the kernel itself produces (Inductor stores a
    value, then overwrites it with the next fused op's result: ``in_out_ptr``) is
    written once; one that held data before the kernel is read once and written once.
    ``produced`` names the buffers the kernel's nodes write (without it, the output
    table stands in; Triton kernels drop such buffers from it). A buffer both in the
    input and the output table (a mutated graph input) is read once and written once.
    Buffers in ``internal`` (produced and consumed inside the kernel) are not counted.
    """

    def removed(value: Any) -> bool:
        return type(value).__name__ == "RemovedArg" or str(value) == "REMOVED"

    inputs = {k for k, v in (getattr(args, "input_buffers", {}) or {}).items() if not removed(v)}
    outputs = {k for k, v in (getattr(args, "output_buffers", {}) or {}).items() if not removed(v) and k not in internal}
    inplace = getattr(args, "inplace_buffers", {}) or {}
    out: list[tuple[str, int]] = []
    seen: set[str] = set()
    for value in {id(v): v for v in inplace.values()}.values():
        if removed(value):
            continue
        names = list(getattr(value, "other_names", []) or [])
        if not names or names[-1] in seen:
            continue
        seen.update(names)
        made = produced if produced else outputs
        produced_here = names[0] in made and names[0] not in inputs
        out.append(("w" if produced_here else "rw", size(names[-1])))
    for name in sorted((inputs | outputs) - seen):
        access = ("r" if name in inputs else "") + ("w" if name in outputs else "")
        out.append((access, size(name)))
    return out


_STACK_PATH = re.compile(r"""\[['"]?([^'"\]]+)['"]?\]|\.?([A-Za-z_0-9]\w*)""")


def module_from_stack_key(qualname: str) -> str | None:
    """Dynamo's ``nn_module_stack`` path (``L['self'].layers.0.mlp``, ``L['self'].layers[0]``,
    ``G['model'].lm_head``, ``L['args'][0].model.norm``) as a module path (``layers.0.mlp``):
    the root (a local or global, whatever its name, and the index into a tuple argument
    such as a decorated forward's ``*args``) is dropped, as are ``_modules`` hops. A module
    reached through an imported Python module's global (``G['__import_...']``: a library's
    function object, not part of the model) has no path: None."""
    parts = [a or b for a, b in _STACK_PATH.findall(qualname)]
    rooted = qualname.startswith(("L[", "G["))
    if rooted and parts:
        root = parts[1] if len(parts) > 1 else ""
        if root.startswith("__import_"):
            return None
        parts = parts[2:]
        if parts and parts[0].isdigit() and qualname[qualname.index("]") + 1:].startswith("["):
            parts = parts[1:]  # L['args'][0]: the module passed as a positional argument
    return ".".join(p for p in parts if p != "_modules")


def stack_entries(stack: dict) -> tuple[tuple[int | None, str], ...]:
    """An FX node's ``nn_module_stack`` as ``(id of the module, Dynamo's path)`` pairs,
    outermost first (Dynamo keys each entry by ``str(id(module))``, ``"<id>@1"`` for a
    module's second call; the id is None where the key is not one)."""
    out = []
    for key, value in stack.items():
        qualname = value[0] if isinstance(value, (tuple, list)) and value else value
        try:
            ident: int | None = int(str(key).split("@")[0])
        except ValueError:
            ident = None
        out.append((ident, str(qualname)))
    return tuple(out)


def resolve_stack(entries: tuple, names: dict[int, str] | None = None) -> str | None:
    """The module path of a node's ``stack_entries``: the innermost entry whose module is
    in ``names`` (``ops.module_names`` of the profiled model: paths as ``named_modules``
    spells them), else the innermost entry whose Dynamo path reads as a module path
    (``module_from_stack_key``). Entries outside the model (a library's function module)
    are passed over to the module that called them."""
    if names:
        for ident, _ in reversed(entries):
            if ident is not None and ident in names:
                return names[ident]
    for _, qualname in reversed(entries):
        path = module_from_stack_key(qualname)
        if path:
            return path
    return None


def merge_module_paths(old: str | None, new: str) -> str | None:
    """The module path of a generated kernel that Inductor reuses for several modules: the
    paths' common form, repeated-structure indices as ``*`` (``layers.0.mlp`` and
    ``layers.1.mlp``: ``layers.*.mlp``), cut where they part otherwise (``layers.0.norm`` and
    ``layers.1.attn``: ``layers.*``); None when nothing is common."""
    if old is None or old == new:
        return new
    out = []
    for a, b in zip(old.split("."), new.split(".")):
        if a == b:
            out.append(a)
        elif (a.isdigit() or a == "*") and (b.isdigit() or b == "*"):
            out.append("*")
        else:
            break
    return ".".join(out) or None


def _module_stacks(nodes: Any) -> tuple:
    """The ``stack_entries`` of the module a kernel works for (Dynamo's ``nn_module_stack``):
    where most of the buffers it writes were made (each scheduler node's ``origin_node``),
    else where most of its ops came from; ``()`` when none has one. The buffers decide
    first because a kernel recomputes cheap upstream ops inline: GPT-2's ``ln_1`` kernel
    recomputes the embedding sum, and counted by ops it read as ``transformer``."""
    def majority(origins: Any) -> tuple:
        counts: dict[str, int] = {}
        stacks: dict[str, tuple] = {}
        for origin in origins:
            stack = (getattr(origin, "meta", {}) or {}).get("nn_module_stack") or {}
            if stack:
                entries = stack_entries(stack)
                path = resolve_stack(entries)
                if path:
                    counts[path] = counts.get(path, 0) + 1
                    stacks.setdefault(path, entries)
        return stacks[max(counts, key=counts.get)] if counts else ()

    buffers = [getattr(getattr(node, "node", None), "origin_node", None) for node in nodes]
    return majority(b for b in buffers if b is not None) or majority(
        origin for node in nodes for origin in getattr(getattr(node, "node", None), "origins", None) or ())


def _origins(nodes: Any) -> list[str]:
    """ATen op names behind scheduler nodes, in first-seen order (``native_layer_norm``)."""
    out: list[str] = []
    for node in nodes:
        ir_node = getattr(node, "node", None)
        for origin in sorted(getattr(ir_node, "origins", None) or (), key=lambda o: getattr(o, "name", "")):
            meta = getattr(origin, "meta", {}) or {}
            target = meta.get("original_aten") or getattr(origin, "target", None)
            packet = getattr(target, "overloadpacket", None)
            name = getattr(packet, "__name__", None) or (target if isinstance(target, str) else None)
            if name and getattr(origin, "op", "") == "call_function" and name not in out:
                out.append(name)
    return out


def generated_flops(nodes: Any) -> tuple[int, bool] | None:
    """(FLOPs, estimated) of a generated kernel's scheduler nodes; ``None`` when unknown.

    Template and extern nodes (GEMM templates under ``max-autotune``) count exactly, by
    Inductor's ``estimate_flops()`` (torch's FLOP formulas); every other node that computes
    a floating-point buffer counts one FLOP per element of its iteration space (its
    pointwise and reduction ranges), the convention of the eager estimate (docs/roofline.md).
    """
    graph = _compat.codegen_graph()
    exact = estimated = 0
    known = False
    for node in nodes:
        if not hasattr(node, "get_ranges"):  # the schedule's reduction markers
            continue
        if node.is_template() or node.is_extern():
            flops = node.estimate_flops()
            if flops:
                exact += int(flops)
                known = True
            continue
        buffer = getattr(node, "node", None)
        dtype = buffer.get_dtype() if buffer is not None else None
        if dtype is None or not dtype.is_floating_point:
            continue
        sizes, reduction = node.get_ranges()
        count = graph.sizevars.optimization_hint(_compat.inductor_sympy_product([*sizes, *reduction]), fallback=0)
        if count:
            estimated += int(count)
            known = True
    return (exact + estimated, estimated > 0) if known else None


def _cpp_kernel_bytes(scheduled_nodes: list[Any]) -> int:
    """Bytes of the fused scheduler nodes whose parts make up one C++ kernel."""
    members = {id(n) for n in scheduled_nodes}
    total = 0
    counted: set[int] = set()
    scheduler = getattr(_compat.codegen_graph(), "scheduler", None)
    for fused in getattr(scheduler, "nodes", []) or []:
        parts = fused.get_nodes()
        if parts and all(id(p) in members for p in parts):
            total += fused.get_read_write_buffers_sizes()
            counted.update(id(p) for p in parts)
    for node in scheduled_nodes:  # nodes fused after the scheduler's pass (outer-loop fusion)
        if id(node) not in counted:
            total += node.get_read_write_buffers_sizes()
    return total


def _on_cpp_kernel(scheduling: Any, name: str, src_code: str, nodes: Any, args: tuple, kwargs: dict) -> None:
    kernel_args = args[0] if args else kwargs.get("kernel_args")
    if kernel_args is None:
        kernel_args = getattr(getattr(scheduling, "kernel_group", None), "args", None)
    graph_id = getattr(_compat.codegen_graph(), "graph_id", None)
    names = [name] + ([f"graph_{graph_id}_{name}"] if graph_id is not None else [])
    _record(
        names,
        _attempt(lambda: compulsory_bytes(kernel_arg_buffers(kernel_args, list(nodes))) if kernel_args is not None else None),
        _attempt(lambda: _origins(nodes)),
        estimate=_attempt(lambda: _cpp_kernel_bytes(list(nodes))),
        stack=_attempt(lambda: _module_stacks(nodes)),
        scope=_graph_scope(),
        flops=_attempt(lambda: generated_flops(list(nodes))),
        source=_attempt(lambda: _source(nodes)),
    )


def _on_triton_kernel(name: str, node_schedule: Any, kernel: Any) -> None:
    _record(
        [name],
        _attempt(lambda: compulsory_bytes(kernel_arg_buffers(kernel.args, list(node_schedule)))),
        _attempt(lambda: _origins(node_schedule)),
        estimate=_attempt(lambda: int(kernel.estimate_kernel_num_bytes())),
        stack=_attempt(lambda: _module_stacks(node_schedule)),
        scope=_graph_scope(),
        flops=_attempt(lambda: generated_flops(list(node_schedule))),
        source=_attempt(lambda: _source(node_schedule)),
    )


_scopes = iter(range(1, 1 << 62))
_scope_of: "weakref.WeakKeyDictionary[Any, int]" = weakref.WeakKeyDictionary()  # graph -> its token


def _graph_scope(graph: Any = None) -> Any:
    """A token for the graph Inductor is generating code for (``graph``, else the codegen
    graph; never reused, unlike ``id``), or None outside codegen. Kept beside the graph
    (a weak map), not on it."""
    try:
        graph = graph if graph is not None else _compat.codegen_graph()
        if graph is None:
            return None
        token = _scope_of.get(graph)
        if token is None:
            token = _scope_of[graph] = next(_scopes)
        return token
    except Exception:
        return None


def _on_wrapper_module(graph: Any, module: Any) -> None:
    """After a graph's wrapper is written: its FX nodes' modules and lines, for its extern
    kernels (``ops.wrapper_module``), and its ``call`` marked with the graph's range, so a
    launch is looked up under its own graph (``InductorKernels``)."""
    scope = _graph_scope(graph)
    _mark_graph_calls(module, scope)
    path = getattr(module, "__file__", None)
    gm = getattr(graph, "module", None)
    if gm is not None and scope is not None:
        reads = [
            ("aten::_local_scalar_dense", stack_trace_source((n.meta or {}).get("stack_trace")))
            for n in gm.graph.nodes
            if n.op == "call_function" and "_local_scalar_dense" in str(n.target)
        ]
        if reads:
            KERNELS.record_host_reads(scope, reads)
    if not path or gm is None:
        return
    nodes: dict[str, tuple[str | None, str | None]] = {}
    for node in gm.graph.nodes:
        meta = getattr(node, "meta", {}) or {}
        stack = meta.get("nn_module_stack") or {}
        entries = stack_entries(stack) if stack else ()
        line = stack_trace_source(meta.get("stack_trace"))
        if not entries and not line:
            continue
        nodes.setdefault(node.name, (entries, line))
        # The wrapper's comments name the user-level ops by Dynamo's node names, which
        # Dynamo renames after the user's variable (linear_3 -> attn_output_4): the
        # post-autograd node keeps that name as its first from_node, and the op's original
        # name in source_fn_stack.
        for origin in (meta.get("from_node") or ())[:1]:
            name = getattr(origin, "name", None)
            if name:
                nodes.setdefault(str(name), (entries, line))
        source = meta.get("source_fn_stack") or []
        if source:
            nodes[str(source[-1][0])] = (entries, line)
    register_wrapper(path, nodes)


_marked = threading.local()  # calls of marked graph wrappers on this thread (marked_calls)


def marked_calls() -> int:
    """How many calls of graph wrappers compiled under the hooks (``_mark_graph_calls``) this thread has made: a
    compiled graph's call that adds none ran a wrapper compiled before them (``capture``'s unseen graphs)."""
    return getattr(_marked, "calls", 0)


def _mark_graph_calls(module: Any, scope: Any) -> None:
    """Wrap a compiled graph's ``call`` (Inductor takes ``module.call`` after
    ``compile_to_module`` returns) so that, while a profiler runs, it opens the range
    ``fusioncheck::graph#<scope>`` that the CUDA kernel source finds its launches in."""
    original = getattr(module, "call", None)
    if scope is None or not callable(original) or getattr(original, "_fusioncheck_graph", None) is not None:
        return
    import torch

    name = f"{GRAPH_RANGE_PREFIX}{scope}"

    def call(*args: Any, **kwargs: Any) -> Any:
        _marked.calls = getattr(_marked, "calls", 0) + 1
        if not _compat.profiler_enabled():
            return original(*args, **kwargs)
        with torch.profiler.record_function(name):
            return original(*args, **kwargs)

    call._fusioncheck_graph = scope
    module.call = call


_TRACE_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


def stack_trace_source(trace: str | None) -> str | None:
    """The model's ``file:line`` in an FX node's ``stack_trace`` (Dynamo's record of where
    the op was traced): its innermost user frame (``where.user_frame``)."""
    if not trace:
        return None
    from ..where import relpath, user_frame

    frames = [(f, int(line)) for f, line, _ in _TRACE_FRAME.findall(trace)]
    found = user_frame(frames)
    return f"{relpath(found[0])}:{found[1]}" if found else None


def _source(nodes: Any) -> str | None:
    """The model line most of a kernel's ops were traced from (their FX stack traces)."""
    counts: dict[str, int] = {}
    for node in nodes:
        for origin in getattr(getattr(node, "node", None), "origins", None) or ():
            line = stack_trace_source((getattr(origin, "meta", {}) or {}).get("stack_trace"))
            if line:
                counts[line] = counts.get(line, 0) + 1
    return max(counts, key=counts.get) if counts else None


# Generated wrapper files -> {FX node name: (stack_entries, model line)}: what an extern kernel
# called from the wrapper (cuBLAS/ATen GEMMs, attention) ran for. The wrapper names a call's
# source nodes in the comment above it ("# Topologically Sorted Source Nodes: [linear_3], ...").
_wrapper_nodes: dict[str, dict[str, tuple[tuple, str | None]]] = {}
_wrapper_lines: dict[tuple[str, int], tuple[tuple, str | None] | None] = {}
_SOURCE_NODES = re.compile(r"#\s*Topologically Sorted Source Nodes: \[([^\]]*)\]")


def register_wrapper(path: str, nodes: dict[str, tuple[tuple, str | None]]) -> None:
    """Remember a generated wrapper file's {FX node name: (stack_entries, model line)}
    (sources/bytes_model.py)."""
    _wrapper_nodes[path] = nodes
    for key in [k for k in _wrapper_lines if k[0] == path]:
        del _wrapper_lines[key]


def wrapper_origin(frame: Any, max_depth: int = 30) -> tuple[tuple, str | None] | None:
    """``(stack_entries, model line)`` of the node an op called from a compiled graph's wrapper ran for,
    from the source nodes the wrapper names above the calling line; None when the op is not
    called from one."""
    if not _wrapper_nodes:
        return None
    depth = 0
    while frame is not None and depth < max_depth:
        filename = frame.f_code.co_filename
        nodes = _wrapper_nodes.get(filename)
        if nodes is not None:
            key = (filename, frame.f_lineno)
            if key not in _wrapper_lines:
                _wrapper_lines[key] = _origin_above(filename, frame.f_lineno, nodes)
            return _wrapper_lines[key]
        frame = frame.f_back
        depth += 1
    return None


def _origin_above(filename: str, lineno: int, nodes: dict[str, tuple[tuple, str | None]]) -> tuple[tuple, str | None] | None:
    import linecache

    for line in range(lineno - 1, max(0, lineno - 40), -1):
        match = _SOURCE_NODES.search(linecache.getline(filename, line))
        if match:
            names = [n.strip() for n in match.group(1).split(",")]
            known = [nodes[n] for n in reversed(names) if n in nodes]  # the call's own node comes last
            # an extern call that took in an op of the enclosing module (a residual add folded
            # into addmm): the innermost node that has a module
            return next((k for k in known if k[0]), known[0] if known else None)
    return None


def _attempt(fn: Any) -> Any:
    """``fn()``, or ``None`` when it fails: a figure Inductor's internals cannot give is
    left out (the kernel is then unmodelled), never a broken compile."""
    try:
        return fn()
    except Exception:
        return None


_hooks_open = threading.local()


@contextlib.contextmanager
def inductor_hooks() -> Iterator[None]:
    """While open, record the compulsory bytes (and Inductor's estimate and origins) of
    every kernel Inductor generates, with its caches off so that every compile generates
    code (``_compat.inductor_switches``). Restored on exit. Re-entrant: a profiled call
    inside a test (which opens them for its whole call) does not patch again."""
    depth = getattr(_hooks_open, "depth", 0)
    if depth:
        _hooks_open.depth = depth + 1
        try:
            yield
        finally:
            _hooks_open.depth -= 1
        return
    with _compat.inductor_switches(), _compat.codegen_hooks(_on_cpp_kernel, _on_triton_kernel, _on_wrapper_module):
        _hooks_open.depth = 1
        try:
            yield
        finally:
            _hooks_open.depth = 0


def triton_launch_bytes(metadata: dict[str, Any] | None, tensors: list[Any]) -> int | None:
    """A directly launched Triton kernel's bytes: declared, else its tensors, else ``None``.

    ``tensors`` are the launch's tensor arguments and the tensors behind its TMA
    descriptors (``launch_tensors``). A launch that declares nothing and passes no
    tensor has no model: ``None``, never 0.
    """
    from ..budget import distinct_bytes

    if metadata:
        declared = metadata.get("bytes")
        if isinstance(declared, (int, float)) and not isinstance(declared, bool) and declared >= 0:
            return int(declared)
    if not tensors:
        return None
    return distinct_bytes(tensors)


def triton_launch_flops(metadata: dict[str, Any] | None) -> int | None:
    """The FLOPs a directly launched Triton kernel's ``launch_metadata`` declares:
    ``"flops"``, else the sum of Proton's per-width keys (``"flops16"``, ``"flops32"``,
    ...); ``None`` when it declares none (never guessed from the arguments)."""
    if not metadata:
        return None

    def count(value: Any) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0

    if count(metadata.get("flops")):
        return int(metadata["flops"])
    widths = [v for k, v in metadata.items() if re.fullmatch(r"flops\d+", str(k)) and count(v)]
    return int(sum(widths)) if widths else None


def launch_dtype(tensors: list[Any]) -> str | None:
    """The dtype of a launch's first floating-point tensor (``"bfloat16"``), if any."""
    for t in tensors:
        if t.is_floating_point():
            return str(t.dtype).removeprefix("torch.")
    return None


def launch_tensors(values: Any) -> list[Any]:
    """Tensors among a Triton launch's argument values, TMA descriptors opened up.

    A host-side ``TensorDescriptor`` (``triton.tools.tensor_descriptor``) and the older
    ``TmaDescKernelParam`` wrappers carry the tensor they describe as ``base`` (or
    ``tensor``); the kernel moves that tensor's bytes, not the descriptor's.
    """
    import torch

    out = []
    for v in values:
        if isinstance(v, torch.Tensor):
            out.append(v)
            continue
        for attr in ("base", "tensor"):
            inner = getattr(v, attr, None)
            if isinstance(inner, torch.Tensor):
                out.append(inner)
                break
    return out


# --------------------------------------------------------------------------- generated kernels' names


_INDUCTOR_CPU_KERNEL = re.compile(r"^(?:graph_\d+_)?(cpp_\w+)$")


def inductor_cpu_kernel(name: str) -> str | None:
    """The kernel name if ``name`` is an Inductor C++ kernel's profiler event, else None."""
    m = _INDUCTOR_CPU_KERNEL.match(name)
    return m.group(1) if m else None


def generated_origin(name: str, graph: Any = None) -> str:
    """``triton_poi_fused_add_gelu_0`` -> ``fused: add, gelu`` (the ops Inductor fused).

    Uses the ATen ops Inductor recorded for the kernel at code generation; falls back
    to reading them off the kernel's name (ambiguous where op names hold underscores).
    """
    origins = inductor_kernel_origins(name, graph)
    if origins:
        return "fused: " + ", ".join(origins)
    base = re.sub(r"_\d+$", "", name)
    m = re.match(r"^(?:graph_\d+_)?(?:cpp|triton)_(?:(?:poi|per|red|tem|spl|mix|unk)_)?fused_?(.*)$", base)
    if not m:
        return "generated"
    ops = [p for p in re.split(r"_(?=[a-z])", m.group(1)) if p]
    return "fused: " + ", ".join(ops) if ops else "generated"


def bound_launch_args(jitfn: Any, args: tuple, kwargs: dict) -> dict[str, Any]:
    """Argument name -> value of a Triton launch, defaults of unpassed parameters filled in
    (what Triton hands a kernel's ``launch_metadata`` hook)."""
    import inspect

    arg_names = list(getattr(jitfn, "arg_names", []) or [])
    bound = dict(zip(arg_names, args))
    bound.update(kwargs)
    params = getattr(jitfn, "params", None)
    if params is None:  # the interpreter's InterpretedFunction: read the Python signature
        try:
            params = list(inspect.signature(jitfn.fn).parameters.values())
        except (AttributeError, TypeError, ValueError):
            params = []
    for param in params:
        pname = getattr(param, "name", None)
        default = getattr(param, "default", inspect.Parameter.empty)
        if pname and pname not in bound and default is not inspect.Parameter.empty:
            bound[pname] = default
    return bound


class _KernelStandIn:
    """What a ``launch_metadata(grid, kernel, args)`` hook may read off ``kernel`` before
    the launch: its name (Triton passes the compiled kernel; we call the hook earlier)."""

    def __init__(self, name: str) -> None:
        self.name = name


def declared_launch_metadata(jitfn: Any, name: str, grid: Any, bound: dict[str, Any]) -> dict[str, Any] | None:
    """The dict a kernel's ``launch_metadata`` hook returns for this launch, or ``None``."""
    meta_fn = getattr(jitfn, "launch_metadata", None) or (getattr(jitfn, "kwargs", None) or {}).get("launch_metadata")
    if not callable(meta_fn):
        return None
    try:
        metadata = meta_fn(grid, _KernelStandIn(name), bound)
    except Exception:  # a hook that needs more than we have: fall back to the tensors
        return None
    return metadata if isinstance(metadata, dict) else None
