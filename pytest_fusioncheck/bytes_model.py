"""Where modelled bytes come from for kernels the op observer cannot see.

Eager ATen ops get their bytes from ``kernels.op_traffic`` (distinct input and output
storages, observed as the op runs). Two other sources live here:

* Inductor-generated kernels: their *compulsory* bytes, taken at code generation from the
  kernel's argument table, the same rule for Triton (CUDA) and C++ (CPU) kernels: each
  buffer the kernel reads counted once, each buffer it writes counted once, an in-place
  buffer once each way. That is the DRAM traffic of a kernel whose re-reads stay on chip
  (a looped reduction's second pass over a row is served by the cache), see
  ``docs/bytes.md``. Inductor's own estimate (``estimate_kernel_num_bytes()``, what its
  benchmark harness reports as ``kernel_num_gb``) is kept beside it as
  ``Kernel.bytes_estimate``. Codegen is skipped when a graph comes from Inductor's
  on-disk cache, so ``install_inductor_hooks`` also turns the FX graph and AOTAutograd
  caches off for the process: recompiling costs time, but every kernel then has a figure.
* Triton kernels launched directly: the ``"bytes"`` their ``launch_metadata`` declares,
  else the distinct bytes of their tensor arguments and of the tensors behind their TMA
  descriptors; a launch with neither is unmodelled (``None``).
"""

from __future__ import annotations

import functools
import threading
from typing import Any

_lock = threading.Lock()
_inductor_bytes: dict[str, int] = {}
_inductor_estimates: dict[str, int] = {}
_inductor_origins: dict[str, list[str]] = {}
_installed = False


def inductor_kernel_bytes(name: str) -> int | None:
    """The compulsory bytes of a generated kernel, by its name as the profiler shows it."""
    with _lock:
        return _inductor_bytes.get(name)


def inductor_kernel_estimate(name: str) -> int | None:
    """Inductor's own byte estimate of a generated kernel (``None`` if it gave none)."""
    with _lock:
        return _inductor_estimates.get(name)


def inductor_kernel_origins(name: str) -> list[str]:
    """The ATen ops a generated kernel was fused from (``["add", "gelu"]``), if recorded."""
    with _lock:
        return list(_inductor_origins.get(name, []))


def _record(names: list[str], nbytes: int | None, origins: list[str] | None = None, estimate: int | None = None) -> None:
    with _lock:
        for n in names:
            if nbytes is not None:
                _inductor_bytes[n] = int(nbytes)
            if estimate is not None:
                _inductor_estimates[n] = int(estimate)
            if origins:
                _inductor_origins[n] = origins


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
    from torch._inductor.utils import get_dtype_size
    from torch._inductor.virtualized import V

    hint = V.graph.sizevars.optimization_hint
    accesses, points = _access_patterns(nodes, hint)
    produced = {dep.name for node in nodes or () for dep in getattr(getattr(node, "read_writes", None), "writes", ())}

    def size(name: str) -> int:
        numel = int(hint(V.graph.get_numel(name), fallback=0))
        patterns = accesses.get(name, ())
        count = 0 if _WHOLE in patterns else len(patterns)
        return touched_elements(numel, count, points) * get_dtype_size(V.graph.get_dtype(name))

    return buffer_accesses(args, size, produced)


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


def buffer_accesses(args: Any, size: Any, produced: set[str] | None = None) -> list[tuple[str, int]]:
    """The compulsory-rule reading of an argument table (see ``kernel_arg_buffers``).

    An in-place buffer whose first name the kernel itself produces (Inductor stores a
    value, then overwrites it with the next fused op's result: ``in_out_ptr``) is
    written once; one that held data before the kernel is read once and written once.
    ``produced`` names the buffers the kernel's nodes write (without it, the output
    table stands in; Triton kernels drop such buffers from it). A buffer both in the
    input and the output table (a mutated graph input) is read once and written once.
    """

    def removed(value: Any) -> bool:
        return type(value).__name__ == "RemovedArg" or str(value) == "REMOVED"

    inputs = {k for k, v in (getattr(args, "input_buffers", {}) or {}).items() if not removed(v)}
    outputs = {k for k, v in (getattr(args, "output_buffers", {}) or {}).items() if not removed(v)}
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


