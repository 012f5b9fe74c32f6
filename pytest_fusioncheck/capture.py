"""Capture: warm up, then run once under ``torch.profiler`` and build a ``FusionReport``.

``profile(fn, *args)`` calls ``fn`` ``warmup`` times unprofiled (Dynamo compiles and
Triton autotunes there, with Inductor's byte hooks on), synchronises, then calls it once
more with every recorder on:

* ``torch.profiler`` (CPU, plus CUDA activities on a GPU) inside an NVTX start/end range
  named ``fusioncheck:<seq>:<label>`` (what ``--fusion-counters=ncu`` filters on);
* the ATen op observer (``ops.make_op_observer``): op, bytes, user ``file:line``;
* a hook on Triton's launcher: name, declared bytes and source of directly launched
  Triton kernels (and, under ``TRITON_INTERPRET=1``, the launch itself, which is then
  counted as one kernel: the CPU model of what the GPU would launch).

Every switch is restored when the call returns. The device's kernel source
(``sources.kernel_source``) turns the profiler's events into kernels. ``Region`` does the
same for a ``with`` block (no warm-up: the block runs once).

On a GPU a profiled call can also be replayed from a CUDA graph (``graph_replay.py``):
asked per call (``graph_replay=True``) or for the session (``--fusion-graph-replay``:
launch-bound reports, or every report), the report then carries the graph's time a call
beside the eager wall time, or the reason there is none (docs/launch_bound.md).
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from typing import Any, Callable

from . import _compat, host_syncs
from .budget import Budget, default_budget, find_captures, iter_tensors, storage_key
from .headroom import find_chains
from .ops import TritonLaunch, make_op_observer, module_names, module_path
from .ranges import CALL_RANGE, SYNC_RANGE_PREFIX, TRITON_RANGE_PREFIX, nvtx_range_name
from .report import FusionReport
from .sources import kernel_source
from .sources.bytes_model import (
    bound_launch_args,
    declared_launch_metadata,
    graph_host_reads,
    inductor_hooks,
    launch_dtype,
    launch_tensors,
    marked_calls,
    triton_launch_bytes,
    triton_launch_flops,
)
from .state import current_log, record_report
from .where import is_internal, relpath, split_source, user_source


_NVTX: list = []  # (start, end): the nvtx package's, else torch's; resolved at the first capture


def _nvtx() -> tuple[Callable[[str], Any], Callable[[Any], None]]:
    if not _NVTX:
        try:
            import nvtx

            _NVTX.append((lambda name: nvtx.start_range(message=name), nvtx.end_range))
        except ImportError:  # a failed import costs ~50 us: not tried again each capture
            import torch

            _NVTX.append((torch.cuda.nvtx.range_start, torch.cuda.nvtx.range_end))
    return _NVTX[0]


def _nvtx_start(name: str) -> int:
    """Open a start/end range in NVTX's default domain (the ``nvtx`` package, else torch's).
    Start/end ranges are process-wide: kernels that autograd's device thread launches in a
    backward pass are inside it too (a push/pop range belongs to the calling thread)."""
    return _nvtx()[0](name)


def _nvtx_end(range_id: Any) -> None:
    _nvtx()[1](range_id)


class FusionCheckError(RuntimeError):
    """The plugin cannot do what was asked (bad device, profiler busy, bad argument)."""


class ProfilerBusyError(FusionCheckError):
    """Another ``torch.profiler`` session is already running in this process."""


class _State(threading.local):
    def __init__(self) -> None:
        self.active: "_Recorders | None" = None


_state = _State()
_seq = [0]


def resolve_device(device: str | None, args: Any = ()) -> str:
    """"cuda" or "cpu": explicit, else the device of the first tensor argument, else CUDA if present."""
    import torch

    if device is None:
        for t in iter_tensors(args):
            device = t.device.type
            break
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = str(device)
    kind = device.split(":")[0]
    if kind not in ("cuda", "cpu"):
        raise FusionCheckError(f"unsupported device {device!r}: fusioncheck profiles 'cuda' and 'cpu'")
    if kind == "cuda" and not torch.cuda.is_available():
        raise FusionCheckError(
            "device 'cuda' was requested but torch.cuda.is_available() is False "
            f"(torch {torch.__version__}); use --fusion-device cpu or run on a GPU machine"
        )
    return kind


def device_name(device: str) -> str:
    import torch

    if device == "cuda":
        return torch.cuda.get_device_name()
    return ""


def synchronize(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def _check_profiler_free() -> None:
    if _compat.profiler_enabled():
        raise ProfilerBusyError(
            "another torch.profiler session is active in this process; fusioncheck needs its own. "
            "Stop the other profiler (or profile outside it) before calling fusion.profile / fusion.region."
        )


class _Recorders:
    """Everything switched on around the one profiled call."""

    def __init__(self, device: str, label: str, modules: dict[int, str] | None = None, caller: Any = None) -> None:
        self.device = device
        self.caller = caller  # the frame the profiled code runs under (default: the one opening this)
        self.label = label
        self.modules = modules or {}
        self.observer = None
        self.prof = None
        self.triton: list[TritonLaunch] = []
        self._stack = contextlib.ExitStack()
        self._nvtx: Any = None  # the open NVTX range's id
        self.seq = 0
        self._t0 = 0.0
        self.wall_s: float | None = None
        self.explicit_syncs: dict[int, str | None] = {}  # sync range index -> user line (host_syncs.py)
        self.unseen_graphs = 0  # calls of compiled graphs compiled before the hooks (graph_call)
        self._call_range: Any = None

    def triton_launch(self, jitfn, original, args, kwargs, grid, warmup, interpreted):
        """The launcher hook (``_compat.triton_launch_hook``): record, then launch."""
        import torch

        if warmup:  # a compile without a launch (JITFunction.warmup): nothing runs on the device
            return original(jitfn, *args, grid=grid, warmup=warmup, **kwargs)
        name = getattr(jitfn, "__name__", None) or getattr(getattr(jitfn, "fn", None), "__name__", "triton_kernel")
        bound = bound_launch_args(jitfn, args, kwargs)
        metadata = declared_launch_metadata(jitfn, name, grid, bound)
        tensors = launch_tensors(list(args) + list(kwargs.values()))
        index = len(self.triton)
        launch = TritonLaunch(index, name, triton_launch_bytes(metadata, tensors), user_source(2), interpreted=interpreted)
        launch.flops, launch.dtype = triton_launch_flops(metadata), launch_dtype(tensors)
        # the module running the launch, as an op's (a kernel a model's forward launches names its layer)
        launch.module = module_path(self.modules, stop=getattr(self.observer, "stop_frame", None))
        launch.inside_op = getattr(self.observer, "running", None)
        self.triton.append(launch)
        if not interpreted:
            return original(jitfn, *args, grid=grid, warmup=warmup, **kwargs)
        # Under the interpreter the launch runs torch ops on the host: hide them from
        # the op observer and count the launch as one kernel.
        paused = self.observer is not None
        if paused:
            self.observer.paused += 1
        t0 = time.perf_counter_ns()
        try:
            with torch.profiler.record_function(f"{TRITON_RANGE_PREFIX}{index}"):
                return original(jitfn, *args, grid=grid, warmup=warmup, **kwargs)
        finally:
            launch.wall_ns = time.perf_counter_ns() - t0
            if paused:
                self.observer.paused -= 1

    def graph_call(self, run: Callable[[], Any]) -> Any:
        """The compiled-graph hook (``_compat.graph_call_hook``): a graph whose run calls no wrapper the codegen hooks
        marked was compiled before they opened, and its kernels have no figures (on CPU: no profiler events)."""
        before = marked_calls()
        out = run()
        if self._call_range is not None and marked_calls() == before:
            self.unseen_graphs += 1
        return out

    def explicit_sync(self, original: Any, *args: Any) -> Any:
        """The explicit-sync hook (``_compat.explicit_sync_hook``): inside the profiled
        call, a range and the user line; the capture's own syncs pass straight through."""
        import torch

        if self._call_range is None:
            return original(*args)
        index = len(self.explicit_syncs)
        self.explicit_syncs[index] = user_source(3)
        with torch.profiler.record_function(f"{SYNC_RANGE_PREFIX}{index}"):
            return original(*args)

    def __enter__(self) -> "_Recorders":
        import torch
        from torch.profiler import ProfilerActivity, profile

        if _state.active is not None:
            raise FusionCheckError("fusioncheck captures cannot nest: a profiled region is already open")
        _check_profiler_free()
        activities = [ProfilerActivity.CPU]
        if self.device == "cuda":
            activities.append(ProfilerActivity.CUDA)
        synchronize(self.device)
        _seq[0] += 1
        self.seq = _seq[0]
        try:
            if self.device == "cuda":
                self._nvtx = _nvtx_start(nvtx_range_name(self.seq, self.label))
            self._stack.enter_context(_compat.triton_launch_hook(self.triton_launch))
            if self.device == "cpu":  # on CUDA every kernel is an event (a CUDA-graph replay calls no wrapper either)
                self._stack.enter_context(_compat.graph_call_hook(self.graph_call))
            self.prof = profile(activities=activities)
            self._stack.enter_context(self.prof)
            self.observer = make_op_observer(record_ranges=True)
            self.observer.modules = self.modules
            self.observer.stop_frame = self.caller or sys._getframe(1)
            self._stack.enter_context(self.observer)
            if self.device == "cuda":
                self._stack.enter_context(_compat.explicit_sync_hook(self.explicit_sync))
            self._call_range = _compat.fast_range(CALL_RANGE)
            self._call_range.__enter__()
        except BaseException:
            self._close()
            raise
        _state.active = self
        self._t0 = time.perf_counter()
        return self

    def _end_call(self) -> None:
        call_range, self._call_range = self._call_range, None
        if call_range is not None:
            call_range.__exit__(None, None, None)

    def _close(self) -> None:
        try:
            self._end_call()
            self._stack.close()
        finally:
            if self._nvtx is not None:
                _nvtx_end(self._nvtx)
                self._nvtx = None

    def __exit__(self, *exc: Any) -> None:
        _state.active = None
        self.caller = None
        if self.observer is not None:
            self.observer.stop_frame = None  # no frame kept alive past the capture
        try:
            self._end_call()  # the call's window ends: the capture's own sync is outside it
            synchronize(self.device)
            self.wall_s = time.perf_counter() - self._t0
        finally:
            self._close()


