"""Attention forward on Hopper with warp specialisation (FlashAttention-3's structure), in Gluon.

``softmax(q @ k^T * scale [+ causal mask]) @ v`` as ``attention.fused`` computes it, for 16-bit tensors on sm_90
(H100 / H200) only. In ``attention._attention_fwd_kernel`` the warps that issue a block's dots also wait for its
loads and run its softmax, so the tensor cores idle meanwhile. Here a program takes ``consumers * BLOCK_M`` query rows
of one (batch, head) and has a partition a consumer and the loader's (``gl.warp_specialize``):

* a loader (1 warp, few registers) that issues every TMA load: the program's q once, then k and v blocks into a ring
  of ``stages`` stages, k and v on separate barriers (the scores need k only);
* two or three consumers (one warpgroup each, ``BLOCK_M`` rows each), all walking the same k/v blocks: wgmma
  ``S = q k^T`` from shared memory, the online softmax in registers, wgmma ``O += P v`` with P from registers, ``S`` of
  the next block issued before ``O += P v`` of this one so that the softmax runs under a dot. A stage is free when
  every consumer arrived on its ``empty`` barrier. While one consumer runs its softmax, the others' dots keep the
  tensor cores busy.

The descriptors are (B, H, N, D) with blocks (1, 1, rows, D), as ``attention``'s TMA plan has them: rows past N load
as zeros (masked as keys) and are never stored, so ragged N and any 16-byte-aligned strides need no mask a thread.
Causal programs stop at their diagonal and are launched heaviest first. Where its resources fit (``walks``: two
consumers whose registers hold the walk's counters, q's tiles in two slots beside the ring: d 64 on sm_90) one program
an SM walks tiles instead (``_attention_walk_kernel``): the ring runs on across tiles, and the next tile's q loads into
the other slot while this tile's last blocks and epilogue run, which a program that takes one tile pays unhidden (its
prologue: q and the ring's first loads). The register split is ``_gemm_ws``'s
(``setmaxnreg``): the warps launch sharing the register file of the SM (one program an SM: ``regs``), the loader keeps
24 and the consumers take the rest: two consumers' 12 warps launch at 168 and their consumers take 240.

Like ``_gemm_ws`` every Gluon import is guarded, and ``available()`` is False where it failed, under the
interpreter, and off a GPU of compute capability 9.x. docs/kernels.md, "attention".
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from . import _device
from ._common import MAX_GRID_Y, cdiv, disable_after_compile_failure, interpreting, sm90, tma_ok
from ._hopper import (TensorDescriptor, fence_async_shared, gl, gluon, mbarrier, smem_layout, tma,
                      tma_load as _tma_load, tma_store as _tma_store, warpgroup_mma, warpgroup_mma_wait)
from ._launch import launch as launch_kernel


BLOCK_M = 64  # a consumer's query rows: one warpgroup's wgmma is 64 rows high
BLOCK_N = 128  # key/value rows a stage: FlashAttention-3's Hopper forward tile at head_dim 64 and 128
# k/v stages: a consumer holds block j's stage until O += P_j v_j, issued after S_(j+1) (``_consumer``), so two are
# in use while the next loads (head_dim 128: 230 KB of an sm_90 block's 227 KiB)
STAGES = 3
LOADER_REGS = 24  # the loader warpgroup's registers a thread (setmaxnreg); the consumers share what is left (regs)
_BARRIER_BYTES = 1024  # mbarriers and alignment beside the tiles (sm_90 compiles: 256-304 bytes)
_OTHER_REGS = 32  # a consumer's registers beside its tiles: row statistics, offsets, addresses (consumer_regs)
_WALK_REGS = 8  # a walking consumer's more: its tile and ring counters across tiles (three consumers' 160, all their
# tiles need, spilled in a walk)
# A consumer more's throughput where neither pads a row (H100, d 64, three consumers over two: 1.05-1.14x), which
# ``plan`` weighs against the rows a taller tile pads past N
CONSUMER_GAIN = 1.05


class WsPlan(NamedTuple):
    """A launch of this kernel, one program an SM: key/value rows a stage, stages in the ring, consumer warpgroups a
    program (each ``BLOCK_M`` query rows: 2 or 3), and whether a program walks tiles (``walk``: the persistent kernel,
    the next tile's q loaded into a second slot under this tile's last blocks and epilogue) or takes one. Two
    programs an SM lost (docs/kernels.md, "Variants removed")."""

    block_n: int
    stages: int
    consumers: int = 2
    walk: bool = False


def warps(plan: WsPlan) -> int:
    """A program's warps: a warpgroup a consumer, and the loader's (one warp, a warpgroup's registers)."""
    return 4 * plan.consumers + 4


def smem_bytes(head_dim: int, elt: int, plan: WsPlan) -> int:
    """Shared memory a program takes: the consumers' q tiles (each reused for its output; two slots of them in a
    walk), the k/v ring."""
    q_rows = plan.consumers * BLOCK_M * (2 if plan.walk else 1)
    return elt * head_dim * (q_rows + 2 * plan.stages * plan.block_n) + _BARRIER_BYTES


def regs(plan: WsPlan, device: _device.Device) -> tuple[int, int]:
    """(registers a thread at launch, a consumer's after ``setmaxnreg``) for ``plan``'s program: the register file
    split between its threads (in steps of 8), the loader's LOADER_REGS off it, the rest the consumers'. Two
    consumers on sm_90: (168, 240)."""
    w = warps(plan)
    launch_regs = device.regs_per_sm // (w * 32) // 8 * 8
    return launch_regs, (launch_regs * w - 4 * LOADER_REGS) // (4 * plan.consumers) // 8 * 8


def fits_device(head_dim: int, elt: int, plan: WsPlan, device: _device.Device) -> bool:
    """Whether ``plan``'s program fits ``device``'s shared memory a block. Its registers always fit (``regs``)."""
    return smem_bytes(head_dim, elt, plan) <= device.smem_per_block


def consumer_regs(head_dim: int, block_n: int) -> int:
    """Registers a consumer thread needs: its float32 O (BLOCK_M x head_dim) and S (BLOCK_M x block_n) over a
    warpgroup's 128 threads, P as 16-bit pairs, and ``_OTHER_REGS``. sm_90 compiles agree: d 64 with 128-key stages
    needs 160 (three consumers' 160 each: no spill, Triton 3.6), d 128 192 (at 160 it spills)."""
    return (BLOCK_M * head_dim + BLOCK_M * block_n + BLOCK_M * block_n // 2) // 128 + _OTHER_REGS


def pairs(seq_len: int, rows: int, causal: bool) -> int:
    """(query, key) pairs a launch of ``rows``-row tiles computes at ``seq_len``: every tile's rows, those past N
    included, against the keys its last row sees (N without the mask, to the tile's diagonal with it)."""
    tiles = cdiv(seq_len, rows)
    if not causal:
        return tiles * rows * seq_len
    return rows * sum(min((t + 1) * rows, seq_len) for t in range(tiles))


def plan(head_dim: int, elt: int, device: _device.Device, seq_len: int | None = None,
         causal: bool = False) -> WsPlan | None:
    """The launch for this problem on this device: ``BLOCK_N`` rows a stage, ``STAGES`` stages, one program an SM of
    three or two consumers, of those whose registers (``regs``) hold what a consumer needs (``consumer_regs``) and
    whose ring fits its shared memory: the one of least modelled time, the (query, key) pairs its tiles compute
    (``pairs``: a taller tile pads more rows past N) over its throughput, ``CONSUMER_GAIN`` a consumer more; walking
    tiles where it may (``walks``). None where none fits (``attention`` then runs its Triton kernel). ``seq_len``
    None: a sequence long enough that no tile pads (the most consumers that fit). docs/kernels.md, "attention"."""
    need = consumer_regs(head_dim, BLOCK_N)
    fitting = [ring for ring in (WsPlan(BLOCK_N, STAGES, consumers) for consumers in (3, 2))
               if regs(ring, device)[1] >= need and fits_device(head_dim, elt, ring, device)]
    if not fitting:
        return None
    if seq_len is None:
        best = fitting[0]
    else:
        def modelled_time(ring: WsPlan) -> float:
            return pairs(max(1, seq_len), ring.consumers * BLOCK_M, causal) / CONSUMER_GAIN ** ring.consumers

        best = min(fitting, key=modelled_time)  # a tie keeps the most consumers (the first)
    walk = best._replace(walk=True)
    return walk if walks(head_dim, elt, walk, device) else best


def walks(head_dim: int, elt: int, plan: WsPlan, device: _device.Device) -> bool:
    """Whether ``plan`` may walk: its consumers' registers hold their tiles and the walk's counters (``_WALK_REGS``),
    and its ring and q's two slots fit the shared memory a block. Where both fit the walk never lost to one tile a
    program (H100, d 64, two consumers: docs/kernels.md, "attention")."""
    plan = plan._replace(walk=True)
    return (regs(plan, device)[1] >= consumer_regs(head_dim, plan.block_n) + _WALK_REGS
            and fits_device(head_dim, elt, plan, device))


def launch_metadata(grid, kernel, args):
    """What profilers read off an attention launch (this kernel's and ``attention``'s Triton ones): a name with the
    problem, and its matmul flops. No ``"bytes"``: pytest-fusioncheck then counts the launch's tensors (q, k, v and
    the output, or the tensors their descriptors describe), which is the compulsory traffic, independently of
    ``attention.budget``."""
    n, d = args["seq_len"], args["HEAD_DIM"]
    bh = args["bh_total"] if "bh_total" in args else grid[1]  # the walk's grid is one program an SM
    pairs = n * (n + 1) // 2 if args["CAUSAL"] else n * n  # (query, key) pairs computed
    causal = ", causal" if args["CAUSAL"] else ""
    return {"name": f"{kernel.name} [BH={bh}, N={n}, D={d}{causal}]", "flops": 4 * bh * pairs * d}


_capable = sm90  # compute capability 9.x (tests replace it)
_DISABLED: list[str] = []  # why this kernel stopped being offered in this process (disable())


def available(device_index: int | None = None) -> bool:
    """Whether this kernel runs here: as ``_gemm_ws.available`` (Gluon's Hopper ops, no interpreter, sm_90, no
    compile failure so far: ``disable``)."""
    if gluon is None or _DISABLED or interpreting() or not torch.cuda.is_available():
        return False
    return _capable(device_index)


def disable(error: Exception) -> None:
    """After the kernel failed to compile (a Triton whose Gluon moved on): warn once; the Triton kernels run."""
    disable_after_compile_failure(_DISABLED, "the warp-specialised attention does not compile",
                                  "attention's Triton kernels run instead", error)


def _tensors_ok(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor) -> bool:
    """One 16-bit dtype and shape, head_dim 64 or 128, CUDA, every tensor one TMA descriptor can describe, batch x
    heads within the grid."""
    if q.dtype not in (torch.float16, torch.bfloat16) or q.shape[-1] not in (64, 128):
        return False
    if not all(t.dtype == q.dtype and t.shape == q.shape and t.is_cuda for t in (q, k, v, out)):
        return False
    return q.shape[0] * q.shape[1] <= MAX_GRID_Y and all(tma_ok(t) for t in (q, k, v, out))


def fits(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor) -> bool:
    """Whether ``launch`` takes these tensors: ``_tensors_ok``, and a plan that the device holds (``plan``)."""
    return _tensors_ok(q, k, v, out) and plan(q.shape[-1], q.element_size(), _device.of(q.device)) is not None


if gluon is not None:

    _BM = gl.constexpr(BLOCK_M)  # what the kernels read of BLOCK_M (a global they may read must be a constexpr)

    @gluon.constexpr_function
    def _mma_layout(n):
        # one warpgroup's wgmma accumulator: 4 warps down M, one instruction n wide, K 16 (16-bit)
        return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, n, 16])

    @gluon.jit
    def _tile(n_heads, CAUSAL: gl.constexpr, CONSUMERS: gl.constexpr):
        """The program's first query row, batch and head: causal programs heaviest first."""
        pid_m = gl.program_id(0)
        if CAUSAL:
            pid_m = gl.num_programs(0) - 1 - pid_m
        return pid_m * CONSUMERS * _BM, gl.program_id(1) // n_heads, gl.program_id(1) % n_heads

    @gluon.jit
    def _tile_at(t, n_m, bh_total, n_heads, sect, CAUSAL: gl.constexpr):
        """A walk's tile ``t``: (query block, batch, head). Tiles go in sections of ``sect`` heads (their k/v fit half
        the L2), a section's heads a query block at a time (causal: the blocks reversed, heaviest first)."""
        per_sect = sect * n_m
        base = t // per_sect * sect
        here = gl.minimum(sect, bh_total - base)
        r = t % per_sect
        m = r // here
        if CAUSAL:
            m = n_m - 1 - m
        return m, (base + r % here) // n_heads, (base + r % here) % n_heads

    @gluon.jit
    def _blocks(first_row, rows, seq_len, BN: gl.constexpr, CAUSAL: gl.constexpr):
        """Key/value blocks that rows [first_row, first_row + rows) see: to the diagonal when causal, never past N."""
        if CAUSAL:
            return gl.minimum(gl.cdiv(first_row + rows, BN), gl.cdiv(seq_len, BN))
        return gl.cdiv(seq_len, BN)

    @gluon.jit
    def _load_tile(q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, q_ready, k_ready, v_ready, empty, b, h, start_m,
                   q_first, g, seq_len, BN: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                   CONSUMERS: gl.constexpr):
        """A tile's loads: its consumers' q into ``q_bufs[q_first:]`` on ``q_ready``, then its k/v blocks into the
        ring, ring blocks ``g`` on (those a program loaded before: a walk's). Returns the ring blocks it loaded."""
        mbarrier.expect(q_ready, CONSUMERS * q_desc.block_type.nbytes)
        for c in gl.static_range(CONSUMERS):
            _tma_load(q_desc, [b, h, start_m + c * _BM, 0], q_ready, q_bufs.index(q_first + c))
        n_blocks = _blocks(start_m, CONSUMERS * _BM, seq_len, BN, CAUSAL)
        for j in range(n_blocks):
            gj = g + j
            s = gj % STAGES
            mbarrier.wait(empty.index(s), ((gj // STAGES) & 1) ^ 1)  # the first pass waits on parity 1: at once
            mbarrier.expect(k_ready.index(s), k_desc.block_type.nbytes)
            _tma_load(k_desc, [b, h, j * BN, 0], k_ready.index(s), k_bufs.index(s))
            mbarrier.expect(v_ready.index(s), v_desc.block_type.nbytes)
            _tma_load(v_desc, [b, h, j * BN, 0], v_ready.index(s), v_bufs.index(s))
        return n_blocks

    @gluon.jit
    def _loader(q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, q_ready, k_ready, v_ready, empty, n_heads, seq_len,
                BN: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr, CONSUMERS: gl.constexpr):
        start_m, b, h = _tile(n_heads, CAUSAL, CONSUMERS)
        _load_tile(q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, q_ready, k_ready, v_ready, empty, b, h, start_m, 0,
                   0, seq_len, BN, STAGES, CAUSAL, CONSUMERS)

    @gluon.jit
    def _softmax_step(qk, m_i, l_i, offs_m, j, my_start, seq_len, qk_scale, BN: gl.constexpr, CAUSAL: gl.constexpr):
        """The online softmax over key block j's raw scores: (p, alpha, m_new, l_new), alpha rescaling what was
        summed under the old max (``attention._online_softmax``'s step)."""
        layout: gl.constexpr = qk.type.layout
        if (CAUSAL and j * BN + BN > my_start) or j * BN + BN > seq_len:  # the diagonal or past N: mask
            offs_n = j * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, layout))
            keep = (offs_n < seq_len)[None, :]
            if CAUSAL:
                keep = keep & (offs_m[:, None] >= offs_n[None, :])
            qk = gl.where(keep, qk * qk_scale, -1.0e30)
            m_new = gl.maximum(m_i, gl.max(qk, 1))
            p = gl.exp2(qk - m_new[:, None])
        else:  # qk_scale > 0 (launch refuses others): the scaled max is max(qk) x scale, each argument one FMA
            m_new = gl.maximum(m_i, gl.max(qk, 1) * qk_scale)
            p = gl.exp2(qk * qk_scale - m_new[:, None])
        alpha = gl.exp2(m_i - m_new)
        return p, alpha, m_new, l_i * alpha + gl.sum(p, 1)

    @gluon.jit
    def _scores(q, k_bufs, s, BN: gl.constexpr, HEAD_DIM: gl.constexpr):
        """Issue S = q k^T on stage s's k (async: the caller waits)."""
        layout: gl.constexpr = _mma_layout(BN)
        k_t = k_bufs.index(s).reshape([BN, HEAD_DIM]).permute((1, 0))
        return warpgroup_mma(q, k_t, gl.zeros((_BM, BN), gl.float32, layout), use_acc=False, is_async=True)

    @gluon.jit
    def _attend(q_tile, k_bufs, v_bufs, k_ready, v_ready, empty, o_desc, b, h, start_m, g, seq_len, qk_scale,
                BN: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                CONSUMERS: gl.constexpr, CONSUMER: gl.constexpr):
        """One warpgroup's _BM query rows of the tile at ``start_m`` (its q loaded in ``q_tile``, its output stored
        through it), ring blocks ``g`` on, FlashAttention-3's intra-warpgroup overlap: S_j = q k_j^T is issued, then
        O += P_(j-1) v_(j-1), and S_j's softmax runs while that dot does (in order, a block at a time, it lost:
        docs/kernels.md, "attention"). Returns the ring blocks of the tile (every one released)."""
        my_start = start_m + CONSUMER * _BM
        o_layout: gl.constexpr = _mma_layout(HEAD_DIM)
        row_layout: gl.constexpr = gl.SliceLayout(1, _mma_layout(BN))
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        dtype: gl.constexpr = o_desc.dtype
        m_i = gl.full([_BM], -1.0e30, gl.float32, layout=row_layout)
        l_i = gl.zeros([_BM], gl.float32, layout=row_layout)
        acc = gl.zeros((_BM, HEAD_DIM), gl.float32, o_layout)
        offs_m = my_start + gl.arange(0, _BM, layout=row_layout)
        q = q_tile.reshape([_BM, HEAD_DIM])
        n_blocks = _blocks(start_m, CONSUMERS * _BM, seq_len, BN, CAUSAL)  # the loader's: every stage is released
        my_blocks = _blocks(my_start, _BM, seq_len, BN, CAUSAL)  # >= 1: every row sees key 0
        mbarrier.wait(k_ready.index(g % STAGES), (g // STAGES) & 1)
        qk = warpgroup_mma_wait(0, deps=(_scores(q, k_bufs, g % STAGES, BN, HEAD_DIM),))
        p, alpha, m_i, l_i = _softmax_step(qk, m_i, l_i, offs_m, 0, my_start, seq_len, qk_scale, BN, CAUSAL)
        p16 = gl.convert_layout(p.to(dtype), p_layout)
        for j in range(1, my_blocks):
            s = (g + j) % STAGES
            prev = (g + j - 1) % STAGES
            mbarrier.wait(k_ready.index(s), ((g + j) // STAGES) & 1)
            qk = _scores(q, k_bufs, s, BN, HEAD_DIM)
            mbarrier.wait(v_ready.index(prev), ((g + j - 1) // STAGES) & 1)
            acc = warpgroup_mma(p16, v_bufs.index(prev).reshape([BN, HEAD_DIM]), acc, is_async=True)
            qk = warpgroup_mma_wait(1, deps=(qk,))  # S_j done (issued first); O's dot may still run
            p, alpha, m_i, l_i = _softmax_step(qk, m_i, l_i, offs_m, j, my_start, seq_len, qk_scale, BN, CAUSAL)
            p16 = gl.convert_layout(p.to(dtype), p_layout)
            acc = warpgroup_mma_wait(0, deps=(acc,))
            mbarrier.arrive(empty.index(prev))
            acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
        last = g + my_blocks - 1
        mbarrier.wait(v_ready.index(last % STAGES), (last // STAGES) & 1)
        acc = warpgroup_mma(p16, v_bufs.index(last % STAGES).reshape([BN, HEAD_DIM]), acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=(acc,))
        mbarrier.arrive(empty.index(last % STAGES))
        for j in range(g + my_blocks, g + n_blocks):  # blocks only the other consumers' rows see: released as they come
            mbarrier.wait(k_ready.index(j % STAGES), (j // STAGES) & 1)
            mbarrier.arrive(empty.index(j % STAGES))
        out = acc / gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))[:, None]
        q.store(out.to(dtype))  # q's tile is free: every wgmma that read it has completed
        fence_async_shared()
        _tma_store(o_desc, [b, h, my_start, 0], q_tile)
        tma.store_wait(0)
        return n_blocks

    @gluon.jit
    def _consumer(q_bufs, k_bufs, v_bufs, q_ready, k_ready, v_ready, empty, o_desc, n_heads, seq_len, qk_scale,
                  BN: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                  CONSUMERS: gl.constexpr, CONSUMER: gl.constexpr):
        start_m, b, h = _tile(n_heads, CAUSAL, CONSUMERS)
        mbarrier.wait(q_ready, 0)
        _attend(q_bufs.index(CONSUMER), k_bufs, v_bufs, k_ready, v_ready, empty, o_desc, b, h, start_m, 0, seq_len,
                qk_scale, BN, HEAD_DIM, STAGES, CAUSAL, CONSUMERS, CONSUMER)

    @gluon.jit
    def _walk_loader(q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, q_ready, q_free, k_ready, v_ready, empty,
                     n_heads, seq_len, n_m, bh_total, sect, n_tiles, BN: gl.constexpr, STAGES: gl.constexpr,
                     CAUSAL: gl.constexpr, CONSUMERS: gl.constexpr):
        """A walk's loads: each tile's q into the slot its tile before last used (once its consumers stored their
        output through it), then its blocks on in the ring."""
        g = 0
        it = 0
        for t in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
            m, b, h = _tile_at(t, n_m, bh_total, n_heads, sect, CAUSAL)
            qs = it % 2
            mbarrier.wait(q_free.index(qs), ((it // 2) & 1) ^ 1)
            g += _load_tile(q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, q_ready.index(qs), k_ready, v_ready, empty,
                            b, h, m * CONSUMERS * _BM, qs * CONSUMERS, g, seq_len, BN, STAGES, CAUSAL, CONSUMERS)
            it += 1

    @gluon.jit
    def _walk_consumer(q_bufs, k_bufs, v_bufs, q_ready, q_free, k_ready, v_ready, empty, o_desc, n_heads, seq_len,
                       qk_scale, n_m, bh_total, sect, n_tiles, BN: gl.constexpr, HEAD_DIM: gl.constexpr,
                       STAGES: gl.constexpr, CAUSAL: gl.constexpr, CONSUMERS: gl.constexpr, CONSUMER: gl.constexpr):
        g = 0
        it = 0
        for t in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
            m, b, h = _tile_at(t, n_m, bh_total, n_heads, sect, CAUSAL)
            qs = it % 2
            mbarrier.wait(q_ready.index(qs), (it // 2) & 1)
            g += _attend(q_bufs.index(qs * CONSUMERS + CONSUMER), k_bufs, v_bufs, k_ready, v_ready, empty, o_desc, b, h,
                         m * CONSUMERS * _BM, g, seq_len, qk_scale, BN, HEAD_DIM, STAGES, CAUSAL, CONSUMERS, CONSUMER)
            mbarrier.arrive(q_free.index(qs))  # this consumer's output is stored: the slot may take a tile's q again
            it += 1

    @gluon.jit(launch_metadata=launch_metadata)
    def _attention_walk_kernel(q_desc, k_desc, v_desc, o_desc, n_heads, seq_len, qk_scale, n_m, bh_total, sect,
                               n_tiles, BN: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr,
                               CAUSAL: gl.constexpr, CONSUMERS: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                               LOADER_REGS: gl.constexpr):
        """Grid: one program an SM (at most the tiles), walking tiles ``program_id``, + programs, ... (``_tile_at``);
        q in two slots of CONSUMERS tiles."""
        gl.static_assert(CONSUMERS == 2, "a walk's consumers are two (walks)")
        dtype: gl.constexpr = q_desc.dtype
        q_bufs = gl.allocate_shared_memory(dtype, [2 * CONSUMERS] + q_desc.block_type.shape, q_desc.layout)
        k_bufs = gl.allocate_shared_memory(dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
        v_bufs = gl.allocate_shared_memory(dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
        q_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        q_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(2):
            mbarrier.init(q_ready.index(i), count=1)
            mbarrier.init(q_free.index(i), count=CONSUMERS)
        for i in gl.static_range(STAGES):
            mbarrier.init(k_ready.index(i), count=1)
            mbarrier.init(v_ready.index(i), count=1)
            mbarrier.init(empty.index(i), count=CONSUMERS)
        fence_async_shared()
        gl.warp_specialize([
            (_walk_consumer, (q_bufs, k_bufs, v_bufs, q_ready, q_free, k_ready, v_ready, empty, o_desc, n_heads,
                              seq_len, qk_scale, n_m, bh_total, sect, n_tiles, BN, HEAD_DIM, STAGES, CAUSAL,
                              CONSUMERS, 0)),
            (_walk_consumer, (q_bufs, k_bufs, v_bufs, q_ready, q_free, k_ready, v_ready, empty, o_desc, n_heads,
                              seq_len, qk_scale, n_m, bh_total, sect, n_tiles, BN, HEAD_DIM, STAGES, CAUSAL,
                              CONSUMERS, 1)),
            (_walk_loader, (q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, q_ready, q_free, k_ready, v_ready, empty,
                            n_heads, seq_len, n_m, bh_total, sect, n_tiles, BN, STAGES, CAUSAL, CONSUMERS)),
        ], [4, 1], [CONSUMER_REGS, LOADER_REGS])

    @gluon.jit(launch_metadata=launch_metadata)
    def _attention_ws_kernel(q_desc, k_desc, v_desc, o_desc, n_heads, seq_len, qk_scale,
                             BN: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                             CONSUMERS: gl.constexpr, CONSUMER_REGS: gl.constexpr, LOADER_REGS: gl.constexpr):
        """Grid (query blocks of CONSUMERS * _BM rows, batch x heads)."""
        dtype: gl.constexpr = q_desc.dtype
        q_bufs = gl.allocate_shared_memory(dtype, [CONSUMERS] + q_desc.block_type.shape, q_desc.layout)
        k_bufs = gl.allocate_shared_memory(dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
        v_bufs = gl.allocate_shared_memory(dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
        q_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(q_ready, count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(k_ready.index(i), count=1)
            mbarrier.init(v_ready.index(i), count=1)
            mbarrier.init(empty.index(i), count=CONSUMERS)  # every consumer releases a stage
        fence_async_shared()
        # the argument lists written out: a constexpr in a tuple built here is a plain int, a function not a value
        if CONSUMERS == 2:
            gl.warp_specialize([
                (_consumer, (q_bufs, k_bufs, v_bufs, q_ready, k_ready, v_ready, empty, o_desc, n_heads, seq_len,
                             qk_scale, BN, HEAD_DIM, STAGES, CAUSAL, CONSUMERS, 0)),
                (_consumer, (q_bufs, k_bufs, v_bufs, q_ready, k_ready, v_ready, empty, o_desc, n_heads, seq_len,
                             qk_scale, BN, HEAD_DIM, STAGES, CAUSAL, CONSUMERS, 1)),
                (_loader, (q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, q_ready, k_ready, v_ready, empty, n_heads,
                           seq_len, BN, STAGES, CAUSAL, CONSUMERS)),
            ], [4, 1], [CONSUMER_REGS, LOADER_REGS])
        else:
            gl.static_assert(CONSUMERS == 3, "two or three consumer warpgroups")
            gl.warp_specialize([
                (_consumer, (q_bufs, k_bufs, v_bufs, q_ready, k_ready, v_ready, empty, o_desc, n_heads, seq_len,
                             qk_scale, BN, HEAD_DIM, STAGES, CAUSAL, CONSUMERS, 0)),
                (_consumer, (q_bufs, k_bufs, v_bufs, q_ready, k_ready, v_ready, empty, o_desc, n_heads, seq_len,
                             qk_scale, BN, HEAD_DIM, STAGES, CAUSAL, CONSUMERS, 1)),
                (_consumer, (q_bufs, k_bufs, v_bufs, q_ready, k_ready, v_ready, empty, o_desc, n_heads, seq_len,
                             qk_scale, BN, HEAD_DIM, STAGES, CAUSAL, CONSUMERS, 2)),
                (_loader, (q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, q_ready, k_ready, v_ready, empty, n_heads,
                           seq_len, BN, STAGES, CAUSAL, CONSUMERS)),
            ], [4, 4, 1], [CONSUMER_REGS, CONSUMER_REGS, LOADER_REGS])


def descriptors(q, k, v, out, block_n):
    """Gluon TMA descriptors of (B, H, N, D) tensors: q's and the output's blocks (1, 1, BLOCK_M, D), k's and v's
    (1, 1, block_n, D)."""
    head_dim = q.shape[-1]

    def one(t, rows):
        block = [1, 1, rows, head_dim]
        return TensorDescriptor(t, list(t.shape), list(t.stride()), block, smem_layout(block, q.dtype))

    return one(q, BLOCK_M), one(k, block_n), one(v, block_n), one(out, BLOCK_M)


def launch(q, k, v, out, causal: bool, qk_scale: float, ws_plan: WsPlan | None = None):
    """``out = attention(q, k, v)`` by the warp-specialised kernel; ``qk_scale`` is the softmax scale x log2(e),
    positive. ``ws_plan`` defaults to ``plan`` for q's device. Raises ValueError on tensors it cannot take
    (``fits``), a plan whose shared memory exceeds a block's or a block_n wgmma cannot take."""
    if gluon is None:
        raise RuntimeError("this Triton has no Gluon with Hopper ops")
    if not _tensors_ok(q, k, v, out):
        raise ValueError("_attention_ws.launch: q, k, v and out must be one shape and 16-bit dtype on CUDA, head_dim "
                         "64 or 128, each one TMA can describe (unit last stride, 16-byte strides and base)")
    if not qk_scale > 0:
        raise ValueError(f"_attention_ws.launch: qk_scale must be positive, got {qk_scale}")
    batch, heads, seq_len, head_dim = q.shape
    device = _device.of(q.device)
    ws_plan = ws_plan or plan(head_dim, q.element_size(), device, seq_len, causal)
    if ws_plan is None or ws_plan.block_n not in (64, 128) or ws_plan.stages < 2 or ws_plan.consumers not in (2, 3):
        raise ValueError(f"_attention_ws.launch: plan {ws_plan}: block_n 64 or 128, at least two stages (a consumer "
                         "holds a block's stage while the next one loads), two or three consumers")
    if ws_plan.walk and (ws_plan.consumers != 2 or not walks(head_dim, q.element_size(), ws_plan, device)):
        raise ValueError(f"_attention_ws.launch: plan {ws_plan}: a walk takes two consumers whose registers hold "
                         "its counters, and q's two slots beside the ring")
    if not fits_device(head_dim, q.element_size(), ws_plan, device):
        raise ValueError(f"_attention_ws.launch: plan {ws_plan} takes {smem_bytes(head_dim, q.element_size(), ws_plan)}"
                         f" bytes of shared memory, more than {device.smem_per_block}")
    launch_regs, consumer_regs = regs(ws_plan, device)
    descs = descriptors(q, k, v, out, ws_plan.block_n)
    if ws_plan.walk:
        n_m, bh = cdiv(seq_len, ws_plan.consumers * BLOCK_M), batch * heads
        sect = max(1, min(bh, device.l2_bytes // 2 // (2 * seq_len * head_dim * q.element_size())))
        return launch_kernel(_attention_walk_kernel, (min(n_m * bh, device.sms),),
            *descs, heads, seq_len, qk_scale, n_m, bh, sect, n_m * bh,
            BN=ws_plan.block_n, HEAD_DIM=head_dim, STAGES=ws_plan.stages, CAUSAL=bool(causal),
            CONSUMERS=ws_plan.consumers, CONSUMER_REGS=consumer_regs, LOADER_REGS=LOADER_REGS, num_warps=4,
            maxnreg=launch_regs,
        )
    return launch_kernel(_attention_ws_kernel, (cdiv(seq_len, ws_plan.consumers * BLOCK_M), batch * heads),
        *descs, heads, seq_len, qk_scale,
        BN=ws_plan.block_n, HEAD_DIM=head_dim, STAGES=ws_plan.stages, CAUSAL=bool(causal),
        CONSUMERS=ws_plan.consumers, CONSUMER_REGS=consumer_regs, LOADER_REGS=LOADER_REGS, num_warps=4,
        maxnreg=launch_regs,
    )
