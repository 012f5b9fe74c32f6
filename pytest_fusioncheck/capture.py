"""Capture: warm up, then run once under ``torch.profiler`` and build a ``FusionReport``.

``profile(fn, *args)`` calls ``fn`` ``warmup`` times unprofiled (Dynamo compiles and
Triton autotunes there), synchronises, then calls it once more with every recorder on:

* ``torch.profiler`` (CPU, plus CUDA activities on a GPU) inside an NVTX range named
  ``fusioncheck:<label>`` (what ``--fusion-counters=ncu`` filters on);
* the ATen op observer (``kernels.make_op_observer``): op, bytes, user ``file:line``;
* a hook on Triton's launcher: name, declared bytes and source of directly launched
  Triton kernels (and, under ``TRITON_INTERPRET=1``, the launch itself, which is then
  counted as one kernel: the CPU model of what the GPU would launch).

``Region`` does the same for a ``with`` block (no warm-up: the block runs once).
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from .budget import Budget, iter_tensors
from .bytes_model import (
    inductor_kernel_bytes,
    inductor_kernel_estimate,
    install_inductor_hooks,
    launch_tensors,
    triton_launch_bytes,
)
from .kernels import (
    OP_RANGE_PREFIX,
    Kernel,
    OpRecord,
    generated_origin,
    inductor_cpu_kernel,
    make_op_observer,
    user_source,
)
from .report import FusionReport

TRITON_RANGE_PREFIX = "fusioncheck::triton#"
NVTX_PREFIX = "fusioncheck:"


def nvtx_range_name(seq: int, label: str) -> str:
    """``fusioncheck:<seq>:<label>``: the NVTX range ncu filters and attributes kernels by."""
    return f"{NVTX_PREFIX}{seq}:{label}"


def _nvtx_push(name: str) -> None:
    """Open a push/pop range in NVTX's default domain (the ``nvtx`` package, else torch's)."""
    try:
        import nvtx

        nvtx.push_range(name)
    except ImportError:
        import torch

        torch.cuda.nvtx.range_push(name)


def _nvtx_pop() -> None:
    try:
        import nvtx

        nvtx.pop_range()
    except ImportError:
        import torch

        torch.cuda.nvtx.range_pop()


class FusionCheckError(RuntimeError):
    """The plugin cannot do what was asked (bad device, profiler busy, bad argument)."""


class ProfilerBusyError(FusionCheckError):
    """Another ``torch.profiler`` session is already running in this process."""


@dataclass
class TritonLaunch:
    index: int
    name: str
    bytes: int | None
    source: str | None
    wall_ns: int = 0
    interpreted: bool = False


class _State(threading.local):
    def __init__(self) -> None:
        self.active: "_Recorders | None" = None


_state = _State()
_triton_patched = False
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
    import torch

    busy = getattr(torch.autograd.profiler, "_is_profiler_enabled", False)
    try:
        busy = busy or bool(torch._C._autograd._profiler_enabled())
    except AttributeError:
        pass
    if busy:
        raise ProfilerBusyError(
            "another torch.profiler session is active in this process; fusioncheck needs its own. "
            "Stop the other profiler (or profile outside it) before calling fusion.profile / fusion.region."
        )


def _patch_triton_launchers() -> None:
    """Wrap Triton's ``JITFunction.run`` (and the interpreter's) to see direct launches.

    Installed once; the wrappers do nothing unless a capture is active on this thread.
    Inductor's generated kernels bypass ``JITFunction.run`` and are identified by name.
    """
    global _triton_patched
    if _triton_patched or "triton.runtime.jit" not in sys.modules:
        return  # code that has not imported Triton cannot launch a Triton kernel
    _triton_patched = True
    try:
        from triton.runtime import jit as triton_jit
    except Exception:  # triton missing or broken: nothing to hook
        return
    _wrap_run(triton_jit.JITFunction, interpreted=False)
    try:
        from triton.runtime.interpreter import InterpretedFunction
    except Exception:
        return
    _wrap_run(InterpretedFunction, interpreted=True)


def _wrap_run(cls: Any, interpreted: bool) -> None:
    original = cls.run

    def run(self, *args, grid, warmup, **kwargs):
        rec = _state.active
        if rec is None or warmup:
            return original(self, *args, grid=grid, warmup=warmup, **kwargs)
        return rec.triton_launch(self, original, args, kwargs, grid, warmup, interpreted)

    run.__wrapped__ = original  # type: ignore[attr-defined]
    cls.run = run


def bound_launch_args(jitfn: Any, args: tuple, kwargs: dict) -> dict[str, Any]:
    """Argument name -> value of a Triton launch, defaults of unpassed parameters filled in
    (what Triton hands a kernel's ``launch_metadata`` hook)."""
    import inspect

    arg_names = list(getattr(jitfn, "arg_names", []) or [])
    bound = dict(zip(arg_names, args))
    bound.update(kwargs)
    params = getattr(jitfn, "params", None)
    if params is None:  # the interpreter's InterpretedFunction: read the Python signature
        try:
            params = list(inspect.signature(jitfn.fn).parameters.values())
        except (AttributeError, TypeError, ValueError):
            params = []
    for param in params:
        pname = getattr(param, "name", None)
        default = getattr(param, "default", inspect.Parameter.empty)
        if pname and pname not in bound and default is not inspect.Parameter.empty:
            bound[pname] = default
    return bound


class _KernelStandIn:
    """What a ``launch_metadata(grid, kernel, args)`` hook may read off ``kernel`` before
    the launch: its name (Triton passes the compiled kernel; we call the hook earlier)."""

    def __init__(self, name: str) -> None:
        self.name = name


def declared_launch_metadata(jitfn: Any, name: str, grid: Any, bound: dict[str, Any]) -> dict[str, Any] | None:
    """The dict a kernel's ``launch_metadata`` hook returns for this launch, or ``None``."""
    meta_fn = getattr(jitfn, "launch_metadata", None) or (getattr(jitfn, "kwargs", None) or {}).get("launch_metadata")
    if not callable(meta_fn):
        return None
    try:
        metadata = meta_fn(grid, _KernelStandIn(name), bound)
    except Exception:  # a hook that needs more than we have: fall back to the tensors
        return None
    return metadata if isinstance(metadata, dict) else None


class _Recorders:
    """Everything switched on around the one profiled call."""

    def __init__(self, device: str, label: str) -> None:
        self.device = device
        self.label = label
        self.observer = None
        self.prof = None
        self.triton: list[TritonLaunch] = []
        self._stack = contextlib.ExitStack()
        self._nvtx = False
        self.seq = 0
        self._t0 = 0.0
        self.wall_s: float | None = None

    def triton_launch(self, jitfn, original, args, kwargs, grid, warmup, interpreted):
        import torch

        name = getattr(jitfn, "__name__", None) or getattr(getattr(jitfn, "fn", None), "__name__", "triton_kernel")
        bound = bound_launch_args(jitfn, args, kwargs)
        metadata = declared_launch_metadata(jitfn, name, grid, bound)
        tensors = launch_tensors(list(args) + list(kwargs.values()))
        index = len(self.triton)
        launch = TritonLaunch(index, name, triton_launch_bytes(metadata, tensors), user_source(2), interpreted=interpreted)
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

    def __enter__(self) -> "_Recorders":
        from torch.profiler import ProfilerActivity, profile

        if _state.active is not None:
            raise FusionCheckError("fusioncheck captures cannot nest: a profiled region is already open")
        _check_profiler_free()
        install_inductor_hooks()
        _patch_triton_launchers()
        activities = [ProfilerActivity.CPU]
        if self.device == "cuda":
            activities.append(ProfilerActivity.CUDA)
        synchronize(self.device)
        _seq[0] += 1
        self.seq = _seq[0]
        try:
            if self.device == "cuda":
                _nvtx_push(nvtx_range_name(self.seq, self.label))
                self._nvtx = True
            self.prof = profile(activities=activities)
            self._stack.enter_context(self.prof)
            self.observer = make_op_observer(record_ranges=True)
            self._stack.enter_context(self.observer)
        except BaseException:
            self._close()
            raise
        _state.active = self
        self._t0 = time.perf_counter()
        return self

    def _close(self) -> None:
        try:
            self._stack.close()
        finally:
            if self._nvtx:
                _nvtx_pop()
                self._nvtx = False

    def __exit__(self, *exc: Any) -> None:
        _state.active = None
        try:
            synchronize(self.device)
            self.wall_s = time.perf_counter() - self._t0
        finally:
            self._close()


def _cpu_kernels(rec: _Recorders, ops: list[OpRecord]) -> tuple[list[Kernel], list[Kernel]]:
    kernels: list[Kernel] = []
    copies: list[Kernel] = []
    op_events: dict[int, Any] = {}
    triton_events: dict[int, Any] = {}
    for e in rec.prof.events():
        name = e.name
        if name.startswith(OP_RANGE_PREFIX):
            op_events[int(name[len(OP_RANGE_PREFIX):])] = e
        elif name.startswith(TRITON_RANGE_PREFIX):
            triton_events[int(name[len(TRITON_RANGE_PREFIX):])] = e
        else:
            kname = inductor_cpu_kernel(name)
            if kname is not None:
                nbytes = inductor_kernel_bytes(name)
                kernels.append(
                    Kernel(
                        name=kname,
                        time_s=e.time_range.elapsed_us() * 1e-6,
                        bytes=nbytes if nbytes is not None else inductor_kernel_bytes(kname),
                        op=generated_origin(kname),
                        source=None,
                        bytes_estimate=_first_not_none(inductor_kernel_estimate(name), inductor_kernel_estimate(kname)),
                        start_ns=int(e.time_range.start * 1000),
                    )
                )
    for op in ops:
        e = op_events.get(op.index)
        k = Kernel(
            name=op.op,
            time_s=(e.time_range.elapsed_us() * 1e-6) if e is not None else op.wall_ns * 1e-9,
            bytes=op.bytes,
            op=op.op,
            source=op.source,
            kind=op.kind,
            start_ns=int(e.time_range.start * 1000) if e is not None else 0,
        )
        (copies if op.kind == "copy" else kernels).append(k)
    for launch in rec.triton:
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
                start_ns=int(e.time_range.start * 1000) if e is not None else 0,
            )
        )
    kernels.sort(key=lambda k: k.start_ns)
    copies.sort(key=lambda k: k.start_ns)
    return kernels, copies