def _build_report(rec: _Recorders, label: str, source: str | None) -> FusionReport:
    """The report of one capture, from the device's kernel source."""
    ops = list(rec.observer.records) if rec.observer is not None else []
    names = rec.observer.modules if rec.observer is not None else rec.modules
    kernels, copies = kernel_source(rec.device).kernels(rec.prof, ops, rec.triton, names)
    report = FusionReport(
        label=label,
        device=rec.device,
        kernels=kernels,
        copies=copies,
        device_name=device_name(rec.device),
        source=source,
    )
    report.wall_time_s = rec.wall_s
    report.unseen_graphs = rec.unseen_graphs
    report.host_syncs = host_syncs.from_profiler(rec.prof, rec.device, ops, rec.explicit_syncs, graph_host_reads)
    if rec.device == "cuda":
        report.time_s = report.device_time_s
        report.time_source = "device time of the profiled call"
    else:
        report.time_s = report.kernel_time_s
        report.time_source = "wall time of the profiled call's kernels"
    report.seq = rec.seq
    if current_log().settings.trace_dir:  # the profiler's events are large: kept only to export traces
        report.trace = rec.prof
    return report


def _graph_break_recorder():
    from .graph_breaks import GraphBreakRecorder

    return GraphBreakRecorder()


def _definition_site(fn: Any) -> str | None:
    """``file:line`` where a (compiled) function or module's forward is defined, when that
    is user code (a ``torch.nn.Sequential``'s forward is torch's: ``None`` then)."""
    import inspect

    import torch

    target = _compat.compiled_inner(fn) or fn
    if isinstance(target, torch.nn.Module):
        target = type(target).forward
    try:
        target = inspect.unwrap(target)  # a decorated forward: the function it decorates
    except ValueError:
        pass
    code = getattr(target, "__code__", None)
    if code is None or is_internal(code.co_filename):
        return None
    return f"{relpath(code.co_filename)}:{code.co_firstlineno}"


