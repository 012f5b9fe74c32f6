"""Time source for any device: wall time of a synchronised, unprofiled call.

On CPU it is the only time there is; on a GPU it is kept beside device time, and the gap
between the two is launch overhead.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable


def l2_flush_buffer(device: str) -> Any:
    """A buffer twice the L2 (at least 64 MiB): writing it evicts whatever a call left there."""
    import torch

    l2 = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "L2_cache_size", 50 << 20)
    return torch.empty(max(2 * l2, 64 << 20), dtype=torch.uint8, device=device)


def wall_times(fn: Callable[..., Any], args: tuple, kwargs: dict, device: str, reps: int = 10, budget_s: float = 1.0) -> list[float]:
    """Wall time of each of ``reps`` calls, synchronised, unprofiled (L2 flushed first on a GPU)."""
    import torch

    flush = l2_flush_buffer(device) if device == "cuda" else None
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


class WallTime:
    """``TimeSource`` for CPU: the median wall time (it is also the "device" time)."""

    def time(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> tuple[float, int, float, str]:
        walls = wall_times(fn, args, kwargs, "cpu")
        wall = statistics.median(walls)
        return wall, len(walls), wall, f"median wall time of {len(walls)} runs"