def _first_not_none(*values: Any) -> Any:
    return next((v for v in values if v is not None), None)


_COPY_ACTIVITIES = {"gpu_memcpy", "gpu_memset"}


def copy_traffic(name: str, nbytes: int | None) -> int | None:
    """HBM bytes of a memcpy/memset activity of ``nbytes``: a device-to-device copy reads
    and writes them, a memset or a host transfer touches device memory once."""
    if nbytes is None:
        return None
    if "DtoD" in name or "Device -> Device" in name or "PtoP" in name:
        return 2 * nbytes
    return nbytes


def _activity_bytes(e: Any) -> int | None:
    """The size Kineto recorded for a memcpy/memset activity (``None`` if it has none)."""
    import json

    try:
        value = e.nbytes()
        if isinstance(value, int) and value > 0:
            return value
    except Exception:
        pass
    try:
        meta = e.metadata_json()
    except Exception:
        return None
    if not meta:
        return None
    try:
        data = json.loads("{" + meta + "}") if not meta.lstrip().startswith("{") else json.loads(meta)
    except ValueError:
        import re

        m = re.search(r'"bytes"\s*:\s*(\d+)', meta)
        return int(m.group(1)) if m else None
    value = data.get("bytes")
    return int(value) if isinstance(value, (int, float)) and value >= 0 else None