def _name_root_kernels(report: FusionReport, modules: list[Any], names: dict[int, str]) -> None:
    """Name the generated kernels of a compiled model's own ``forward`` by the model, as its
    eager ops are (by class: ``Block``). Dynamo compiles that forward as the frame itself, so
    its ops carry no ``nn_module_stack`` entry; a kernel with no module whose source line lies
    in a captured root module's ``forward`` gets that root's name (``names``: ops.module_names)."""
    import inspect

    if not any(k.module is None and k.generated for k in report.kernels):
        return  # no kernel to name: the source lookups below are skipped
    spans = []
    for module in modules:
        module = getattr(module, _compat.COMPILED_MODULE_ATTR, module)
        if names.get(id(module)) != type(module).__name__:
            continue  # not a root: its kernels carry their path from the stack
        try:
            forward = inspect.unwrap(type(module).forward)
            lines, first = inspect.getsourcelines(forward)
            filename = inspect.getsourcefile(forward)
        except (OSError, TypeError, ValueError):
            continue
        if filename and not is_internal(filename):
            spans.append((relpath(filename), first, first + len(lines) - 1, names[id(module)]))
    if not spans:
        return
    for k in report.kernels:
        where = split_source(k.source) if k.module is None and k.generated else None
        if where is None:
            continue
        for span_path, first, last, name in spans:
            if where[0] == span_path and first <= where[1] <= last:
                k.module = name
                break


