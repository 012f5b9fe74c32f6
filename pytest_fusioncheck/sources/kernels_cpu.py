"""Kernel source for CPU: a model of what a GPU would launch (docs/bytes.md).

Each Inductor-generated C++ kernel (Inductor's kernel profiling names it in the profiler),
each eager ATen op that computes (seen by the op observer), and each Triton launch run by
the interpreter counts as one kernel; ``.item()`` and cross-device transfers are copies.
An op's FLOPs and dtype (``ops.op_flops``) ride along; Inductor's C++ kernels carry the
estimate recorded at code generation (``bytes_model.generated_flops``, docs/roofline.md).
"""

from __future__ import annotations

from typing import Any

from .._compat import kineto_events
from ..ops import OpRecord, TritonLaunch
from ..ranges import OP_RANGE_PREFIX, TRITON_RANGE_PREFIX
from ..report import Kernel
from .bytes_model import (
    generated_origin,
    inductor_cpu_kernel,
    inductor_kernel_bytes,
    inductor_kernel_estimate,
    inductor_kernel_flops,
    inductor_kernel_module,
    inductor_kernel_source,
)


class CpuKernels:
    """``KernelSource`` for ``device == "cpu"``."""

    def kernels(self, prof: Any, ops: list[OpRecord], triton: list[TritonLaunch], names: dict[int, str] | None = None) -> tuple[list[Kernel], list[Kernel]]:
        return cpu_kernels(prof, ops, triton, names)


def cpu_kernels(prof: Any, ops: list[OpRecord], triton: list[TritonLaunch], names: dict[int, str] | None = None) -> tuple[list[Kernel], list[Kernel]]:
    """Kernels and copies of a CPU capture: Inductor C++ kernels (profiler events), the
    observed ATen ops that compute, and interpreted Triton launches (one kernel each)."""
    kernels: list[Kernel] = []
    copies: list[Kernel] = []
    op_events: dict[int, Any] = {}
    triton_events: dict[int, Any] = {}
    for e in kineto_events(prof):  # raw events: cheaper than prof.events()' tree
        name = e.name()
        if name.startswith(OP_RANGE_PREFIX):
            op_events[int(name[len(OP_RANGE_PREFIX):])] = e
        elif name.startswith(TRITON_RANGE_PREFIX):
            triton_events[int(name[len(TRITON_RANGE_PREFIX):])] = e
        else:
            kname = inductor_cpu_kernel(name)
            if kname is not None:
                nbytes = inductor_kernel_bytes(name)
                flops, estimated = inductor_kernel_flops(name)
                if flops is None:
                    flops, estimated = inductor_kernel_flops(kname)
                kernels.append(
                    Kernel(
                        name=kname,
                        time_s=e.duration_ns() * 1e-9,
                        bytes=nbytes if nbytes is not None else inductor_kernel_bytes(kname),
                        op=generated_origin(kname),
                        source=_first_not_none(inductor_kernel_source(name), inductor_kernel_source(kname)),
                        bytes_estimate=_first_not_none(inductor_kernel_estimate(name), inductor_kernel_estimate(kname)),
                        module=_first_not_none(inductor_kernel_module(name, names=names), inductor_kernel_module(kname, names=names)),
                        start_ns=e.start_ns(),
                        flops=flops,
                        flops_estimated=estimated,
                    )
                )
    # an op whose implementation launched Triton (a custom op wrapping a kernel): its launches are its kernels
    wrapping = {launch.inside_op for launch in triton if launch.interpreted and launch.inside_op is not None}
    by_index = {op.index: op for op in ops if op.index in wrapping}
    for op in ops:
        if op.index in wrapping:
            continue
        e = op_events.get(op.index)
        k = Kernel(
            name=op.op,
            time_s=(e.duration_ns() * 1e-9) if e is not None else op.wall_ns * 1e-9,
            bytes=op.bytes,
            op=op.op,
            source=op.source,
            kind=op.kind,
            reads=op.reads,
            writes=op.writes,
            module=op.module,
            start_ns=e.start_ns() if e is not None else 0,
            flops=op.flops,
            flops_estimated=op.flops_estimated,
            dtype=op.dtype,
        )
        (copies if op.kind == "copy" else kernels).append(k)
    for launch in triton:
        if not launch.interpreted:
            continue
        e = triton_events.get(launch.index)
        kernels.append(
            Kernel(
                name=launch.name,
                time_s=launch.wall_ns * 1e-9,
                bytes=launch.bytes,
                op="triton",
                source=launch.source,
                module=launch.module or (by_index[launch.inside_op].module if launch.inside_op in by_index else None),
                start_ns=e.start_ns() if e is not None else 0,
                flops=launch.flops,
                dtype=launch.dtype,
            )
        )
    kernels.sort(key=lambda k: k.start_ns)
    copies.sort(key=lambda k: k.start_ns)
    return kernels, copies


def _first_not_none(*values: Any) -> Any:
    return next((v for v in values if v is not None), None)
