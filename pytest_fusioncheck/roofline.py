"""Peak bandwidth, timing and efficiency: the roofline half of the plugin.

* Peak bandwidth is measured once per device per session with a large copy (bytes read
  plus bytes written over the median time): device-to-device on a GPU, host memory on
  CPU. The figure is cached in pytest's cache keyed by the device name, and
  ``--fusion-peak-bandwidth`` overrides it.
* The time of a ``fusion.profile`` call is the median of repeated CUDA-event timings
  with the L2 flushed between runs (on CPU, the median wall time); a region's time is
  its kernels' device time. Timing is lazy: it runs when an efficiency is asked for.
* Efficiency = (budget bytes / peak bandwidth) / time.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

from .report import FusionReport

_peak: dict[str, float] = {}
CACHE_KEY = "fusioncheck/peak_bandwidth"


def _device_key(device: str, name: str) -> str:
    if device == "cpu":
        import platform

        return f"cpu:{platform.processor() or platform.machine()}"
    return f"{device}:{name}"


def measure_copy_bandwidth(device: str, nbytes: int | None = None, reps: int = 10) -> float:
    """Bytes/s (read + write) of a large copy on ``device``; median of ``reps`` runs."""
    import torch

    if nbytes is None:
        nbytes = (1 << 30) if device == "cuda" else (256 << 20)
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device=device).random_()
    dst = torch.empty_like(src)
    times = []
    for _ in range(reps + 2):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e-3)
        else:
            t0 = time.perf_counter()
            dst.copy_(src)
            times.append(time.perf_counter() - t0)
    return 2 * src.numel() / statistics.median(times[2:])


def peak_bandwidth(device: str, name: str = "") -> float:
    """The session's peak bandwidth for ``device`` (override > in-process > pytest cache > measured)."""
    from .api import settings

    if settings.peak_bandwidth:
        return settings.peak_bandwidth
    key = _device_key(device, name)
    if key in _peak:
        return _peak[key]
    cache = settings.peak_cache
    cached = cache.get(f"{CACHE_KEY}/{key}", None) if cache is not None else None
    if isinstance(cached, (int, float)) and cached > 0:
        _peak[key] = float(cached)
        return _peak[key]
    value = measure_copy_bandwidth(device)
    _peak[key] = value
    if cache is not None:
        cache.set(f"{CACHE_KEY}/{key}", value)
    return value


def median_time(fn: Callable[..., Any], args: tuple, kwargs: dict, device: str, reps: int = 15, budget_s: float = 1.0) -> tuple[float, int]:
    """Median seconds of ``fn(*args, **kwargs)``: CUDA events with the L2 flushed, or wall time."""
    import torch

    times: list[float] = []
    deadline = time.perf_counter() + budget_s
    if device == "cuda":
        l2 = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "L2_cache_size", 50 << 20)
        flush = torch.empty(max(2 * l2, 64 << 20), dtype=torch.uint8, device="cuda")
        for i in range(reps):
            flush.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(*args, **kwargs)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e-3)
            if i >= 2 and time.perf_counter() > deadline:
                break
    else:
        for i in range(reps):
            t0 = time.perf_counter()
            fn(*args, **kwargs)
            times.append(time.perf_counter() - t0)
            if i >= 2 and time.perf_counter() > deadline:
                break
    return statistics.median(times), len(times)


def attach_timer(report: FusionReport, fn: Callable[..., Any], args: tuple, kwargs: dict) -> None:
    """Let ``ensure_efficiency`` re-time this call later (lazily, only when asked)."""
    report._retime = lambda: median_time(fn, args, kwargs, report.device)  # type: ignore[attr-defined]


def ensure_efficiency(report: FusionReport) -> None:
    """Fill ``peak_bandwidth`` and, for a profiled call, the median time; add L2 warnings."""
    if report.peak_bandwidth is None:
        report.peak_bandwidth = peak_bandwidth(report.device, report.device_name)
    retime = getattr(report, "_retime", None)
    if retime is not None:
        report._retime = None  # type: ignore[attr-defined]
        seconds, n = retime()
        report.time_s = seconds
        report.time_source = f"median of {n} {'CUDA-event timings, L2 flushed' if report.device == 'cuda' else 'wall-clock runs'}"
    if report.device == "cuda" and report.budget is not None:
        import torch

        l2 = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "L2_cache_size", 0)
        if l2 and report.budget.total < 4 * l2:
            msg = (
                f"budget {report.budget.total / 2**20:.1f} MiB is under 4x the {l2 / 2**20:.0f} MiB L2: "
                "timings may measure the cache, not HBM; use larger inputs"
            )
            if msg not in report.warnings:
                report.warnings.append(msg)
