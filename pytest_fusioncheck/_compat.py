"""Every private torch / Triton entry point the plugin touches, behind one door.

Each is guarded: when a release moves one, the plugin degrades with a named
``FusionCompatWarning`` ("graph-break reasons unavailable on torch X") instead of crashing
every test. Process-wide switches (Inductor's config, the codegen hooks, Triton's launcher
hook) are context managers: set for a profiled call (or a test) and restored after it.

Checked on torch 2.11 (CUDA 13, the H200) and 2.13 (CPU), Triton 3.6 and 3.9
(``TESTED``; ``pyproject.toml`` declares the same range).
"""

from __future__ import annotations

import contextlib
import functools
import sys
import warnings
from typing import Any, Callable, Iterator

TESTED = {"torch": ("2.11", "2.13"), "triton": ("3.6", "3.9")}


class FusionCompatWarning(UserWarning):
    """A private torch/Triton API the plugin uses is missing: a feature is degraded."""


_warned: set[str] = set()


def _warn_once(what: str, exc: BaseException | None = None) -> None:
    if what in _warned:
        return
    _warned.add(what)
    try:
        import torch

        version = torch.__version__
    except Exception:  # pragma: no cover
        version = "?"
    detail = f" ({type(exc).__name__}: {exc})" if exc is not None else ""
    warnings.warn(FusionCompatWarning(f"{what} unavailable on torch {version}{detail}; checked on torch {', '.join(TESTED['torch'])}"), stacklevel=3)


# --------------------------------------------------------------------------- profiler


def kineto_events(prof: Any) -> list[Any]:
    """The raw Kineto events of a finished ``torch.profiler.profile`` (device activities
    with correlation ids), or ``[]`` with a warning."""
    try:
        return list(prof.profiler.kineto_results.events())
    except Exception as exc:
        _warn_once("Kineto events (torch.profiler: profiler.kineto_results)", exc)
        return []


def fast_range(name: str) -> Any:
    """A profiler range (context manager) named ``name``: torch's C++ ``_RecordFunctionFast``
    (~1 us) where it exists, else ``record_function`` (~8 us: an op dispatched to enter it and
    one to leave). Same name, thread and span in Kineto's events; it is a function-scope
    range, not a user annotation (no GPU-timeline mirror in an exported trace)."""
    global fast_range
    import torch

    cls = getattr(getattr(torch._C, "_profiler", None), "_RecordFunctionFast", None)
    fast_range = cls if cls is not None else torch.profiler.record_function
    return fast_range(name)


_COPY_ACTIVITIES = frozenset({"gpu_memcpy", "gpu_memset"})
_KERNEL_ACTIVITIES = frozenset({"", "kernel", "concurrent_kernel"})


def device_activity_kind(e: Any) -> str | None:
    """``"kernel"``, ``"copy"`` (memcpy/memset) or ``None`` (skip: the plugin's own ranges
    and user annotations mirrored on the GPU timeline, syncs, overhead) for a Kineto
    device event. torch 2.11's events have no ``activity_type``: then the name decides."""
    try:
        activity = e.activity_type()
    except Exception:
        activity = ""
    name = e.name()
    if name.startswith(("fusioncheck", "ProfilerStep")) or "annotation" in activity:
        return None
    try:
        if e.is_user_annotation():
            return None
    except Exception:
        pass
    if activity in _COPY_ACTIVITIES or name.startswith(("Memcpy", "Memset")):
        return "copy"
    return "kernel" if activity in _KERNEL_ACTIVITIES else None


def profiler_enabled() -> bool:
    """Whether a ``torch.profiler`` session is already running in this process."""
    import torch

    busy = bool(getattr(torch.autograd.profiler, "_is_profiler_enabled", False))
    try:
        busy = busy or bool(torch._C._autograd._profiler_enabled())
    except AttributeError:
        pass
    return busy


def _dispatch_mode_base() -> type:
    try:
        from torch.utils._python_dispatch import TorchDispatchMode

        return TorchDispatchMode
    except ImportError as exc:  # pragma: no cover - every supported torch has it
        _warn_once("the ATen op observer (torch.utils._python_dispatch.TorchDispatchMode)", exc)
        raise


