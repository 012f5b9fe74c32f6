"""Shared host-side helpers of the reference kernels: input checks, launch heuristics, row views.

One place for the choices every launcher makes (block size, warps; the device's SMs and resources: ``_device``), as Liger-Kernel's
``ops/utils.py`` keeps ``calculate_settings`` and ``infer_device``, so that tuning one subject
does not fork the others. Triton helpers that several subjects call live beside it:
``_split_walk.py`` (the persistent / split row walk of softmax and the layer-norm forward)
and ``_math.py`` (fast-math primitives and the exact GELU). Subject modules import from
these, never from each other.
"""

from __future__ import annotations

import functools
import os
import warnings

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def interpreting() -> bool:
    """True when Triton runs kernels under its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


# Host-side integer helpers. Triton's own (triton.cdiv, triton.next_power_of_2) are constexpr functions since Triton
# 3.x: a host call unwraps its arguments and costs ~2.5 us against ~0.03 us for plain Python, and a launch plan takes
# dozens (docs/kernels.md, "Host time a call").
def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def check_tensor(t: object, name: str, *, dtypes=FLOAT_DTYPES, ndim: int | None = None, min_ndim: int | None = None) -> None:
    """Raise a clear ``TypeError``/``ValueError`` when ``t`` is not a usable kernel input.

    Checks: it is a tensor, its dtype is one the kernel supports, its rank, and that its
    device can run Triton here (a CUDA tensor, or any tensor under the interpreter).
    """
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        allowed = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{name} has dtype {str(t.dtype).replace('torch.', '')}; supported: {allowed}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimension(s), got shape {tuple(t.shape)}")
    if min_ndim is not None and t.dim() < min_ndim:
        raise ValueError(f"{name} must have at least {min_ndim} dimension(s), got shape {tuple(t.shape)}")
    if not t.is_cuda and not interpreting():
        raise ValueError(
            f"{name} is on {t.device}; the fused kernels run on CUDA tensors "
            "(or on CPU tensors under TRITON_INTERPRET=1)"
        )


# --------------------------------------------------------------------------- launch heuristics

TRITON_DIVISIBILITY = 16  # Triton specialises integer arguments and pointers divisible by 16 (bytes for a pointer)
INTERPRETER_SMS = 3  # "SMs" off CUDA and under the interpreter: few, so persistent programs walk several tiles
ELEMS_PER_THREAD = 32  # whole rows held in registers: 32 elements a thread (docs/kernels.md, "softmax")
# Register-capped plans keep RESIDENT_WARPS warps an SM resident (half an SM's 64 warp slots: two 16-warp programs, four
# 8-warp ones, ...); their cap is the register file over those warps (64 registers on sm_80-sm_100)
RESIDENT_WARPS = 32
THREAD_MAX_REGS = 255  # the most registers a thread may have (every GPU the kernels run on)
MAX_GRID_Y = 65535  # CUDA's limit on a grid's second axis (attention's batch x heads)
# The rows plan of softmax and the layer-norm forward (docs/kernels.md, "The rows kernel"): a program holds rows of up
# to MAX_ROW elements (32 warps x 32 threads x 16 fp32) and ROWS_TILE elements in all (4 warps x 32 x 16)
MAX_ROW = 16384
ROWS_TILE = 2048


def tma_ok(t: torch.Tensor) -> bool:
    """Whether TMA can describe ``t``: a unit innermost stride, the others and the base address 16-byte aligned."""
    elt = t.element_size()
    return t.stride(-1) == 1 and t.data_ptr() % 16 == 0 and all(s * elt % 16 == 0 for s in t.stride()[:-1])


def reg_cap(regs_per_sm: int, warps_an_sm: int) -> int:
    """Registers a thread (``maxnreg``, in Triton's steps of 8, at most ``THREAD_MAX_REGS``) at which ``warps_an_sm``
    warps fit an SM's register file at once."""
    return min(THREAD_MAX_REGS, regs_per_sm // (warps_an_sm * 32) // 8 * 8)


def warps_for(elements: int) -> int:
    """Warps for a program holding ``elements`` in registers: ``ELEMS_PER_THREAD`` a thread, 4 to 16 warps."""
    return max(4, min(16, elements // (32 * ELEMS_PER_THREAD)))


# --------------------------------------------------------------------------- row views and outputs


def as_rows(x: torch.Tensor) -> torch.Tensor:
    """``x`` as an (M, N) view with unit column stride; copies only when no such view exists."""
    if x.dim() == 2 and x.stride(1) == 1:  # already rows (the common call: no view to make)
        return x
    n_cols = x.shape[-1]
    if x.stride(-1) != 1 and n_cols > 1:
        x = x.contiguous()
    try:
        return x.view(-1, n_cols)
    except RuntimeError:  # leading dims not flattenable without a copy
        return x.contiguous().view(-1, n_cols)


def rows_cols(x: torch.Tensor) -> tuple[int, int]:
    """(M, N) of ``x`` seen as rows of its last dimension; a 0-d tensor is one row of one."""
    n_cols = x.shape[-1] if x.dim() else 1
    return (x.numel() // n_cols if n_cols else 0), n_cols


def tracing() -> bool:
    """Whether torch.compile is tracing this call: each subject's public call is then its opaque op
    (``reference_kernels::<subject>``, registered beside it), which the compiled graph runs eagerly; Dynamo would
    otherwise trace into the launch path and fail there."""
    return torch.compiler.is_compiling()


# Every subject's op under torch.compile, defined by a Library rather than ``torch.library.custom_op``, with autograd
# passing through to its implementation: what autograd records is its public call's, eager and traced alike (an op
# with no backward runs forward on inputs that require grad and raises only where a gradient reaches it; custom_op's
# failed to compile there), and a compiled graph's call pays no Python between the dispatcher and the implementation
# (benchmarks/bench_ops.py).
OPS = torch.library.Library("reference_kernels", "DEF")


def define_op(schema: str, impl, fake, *, lib: torch.library.Library = OPS):
    """Define ``reference_kernels::<name>`` by its ``schema`` ("name(Tensor x, ...) -> Tensor"): ``impl`` computes it on
    any device, ``fake`` gives torch.compile its outputs' shapes. Returns the op (its default overload). Autograd falls
    through to ``impl``: the op's outputs take no autograd node of their own, so each public call gives its outputs
    theirs, eager and under torch.compile alike: a node that raises if a gradient reaches it (``inference_result``),
    or the layer norm's autograd.Function, whose forward and backward call its ops when traced. ``lib``: another
    namespace's library (benchmarks/bench_ops.py times a stand-in op defined this way)."""
    name = schema.split("(", 1)[0]
    lib.define(schema)
    lib.impl(name, impl, "CompositeExplicitAutograd")
    lib.impl(name, torch.library.fallthrough_kernel, "Autograd")
    torch.library.register_fake(f"{lib.ns}::{name}", fake, lib=lib)
    return getattr(getattr(torch.ops, lib.ns), name).default


def _no_backward_impl(grad: torch.Tensor, like: torch.Tensor, where: str) -> torch.Tensor:
    raise RuntimeError(f"{where} has no backward: a gradient reached it (run it under torch.no_grad(), or on tensors "
                       "that do not require grad; layer_norm.fused is the differentiable layer norm)")


# A backward that raises when it runs (an eager backward, or a compiled one's at run time) and traces to a tensor like
# ``like``, so that torch.compile can build the graph of a forward that never differentiates through the op
_NO_BACKWARD = define_op("no_backward(Tensor grad, Tensor like, str where) -> Tensor", _no_backward_impl,
                         lambda grad, like, where: torch.empty_like(like))


class _NoBackward(torch.autograd.Function):
    """The outputs of a call with no backward, given a node that raises if a gradient reaches it."""

    @staticmethod
    def forward(ctx, where, n_inputs, *tensors):
        ctx.where = where
        ctx.save_for_backward(*tensors[:n_inputs])
        outs = tuple(t.view_as(t) for t in tensors[n_inputs:])
        return outs if len(outs) > 1 else outs[0]

    @staticmethod
    def backward(ctx, *grads):
        grad = next(g for g in grads if g is not None)
        return (None, None, *(_NO_BACKWARD(grad, t, ctx.where) for t in ctx.saved_tensors), *(None,) * len(grads))


def wants_grad(tensors) -> bool:
    """Whether autograd would differentiate through a call of these tensors (or Nones): grad mode, and one of them
    requires grad. A loop, not a list: every eager call asks (~0.2 us)."""
    if torch.is_grad_enabled():
        for t in tensors:
            if t is not None and t.requires_grad:
                return True
    return False


def inference_result(where: str, inputs, result):
    """``result`` of a call with no backward (``where``: its name; ``inputs``: its tensors, or None): as it is unless
    autograd would differentiate through it (grad mode, an input that requires grad); then its tensors carry a node
    that raises when a gradient reaches it, where a fresh Triton output would take none and leave the inputs'
    gradients silently short."""
    if not wants_grad(inputs):
        return result
    needs = [t for t in inputs if t is not None and t.requires_grad]
    outs = result if isinstance(result, tuple) else (result,)
    wrapped = _NoBackward.apply(where, len(needs), *needs, *outs)
    return (wrapped,) if isinstance(result, tuple) and len(outs) == 1 else wrapped


def eager_only(where: str, **overrides) -> None:
    """Refuse a traced call that set a plan override: under torch.compile the default plan runs."""
    for name, value in overrides.items():
        if value is not None:
            raise ValueError(f"{where}: {name}= is for eager calls; under torch.compile the default plan runs")


def traced_result(result: torch.Tensor, out: torch.Tensor | None, where: str) -> torch.Tensor:
    """A traced call's result from its op, copied into ``out`` when given (one more kernel than an eager call's)."""
    if out is None:
        return result
    if out.shape != result.shape or out.dtype != result.dtype or out.device != result.device or not out.is_contiguous():
        raise ValueError(f"{where}: out must be a contiguous {tuple(result.shape)} tensor of {result.dtype} on "
                         f"{result.device}")
    return out.copy_(result)


def output_like(x: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """A fresh contiguous tensor like ``x``, or ``out`` once checked to be one."""
    if out is None:
        return torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if not isinstance(out, torch.Tensor) or out.shape != x.shape or out.dtype != x.dtype or out.device != x.device:
        raise ValueError(f"out must be a tensor of x's shape {tuple(x.shape)}, dtype {x.dtype} and device {x.device}")
    if not out.is_contiguous():
        raise ValueError("out must be contiguous")
    return out


def float32_pair(rows: int, n_cols: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Two (rows, n_cols) float32 scratch tensors (dweight's and dbias's shares) from one allocation: an eager call's
    allocations are much of its host time (docs/kernels.md, "Host time a call"); the second starts 16-byte aligned."""
    n = rows * n_cols
    start = (n + 3) // 4 * 4
    both = torch.empty(start + n, dtype=torch.float32, device=device)
    return both[:n].view(rows, n_cols), both[start:].view(rows, n_cols)


def graph_device_ms(launch, sets: list, replays: int = 5) -> float:
    """Device milliseconds of one ``launch(set)``: ``max(len(sets), 4)`` calls over the rotating
    ``sets`` captured in one CUDA graph (after a call on a side stream, as torch's CUDA-graph notes
    prescribe), the graph replayed ``replays`` times, the median replay over its calls.

    A graph replays the launches back to back, so the Python launch path is not timed: timing
    from the host (``do_bench``) read a 65 us softmax 30% slow and a 7-20 us GEMM at 40-150 us
    (docs/kernels.md). The reference kernels' tuning and the benchmarks time with it.
    """
    import statistics

    calls = max(len(sets), 4)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        launch(sets[0])
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            launch(sets[i % len(sets)])
    graph.replay()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / calls)
    del graph
    return statistics.median(times)


@functools.cache
def sm90(device_index: int | None) -> bool:
    """Whether CUDA device ``device_index`` has compute capability 9.x, what the Gluon kernels are built for (wgmma,
    ``setmaxnreg``, sm_90's shared memory): each Gluon module's ``available()`` asks it as ``_capable``."""
    return torch.cuda.get_device_capability(device_index)[0] == 9


def disable_after_compile_failure(record: list[str], what: str, instead: str, error: Exception) -> None:
    """A Gluon kernel failed to compile (a Triton whose Gluon moved on): warn once that ``what`` does not compile with
    this Triton and that ``instead`` runs, and append the error to ``record`` (the module's list that its
    ``available()`` reads). The warning points at the caller of the module's ``disable``."""
    if not record:
        import triton

        first = str(error).splitlines()[0][:200] if str(error) else ""
        warnings.warn(f"reference_kernels: {what} with Triton {triton.__version__} ({type(error).__name__}: {first}); "
                      f"{instead}", RuntimeWarning, stacklevel=4)
    record.append(f"{type(error).__name__}: {error}")
