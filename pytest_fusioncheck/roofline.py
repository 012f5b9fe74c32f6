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
  A region's time is its kernels' device time in its one run. Capture times a call when
  its caller asks (``capture.profile_call(timing=)``: docs/bytes.md, "Time").
* Efficiency = (budget bytes / peak bandwidth) / time.
* The roofline plot's ceilings (``--fusion-roofline``, docs/roofline.md): the peak
  bandwidth above when it is known without measuring (override, this session, pytest's
  cache), else a datasheet default per device (``DEFAULT_BANDWIDTH``); peak FLOP/s per
  dtype from a datasheet table (``PEAK_FLOPS``), or a nominal figure on CPU.
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


# Sizes of the GPU copy that measures peak bandwidth, bytes per tensor: each at least 4x
# any current L2 (60 MB on an H200), the largest that fits taken too, the best one kept
# (docs/roofline.md, "Peak bandwidth").
_GPU_COPY_SIZES = (1 << 28, 1 << 29, 1 << 30, 1 << 31)
_GPU_COPIES_PER_TIMING = 4


def measure_copy_bandwidth(device: str, nbytes: int | None = None, reps: int = 10) -> float:
    """Bytes/s (read + write) of a large copy on ``device``.

    On a GPU: device-to-device copies of several sizes (``_GPU_COPY_SIZES``, those that fit
    in a third of the free memory), each timed as ``reps`` rounds of back-to-back copies
    between one pair of events (a launch's gap amortised over the round), median of the
    rounds; the best size is the peak. On CPU: the median of ``reps`` timed host copies.
    ``nbytes`` fixes one size (bytes per tensor)."""
    import torch

    if device != "cuda":
        nbytes = nbytes or (128 << 20)
        src = torch.empty(nbytes, dtype=torch.uint8, device=device).random_()
        dst = torch.empty_like(src)
        times = []
        for _ in range(reps + 2):
            t0 = time.perf_counter()
            dst.copy_(src)
            times.append(time.perf_counter() - t0)
        return 2 * src.numel() / statistics.median(times[2:])
    free, _ = torch.cuda.mem_get_info()
    sizes = [nbytes] if nbytes else [n for n in _GPU_COPY_SIZES if 3 * n <= free] or [min(_GPU_COPY_SIZES)]
    best = 0.0
    for size in sizes:
        src = torch.empty(size, dtype=torch.uint8, device=device).random_()
        dst = torch.empty_like(src)
        for _ in range(2):
            dst.copy_(src)
        rounds = []
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(_GPU_COPIES_PER_TIMING):
                dst.copy_(src)
            end.record()
            end.synchronize()
            rounds.append(start.elapsed_time(end) * 1e-3 / _GPU_COPIES_PER_TIMING)
        best = max(best, 2 * size / statistics.median(rounds))
        del src, dst
        torch.cuda.empty_cache()
    return best


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


def l2_cache_size() -> int:
    """Bytes of L2 on the current CUDA device (0 when torch does not say)."""
    import torch

    return getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "L2_cache_size", 0)


def l2_warnings(report: FusionReport, l2: int) -> list[str]:
    """What a timed GPU report says about its budget and the ``l2``-byte cache: a budget
    under 4x the L2 may time the cache, and one far above the modelled bytes reads high."""
    if report.budget is None:
        return []
    out = []
    if l2 and report.budget.total < 4 * l2:
        out.append(
            f"budget {report.budget.total / 2**20:.1f} MiB is under 4x the {l2 / 2**20:.0f} MiB L2: "
            "timings may measure the cache, not HBM; use larger inputs"
        )
    over = budget_over_modelled(report.budget.total, report.bytes, report.bytes_unmodelled, l2)
    if over:
        out.append(over)
    return out


def budget_over_modelled(budget: int, modelled: int, unmodelled: int, l2: int) -> str | None:
    """A warning when the budget (the least the call must move) exceeds what its kernels
    were modelled to move by more than the L2 could hold: the budget counts tensors the
    call does not touch, and an efficiency from it reads high (docs/roofline.md)."""
    if unmodelled or not l2 or budget - modelled <= l2:
        return None
    return (
        f"budget {budget / 2**20:.1f} MiB is {(budget - modelled) / 2**20:.1f} MiB above the {modelled / 2**20:.1f} MiB "
        f"the kernels were modelled to move (more than the {l2 / 2**20:.0f} MiB L2): the budget counts what the call "
        "does not touch, so the efficiency reads high; pass budget= with what the call reads and writes"
    )


# --------------------------------------------------------------------------- the plot's ceilings