def __getattr__(name: str) -> Any:
    if name == "TorchDispatchMode":  # imported lazily: this module loads without torch
        return _dispatch_mode_base()
    raise AttributeError(name)


# --------------------------------------------------------------------------- FLOP formulas


_flop_formulas: dict[str, Callable[..., Any]] | None = None


def flop_formulas() -> dict[str, Callable[..., Any]]:
    """torch's own FLOP formulas (``torch.utils.flop_counter``'s registry, not part of its
    ``__all__``) keyed by qualified op name (``"aten::mm"``), built once. Each is called as
    ``FlopCounterMode`` calls it, ``formula(*args, **kwargs, out_val=out)`` with the op's
    real arguments and output (``_shapes_first`` makes the common case cheaper). ``{}``
    with a warning when the registry has moved."""
    global _flop_formulas
    if _flop_formulas is None:
        table: dict[str, Callable[..., Any]] = {}
        try:
            from torch.utils import flop_counter

            for key, formula in dict(flop_counter.flop_registry).items():
                name = getattr(key, "_qualified_op_name", None)
                if isinstance(name, str) and callable(formula):
                    table[name] = _shapes_first(formula)
        except Exception as exc:
            _warn_once("FLOP counts (torch.utils.flop_counter.flop_registry)", exc)
        _flop_formulas = table
    return _flop_formulas


def _shapes_first(formula: Callable[..., Any]) -> Callable[..., Any]:
    """``formula`` as ``FlopCounterMode`` calls it, but a formula torch wraps to take shapes
    (``shape_wrapper``: ``__wrapped__`` takes shapes) gets them directly when every tensor
    is a top-level argument or the output: torch's ``tree_map`` over the arguments costs
    ~10 us an op. Anything nested goes through torch's own wrapper."""
    raw = getattr(formula, "__wrapped__", None)
    if raw is None:
        return formula

    def shape(value: Any) -> Any:
        return value.shape if hasattr(value, "shape") and hasattr(value, "dtype") else value

    def nested(value: Any) -> bool:
        return isinstance(value, (list, tuple, dict)) and any(hasattr(v, "shape") for v in (value.values() if isinstance(value, dict) else value))

    memo: dict = {}  # the shapes-only formula is a pure function of its shapes: cached

    def typed(value: Any) -> Any:
        return (type(value), value)

    @functools.wraps(formula)
    def call(*args: Any, out_val: Any = None, **kwargs: Any) -> Any:
        if any(nested(a) for a in args) or any(nested(v) for v in kwargs.values()) or isinstance(out_val, dict):
            return formula(*args, out_val=out_val, **kwargs)
        out_shape = tuple(shape(o) for o in out_val) if isinstance(out_val, (list, tuple)) else shape(out_val)
        shapes = tuple(shape(a) for a in args)
        named = {k: shape(v) for k, v in kwargs.items()}
        try:
            key = (tuple(map(typed, shapes)), tuple((k, typed(v)) for k, v in named.items()), typed(out_shape))
            return memo[key]
        except KeyError:
            pass
        except TypeError:  # an unhashable argument (a list): not cached
            return raw(*shapes, out_shape=out_shape, **named)
        value = raw(*shapes, out_shape=out_shape, **named)
        if len(memo) >= 4096:
            memo.clear()
        memo[key] = value
        return value

    return call


# --------------------------------------------------------------------------- dynamo


def dynamo_frame_counter() -> int | None:
    """Dynamo's count of frames compiled so far (``convert_frame.FRAME_COUNTER``: the
    first number of a compile id ``frame/compile``), or ``None``."""
    try:
        from torch._dynamo import convert_frame

        return int(convert_frame.FRAME_COUNTER)
    except Exception:
        return None


def dynamo_utils() -> Any | None:
    """``torch._dynamo.utils`` (graph-break reasons, guard failures), or ``None``."""
    try:
        from torch._dynamo import utils
    except Exception as exc:
        _warn_once("graph-break reasons (torch._dynamo.utils)", exc)
        return None
    missing = [a for a in ("graph_break_reasons", "guard_failures") if not hasattr(utils, a)]
    if missing:
        _warn_once(f"graph-break reasons (torch._dynamo.utils.{', '.join(missing)})")
        return None
    return utils