def copy_sizes_from_trace(trace: dict[str, Any]) -> dict[int, int]:
    """Correlation id -> bytes of each memcpy/memset in a Chrome trace (Kineto writes the
    size there, and torch's event API does not expose it)."""
    out: dict[int, int] = {}
    for ev in trace.get("traceEvents", []) or []:
        if ev.get("cat") not in ("gpu_memcpy", "gpu_memset"):
            continue
        args = ev.get("args") or {}
        size, corr = args.get("bytes"), args.get("correlation")
        if isinstance(size, (int, float)) and isinstance(corr, int) and size >= 0:
            out[corr] = int(size)
    return out


def _copy_sizes(prof: Any) -> dict[int, int]:
    """``copy_sizes_from_trace`` of the profiler's own trace (exported to a temporary file:
    done only for regions that launched copies)."""
    import json
    import tempfile

    with tempfile.TemporaryDirectory(prefix="fusioncheck-") as tmp:
        path = f"{tmp}/trace.json"
        try:
            prof.export_chrome_trace(path)
            with open(path) as fh:
                return copy_sizes_from_trace(json.load(fh))
        except Exception:  # no sizes: the copies stay unmodelled
            return {}


def attribute_op_bytes(activities: list[Kernel], op_bytes: int | None) -> None:
    """Give one op's modelled traffic to the device activities it launched (the rule of
    ``docs/bytes.md``): copies (memset/memcpy) keep their own size; the op's bytes go to
    its longest compute kernel (the GEMM of a GEMM + memset, the main kernel of a split-K
    GEMM + reduce); its other compute kernels carry 0, their traffic being inside that
    figure. An op that could not be modelled leaves its kernels unmodelled (``None``)."""
    compute = [k for k in activities if k.kind != "copy"]
    if not compute:
        return
    main = max(compute, key=lambda k: k.time_s)
    for k in compute:
        k.bytes = op_bytes if k is main else (0 if op_bytes is not None else None)