def profile_call(
    fn: Callable[..., Any],
    args: tuple,
    kwargs: dict,
    *,
    warmup: int = 1,
    device: str | None = None,
    label: str | None = None,
    budget: Budget | None = None,
    graph_replay: bool | None = None,
    timing: bool | None = None,
    source: str | None = None,
) -> FusionReport:
    """The engine behind ``profile`` and ``fusion.profile``: the report, complete.

    ``timing`` times the call again without the profiler (``median_time_s``, the peak
    bandwidth, the L2 notes); ``None`` takes the current log's choice (a test's: what its
    markers and code ask for; outside pytest: on). A CUDA-graph replay times it too.
    ``source`` is the report's ``file:line`` when no user frame called this."""
    __tracebackhide__ = True
    if not callable(fn):
        raise TypeError(f"profile() needs a callable first, got {type(fn).__name__}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be a non-negative int, got {warmup!r}")
    if graph_replay is not None and not isinstance(graph_replay, bool):
        raise TypeError(
            f"graph_replay must be True, False or None (None: the session's --fusion-graph-replay), got {graph_replay!r}"
        )
    if budget is not None and not isinstance(budget, Budget):
        raise TypeError(
            f"budget must be a Budget (Budget(read_bytes=..., write_bytes=...) or Budget.from_tensors(...)), got {type(budget).__name__}"
        )
    dev = resolve_device(device, (args, kwargs))
    label = label or getattr(fn, "__qualname__", None) or getattr(type(fn), "__name__", "call")
    source = user_source(2) or source
    recorder = _graph_break_recorder()
    # Inductor's hooks before the warm-up, which is where torch.compile compiles.
    with inductor_hooks(), recorder as breaks:
        for _ in range(warmup):
            fn(*args, **kwargs)
        synchronize(dev)
        # after the warm-up: an optimizer's state exists from its first step
        captures = find_captures(fn, (args, kwargs))
        before = captures.snapshot((args, kwargs)) if budget is None else None
        names = module_names(captures.modules)
        with _Recorders(dev, label, names) as rec:
            output = fn(*args, **kwargs)
    report = _build_report(rec, label, source)
    _name_root_kernels(report, captures.modules, names)
    origin = _definition_site(fn) or source  # else the user line that profiled it
    for k in report.kernels:
        if k.source is None and origin and k.generated:
            k.source = origin  # a generated kernel: where the compiled code is defined
    report.output = output
    report.budget = budget if budget is not None else default_budget(args, kwargs, output, fn, before, _written_storages(rec), _read_storages(rec, report))
    if before is not None:
        note = _budget_misses_parameters(rec, before)
        if note:
            report.warnings.append(note)
    report.headroom = find_chains(report.kernels, returned={storage_key(t) for t in iter_tensors(output)}, device_time=report.device == "cuda")
    arg_devices = {t.device.type for t in iter_tensors((args, kwargs))}
    if arg_devices and dev not in arg_devices:
        report.warnings.append(
            f"profiled on {dev} but the tensor arguments are on {', '.join(sorted(arg_devices))}: "
            f"work on other devices is not counted (move the inputs to {dev}, e.g. fusion.device)"
        )
    if breaks is not None:
        report.graph_breaks = list(getattr(breaks, "breaks", []))
        report.recompiles = list(getattr(breaks, "recompiles", []))
    log = current_log()
    _time_and_replay(report, log, timing, graph_replay, rec.prof, (fn, args, kwargs))
    _fill_bytes(report, log)
    return report


