"""The reference kernels' launch path: a public call recorded once per problem, replayed after.

A fused call costs its checks, its launch plan (each subject's rules) and Triton's ``JITFunction.run``
(argument binding, specialisation key, cache lookup) before the driver's launch: 55-380 us of
Python a call on the H100 machine, where torch's own ops take 7-25 (docs/kernels.md, "Host
time a call"). None of it depends on the tensors' contents, only on what a ``Calls`` table keys
a call by: each tensor argument's shape, strides, dtype, device and 16-byte alignment (what
Triton specialises on), which arguments are the same tensor, and the other arguments. The
first call of a key plans (a key called once never pays a record), its second runs the public
call's body recorded; later calls replay the record: its outputs allocated again (scratch
that only its launches take kept for the next call on the stream: ``_Scratch``), each launch through the compiled
kernel's own launcher (``CompiledKernel.run``, what ``JITFunction.run`` calls last; its compiled
launch function itself where the layout is Triton 3.6's and the kernel takes no scratch) with
the new data pointers, and what the body returned rebuilt from the new tensors; a record's replay
is Python generated for it, straight-line. The checks are not run again: a key is recorded only
by a call that passed them, and all they read is in the key.

A record is kept only where replaying it does the same work. Every tensor a launch takes is
one of the call's tensors, a view of one at a fixed offset, or one the call allocated
(``torch.empty`` / ``zeros`` and their ``_like`` / ``new_`` forms, or a copy: ``clone``,
``contiguous``, ``copy_``, replayed in their place between the launches); nothing else ran on the
device (a fill, a reduction: the torch function mode below sees every torch call) but the library
ops a plan names (``library``: a cuBLAS GEMM), replayed on the same views of the new tensors;
every other argument is a number fixed by the key, or a ``do_not_specialize`` argument the
caller names per call (a dropout seed). Otherwise the key keeps planning each call
(``Calls.last`` says why).

Every call plans and launches through Triton while Triton's launcher is hooked (a
profiler's capture, fusioncheck's included, must see the launch), while a launch hook is
set, and under torch.compile's tracing. A record holds the plan of the module constants it was
made under: whoever sets one calls ``forget()`` (the tests' ``monkeypatch``, ``sweep.py --set``).
Under ``TRITON_INTERPRET=1`` a replay relaunches through the interpreter with views of the
new tensors: CI runs the same records, keys and checks; only the last call differs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import os
import threading
import types
from typing import Any, Callable, Iterator

import torch
import triton

from ._common import TRITON_DIVISIBILITY

try:
    from triton.runtime.jit import JITFunction
except ImportError:  # pragma: no cover - every supported Triton has it
    JITFunction = None

try:  # torch.compile's C++ check of tensors' dtype, device, shape and strides (and type, grad, dispatch keys) against
    # those it was made from: ~0.4 us for three, where a key of them took ~3 (Calls.hot)
    from torch._C._dynamo.guards import TensorGuards as _TensorGuards
except ImportError:  # pragma: no cover - a torch without it: every call keys
    _TensorGuards = None

try:  # what torch.compile's generated wrappers allocate and view with: half the Python of torch.empty_strided's and
    # as_strided's argument parsing and dispatch (~1.1 -> ~0.5 us an allocation on CI's host); the current device's
    from torch._C._dynamo.guards import _empty_strided_cpu, _empty_strided_cuda, _reinterpret_tensor
except ImportError:  # pragma: no cover - a torch without them: torch.empty_strided and as_strided
    _empty_strided_cpu = _empty_strided_cuda = _reinterpret_tensor = None

_INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
_ALIGN = TRITON_DIVISIBILITY - 1  # the low bits of a pointer that Triton's specialisation reads
_MAX_KEYS = 1024  # a table that grows past this starts again
_HOT_KEYS = 4  # the keys replayed last checked before a key is made: a block's GEMMs, in turn (Calls.hot)
_SEEN = object()  # a key called once: its next call records
_MAX_ADDRESSES = 64  # a replayed descriptor's encodings kept (_Encoded)
# a record's scratch kept across its replays (_Scratch): one allocation up to this size (a zeroed one: a pool of
# slices this size), and a table's at most _TABLE_KEPT_BYTES; past them a replay allocates it as the record did
_KEPT_BYTES = 1 << 20
_TABLE_KEPT_BYTES = 64 << 20
_BASE_ARGS = 13  # Triton 3.6's launch function's arguments before the kernel's: grid, stream, function, flags, ...
_STAND_IN = 1 << 32  # a 16-byte aligned address a descriptor may be encoded at (never read) in _same_arguments
_PLAIN = (bool, int, float, str, type(None))


def _launcher_class():
    if _INTERPRETED:
        from triton.runtime.interpreter import InterpretedFunction

        return InterpretedFunction
    return JITFunction


_LAUNCHER = _launcher_class()
_TRITON_RUN = inspect.unwrap(_LAUNCHER.run) if _LAUNCHER is not None else None
_KNOBS = getattr(triton, "knobs", None)


def _hooks_set() -> bool:
    if _KNOBS is None:
        return True
    runtime = _KNOBS.runtime
    for hook in (runtime.launch_enter_hook, runtime.launch_exit_hook):
        if hook is not None and getattr(hook, "calls", True):  # a HookChain with nothing in it is none
            return True
    return False


_replays_enabled = True  # False: every call plans and launches through Triton (``replays_off``)


@contextlib.contextmanager
def replays_off() -> Iterator[None]:
    """Every call inside plans and launches through Triton, as before records (benchmarks/bench_host.py times both)."""
    global _replays_enabled
    saved, _replays_enabled = _replays_enabled, False
    try:
        yield
    finally:
        _replays_enabled = saved


def replays_allowed() -> bool:
    """Whether a recorded call may replay now: Triton's launcher is its own, no launch hook, not tracing."""
    # torch.compile's tracing first: under it this is all the tracer reads
    return (not torch.compiler.is_compiling() and _replays_enabled and _LAUNCHER is not None
            and _LAUNCHER.run is _TRITON_RUN and not _hooks_set())


# --------------------------------------------------------------------------- recording