def _is_annotation(e: Any, activity: str) -> bool:
    if "annotation" in activity:
        return True
    try:
        return bool(e.is_user_annotation())
    except Exception:
        return False


def _cuda_kernels(rec: _Recorders, ops: list[OpRecord]) -> tuple[list[Kernel], list[Kernel]]:
    """Device activities from Kineto, each attributed to the op or Triton launch behind it."""
    from torch.autograd import DeviceType

    events = list(rec.prof.profiler.kineto_results.events())
    launches: dict[int, Any] = {}
    markers: list[tuple[int, int, int, str]] = []
    device_events = []
    for e in events:
        name = e.name()
        if e.device_type() == DeviceType.CUDA:
            device_events.append(e)
        elif name.startswith(OP_RANGE_PREFIX) or name.startswith(TRITON_RANGE_PREFIX):
            markers.append((e.start_ns(), e.end_ns(), e.start_thread_id(), name))
        elif e.correlation_id():
            launches[e.correlation_id()] = e
    markers.sort()
    by_index = {op.index: op for op in ops}
    triton_queue: dict[str, list[TritonLaunch]] = {}
    for launch in rec.triton:
        triton_queue.setdefault(launch.name, []).append(launch)

    def innermost_op(launch_event: Any) -> OpRecord | None:
        if launch_event is None:
            return None
        t, tid = launch_event.start_ns(), launch_event.start_thread_id()
        best = None
        for start, end, thread, name in markers:
            if start > t:
                break
            if thread == tid and start <= t <= end and name.startswith(OP_RANGE_PREFIX):
                best = name
        return by_index.get(int(best[len(OP_RANGE_PREFIX):])) if best else None

    kernels: list[Kernel] = []
    copies: list[Kernel] = []
    by_op: dict[int, list[Kernel]] = {}
    sizes: dict[int, int] | None = None
    for e in sorted(device_events, key=lambda ev: ev.start_ns()):
        activity = ""
        try:
            activity = e.activity_type()
        except Exception:
            pass
        name = e.name()
        if name.startswith(("fusioncheck", "ProfilerStep")) or _is_annotation(e, activity):
            continue  # our own ranges, mirrored on the GPU timeline
        is_copy = activity in _COPY_ACTIVITIES or name.startswith(("Memcpy", "Memset"))
        if not is_copy and activity not in ("", "kernel", "concurrent_kernel"):
            continue  # sync events, overhead
        op = innermost_op(launches.get(e.linked_correlation_id()))
        k = Kernel(name=name, time_s=e.duration_ns() * 1e-9, kind="copy" if is_copy else "kernel", start_ns=e.start_ns())
        if is_copy:
            nbytes = _activity_bytes(e)
            if nbytes is None:
                if sizes is None:
                    sizes = _copy_sizes(rec.prof)
                nbytes = sizes.get(e.linked_correlation_id(), sizes.get(e.correlation_id()))
            k.bytes = copy_traffic(name, nbytes)
        queue = triton_queue.get(name)
        if op is not None:
            k.op, k.source = op.op, op.source
            by_op.setdefault(op.index, []).append(k)
        elif queue and not is_copy:
            launch = queue.pop(0)
            k.op, k.source, k.bytes = "triton", launch.source, launch.bytes
        elif not is_copy:
            est = inductor_kernel_bytes(name)
            if est is not None or name.startswith("triton_"):
                k.op, k.bytes = generated_origin(name), est
                k.bytes_estimate = inductor_kernel_estimate(name)
        (copies if is_copy else kernels).append(k)
    for index, group in by_op.items():
        attribute_op_bytes(group, by_index[index].bytes)
    return kernels, copies