def graph_break_logger_names() -> list[str]:
    """Names of the loggers Dynamo writes graph breaks to (its ``graph_breaks`` artifact)."""
    try:
        from torch._logging._internal import log_registry

        return [n for n in log_registry.get_artifact_log_qnames() if n.endswith(".__graph_breaks")]
    except Exception:  # the two well-known names (graph_breaks.py) still apply
        return []


# --------------------------------------------------------------------------- inductor


@contextlib.contextmanager
def inductor_switches() -> Iterator[None]:
    """While open: Inductor's FX-graph cache and AOTAutograd's cache off (so every compile
    goes through code generation, where bytes are recorded) and C++ kernel profiling on
    (so CPU kernels appear in the profiler). Restored on exit."""
    try:
        import torch._inductor.config as inductor_config
    except Exception as exc:
        _warn_once("Inductor's config (torch._inductor.config): compiled kernels may be unmodelled", exc)
        yield
        return
    saved: list[tuple[Any, str, Any]] = []

    def set_(obj: Any, attr: str, value: Any) -> None:
        if hasattr(obj, attr):
            saved.append((obj, attr, getattr(obj, attr)))
            setattr(obj, attr, value)

    set_(inductor_config, "fx_graph_cache", False)
    set_(inductor_config.cpp, "enable_kernel_profile", True)
    try:
        import torch._functorch.config as functorch_config

        set_(functorch_config, "enable_autograd_cache", False)
    except ImportError:
        pass
    try:
        yield
    finally:
        for obj, attr, value in reversed(saved):
            setattr(obj, attr, value)


@contextlib.contextmanager
def codegen_hooks(on_cpp: Callable[..., None], on_triton: Callable[..., None],
                  on_module: Callable[..., None] | None = None) -> Iterator[None]:
    """While open, ``on_cpp(self, name, src_code, nodes, args, kwargs)`` runs after each
    C++ kernel Inductor defines, ``on_triton(name, node_schedule, kernel)`` after each
    Triton kernel and ``on_module(graph, module)`` after a graph's wrapper module is written
    (``GraphLowering.compile_to_module``; checked on torch 2.11 and 2.13). A hook that raises
    is ignored (code generation must not break). Restored on exit."""
    patches: list[tuple[type, str, Callable[..., Any]]] = []
    if on_module is not None:
        try:
            from torch._inductor.graph import GraphLowering

            original_module = GraphLowering.compile_to_module

            @functools.wraps(original_module)
            def compile_to_module(self, *args, **kwargs):
                module = original_module(self, *args, **kwargs)
                with contextlib.suppress(Exception):
                    on_module(self, module)
                return module

            patches.append((GraphLowering, "compile_to_module", original_module))
            GraphLowering.compile_to_module = compile_to_module
        except Exception as exc:
            _warn_once("modules of extern kernels in compiled code (torch._inductor.graph.GraphLowering.compile_to_module)", exc)
    try:
        from torch._inductor.codegen.cpp import CppScheduling

        original_cpp = CppScheduling.define_kernel

        @functools.wraps(original_cpp)
        def cpp_define_kernel(self, src_code, nodes, *args, **kwargs):
            name = original_cpp(self, src_code, nodes, *args, **kwargs)
            with contextlib.suppress(Exception):
                on_cpp(self, name, src_code, nodes, args, kwargs)
            return name

        patches.append((CppScheduling, "define_kernel", original_cpp))
        CppScheduling.define_kernel = cpp_define_kernel
    except Exception as exc:
        _warn_once("C++ kernel bytes (torch._inductor.codegen.cpp.CppScheduling.define_kernel)", exc)
    try:
        from torch._inductor.codegen.triton import TritonScheduling

        original_triton = TritonScheduling.define_kernel

        @functools.wraps(original_triton)
        def triton_define_kernel(self, src_code, node_schedule, kernel, *args, **kwargs):
            name = original_triton(self, src_code, node_schedule, kernel, *args, **kwargs)
            with contextlib.suppress(Exception):
                on_triton(name, node_schedule, kernel)
            return name

        patches.append((TritonScheduling, "define_kernel", original_triton))
        TritonScheduling.define_kernel = triton_define_kernel
    except ImportError:
        pass  # a torch without Triton: no Triton kernels to hook
    except Exception as exc:
        _warn_once("Triton kernel bytes (torch._inductor.codegen.triton.TritonScheduling.define_kernel)", exc)
    try:
        yield
    finally:
        for cls, attr, original in reversed(patches):
            setattr(cls, attr, original)