# what a recorded call may do besides launching: read metadata, take views (checked to share storage), allocate
_METADATA = frozenset((
    "__get__", "size", "stride", "storage_offset", "data_ptr", "element_size", "dim", "ndimension", "numel",
    "nelement", "is_contiguous", "untyped_storage", "get_device", "__len__", "is_floating_point",
))
_VIEWS = frozenset((
    "view", "view_as", "reshape", "as_strided", "__getitem__", "t", "transpose", "permute", "unsqueeze", "squeeze",
    "flatten", "unflatten", "expand", "expand_as", "contiguous", "narrow", "select", "movedim", "detach",
))
_ALLOCATORS = {torch.empty: False, torch.zeros: True, torch.empty_like: False, torch.zeros_like: True,
               torch.empty_strided: False, torch.Tensor.new_empty: False, torch.Tensor.new_zeros: True}


class _Recorder(torch.overrides.TorchFunctionMode):
    """Sees every torch call of a recorded call: keeps its allocations, and the first call that does device work."""

    def __init__(self) -> None:
        super().__init__()
        # in order: ("launch", kernel, grid, args, kwargs, compiled), ("copy", dst, src), ("call", op, args, kwargs)
        self.launches: list[tuple] = []
        self.allocs: list[tuple[torch.Tensor, bool]] = []  # (tensor, zeroed)
        self.write_only: list[torch.Tensor] = []  # allocations its replays pass again (write_only)
        self.unsafe: str | None = None
        self.paused = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.paused or self.unsafe:
            return out
        name = getattr(func, "__name__", repr(func))
        if func in _ALLOCATORS:
            self.allocs.append((out, _ALLOCATORS[func]))
        elif name in _VIEWS or name == "clone":
            if not (isinstance(out, torch.Tensor) and args and isinstance(args[0], torch.Tensor)):
                self.unsafe = f"torch's {name} ran"
            elif out.untyped_storage().data_ptr() != args[0].untyped_storage().data_ptr():  # a copy into a new tensor
                if out.shape != args[0].shape:  # a reshape that copied: not a plain copy
                    self.unsafe = f"{name} copied a tensor into another shape"
                self.allocs.append((out, False))
                self.launches.append(("copy", out, args[0]))
        elif name == "copy_" and len(args) == 2 and all(isinstance(a, torch.Tensor) for a in args) and not kwargs:
            self.launches.append(("copy", args[0], args[1]))
        elif name not in _METADATA:
            self.unsafe = f"torch's {name} ran"
        return out


class _Recording(threading.local):
    """The calls being recorded on this thread (innermost last): a launch on another thread is not theirs."""

    def __init__(self) -> None:
        self.stack: list[_Recorder] = []


_recording = _Recording()


def _current() -> _Recorder | None:
    stack = _recording.stack
    return stack[-1] if stack else None


def launch(kernel: Any, grid: tuple, *args: Any, **kwargs: Any) -> Any:
    """``kernel[grid](*args, **kwargs)``: how the subjects launch, so that a recorded call sees its launches."""
    __tracebackhide__ = True  # a launch's line is its caller's (pytest's tracebacks, fusioncheck's kernel sources)
    rec = None if torch.compiler.is_compiling() else _current()  # traced by torch.compile: a plain launch
    if rec is None:
        return kernel[grid](*args, **kwargs)
    rec.paused += 1  # Triton's own torch calls (the interpreter's copies) are not the call's
    try:
        compiled = kernel[grid](*args, **kwargs)
    finally:
        rec.paused -= 1
    rec.launches.append(("launch", kernel, grid, args, kwargs, compiled))
    return compiled


def library(op: Callable, *args: Any, **kwargs: Any) -> Any:
    """``op(*args, **kwargs)``: a torch op that a plan takes in place of a kernel (a cuBLAS GEMM writing into ``out=``),
    recorded like a launch: a replay calls it again on the same views of the new tensors. The op must write only
    into tensors it is given; what it returns is not kept."""
    rec = None if torch.compiler.is_compiling() else _current()
    if rec is None:
        return _gradless(op, args, kwargs)
    rec.paused += 1  # the op's own torch calls are the op's
    try:
        value = _gradless(op, args, kwargs)
    finally:
        rec.paused -= 1
    rec.launches.append(("call", op, args, kwargs))
    return value


def _gradless(op: Callable, args: tuple, kwargs: dict) -> Any:
    """``op(*args, **kwargs)`` with grad off: autograd refuses an op writing into ``out=`` from inputs that require grad
    (a model's weights), and a call's outputs take their autograd node from the call (``_common.inference_result``).
    Grad mode is set as ``torch.no_grad`` sets it, without its context manager: ~0.3 us against ~1.5 on CI's host, on
    a replay's path."""
    if not torch.is_grad_enabled():
        return op(*args, **kwargs)
    torch._C._set_grad_enabled(False)
    try:
        return op(*args, **kwargs)
    finally:
        torch._C._set_grad_enabled(True)


def write_only(t: torch.Tensor) -> torch.Tensor:
    """``t``, an allocation of the call that its launches write and nothing reads (not a later launch, not the
    caller: never returned), as a layer norm's statistics in inference: its replays pass the record's tensor again,
    kept with the record, instead of allocating one (docs/kernels.md, "Host time a call"). Concurrent replays
    write it at once: nothing reads it. A record that returns it plans each call."""
    rec = None if torch.compiler.is_compiling() else _current()
    if rec is not None:
        rec.write_only.append(t)
    return t


@contextlib.contextmanager
def unrecorded() -> Iterator[None]:
    """Work of a recorded call that its replays skip (a GEMM timing its candidate configs on the first call)."""
    rec = _current()
    if rec is None:
        yield
        return
    rec.paused += 1
    saved = len(rec.launches)
    try:
        yield
    finally:
        rec.paused -= 1
        del rec.launches[saved:]


# --------------------------------------------------------------------------- replays


class _Launch:
    """What both kinds of recorded launch hold: the tensor and descriptor arguments' sources, by argument index."""

    tensors: list
    descriptors: list

    def used(self) -> list[int]:
        return [src for _, src, *_ in (*self.tensors, *self.descriptors)]


