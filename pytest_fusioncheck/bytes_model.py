"""Where modelled bytes come from for kernels the op observer cannot see.

Eager ATen ops get their bytes from ``kernels.op_traffic`` (distinct input and output
storages, observed as the op runs). Two other sources live here:

* Inductor-generated kernels: Inductor's own per-kernel estimate, taken at code
  generation. For Triton kernels that is ``estimate_kernel_num_bytes()`` (the figure
  Inductor's own benchmark harness reports as ``kernel_num_gb``); for C++ kernels it is
  the read/write buffer sizes of the fused scheduler nodes in the kernel (the figure
  ``GraphLowering.count_bytes`` sums). Codegen is skipped when a graph comes from
  Inductor's on-disk cache, so ``install_inductor_hooks`` also turns the FX graph and
  AOTAutograd caches off for the process: recompiling costs time, but every kernel then
  has a figure.
* Triton kernels launched directly: the ``"bytes"`` their ``launch_metadata`` declares,
  else the distinct bytes of their tensor arguments.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

_lock = threading.Lock()
_inductor_bytes: dict[str, int] = {}
_inductor_origins: dict[str, list[str]] = {}
_installed = False


def inductor_kernel_bytes(name: str) -> int | None:
    """Inductor's estimate for a generated kernel, by its name as the profiler shows it."""
    with _lock:
        return _inductor_bytes.get(name)


def inductor_kernel_origins(name: str) -> list[str]:
    """The ATen ops a generated kernel was fused from (``["add", "gelu"]``), if recorded."""
    with _lock:
        return list(_inductor_origins.get(name, []))


def _record(names: list[str], nbytes: int, origins: list[str] | None = None) -> None:
    with _lock:
        for n in names:
            _inductor_bytes[n] = int(nbytes)
            if origins:
                _inductor_origins[n] = origins


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

            nbytes = _cpp_kernel_bytes(list(nodes))
            graph_id = getattr(V.graph, "graph_id", None)
            names = [name] + ([f"graph_{graph_id}_{name}"] if graph_id is not None else [])
            _record(names, nbytes, _origins(nodes))
        except Exception:  # the estimate is best effort; codegen must not break
            pass
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
                _record([name], int(kernel.estimate_kernel_num_bytes()), _origins(node_schedule))
            except Exception:
                pass
            return name

        TritonScheduling.define_kernel = triton_define_kernel
    _installed = True


def triton_launch_bytes(metadata: dict[str, Any] | None, tensors: list[Any]) -> int:
    """A directly launched Triton kernel's bytes: declared, else its tensor arguments."""
    from .budget import distinct_bytes

    if metadata:
        declared = metadata.get("bytes")
        if isinstance(declared, (int, float)) and declared >= 0:
            return int(declared)
    return distinct_bytes(tensors)