def _time_and_replay(report: FusionReport, log: Any, timing: bool | None, replay: bool | None, prof: Any, call: tuple) -> None:
    """Time the call when ``timing`` (None: the log's choice) or a CUDA-graph replay asks
    for it, then replay it: the graph's time is compared with the median wall time."""
    replay = _replay_wanted(report, log, replay, call[0])
    _time(report, log, call if (log.times_calls() if timing is None else timing) or replay else None)
    if replay:
        _replay_in_graph(report, prof, *call)


def _time(report: FusionReport, log: Any, call: tuple | None) -> None:
    """The call timed again without the profiler (``call``: ``(fn, args, kwargs)``, or
    None when the caller did not ask), the peak bandwidth and what a timed GPU report says
    about the L2. Untimed, the peak is the session's ``--fusion-peak-bandwidth`` or None: a
    figure measured by an earlier test would make the report depend on test order."""
    from . import roofline

    settings = log.settings
    if call is None:
        report.peak_bandwidth = settings.peak_bandwidth
        return
    report.peak_bandwidth = roofline.peak_bandwidth(report.device, report.device_name, settings)
    report.median_time_s, _, report.median_wall_time_s, report.median_source = roofline.median_time(*call, report.device)
    if report.device == "cuda":
        report.warnings += [w for w in roofline.l2_warnings(report, roofline.l2_cache_size()) if w not in report.warnings]


def _fill_bytes(report: FusionReport, log: Any) -> None:
    """Measured bytes (``--fusion-counters=ncu``) for a report of a running test, by the
    index it will be recorded at."""
    if log.test_id is not None:
        from .sources import byte_source

        byte_source(log.settings).fill(report, log.test_id, len(log.reports))


def _written_storages(rec: _Recorders) -> set:
    """Storage keys the profiled call's observed ops wrote."""
    records = rec.observer.records if rec.observer is not None else []
    return {key for r in records for key in r.writes}


def _read_storages(rec: _Recorders, report: FusionReport) -> set | None:
    """Storage keys the profiled call's ops read, when every kernel it launched was an
    observed ATen op (else None: a generated or Triton kernel's reads are not known)."""
    if any(not k.op.startswith("aten::") for k in report.kernels):
        return None
    records = rec.observer.records if rec.observer is not None else []
    return {key for r in records for key in r.reads}


def _budget_misses_parameters(rec: _Recorders, before: Any) -> str | None:
    """A note when the profiled ops read ``nn.Parameter`` storages that the default budget
    does not hold: a module the capture search could not reach (docs/bytes.md)."""
    from .budget import format_bytes

    seen = getattr(rec.observer, "param_reads", None) or {}
    held = {storage_key(t) for t in before.reads()}
    missing = {k: b for k, b in seen.items() if k not in held}
    if not missing:
        return None
    return (
        f"the call read {format_bytes(sum(missing.values()))} of parameters ({len(missing)} tensors) that the default "
        "budget does not hold (their module is not reachable from the callable or its arguments); pass "
        "budget=Budget.from_tensors(reads=[model, inputs], writes=[outputs])"
    )