def callable_modules(fn: Any) -> list[Any]:
    """The ``nn.Module`` objects a callable is or wraps: a module, a compiled module or
    function (``_orig_mod``, ``_torchdynamo_orig_callable``), a bound method's
    ``__self__``, a ``functools.partial``'s function and bound arguments."""
    import functools

    import torch

    found: list[Any] = []
    stack, seen = [fn], set()
    while stack:
        obj = stack.pop()
        if obj is None or id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.nn.Module):
            found.append(obj)
            continue
        if isinstance(obj, functools.partial):
            stack += [obj.func, *obj.args, *obj.keywords.values()]
            continue
        for attr in ("_orig_mod", "_torchdynamo_orig_callable", "__self__", "__wrapped__"):
            inner = getattr(obj, attr, None)
            if inner is not None and not isinstance(inner, type):
                stack.append(inner)
    return found


def default_budget(args: Any, kwargs: Any, output: Any, fn: Any = None) -> Budget:
    """Tensor arguments, and the parameters and buffers of the callable's modules and of
    module arguments, read once; returned tensors written once."""
    modules = callable_modules(fn) if fn is not None else []
    label = "default: args" + (" and module weights" if modules else "") + " read once, outputs written once"
    return Budget.from_tensors(reads=[args, kwargs, modules], writes=[output], label=label)


def _build_report(rec: _Recorders, label: str, source: str | None) -> FusionReport:
    ops = list(rec.observer.records) if rec.observer is not None else []
    if rec.device == "cuda":
        kernels, copies = _cuda_kernels(rec, ops)
    else:
        kernels, copies = _cpu_kernels(rec, ops)
    report = FusionReport(
        label=label,
        device=rec.device,
        kernels=kernels,
        copies=copies,
        device_name=device_name(rec.device),
        source=source,
    )
    report.wall_time_s = rec.wall_s
    if rec.device == "cuda":
        report.time_s = report.device_time_s
        report.time_source = "device time of the profiled call"
    else:
        report.time_s = report.kernel_time_s
        report.time_source = "wall time of the profiled call's kernels"
    report.seq = rec.seq
    from .api import settings

    if settings.trace_dir:  # the profiler's events are large: keep them only to export traces
        report._prof = rec.prof  # type: ignore[attr-defined]
    return report