# Datasheet HBM bandwidth (bytes/s) by a substring of the device name, first match wins:
# used only when no measured or overriding figure is known. CPU: a nominal dual-channel
# desktop figure; pass --fusion-peak-bandwidth (or run a bandwidth check once) for yours.
DEFAULT_BANDWIDTH: list[tuple[str, float]] = [
    ("H200", 4.8e12),
    ("H100 PCIe", 2.0e12),
    ("H100", 3.35e12),  # SXM
    ("A100", 2.0e12),  # 80 GB SXM (the 40 GB part: 1.56e12)
    ("cpu", 20e9),
]

# Dense peak FLOP/s by device-name substring and compute dtype (NVIDIA datasheets, no
# sparsity). bf16/fp16/tf32/fp8 are tensor-core peaks (what a GEMM can reach); an
# elementwise kernel's ceiling on CUDA cores is lower, but such kernels sit far left of
# the ridge, under the bandwidth slope.
PEAK_FLOPS: list[tuple[str, dict[str, float]]] = [
    ("H200", {"float64": 67e12, "float32": 67e12, "tf32": 495e12, "bfloat16": 989e12, "float16": 989e12, "float8": 1979e12}),
    ("H100 PCIe", {"float64": 51e12, "float32": 51e12, "tf32": 378e12, "bfloat16": 756e12, "float16": 756e12, "float8": 1513e12}),
    ("H100", {"float64": 67e12, "float32": 67e12, "tf32": 495e12, "bfloat16": 989e12, "float16": 989e12, "float8": 1979e12}),
    ("A100", {"float64": 19.5e12, "float32": 19.5e12, "tf32": 156e12, "bfloat16": 312e12, "float16": 312e12}),
]



def _device_name(device_kind: str) -> tuple[str, str]:
    device, _, name = device_kind.partition(":")
    return device, name


def known_peak_bandwidth(device_kind: str, settings: Settings | None = None, reported: float | None = None) -> tuple[float, str] | None:
    """``(bytes/s, where from)`` for the roofline's slope without measuring anything: the
    ``--fusion-peak-bandwidth`` override, a figure a report carries (measured this session),
    the session's measurements, pytest's cache; else the datasheet default
    (``DEFAULT_BANDWIDTH``); else ``None``."""
    if settings is not None and settings.peak_bandwidth:
        return settings.peak_bandwidth, "--fusion-peak-bandwidth"
    if reported:
        return reported, "measured"
    device, name = _device_name(device_kind)
    key = _device_key(device, name)
    if settings is not None and key in settings.peaks:
        return settings.peaks[key], "measured"
    cache = settings.peak_cache if settings is not None else None
    if cache is not None:
        try:
            cached = cache.get(f"{CACHE_KEY}/{key}", None)
        except Exception:
            cached = None
        if isinstance(cached, (int, float)) and cached > 0:
            return float(cached), "measured (cached)"
    target = name if device != "cpu" else "cpu"
    for pattern, value in DEFAULT_BANDWIDTH:
        if pattern in target:
            return value, "datasheet default, not measured" if device != "cpu" else "nominal default, not measured"
    return None


def _dtype_key(dtype: str | None) -> str:
    dtype = dtype or "float32"
    return "float8" if dtype.startswith("float8") else dtype


def peak_flops(device_kind: str, dtype: str | None) -> tuple[float, str] | None:
    """``(FLOP/s, where from)``: the datasheet dense peak for a known GPU and dtype
    (``PEAK_FLOPS``), the nominal CPU figure (``cpu_nominal_flops``), else ``None``."""
    device, name = _device_name(device_kind)
    key = _dtype_key(dtype)
    if device == "cpu":
        value = cpu_nominal_flops()
        return (value / 2 if key == "float64" else value), "nominal: cores x clock x FLOP/cycle"
    for pattern, table in PEAK_FLOPS:
        if pattern in name:
            if key in table:
                return table[key], "datasheet, dense"
            return None
    return None


def cpu_nominal_flops() -> float:
    """A CPU's nominal fp32 peak: cores x clock x FLOP per cycle per core (64 with AVX-512,
    two FMA units; 32 with AVX2; 8 otherwise), from ``/proc/cpuinfo`` where there is one
    (clock 2.5 GHz when unknown). A ceiling to read the plot against, not a measurement;
    bf16/fp16 get the same figure (no AMX assumed)."""
    import os

    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    per_cycle, ghz = 8, 2.5
    try:
        with open("/proc/cpuinfo") as fh:
            text = fh.read(200_000)
        flags = next((line for line in text.splitlines() if line.startswith("flags")), "")
        per_cycle = 64 if " avx512f" in flags else 32 if " avx2" in flags else 8
        mhz = next((line.split(":")[1] for line in text.splitlines() if line.startswith("cpu MHz")), None)
        if mhz is not None and float(mhz) > 100:
            ghz = float(mhz) / 1000
    except (OSError, ValueError, IndexError):
        pass
    return cores * ghz * 1e9 * per_cycle
