"""GEMM + epilogue on Hopper with warp specialisation: a "ping-pong" persistent kernel in Gluon.

``act(a @ b + bias) + residual`` as ``gemm_epilogue.fused`` computes it, for sm_90 (H100 / H200) only. In
``gemm_epilogue._gemm_epilogue_tma_kernel`` (Triton's own language) the warps that issue a tile's MMAs also run its
epilogue (bias, exact GELU: ~25 instructions an element), and the tensor cores idle meanwhile: at K = 768 that is
10-25% against cuBLASLt. Here one persistent program an SM has three partitions (``gl.warp_specialize``):

* a loader (1 warp, few registers) that issues every TMA load of the program's tiles into a ring of ``STAGES``
  (A, B) shared-memory stages, each with a ``ready`` and an ``empty`` mbarrier;
* two consumers (one warpgroup each: the default partition and a 4-warp worker running the same code), consumer
  ``c`` taking the program's tiles ``c, c + 2, ...``: async ``warpgroup_mma`` over the ring, then the epilogue on
  its fp32 accumulator in registers, a store into the consumer's own shared tile and a TMA store. While one runs
  its epilogue, the other's MMAs keep the tensor cores busy.

The ring is shared: the k-th step of the program's j-th tile is the ring's step ``j * k_tiles + k`` (stage
``% STAGES``, parity ``// STAGES & 1``), so each consumer derives its stages and phases without talking to the other.
The consumers' main loops are ordered by two mbarriers (``turn``): consumer ``c`` starts a tile's MMAs only after the
other finished its previous tile's, so the MMA phases alternate strictly. This is also what makes the shared ring's
parities safe: a consumer that waited on a stage's ``ready`` barrier while that stage's previous use (the other
consumer's tile) was still unloaded would see the previous phase complete and read the wrong step.

The epilogue is ``_gemm_common._epilogue`` and the tile order ``_gemm_common._tile_coords``, the ones
``gemm_epilogue``'s kernels call: Triton ``@triton.jit`` functions compile inside a Gluon kernel (the callee inherits
the caller's Gluon code generator; checked with Triton 3.6 and 3.9), so the semantics are the other kernels' by
construction.

Gluon's names move between releases; like ``_held``, every Gluon import is guarded and ``available()`` is False
where it failed, under the interpreter, and off a GPU of compute capability 9.x.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from . import _gemm_common
from ._common import cdiv, disable_after_compile_failure, interpreting, sm90
from ._device import DESCRIPTIONS, sm_count
from ._hopper import (TensorDescriptor, fence_async_shared, gl, gluon, mbarrier, smem_layout, tma,
                      tma_load as _tma_load, tma_store as _tma_store, warpgroup_mma, warpgroup_mma_wait)
from ._launch import launch as launch_kernel


SMEM_PER_BLOCK = DESCRIPTIONS["H100"].smem_per_block  # the most one block may take on sm_90 (227 KiB, opt-in)
# Registers a thread (setmaxnreg, by warpgroup): 12 warps launch at 168 (64K / 384 threads); the consumer worker asks
# CONSUMER_REGS, the loader's warpgroup (1 warp used) LOADER_REGS, the default partition (consumer 0) the rest:
# (168 * 384 - 240 * 128 - 24 * 128) / 128 = 240 (SASS: USETMAXREG 0xf0 / 0x18). 240 rather than 232 (loader 40):
# a residual whose row stride is not a multiple of 16 elements spills 17 registers at 232, 11 at 240 with Triton 3.6
# (none if aligned, none with 3.9).
CONSUMER_REGS = 240
LOADER_REGS = 24


class WsConfig(NamedTuple):
    """A launch of this kernel (``gemm_epilogue``'s tuner times these beside its own configs' tuples)."""
    block_m: int  # a consumer's tile rows: 64 or 128 (one warpgroup's wgmma)
    block_n: int  # its columns, at most 256
    block_k: int
    group_m: int  # grouped tile order (_gemm_common._tile_coords)
    stages: int  # (A, B) stages of the loader's ring
    per_sm: int  # programs an SM: 1 (12 warps at 168 registers fill the register file; launch refuses more)
    epilogue_split: int = 2  # 1, or 2: store a tile in two column halves (half the output tiles' shared memory)


DEFAULT_CONFIG = WsConfig(128, 128, 64, 8, 6, 1)
EPILOGUE_SPLIT = 2  # the split of a config given as a plain 6-tuple
_DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16"}


_capable = sm90  # compute capability 9.x (tests replace it)


def available(device_index: int | None = None) -> bool:
    """Whether this kernel runs here: Triton with Gluon's Hopper ops, not the interpreter, a CUDA GPU of compute
    capability 9.x (wgmma and ``setmaxnreg`` are sm_90 instructions), and no compile failure so far (``disable``)."""
    if gluon is None or _DISABLED or interpreting() or not torch.cuda.is_available():
        return False
    return _capable(device_index)


_DISABLED: list[str] = []  # why this kernel stopped being offered in this process (disable())


def disable(error: Exception) -> None:
    """After the kernel failed to compile (a Triton whose Gluon moved on): warn once; the tuner's other configs run."""
    disable_after_compile_failure(_DISABLED, "the warp-specialised GEMM does not compile", "the other GEMM kernels "
                                  "run instead", error)