def _cpp_kernel_bytes(scheduled_nodes: list[Any]) -> int:
    """Bytes of the fused scheduler nodes whose parts make up one C++ kernel."""
    from torch._inductor.virtualized import V

    members = {id(n) for n in scheduled_nodes}
    total = 0
    counted: set[int] = set()
    scheduler = getattr(V.graph, "scheduler", None)
    for fused in getattr(scheduler, "nodes", []) or []:
        parts = fused.get_nodes()
        if parts and all(id(p) in members for p in parts):
            total += fused.get_read_write_buffers_sizes()
            counted.update(id(p) for p in parts)
    for node in scheduled_nodes:  # nodes fused after the scheduler's pass (outer-loop fusion)
        if id(node) not in counted:
            total += node.get_read_write_buffers_sizes()
    return total


def install_inductor_hooks() -> None:
    """Record Inductor's byte estimate of every kernel it generates from now on.

    Idempotent. Also turns Inductor's FX graph cache and AOTAutograd's cache off, so a
    graph compiled in an earlier process still goes through code generation here.
    """
    global _installed
    if _installed:
        return
    import torch._inductor.config as inductor_config

    inductor_config.fx_graph_cache = False
    try:
        import torch._functorch.config as functorch_config

        functorch_config.enable_autograd_cache = False
    except (ImportError, AttributeError):
        pass
    inductor_config.cpp.enable_kernel_profile = True

    from torch._inductor.codegen.cpp import CppScheduling

    original_cpp = CppScheduling.define_kernel

    @functools.wraps(original_cpp)
    def cpp_define_kernel(self, src_code, nodes, *args, **kwargs):
        name = original_cpp(self, src_code, nodes, *args, **kwargs)
        try:
            from torch._inductor.virtualized import V

            kernel_args = args[0] if args else kwargs.get("kernel_args")
            if kernel_args is None:
                kernel_args = getattr(getattr(self, "kernel_group", None), "args", None)
            graph_id = getattr(V.graph, "graph_id", None)
            names = [name] + ([f"graph_{graph_id}_{name}"] if graph_id is not None else [])
        except Exception:  # codegen must not break
            return name
        try:
            nbytes = compulsory_bytes(kernel_arg_buffers(kernel_args, list(nodes))) if kernel_args is not None else None
        except Exception:  # no figure: the kernel is left unmodelled
            nbytes = None
        try:
            estimate = _cpp_kernel_bytes(list(nodes))
        except Exception:
            estimate = None
        try:
            origins = _origins(nodes)
        except Exception:
            origins = None
        _record(names, nbytes, origins, estimate=estimate)
        return name

    CppScheduling.define_kernel = cpp_define_kernel

    try:
        from torch._inductor.codegen.triton import TritonScheduling
    except ImportError:  # pragma: no cover - Triton-less builds
        TritonScheduling = None
    if TritonScheduling is not None:
        original_triton = TritonScheduling.define_kernel

        @functools.wraps(original_triton)
        def triton_define_kernel(self, src_code, node_schedule, kernel, *args, **kwargs):
            name = original_triton(self, src_code, node_schedule, kernel, *args, **kwargs)
            try:
                nbytes = compulsory_bytes(kernel_arg_buffers(kernel.args, list(node_schedule)))
            except Exception:  # no figure: the kernel is left unmodelled
                nbytes = None
            try:
                estimate = int(kernel.estimate_kernel_num_bytes())
            except Exception:
                estimate = None
            try:
                origins = _origins(node_schedule)
            except Exception:
                origins = None
            _record([name], nbytes, origins, estimate=estimate)
            return name

        TritonScheduling.define_kernel = triton_define_kernel
    _installed = True


def triton_launch_bytes(metadata: dict[str, Any] | None, tensors: list[Any]) -> int | None:
    """A directly launched Triton kernel's bytes: declared, else its tensors, else ``None``.

    ``tensors`` are the launch's tensor arguments and the tensors behind its TMA
    descriptors (``launch_tensors``). A launch that declares nothing and passes no
    tensor has no model: ``None``, never 0.
    """
    from .budget import distinct_bytes

    if metadata:
        declared = metadata.get("bytes")
        if isinstance(declared, (int, float)) and not isinstance(declared, bool) and declared >= 0:
            return int(declared)
    if not tensors:
        return None
    return distinct_bytes(tensors)


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
