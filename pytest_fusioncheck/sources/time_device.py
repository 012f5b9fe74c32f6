"""Time source for GPUs: device time, as CUPTI recorded it.

The durations of the kernels and copies one call launched, summed, for each of up to 10
calls with the L2 flushed before each (docs/bytes.md, "Time"). Never an event pair around
the Python call: that adds the launcher's host time, and a kernel at copy speed reads as
55-77% of peak.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

from .._compat import device_activity_kind, kineto_events
from ..ranges import REP_RANGE_PREFIX
from .time_wall import l2_flush_buffer, wall_times


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


def device_times(fn: Callable[..., Any], args: tuple, kwargs: dict, reps: int = 10, budget_s: float = 1.0) -> list[float]:
    """Device time of each of ``reps`` calls, L2 flushed before each: the sum of the
    durations of the kernels and copies each call launched, read from the profiler
    (CUPTI), never an event pair around the Python call (which adds launch time)."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile, record_function

    flush = l2_flush_buffer("cuda")
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
    for e in kineto_events(prof):
        name = e.name()
        if e.device_type() == DeviceType.CUDA:
            if device_activity_kind(e) is None:
                continue  # ranges mirrored on the GPU timeline, syncs: not work
            activities.append((e.linked_correlation_id(), e.start_ns(), e.duration_ns()))
        elif name.startswith(REP_RANGE_PREFIX):
            ranges[int(name[len(REP_RANGE_PREFIX):])] = (e.start_ns(), e.end_ns())
        elif e.correlation_id():
            launches[e.correlation_id()] = e.start_ns()
    reps_ns = [ranges[i] for i in sorted(ranges)]
    return per_rep_device_time(reps_ns, launches, activities)


class DeviceTime:
    """``TimeSource`` for GPUs: median device time, median unprofiled wall time beside it."""

    def time(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> tuple[float, int, float, str]:
        wall = statistics.median(wall_times(fn, args, kwargs, "cuda"))
        dev = device_times(fn, args, kwargs)
        if not dev:  # nothing launched (or no Kineto events): the wall time is all there is
            return wall, 0, wall, "wall time (no device activity recorded)"
        return statistics.median(dev), len(dev), wall, f"median device time of {len(dev)} runs, L2 flushed"

