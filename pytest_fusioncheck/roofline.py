"""Peak bandwidth and efficiency: the roofline half of the plugin.

* Peak bandwidth is measured once per device per session with a large copy (bytes read
  plus bytes written over the median time): device-to-device on a GPU, host memory on
  CPU. The figure is cached in pytest's cache keyed by the device name, and
  ``--fusion-peak-bandwidth`` overrides it.
* The time of a ``fusion.profile`` call on a GPU is its *device time*: the durations of
  the kernels and copies it launched as the profiler (CUPTI) saw them, summed per call,
  median over repeats with the L2 flushed between; never an event pair around the
  Python call, which adds the launcher's host time. The median unprofiled wall time is
  kept beside it (their gap is launch overhead). On CPU both are the median wall time.
  A region's time is its kernels' device time in its one run. Timing is lazy: it runs
  when an efficiency is asked for.
* Efficiency = (budget bytes / peak bandwidth) / time.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

from .report import FusionReport
from .sources import time_source
from .state import Settings

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


def peak_bandwidth(device: str, name: str = "", settings: Settings | None = None) -> float:
    """The session's peak bandwidth for ``device``: the override, else measured once per
    session (kept in ``settings.peaks`` and in pytest's cache across sessions)."""
    settings = settings if settings is not None else Settings()
    if settings.peak_bandwidth:
        return settings.peak_bandwidth
    key = _device_key(device, name)
    if key in settings.peaks:
        return settings.peaks[key]
    cache = settings.peak_cache
    cached = cache.get(f"{CACHE_KEY}/{key}", None) if cache is not None else None
    if isinstance(cached, (int, float)) and cached > 0:
        settings.peaks[key] = float(cached)
        return settings.peaks[key]
    value = measure_copy_bandwidth(device)
    settings.peaks[key] = value
    if cache is not None:
        cache.set(f"{CACHE_KEY}/{key}", value)
    return value


def median_time(fn: Callable[..., Any], args: tuple, kwargs: dict, device: str) -> tuple[float, int, float, str]:
    """``(time, repeats, wall time, what the time is)`` from the device's time source."""
    return time_source(device).time(fn, args, kwargs)


def attach_timer(report: FusionReport, fn: Callable[..., Any], args: tuple, kwargs: dict) -> None:
    """Let ``ensure_efficiency`` re-time this call later (lazily, only when asked)."""
    report.timer = lambda: median_time(fn, args, kwargs, report.device)


def ensure_efficiency(report: FusionReport, settings: Settings | None = None) -> None:
    """Fill ``peak_bandwidth`` and, for a profiled call, the median time; add L2 warnings."""
    if settings is None:
        from .state import current_log

        settings = current_log().settings
    if report.peak_bandwidth is None:
        report.peak_bandwidth = peak_bandwidth(report.device, report.device_name, settings)
    timer, report.timer = report.timer, None
    if timer is not None:
        report.time_s, _, report.wall_time_s, report.time_source = timer()
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
