"""CUDA-graph replay of a profiled call: what a graph would recover of a launch-bound
region (docs/launch_bound.md).

``replay_time(fn, args, kwargs)`` first runs the call once with torch's sync debug mode
set to "error", so that a call which synchronises with the host (``.item()``, ``.cpu()``,
``nonzero``, a copy from pageable memory) is refused before any capture starts. It then
warms the call up on a side stream, as torch's CUDA-graph notes prescribe, captures one
call into a ``torch.cuda.CUDAGraph`` and times batches of replays with CUDA events
around them: a replay is one launch, so the event pair measures the graph, not the host.

It returns ``(seconds a replay, None)`` or ``(None, why not)`` and never raises for a
call that cannot be captured. A failed capture is cleaned up: the caller's stream is
current again, the allocator stops routing to the capture's pool
(``_compat.abandon_graph_pool``), the graph is reset, so the next profile works.
"""

from __future__ import annotations

import statistics
from typing import Any, Callable

from . import _compat

MODES = ("off", "auto", "all")  # --fusion-graph-replay: never, launch-bound reports, every report
WARMUP = 3  # calls on the side stream before the capture
BATCH_S = 2e-3  # a timed batch of replays lasts about this long
BATCHES = 5  # the time is the median of this many batches
MAX_REPLAYS = 1000  # replays in one batch, at most

ALREADY_A_GRAPH = (
    "the call already replays CUDA graph(s) (torch.compile(mode='reduce-overhead'), or a "
    "torch.cuda.CUDAGraph of its own): its wall time is a graph's, there is nothing to capture"
)
NO_CALLABLE = (
    "a `with` region has no callable to replay; profile it as a function "
    "(fusion.profile(fn, ..., graph_replay=True)) to measure the graph time"
)


def wanted(asked: bool | None, mode: str, launch_bound: bool) -> bool:
    """Whether a report gets a replay: ``asked`` (``profile(..., graph_replay=)``) wins;
    else the session's mode: ``"all"``, or ``"auto"`` for a launch-bound report."""
    if asked is not None:
        return asked
    return mode == "all" or (mode == "auto" and launch_bound)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".strip()


def _root(exc: BaseException) -> BaseException:
    """The first error of a chain: a capture that failed inside the call raises again
    when it ends ("operation failed due to a previous error during capture")."""
    seen = {id(exc)}
    while exc.__context__ is not None and id(exc.__context__) not in seen:
        exc = exc.__context__
        seen.add(id(exc))
    return exc


def capture_failure(exc: BaseException) -> str:
    """Why a capture failed, in a sentence that names the cause."""
    root = _root(exc)
    text = str(root)
    if "synchronizing CUDA operation" in text:
        return (
            "the call synchronises with the host (.item(), .tolist(), .cpu(), a data-dependent "
            "shape such as nonzero, a copy from pageable host memory), which a CUDA graph cannot "
            f"capture ({_first_line(root)})"
        )
    if "captur" in text.lower():
        return f"the call does something a CUDA-graph capture cannot record ({_first_line(root)})"
    return f"the capture failed: {_first_line(root)}"


def _synchronises(fn: Callable[..., Any], args: tuple, kwargs: dict) -> str | None:
    """Run the call once with sync debug mode "error": the reason when it synchronises
    with the host (or fails), else ``None``."""
    import torch

    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        fn(*args, **kwargs)
    except Exception as exc:
        if "synchronizing CUDA operation" in str(exc):
            return capture_failure(exc)
        return f"the call failed when run again before the capture: {_first_line(exc)}"
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    torch.cuda.synchronize()
    return None


def _capture(fn: Callable[..., Any], args: tuple, kwargs: dict, stream: Any) -> tuple[Any, Any, str | None]:
    """``(graph, output, None)``, or ``(None, None, why)`` with the failed capture undone."""
    import torch

    caller = torch.cuda.current_stream()
    device = torch.cuda.current_device()
    pool = torch.cuda.graph_pool_handle()
    graph = torch.cuda.CUDAGraph()
    why = None
    try:
        # thread_local: work of other threads during the capture neither fails it nor fails.
        with torch.cuda.graph(graph, pool=pool, stream=stream, capture_error_mode="thread_local"):
            output = fn(*args, **kwargs)
    except Exception as exc:
        why = capture_failure(exc)
    if why is None:
        return graph, output, None
    # torch.cuda.graph leaves the capture stream current when capture_end raises.
    torch.cuda.set_stream(caller)
    _compat.abandon_graph_pool(device, pool)
    graph.reset()
    try:
        torch.cuda.synchronize()
    except RuntimeError:  # an asynchronous error of the call itself: reported, not raised
        pass
    return None, None, why


def _time_replays(graph: Any) -> float:
    """Median seconds a replay, from CUDA events around batches of back-to-back replays."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def batch(n: int) -> float:
        start.record()
        for _ in range(n):
            graph.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e-3

    batch(1)  # the first replay uploads the graph
    n = max(1, min(MAX_REPLAYS, int(BATCH_S / max(batch(1), 1e-7))))
    return statistics.median(batch(n) / n for _ in range(BATCHES))


def replay_time(fn: Callable[..., Any], args: tuple, kwargs: dict, warmup: int = WARMUP) -> tuple[float | None, str | None]:
    """``(seconds a replay of fn(*args, **kwargs) from a CUDA graph, None)``, or
    ``(None, why it could not be captured)``."""
    import torch

    if torch.cuda.is_current_stream_capturing():
        return None, "the call was profiled inside another CUDA-graph capture"
    why = _synchronises(fn, args, kwargs)
    if why is not None:
        return None, why
    caller = torch.cuda.current_stream()
    side = torch.cuda.Stream()
    side.wait_stream(caller)
    try:
        with torch.cuda.stream(side):
            for _ in range(warmup):
                fn(*args, **kwargs)
    except Exception as exc:
        return None, f"the call failed on a side stream (the capture's warm-up): {_first_line(exc)}"
    caller.wait_stream(side)
    torch.cuda.synchronize()
    graph, output, why = _capture(fn, args, kwargs, side)
    if graph is None:
        return None, why
    try:
        return _time_replays(graph), None
    finally:
        del output
        graph.reset()