def _replay_wanted(report: FusionReport, log: Any, asked: bool | None, fn: Callable[..., Any] | None) -> bool:
    """Whether to replay the call from a CUDA graph: per call, else by the session's
    ``--fusion-graph-replay`` (docs/launch_bound.md); where it cannot, ``graph_note`` says why."""
    from . import graph_replay

    if not graph_replay.wanted(asked, log.settings.graph_replay, report.launch_bound):
        return False
    if report.device != "cuda":
        report.graph_note = f"CUDA graphs need a GPU; this report is on {report.device}"
    elif fn is None:
        report.graph_note = graph_replay.NO_CALLABLE
    return report.graph_note is None


def _replay_in_graph(report: FusionReport, prof: Any, fn: Callable[..., Any], args: tuple, kwargs: dict) -> None:
    """Fill ``graph_time_s`` (or ``graph_note``). It is compared with the call's median
    unprofiled wall time, timed before (for a call that already replays graphs too, that
    wall time is the graph's)."""
    from . import graph_replay

    if _compat.graph_launches(prof):  # reduce-overhead: its timed wall time is the graph's
        report.graph_note = graph_replay.ALREADY_A_GRAPH
        return
    report.graph_time_s, report.graph_note = graph_replay.replay_time(fn, args, kwargs or {})


def profile(
    fn: Callable[..., Any], *args: Any, warmup: int = 1, device: str | None = None, budget: Budget | None = None,
    graph_replay: bool | None = None, **kwargs: Any
) -> FusionReport:
    """Profile ``fn(*args, **kwargs)``: ``warmup`` unprofiled calls, then one profiled call.

    ``budget`` replaces the default budget (what the call uses, read once; what it returns
    or updates, written once). The keywords ``warmup``, ``device``, ``budget`` and
    ``graph_replay`` are this function's: to pass one of those names to ``fn`` itself, bind
    it first (``profile(functools.partial(fn, budget=b), x)`` or a lambda). ``graph_replay=True`` also replays the call from a CUDA graph (GPU) and records the
    graph's time a call (``report.graph_time_s``) or why it could not (``graph_note``);
    ``None`` follows ``--fusion-graph-replay`` (off outside pytest). Usable outside
    pytest. The report is also recorded as the latest report of the running test (or of
    the process, outside pytest) for the ``assert_*`` helpers.
    """
    __tracebackhide__ = True
    report = profile_call(fn, args, kwargs, warmup=warmup, device=device, budget=budget, graph_replay=graph_replay)
    record_report(report)
    return report


class Region:
    """``with Region(label) as r: ...`` profiles the block once; ``r.report`` after exit."""

    def __init__(self, label: str = "region", device: str | None = None, on_report: Callable[[FusionReport], None] | None = None) -> None:
        self.label = label
        self.device = device
        self.report: FusionReport | None = None
        self._on_report = on_report
        self._rec: _Recorders | None = None
        self._breaks = None
        self._source: str | None = None

    def __enter__(self) -> "Region":
        self._source = user_source(2)
        self._device = resolve_device(self.device)
        self._stack = contextlib.ExitStack()
        try:
            self._stack.enter_context(inductor_hooks())
            self._breaks = self._stack.enter_context(_graph_break_recorder())
            self._rec = _Recorders(self._device, self.label, caller=sys._getframe(1))
            self._stack.enter_context(self._rec)
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        __tracebackhide__ = True
        self._stack.__exit__(exc_type, exc, tb)
        if exc_type is not None:
            return
        report = _build_report(self._rec, self.label, self._source)
        report.headroom = find_chains(report.kernels, device_time=report.device == "cuda")
        if self._breaks is not None:
            report.graph_breaks = list(getattr(self._breaks, "breaks", []))
            report.recompiles = list(getattr(self._breaks, "recompiles", []))
        log = current_log()
        _replay_wanted(report, log, None, None)  # a block cannot be replayed: the note says so
        _time(report, log, None)  # a block cannot be re-run: its time is its kernels'
        _fill_bytes(report, log)
        self.report = report
        if self._on_report is not None:
            self._on_report(report)

