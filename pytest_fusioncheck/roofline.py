"""Peak bandwidth, timing and efficiency: the roofline half of the plugin.

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


REP_RANGE_PREFIX = "fusioncheck::rep#"


def per_rep_device_time(
    reps: list[tuple[int, int]],
    launches: dict[int, int],
    activities: list[tuple[int, int, int]],
) -> list[float]:
    """Seconds of device activity launched inside each repeat (pure logic).

    ``reps`` are the host-side ``(start_ns, end_ns)`` of each repeat's range; ``launches``
    maps a launch's correlation id to its host timestamp; ``activities`` are the device
    activities as ``(correlation_id, start_ns, duration_ns)``. An activity belongs to the
    repeat whose range holds its launch (its own start when the launch is unknown, e.g.
    a CUDA-graph node). Repeats that launched nothing are dropped.
    """
    totals = [0] * len(reps)
    seen = [False] * len(reps)
    order = sorted(range(len(reps)), key=lambda i: reps[i][0])
    for corr, start, duration in activities:
        t = launches.get(corr, start)
        for i in order:
            lo, hi = reps[i]
            if lo <= t <= hi:
                totals[i] += duration
                seen[i] = True
                break
    return [totals[i] * 1e-9 for i in range(len(reps)) if seen[i]]


def _l2_flush_buffer(device: str) -> Any:
    import torch

    l2 = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "L2_cache_size", 50 << 20)
    return torch.empty(max(2 * l2, 64 << 20), dtype=torch.uint8, device=device)


def device_times(fn: Callable[..., Any], args: tuple, kwargs: dict, reps: int = 10, budget_s: float = 1.0) -> list[float]:
    """Device time of each of ``reps`` calls, L2 flushed before each: the sum of the
    durations of the kernels and copies each call launched, read from the profiler
    (CUPTI), never an event pair around the Python call (which adds launch time)."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile, record_function

    flush = _l2_flush_buffer("cuda")
    deadline = time.perf_counter() + budget_s
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(reps):
            flush.zero_()
            torch.cuda.synchronize()
            with record_function(f"{REP_RANGE_PREFIX}{i}"):
                fn(*args, **kwargs)
                torch.cuda.synchronize()
            if i >= 2 and time.perf_counter() > deadline:
                break
    ranges: dict[int, tuple[int, int]] = {}
    launches: dict[int, int] = {}
    activities: list[tuple[int, int, int]] = []
    for e in prof.profiler.kineto_results.events():
        name = e.name()
        if e.device_type() == DeviceType.CUDA:
            try:
                activity = e.activity_type()
            except Exception:
                activity = ""
            if name.startswith(("fusioncheck", "ProfilerStep")) or "annotation" in activity or _is_user_annotation(e):
                continue  # ranges mirrored on the GPU timeline, not work
            if activity and activity not in ("kernel", "concurrent_kernel", "gpu_memcpy", "gpu_memset"):
                continue
            activities.append((e.linked_correlation_id(), e.start_ns(), e.duration_ns()))
        elif name.startswith(REP_RANGE_PREFIX):
            ranges[int(name[len(REP_RANGE_PREFIX):])] = (e.start_ns(), e.end_ns())
        elif e.correlation_id():
            launches[e.correlation_id()] = e.start_ns()
    reps_ns = [ranges[i] for i in sorted(ranges)]
    return per_rep_device_time(reps_ns, launches, activities)


def _is_user_annotation(e: Any) -> bool:
    try:
        return bool(e.is_user_annotation())
    except Exception:
        return False


def wall_times(fn: Callable[..., Any], args: tuple, kwargs: dict, device: str, reps: int = 10, budget_s: float = 1.0) -> list[float]:
    """Wall time of each of ``reps`` calls, synchronised, unprofiled (L2 flushed first on a GPU)."""
    import torch

    flush = _l2_flush_buffer(device) if device == "cuda" else None
    times: list[float] = []
    deadline = time.perf_counter() + budget_s
    for i in range(reps):
        if flush is not None:
            flush.zero_()
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn(*args, **kwargs)
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        if i >= 2 and time.perf_counter() > deadline:
            break
    return times


def median_time(fn: Callable[..., Any], args: tuple, kwargs: dict, device: str, reps: int = 10, budget_s: float = 1.0) -> tuple[float, int, float]:
    """``(time, repeats, wall time)``: on a GPU the median device time with the L2 flushed
    and the median unprofiled wall time; on CPU the median wall time for both."""
    walls = wall_times(fn, args, kwargs, device, reps, budget_s)
    wall = statistics.median(walls)
    if device != "cuda":
        return wall, len(walls), wall
    dev = device_times(fn, args, kwargs, reps, budget_s)
    if not dev:
        return wall, len(walls), wall
    return statistics.median(dev), len(dev), wall


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
        seconds, n, wall = retime()
        report.time_s = seconds
        report.wall_time_s = wall
        report.time_source = (
            f"median device time of {n} runs, L2 flushed" if report.device == "cuda" else f"median wall time of {n} runs"
        )
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