class _Relaunch(_Launch):
    """One recorded launch, through ``kernel[grid]`` (the interpreter, or a Triton without ``knobs``)."""

    def __init__(self, kernel, grid, values, options, tensors, named, descriptors):
        self.kernel, self.grid, self.values, self.options = kernel, grid, values, options
        self.tensors, self.named, self.descriptors = tensors, named, descriptors

    def __call__(self, sources: list, scalars: dict, stream: int | None) -> None:
        values = self.values.copy()
        for i, src, delta, size, stride, dtype in self.tensors:
            values[i] = _view(sources[src], delta, size, stride, dtype)
        for i, src, delta, desc, (shape, stride) in self.descriptors:
            values[i] = _rebased(desc, _view(sources[src], delta, shape, stride, desc.base.dtype))
        for i, name in self.named:
            values[i] = scalars[name]
        self.kernel[self.grid](*values, **self.options)


class _Bound(_Launch):
    """One recorded launch through the compiled kernel's launcher: new data pointers, nothing else re-derived. A
    replay calls the launcher from generated code (``_Replay``); ``source`` writes that call."""

    def __init__(self, compiled, grid, values, tensors, named, descriptors):
        self.run, self.function, self.metadata = compiled.run, compiled.function, compiled.packed_metadata
        self.grid = (tuple(grid) + (1, 1))[:3]
        self.values, self.named, self.tensors, self.descriptors = values, named, tensors, descriptors
        self.direct = _direct_launch(self.run)
        self.encoded = _encoders(self.run.launch, values, tensors, descriptors) if self.direct and descriptors else None

    def source(self, const: Callable[[Any], str], var: Callable[[int], str]) -> str:
        """The launcher's call as Python: ``const(value)`` names a value the replay holds, ``var(i)`` source i."""
        args = [const(v) for v in self.values]
        for i, src, delta, *_ in self.tensors:
            args[i] = f"{var(src)}.data_ptr()" + (f" + {delta}" if delta else "")
        launch, encoders = self.encoded or (self.run.launch, {})
        for i, src, delta, desc, _ in self.descriptors:
            address = f"{var(src)}.data_ptr() + {delta}"
            if i in encoders:  # the launcher's arguments for the descriptor at this address (_Encoded)
                args[i] = f"*{const(encoders[i])}[{address}]"
            else:
                args[i] = f"_rebased({const(desc)}, _Address({address}, {const(desc.base.dtype)}))"
        for i, name in self.named:
            args[i] = f"scalars[{name!r}]"
        grid = [*map(str, self.grid), "stream", const(self.function)]
        if self.direct:  # the launcher's own call, as its __call__ makes it without scratch (_direct_launch)
            run = self.run
            head = [*grid, const(run.launch_cooperative_grid), const(run.launch_pdl), "None", "None"]
            return f"{const(launch)}({', '.join(head + [const(self.metadata), 'None', 'None', 'None'] + args)})"
        return f"{const(self.run)}({', '.join(grid + [const(self.metadata), 'None', 'None', 'None'] + args)})"


def _direct_launch(run: Any) -> bool:
    """Whether a replay may call ``run``'s compiled launch function itself, skipping the Python ``__call__`` in front
    of it (~1 us a launch). Only for a launcher laid out as Triton 3.6's ``CudaLauncher``: ``__call__(self, gridX,
    gridY, gridZ, stream, function, *args)`` passes ``launch`` the grid, stream, function, its cooperative-grid and
    PDL flags, the global and profile scratch (None where the kernel takes none) and ``args`` unchanged. Any other
    layout, or a kernel that takes scratch, launches through ``run``."""
    call = getattr(type(run), "__call__", None)
    try:
        params = list(inspect.signature(call).parameters.values())
    except (TypeError, ValueError):
        return False
    layout = [p.name for p in params] == ["self", "gridX", "gridY", "gridZ", "stream", "function", "args"]
    return (layout and params[-1].kind is inspect.Parameter.VAR_POSITIONAL and callable(getattr(run, "launch", None))
            and getattr(run, "global_scratch_size", 1) == 0 and getattr(run, "profile_scratch_size", 1) == 0
            and all(hasattr(run, a) for a in ("launch_cooperative_grid", "launch_pdl")))


def _encoders(launch: Any, values: list, tensors: list, descriptors: list) -> tuple[Any, dict] | None:
    """(the compiled launch function, {argument index: ``_Encoded``}) where ``launch`` is Triton 3.6's
    ``wrap_handle_tensordesc`` wrapper over it, else None. The wrapper turns each descriptor argument into the
    launcher's arguments (``make_tensordesc_arg``: the TMA descriptor, encoded in C, then shapes and strides) on every
    launch, with a Python walk over all the arguments; a replay calls the function under it with each descriptor's
    arguments as Triton made them for its address, kept (docs/kernels.md, "Host time a call"). Only where the
    wrapper, run once on this launch's arguments, gives the function what the replay would (``_same_arguments``)."""
    code, cells = getattr(launch, "__code__", None), getattr(launch, "__closure__", None) or ()
    free = dict(zip(getattr(code, "co_freevars", ()), (c.cell_contents for c in cells)))
    names = getattr(launch, "__globals__", {})
    encode = names.get("make_tensordesc_arg")
    if (set(free) != {"launcher", "tensordesc_indices", "tensordesc_meta"} or not callable(encode)
            or names.get("_BASE_ARGS_FORMAT_LEN") != _BASE_ARGS):
        return None
    indices = sorted(free["tensordesc_indices"])
    metas = free["tensordesc_meta"] or [None] * len(indices)
    if indices != sorted(i for i, *_ in descriptors) or len(metas) != len(indices):
        return None
    by_index = {i: desc for i, _, _, desc, _ in descriptors}
    encoders = {i: _Encoded(encode, by_index[i], meta) for i, meta in zip(indices, metas)}
    return (free["launcher"], encoders) if _same_arguments(launch, free, values, tensors, encoders) else None