# --------------------------------------------------------------------------- triton


@contextlib.contextmanager
def graph_call_hook(on_call: Callable[[Callable[[], Any]], Any]) -> Iterator[None]:
    """While open, each call of an Inductor-compiled graph (``CompiledFxGraph.__call__``; checked on torch 2.11 and
    2.13) goes through ``on_call(run)``, which must return ``run()``: the capture tells graphs compiled under its
    hooks (whose wrapper ``sources/bytes_model._mark_graph_calls`` marks, whatever Inductor wraps around it) from
    those compiled before. Restored on exit."""
    try:
        from torch._inductor.output_code import CompiledFxGraph

        original = CompiledFxGraph.__call__
    except Exception as exc:
        _warn_once("compiled graphs' calls (torch._inductor.output_code.CompiledFxGraph.__call__)", exc)
        yield
        return

    @functools.wraps(original)
    def call(self, inputs):
        return on_call(lambda: original(self, inputs))

    CompiledFxGraph.__call__ = call
    try:
        yield
    finally:
        CompiledFxGraph.__call__ = original


@contextlib.contextmanager
def triton_launch_hook(on_launch: Callable[..., Any]) -> Iterator[None]:
    """While open, each direct Triton launch (``JITFunction.run``; the interpreter's
    ``InterpretedFunction.run`` under ``TRITON_INTERPRET=1``) goes through
    ``on_launch(jitfn, original, args, kwargs, grid, warmup, interpreted)``, which must
    call ``original``. Code that has not imported Triton cannot launch a Triton kernel:
    nothing is patched then. Restored on exit."""
    patches: list[tuple[type, Callable[..., Any]]] = []
    if "triton.runtime.jit" in sys.modules:
        targets: list[tuple[str, str, bool]] = [
            ("triton.runtime.jit", "JITFunction", False),
            ("triton.runtime.interpreter", "InterpretedFunction", True),
        ]
        for module_name, cls_name, interpreted in targets:
            try:
                module = __import__(module_name, fromlist=[cls_name])
                cls = getattr(module, cls_name)
            except Exception:
                continue
            original = cls.run

            def run(self, *args, grid, warmup, _original=original, _interpreted=interpreted, **kwargs):
                if warmup:
                    return _original(self, *args, grid=grid, warmup=warmup, **kwargs)
                return on_launch(self, _original, args, kwargs, grid, warmup, _interpreted)

            run.__wrapped__ = original  # type: ignore[attr-defined]
            patches.append((cls, original))
            cls.run = run
    try:
        yield
    finally:
        for cls, original in reversed(patches):
            cls.run = original


@contextlib.contextmanager
def explicit_sync_hook(on_sync: Callable[..., Any]) -> Iterator[None]:
    """While open, ``torch.cuda.synchronize()`` (through ``torch._C._cuda_synchronize``),
    ``torch.cuda.Stream.synchronize`` and ``torch.cuda.Event.synchronize`` go through
    ``on_sync(original, *args)``, which must call ``original``. What is missing in this
    torch is left alone. Restored on exit (host_syncs.py: the line of an explicit sync)."""
    import torch

    patches: list[tuple[Any, str, Any]] = []
    for owner, name in ((torch._C, "_cuda_synchronize"), (torch.cuda.Stream, "synchronize"), (torch.cuda.Event, "synchronize")):
        original = getattr(owner, name, None)
        if original is None:
            continue

        def hooked(*args: Any, _original: Any = original) -> Any:
            return on_sync(_original, *args)

        hooked.__wrapped__ = original  # type: ignore[attr-defined]
        try:
            setattr(owner, name, hooked)
        except (AttributeError, TypeError):
            continue
        patches.append((owner, name, original))
    try:
        yield
    finally:
        for owner, name, original in reversed(patches):
            setattr(owner, name, original)


# --------------------------------------------------------------------------- CUDA graphs


