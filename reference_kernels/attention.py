"""Fused attention forward, FlashAttention style: ``softmax(q @ k^T * scale [+ causal mask]) @ v``: its plans,
launches and public functions (the Triton kernels: ``_attention_kernels``).

One kernel, ``_attention_fwd_kernel``: a program owns ``BLOCK_M`` query rows of one
(batch, head), keeps them in registers, and walks the keys and values once in blocks of
``BLOCK_N``. For each block it takes the scores ``q @ k^T`` on the tensor cores, updates
an online softmax (running row max ``m`` and sum of exponentials ``l``, both float32) and
rescales its float32 output accumulator by ``exp(m_old - m_new)`` before adding
``p @ v``; one division by ``l`` at the end. The (N, N) score matrix never leaves the
chip: q, k and v are read once and the output written once (``budget``), where the
unfused chain (``unfused``) writes and re-reads the scores several times, bytes that grow
as N^2 (``unfused_traffic``).

The walk is cut in two stages so that masks cost only where they are needed:

* blocks every row of the program sees in full (non-causal: all but a ragged last block;
  causal: the blocks left of the program's diagonal) run without masks;
* the rest (the ragged last block; causal: the ``BLOCK_M / BLOCK_N`` blocks on the
  diagonal) mask out columns past the sequence and, causal, above the diagonal.
  Causal programs never visit the blocks right of their diagonal (fully masked), and
  are launched heaviest first (last query block first) so the short ones fill the tail.

Exponentials are base 2 (the log2(e) folded into the scale), by ``ex2.approx`` on the GPU
(``_math.exp2``). ``_attention_settings`` holds the launch heuristics; they are Hopper
defaults from the FlashAttention-2 paper and Triton's fused-attention tutorial, compiled for
sm_90 without spills; the 16-bit tiles timed on the H200 (docs/kernels.md, "attention").
A plan may instead ask for q, k, v through TMA (``_Plan.tma``) or, on sm_90, for
``_attention_ws``'s warp-specialised Gluon kernel (``_Plan.ws``); each falls back to the
pointer kernel where it cannot take the tensors.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from triton.compiler.errors import CompilationError

from pytest_fusioncheck.budget import Budget

from . import _attention_ws, _device
from ._common import (MAX_GRID_Y, cdiv, check_tensor, define_op, eager_only, inference_result, interpreting,
                      next_power_of_2, tma_ok, tracing)
from ._attention_kernels import _attention_fwd_kernel, _attention_fwd_tma_kernel
from ._launch import Calls, launch as launch_kernel

_INPUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_HEAD_DIMS = (64, 128)
_LOG2E = 1.4426950408889634


# --------------------------------------------------------------------------- plan


class _Plan(NamedTuple):
    """How one attention forward is launched; ``_attention_settings`` makes it, tests and benchmarks may vary it."""

    block_m: int  # query rows a program
    block_n: int  # key/value rows a step; a power of two dividing block_m
    num_warps: int
    num_stages: int  # software-pipelining depth of the key/value loop
    tma: bool = False  # q, k, v and the output through TMA descriptors (``_attention_fwd_tma_kernel``) where they
    # allow it (16-bit, sm_90 on, 16-byte aligned strides: ``_tma_allowed``), else through pointers
    ws: bool = False  # the warp-specialised Gluon kernel (``_attention_ws``) where it runs and takes the tensors
    # (sm_90, 16-bit, TMA-describable, a positive scale), else the Triton kernel above


# Launch heuristics by (head_dim, element size). 16-bit inputs: the warp-specialised kernel where it runs
# (sm_90; its plan and figures: _attention_ws.plan, docs/kernels.md, "attention"), else 64 x 64 tiles, 4 warps, three stages through pointers, timed on the H200 against the
# Hopper defaults of FlashAttention-2 and Triton's fused-attention tutorial (06) (128 x 64, 4 / 8 warps) and
# their neighbours (benchmarks/bench_attention.py --variants); the TMA plan not yet timed.
# float32 runs IEEE fp32 dots (no tensor cores): 64 x 32 and 128 x 64-wide fp32 tiles spilled
# 320-1600 bytes in sm_90 compiles, these smaller ones none (74-86 registers); not timed.
_PLANS = {
    (64, 2): _Plan(64, 64, 4, 3, ws=True),
    (128, 2): _Plan(64, 64, 4, 3, ws=True),
    (64, 4): _Plan(64, 16, 8, 2),
    (128, 4): _Plan(32, 16, 8, 2),
}
# Under the interpreter: small tiles, so that the short sequences of the CPU tests still walk
# several blocks, unmasked and masked, and causal programs have two blocks on their diagonal.
_INTERPRETER_PLAN = _Plan(32, 16, 4, 1)
_MIN_BLOCK = 16  # tl.dot's smallest tile side


def _attention_settings(head_dim: int, dtype: torch.dtype, seq_len: int) -> _Plan:
    """The launch plan for a problem: tiles, warps and stages by head_dim and dtype (see ``_PLANS``).

    Tiles shrink (powers of two, not below 16) for sequences shorter than a tile.
    """
    if head_dim not in _HEAD_DIMS:
        raise ValueError(f"head_dim must be one of {', '.join(map(str, _HEAD_DIMS))}, got {head_dim}")
    plan = _INTERPRETER_PLAN if interpreting() else _PLANS[(head_dim, 4 if dtype == torch.float32 else 2)]
    cap = max(_MIN_BLOCK, next_power_of_2(seq_len))
    block_m = min(plan.block_m, cap)
    return plan._replace(block_m=block_m, block_n=min(plan.block_n, block_m))


# --------------------------------------------------------------------------- launcher


def _launch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, causal: bool, scale: float, plan: _Plan) -> None:
    batch, heads, seq_len, head_dim = q.shape
    if plan.block_m % plan.block_n or plan.block_n < _MIN_BLOCK or plan.block_n & (plan.block_n - 1):
        raise ValueError(f"plan {plan}: block_n must be a power of two >= {_MIN_BLOCK} dividing block_m")
    if batch * heads > MAX_GRID_Y:
        raise ValueError(f"batch x heads = {batch * heads} exceeds the grid's {MAX_GRID_Y}")
    if plan.ws and scale > 0 and _attention_ws.available(q.device.index) and _attention_ws.fits(q, k, v, out):
        try:
            _attention_ws.launch(q, k, v, out, causal, scale * _LOG2E)
            return
        except CompilationError as error:  # a Triton whose Gluon moved on
            _attention_ws.disable(error)
    grid = (cdiv(seq_len, plan.block_m), batch * heads)
    options = dict(HEAD_DIM=head_dim, BLOCK_M=plan.block_m, BLOCK_N=plan.block_n, CAUSAL=bool(causal),
                   FAST_EXP=not interpreting(), DOT_IN_FP32=interpreting(),
                   DOT_PRECISION="ieee" if q.dtype == torch.float32 or interpreting() else "tf32",  # tf32: not 16-bit's
                   SCALE_FMA=scale > 0, num_warps=plan.num_warps, num_stages=plan.num_stages)
    if plan.tma and _tma_allowed(q, k, v, out):
        from triton.tools.tensor_descriptor import TensorDescriptor

        descriptors = [TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, rows, head_dim])
                       for t, rows in ((q, plan.block_m), (k, plan.block_n), (v, plan.block_n), (out, plan.block_m))]
        launch_kernel(_attention_fwd_tma_kernel, grid, *descriptors, heads, seq_len, scale * _LOG2E, **options)
        return
    launch_kernel(_attention_fwd_kernel, grid,
        q, k, v, out, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out.stride()[:3],
        heads, seq_len, scale * _LOG2E, **options,
    )


def _tma_allowed(*tensors: torch.Tensor) -> bool:
    """Whether a TMA plan runs as one: 16-bit inputs (fp32's IEEE dots read TMA's tiles into 255 registers and spill
    at head_dim 128: scripts/attn_sass.py), on a GPU of compute capability 9.0 on (or the interpreter), every tensor
    one TMA can describe."""
    if tensors[0].element_size() != 2 or (not interpreting() and _device.of(tensors[0].device).arch < 90):
        return False
    return all(tma_ok(t) for t in tensors)


# --------------------------------------------------------------------------- public functions


def _check(q, k, v) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(t, name, dtypes=_INPUT_DTYPES, ndim=4)
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k and v must share a dtype, got {q.dtype}, {k.dtype} and {v.dtype}")
    if not (q.shape == k.shape == v.shape):
        raise ValueError(
            f"q, k and v must have one shape (batch, heads, seq, head_dim), got "
            f"{tuple(q.shape)}, {tuple(k.shape)} and {tuple(v.shape)}"
        )
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k and v must be on one device, got {q.device}, {k.device} and {v.device}")
    if q.shape[-1] not in _HEAD_DIMS:
        raise ValueError(f"head_dim must be one of {', '.join(map(str, _HEAD_DIMS))}, got {q.shape[-1]}")


def _scale(q: torch.Tensor, scale: float | None) -> float:
    if scale is None:
        return 1.0 / math.sqrt(q.shape[-1])
    scale = float(scale)
    if not math.isfinite(scale):
        raise ValueError(f"scale must be finite, got {scale}")
    return scale


def _unit_head_dim_stride(t: torch.Tensor) -> torch.Tensor:
    """``t``, or a contiguous copy when its head_dim is strided: the kernel's loads need a unit stride
    there to be 16-byte vectors and software-pipelined (the sm_90 compile of a runtime stride did neither)."""
    return t if t.stride(-1) == 1 else t.contiguous()


CALLS = Calls("attention.fused")  # a problem's first call plans, its second records, later ones replay (_launch.py)


def fused(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False, scale: float | None = None,
          plan: _Plan | None = None) -> torch.Tensor:
    """``softmax(q @ k^T * scale) @ v`` in one Triton kernel (the module docstring), optionally causal.

    q, k, v: one shape (batch, heads, seq, head_dim), float16, bfloat16 or float32, one
    device; head_dim 64 or 128. Any strides (a head_dim whose stride is not 1 costs a copy). ``scale`` defaults to 1/sqrt(head_dim).
    ``causal``: query i sees keys 0..i (torch's ``is_causal``). Scores, max and sum in
    float32; returns a contiguous tensor of q's shape and dtype. ``plan`` overrides the
    launch heuristic (``_attention_settings``), for tests and benchmarks. Under ``torch.compile`` the call is the
    opaque op ``reference_kernels::attention`` (no ``plan``), which the compiled graph calls eagerly.
    """
    if tracing():
        eager_only("attention.fused", plan=plan)
        result = _ATTENTION_OP(q, k, v, bool(causal), None if scale is None else float(scale))
    else:
        result = _calls(q, k, v, causal, scale, plan)
    return inference_result("attention.fused", (q, k, v), result)


def _calls(q, k, v, causal, scale, plan=None):
    """The call's launches (recorded or replayed), and the op's implementation."""
    return CALLS((causal, scale, plan), (q, k, v), lambda: _fused(q, k, v, causal, scale, plan))


def _fake(q, k, v, causal, scale):
    _check(q, k, v)
    return torch.empty(q.shape, dtype=q.dtype, device=q.device)


_ATTENTION_OP = define_op("attention(Tensor q, Tensor k, Tensor v, bool causal, float? scale) -> Tensor", _calls, _fake)


def _fused(q, k, v, causal, scale, plan):
    _check(q, k, v)
    scale = _scale(q, scale)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if q.numel() == 0:
        return out
    q, k, v = (_unit_head_dim_stride(t) for t in (q, k, v))
    _launch(q, k, v, out, causal, scale, plan or _attention_settings(q.shape[-1], q.dtype, q.shape[2]))
    return out


def unfused(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False, scale: float | None = None) -> torch.Tensor:
    """Attention as people write it: scores, scale, mask, softmax, @ v, one kernel each.

    Traffic per line for q, k, v of shape (B, H, N, D), in elements of q's dtype; the
    causal mask is bool (bytes).
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = q @ k.transpose(-2, -1)  # read 2BHND elements ; write BHNN elements
    scores = scores * scale  # read BHNN elements ; write BHNN elements
    if causal:
        n = q.shape[-2]
        mask = torch.ones(n, n, dtype=torch.bool, device=q.device)  # read nothing ; write NN bytes
        mask = mask.triu(1)  # read NN bytes ; write NN bytes
        scores.masked_fill_(mask, float("-inf"))  # read BHNN elements + NN bytes ; write BHNN elements
    probs = torch.softmax(scores, dim=-1)  # read BHNN elements ; write BHNN elements
    return probs @ v  # read BHNN + BHND elements ; write BHND elements


def budget(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False, scale: float | None = None) -> Budget:
    """Compulsory traffic of attention: q, k and v read once, the output written once.

    ``causal`` and ``scale`` change nothing (accepted so that a call's arguments can be
    passed on as they are). Reads shapes only: meta tensors work, so budgets of large
    problems cost no memory.
    """
    b, h, n, d = q.shape
    elt = q.element_size()
    return Budget(read_bytes=3 * b * h * n * d * elt, write_bytes=b * h * n * d * elt, label="attention")


def unfused_traffic(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                    scale: float | None = None) -> Budget:
    """Traffic of ``unfused(q, k, v, causal=causal)``: the sum of its line comments.

    The (N, N) scores are written three times and read three times (four of each with the
    causal mask), so this grows as N^2 where ``budget`` grows as N.
    """
    b, h, n, d = q.shape
    elt = q.element_size()
    bhnn, bhnd = b * h * n * n, b * h * n * d
    reads = 2 * bhnd + bhnn + bhnn + (bhnn + bhnd)  # scores, * scale, softmax, @ v
    writes = bhnn + bhnn + bhnn + bhnd
    read_bytes, write_bytes = reads * elt, writes * elt
    if causal:
        read_bytes += bhnn * elt + n * n + n * n  # masked_fill_ (scores + mask), triu
        write_bytes += bhnn * elt + n * n + n * n  # masked_fill_, ones, triu
    label = "attention, unfused" + (" causal" if causal else "")
    return Budget(read_bytes=read_bytes, write_bytes=write_bytes, label=label)
