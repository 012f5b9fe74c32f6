"""The plugin's swappable parts: what counts as a kernel, where bytes and time come from.

Each part is a small protocol with one implementation per kind, chosen here and nowhere
else (docs/architecture.md says how to add one):

* ``KernelSource`` (per device): a capture's profiler events, observed ops and Triton
  launches, and the module names of the profiled model (``ops.module_names``) ->
  ``(kernels, copies)``. ``kernels_cuda.CudaKernels``, ``kernels_cpu.CpuKernels``.
* ``ByteSource`` (per session): fills measured bytes into a report as it is recorded.
  The model needs none (modelled bytes come with the kernels: ``bytes_model``);
  ``bytes_ncu.NcuBytes`` with ``--fusion-counters=ncu``.
* ``TimeSource`` (per device): ``(time, repeats, wall time, description)`` of a call.
  ``time_device.DeviceTime`` on GPUs, ``time_wall.WallTime`` on CPU.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol


class KernelSource(Protocol):
    def kernels(self, prof: Any, ops: list[Any], triton: list[Any], names: dict[int, str] | None = None) -> tuple[list[Any], list[Any]]: ...


class ByteSource(Protocol):
    def fill(self, report: Any, test_id: str, index: int) -> None: ...


class TimeSource(Protocol):
    def time(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> tuple[float, int, float, str]: ...


def kernel_source(device: str) -> KernelSource:
    if device == "cuda":
        from .kernels_cuda import CudaKernels

        return CudaKernels()
    from .kernels_cpu import CpuKernels

    return CpuKernels()


class ModelledBytes:
    """``ByteSource`` without counters: modelled bytes are already on the kernels."""

    def fill(self, report: Any, test_id: str, index: int) -> None:
        return None


def byte_source(settings: Any) -> ByteSource:
    if settings.counters == "ncu" and settings.measured is not None:
        from .bytes_ncu import NcuBytes

        return NcuBytes(settings.measured)
    return ModelledBytes()


def time_source(device: str) -> TimeSource:
    if device == "cuda":
        from .time_device import DeviceTime

        return DeviceTime()
    from .time_wall import WallTime

    return WallTime()