def _same_arguments(launch: Any, free: dict, values: list, tensors: list, encoders: dict) -> bool:
    """Whether the wrapper ``launch`` passes the function under it what a replay through ``encoders`` would, on this
    launch's arguments at stand-in addresses: the wrapper is rebuilt around a function that keeps what it is given."""
    got: list = []
    keep = lambda *args: got.append(args)  # noqa: E731
    closure = tuple(types.CellType(keep if name == "launcher" else value) for name, value in free.items())
    wrapper = types.FunctionType(launch.__code__, launch.__globals__, launch.__name__, launch.__defaults__, closure)
    probe = list(values)
    for n, (i, *_) in enumerate(tensors):
        probe[i] = _STAND_IN + 256 * n
    head = list(range(_BASE_ARGS))
    replayed = []
    try:
        for i, value in enumerate(probe):
            if i in encoders:
                one = encoders[i]
                probe[i] = _rebased(one.desc, _Address(_STAND_IN + 256 * (len(tensors) + i), one.desc.base.dtype))
                replayed += one.encode(probe[i], one.meta)
            else:
                replayed.append(value)
        wrapper(*head, *probe)
        want = head + replayed
        return len(got) == 1 and len(got[0]) == len(want) and all(
            a is b or (type(a) is type(b) and (isinstance(a, _PLAIN) and a == b or not isinstance(a, _PLAIN)))
            for a, b in zip(got[0], want))
    except Exception:  # noqa: BLE001 - a wrapper laid out otherwise than 3.6's: launch through it
        return False


class _Encoded(dict):
    """A recorded descriptor's launcher arguments by its base's address: Triton's own ``make_tensordesc_arg`` of the
    descriptor rebased there, made on an address's first replay and kept (all it encodes but the address is the
    key's); a replay's lookup is a dict's. Past ``_MAX_ADDRESSES`` addresses it starts again."""

    __slots__ = ("encode", "desc", "meta")

    def __init__(self, encode: Callable, desc: Any, meta: Any) -> None:
        super().__init__()
        self.encode, self.desc, self.meta = encode, desc, meta

    def __missing__(self, address: int) -> tuple:
        if len(self) >= _MAX_ADDRESSES:
            self.clear()
        made = self[address] = tuple(self.encode(_rebased(self.desc, _Address(address, self.desc.base.dtype)),
                                                 self.meta))
        return made


class _Copy:
    """A recorded copy (``clone``, ``contiguous``, ``copy_``: rows made to agree before a launch, or copied out
    after it), replayed between the same views of the new tensors."""

    def __init__(self, dst: tuple, src: tuple) -> None:
        self.dst, self.src = dst, src  # (source index, byte offset, size, stride, dtype)
        self.named = ()

    def used(self) -> list[int]:
        return [self.dst[0], self.src[0]]

    def __call__(self, sources: list, scalars: dict, stream: int | None) -> None:
        (i, di, *dv), (j, dj, *sv) = self.dst, self.src
        _view(sources[i], di, *dv).copy_(_view(sources[j], dj, *sv))


class _Call:
    """A recorded library op (``library``), called again with each tensor argument the same view of the new tensors."""

    def __init__(self, op: Callable, args: list, kwargs: dict, tensors: list) -> None:
        self.op, self.args, self.kwargs = op, args, kwargs
        # (argument index or keyword, source index, view): the view (byte offset, size, stride, dtype), or None where
        # the argument is the source itself, as the key keeps it
        self.tensors = tensors
        self.named = ()

    def used(self) -> list[int]:
        return [src for _, src, *_ in self.tensors]

    def __call__(self, sources: list, scalars: dict, stream: int | None) -> None:
        args, kwargs = self.args.copy(), self.kwargs.copy()
        for where, src, view in self.tensors:
            t = sources[src] if view is None else _view(sources[src], *view)
            if where.__class__ is int:
                args[where] = t
            else:
                kwargs[where] = t
        _gradless(self.op, args, kwargs)


def _call(op: Callable, args: tuple, kwargs: dict, sources: list) -> Any:
    tensors = []
    for where, value in (*enumerate(args), *kwargs.items()):
        if isinstance(value, torch.Tensor):
            found = _source(value, sources)
            if isinstance(found, str):
                return found.replace("a launch takes", f"{getattr(op, '__name__', op)} takes")
            src, delta = found
            view = (delta, tuple(value.shape), tuple(value.stride()), value.dtype)
            itself = view == (0, tuple(sources[src].shape), tuple(sources[src].stride()), sources[src].dtype)
            tensors.append((where, src, None if itself else view))
        elif not isinstance(value, _PLAIN):
            return f"{getattr(op, '__name__', op)} takes a {type(value).__name__}"
    plain = lambda v: None if isinstance(v, torch.Tensor) else v  # noqa: E731
    return _Call(op, [plain(v) for v in args], {k: plain(v) for k, v in kwargs.items()}, tensors)


class _Replay:
    """A record, replayed by ``run(slots, scalars)``: Python generated for it (``_replay_source``), so that a replay
    costs its allocations, views and launches, not a walk over the record (docs/kernels.md, "Host time a call").
    The Python is generated at the first replay (0.15-0.35 ms on CI's host), never for a key called twice: a shape
    that changes every call (a growing sequence) pays neither it nor the record (``Calls``)."""

    __slots__ = ("n_slots", "allocs", "launches", "result", "run", "hot")

    def __init__(self, n_slots: int, allocs: list, launches: list, result: Any) -> None:
        self.n_slots, self.allocs, self.launches, self.result = n_slots, allocs, launches, result
        self.run = self._generate
        self.hot: _Hot | bool | None = None  # its key's check (Calls.hot), False where none stands for it, None: unknown

    def _generate(self, slots: list, scalars: dict) -> Any:
        text, names = _replay_source(self.n_slots, self.allocs, self.launches, self.result)
        exec(compile(text, f"<replay of {len(self.launches)} launches>", "exec"), names)  # noqa: S102 - our own text
        self.run = names["replay"]
        return self.run(slots, scalars)