def _graph_break_recorder():
    try:
        from .graph_breaks import GraphBreakRecorder
    except ImportError:  # pragma: no cover - module always shipped
        return contextlib.nullcontext(None)
    return GraphBreakRecorder()


def _definition_site(fn: Any) -> str | None:
    """``file:line`` where a (compiled) function or module's forward is defined."""
    from .kernels import relpath

    target = getattr(fn, "_torchdynamo_orig_callable", None) or getattr(fn, "_orig_mod", None) or fn
    import torch

    if isinstance(target, torch.nn.Module):
        target = type(target).forward
    code = getattr(target, "__code__", None)
    if code is None:
        return None
    return f"{relpath(code.co_filename)}:{code.co_firstlineno}"


def profile_call(
    fn: Callable[..., Any],
    args: tuple,
    kwargs: dict,
    *,
    warmup: int = 1,
    device: str | None = None,
    label: str | None = None,
    budget: Budget | None = None,
) -> FusionReport:
    """The engine behind ``profile`` and ``fusion.profile``."""
    if not callable(fn):
        raise TypeError(f"profile() needs a callable first, got {type(fn).__name__}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be a non-negative int, got {warmup!r}")
    dev = resolve_device(device, (args, kwargs))
    install_inductor_hooks()  # before the warm-up, which is where torch.compile compiles
    label = label or getattr(fn, "__qualname__", None) or getattr(type(fn), "__name__", "call")
    source = user_source(2)
    recorder = _graph_break_recorder()
    with recorder as breaks:
        for _ in range(warmup):
            fn(*args, **kwargs)
        synchronize(dev)
        with _Recorders(dev, label) as rec:
            output = fn(*args, **kwargs)
    report = _build_report(rec, label, source)
    origin = _definition_site(fn)
    for k in report.kernels:
        if k.source is None and origin and (k.op.startswith("fused") or k.op == "generated"):
            k.source = origin  # a generated kernel: where the compiled code is defined
    report.output = output
    report.budget = budget if budget is not None else default_budget(args, kwargs, output, fn)
    arg_devices = {t.device.type for t in iter_tensors((args, kwargs))}
    if arg_devices and dev not in arg_devices:
        report.warnings.append(
            f"profiled on {dev} but the tensor arguments are on {', '.join(sorted(arg_devices))}: "
            f"work on other devices is not counted (move the inputs to {dev}, e.g. fusion.device)"
        )
    from .roofline import attach_timer

    attach_timer(report, fn, args, kwargs)
    if breaks is not None:
        report.graph_breaks = list(getattr(breaks, "breaks", []))
        report.recompiles = list(getattr(breaks, "recompiles", []))
    return report


def profile(fn: Callable[..., Any], *args: Any, warmup: int = 1, device: str | None = None, **kwargs: Any) -> FusionReport:
    """Profile ``fn(*args, **kwargs)``: ``warmup`` unprofiled calls, then one profiled call.

    Usable outside pytest. The report is also recorded as the latest report of the
    running test (or of the process, outside pytest) for the ``assert_*`` helpers.
    """
    from . import api

    report = profile_call(fn, args, kwargs, warmup=warmup, device=device)
    api.record_report(report)
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
        install_inductor_hooks()
        self._breaks_cm = _graph_break_recorder()
        self._breaks = self._breaks_cm.__enter__()
        try:
            self._rec = _Recorders(self._device, self.label)
            self._rec.__enter__()
        except BaseException:
            self._breaks_cm.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self._rec.__exit__(exc_type, exc, tb)
        finally:
            self._breaks_cm.__exit__(exc_type, exc, tb)
        if exc_type is not None:
            return
        report = _build_report(self._rec, self.label, self._source)
        if self._breaks is not None:
            report.graph_breaks = list(getattr(self._breaks, "breaks", []))
            report.recompiles = list(getattr(self._breaks, "recompiles", []))
        self.report = report
        if self._on_report is not None:
            self._on_report(report)