def abandon_graph_pool(device: int, pool: Any) -> None:
    """After a CUDA-graph capture into ``pool`` failed, stop the caching allocator from
    routing to that pool and release it (``torch.cuda.use_mem_pool`` does the same on
    exit). ``CUDAGraph.capture_end`` skips both when ``cudaStreamEndCapture`` fails (an
    invalidated capture): left as is, the allocator would defer freeing blocks for as
    long as the process runs. When the capture got past that point the graph's own reset
    releases the pool: nothing is done then. (torch 2.13 names the call
    ``_cuda_endAllocateToPool``; older releases ``_cuda_endAllocateCurrentStreamToPool``.)"""
    import torch

    end = getattr(torch._C, "_cuda_endAllocateToPool", None) or getattr(torch._C, "_cuda_endAllocateCurrentStreamToPool", None)
    release = getattr(torch._C, "_cuda_releasePool", None)
    if end is None or release is None:
        _warn_once("releasing a failed CUDA-graph capture's memory pool (torch._C._cuda_endAllocateToPool)")
        return
    try:
        end(device, pool)
    except RuntimeError:  # "not currently recording to mempool_id": capture_end did it
        return
    release(device, pool)


def graph_launches(prof: Any) -> int:
    """How many CUDA graphs a finished profiler session launched (``cudaGraphLaunch``
    runtime calls): a call compiled with ``mode="reduce-overhead"`` replays its graphs."""
    return sum(1 for e in kineto_events(prof) if e.name().startswith(("cudaGraphLaunch", "cuGraphLaunch")))


_sequence_nr: list = []  # torch's getter, looked up once (called for every observed op)


def next_sequence_nr() -> int | None:
    """The autograd sequence number the calling thread's next graph node gets (a forward op
    that records a node has just taken this minus one), or None where torch lacks it."""
    try:
        if not _sequence_nr:
            _sequence_nr.append(torch_c_autograd()._get_sequence_nr)
        return int(_sequence_nr[0]())
    except Exception:
        return None


def backward_node() -> tuple[int, Any] | None:
    """``(sequence number, variable)`` of the autograd node running on this thread (inside
    ``backward()``): the sequence number is the forward op's it differentiates; the variable
    is the leaf tensor of a gradient accumulation (None for other nodes). None outside a
    backward pass."""
    try:
        import torch

        node = torch._C._current_autograd_node()
        if node is None:
            return None
        return int(node._sequence_nr()), getattr(node, "variable", None)
    except Exception:
        return None


def torch_c_autograd() -> Any:
    import torch

    return torch._C._autograd


# --------------------------------------------------------------------------- objects' private members

# torch.compile's wrappers and what they wrap: an ``OptimizedModule`` keeps the model in
# ``_orig_mod`` (and puts it in its submodule paths); a compiled function keeps the
# function in ``_torchdynamo_orig_callable``.
COMPILED_MODULE_ATTR = "_orig_mod"
COMPILED_WRAPPER_ATTRS = ("_torchdynamo_orig_callable", COMPILED_MODULE_ATTR)


def compiled_inner(obj: Any) -> Any | None:
    """What ``obj`` wraps when it is a ``torch.compile`` wrapper (a compiled function's
    original callable, an ``OptimizedModule``'s model), else None."""
    for attr in COMPILED_WRAPPER_ATTRS:
        try:
            inner = getattr(obj, attr, None)
        except Exception:
            inner = None
        if inner is not None:
            return inner
    return None


def tensor_version(t: Any) -> int:
    """A tensor's version counter: bumped by every in-place write (autograd's ``_version``)."""
    return int(t._version)


def op_schema(func: Any) -> Any | None:
    """An ``OpOverload``'s schema (``func._schema``), or None for other callables."""
    return getattr(func, "_schema", None)


def codegen_graph() -> Any | None:
    """The graph Inductor is generating code for (``V.graph``), or None outside codegen."""
    try:
        from torch._inductor.virtualized import V

        return V.graph
    except Exception:
        return None


def inductor_dtype_size(dtype: Any) -> int:
    from torch._inductor.utils import get_dtype_size

    return get_dtype_size(dtype)


def inductor_sympy_product(values: Any) -> Any:
    from torch._inductor.utils import sympy_product

    return sympy_product(values)