class _Scratch:
    """A record's allocation that only its launches take (never returned, not write-only), kept across its replays:
    each (stream, thread) its own, since a call's launches run in order on its stream and a thread's calls one after
    another, so the next call there finds it free (docs/kernels.md, "Host time a call"). A zeroed one is a slice of a
    pool zeroed at once, the next slice each call, the pool zeroed again by one fill launch once every slice was
    taken (behind, on the stream, the launches that took them). A replay makes one as the record did while a CUDA
    graph is captured (its launches then run whenever the graph does, on any stream) and past the table's
    ``_TABLE_KEPT_BYTES``. A replay calls it with its stream."""

    __slots__ = ("made", "nbytes", "slices", "table", "kept", "cuda")

    def __init__(self, made: tuple, table: "Calls") -> None:
        self.made, self.table, self.kept = made, table, {}
        self.nbytes = _span(made[0], made[1]) * made[2].itemsize
        self.slices = max(1, _KEPT_BYTES // _rounded(self.nbytes)) if made[4] else 1
        self.cuda = made[3].type == "cuda"

    @staticmethod
    def fits(made: tuple) -> bool:
        """Whether an allocation of this (shape, strides, dtype, device, zeroed) may be kept: 1 to _KEPT_BYTES."""
        return 0 < _span(made[0], made[1]) * made[2].itemsize <= _KEPT_BYTES

    def __call__(self, stream: int | None) -> torch.Tensor:
        if self.cuda and _capturing():
            return self.fresh()
        key = (stream, threading.get_ident())
        kept = self.kept.get(key)
        if kept is None:
            kept = self.keep(key)
            if kept is None:
                return self.fresh()
        if kept.__class__ is not list:
            return kept
        at = kept[0]
        if at == self.slices:  # every slice taken: zeroed again, behind the launches that took them
            kept[1].zero_()
            at = 0
        kept[0] = at + 1
        return kept[2][at]

    def fresh(self) -> torch.Tensor:
        shape, stride, dtype, device, zero = self.made
        t = torch.empty_strided(shape, stride, dtype=dtype, device=device)
        return t.zero_() if zero else t

    def keep(self, key: tuple) -> Any:
        """What ``key`` keeps (a tensor; for a zeroed one [next slice, the pool, its slices]), within the table's
        budget, else None."""
        shape, stride, dtype, device, zero = self.made
        step = _rounded(self.nbytes) // dtype.itemsize
        size = step * self.slices * dtype.itemsize
        if self.table.kept_bytes + size > _TABLE_KEPT_BYTES:
            return None
        self.table.kept_bytes += size
        with torch.inference_mode(False):  # a tensor that later calls may zero in place, in inference mode or not
            if not zero:
                kept = self.kept[key] = torch.empty_strided(shape, stride, dtype=dtype, device=device)
                return kept
            pool = torch.zeros(step * self.slices, dtype=dtype, device=device)
            kept = self.kept[key] = [0, pool, [pool.as_strided(shape, stride, i * step) for i in range(self.slices)]]
        return kept


def _span(shape: tuple, stride: tuple) -> int:
    """Elements of storage a tensor of this shape and strides reaches (0 where it has none)."""
    if any(n == 0 for n in shape):
        return 0
    return 1 + sum((n - 1) * abs(st) for n, st in zip(shape, stride))


def _rounded(nbytes: int) -> int:
    """``nbytes`` up to a pool slice's start: the 16-byte grid Triton specialises a pointer on."""
    return (nbytes + _ALIGN) & ~_ALIGN


def _capturing() -> bool:
    """Whether the current CUDA stream is capturing a graph (torch's query, without its Python wrapper)."""
    return torch._C._cuda_isCurrentStreamCapturing()


def _replay_source(n_slots: int, allocs: list, launches: list, result: Any) -> tuple[str, dict]:
    """The text of ``replay(slots, scalars)`` for a record, and the names it reads: the slots unpacked, each
    allocation made again, the launches on the new pointers, the result rebuilt. Values of the record (shapes,
    dtypes, compiled kernels) are names bound to the objects themselves, never written out as text."""
    names: dict = {"_empty": torch.empty_strided, "_stream": _current_stream, "_view": _view, "_rebased": _rebased,
                   "_Address": _Address, "_empty_cpu": _empty_strided_cpu, "_empty_cuda": _empty_strided_cuda,
                   "_device": _current_device, "_reinterpret": _reinterpret_tensor}
    held: dict = {}

    def const(value: Any) -> str:
        if value is None or value.__class__ in (bool, int):
            return repr(value)
        name = held.setdefault(id(value), f"c{len(held)}")
        names[name] = value
        return name

    var = lambda i: f"s{i}"  # noqa: E731
    lines = ["def replay(slots, scalars):"]
    if n_slots:
        lines.append(f"    {''.join(var(i) + ', ' for i in range(n_slots))}= slots")
    if _empty_strided_cuda is not None and any(a.__class__ is tuple and a[3].type == "cuda" for a in allocs):
        lines.append("    current = _device()")  # the fast allocator takes the current device: the record's?
    bound = [one.__class__ is _Bound for one in launches]
    # the launcher's stream; a CUDA scratch is kept by it too, whatever launches (a library op's record)
    on_stream = any(bound) or any(a.__class__ is _Scratch and a.cuda for a in allocs)
    lines.append("    stream = _stream()" if on_stream else "    stream = None")
    for n, alloc in enumerate(allocs, n_slots):
        if alloc is None:  # made by the record, taken by nothing: not made again
            lines.append(f"    {var(n)} = None")
            continue
        if alloc.__class__ is _Scratch:  # kept for this stream and thread
            lines.append(f"    {var(n)} = {const(alloc)}(stream)")
            continue
        if alloc.__class__ is not tuple:  # write-only: the record's own tensor again
            lines.append(f"    {var(n)} = {const(alloc)}")
            continue
        shape, stride, dtype, device, zero = alloc
        zeroed = ".zero_()" if zero else ""
        made = f"_empty({const(shape)}, {const(stride)}, dtype={const(dtype)}, device={const(device)})"
        if device.type == "cpu" and _empty_strided_cpu is not None:
            made = f"_empty_cpu({const(shape)}, {const(stride)}, {const(dtype)})"
        elif device.type == "cuda" and _empty_strided_cuda is not None and device.index is not None:
            fast = f"_empty_cuda({const(shape)}, {const(stride)}, {const(dtype)})"
            made = f"({fast} if current == {device.index} else {made})"
        lines.append(f"    {var(n)} = {made}{zeroed}")
    if not all(bound):
        lines.append(f"    sources = [{', '.join(var(i) for i in range(n_slots + len(allocs)))}]")
    for one, is_bound in zip(launches, bound):
        lines.append("    " + (one.source(const, var) if is_bound else f"{const(one)}(sources, scalars, stream)"))
    lines.append(f"    return {_result_source(result, const, var, allocs, n_slots)}")
    return "\n".join(lines) + "\n", names


def _result_source(result: Any, const: Callable[[Any], str], var: Callable[[int], str], allocs: list, n_slots: int,
                   once: set | None = None) -> str:
    if once is None:  # the allocations that one returned tensor alone comes from
        srcs = [o.src for o in _outs(result)]
        once = {i for i in srcs if srcs.count(i) == 1}
    if result.__class__ is _Out:
        if result.view is None:
            return var(result.src)
        delta, size, stride, dtype = result.view
        alloc = allocs[result.src - n_slots] if result.src >= n_slots else None
        if alloc is not None and alloc[2] == dtype and delta % dtype.itemsize == 0:  # its storage starts at an allocation
            if _reinterpret_tensor is not None and result.src in once:  # no view tracking: nothing else aliases it
                return f"_reinterpret({var(result.src)}, {const(size)}, {const(stride)}, {delta // dtype.itemsize})"
            return f"{var(result.src)}.as_strided({const(size)}, {const(stride)}, {delta // dtype.itemsize})"
        return f"_view({var(result.src)}, *{const(result.view)})"
    if result.__class__ is tuple:
        return f"({''.join(_result_source(r, const, var, allocs, n_slots, once) + ', ' for r in result)})"
    return const(result)


class _Planned:
    """A key whose calls plan each time, and why."""

    __slots__ = ("why",)

    def __init__(self, why: str) -> None:
        self.why = why


_STREAM_OF: list = []  # Triton's driver's (current device, current stream) functions, looked up once


def _current_stream() -> int:
    """The current CUDA stream's handle on the current device, what Triton's launcher takes (Triton's own query)."""
    if not _STREAM_OF:
        from triton.runtime import driver

        _STREAM_OF.extend((driver.active.get_current_device, driver.active.get_current_stream))
    device, stream = _STREAM_OF
    return stream(device())


def _current_device() -> int:
    """The current CUDA device's index (torch's query without its Python wrapper: a replay's device is initialised)."""
    return torch._C._cuda_getDevice()


def _source(t: torch.Tensor, sources: list) -> tuple[int, int] | str:
    """(index in ``sources``, byte offset) of the source ``t`` views, or why none is certain."""
    ptr = t.data_ptr()
    for i, s in enumerate(sources):  # a view from a source's first element (the usual case), however near others lie
        if s is not None and s.data_ptr() == ptr:
            return i, 0
    storage = t.untyped_storage().data_ptr()
    found = sorted((abs(t.data_ptr() - s.data_ptr()), i) for i, s in enumerate(sources)
                   if s is not None and s.untyped_storage().data_ptr() == storage)
    if not found:
        return "a launch takes a tensor the call did not get or allocate"
    (near, i), rest = found[0], found[1:]
    if any(d - near < 256 and sources[j].data_ptr() != sources[i].data_ptr() for d, j in rest):
        return "a launch takes a view that two of the call's tensors could give"
    return i, t.data_ptr() - sources[i].data_ptr()


def _is_descriptor(value: Any) -> bool:
    """A Triton or Gluon ``TensorDescriptor``: a dataclass over a tensor (``base``) that the launcher encodes."""
    return dataclasses.is_dataclass(value) and isinstance(getattr(value, "base", None), torch.Tensor)


class _Address:
    """What a replayed descriptor has for a base: the new address, and the dtype the launcher may ask."""

    __slots__ = ("ptr", "dtype")

    def __init__(self, ptr: int, dtype: torch.dtype) -> None:
        self.ptr, self.dtype = ptr, dtype

    def data_ptr(self) -> int:
        return self.ptr

    def element_size(self) -> int:
        return self.dtype.itemsize


def _rebased(desc: Any, base: Any) -> Any:
    """``desc`` with another base, its other fields as they are (no re-validation: the key fixed them)."""
    new = object.__new__(type(desc))
    new.__dict__.update(desc.__dict__)
    new.base = base
    return new


def _view(base: torch.Tensor, delta: int, size: tuple, stride: tuple, dtype: torch.dtype) -> torch.Tensor:
    """The tensor ``delta`` bytes from ``base``'s first element, of this size, strides and dtype."""
    if dtype == base.dtype and delta % dtype.itemsize == 0:  # one call: what a returned mean or rstd costs
        return base.as_strided(size, stride, base.storage_offset() + delta // dtype.itemsize)
    storage = base.untyped_storage()
    offset = base.data_ptr() + delta - storage.data_ptr()
    return torch.empty(0, dtype=dtype, device=base.device).set_(storage, offset // dtype.itemsize, size, stride)


def _copy(dst: torch.Tensor, src: torch.Tensor, sources: list) -> Any:
    refs = []
    for t in (dst, src):
        where = _source(t, sources)
        if isinstance(where, str):
            return where.replace("a launch takes", "a copy touches")
        refs.append((*where, tuple(t.shape), tuple(t.stride()), t.dtype))
    return _Copy(*refs)


_SIGNATURES: dict = {}  # a kernel's Python function: its signature (_bind)


def _bind(launch_record: tuple, sources: list, scalars: dict) -> Any:
    kernel, grid, args, kwargs, compiled = launch_record
    if callable(grid) or not isinstance(kernel, _LAUNCHER):
        return f"{getattr(kernel, '__name__', kernel)} is not a plain Triton launch"
    sig = _SIGNATURES.get(kernel.fn)
    if sig is None:  # once a kernel: inspect.signature cost ~0.1 ms of each record
        sig = _SIGNATURES[kernel.fn] = inspect.signature(kernel.fn)
    params = {k: v for k, v in kwargs.items() if k in sig.parameters}
    options = {k: v for k, v in kwargs.items() if k not in sig.parameters}
    bound = sig.bind(*args, **params)
    bound.apply_defaults()
    values = list(bound.arguments.values())
    raw = getattr(kernel, "do_not_specialize", None) or getattr(kernel, "kwargs", {}).get("do_not_specialize") or ()
    no_spec = {kernel.arg_names[i] if isinstance(i, int) else i for i in raw}
    tensors, named, descriptors = [], [], []
    for i, (name, value) in enumerate(bound.arguments.items()):
        if isinstance(value, torch.Tensor):
            where = _source(value, sources)
            if isinstance(where, str):
                return where
            tensors.append((i, *where, tuple(value.shape), tuple(value.stride()), value.dtype))
            values[i] = None
        elif _is_descriptor(value):  # a host-side TMA descriptor: the launcher encodes it from its base's address
            where = _source(value.base, sources)
            if isinstance(where, str):
                return where
            base = value.base  # kept as a dtype: a record holds no tensor of the call (its memory stays the caller's)
            descriptors.append((i, *where, _rebased(value, _Address(0, base.dtype)), (tuple(base.shape),
                                                                                      tuple(base.stride()))))
            values[i] = None
        elif name in scalars and value == scalars[name]:
            if name not in no_spec:
                return f"per-call argument {name!r} is specialised on"
            named.append((i, name))
        elif not isinstance(value, _PLAIN) and not isinstance(value, (triton.language.constexpr, triton.language.dtype)):
            return f"argument {name!r} is a {type(value).__name__}"
    if (not _INTERPRETED and _KNOBS is not None and not options.get("launch_cooperative_grid")
            and all(hasattr(compiled, a) for a in ("run", "function", "packed_metadata"))):
        return _Bound(compiled, grid, values, tensors, named, descriptors)
    return _Relaunch(kernel, grid, values, options, tensors, named, descriptors)


class _Out:
    """A returned tensor: a source itself, or a view of one (``view``: byte offset, shape, strides, dtype)."""

    __slots__ = ("src", "view")

    def __init__(self, src: int, view: tuple | None) -> None:
        self.src, self.view = src, view


def _result_of(value: Any, sources: list) -> Any:
    """What a replay returns in place of the recorded call's ``value``: tensors as ``_Out``, tuples element by
    element, anything else (a number, None) as it was; a string says why it cannot be."""
    if isinstance(value, torch.Tensor):
        for i, s in enumerate(sources):
            if s is value:
                return _Out(i, None)
        where = _source(value, sources)
        if isinstance(where, str):
            return "the call returns a tensor it did not get or allocate"
        return _Out(where[0], (where[1], tuple(value.shape), tuple(value.stride()), value.dtype))
    if type(value) is tuple:
        parts = [_result_of(v, sources) for v in value]
        return next((p for p in parts if isinstance(p, str)), tuple(parts))
    if isinstance(value, _PLAIN):
        return value
    return f"the call returns a {type(value).__name__}"


def _replay_of(rec: _Recorder, slots: tuple, scalars: dict, value: Any,
               table: "Calls | None" = None) -> _Replay | _Planned:
    """The record's replay, or why its key plans each call; ``table``: the ``Calls`` whose budget its kept scratch
    takes from (none: scratch made each replay)."""
    if rec.unsafe:
        return _Planned(rec.unsafe)
    sources = list(slots) + [t for t, _ in rec.allocs]
    launches = []
    for kind, *step in rec.launches:
        if kind == "launch":
            bound = _bind(step, sources, scalars)
        else:
            bound = _call(*step, sources) if kind == "call" else _copy(*step, sources)
        if isinstance(bound, str):
            return _Planned(bound)
        launches.append(bound)
    for name in scalars:
        if not any(name == n for one in launches for _, n in one.named):
            return _Planned(f"per-call argument {name!r} reaches no launch as itself")
    result = _result_of(value, sources)
    if isinstance(result, str):
        return _Planned(result)
    kept = {len(slots) + i for i, (t, _) in enumerate(rec.allocs) if any(t is w for w in rec.write_only)}
    returned = {r.src for r in _outs(result)}
    if returned & kept:
        return _Planned("the call returns a tensor it marked write-only")
    used = {i for one in launches for i in one.used()}
    allocs: list = []
    for n, (t, zero) in enumerate(rec.allocs, len(slots)):
        made = (tuple(t.shape), tuple(t.stride()), t.dtype, t.device, zero)
        if n not in used and n not in returned:  # made by the record, taken by nothing: not made again
            allocs.append(None)
        elif n in kept:
            allocs.append(t)
        elif n in returned:
            allocs.append(made)
        else:  # the launches' alone: scratch
            allocs.append(_Scratch(made, table) if table is not None and _Scratch.fits(made) else made)
    return _Replay(len(slots), allocs, launches, result)


def _outs(result: Any) -> list:
    if result.__class__ is _Out:
        return [result]
    if result.__class__ is tuple:
        return [o for r in result for o in _outs(r)]
    return []


def _keyable(p: Any) -> bool:
    """A plain value a key may hold (a tensor or other object would key by identity, never to be seen again)."""
    return p.__class__ in _KEYABLE or (isinstance(p, tuple) and all(_keyable(v) for v in p))


_KEYABLE = frozenset((bool, int, float, str, type(None), torch.dtype))


def _slot_key(slots: tuple) -> tuple:
    """Each tensor's shape, strides, dtype, device and 16-byte alignment, and the first slot at its address."""
    key = []
    first: dict = {}
    for n, t in enumerate(slots):
        if t is None:
            key.append(None)
            continue
        p = t.data_ptr()
        key.append((t.shape, t.stride(), t.dtype, t.get_device(), p & _ALIGN, first.setdefault(p, n)))
    return tuple(key)


class _Hot:
    """A replayed key, checked without making one: the same params, the same Nones, tensors that pass a C++ check of
    all else the key holds (``_TensorGuards``: dtype, device, shape, strides; stricter, as it also asks type, grad
    and dispatch keys), at distinct 16-byte-aligned addresses. Kept only for a key whose tensors are so placed (an
    aliased or unaligned call keys each time). ``next``: the key replayed after it last time, checked first."""

    __slots__ = ("params", "gaps", "picks", "guards", "entry", "next")

    def __init__(self, params: tuple, slots: tuple, guards: Any, entry: _Replay) -> None:
        self.params, self.guards, self.entry = params, guards, entry
        # the slots that held None (None where none did) and those that held tensors
        gaps = tuple(i for i, t in enumerate(slots) if t is None)
        self.gaps = gaps or None
        self.picks = tuple(i for i, t in enumerate(slots) if t is not None)
        self.next: _Hot | None = None

    @classmethod
    def of(cls, params: tuple, slots: tuple, entry: _Replay) -> "_Hot | None":
        tensors = [t for t in slots if t is not None]
        if _TensorGuards is None or not _apart(tensors):
            return None
        guards = _TensorGuards(*tensors, dynamic_dims_sizes=[list(t.shape) for t in tensors],
                               dynamic_dims_strides=[list(t.stride()) for t in tensors])
        return cls(params, slots, guards, entry)

    def matches(self, slots: tuple) -> bool:
        if self.gaps is None:
            return self.guards.check(*slots) and _apart(slots)
        for i in self.gaps:
            if slots[i] is not None:
                return False
        tensors = [slots[i] for i in self.picks]  # a None among them fails the check
        return self.guards.check(*tensors) and _apart(tensors)


_DATA_PTR = torch.Tensor.data_ptr


def _apart(tensors) -> bool:
    """Each tensor at its own 16-byte-aligned address."""
    ptrs = set(map(_DATA_PTR, tensors))
    if len(ptrs) != len(tensors):
        return False
    for p in ptrs:
        if p & _ALIGN:
            return False
    return True


class Calls:
    """One public function's records, by key: ``calls(params, slots, run)`` returns ``run()`` (checks, outputs,
    plan and launches through ``launch``), planned the first time a key is seen, recorded the second, and replays
    the record after: the same allocations made again, the launches on the new pointers, and what ``run`` returned
    rebuilt from them. A key called once (a shape that changes every call) never pays a record.

    ``params``: the function's non-tensor arguments (hashable); ``slots``: its tensor arguments (or None), whose
    shapes, strides, dtypes, devices and alignment are the rest of the key. A call of a recorded key passed its
    checks once: everything they read is in the key. ``scalars``: per-call values of ``do_not_specialize`` kernel
    arguments, by name. ``last`` says what the last call did: "replayed", "recorded", "planned: <why>" ("planned:
    first call" for a key's first).
    """

    tables: list["Calls"] = []

    def __init__(self, name: str) -> None:
        self.name = name
        self.table: dict = {}
        self.last = ""
        self.hot: tuple[_Hot, ...] = ()  # the last keys replayed, latest first: checked before any key is made
        self.prev: _Hot | None = None  # the last call's, if checked: its ``next`` is checked first
        self.kept_bytes = 0  # scratch its records keep (_Scratch)
        Calls.tables.append(self)

    def __call__(self, params: tuple, slots: tuple, run: Callable[[], Any], scalars: dict | None = None) -> Any:
        if not replays_allowed():
            self.last = "planned: replays off"
            return run()
        try:
            for p in params:
                if p.__class__ not in _KEYABLE and not _keyable(p):
                    raise TypeError
            prev = self.prev
            # first, the key that came after the last call's last time: the same key again, or the next of keys in turn
            guess = hot = prev.next if prev is not None else None
            if hot is None or hot.params != params or not hot.matches(slots):
                for hot in self.hot:
                    if hot is not guess and hot.params == params and hot.matches(slots):
                        break
                else:
                    hot, key = None, (params, _slot_key(slots))
        except (AttributeError, TypeError):  # not tensors, or arguments no key holds: ``run`` says what is wrong
            self.last = "planned: no key"
            return run()
        if hot is not None:  # outside the try: an error of the replay is the caller's, not a reason to run again
            if prev is not None:
                prev.next = hot
            self.prev = hot
            self.last = "replayed"
            return hot.entry.run(slots, scalars or {})
        self.prev = None
        entry = self.table.get(key)
        if entry is None:
            self._keep(key, _SEEN)
            self.last = "planned: first call"
            return run()
        if entry is _SEEN:
            return self._record(key, slots, run, scalars or {})
        if entry.__class__ is _Replay:
            self.last = "replayed"
            if entry.hot is None:  # once a key: whether its tensors' placement lets a check stand for it
                entry.hot = _Hot.of(params, slots, entry) or False
            if entry.hot:
                self.hot = (entry.hot, *[h for h in self.hot if h is not entry.hot][:_HOT_KEYS - 1])
                if prev is not None:
                    prev.next = entry.hot
                self.prev = entry.hot
            return entry.run(slots, scalars or {})
        self.last = f"planned: {entry.why}"
        return run()

    def _record(self, key: tuple, slots: tuple, run: Callable[[], Any], scalars: dict) -> Any:
        rec = _Recorder()
        _recording.stack.append(rec)
        try:
            with rec:
                value = run()
        finally:
            _recording.stack.pop()
        entry = _replay_of(rec, slots, scalars, value, self)
        self._keep(key, entry)
        self.last = "recorded" if isinstance(entry, _Replay) else f"planned: {entry.why}"
        return value

    def _keep(self, key: tuple, entry: Any) -> None:
        if key not in self.table and len(self.table) >= _MAX_KEYS:
            self.table.clear()
            self.kept_bytes = 0
        self.table[key] = entry


def forget() -> None:
    """Drop every record: the next call of each key plans again. Call it after setting a module constant or function
    that a plan reads (the tests' ``monkeypatch`` does, tests/conftest.py; so does ``benchmarks/sweep.py --set``)."""
    for calls in Calls.tables:
        calls.table.clear()
        calls.hot, calls.prev, calls.kept_bytes = (), None, 0


def decline(why: str) -> None:
    """The call being recorded must plan each time (``why``): its plan holds for this call only."""
    rec = _current()
    if rec is not None and rec.unsafe is None:
        rec.unsafe = why