if gluon is not None:

    @gluon.constexpr_function
    def _acc_layout(BLOCK_N):
        # one warpgroup's wgmma accumulator: 4 warps down M, one instruction N-wide (N <= 256), K 16 (16-bit)
        return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16])

    @gluon.jit
    def _loader(a_desc, b_desc, a_bufs, b_bufs, ready, empty, M, N, K,
                BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, GROUP_M: gl.constexpr,
                STAGES: gl.constexpr, NUM_PROGRAMS: gl.constexpr, B_KMAJOR: gl.constexpr):
        pid = gl.program_id(0)
        num_pid_m = gl.cdiv(M, BLOCK_M)
        num_pid_n = gl.cdiv(N, BLOCK_N)
        k_tiles = gl.cdiv(K, BLOCK_K)
        num_tiles = num_pid_m * num_pid_n
        nbytes: gl.constexpr = a_desc.block_type.nbytes + b_desc.block_type.nbytes
        step = 0
        for tile_id in range(pid, num_tiles, NUM_PROGRAMS):
            pid_m, pid_n = _gemm_common._tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
            off_m = pid_m * BLOCK_M
            off_n = pid_n * BLOCK_N
            for k in range(k_tiles):
                s = step % STAGES
                # the stage's previous use released (the first pass waits on parity 1: passes at once)
                mbarrier.wait(empty.index(s), ((step // STAGES) & 1) ^ 1)
                bar = ready.index(s)
                mbarrier.expect(bar, nbytes)
                _tma_load(a_desc, [off_m, k * BLOCK_K], bar, a_bufs.index(s))
                if B_KMAJOR:
                    _tma_load(b_desc, [off_n, k * BLOCK_K], bar, b_bufs.index(s))
                else:
                    _tma_load(b_desc, [k * BLOCK_K, off_n], bar, b_bufs.index(s))
                step += 1

    @gluon.jit
    def _store_part(c_desc, c_buf, acc, rows, off_m, off_n, col0: gl.constexpr, M, N, bias_ptr, res_ptr,
                    stride_rm, stride_rn, WIDTH: gl.constexpr, HAS_BIAS: gl.constexpr, ACTIVATION: gl.constexpr,
                    HAS_RESIDUAL: gl.constexpr, GELU_DEGREE: gl.constexpr):
        # columns [col0, col0 + WIDTH) of the tile: epilogue in registers, then through c_buf by one TMA store
        layout: gl.constexpr = acc.type.layout
        cols = off_n + col0 + gl.arange(0, WIDTH, layout=gl.SliceLayout(0, layout))
        out = _gemm_common._epilogue(acc, rows, cols, M, N, bias_ptr, res_ptr, stride_rm, stride_rn,
                            HAS_BIAS, ACTIVATION, HAS_RESIDUAL, GELU_DEGREE)
        tma.store_wait(0)  # this consumer's previous store has finished reading c_buf
        c_buf.store(out.to(c_desc.dtype))
        fence_async_shared()
        _tma_store(c_desc, [off_m, off_n + col0], c_buf)

    @gluon.jit
    def _consumer(a_bufs, b_bufs, ready, empty, turn, c_desc, c_bufs, bias_ptr, res_ptr, M, N, K, stride_rm, stride_rn,
                  BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, GROUP_M: gl.constexpr,
                  STAGES: gl.constexpr, NUM_PROGRAMS: gl.constexpr, B_KMAJOR: gl.constexpr,
                  EPILOGUE_SPLIT: gl.constexpr, HAS_BIAS: gl.constexpr,
                  ACTIVATION: gl.constexpr, HAS_RESIDUAL: gl.constexpr, GELU_DEGREE: gl.constexpr,
                  CONSUMER: gl.constexpr):
        pid = gl.program_id(0)
        num_pid_m = gl.cdiv(M, BLOCK_M)
        num_pid_n = gl.cdiv(N, BLOCK_N)
        k_tiles = gl.cdiv(K, BLOCK_K)
        num_tiles = num_pid_m * num_pid_n
        acc_layout: gl.constexpr = _acc_layout(BLOCK_N)
        c_buf = c_bufs.index(CONSUMER)
        j = CONSUMER  # the tile's index among the program's tiles: this consumer takes every other one
        n = 0  # tiles this consumer has done (its turn barrier's parity)
        for tile_id in range(pid + CONSUMER * NUM_PROGRAMS, num_tiles, 2 * NUM_PROGRAMS):
            pid_m, pid_n = _gemm_common._tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
            off_m = pid_m * BLOCK_M
            off_n = pid_n * BLOCK_N
            # the other consumer has finished its previous tile's MMAs (so every earlier ring step is loaded and
            # consumed); consumer 0's first wait is on parity 1 (passes at once), consumer 1's waits for consumer 0
            mbarrier.wait(turn.index(CONSUMER), (n & 1) ^ (1 - CONSUMER))
            base = j * k_tiles
            acc = gl.zeros((BLOCK_M, BLOCK_N), gl.float32, acc_layout)
            for k in range(k_tiles):
                step = base + k
                s = step % STAGES
                mbarrier.wait(ready.index(s), (step // STAGES) & 1)
                if B_KMAJOR:
                    b_op = b_bufs.index(s).permute((1, 0))
                else:
                    b_op = b_bufs.index(s)
                acc = warpgroup_mma(a_bufs.index(s), b_op, acc, use_acc=k > 0, is_async=True)
                # at most this MMA in flight: the previous step's is done, its stage free for the loader
                acc = warpgroup_mma_wait(1, deps=(acc,))
                mbarrier.arrive(empty.index((step + STAGES - 1) % STAGES), pred=k > 0)
            acc = warpgroup_mma_wait(0, deps=(acc,))
            mbarrier.arrive(empty.index((base + k_tiles - 1) % STAGES))
            mbarrier.arrive(turn.index(1 - CONSUMER))

            rows = off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, acc_layout))
            if EPILOGUE_SPLIT == 2:
                HALF: gl.constexpr = BLOCK_N // 2
                half_layout: gl.constexpr = _acc_layout(HALF)
                acc0, acc1 = gl.split(gl.permute(gl.reshape(acc, (BLOCK_M, 2, HALF)), (0, 2, 1)))
                # the halves' registers are the accumulator's: the conversions move no data
                acc0 = gl.convert_layout(acc0, half_layout)
                acc1 = gl.convert_layout(acc1, half_layout)
                rows_h = gl.convert_layout(rows, gl.SliceLayout(1, half_layout))
                _store_part(c_desc, c_buf, acc0, rows_h, off_m, off_n, 0, M, N, bias_ptr, res_ptr, stride_rm,
                            stride_rn, HALF, HAS_BIAS, ACTIVATION, HAS_RESIDUAL, GELU_DEGREE)
                _store_part(c_desc, c_buf, acc1, rows_h, off_m, off_n, HALF, M, N, bias_ptr, res_ptr, stride_rm,
                            stride_rn, HALF, HAS_BIAS, ACTIVATION, HAS_RESIDUAL, GELU_DEGREE)
            else:
                _store_part(c_desc, c_buf, acc, rows, off_m, off_n, 0, M, N, bias_ptr, res_ptr, stride_rm,
                            stride_rn, BLOCK_N, HAS_BIAS, ACTIVATION, HAS_RESIDUAL, GELU_DEGREE)
            j += 2
            n += 1
        tma.store_wait(0)

    # M and K unspecialised: their divisibility changes nothing here (TMA clips the edges) but would multiply the
    # compiled variants. N's and stride_rm's do matter: with both multiples of 16 the bias and residual loads pair
    # up (32-bit) and the residual epilogue does not spill (otherwise 11 spilled registers at 240 a thread)
    @gluon.jit(launch_metadata=lambda grid, kernel, args: _gemm_common._launch_metadata(grid, kernel, args),
               do_not_specialize=["M", "K"])
    def _gemm_ws_kernel(
        a_desc,  # (M, K) descriptor, block (BLOCK_M, BLOCK_K)
        b_desc,  # (K, N) descriptor, block (BLOCK_K, BLOCK_N); (N, K), block (BLOCK_N, BLOCK_K) if B_KMAJOR
        c_desc,  # (M, N) descriptor, block (BLOCK_M, BLOCK_N // EPILOGUE_SPLIT)
        bias_ptr,  # (N,); any pointer if not HAS_BIAS
        res_ptr,  # (M, N); any pointer if not HAS_RESIDUAL
        M, N, K,
        stride_rm, stride_rn,  # residual strides
        BLOCK_M: gl.constexpr,
        BLOCK_N: gl.constexpr,
        BLOCK_K: gl.constexpr,
        GROUP_M: gl.constexpr,
        STAGES: gl.constexpr,  # (A, B) stages of the ring
        NUM_PROGRAMS: gl.constexpr,  # the persistent grid's stride
        B_KMAJOR: gl.constexpr,  # b is a transposed view of a contiguous (N, K) tensor
        EPILOGUE_SPLIT: gl.constexpr,  # 1, or 2: store each tile in two column halves
        HAS_BIAS: gl.constexpr,
        ACTIVATION: gl.constexpr,  # gemm_epilogue's codes (0-5)
        HAS_RESIDUAL: gl.constexpr,
        GELU_DEGREE: gl.constexpr,
        CONSUMER_REGS: gl.constexpr,  # registers a consumer-worker thread; the default partition gets the rest
        LOADER_REGS: gl.constexpr,
    ):
        gl.static_assert(gl.num_warps() == 4, "the default partition is one consumer warpgroup: num_warps=4")
        gl.static_assert(BLOCK_M == 64 or BLOCK_M == 128, "BLOCK_M: one warpgroup's wgmma rows, 64 or 128")
        gl.static_assert(BLOCK_N <= 256, "BLOCK_N: one wgmma's N, at most 256")
        dtype: gl.constexpr = a_desc.dtype
        a_bufs = gl.allocate_shared_memory(dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
        b_bufs = gl.allocate_shared_memory(dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
        c_bufs = gl.allocate_shared_memory(c_desc.dtype, [2] + c_desc.block_type.shape, c_desc.layout)
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(ready.index(i), count=1)
            mbarrier.init(empty.index(i), count=1)
        for i in gl.static_range(2):
            mbarrier.init(turn.index(i), count=1)
        fence_async_shared()  # the barriers' initialisation before any partition's TMA or wait uses them

        # (the argument tuples are written inline: passed through a variable, Triton 3.6 gave the partitions its
        # constexprs as tensors, and gl.zeros((BLOCK_M, BLOCK_N), ...) failed to compile)
        gl.warp_specialize([
            (_consumer, (a_bufs, b_bufs, ready, empty, turn, c_desc, c_bufs, bias_ptr, res_ptr, M, N, K, stride_rm,
                         stride_rn, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, STAGES, NUM_PROGRAMS, B_KMAJOR,
                         EPILOGUE_SPLIT, HAS_BIAS, ACTIVATION, HAS_RESIDUAL, GELU_DEGREE, 0)),
            (_consumer, (a_bufs, b_bufs, ready, empty, turn, c_desc, c_bufs, bias_ptr, res_ptr, M, N, K, stride_rm,
                         stride_rn, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, STAGES, NUM_PROGRAMS, B_KMAJOR,
                         EPILOGUE_SPLIT, HAS_BIAS, ACTIVATION, HAS_RESIDUAL, GELU_DEGREE, 1)),
            (_loader, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M,
                       STAGES, NUM_PROGRAMS, B_KMAJOR)),
        ], [4, 1], [CONSUMER_REGS, LOADER_REGS])


# --------------------------------------------------------------------------- host side


def smem_bytes(config, elt: int = 2, epilogue_split: int | None = None) -> int:
    """Shared memory a config's program takes: the ring, the two consumers' output tiles, the barriers."""
    BM, BN, BK, _, stages, _ = tuple(config)[:6]
    split = epilogue_split or (config[6] if len(config) > 6 else EPILOGUE_SPLIT)
    return elt * (stages * (BM * BK + BK * BN) + 2 * BM * BN // split) + 8 * (2 * stages + 2) + 1024  # + alignment


def _why_not(a, b, out, bias, residual) -> str | None:
    """Why this kernel cannot take these tensors (None: it can)."""
    for name, t in (("a", a), ("b", b), ("out", out)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2:
            return f"{name} must be a 2-D tensor"
    if a.dtype not in _DTYPES or b.dtype != a.dtype or out.dtype != a.dtype:
        return f"a, b and out must share a 16-bit dtype (bf16 or fp16), got {a.dtype}, {b.dtype}, {out.dtype}"
    M, K = a.shape
    if b.shape[0] != K or tuple(out.shape) != (M, b.shape[1]):
        return f"shapes do not chain: a {tuple(a.shape)} @ b {tuple(b.shape)} -> out {tuple(out.shape)}"
    if M == 0 or b.shape[1] == 0 or K == 0:
        return "empty problem (M, N or K is 0)"
    if not all(t.is_cuda and t.device == a.device for t in (b, out)):
        return "a, b and out must be CUDA tensors on one device"
    if not _gemm_common._tma_ok(a):
        return "a breaks TMA's rules (unit column stride, 16-byte row stride and base address)"
    if not (_gemm_common._tma_ok(b) or _gemm_common._tma_ok(b.T)):
        return "b breaks TMA's rules row-major and as the transpose of an (N, K) tensor"
    if not _gemm_common._tma_ok(out):
        return "out breaks TMA's rules"
    N = b.shape[1]
    for name, t, shape in (("bias", bias, (N,)), ("residual", residual, (M, N))):
        if t is None:
            continue
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != shape or t.dtype != a.dtype or t.device != a.device:
            return f"{name} must be a {shape} tensor of a's dtype on a's device"
    if bias is not None and bias.stride(0) != 1:
        return "bias must have a unit stride"
    return None


def fits(a, b, out, bias=None, residual=None) -> bool:
    """Whether ``launch`` takes these tensors: 16-bit, TMA's 16-byte rules on a, b (or b's transpose) and out."""
    return _why_not(a, b, out, bias, residual) is None


def _descriptors(a, b, out, BM, BN, BK, split):
    M, K = a.shape
    N = b.shape[1]
    layout = lambda block: smem_layout(block, a.dtype)  # noqa: E731
    a_desc = TensorDescriptor(a, [M, K], [a.stride(0), 1], [BM, BK], layout([BM, BK]))
    b_kmajor = not _gemm_common._tma_ok(b)
    if b_kmajor:
        bt = b.T
        b_desc = TensorDescriptor(bt, [N, K], [bt.stride(0), 1], [BN, BK], layout([BN, BK]))
    else:
        b_desc = TensorDescriptor(b, [K, N], [b.stride(0), 1], [BK, BN], layout([BK, BN]))
    c_block = [BM, BN // split]
    c_desc = TensorDescriptor(out, [M, N], [out.stride(0), 1], c_block, layout(c_block))
    return a_desc, b_desc, c_desc, b_kmajor


def launch(a, b, out, bias, residual, activation_code, gelu_degree=None, config=None, *, epilogue_split=None,
           consumer_regs=None, loader_regs=None, return_compiled=False):
    """``out = act(a @ b + bias) + residual`` by the warp-specialised kernel.

    ``activation_code``: ``gemm_epilogue``'s kernel codes (0 none, 1 relu, 2 exact GELU, 3 tanh GELU, 4 / 5 the
    tanh / exact GELU in PTX fast-math; 2 and 3 are mapped to 5 and 4 where ``_gemm_common.fast_activation``
    maps them). ``config``: (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, STAGES, programs an SM), default
    ``DEFAULT_CONFIG``. Raises ValueError on tensors it cannot take (``fits``) or a config whose shared memory
    exceeds an SM's. ``epilogue_split``, ``consumer_regs`` and ``loader_regs`` override the module's
    constants (for A/B timing); ``return_compiled`` returns (out, the compiled kernel) instead of out.
    """
    if gluon is None:
        raise RuntimeError("this Triton has no Gluon with Hopper ops")
    why = _why_not(a, b, out, bias, residual)
    if why:
        raise ValueError(f"_gemm_ws.launch: {why}")
    config = tuple(config or DEFAULT_CONFIG)
    BM, BN, BK, GROUP_M, stages, per_sm = config[:6]
    split = epilogue_split or (config[6] if len(config) > 6 else EPILOGUE_SPLIT)
    if split not in (1, 2) or BN % (8 * split) or BM not in (64, 128) or BN > 256:
        raise ValueError(f"_gemm_ws.launch: unsupported tile {BM}x{BN} / epilogue split {split}")
    # a consumer's 128 threads hold its fp32 accumulator: 128 registers a thread at 128x128, and the epilogue needs
    # room beside it (sm_90 SASS at 240 registers: 128x256 spills ~1.6 KB a thread, 128x128 stored whole 56 bytes)
    if BM * BN > 128 * 128 or (BM * BN == 128 * 128 and split == 1):
        raise ValueError(f"_gemm_ws.launch: a {BM}x{BN} tile (epilogue split {split}) spills a consumer's registers; "
                         "at most 128x128 elements, stored in two halves at that size")
    if per_sm != 1:
        raise ValueError(f"_gemm_ws.launch: {per_sm} programs an SM; one program's 12 warps at 168 registers fill an"
                         " SM's register file")
    need = smem_bytes((BM, BN, BK, GROUP_M, stages, per_sm), a.element_size(), split)
    if need > SMEM_PER_BLOCK:
        raise ValueError(f"_gemm_ws.launch: config {config} takes {need} bytes of shared memory, more than "
                         f"{SMEM_PER_BLOCK}")
    degree = _gemm_common.GELU_DEGREE if gelu_degree is None else gelu_degree
    if degree not in (5, 7, 9):
        raise ValueError(f"GELU fit of degree {degree}: 5, 7 or 9")
    M, K = a.shape
    N = b.shape[1]
    a_desc, b_desc, c_desc, b_kmajor = _descriptors(a, b, out, BM, BN, BK, split)
    tiles = cdiv(M, BM) * cdiv(N, BN)
    programs = per_sm * sm_count(a.device)
    rs = residual.stride() if residual is not None else (0, 0)
    compiled = launch_kernel(_gemm_ws_kernel, (min(programs, tiles),),
        a_desc, b_desc, c_desc, bias if bias is not None else out, residual if residual is not None else out,
        M, N, K, rs[0], rs[1],
        BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK, GROUP_M=GROUP_M, STAGES=stages, NUM_PROGRAMS=programs,
        B_KMAJOR=b_kmajor, EPILOGUE_SPLIT=split,
        HAS_BIAS=bias is not None, ACTIVATION=_gemm_common.fast_activation(activation_code),
        HAS_RESIDUAL=residual is not None, GELU_DEGREE=degree,
        CONSUMER_REGS=consumer_regs or CONSUMER_REGS, LOADER_REGS=loader_regs or LOADER_REGS,
        num_warps=4,
    )
    return (out, compiled) if return_compiled else out

