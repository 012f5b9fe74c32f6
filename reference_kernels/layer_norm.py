"""Fused layer norm over the last dimension: forward and backward, for any row width.

Forward reads ``x`` once and writes ``y`` once (plus float32 ``mean`` and ``rstd`` per row, kept for the backward).
Backward reads ``x`` and ``dy`` once, writes ``dx`` once and reduces ``dweight``/``dbias`` deterministically: each
program sums its rows into its own float32 share row, and a small kernel adds the shares in a fixed order, so two runs
give bitwise-identical gradients (no atomics).

Read top-down: the plan (``_Plan``, ``Tuning`` — the widths measured on one GPU and Triton, data in
``tuned/<arch>.json`` — and ``_layer_norm_settings``, with the rules that pick the Gluon plans of ``_layer_norm_held``),
then the launches, then the public functions (``forward``, ``backward``, ``fused``, ``unfused``, ``budget``). The
Triton kernels are ``_layer_norm_kernels``'. docs/kernels.md, "layer_norm: forward" and "layer_norm: backward", says
what each plan is, where it is picked and what it measured.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import torch

from pytest_fusioncheck.budget import Budget

from . import _layer_norm_held
from . import _device
from ._common import (as_rows, cdiv, check_tensor, float32_pair, interpreting, next_power_of_2, output_like, rows_cols,
                      warps_for)
from ._device import Device
from ._ragged import VECTOR_BYTES, Phased, launch_width, packed_width, phased, phased_rows, ragged_width, row_pieces
from ._split_walk import COUNTER_STRIDE_INTS, split_group, split_run
from ._launch import Calls, launch as launch_kernel
from ._layer_norm_kernels import (
    _FROM_STATS,
    _ONE_PASS,
    _ROWS,
    _STATS,
    _layer_norm_bwd_flat_kernel,
    _layer_norm_bwd_kernel,
    _layer_norm_bwd_lean_kernel,
    _layer_norm_bwd_phased_kernel,
    _layer_norm_dwdb_kernel,
    _layer_norm_fwd_kernel,
    _layer_norm_fwd_looped_kernel,
    _layer_norm_fwd_split_kernel,
    _layer_norm_fwd_walk_kernel,
)

# --------------------------------------------------------------------------- plan


class _Plan(NamedTuple):
    """How one layer-norm pass is launched; ``_layer_norm_settings`` makes it."""

    mode: str  # "rows"; forward "persistent", "split", "looped"; backward "one_pass", "two_pass"
    block_m: int
    block_n: int
    num_warps: int
    n_groups: int = 1  # backward: row groups, each summed into its own dweight/dbias share; forward "walk", "looped": programs
    variant: str = "measured"  # backward only: "measured" (_layer_norm_bwd_kernel) or "lean" (_layer_norm_bwd_lean_kernel)
    max_regs: int | None = None  # backward lean and phased, forward unaligned rows and walk: ptxas register cap (maxnreg), None for ptxas's choice
    group: int = 1  # forward "split": programs (slices) per row; "persistent" is "split" with 1
    per_sm: int = 0  # forward "persistent", "split", "looped" (0: a program a row): programs launched per SM
    prefetch: bool = False  # backward "rows" (measured kernel): the next row block's loads in flight meanwhile
    stages: int = 1  # backward "phased", forward "walk": pipelining depth of the row loop (rows in flight: stages - 1); "looped": of the chunk loops
    block_t: int = 0  # backward "phased", forward "walk": a second piece of the row, from block_n on (_ragged.row_pieces)
    block_u: int = 0  # forward "walk", backward "phased": a third piece, from block_n + block_t on
    tail: int = 0  # forward "walk", 16-bit unaligned rows: vectors read as words after the pieces (0: none)


# The heuristics, from the H200 sweeps (docs/kernels.md, "layer_norm: forward" / "backward").
# Forward: rows up to _MAX_ROW wide held whole, _ROWS_TILE elements per program for narrow
# rows, 32 per thread; wider rows by _WIDE_ROWS_PLAN. "auto": fp32 rows take "split" with each
# slice held in registers (32 elements a thread, 16 KiB slices at 65536: 73% of copy against 61%
# for "looped"); 16-bit rows keep "looped" (63%: "persistent", softmax's best plan there,
# measured 61%, the held splits 44-60%); "persistent" and "split" (the split walk: docs/kernels.md,
# "The split walk") can be named with ``wide=``.
_MAX_ROW = 16384
_ROWS_TILE = 2048
# fp32 forward rows of a multiple of 16 columns on one piece, from fwd_params_first_min_cols (None: none): weight and
# bias loaded before x, in flight with it, instead of after the row's reductions (Liger's order); only rows that fill
# _FWD_PARAMS_FIRST_LANE_USE of their block, on blocks wider than _FWD_PARAMS_FIRST_MAX_MASKED_BLOCK lanes
# _FWD_PARAMS_FIRST_WIDE_LANE_USE (``_params_first``). H200, % of copy, against after (docs/kernels.md, "fp32 aligned
# rows against Liger's shape"): 2048 92.4 -> 95.5, 3072 93 -> 96.5, 3584 93 -> 97.9, 3840 93 -> 99.7, 4096 92.6 ->
# 97.3, 7168 92.6 -> 96.4, 7680 92.7 -> 97.4, 8192 92.1 -> 96.7 (Liger 96-97); lost on blocks less filled (5120 93.6
# -> 83.8, 6144 93.3 -> 90.7; 2112 94 -> 87, 2240 94 -> 88, 2368 93.5 -> 90), level at 768-1536 and 2560, lost in
# 16-bit rows (bf16 1024 96.8 -> 91.7, 3072 90.8 -> 85).
_FWD_PARAMS_FIRST_LANE_USE = 0.7
_FWD_PARAMS_FIRST_MAX_MASKED_BLOCK = 4096
_FWD_PARAMS_FIRST_WIDE_LANE_USE = 0.875
# Forward rows held in shared memory by persistent Gluon programs (_layer_norm_held; docs/kernels.md, "Rows held in shared
# memory"), on CUDA GPUs with Gluon, for rows of N not a multiple of 16 (whose vectors Triton cannot prove aligned) from
# these widths (but the packed rows' widths, _packed_rows): 16-bit rows from 1025 since their statistics take one pass
# (_layer_norm_held.FWD_JOINT; H200, bf16 / fp16 against the walk: 2100 67 -> 69 / 71, 2200 58 -> 72 / 74, 2600 65 -> 80
# / 81 with it) and rows under 2100 take 2-warp programs (_layer_norm_held.fwd_shape: bf16 1025 60 -> 68, 2049 75 -> 79;
# the packed rows plan keeps 1300-1900, 88-94 against 57-76 held on 4 warps); fp32 4200 70 -> 76, 6500 63 -> 75,
# 7001 70 -> 78 (two programs an SM or more; 8191, one an SM, 86 -> 54; 4097 81 -> 74, 4113 77 -> 73). Aligned rows lost
# (10240 86 -> 79, 24000 79 -> 63). 16-bit rows under 1025 (2026-12-03, twice, the rows plan's scalar loads -> held, bf16 /
# fp16): 777 57 -> 69 / 58 -> 69, 999 63 -> 80 / 64 -> 80, 1023 64 -> 70 / 64 -> 72 (two and three 512-element
# segments); 333 (one) 50 -> 47 lost, so from 513; but the narrow packed ones (_narrow_packed) and under 1025 the even
# ones, whose rows plan loads 4-byte pairs (_HELD_FWD_EVEN_MIN_COLS). docs/kernels.md, "layer_norm: forward". None: never.
# Even forward rows (not a multiple of 4) held only from here: under it the rows plan's pairs win. H200, 2026-12-03, the
# rows plan -> held, bf16 / fp16: 514 63 -> 49 / 62 -> 50, 998 85 -> 81 / 86 -> 81, 1022 86 -> 70 / 86 -> 72.
_HELD_FWD_EVEN_MIN_COLS = 1025
# Forward rows too wide for the held plan (its row, weight and bias in one block's shared memory) streamed past the
# held weight and bias instead (_layer_norm_held.launch_stream: each row in registers, the next one loaded as the
# output pass leaves each segment, the weight and bias at the program's phase in shared memory), on the same GPUs, where
# the weight and bias fit (16-bit parameters: to 57337 columns): rows of N not a multiple of 16 from these widths (by
# element size), aligned ones from stream_fwd_aligned_min_cols. H200, % of copy, the other plans -> streamed, bf16:
# 37409 31 -> 65, 50257 31 -> 60, 57337 33 -> 59, aligned 49152 59 -> 67, 51776 56 -> 62; fp32 22618 45 -> 62; not taken:
# aligned 24576 75 -> 68, 32768 71 -> 69, fp32 24576 72 -> 69, 16-bit 2560-14336 84-91 -> 29-62 (one 8-warp program an
# SM holds too little in flight for short rows). docs/kernels.md, "Rows streamed past the held weight". None: never.
# Aligned rows streamed from stream_fwd_aligned_min_cols (by element size). fp32 aligned rows are not: streamed, 8193-9728 read 84-87% against the persistent plan's 81-86 (past it
# lower: 12288 87 -> 83, 16384 85 -> 78), and the walk took 8193-11520 at 85-91 (walk_fwd_aligned; docs/kernels.md,
# "Statistics", "fp32 aligned rows against Liger's shape").
# Narrower rows of N not a multiple of 16 streamed by several programs an SM (_layer_norm_held.stream_shape) before the
# held plan, in these bands (by element size, inclusive; rows that lie packed at a multiple of 4 columns under 2048 keep
# the packed rows plan, even 16-bit rows under 1025 the rows plan's pairs). H200, % of copy, their plans -> streamed,
# 2026-12-03: fp32 1025 62 -> 87, 2049 87 -> 88, 2500 82 -> 85, 3001 82 -> 85, 3500 77 -> 86, 4097 81 -> 88, 4500 78
# -> 88, 5113 84 -> 85, 6500 75 -> 79, 7001 80 -> 81, 9001 54 -> 79, 10468 55 -> 75, 11000 67 -> 75, 12345 63 -> 68,
# 13001 51 -> 70, 14001 62 -> 70, 15001 56 -> 73, 16383 66 -> 72, 5500 / 6001 level; lost at 8191 (the walk, 85 -> 76)
# and 1500 (packed, 97 -> 84). bf16 / fp16: 555 52 -> 58 / 52 -> 57, 777 68 -> 74, 999 79 -> 85 / 80 -> 85, 1023 68 ->
# 76 / 71 -> 76, 1025 69 -> 75 / 71 -> 76, 601 / 701 / 901 +3 to +4, 2049 82 -> 84, 2101 69 -> 84, 2222 72 -> 84, 2300
# 74 -> 81, 4200 83 -> 85, 4444 79-81 -> 85, 7001 81 -> 83, 4097 / 5001 / 8191 / 9999 / 10001 level to +2; lost where the
# 16-bit row takes six segments or 16 warps (2600, 3001, 6001 -1 to -5, 12345 -2 to -5: _STREAM_FWD_16BIT_MOST, the most
# segments and warps) and at the rows plan's even pairs under 1025 (514 63 -> 53, 1022 87 -> 75). 16-bit rows of 257-512
# since one-warp programs (_layer_norm_held.STREAM_NARROW_MAX_SEGMENTS_BY_WARPS): 259 40 -> 58-59, 333 49 -> 69-70.
# docs/kernels.md, "Rows streamed past the held weight". None: never.
_STREAM_FWD_16BIT_MOST = (5, 8)
# Even 16-bit rows under _HELD_FWD_EVEN_MIN_COLS streamed only where their streamed programs have at most this many warps
# (one: up to three 256-element segments, ~761 columns). H200, 2026-12-03, the rows plan's pairs -> streamed, bf16 /
# fp16: 258 47 -> 59 / 48 -> 59, 290 50 -> 63 / 51 -> 62, 322 54 -> 67 / 55 -> 67, 402 66 -> 75 / 66 -> 75, 514 63 -> 75 /
# 62 -> 76, 530 60 -> 75 / 61 -> 75, 602 66 -> 77 / 66 -> 77, 750 76 -> 79 / 76 -> 78; on two warps lost, 778 75 -> 73 / 76
# -> 74, 898 82 -> 79 / 83 -> 80, 1018 87 -> 75 / 86 -> 76. None: never.
_STREAM_FWD_EVEN_MAX_WARPS: int | None = 1
_HELD_FWD_FP32_ALONE_MIN_COLS = 16385  # fp32 rows narrower than this are held only where two programs an SM fit
# Aligned forward rows (N a multiple of 16: every row starts on a 16-byte boundary, so none holds slack) held in these
# bands (by element size, inclusive; powers of two never, their tiles fill every lane). H200, % of copy, their plans
# (chunked rows to 9216, the JOINT tile past it) -> held, bf16 / fp16: 8208 68 -> 85 / 71 -> 83, 8704 74 -> 84 / 77 ->
# 85, 9216 76 -> 84 / 79 -> 83, 9728 76 -> 87 / 82 -> 87, 10240 78 -> 87 / 84 -> 87; level at 10496-10752; 11008
# (2026-12-03, twice) 82 -> 86 / 87 -> 86; lost at 11264-16384 (fp16 11264 88 -> 85, 12288 87 -> 81, 14336 91 -> 78) and
# 2560-8192 (84-95 -> 80-89). docs/kernels.md, "One pass for the statistics".
# Backward rows held in shared memory (_layer_norm_held's backward kernel: x, dy and the weight there, the program's
# dweight / dbias shares in registers for rows of up to eight 1024-element segments, else in shared memory too), for
# 16-bit rows of N not a multiple of 16 in these bands (by element size, inclusive), where it runs and its row fits:
# past _PHASED_BWD_MAX_ROW always (the alternative is the chunked plan: bf16 9001-14001 30-33 -> 42-45% of copy);
# narrower rows where two or more programs an SM fit and, with the shares in registers, the row's segments hold at most
# _HELD_BWD_REG_SLOTS times the lanes of the phased plan's tile and pieces (H200, bf16, phased -> held: 1100 50 -> 54,
# 1500 61 -> 71, 2049 64 -> 70, 2300 42 -> 76, 2600 47 -> 79, 4097 55 -> 71, 5121 44 -> 67, 6137 50 -> 69; 2800 and
# 4001 level; 1025 on 1024-element segments, 2048 slots against the phased plan's 1024 and a tail in words, 67 -> 52,
# and on the 2-warp programs' 512-element ones, 1536 slots, 67 -> 74), or, with the shares in shared memory, fill
# _HELD_BWD_MIN_GAIN more of their segments than of the phased plan's tile. None: never.
# 16-bit rows under 1025 (2026-12-03, twice, the measured plan -> held, bf16 / fp16): 333 44 -> 61 / 44 -> 61, 777 44 ->
# 77 / 44 -> 79, 999 52 -> 82 / 53 -> 81, 1023 52 -> 75 / 53 -> 74; 258 36 -> 48 / 37 -> 48, 290 39 -> 54 / 40 -> 54, 322
# 43 -> 60 / 43 -> 59, level at 514 (54 -> 54 / 57 -> 55), 998 (76 -> 82 / 77 -> 82) and 1022 (76 -> 74 / 76 -> 73); but
# the narrow packed ones (_narrow_packed). docs/kernels.md, "layer_norm: backward".
_HELD_BWD_REG_SLOTS = 1.9
_HELD_BWD_MIN_GAIN = 0.1
# The same for aligned rows (N a multiple of 16), in these bands, with the shares in registers (H200, % of copy, their
# plans -> held, bf16 / fp16: 3072 78 -> 82 / 78 -> 88, 4352 65 -> 80 / 62 -> 85, 4608 76 -> 82 / 77 -> 86, 5120 78 -> 82
# / 78 -> 85, 5632 80 -> 82 / 79 -> 86, 6400 71 -> 82 / 75 -> 82, 6656 82 -> 82 / 81 -> 83, 7168 82 -> 84 / 83 -> 84; not
# taken: 3136-3840, bf16 -5 to -12 (three pieces on 8 warps, 3584: 89%), fp16 0 to +10; 7424-8176, bf16 0 to +3, fp16
# -1 to -4; 2048, 2560, 4096, 8192 -3 to -11; 2816 level). 1600 (GPT-2 XL; 2026-12-03, twice): 76 -> 77 / 77 -> 79.
# Aligned 16-bit forward rows in this band whose power-of-two tile masks lanes (384 on 512, 1280 on 2048)
# take _MASKED_ROWS_TILE elements a program: twice the rows of the tile (1280: two rows, not one). ncu
# (ln_fwd_bf16_1280): issue-bound, 81% of the issue slots busy at ~31 instructions an element, the masked
# lanes' included; the rows share a program's weight, bias and set-up. docs/kernels.md, "Aligned 16-bit rows".
_MASKED_ROWS_TILE = 4096
# aligned rows: a multiple of 16 columns. H200, % of copy, 64 -> 16 (two runs, bf16 / fp16): 272 56 -> 75 / 62 -> 75-76,
# 528 53-54 -> 67 / 56 -> 70-71, 1040 59 -> 68-69 / 63 -> 74, 1104 52 -> 65-66 / 52 -> 64, 1296 77 -> 88-89 / 82-83 -> 91-92,
# 1552 86 -> 95-96 / 89 -> 97; 400 (+0-2) and 2000 level
_MASKED_ROWS_MULTIPLE = 16
# Forward rows wider than _HELD_ROWS_MIN, up to _MAX_ROW: fp32 rows take "persistent" with the
# whole row held (one program an SM loading its next row before this row's reductions):
# 91% of copy at 16384 against 87% for "rows"; 16-bit rows stay "rows" with 64 elements a
# thread (8 warps at 16384): 92-93% against 90% with 16 (H200, twice each). fp32 on 16 warps instead of 32 (2026-12-03,
# four runs in two calls): +1 to +2 points at 12288-16384, -1 at 9216-10240, level at 11008; not taken.
_HELD_ROWS_MIN = 8192
_HELD_ROWS_WARPS = 32
_HELD_ROWS_ELEMS_16BIT = 64
_CHUNK = 4096  # looped steps
_WIDE_ROWS_PLAN = "auto"
_WIDE_PLANS = ("auto", "persistent", "split", "looped")
_PERSISTENT_CHUNK_BYTES = 65536
_PERSISTENT_WARPS = 16
_SPLIT_CHUNK_BYTES = 16384  # steps of a slice that is not held
_SPLIT_WARPS = 8
_SPLIT_PER_SM = 3
_SPLIT_HOLD_MIN_ELEM_SIZE = 4  # 16-bit held slices measured 44-60%
_SPLIT_SLICE_BYTES = 16384  # smallest held slice; wider rows get wider slices, up to _MAX_SPLIT_GROUP a row
_SPLIT_HOLD_MAX_BYTES = 65536  # widest slice held in registers (16 warps x 32 fp32 a thread)
# A row the split kernel holds whole (one slice, one step: the fp32 "persistent" plan of 8193-16384) whose shift x[row, 0]
# lies far from its mean, (mean - shift)^2 > _SPLIT_RECENTRE var, takes its variance again as the mean square about the
# mean (a second reduction over the held registers): the shifted one-pass sums lose up to ~N float32 ulps of it there.
# Off: on 32 warps at 64 registers the branch grew the kernel's stack 160 -> 256 bytes (sm_90) and cost 14-18 points
# of copy even where no row took it, as always centring did (docs/kernels.md, "Statistics"). None: never.
_SPLIT_RECENTRE: float | None = None
_MAX_SPLIT_GROUP = 16
_LOOPED_WARPS = 16
# Aligned rows in a band of looped_fwd_bands (by element size) take "looped" on a persistent grid: a
# row's tile is its chunks, not its power of two (docs/kernels.md, "layer_norm: forward", "Aligned 16-bit rows":
# bf16 8704 61 -> 74%, 9216 64 -> 76%; elsewhere the tiles were faster).
_LOOPED_FWD_CHUNK_BYTES = 2048  # widest chunk; narrower ones where they divide the row more evenly
_LOOPED_FWD_WASTE = 1 / 8  # the masked share of the last chunk a row may leave
_LOOPED_FWD_WARPS_PER_SM = 32
_LOOPED_FWD_STAGES = 4  # software-pipelining depth of the chunk loops (chunks in flight: stages - 1)
# Backward: rows up to _BWD_MAX_ROW in _BWD_ROWS_TILE-element steps with _BWD_WARPS warps and
# _BWD_PROGRAMS_PER_SM row groups per multiprocessor, except narrow half-precision rows
# (one row per step, 4 warps, 8 groups per SM: 69% against 56%). Wider rows: one_pass
# chunks of _BWD_CHUNK (measured 46-57% of copy in fp32, the best of the plans timed).
_BWD_MAX_ROW = 4096
_BWD_ROWS_TILE = 4096
_BWD_WARPS = 8
# Backward rows (measured kernel), 16-bit rows wider than this: load each program's next row before
# working on this one. bf16 4096: 87% of copy against 74% (8 warps, 164 registers: one program an SM
# with nothing else in flight); it lost at fp32 1024 / 4096 (92 -> 77%, 93 -> 90%) and bf16 1024
# (81 -> 68%), so those stay as they were (docs/kernels.md, "layer_norm: backward").
_BWD_FP32_ROW_WARPS = 16  # fp32 rows one a program (4096 wide): 91% of copy against 83-84% at 8 warps (H200, twice)
_BWD_PROGRAMS_PER_SM = 2
_BWD_NARROW_HALF = dict(max_width=1024, block_m=1, num_warps=4, programs_per_sm=8)
_BWD_CHUNK = 4096
# dweight/dbias: share rows summed per program of the first level (the second adds the splits)
_DWDB_GROUPS_PER_SPLIT = 32
_DWDB_BLOCK_G = 16
_DWDB_BLOCK_N = 256
# Backward variant: "measured" (the plans above) or "lean" (_layer_norm_bwd_lean_kernel: one row a
# step with the next row's loads in flight, one 16-byte vector per tensor a thread, ~62-80
# registers). "lean" (the default) takes over where it measured faster on the H200
# (docs/kernels.md, "layer_norm: backward"): rows wider than _BWD_MAX_ROW, bf16 34% -> 51%
# at 16384 and 15% -> 43% at 65536, fp32 56% -> 63% at 16384; not fp32 rows wider than
# _LEAN_FP32_MAX_ROW (40% against 46%) nor rows up to _BWD_MAX_ROW (bf16 60% against 69-72%).
_BWD_VARIANT = "lean"
_LEAN_FP32_MAX_ROW = 16384
_BWD_VARIANTS = ("measured", "lean", "phased", "flat")
# Rows that start unaligned (_ragged: N not a multiple of 16 elements), forward: the rows plan reads
# aligned vectors from _PHASED_ROWS_MIN_COLS columns (narrower, Triton's scalar accesses); the
# split walk always does. Backward: _layer_norm_bwd_phased_kernel (aligned rows too, where
# _phased_backward says) for rows of up to _PHASED_BWD_MAX_ROW virtual columns plus a tail of
# _PHASED_BWD_MAX_TAIL, _PHASED_BWD_VECTORS 16-byte vectors of x (and of dy) a thread, up to
# _PHASED_BWD_WARPS_PER_SM warps an SM (docs/kernels.md, "layer_norm: backward").
_PHASED_ROWS_MIN_COLS = 2048
# Narrower unaligned rows that lie packed (strides N) take N as a compile-time constant up to this width
# (_ragged.Phased.packed_width; softmax._PACKED_N_MAX): vectors of the rows' alignment, one compile a width.
# H200, % of copy, runtime -> compile-time width, bf16 / fp16 / fp32: forward 360 38 / 38 / 70 -> 81 / 83 / 85,
# 1000 65 / 65 / 95 -> 97 / 96 / 95; backward 1000 51 / 52 / 86 -> 76 / 79 / 89 (docs/kernels.md, "Packed rows").
_PACKED_N_MAX = 2047
# Packed unaligned rows in this band whose N is a multiple of _PACKED_ROWS_MULTIPLE (vectors of 8 bytes or more in
# 16-bit) take the rows plan at that width (_packed_rows), not the forward's walk or the phased backward. H200, %
# of copy, bf16 / fp16 / fp32: forward 1032 56 / 57 / 93 -> 71 / 77 / 94, 1500 54 / 54 / 92 -> 68 / 69 / 92, 1800
# 68 / 70 / 93 -> 93 / 93 / 95, 2040 75 / 76 / 95 -> 96 / 96 / 95, 1100 level; backward 1032 40 / 41 / 81 -> 50 /
# 51 / 75, 1100 42 / 43 / 71 -> 51 / 52 / 77, 1800 64 / 65 / 78 -> 68 / 68 / 88, 2040 71 / 71 / 77 -> 71 / 71 / 89
_PACKED_ROWS_MULTIPLE = 4
# Packed rows at a compile-time width are held as aligned rows are (_row_pieces: their power of two unless it masks
# _PIECE_WASTE_ALIGNED, not pieces that cover every phase), and 16-bit ones of a multiple of
# _MASKED_ROWS_PACKED_MULTIPLE take the masked-rows tile (_forward_rows_tile). H200, % of copy, bf16 / fp16 / fp32,
# neither -> both (one call): 360 79 / 82 / 86 -> 85 / 89 / 98, 600 55 / 55 / 72 -> 82 / 85 / 98, 1028 67 / 67 / 96
# -> 87 / 87 / 96, 1100 51 / 51 / 71 -> 65 / 66 / 71, 1500 69 / 70 / 94 -> 94 / 94 / 97, 1800 94 / 95 / 96 -> 96 /
# 98 / 97, 1000 and 2040 level; either alone gained less (600 bf16 73 / 68, 1500 74 / 80)
_MASKED_ROWS_PACKED_MULTIPLE = 4
# Forward rows held as up to _ROW_PIECES power-of-two pieces (softmax's rule: _ragged.row_pieces).
_ROW_PIECES = 3
_PIECE_SLACK = 0.125
_PIECES_MIN_COLS = 256
_PIECE_WASTE_ALIGNED = 0.45
# Aligned (and packed) rows just above a power of two of at most _SLIVER_MAX_SINGLE (by element size): that power of
# two whole, not pieces, unless the pieces past the first hold at most 1/_SLIVER of its lanes (16-bit rows; fp32 ones
# only on blocks of _SLIVER_FP32_MIN_SINGLE). H200, % of copy, pieces -> whole, bf16 / fp16: 1040 66 / 73 -> 75 / 83,
# 1060 68 / 70 -> 80 / 81, 1100 63 / 64 -> 81 / 83, 1120 65 / 63 -> 80 / 85, 2080 73 / 74 -> 73 / 79, 2160 63 / 64 ->
# 76 / 79; fp32 1060 84 -> 95, 1100 70 -> 96, 1028 94 -> 97, 2064 93 -> 94, 4224 70.5 -> 89.5, 4288 71 -> 90, 4352 71
# -> 90, 4416 88 -> 91, 4480 88 -> 91; slivers, kept: bf16 / fp16 1028 85 / 85 -> 78 / 79, 2064 78 / 83 -> 73 / 79,
# fp32 4160 (4096 + 64) 91 -> 89 (docs/kernels.md, "Rows in pieces, ragged or aligned (forward)").
_SLIVER_MAX_SINGLE = {2: 4096, 4: 8192}
_SLIVER = {2: 128, 4: 64}
_SLIVER_FP32_MIN_SINGLE = 8192
# Aligned rows in pieces whose pieces past the first hold lanes in this inclusive range keep the warps of their whole
# block (``_block_warps``; None: none): of the rows plan's widths only 16-bit 4176-4224 (4096 + a 128-lane piece).
# sm_90 (Triton 3.9) compiles bf16 4224 on 4 warps (the first piece's) at 95 registers and 800 SASS instructions, five
# programs an SM, on 8 (the block's) at 48 and 432; ncu put the 4-warp kernel at 29.5% occupancy, 46% of cycles no
# eligible warp, DRAM 51%. H200, 2026-12-03, two runs, % of copy, first piece's -> block's warps, bf16 / fp16: 4176
# 62 / 63 -> 66 / 67, 4192 62 / 63 -> 67, 4208 62 / 63 -> 67, 4224 63 / 64 -> 69 / 68; shorter tails lost (4112 84 / 90
# -> 71 / 81, 4128 76 / 79 -> 64, 4160 74 / 79 -> 68) (docs/kernels.md, "Rows in pieces, ragged or aligned (forward)").
# 16-bit aligned rows (docs/kernels.md, "layer_norm: forward", "Aligned 16-bit rows"): in this band, two
# pieces where the second has _ALIGNED_PIECE_MIN_LANES or more, with JOINT statistics and 64 registers;
# from joint_16bit_min_cols, one tile with JOINT statistics.
_ALIGNED_PIECE_MIN_LANES = 1024
_ALIGNED_PIECES_MAX_REGS = 64
# fp16 rows on one 8192-lane tile take JOINT (and PACKED) from here: fp16 6656-8192 79-90 -> 89-94%, where
# bf16 lost 1-2 points and both lost at 4608 and under 2048 (docs/kernels.md, "Aligned 16-bit rows").
# With JOINT on one tile, x held in its 16-bit registers through the reduction and widened again after
# it (PACKED): 78 registers against 107 at bf16 16384 on 8 warps, three programs an SM instead of two
# (docs/kernels.md, "Aligned 16-bit rows").
# The same for the two JOINT pieces of 4097-8192 (_aligned_16bit_pieces): bf16 4096 + 1024 on 4 warps 80 ->
# 56 registers uncapped, no stack at the 64 cap (16 bytes before); bf16 6144 87 -> 91-92%, fp16 87-88 -> 94-95%.
# bf16 aligned rows (a multiple of 16 columns) on the rows kernel in these bands (inclusive; None: none): x, the
# weight and the bias widened a pair at a time from their 32-bit registers by a shift and an AND (_math.widen), not
# by the compiler's conversion, which spends a PRMT and a shift on one of the two. CUDA only. H200, dense, two
# interleaved runs, % of copy: 2112-3264 +1.2 to +4.5 (2368 78.5 -> 83), 4160 74 -> 77.6, 11072-14000 +1 to +2;
# lost on the 8192-lane tile (6208 85 -> 75, 7168 90 -> 82, 8192 92.5 -> 88: Triton 3.6 64 -> 79 registers, a program
# an SM fewer), the 64-register JOINT pieces (6144 91 -> 89.5: 16 bytes of stack), 4224 on its block's warps 69.4 ->
# 66.7, 768 93 -> 91 and packed ragged rows (1500 -5.4) (docs/kernels.md, "bf16 widened by a shift").
# Forward: fp32 only; the H200 sweep of 16-bit ragged rows (1023-12345) put the phased rows
# kernel level with or behind the scalar one (docs/kernels.md, "layer_norm: forward").
_PHASED_MIN_ELEM_SIZE = 4
_PHASED_ROWS_ELEMS = 16  # elements a thread of the phased rows plan: 8-32 warps, 80-84 registers uncapped
_PHASED_MAX_REGS = 64  # two 16-warp (or four 8-warp) programs an SM; sm_90 compiles: at most 8 bytes of stack
_PHASED_BWD_MAX_ROW = 8192  # 16384 columns (fp32 or bf16 8191) spill 200-400 bytes a thread at 32 warps
_PHASED_BWD_MAX_TAIL = 1024  # a second piece of one element a thread at 32 warps: 8191 holds as 8192 + 8
_PHASED_BWD_VECTORS = {4: 2, 2: 1}  # by element size: fp32 1025 / 2049 71% / 66% against 50% / 46% on one
_PHASED_BWD_WARPS_PER_SM = 32
# The phased backward's row loop pipelined (_PHASED_BWD_STAGES - 1 rows of x and dy in flight in shared
# memory, within _PHASED_BWD_SMEM_BYTES an SM); besides unaligned rows from phased_bwd_min_cols it takes
# aligned rows from phased_bwd_aligned_min_cols and in the bands below (docs/kernels.md, "layer_norm: backward").
_PHASED_BWD_STAGES = 3
_PHASED_BWD_SMEM_BYTES = 196608  # or the device's shared memory an SM where less
_PHASED_BWD_MIN_ELEM_SIZE = 2
# A row in two pieces where its power of two masks _PHASED_BWD_PIECE_WASTE of the lanes: unaligned rows
# (bf16 4097 32 -> 40%, fp32 2049 65 -> 75%; 16-bit ones only with a one-vector tail, see the edge words below) and
# fp32 rows under 4096; aligned rows wider, or 16-bit, lost (bf16 4608 52 -> 38%, fp32 4608 80+ -> 74%).
_PHASED_BWD_PIECES = 2
_PHASED_BWD_PIECE_WASTE = 0.1
# The edges of unaligned 16-bit rows read as 32-bit words (_ragged.edge_words), which the pipeline copies
# with cp.async (2-byte loads it cannot): bf16 7001 45 -> 57%, 5121 31 -> 44% (whole, not in pieces). Next to a
# one-vector tail piece, itself 2-byte loads, they lost 3-7 points: there the tail goes as words too (below),
# or, past _PHASED_BWD_TAIL_WORDS_MAX (8191), the tail piece and 2-byte edges stay.
# The phased backward's one-vector tail piece of 16-bit rows (1025, 2049, 4097, 8191: 2-byte loads, synchronous in
# the pipelined loop) read with the edges as words instead (_layer_norm_bwd_phased_kernel's TAIL).
_PHASED_BWD_TAIL_WORDS_MAX = 4096  # widest first piece that takes it: 8191 (8192 + 8, 32 warps) lost, 46 -> 38%
# a piece's two row sums in one reduction (PAIRS) on rows of this many lanes or more: bf16 / fp16 +1-10 points at
# 1280-8192 (8191 46 -> 56%, 7168 75 -> 78%); on 1024 lanes mixed (768 +2, 1024 88 -> 83% in two runs)
_PHASED_BWD_PAIRS_MIN_LANES = 2048
# and on narrower 16-bit rows that take more than one reduction a row (two pieces not merged, or a tail in words):
# bf16 / fp16 1040 (1024 + 16) 71 -> 80 / 72 -> 80, 1056 71 -> 79, 1088 68 -> 70, 1025 66 -> 67; fp32 lost (1280 90 ->
# 85; _phased_pairs)
# 16-bit aligned rows in these bands (inclusive) in two pieces (1024 + 16 .. 1024 + 256, 4096 + 16 .. 4096 +
# 2048), where the second has at least _PHASED_BWD_ALIGNED_PIECE_MIN_LANES lanes, on the warps of the first
# piece (None: one power of two). Registers: _PHASED_BWD_ALIGNED_PIECE_MAX_REGS[i] for second pieces up to the
# i-th's lanes (programs an SM: as many as fit). H200, bf16 / fp16, % of copy: 1280 63 -> 72 / 64 -> 74, 4112
# 48 -> 69 / 49 -> 71, 4608 54 -> 65 / 56 -> 65, 5120 60 -> 65 / 62 -> 66 (64 registers, 2 programs an SM; 72
# bytes of stack); 6144 69 -> 72 / 72 -> 72 (128, one an SM; at 64 it spilled 176 bytes and read 57). Lost: the
# warps of both pieces (32, 55 registers: 39-52); 1536 73 -> 55, 3072 78 -> 60, 2304-2560 level (docs/kernels.md).
_PHASED_BWD_ALIGNED_PIECE_MIN_LANES = 16
_PHASED_BWD_ALIGNED_PIECE_MAX_REGS = ((1024, 64), (3072, 128))  # (the later pieces' lanes up to, register cap)
# and 16-bit aligned rows in these bands (inclusive) in three pieces where all three merge on the first's warps
# (2048 + 1024 + 256 or + 512 on 8 warps: 3073-3584, phased outside phased_bwd_aligned_16bit too; 4096 + 2048 + 512
# or + 1024 on 16 warps: 6145-7168; docs/kernels.md, "Aligned 16-bit rows in pieces"); None: none
# (H200, % of copy, bf16 / fp16, the 8192-lane tile -> three pieces: 6656 73-74 -> 80-81 / 76-77 -> 80-81, 7168 78-79 ->
# 82 / 80-81 -> 82-83; the rows plan -> three pieces: 3216 76-77 -> 81-82 / 77 -> 81-82, 3328 80 -> 85 / 81 -> 85, 3584
# 83 -> 88 / 83-84 -> 88; 1281-2047 lost, 1664 79 -> 55-56, 1792 84-86 -> 56-61.) A third piece of under two lanes a thread loaded a row ahead in registers (_phased_ahead): 6656
# 61-62 -> 80-81; on second pieces (4112-4608, 1040-1152, 8191's tail) it lost 2-10 points.
# Aligned rows in pieces load, select and store their first piece without masks (it lies inside every row; _full_first):
# sm_90 SASS, loop instructions a row, bf16 5120 336 -> 316, 1216 329 -> 309. H200, % of copy, bf16 / fp16: 4224 59 ->
# 63-64 / 60-61 -> 62, 5120 74-75 -> 77 / 75-76 -> 78-79, 1152 81-82 -> 83-84 / 82-83 -> 85, 1216 84-85 -> 83 / 84 -> 82;
# fp32 2560 86 -> 88-90, 2304 83-84 -> 85-86. Not with a third piece a row ahead (6656 80-81 -> 76; 377 instructions).
# Rows held as their power of two and a tail in words (TAIL: 16-bit 2^k + 1 .. 2^k + 7 columns, k <= 12) spilled at
# _PHASED_MAX_REGS (ncu, bf16 1025: 2.9M local-memory requests); they take up to phased_bwd_tail_max_regs, fewer
# programs an SM. H200, % of copy, 64 -> 72 / 80 / 96 registers, bf16: 1025 55 -> 59 / 63 / 66, 2049 55 -> 57 / 63 / 64,
# 4097 51 -> 47 / 51 / 55 (fp16 within 2 points); rows on one power of two lost (3001 53 -> 46-47), 1500 level.
# A 16-bit row's two pieces in one block reduction where both are a multiple of the threads (_merge_pieces): H200, % of
# copy, bf16 4608 64 -> 74, 5120 64 -> 75, 6144 70 -> 81, 1152 70 -> 81 (fp16 alike); fp32 pieces lost (1280 89 -> 83;
# docs/kernels.md, "Aligned 16-bit rows in pieces").
# Backward, 16-bit aligned rows laid flat (_layer_norm_bwd_flat_kernel, plan "flat"; docs/kernels.md, "Rows laid
# flat"): windows of whole rows in a tile of _FLAT_BWD_TILE lanes, cut in segments of up to _FLAT_BWD_SEGMENT lanes
# (a warp of 16-byte vectors), for rows in flat_bwd_16bit (inclusive) where the tile holds at least _FLAT_BWD_MIN_GAIN
# more of its lanes in use than the plan it replaces (1536: 30 of 32 segments against 1536 of 2048 lanes; a row in
# two pieces counts as its power of two), and at flat_bwd_also. H200, bf16 / fp16, % of copy: 768 73 -> 83 / 75 ->
# 81, 1280 (pieces) 71-72 -> 83 / 74-75 -> 82, 1536 73 -> 83 / 74 -> 82, 2304 69-70 -> 79-80 / 70 -> 78, 2560 72 -> 84 /
# 73 -> 83, 4096 (rows plan) 84.5 -> 87-88 / 84.5 -> 88 (docs/kernels.md has the final figures). At the same share of
# lanes it lost elsewhere: 1024 89 -> 87, 2048 89 -> 87, 1792 83 -> 80-81, 2816-3840 1-7 points.
_FLAT_BWD_TILE = 8192
# the smaller tile (_flat_shape): 768 83 -> 83-84 / 81-82 -> 84, 1280 82-83 -> 84-85 / 82 -> 87-88
_FLAT_BWD_SMALL_TILE: int | None = 4096
_FLAT_BWD_SEGMENT = 256
_FLAT_BWD_MAX_SEGMENTS = 64  # segments a tile at most (the row sums add segments through an (S, S) mask)
_FLAT_BWD_MIN_GAIN = 0.05
_FLAT_BWD_STAGES = 3
# Windows on the 8192-lane tile, fp16 ones or ones that mask no segment (4096): three in flight (H200, two runs each,
# % of copy, 3 -> 4 stages: fp16 1536 82-83 -> 86-87, 2304 78 -> 81-82, 2560 83 -> 87-88, 4096 level; bf16 4096 88 ->
# 90, bf16 1536-2560 0-1.5 points lower; 1280 on the 4096-lane tile 85 -> 81 / 87-88 -> 84-86; two stages: 48-64)
_FLAT_BWD_STAGES_WIDE = 4
_FLAT_BWD_MAX_REGS = 64
# Forward "walk" (_layer_norm_fwd_walk_kernel): the phased backward's pipelined walk for the forward, weight
# and bias held at the program's phase. Taken by default for unaligned rows in walk_fwd_bands[element size]
# (inclusive ranges) and aligned ones in walk_fwd_aligned[element size] that it holds in at most
# _WALK_FWD_MAX_LANES lanes;
# _WALK_FWD_ELEMS elements a thread over the row's pieces (4..32 warps), fewer warps while a piece wider than
# a vector would get under _WALK_FWD_MIN_PIECE_BYTES a thread (cp.async copies 4, 8 or 16 bytes). H200 A/B
# (docs/kernels.md, "layer_norm: forward", "The walk"): 16-bit unaligned rows of 1025-16383 gain 7-33 points
# (bf16 4097 41 -> 70%, 8191 26 -> 60%); fp32 only at the top of the rows plan's blocks (8191 72 -> 86%,
# 16383 43 -> 66%; 2049-7001 and 12345 lost 7-46; fp32 aligned 2112-4544 lost 1-36); aligned 16-bit rows past
# 2^k + 2^k / 16 up to 2^k + 2^k / 8 for 2^k = 2048, 4096 (2192-2224 77 -> 90%, 2240 77 -> 92%, 2304 78 -> 92%,
# 4240-4272 64 -> 70-71%, 4352 65 -> 72%, 4608 75 -> 88%), not at or under 2^k + 2^k / 16 (2112 74 -> 58%, 2176 77 ->
# 59%, 4160 74 -> 52%, 4224 64 -> 51%; bf16, 2026-12-03) nor elsewhere (5120 79 -> 66%, 2560 83 -> 71%, 8704 61 -> 44%);
# fp32 aligned rows of 8193-11520 (8704 84 -> 89.5%, 10240 87 -> 90%, 11264 87 -> 88.5%; from 11584 level or lower:
# 12288 86 -> 85%; against the streamed and persistent plans).
_WALK_FWD_MAX_LANES = 16384 + 1024
_WALK_FWD_PIECES = 2  # three lost to one power of two: 12345 35 -> 46%, 13883 34 -> 50% (bf16)
_WALK_FWD_ELEMS = {2: 16, 4: 8}
_WALK_FWD_MAX_ELEMS = 16  # elements a thread of the first piece at most (8192 + 512 on 8 warps spilled 264 bytes)
_WALK_FWD_MIN_PIECE_BYTES = 4
# Whether the warps are halved down to the fewest (_WALK_FWD_MAX_ELEMS) even where a piece stays under
# _WALK_FWD_MIN_PIECE_BYTES a thread there (by element size). fp32 aligned 8272-8448 (8192 + 128 or 256): 16 warps at
# 80 registers read 66-68% of copy, 32 at 64 84-86% (8256 / 8512: 87-88 / 91, their plans as before); H200,
# 2026-12-03, two runs (docs/kernels.md, "The walk").
_WALK_FWD_HALVE_UNREACHED = {2: True, 4: False}
_WALK_FWD_MIN_PIECE = 256  # 16-bit unaligned rows: a narrower last piece goes as words (12345: 8192 + 4096 + 8 vectors)
_WALK_FWD_MAX_TAIL = 16
_WALK_FWD_WARPS_PER_SM = 32
_WALK_FWD_MAX_REGS = 64
_WALK_FWD_MAX_REGS_16 = 80  # a thread holding 16 elements of the widest piece, <= 16 warps: 64 spilled 64-72 bytes
# and measured 60 / 56% at bf16 4097 / 8191 against 70 / 60% at 80
_WALK_FWD_STAGES = 3
_LEAN_MAX_ROW = 4096  # widest row one lean program holds; wider rows go in _LEAN_CHUNK chunks
_LEAN_CHUNK = 2048
_LEAN_MAX_WARPS = {4: 32, 2: 16}  # by element size: fp32 4096 = 32 warps x 32 lanes x 4
# ptxas register caps: 64 gives 32 resident warps an SM. fp32 needs 62 anyway; 16-bit rows
# reload 4 loop-invariant words from L1 at 64 (16 bytes of stack, nothing stored in the
# loop), chunks spill more there and get 80 (no spills, 3 eight-warp programs an SM).
_LEAN_MAX_REGS = {("rows", 4): 64, ("rows", 2): 64, ("chunks", 4): 64, ("chunks", 2): 80}
# Backward chunked plans: one_pass needs a row's chunks co-resident, so past this many it gives
# way to two_pass. Beyond _MAX_CHUNKS chunks a row the chunks (and the looped forward's steps) widen.
_MAX_ONE_PASS_CHUNKS = 128
_MAX_CHUNKS = 4096


@dataclasses.dataclass(frozen=True)
class Tuning:
    """The width bands measured on one kind of GPU and Triton (``tuned/<arch>.json``, "layer_norm"): where a plan or a
    kernel option won there. By element size: pairs (2 or 4, value). The defaults take none of them: the base plans
    (rows, the split walk and the looped walk forward; rows, phased past the rows plan's widest row, lean and chunked
    backward) and the held kernels nowhere.
    docs/kernels.md, "layer_norm: forward" and "layer_norm: backward", gives each band with its figures."""

    # forward: which plan
    held_fwd_min_cols: tuple = ()  # ragged rows held (_layer_norm_held) from this width
    held_fwd_aligned_bands: tuple = ()  # aligned rows held in these bands
    stream_fwd_min_cols: tuple = ()  # ragged rows streamed past the held weight from this width
    stream_fwd_aligned_min_cols: tuple = ()  # aligned rows streamed from this width
    stream_fwd_bands: tuple = ()  # ragged rows streamed in these bands before the held plan is asked
    walk_fwd_bands: tuple = ()  # ragged rows on the walk
    walk_fwd_aligned: tuple = ()  # aligned rows on the walk
    looped_fwd_bands: tuple = ()  # aligned rows on the looped plan
    packed_rows_band: tuple | None = None  # packed ragged rows of a multiple of 4 on the rows plan, NARROW
    # forward: the rows kernel's options
    masked_rows_16bit: tuple | None = None  # 16-bit rows that mask lanes take the masked-rows tile
    aligned_pieces_16bit: tuple | None = None  # 16-bit aligned rows in two JOINT pieces
    aligned_pieces_block_warps_tails: tuple | None = None  # aligned pieces whose tails keep their block's warps
    joint_16bit_min_cols: int | None = None  # JOINT statistics on one tile from here (bf16)
    joint_fp16_min_cols: int | None = None  # ... and fp16
    rows_widen_bands: tuple = ()  # bf16 aligned rows widened by a shift (CUDA)
    fwd_params_first_min_cols: int | None = None  # fp32 aligned rows load weight and bias first from here
    # backward: which plan
    held_bwd_bands: tuple = ()  # a band of ragged rows held
    held_bwd_aligned_bands: tuple = ()  # aligned rows held in these bands
    # ragged and aligned rows on the phased plan from here; by default past the rows plan's widest row, where a row no
    # longer fits one rows program and the phased plan still holds it whole (not a band: bench_tuning.py measured the
    # chunked plans the rows go to otherwise at 0.52-0.83x of it on the H100)
    phased_bwd_min_cols: int | None = _BWD_MAX_ROW + 1
    phased_bwd_aligned_min_cols: int | None = _BWD_MAX_ROW + 1  # ...
    phased_bwd_aligned_16bit: tuple | None = None  # ... and 16-bit aligned ones in this band
    phased_bwd_aligned_fp32: tuple | None = None  # ... and fp32 aligned ones in this band
    flat_bwd_16bit: tuple | None = None  # 16-bit aligned rows laid flat in this band (where their tile fills) ...
    flat_bwd_also: tuple = ()  # ... and these widths
    # backward: the phased and rows kernels' options
    phased_bwd_aligned_pieces_16bit: tuple = ()  # 16-bit aligned rows in two pieces
    phased_bwd_aligned_three_pieces_16bit: tuple = ()  # ... in three
    phased_bwd_tail_max_regs: int | None = None  # register cap of a tail read as words (Triton 3.6's ptxas)
    bwd_prefetch_16bit_min: int | None = None  # 16-bit rows wider than this prefetch the next row block


DEFAULT_TUNING = Tuning()


def _tuning(device: Device) -> Tuning:
    """The layer norm's choices on ``device``: its tuned file's where this Triton matches it, else ``DEFAULT_TUNING``."""
    return _device.tuning("layer_norm", device, DEFAULT_TUNING)


def _layer_norm_settings(
    n_rows: int,
    n_cols: int,
    elem_size: int,
    *,
    backward: bool = False,
    device: Device = _device.INTERPRETER,
    max_row: int | None = None,
    one_pass: bool | None = None,
    variant: str | None = None,
    wide: str | None = None,
    phased_ok: bool = True,
    flat_ok: bool = True,
    packed: bool = False,
    tuning: Tuning | None = None,
) -> _Plan:
    """The launch plan of a forward or backward pass over an (n_rows, n_cols) input.

    ``max_row`` overrides the widest row held by one program (and is then the chunk or
    step width), ``one_pass`` forces the backward's one-pass (never under the interpreter) or
    two-pass chunked plan: tests use both to reach every code path with small shapes. ``variant``
    ("measured", "lean", "phased" or "flat") forces the backward kernel at every shape ("phased": whole
    rows only; "flat": aligned rows of at most ``_FLAT_BWD_MAX_SEGMENTS`` segments); left out, rows that start
    unaligned (N not a multiple of 16) from
    ``phased_bwd_min_cols`` up to ``_PHASED_BWD_MAX_ROW`` take "phased" where ``phased_ok`` (dy in
    x's dtype), 16-bit aligned rows that ``_flat_backward`` names take "flat" where ``flat_ok`` too (x and
    dy contiguous from a 16-byte aligned address), else
    ``_BWD_VARIANT`` decides, "lean" only at the widths where it measured faster. ``packed`` (the
    rows lie back to back, strides N): unaligned rows that ``_packed_rows`` names take the rows plan,
    not the forward's walk or the phased backward.
    ``wide`` names the forward plan for rows wider than ``_MAX_ROW`` instead of
    ``_WIDE_ROWS_PLAN``; as in softmax, an explicit "split" is refused under the interpreter.
    """
    if variant is not None and variant not in _BWD_VARIANTS:
        raise ValueError(f"unknown backward variant {variant!r}; expected one of {_BWD_VARIANTS}")
    t = _tuning(device) if tuning is None else tuning
    if backward and (variant == "flat" or (variant is None and max_row is None and phased_ok and flat_ok
                                            and _flat_backward(n_cols, elem_size, t))):
        return _flat_backward_plan(n_rows, n_cols, elem_size, device)
    if backward and (variant == "phased" or (variant is None and max_row is None and phased_ok
                                              and _phased_backward(n_cols, elem_size, t)
                                              and not (packed and _packed_rows(n_cols, t)))):
        return _phased_backward_plan(n_rows, n_cols, elem_size, device)
    if backward and (variant or _BWD_VARIANT) == "lean":
        if variant == "lean" or _BWD_MAX_ROW < n_cols <= (_LEAN_FP32_MAX_ROW if elem_size >= 4 else n_cols):
            return _lean_backward_plan(n_rows, n_cols, elem_size, device, max_row, one_pass)
    widest = max_row if max_row is not None else (_BWD_MAX_ROW if backward else _MAX_ROW)
    # the columns a forward rows program covers: the widest phase too where it reads aligned vectors (_ragged)
    width = ragged_width(n_cols, elem_size) if not backward and _phase_rows(n_cols, elem_size) else n_cols
    if not backward and max_row is None and _looped_forward(n_cols, elem_size, t):
        return _looped_forward_plan(n_rows, n_cols, elem_size, device)
    if not backward and max_row is None and _walk_forward(n_cols, elem_size, t) and not (packed and _packed_rows(n_cols, t)):
        vec = 1 if n_cols % 16 == 0 else max(1, 16 // elem_size)  # contiguous rows (the launcher checks)
        return _walk_forward_plan(n_rows, n_cols, elem_size, vec, device)
    held = not backward and max_row is None and _HELD_ROWS_MIN < n_cols <= _MAX_ROW and width == n_cols
    if held and elem_size >= 4:
        return _Plan("persistent", 1, next_power_of_2(n_cols), _HELD_ROWS_WARPS, group=1, per_sm=1)
    if not backward and width != n_cols and width <= widest:  # unaligned rows read as aligned vectors
        block_n = next_power_of_2(width)
        block_m = max(1, min(_ROWS_TILE // block_n, next_power_of_2(n_rows)))
        warps = max(warps_for(block_m * block_n), min(32, block_m * block_n // (32 * _PHASED_ROWS_ELEMS)))
        return _Plan("rows", block_m, block_n, warps, max_regs=_PHASED_MAX_REGS)
    if width <= widest:
        block_n = next_power_of_2(width)
        if backward and elem_size == 2 and n_cols <= _BWD_NARROW_HALF["max_width"]:
            block_m, warps, per_sm = (_BWD_NARROW_HALF[k] for k in ("block_m", "num_warps", "programs_per_sm"))
        else:
            tile = _BWD_ROWS_TILE if backward else _forward_rows_tile(n_cols, elem_size, packed, t)
            block_m = max(1, min(tile // block_n, next_power_of_2(n_rows)))
            warps = _BWD_WARPS if backward else warps_for(block_m * block_n)
            if held:  # 16-bit
                warps = max(4, block_n // (32 * _HELD_ROWS_ELEMS_16BIT))
            if backward and elem_size >= 4 and block_m == 1 and max_row is None:
                warps = _BWD_FP32_ROW_WARPS
            per_sm = _BWD_PROGRAMS_PER_SM
        least = t.bwd_prefetch_16bit_min
        prefetch = backward and elem_size == 2 and max_row is None and least is not None and n_cols > least
        plan = _Plan("rows", block_m, block_n, warps, prefetch=prefetch)
        n_chunks = 1
    elif not backward:  # wider rows, and unaligned ones whose phase overflows the 16384 block (16383)
        return _wide_forward_plan(n_cols, elem_size, wide, max_row)
    else:
        chunk = next_power_of_2(max_row) if max_row is not None else _BWD_CHUNK
        block_n = max(chunk, next_power_of_2(cdiv(n_cols, _MAX_CHUNKS)))
        n_chunks = cdiv(n_cols, block_n)
        if one_pass and interpreting():
            raise ValueError("the one-pass chunked plan waits on other programs: it cannot run under the interpreter")
        if one_pass is None:
            one_pass = not interpreting() and n_chunks <= _MAX_ONE_PASS_CHUNKS
        plan = _Plan("one_pass" if one_pass else "two_pass", 1, block_n, _BWD_WARPS)
        per_sm = _BWD_PROGRAMS_PER_SM
    if backward:
        row_blocks = cdiv(n_rows, plan.block_m)
        plan = plan._replace(n_groups=max(1, min(row_blocks, (device.sms * per_sm) // n_chunks)))
    return plan


def _wide_forward_plan(n_cols: int, elem_size: int, wide: str | None, max_row: int | None) -> _Plan:
    """The forward's plan for rows wider than ``_MAX_ROW`` (``wide`` or ``_WIDE_ROWS_PLAN``).

    "looped": one program a row. "persistent" and "split": ``_layer_norm_fwd_split_kernel``;
    "split" holds fp32 slices of one step in registers (32 elements a thread, a few programs an
    SM) while they fit, else takes 16 KB steps.
    """
    plan = wide or _WIDE_ROWS_PLAN
    if plan not in _WIDE_PLANS:
        raise ValueError(f"unknown wide-row plan {plan!r}; choose one of {_WIDE_PLANS}")
    if plan == "auto":
        plan = "split" if elem_size >= _SPLIT_HOLD_MIN_ELEM_SIZE else "looped"
    if plan == "looped":
        chunk = next_power_of_2(max_row) if max_row is not None else _CHUNK
        return _Plan("looped", 1, max(chunk, next_power_of_2(cdiv(n_cols, _MAX_CHUNKS))), _LOOPED_WARPS)
    row_bytes = n_cols * elem_size
    if plan == "persistent":
        chunk = next_power_of_2(max_row) if max_row is not None else _PERSISTENT_CHUNK_BYTES // elem_size
        return _Plan(plan, 1, chunk, _PERSISTENT_WARPS, group=1, per_sm=1)
    slice_bytes = next_power_of_2(max(_SPLIT_SLICE_BYTES, cdiv(row_bytes, _MAX_SPLIT_GROUP)))
    hold = max_row is None and elem_size >= _SPLIT_HOLD_MIN_ELEM_SIZE and slice_bytes <= _SPLIT_HOLD_MAX_BYTES
    if max_row is not None:
        chunk, warps, per_sm = next_power_of_2(max_row), _SPLIT_WARPS, _SPLIT_PER_SM
    elif hold:
        chunk = slice_bytes // elem_size
        warps = warps_for(chunk)
        per_sm = max(1, 16 // warps)
    else:
        chunk, warps, per_sm = _SPLIT_CHUNK_BYTES // elem_size, _SPLIT_WARPS, _SPLIT_PER_SM
    group = split_group(n_cols, chunk, min(_MAX_SPLIT_GROUP, cdiv(row_bytes, slice_bytes)))[0]
    if group > 1 and interpreting():
        if wide == "split":
            raise ValueError("the split plan waits on other programs: it cannot run under the interpreter")
        group = 1
    return _Plan(plan, 1, chunk, warps, group=group, per_sm=per_sm)


def _phase_rows(n_cols: int, elem_size: int) -> bool:
    """Whether the forward ``rows`` plan reads unaligned rows as aligned vectors (``_ragged``)."""
    return n_cols >= _PHASED_ROWS_MIN_COLS and elem_size >= _PHASED_MIN_ELEM_SIZE


def _phased_bwd_pieces(n_cols: int, elem_size: int, t: Tuning | None = None) -> tuple[int, int, int] | None:
    """(BLOCK_N, BLOCK_T, BLOCK_U) of the phased backward for a contiguous (n_cols)-wide input, or None past what it
    holds: ``_PHASED_BWD_MAX_ROW`` lanes, or a first piece of that many and a tail of ``_PHASED_BWD_MAX_TAIL``."""
    aligned = _aligned_16bit_bwd_pieces(n_cols, elem_size, t)
    if aligned is not None:
        return aligned
    vec = max(1, 16 // elem_size)
    need = ragged_width(n_cols, elem_size)
    block_n, block_t, _ = row_pieces(need, vec, _PHASED_BWD_PIECES, _PIECE_SLACK)
    pieces = n_cols % 16 != 0 or (elem_size >= 4 and n_cols < 4096)
    if elem_size < 4 and block_t > vec:  # 16-bit: only a one-vector tail (wider ones lost to edge words)
        pieces = False
    if (not pieces
            or next_power_of_2(need) - need < _PHASED_BWD_PIECE_WASTE * next_power_of_2(need)):
        block_n, block_t = next_power_of_2(need), 0
    if block_n > _PHASED_BWD_MAX_ROW or (block_n + block_t > _PHASED_BWD_MAX_ROW and block_t > _PHASED_BWD_MAX_TAIL):
        return None
    if block_t == vec == 8 and block_n <= _PHASED_BWD_TAIL_WORDS_MAX:
        # the one-vector tail read as words with the edges
        block_t = 0
    return block_n, block_t, 0


def _merge_pieces(block_n: int, block_t: int, warps: int, elem_size: int, block_u: int = 0) -> int:
    """``MERGE`` of the phased backward: its threads where the rows are 16-bit (fp32
    pieces lost: docs/kernels.md, "Aligned 16-bit rows in pieces") and a row in two pieces (or three) gives every
    thread lanes of each, at most one 16-byte vector of each (each piece a multiple of the threads), so that a thread's
    lanes are side by side, its sums move no data, and the pieces' row sums go through one block reduction instead of
    one each; else 0. (More than a vector a thread repeats the layout every vector: the reshape would go through shared
    memory, as it did in the forward.)"""
    threads = 32 * warps
    return threads if (elem_size == 2 and block_t >= threads and block_n % threads == 0
                       and block_t % threads == 0 and block_u % threads == 0 and block_n // threads <= 8) else 0


def _phased_ahead(block_u: int, warps: int, elem_size: int) -> bool:
    """``AHEAD`` of the phased backward: a 16-bit row's third piece of fewer than two
    lanes a thread (2-byte loads, which ``cp.async`` does not copy: synchronous in the pipelined loop, ``LDG.U16`` in
    the sm_90 SASS) loaded a row ahead into registers. Second pieces load the same way but keep it: with several
    programs an SM, or 64 registers, the row ahead lost (docs/kernels.md, "Aligned 16-bit rows in pieces")."""
    return elem_size == 2 and 0 < block_u < 2 * 32 * warps


def _full_first(block_n: int, block_t: int, n_cols: int, vec: int, prefetch: bool, ahead: bool) -> bool:
    """``FULL`` of the phased backward: aligned rows (``vec`` 1: every row at phase 0)
    held in pieces, whose first piece of ``block_n`` columns lies inside every row, take it without masks; not with a
    third piece a row ahead (``ahead``: ``_phased_ahead``), where it lost."""
    return (vec == 1 and block_t > 0 and n_cols > block_n and not prefetch
            and not ahead)


def _phased_bwd_warps(spread: int, elem_size: int) -> int:
    """Warps of the phased backward for ``spread`` lanes at ``_PHASED_BWD_VECTORS`` 16-byte vectors a thread (4..32)."""
    lanes = 32 * max(1, 16 // elem_size) * _PHASED_BWD_VECTORS[4 if elem_size >= 4 else 2]  # a warp's
    return max(4, min(32, next_power_of_2(cdiv(spread, lanes))))


def _tail_in_words(block_n: int, block_t: int, n_cols: int, vec: int) -> bool:
    """``TAIL`` of the phased backward: 16-bit rows read with their edges as words (``vec`` 8) held as
    one piece that stops short of the launch's width (``_phased_bwd_pieces`` turned a one-vector tail piece into
    words), so the words hold the row's last vector."""
    return vec == 8 and block_t == 0 and block_n < launch_width(n_cols, vec)


def _phased_pairs(block_n: int, block_t: int, tail: bool, elem_size: int) -> bool:
    """``PAIRS`` of the phased backward: rows of ``_PHASED_BWD_PAIRS_MIN_LANES`` or more, and where
    narrower 16-bit rows that take more than one reduction a row (a second piece, or a
    tail in words; ``MERGE``, where it applies, takes the row in one reduction of its own). fp32 pieces lost with it
    (docs/kernels.md, "Aligned 16-bit rows in pieces")."""
    return block_n + block_t >= _PHASED_BWD_PAIRS_MIN_LANES or (
        elem_size == 2 and (block_t > 0 or tail))


def _aligned_16bit_bwd_pieces(n_cols: int, elem_size: int, t: Tuning | None = None) -> tuple[int, int, int] | None:
    """The pieces (BLOCK_N, BLOCK_T, BLOCK_U) in which the phased backward holds a 16-bit aligned row, or None (one
    power of two): two in a band of ``phased_bwd_aligned_pieces_16bit`` (the second of at least
    ``_PHASED_BWD_ALIGNED_PIECE_MIN_LANES`` lanes), three in a band of ``phased_bwd_aligned_three_pieces_16bit``
    where all three merge on the first piece's warps (``_merge_pieces``: one reduction a row)."""
    t = t or DEFAULT_TUNING
    if elem_size >= 4 or n_cols % 16:
        return None
    if _in_any(t.phased_bwd_aligned_pieces_16bit, n_cols):
        block_n, block_t, _ = row_pieces(n_cols, 1, 2, _PIECE_SLACK)
        if block_t >= _PHASED_BWD_ALIGNED_PIECE_MIN_LANES and block_n + block_t <= _PHASED_BWD_MAX_ROW:
            return block_n, block_t, 0
    if _in_any(t.phased_bwd_aligned_three_pieces_16bit, n_cols):
        block_n, block_t, block_u = row_pieces(n_cols, 1, 3, 0.0)
        if (block_u > 0 and block_n + block_t + block_u <= _PHASED_BWD_MAX_ROW
                and _merge_pieces(block_n, block_t, _phased_bwd_warps(block_n, elem_size), elem_size, block_u)):
            return block_n, block_t, block_u
    return None


def _phased_backward(n_cols: int, elem_size: int, t: Tuning | None = None) -> bool:
    """Whether the backward's default plan for rows of ``n_cols`` is "phased" (dy in x's dtype): aligned rows held in
    three pieces too, outside the aligned bands."""
    t = t or DEFAULT_TUNING
    held = _phased_bwd_pieces(n_cols, elem_size, t)
    if held is None:
        return False
    if n_cols % 16 == 0:
        band = t.phased_bwd_aligned_16bit if elem_size < 4 else t.phased_bwd_aligned_fp32
        least = t.phased_bwd_aligned_min_cols
        return (least is not None and n_cols >= least) or _in(band, n_cols) or held[2] > 0
    least = t.phased_bwd_min_cols
    return least is not None and n_cols >= least and elem_size >= _PHASED_BWD_MIN_ELEM_SIZE


def _phased_backward_plan(n_rows: int, n_cols: int, elem_size: int, device: Device) -> _Plan:
    """The plan of ``_layer_norm_bwd_phased_kernel``: whole rows, a multiple of VEC programs walking rows,
    ``_PHASED_BWD_VECTORS`` vectors of x and dy a thread (up to 32 warps), capped at 64 registers
    (no spills in an sm_90 compile), as many programs as fill ``_PHASED_BWD_WARPS_PER_SM``. Aligned 16-bit
    rows in two pieces (``_aligned_16bit_bwd_pieces``): warps for the first piece, the register cap of
    ``_PHASED_BWD_ALIGNED_PIECE_MAX_REGS`` and the programs an SM that it lets fit."""
    vec = max(1, 16 // elem_size)
    t = _tuning(device)
    held = _phased_bwd_pieces(n_cols, elem_size, t)
    if held is None:
        raise ValueError(f"the phased backward holds whole rows up to {_PHASED_BWD_MAX_ROW} columns (and a tail of "
                         f"{_PHASED_BWD_MAX_TAIL} past them), not {n_cols}")
    block_n, block_t, block_u = held
    aligned_pieces = _aligned_16bit_bwd_pieces(n_cols, elem_size, t) is not None
    first_only = aligned_pieces
    warps = _phased_bwd_warps(block_n if first_only else block_n + block_t, elem_size)
    per_sm = max(1, _PHASED_BWD_WARPS_PER_SM // warps)
    max_regs = _PHASED_MAX_REGS
    if aligned_pieces:  # the cap for the later pieces' width, and the programs an SM that it lets fit
        max_regs = next(cap for widest, cap in _PHASED_BWD_ALIGNED_PIECE_MAX_REGS if block_t + block_u <= widest)
        per_sm = max(1, min(per_sm, device.regs_per_sm // (warps * 32 * max_regs)))
    elif _tail_in_words(block_n, block_t, n_cols, 1 if n_cols % 16 == 0 else vec) and t.phased_bwd_tail_max_regs:
        # the row's power of two and its tail in words (TAIL): a cap of their own, as the register file allows
        max_regs = max(max_regs, min(t.phased_bwd_tail_max_regs, device.regs_per_sm // (warps * 32) // 8 * 8))
        per_sm = max(1, min(per_sm, device.regs_per_sm // (warps * 32 * max_regs)))
    stages = _PHASED_BWD_STAGES
    if stages > 1:  # x and dy, stages - 1 rows each, in shared memory
        held_bytes = (stages - 1) * (block_n + block_t + block_u) * elem_size * 2
        per_sm = max(1, min(per_sm, min(_PHASED_BWD_SMEM_BYTES, device.smem_per_sm) // held_bytes))
    n_groups = min(device.sms * per_sm, n_rows)
    if n_cols % vec:  # rows at several phases: a multiple of vec programs, rounded down (one more than the
        n_groups = max(vec, n_groups // vec * vec)  # SMs hold runs its whole share after the rest: bf16 8192 45% -> 78%)
    return _Plan("rows", 1, block_n, warps, n_groups, "phased", max_regs, prefetch=False,
                 stages=stages, block_t=block_t, block_u=block_u)


def _flat_shape(n_cols: int) -> tuple[int, int, int, int]:
    """(P, K, R, S) of the flat backward for rows of ``n_cols``: segments of P lanes (the widest power of two up
    to ``_FLAT_BWD_SEGMENT`` that divides the row), K of them a row, R rows a window, S segments a tile (a power
    of two, at most ``_FLAT_BWD_TILE`` lanes and ``_FLAT_BWD_MAX_SEGMENTS`` segments). The tile is
    ``_FLAT_BWD_SMALL_TILE`` lanes instead where that holds as large a share of its lanes in use and two rows or
    more. ValueError where one row does not fit."""
    tile, small, segments = _FLAT_BWD_TILE, _FLAT_BWD_SMALL_TILE, _FLAT_BWD_MAX_SEGMENTS
    seg = min(_FLAT_BWD_SEGMENT, n_cols & -n_cols)
    k = n_cols // seg
    most = min(tile // seg, segments)
    if k > most:
        raise ValueError(f"the flat plan holds rows of up to {most} segments of {seg} lanes, not {n_cols} columns")
    r = most // k
    if small and small < tile:
        few = min(small // seg, segments)
        r_small = few // k
        if r_small >= 2 and r_small * k * next_power_of_2(r * k) >= r * k * next_power_of_2(r_small * k):
            r = r_small
    return seg, k, r, next_power_of_2(r * k)


def _flat_backward(n_cols: int, elem_size: int, t: Tuning | None = None) -> bool:
    """Whether the backward's default plan for aligned rows of ``n_cols`` is "flat": 16-bit rows in
    ``flat_bwd_16bit``, a multiple of ``_FLAT_BWD_SEGMENT`` columns, whose tile uses ``_FLAT_BWD_MIN_GAIN`` more
    of its lanes than the plan it replaces (the phased kernel's whole row; its pieces, or the rows plan, as the row's
    power of two), or in ``flat_bwd_also``."""
    t = t or DEFAULT_TUNING
    if elem_size != 2 or n_cols % _FLAT_BWD_SEGMENT or not _in(t.flat_bwd_16bit, n_cols):
        return False
    try:
        _, k, r, segments = _flat_shape(n_cols)
    except ValueError:
        return False
    if n_cols in t.flat_bwd_also:
        return True
    held = _phased_bwd_pieces(n_cols, elem_size, t) if _phased_backward(n_cols, elem_size, t) else None
    lanes = held[0] if held and not held[1] else next_power_of_2(n_cols)
    return r * k / segments >= n_cols / lanes + _FLAT_BWD_MIN_GAIN


def _flat_backward_plan(n_rows: int, n_cols: int, elem_size: int, device: Device) -> _Plan:
    """The plan of ``_layer_norm_bwd_flat_kernel`` (``_flat_shape``): block_m R rows a window, block_n P lanes a
    segment, warps for one 16-byte vector a thread (up to 32), as many programs an SM as 32 warps hold."""
    seg, _, r, segments = _flat_shape(n_cols)
    vec = max(1, 16 // elem_size)
    warps = max(1, min(32, next_power_of_2(cdiv(segments * seg, 32 * vec))))
    n_groups = max(1, min(device.sms * max(1, 32 // warps), cdiv(n_rows, r)))
    return _Plan("rows", r, seg, warps, n_groups, "flat", _FLAT_BWD_MAX_REGS, stages=_FLAT_BWD_STAGES)


def _packed_rows(n_cols: int, t: Tuning | None = None) -> bool:
    """Whether unaligned rows of ``n_cols`` that lie packed take the rows plan with a compile-time width
    (``NARROW``) instead of the forward's walk or the phased backward: in ``packed_rows_band``, a multiple of
    ``_PACKED_ROWS_MULTIPLE`` and at most ``_PACKED_N_MAX``."""
    band = (t or DEFAULT_TUNING).packed_rows_band
    return (band is not None and band[0] <= n_cols <= min(band[1], _PACKED_N_MAX) and n_cols % 16 != 0
            and n_cols % _PACKED_ROWS_MULTIPLE == 0)


def _narrow_packed(n_cols: int, t: Tuning | None = None) -> bool:
    """Whether rows of ``n_cols`` lie under ``packed_rows_band`` with N a multiple of ``_PACKED_ROWS_MULTIPLE``: there
    the rows plan at a compile-time width loads 8- or 16-byte vectors (16-bit 1000: 97% of copy forward, 77% backward)
    and the held plans, measured at odd widths only, do not take them."""
    band = (t or DEFAULT_TUNING).packed_rows_band
    return band is not None and n_cols < band[0] and n_cols % _PACKED_ROWS_MULTIPLE == 0


def _in_bands(bands: tuple, n_cols: int, elem_size: int) -> bool:
    """Whether ``n_cols`` lies in one of the inclusive ranges ``bands`` holds for ``elem_size`` (4: fp32, 2: 16-bit)."""
    return _in_any(_sized(bands, elem_size), n_cols)


def _sized(pairs: tuple, elem_size: int):
    """The value a tuned choice by element size (pairs (2 or 4, value)) holds for ``elem_size``, or None."""
    return dict(pairs).get(4 if elem_size >= 4 else 2)


def _in(band: tuple | None, n: int) -> bool:
    return band is not None and band[0] <= n <= band[1]


def _in_any(bands: tuple | None, n: int) -> bool:
    return any(lo <= n <= hi for lo, hi in bands or ())


def _walk_forward(n_cols: int, elem_size: int, t: Tuning | None = None) -> bool:
    """Whether the forward's default plan for contiguous rows of ``n_cols`` is "walk" (``walk_fwd_bands``
    for unaligned rows, ``walk_fwd_aligned`` for aligned ones)."""
    aligned = n_cols % 16 == 0
    t = t or DEFAULT_TUNING
    if not _in_bands(t.walk_fwd_aligned if aligned else t.walk_fwd_bands, n_cols, elem_size):
        return False
    pieces, _ = _walk_pieces(n_cols, elem_size, 1 if aligned else max(1, 16 // elem_size))
    return sum(pieces) <= _WALK_FWD_MAX_LANES


def _looped_forward(n_cols: int, elem_size: int, t: Tuning | None = None) -> bool:
    """Whether the forward's default plan for contiguous rows of ``n_cols`` is the chunked "looped" one
    (aligned rows in a band of ``looped_fwd_bands``)."""
    return n_cols % 16 == 0 and _in_bands((t or DEFAULT_TUNING).looped_fwd_bands, n_cols, elem_size)


def _looped_forward_plan(n_rows: int, n_cols: int, elem_size: int, device: Device) -> _Plan:
    """``_layer_norm_fwd_looped_kernel`` on a persistent grid for aligned rows of ``n_cols``: the widest
    chunk of at most ``_LOOPED_FWD_CHUNK_BYTES`` whose last one masks at most ``_LOOPED_FWD_WASTE`` of the
    row, warps for one 16-byte vector of x a thread a chunk, ``_LOOPED_FWD_WARPS_PER_SM`` warps an SM."""
    per_vector = 16 // elem_size
    chunk = next_power_of_2(max(1, _LOOPED_FWD_CHUNK_BYTES // elem_size))
    smallest = 32 * per_vector  # one warp
    while chunk > smallest and cdiv(n_cols, chunk) * chunk - n_cols > _LOOPED_FWD_WASTE * n_cols:
        chunk //= 2
    chunk = max(chunk, smallest)
    warps = max(1, min(16, chunk // smallest))
    per_sm = max(1, _LOOPED_FWD_WARPS_PER_SM // warps)
    return _Plan("looped", 1, chunk, warps, n_groups=max(1, min(n_rows, per_sm * device.sms)), per_sm=per_sm,
                 stages=_LOOPED_FWD_STAGES)


def _walk_pieces(n_cols: int, elem_size: int, vec: int) -> tuple[tuple[int, int, int], int]:
    """((BLOCK_N, BLOCK_T, BLOCK_U), TAIL) of the forward walk for rows read ``vec`` elements a vector.

    16-bit unaligned rows (edges read as words): the pieces cover all but the last vector the widest
    phase reaches, which goes as words (``TAIL`` 1), or a last piece under ``_WALK_FWD_MIN_PIECE`` lanes
    does (up to ``_WALK_FWD_MAX_TAIL`` vectors). Other rows: pieces covering every phase, no words."""
    if not (vec == 8 and elem_size == 2):
        return row_pieces(launch_width(n_cols, vec), vec, _WALK_FWD_PIECES, _PIECE_SLACK), 0
    reach = cdiv(n_cols + vec - 1, vec) * vec  # the end of the last vector of the widest phase
    pieces = row_pieces(max(vec, reach - vec), vec, _WALK_FWD_PIECES, _PIECE_SLACK)
    last = max(i for i in range(3) if pieces[i])
    if last > 0 and pieces[last] < _WALK_FWD_MIN_PIECE:
        rest = next_power_of_2(cdiv(reach - sum(pieces[:last]), vec))
        if rest <= _WALK_FWD_MAX_TAIL:
            return tuple(p if i < last else 0 for i, p in enumerate(pieces)), rest
    return pieces, 1


def _walk_forward_plan(n_rows: int, n_cols: int, elem_size: int, vec: int, device: Device) -> _Plan:
    """The plan of ``_layer_norm_fwd_walk_kernel`` for rows read ``vec`` elements a vector (1: aligned): the
    pieces (``_walk_pieces``), warps for ``_WALK_FWD_ELEMS`` elements a thread (fewer where a piece would
    get under ``_WALK_FWD_MIN_PIECE_BYTES`` a thread, never over ``_WALK_FWD_MAX_ELEMS``; fp32 only where the
    fewest reach the bytes: ``_WALK_FWD_HALVE_UNREACHED``), as many
    programs as fill ``_WALK_FWD_WARPS_PER_SM`` warps, their registers (64; 80 where a thread holds 16
    elements of the first piece) and the shared memory of ``_WALK_FWD_STAGES - 1`` rows in flight."""
    pieces, tail = _walk_pieces(n_cols, elem_size, vec)
    lanes = sum(pieces)
    warps = max(4, min(32, next_power_of_2(cdiv(lanes, 32 * _WALK_FWD_ELEMS[4 if elem_size >= 4 else 2]))))
    # pieces too narrow to reach the bytes even at 4 warps (a one-vector tail) are left out of the rule
    narrowest = min((p for p in pieces if p * elem_size >= _WALK_FWD_MIN_PIECE_BYTES * 128), default=pieces[0])
    fewest = max(4, min(32, pieces[0] // (32 * _WALK_FWD_MAX_ELEMS)))
    reached = narrowest * elem_size >= _WALK_FWD_MIN_PIECE_BYTES * 32 * fewest
    if reached or _WALK_FWD_HALVE_UNREACHED[4 if elem_size >= 4 else 2]:
        while warps > fewest and narrowest * elem_size < _WALK_FWD_MIN_PIECE_BYTES * 32 * warps:
            warps //= 2
    max_regs = _WALK_FWD_MAX_REGS_16 if warps <= 16 and pieces[0] >= 16 * 32 * warps else _WALK_FWD_MAX_REGS
    per_sm = max(1, min(_WALK_FWD_WARPS_PER_SM // warps, device.regs_per_sm // (max_regs * 32 * warps)))
    stages = _WALK_FWD_STAGES
    if stages > 1:
        smem = min(_PHASED_BWD_SMEM_BYTES, device.smem_per_sm)
        per_sm = max(1, min(per_sm, smem // ((stages - 1) * lanes * elem_size)))
    n_groups = min(device.sms * per_sm, n_rows)
    if vec > 1:  # one phase a program: a multiple of vec programs, rounded down (as the phased backward)
        n_groups = max(vec, n_groups // vec * vec)
    return _Plan("walk", 1, pieces[0], warps, n_groups, max_regs=max_regs, stages=stages,
                 block_t=pieces[1], block_u=pieces[2], tail=tail)


def _lean_backward_plan(
    n_rows: int, n_cols: int, elem_size: int, device: Device, max_row: int | None, one_pass: bool | None
) -> _Plan:
    """The plan of ``_layer_norm_bwd_lean_kernel``: one 16-byte vector per tensor a thread."""
    vector = 16 // elem_size
    size = 4 if elem_size >= 4 else 2
    widest = max_row if max_row is not None else _LEAN_MAX_ROW
    if n_cols <= widest:
        mode, block_n, n_chunks = "rows", next_power_of_2(n_cols), 1
        max_regs = _LEAN_MAX_REGS[("rows", size)]
    else:
        block_n = next_power_of_2(max_row) if max_row is not None else _LEAN_CHUNK
        block_n = max(block_n, next_power_of_2(cdiv(n_cols, _MAX_CHUNKS)))
        n_chunks = cdiv(n_cols, block_n)
        if one_pass and interpreting():
            raise ValueError("the one-pass chunked plan waits on other programs: it cannot run under the interpreter")
        if one_pass is None:
            one_pass = not interpreting() and n_chunks <= _MAX_ONE_PASS_CHUNKS
        mode = "one_pass" if one_pass else "two_pass"
        max_regs = _LEAN_MAX_REGS[("chunks", size)]
    warps = max(1, min(_LEAN_MAX_WARPS[size], block_n // (32 * vector)))
    resident = max(1, min(device.warps_per_sm // warps, device.regs_per_sm // (max_regs * 32 * warps)))
    n_groups = max(1, min(n_rows, (device.sms * resident) // n_chunks))
    return _Plan(mode, 1, block_n, warps, n_groups, "lean", max_regs)


# --------------------------------------------------------------------------- launchers


def _row_pieces(n_cols: int, vec: int, max_pieces: int | None = None, packed: bool = False,
                elem_size: int = 2) -> tuple[int, int, int]:
    """(BLOCK_N, BLOCK_T, BLOCK_U) of the forward rows kernel (``_ragged.row_pieces``): pieces covering
    every phase of the row (N + VEC - 1 virtual columns). H200 sweep (docs/kernels.md, "layer_norm:
    forward"): unaligned rows gain from them at every width (fp32 4097 51 -> 80% of copy with the
    vector-masked body), three pieces best (12345: 63 vs 51% on two); aligned rows (N a multiple of 16)
    lost up to 32 points in pieces (bf16 768-6144, 11008-13824) and gained nowhere for sure, so they
    keep their own power of two unless it masks ``_PIECE_WASTE_ALIGNED`` of the lanes. Rows under
    ``_PIECES_MIN_COLS``: one piece. ``packed`` (a compile-time width, ``NARROW``): as aligned rows.
    Aligned rows whose power of two is at most ``_SLIVER_MAX_SINGLE[elem_size]`` take it
    whole, unless the pieces past the first hold at most 1/``_SLIVER[elem_size]`` of its lanes and the rows are 16-bit
    (1028 = 1024 + 8, 2064 = 2048 + 16) or fp32 on a block of ``_SLIVER_FP32_MIN_SINGLE`` (4160 = 4096 + 64)."""
    pieces = _ROW_PIECES if max_pieces is None else max_pieces
    need = launch_width(n_cols, vec)
    single = next_power_of_2(need)
    aligned = n_cols % 16 == 0 or packed
    if n_cols < _PIECES_MIN_COLS or (aligned and single - need < _PIECE_WASTE_ALIGNED * single):
        pieces = 1
    split = row_pieces(need, vec, pieces, _PIECE_SLACK)
    key = 4 if elem_size >= 4 else 2
    sliver = ((key == 2 or single >= _SLIVER_FP32_MIN_SINGLE) and split[1] + split[2] <= split[0] // _SLIVER[key])
    if aligned and split[1] and single <= _SLIVER_MAX_SINGLE[key] and not sliver:
        return single, 0, 0
    return split


def _aligned_16bit_pieces(n_cols: int, t: Tuning | None = None) -> tuple[int, int, int] | None:
    """Two pieces for a 16-bit aligned row in ``aligned_pieces_16bit``, where the second has at least
    ``_ALIGNED_PIECE_MIN_LANES`` lanes (5120 = 4096 + 1024, 5632 and 6144 = 4096 + 2048), else None."""
    if not _in((t or DEFAULT_TUNING).aligned_pieces_16bit, n_cols):
        return None
    pieces = row_pieces(n_cols, 1, 2, _PIECE_SLACK)
    return pieces if pieces[1] >= _ALIGNED_PIECE_MIN_LANES else None


def _forward_launch(x2, weight, bias, y2, mean, rstd, eps: float, plan: _Plan) -> None:
    n_rows, n_cols = x2.shape
    if plan.mode == "looped" or (plan.mode == "rows" and not _phase_rows(n_cols, x2.element_size())):
        r = Phased.plain(x2, y2)  # Triton's own (scalar, for unaligned rows) accesses
    else:
        r = phased(x2, y2)
    if plan.mode == "rows":
        t = _tuning(_device.of(x2.device))
        block_n = max(plan.block_n, next_power_of_2(launch_width(n_cols, r.vec)))
        narrow = r.packed_width(n_cols, _PACKED_N_MAX)
        pieces = (_row_pieces(n_cols, r.vec, packed=narrow > 0, elem_size=x2.element_size())
                  if block_n == next_power_of_2(launch_width(n_cols, r.vec))
                  else (block_n, 0, 0))
        cap = plan if r.vec > 1 else plan._replace(max_regs=None)
        joint = packed = False
        if r.vec == 1 and x2.element_size() == 2 and block_n == next_power_of_2(n_cols):
            split = _aligned_16bit_pieces(n_cols, t)
            if split is not None:  # two pieces, their statistics in one reduction each, 64 registers
                pieces, joint, cap = split, True, plan._replace(max_regs=_ALIGNED_PIECES_MAX_REGS)
                packed = True
            else:
                joint = pieces[1] == 0 and _joint_tile(n_cols, x2.dtype, t)
                packed = joint
        warps = plan.num_warps
        if pieces[1] and not _block_warps(pieces, r.vec, joint, t):
            # the plan's elements a thread over the pieces' lanes (4096 + 4: half the warps of 8192)
            warps = max(4, plan.num_warps * (1 << (sum(pieces).bit_length() - 1)) // block_n)
        launch_kernel(_layer_norm_fwd_kernel, (cdiv(n_rows, plan.block_m),),
            r.x, weight, bias, r.y, mean, rstd, r.phase, n_rows, n_cols, r.stride_x, r.stride_y, eps,
            BLOCK_M=plan.block_m, BLOCK_N=pieces[0], BLOCK_T=pieces[1], BLOCK_U=pieces[2], VEC=r.vec,
            JOINT=joint, PACKED=packed, NARROW=narrow,
            PARAMS_FIRST=_params_first(n_cols, pieces, x2.element_size(), r.vec, t),
            WIDEN=r.vec == 1 and _rows_widen(x2, n_cols, t), num_warps=warps, **_reg_cap(cap),
        )
    elif plan.mode == "walk":
        _forward_launch_walk(x2, weight, bias, y2, mean, rstd, eps, plan)
        return
    elif plan.mode == "looped":  # a program a row, or (per_sm) a persistent grid of n_groups programs
        launch_kernel(_layer_norm_fwd_looped_kernel, (plan.n_groups if plan.per_sm else n_rows,),
            x2, weight, bias, y2, mean, rstd, n_cols, x2.stride(0), y2.stride(0), eps, n_rows,
            BLOCK_N=plan.block_n, STAGES=plan.stages, num_warps=plan.num_warps,
        )
    else:
        _forward_launch_split(r, weight, bias, mean, rstd, n_rows, n_cols, eps, plan)
    r.finish()



def _block_warps(pieces: tuple, vec: int, joint: bool, t: Tuning | None = None) -> bool:
    """Whether aligned rows in pieces (``vec`` 1, not JOINT) keep the warps of their whole block instead of those of
    their first piece: pieces past the first whose lanes lie in ``aligned_pieces_block_warps_tails``."""
    if vec != 1 or joint or not pieces[1]:
        return False
    return _in((t or DEFAULT_TUNING).aligned_pieces_block_warps_tails, pieces[1] + pieces[2])


def _params_first(n_cols: int, pieces: tuple, elem_size: int, vec: int, t: Tuning | None = None) -> bool:
    """Whether a forward rows program loads weight and bias before x (``fwd_params_first_min_cols``): fp32 rows of a
    multiple of 16 columns on one piece (``pieces`` (BLOCK_N, 0, 0), ``vec`` 1) from that width that fill
    ``_FWD_PARAMS_FIRST_LANE_USE`` of their block, ``_FWD_PARAMS_FIRST_WIDE_LANE_USE`` of one wider than
    ``_FWD_PARAMS_FIRST_MAX_MASKED_BLOCK`` lanes."""
    block_n, least = pieces[0], (t or DEFAULT_TUNING).fwd_params_first_min_cols
    if elem_size < 4 or vec != 1 or n_cols % 16 or pieces[1] or least is None:
        return False
    wide = block_n > _FWD_PARAMS_FIRST_MAX_MASKED_BLOCK
    use = _FWD_PARAMS_FIRST_WIDE_LANE_USE if wide else _FWD_PARAMS_FIRST_LANE_USE
    return n_cols >= least and n_cols >= use * block_n


def _forward_rows_tile(n_cols: int, elem_size: int, packed: bool = False, t: Tuning | None = None) -> int:
    """Elements a forward rows program holds (rows of the tile times its lanes): ``_MASKED_ROWS_TILE`` for
    16-bit rows of a multiple of ``_MASKED_ROWS_MULTIPLE`` columns (``_MASKED_ROWS_PACKED_MULTIPLE`` where they
    lie ``packed``) in ``masked_rows_16bit`` that mask lanes, else ``_ROWS_TILE``."""
    band = (t or DEFAULT_TUNING).masked_rows_16bit
    masked = n_cols != next_power_of_2(n_cols)
    aligned = n_cols % _MASKED_ROWS_MULTIPLE == 0 or (packed and _MASKED_ROWS_PACKED_MULTIPLE > 0
                                                        and n_cols % _MASKED_ROWS_PACKED_MULTIPLE == 0)
    return _MASKED_ROWS_TILE if elem_size == 2 and aligned and masked and _in(band, n_cols) else _ROWS_TILE


def _joint_tile(n_cols: int, dtype: torch.dtype, t: Tuning | None = None) -> bool:
    """Whether an aligned 16-bit row held on one tile takes JOINT statistics (and PACKED x): from
    ``joint_16bit_min_cols``, fp16 from ``joint_fp16_min_cols`` (docs/kernels.md, "Aligned 16-bit rows")."""
    t = t or DEFAULT_TUNING
    least = t.joint_fp16_min_cols if dtype == torch.float16 else t.joint_16bit_min_cols
    return least is not None and n_cols >= least


def _forward_launch_walk(x2, weight, bias, y2, mean, rstd, eps: float, plan: _Plan) -> None:
    n_rows, n_cols = x2.shape
    r = phased_rows((x2,), (y2,))
    words = r.vec == 8
    tail = plan.tail if words else 0
    # the columns the kernel must hold: every phase's row (with words: up to the end of its last vector)
    need = cdiv(n_cols + r.vec - 1, r.vec) * r.vec if words else launch_width(n_cols, r.vec)
    if (words and tail == 0) or plan.block_n + plan.block_t + plan.block_u + tail * r.vec < need:
        plan = _walk_forward_plan(n_rows, n_cols, x2.element_size(), r.vec, _device.of(x2.device))  # other phases
        tail = plan.tail if words else 0
    if r.vec > 1:  # every row of a program at one phase (as the phased backward)
        plan = plan._replace(n_groups=max(r.vec, plan.n_groups // r.vec * r.vec))
    launch_kernel(_layer_norm_fwd_walk_kernel, (plan.n_groups,),
        *r.reads, weight, bias, *r.writes, mean, rstd, r.phase, n_rows, n_cols, *r.read_strides, *r.write_strides,
        eps, plan.n_groups, BLOCK_N=plan.block_n, BLOCK_T=plan.block_t, BLOCK_U=plan.block_u, VEC=r.vec,
        STAGES=plan.stages, TAIL=tail, num_warps=plan.num_warps, **_reg_cap(plan),
    )
    r.finish()


def _forward_launch_split(r: Phased, weight, bias, mean, rstd, n_rows: int, n_cols: int, eps: float, plan: _Plan) -> None:
    group, slice_cols = split_group(launch_width(n_cols, r.vec), plan.block_n, plan.group)
    early = group == 1 and slice_cols == plan.block_n
    split_run(
        _layer_norm_fwd_split_kernel,
        lambda part, sync, n_programs: (
            r.x, weight, bias, r.y, mean, rstd, part, sync, r.phase, n_rows, n_cols, r.stride_x, r.stride_y,
            slice_cols, n_programs, eps),
        n_rows, group, plan.per_sm, r.x.device, mean,
        GROUP=group, BLOCK_N=plan.block_n, BLOCK_G=next_power_of_2(group),
        SUB=max(1, min(plan.block_n, 16 // r.x.element_size())), HOLD=slice_cols == plan.block_n,
        EARLY=early, VEC=r.vec, RECENTRE=float(_SPLIT_RECENTRE or 0.0) if early else 0.0, num_warps=plan.num_warps,
    )


def _backward_launch(dy2, x2, weight, mean, rstd, dx2, dw, db, plan: _Plan) -> None:
    n_rows, n_cols = x2.shape
    if plan.variant == "phased":
        _backward_launch_phased(dy2, x2, weight, mean, rstd, dx2, dw, db, plan)
        return
    if plan.variant == "flat":
        _backward_launch_flat(dy2, x2, weight, mean, rstd, dx2, dw, db, plan)
        return
    n_chunks = cdiv(n_cols, plan.block_n)
    n_row_blocks = cdiv(n_rows, plan.block_m)
    rows_per_group = cdiv(n_row_blocks, plan.n_groups) * plan.block_m
    n_groups = cdiv(n_rows, rows_per_group)
    dw_part, db_part = float32_pair(n_groups, n_cols, x2.device)
    common = dict(BLOCK_M=plan.block_m, BLOCK_N=plan.block_n, num_warps=plan.num_warps)
    grid = (n_groups * n_chunks,)
    tensors = (x2, dy2, weight, mean, rstd, dx2, dw_part, db_part)
    scalars = (n_rows, n_cols, x2.stride(0), dy2.stride(0), dx2.stride(0), rows_per_group, n_chunks)
    if plan.variant == "lean":
        kernel = _layer_norm_bwd_lean_kernel
        common = dict(BLOCK_N=plan.block_n, num_warps=plan.num_warps)
        if plan.max_regs is not None and not interpreting():
            common["maxnreg"] = plan.max_regs
    else:
        kernel = _layer_norm_bwd_kernel
        if plan.mode == "rows":
            common["PREFETCH"] = plan.prefetch
            common["NARROW"] = _packed_width(x2, dy2, dx2)
    if plan.mode == "rows":
        launch_kernel(kernel, grid, *tensors, x2, x2, *scalars, MODE=_ROWS, BLOCK_C=1, **common)
    else:
        part = torch.empty((n_rows, 2, n_chunks), dtype=torch.float32, device=x2.device)
        block_c = next_power_of_2(n_chunks)
        if plan.mode == "one_pass":
            count = torch.zeros((n_row_blocks + 1) * COUNTER_STRIDE_INTS, dtype=torch.int32, device=x2.device)
            launch_kernel(kernel, grid, *tensors, part, count, *scalars, MODE=_ONE_PASS, BLOCK_C=block_c, **common)
        else:
            launch_kernel(kernel, grid, *tensors, part, part, *scalars, MODE=_STATS, BLOCK_C=block_c, **common)
            launch_kernel(kernel, grid, *tensors, part, part, *scalars, MODE=_FROM_STATS, BLOCK_C=block_c, **common)
    _sum_shares(dw_part, db_part, dw, db)


def _backward_launch_phased(dy2, x2, weight, mean, rstd, dx2, dw, db, plan: _Plan) -> None:
    n_rows, n_cols = x2.shape
    r = phased_rows((x2, dy2), (dx2,))
    # every row of a program at one phase: a multiple of r.vec programs (rounded down; the plan's
    # count already is one where rows of its width start at several phases)
    n_groups = max(r.vec, plan.n_groups // r.vec * r.vec)
    need = launch_width(n_cols, r.vec)
    words = r.vec == 8
    reach = cdiv(n_cols + r.vec - 1, r.vec) * r.vec  # with words: the last vector in them
    if plan.block_n + plan.block_t + plan.block_u >= need or (words and plan.block_t == 0 and plan.block_n + r.vec >= reach):
        block_n, block_t, block_u = plan.block_n, plan.block_t, plan.block_u
    else:  # planned for other phases than these rows have
        block_n, block_t, block_u = next_power_of_2(need), 0, 0
    tail = _tail_in_words(block_n, block_t, n_cols, r.vec)
    ahead = _phased_ahead(block_u, plan.num_warps, x2.element_size())
    dw_part, db_part = float32_pair(n_groups, n_cols, x2.device)
    launch_kernel(_layer_norm_bwd_phased_kernel, (n_groups,),
        *r.reads, weight, mean, rstd, *r.writes, dw_part, db_part, r.phase, n_rows, n_cols, *r.read_strides,
        *r.write_strides, n_groups,
        BLOCK_N=block_n, VEC=r.vec, PREFETCH=plan.prefetch, STAGES=plan.stages, BLOCK_T=block_t,
        EDGE_WORDS=block_t == 0, TAIL=tail, PAIRS=_phased_pairs(block_n, block_t, tail, x2.element_size()),
        MERGE=_merge_pieces(block_n, block_t, plan.num_warps, x2.element_size(), block_u), BLOCK_U=block_u,
        AHEAD=ahead, FULL=_full_first(block_n, block_t, n_cols, r.vec, plan.prefetch, ahead),
        num_warps=plan.num_warps, **_reg_cap(plan),
    )
    r.finish()
    _sum_shares(dw_part, db_part, dw, db)


def _share_rows(plan: _Plan) -> int:
    """The float32 dweight/dbias share rows a backward plan writes (and ``_sum_shares`` re-reads): one a program,
    R a program of the flat plan (one a row of its window)."""
    return plan.n_groups * (plan.block_m if plan.variant == "flat" else 1)


def _backward_share_rows(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> int:
    """The float32 dweight/dbias share rows ``backward`` writes for these tensors (and re-reads to sum them), whichever
    plan runs: the held plan's programs, else ``_share_rows`` of the planned launch. What the byte budget's slack for
    the shares is computed from (tests/test_ref_dogfood.py)."""
    x2, dy2 = as_rows(x), as_rows(dy)
    if _held_backward(dy2, x2, weight.contiguous(), x2, _tuning(_device.of(x.device))):  # a fresh dx is packed wherever x is
        return _layer_norm_held.backward_programs(x2, weight, _device.of(x.device).sms)
    plan = _layer_norm_settings(*x2.shape, x.element_size(), backward=True, device=_device.of(x.device),
                                phased_ok=dy.dtype == x.dtype, flat_ok=_flat_layout(x2, dy2),
                                packed=_packed_width(x2, dy2) > 0)
    return _share_rows(plan)


def _flat_layout(*tensors: torch.Tensor) -> bool:
    """Whether each (M, N) tensor's rows lie back to back from a 16-byte aligned address (the flat backward's)."""
    return all(t.is_contiguous() and t.data_ptr() % VECTOR_BYTES == 0 for t in tensors)


def _flat_stages(plan: _Plan, n_cols: int, dtype: torch.dtype) -> int:
    """The flat backward's pipelining depth: the plan's, or ``_FLAT_BWD_STAGES_WIDE`` for windows on the
    ``_FLAT_BWD_TILE``-lane tile that are fp16 or mask no segment (the dtype is the launch's; the plan knows only
    the element size)."""
    segments = plan.block_m * n_cols // plan.block_n  # in use; the tile holds their power of two
    wide = next_power_of_2(segments) * plan.block_n >= _FLAT_BWD_TILE
    full = segments == next_power_of_2(segments)
    if wide and (dtype == torch.float16 or full) and plan.stages == _FLAT_BWD_STAGES:
        return _FLAT_BWD_STAGES_WIDE
    return plan.stages


def _backward_launch_flat(dy2, x2, weight, mean, rstd, dx2, dw, db, plan: _Plan) -> None:
    n_rows, n_cols = x2.shape
    if not _flat_layout(x2, dy2, dx2):
        raise ValueError("the flat backward reads x, dy and dx as contiguous rows from 16-byte aligned addresses")
    seg, r = plan.block_n, plan.block_m
    k = n_cols // seg
    if k * seg != n_cols or seg & (seg - 1):
        raise ValueError(f"the flat backward's segments of {seg} lanes do not divide rows of {n_cols}")
    dw_part, db_part = float32_pair(_share_rows(plan), n_cols, x2.device)
    launch_kernel(_layer_norm_bwd_flat_kernel, (plan.n_groups,),
        x2, dy2, weight, mean, rstd, dx2, dw_part, db_part, n_rows, plan.n_groups,
        N=n_cols, P=seg, K=k, R=r, S=next_power_of_2(r * k), STAGES=_flat_stages(plan, n_cols, x2.dtype),
        num_warps=plan.num_warps,
        **_reg_cap(plan),
    )
    _sum_shares(dw_part, db_part, dw, db)


def _packed_width(*rows: torch.Tensor) -> int:
    """N where every (M, N) tensor's rows lie back to back (strides N), N is not a multiple of 16 elements and at
    most ``_PACKED_N_MAX``, else 0 (``_ragged.packed_width``): the rows backward's ``NARROW``, and what makes
    ``packed`` for the plans of both passes."""
    return packed_width(rows[0].shape[1], tuple(t.stride(0) for t in rows), _PACKED_N_MAX)


def _rows_widen(x: torch.Tensor, n_cols: int, t: Tuning | None = None) -> bool:
    """Whether the rows kernel widens ``x``'s rows of ``n_cols`` by ``_math.widen``: bf16 rows of a multiple of 16
    columns in ``rows_widen_bands``, on CUDA, not under the interpreter, which runs no PTX."""
    return (x.dtype == torch.bfloat16 and n_cols % 16 == 0 and x.is_cuda and not interpreting()
            and _in_any((t or DEFAULT_TUNING).rows_widen_bands, n_cols))


def _reg_cap(plan: _Plan) -> dict:
    """Launch options capping registers (``_Plan.max_regs``); none under the interpreter."""
    return {"maxnreg": plan.max_regs} if plan.max_regs and not interpreting() else {}


def _sum_shares(dw_part: torch.Tensor, db_part: torch.Tensor, dw: torch.Tensor, db: torch.Tensor) -> None:
    """dw, db = column sums of the (n_groups, N) shares, deterministically, in one or two launches."""
    n_groups, n_cols = dw_part.shape
    block_n = min(_DWDB_BLOCK_N, next_power_of_2(n_cols))
    col_blocks = cdiv(n_cols, block_n)
    if n_groups > _DWDB_GROUPS_PER_SPLIT:
        n_splits = cdiv(n_groups, _DWDB_GROUPS_PER_SPLIT)
        dw_mid, db_mid = float32_pair(n_splits, n_cols, dw_part.device)
        launch_kernel(_layer_norm_dwdb_kernel, (col_blocks, n_splits),
            dw_part, db_part, dw_mid, db_mid, n_groups, n_cols, _DWDB_GROUPS_PER_SPLIT,
            BLOCK_G=_DWDB_BLOCK_G, BLOCK_N=block_n, num_warps=4,
        )
        dw_part, db_part, n_groups = dw_mid, db_mid, n_splits
    launch_kernel(_layer_norm_dwdb_kernel, (col_blocks, 1),
        dw_part, db_part, dw, db, n_groups, n_cols, n_groups, BLOCK_G=_DWDB_BLOCK_G, BLOCK_N=block_n, num_warps=4
    )


# --------------------------------------------------------------------------- public functions


def _held_default(n_cols: int, elem_size: int, col_bytes: int | None = None, t: Tuning | None = None) -> bool:
    """Whether the forward takes the held plan for rows of ``n_cols`` where it can run (``held_fwd_min_cols``):
    widths that are not a multiple of 16, from the band's first width on; fp32 rows under
    ``_HELD_FWD_FP32_ALONE_MIN_COLS`` only where two programs an SM fit (``col_bytes``: shared memory a column, default
    the row's, the weight's and the bias's element alike); aligned rows in ``held_fwd_aligned_bands``."""
    t = t or DEFAULT_TUNING
    if n_cols % 16 == 0:
        return _in_aligned_band(t.held_fwd_aligned_bands, n_cols, elem_size)
    least = _sized(t.held_fwd_min_cols, elem_size)
    if least is None or n_cols < least or _packed_rows(n_cols, t) or _narrow_packed(n_cols, t):
        return False
    if n_cols % 2 == 0 and n_cols < _HELD_FWD_EVEN_MIN_COLS:
        return False
    if elem_size >= 4 and n_cols < _HELD_FWD_FP32_ALONE_MIN_COLS:
        return _layer_norm_held.fwd_shape(n_cols, elem_size, col_bytes or 3 * elem_size)[3] >= 2
    return True


def _held_forward(x2: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, y2: torch.Tensor,
                  t: Tuning | None = None) -> bool:
    """Whether this forward runs on ``_layer_norm_held``: the width's rule (``t``, default the tensors' device's), this
    machine, and tensors it takes."""
    t = _tuning(_device.of(x2.device)) if t is None else t
    return (_held_default(x2.shape[1], x2.element_size(), _layer_norm_held.col_bytes(x2, weight, bias), t)
            and _layer_norm_held.available() and _layer_norm_held.fits(x2, weight, bias, y2))


def _stream_band(n_cols: int, elem_size: int, t: Tuning | None = None) -> bool:
    """Whether rows of ``n_cols`` are streamed before the held plan is asked (``stream_fwd_bands``): N not a multiple
    of 16 inside a band of their element size, and not rows the packed rows plan takes (``_packed_rows``,
    ``_narrow_packed``, even rows under ``_HELD_FWD_EVEN_MIN_COLS`` but 16-bit ones on programs of at most
    ``_STREAM_FWD_EVEN_MAX_WARPS`` warps); 16-bit rows only where their streamed shape has at
    most ``_STREAM_FWD_16BIT_MOST`` segments and warps (the shape of parameters in x's dtype: the rule's, whatever the
    call's)."""
    t = t or DEFAULT_TUNING
    even = n_cols % 2 == 0 and n_cols < _HELD_FWD_EVEN_MIN_COLS  # the rows plan's 4-byte pairs, as for the held plan
    if (n_cols % 16 == 0 or not _in_bands(t.stream_fwd_bands, n_cols, elem_size) or _packed_rows(n_cols, t)
            or _narrow_packed(n_cols, t)):
        return False
    shape = _layer_norm_held.stream_shape(n_cols, elem_size, 2 * elem_size)  # the shape with parameters of x's dtype
    if even and (shape is None or elem_size >= 4 or shape.warps > (_STREAM_FWD_EVEN_MAX_WARPS or 0)):
        return False
    if shape is None or elem_size >= 4:
        return shape is not None
    most_segments, most_warps = _STREAM_FWD_16BIT_MOST
    return shape.nseg <= most_segments and shape.warps <= most_warps


def _stream_forward(x2: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, y2: torch.Tensor,
                    band: bool | None = None, t: Tuning | None = None) -> bool:
    """Whether this forward streams its rows past the held weight and bias: rows in ``_stream_band`` (``band``: its
    answer, where the caller has it), and rows from the width of their element size on (``stream_fwd_min_cols``; N a
    multiple of 16 from ``stream_fwd_aligned_min_cols``), on a machine that runs
    the held kernels, of tensors ``launch_stream`` takes."""
    t, n_cols = t or DEFAULT_TUNING, x2.shape[1]
    least = _sized(t.stream_fwd_aligned_min_cols if n_cols % 16 == 0 else t.stream_fwd_min_cols, x2.element_size())
    if band is None:
        band = _stream_band(n_cols, x2.element_size(), t)
    wanted = band or (least is not None and n_cols >= least)
    return wanted and _layer_norm_held.available() and _layer_norm_held.fits_stream(x2, weight, bias, y2)


def _in_aligned_band(bands: tuple, n_cols: int, elem_size: int) -> bool:
    """Whether aligned rows of ``n_cols`` (a multiple of 16) are held: inside one of the bands of their element size
    (inclusive), and not a power of two (whose tiles the other plans fill whole)."""
    return _in_bands(bands, n_cols, elem_size) and n_cols & (n_cols - 1) != 0


def _held_bwd_default(n_cols: int, elem_size: int, t: Tuning | None = None) -> bool:
    """Whether the backward takes the held plan for rows of ``n_cols`` where it can run (``held_bwd_bands``): widths
    that are not a multiple of 16, inside the band of their element size, past the phased plan's widest row or, with
    two programs an SM or more, holding at most ``_HELD_BWD_REG_SLOTS`` times the phased plan's lanes where the shares
    are held in registers, else filling their segments better than the phased plan's tile (``_HELD_BWD_MIN_GAIN``).
    Aligned rows: in ``held_bwd_aligned_bands`` with the shares in registers (what was measured)."""
    t = t or DEFAULT_TUNING
    if n_cols % 16 == 0:
        return (_in_aligned_band(t.held_bwd_aligned_bands, n_cols, elem_size)
                and _layer_norm_held.bwd_shape(n_cols, elem_size, elem_size).reg_shares)
    if not _in(_sized(t.held_bwd_bands, elem_size), n_cols) or _narrow_packed(n_cols, t):
        return False
    if n_cols > _PHASED_BWD_MAX_ROW:
        return True
    shape = _layer_norm_held.bwd_shape(n_cols, elem_size, elem_size)
    pieces = _phased_bwd_pieces(n_cols, elem_size, t)
    if shape.per_sm < 2 or pieces is None:
        return False
    phased_fill = min(1.0, n_cols / sum(pieces))  # its tile and pieces (a tail in words past them: full)
    if shape.reg_shares:  # the slots of its segments against the phased plan's lanes
        return shape.nseg * shape.block <= _HELD_BWD_REG_SLOTS * n_cols / phased_fill
    held_fill = (n_cols + 16 // elem_size - 1) / (shape.nseg * shape.block)  # from the widest phase's aligned start
    return held_fill >= phased_fill + _HELD_BWD_MIN_GAIN


def _held_backward(dy2: torch.Tensor, x2: torch.Tensor, weight: torch.Tensor, dx2: torch.Tensor,
                   t: Tuning | None = None) -> bool:
    """Whether this backward runs on ``_layer_norm_held``: the width's rule (``t``, default the tensors' device's), this
    machine, and tensors it takes."""
    t = _tuning(_device.of(x2.device)) if t is None else t
    return (_held_bwd_default(x2.shape[1], x2.element_size(), t) and _layer_norm_held.available()
            and _layer_norm_held.fits_backward(dy2, x2, weight, dx2))


def _check_params(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    check_tensor(x, "x", min_ndim=1)
    for name, p in (("weight", weight), ("bias", bias)):
        check_tensor(p, name, ndim=1)
        if p.shape[0] != x.shape[-1]:
            raise ValueError(f"{name} has shape {tuple(p.shape)}; x's last dimension needs ({x.shape[-1]},)")
        if p.get_device() != x.get_device():  # device indices: cheaper than comparing torch.device objects
            raise ValueError(f"{name} is on {p.device} but x is on {x.device}")


# each problem's first call recorded, replayed after (_launch.py)
FORWARD_CALLS = Calls("layer_norm.forward")
BACKWARD_CALLS = Calls("layer_norm.backward")


def forward(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    eps: float = 1e-5,
    *,
    out: torch.Tensor | None = None,
    max_row: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Layer norm of ``x`` over its last dimension: ``(y, mean, rstd)``.

    ``y`` has ``x``'s shape and dtype (written into ``out`` when given: contiguous, same
    shape, dtype and device); ``mean`` and ``rstd`` are float32 of shape ``x.shape[:-1]``.
    ``weight`` and ``bias`` have shape ``(N,)``, any float dtype. ``max_row`` overrides the
    launch plan, for tests.
    """
    return FORWARD_CALLS((eps, max_row), (x, weight, bias, out), lambda: _forward(x, weight, bias, eps, out, max_row))


def _forward(x, weight, bias, eps, out, max_row):
    _check_params(x, weight, bias)
    y = output_like(x, out)
    stats = torch.empty((2, *x.shape[:-1]), dtype=torch.float32, device=x.device)  # one allocation: host time
    mean, rstd = stats[0], stats[1]
    if x.numel() == 0:
        return y, mean, rstd
    x2 = as_rows(x)
    rows = x.dim() == 2  # already rows: no views to make
    y2 = y if rows else y.view(x2.shape)
    mean1, rstd1 = (mean, rstd) if rows else (mean.view(-1), rstd.view(-1))
    _forward_any(x2, weight, bias, y2, mean1, rstd1, float(eps), max_row)
    return y, mean, rstd


def _forward_any(x2, weight, bias, y2, mean, rstd, eps: float, max_row: int | None) -> None:
    """The forward's plan, then its launches: the held or streamed Gluon kernels where they take these rows, else the
    Triton plan (``_layer_norm_settings``)."""
    device = x2.device
    t = _tuning(_device.of(device))
    band = max_row is None and _stream_band(x2.shape[1], x2.element_size(), t)  # asked once: it builds the stream's shape
    streamed = max_row is None and _stream_forward(x2, weight, bias, y2, band, t)
    if max_row is None and not (band and streamed) and _held_forward(x2, weight, bias, y2, t):
        try:
            _layer_norm_held.launch(x2, weight, bias, y2, mean, rstd, eps, _device.of(device).sms)
            return
        except _layer_norm_held.CompilationError as exc:  # a Triton whose Gluon moved on: warn once, then without it
            _layer_norm_held.disable(exc)
    if streamed and _layer_norm_held.available():  # available: not if the held plan's compile just failed
        try:
            _layer_norm_held.launch_stream(x2, weight, bias, y2, mean, rstd, eps, _device.of(device).sms)
            return
        except _layer_norm_held.CompilationError as exc:
            _layer_norm_held.disable(exc)
    plan = _layer_norm_settings(*x2.shape, x2.element_size(), max_row=max_row, device=_device.of(device),
                                packed=_packed_width(x2, y2) > 0)
    _forward_launch(x2, weight.contiguous(), bias.contiguous(), y2, mean, rstd, eps, plan)


def backward(
    dy: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    mean: torch.Tensor,
    rstd: torch.Tensor,
    *,
    bias_dtype: torch.dtype | None = None,
    max_row: int | None = None,
    one_pass: bool | None = None,
    variant: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients ``(dx, dweight, dbias)`` of layer norm, given ``dy`` and the forward's saved values.

    ``max_row``/``one_pass``/``variant`` override the launch plan (``_layer_norm_settings``).
    """
    return BACKWARD_CALLS((bias_dtype, max_row, one_pass, variant), (dy, x, weight, mean, rstd),
                          lambda: _backward(dy, x, weight, mean, rstd, bias_dtype, max_row, one_pass, variant))


def _backward(dy, x, weight, mean, rstd, bias_dtype, max_row, one_pass, variant):
    check_tensor(dy, "dy", min_ndim=1)
    if dy.shape != x.shape:
        raise ValueError(f"dy has shape {tuple(dy.shape)} but x has {tuple(x.shape)}")
    n_cols = x.shape[-1]
    device = x.device
    dx = torch.empty(x.shape, dtype=x.dtype, device=device)
    if x.numel() == 0:  # no rows: zero gradients for the parameters
        dw = torch.zeros(n_cols, dtype=weight.dtype, device=device)
        return dx, dw, torch.zeros(n_cols, dtype=bias_dtype or weight.dtype, device=device)
    dw = torch.empty(n_cols, dtype=weight.dtype, device=device)  # every column is written
    db = torch.empty(n_cols, dtype=bias_dtype or weight.dtype, device=device)
    x2, dy2 = as_rows(x), as_rows(dy)
    rows = x.dim() == 2  # already rows: no views to make
    dx2 = dx if rows else dx.view(x2.shape)
    weight = weight.contiguous()
    mean1, rstd1 = (mean, rstd) if rows and mean.dim() == 1 else (mean.reshape(-1), rstd.reshape(-1))
    _backward_any(dy2, x2, weight, mean1, rstd1, dx2, dw, db, max_row, one_pass, variant)
    return dx, dw, db


def _backward_any(dy2, x2, weight, mean, rstd, dx2, dw, db, max_row, one_pass, variant) -> None:
    """The backward's plan, then its launches: the held Gluon kernel where it takes these rows, else the Triton plan."""
    if (max_row is None and one_pass is None and variant is None
            and _held_backward(dy2, x2, weight, dx2, _tuning(_device.of(x2.device)))):
        try:
            shares = _layer_norm_held.launch_backward(dy2, x2, weight, mean, rstd, dx2, _device.of(x2.device).sms)
            _sum_shares(*shares, dw, db)
            return
        except _layer_norm_held.CompilationError as exc:  # a Triton whose Gluon moved on: warn once, then without it
            _layer_norm_held.disable(exc)
    plan = _layer_norm_settings(
        *x2.shape,
        x2.element_size(),
        backward=True,
        device=_device.of(x2.device),
        max_row=max_row,
        one_pass=one_pass,
        variant=variant,
        phased_ok=dy2.dtype == x2.dtype,
        flat_ok=_flat_layout(x2, dy2),
        packed=_packed_width(x2, dy2, dx2) > 0,
    )
    _backward_launch(dy2, x2, weight, mean, rstd, dx2, dw, db, plan)


class _LayerNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps, max_row, one_pass, variant):
        y, mean, rstd = forward(x, weight, bias, eps, max_row=max_row)
        ctx.save_for_backward(x, weight, mean, rstd)
        ctx.bias_dtype = bias.dtype
        ctx.plan_overrides = dict(max_row=max_row, one_pass=one_pass, variant=variant)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, mean, rstd = ctx.saved_tensors
        dx, dw, db = backward(dy, x, weight, mean, rstd, bias_dtype=ctx.bias_dtype, **ctx.plan_overrides)
        return dx, dw, db, None, None, None, None


def fused(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    eps: float = 1e-5,
    *,
    max_row: int | None = None,
    one_pass: bool | None = None,
    bwd_variant: str | None = None,
) -> torch.Tensor:
    """Differentiable fused layer norm: ``forward`` now, ``backward`` under autograd.

    ``max_row`` overrides both passes' plans, ``one_pass`` the backward's chunked plan and
    ``bwd_variant`` ("measured" or "lean") its kernel, for tests and benchmarks.
    """
    return _LayerNormFunction.apply(x, weight, bias, eps, max_row, one_pass, bwd_variant)


def unfused(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """Layer norm op by op as people write it; traffic per line for x of shape (M, N)."""
    mean = x.mean(dim=-1, keepdim=True)  # read MN elements ; write M elements
    centred = x - mean  # read MN + M elements ; write MN elements
    squared = centred * centred  # read MN elements ; write MN elements
    var = squared.mean(dim=-1, keepdim=True)  # read MN elements ; write M elements
    shifted = var + eps  # read M elements ; write M elements
    rstd = torch.rsqrt(shifted)  # read M elements ; write M elements
    normed = centred * rstd  # read MN + M elements ; write MN elements
    scaled = normed * weight  # read MN + N elements ; write MN elements
    return scaled + bias  # read MN + N elements ; write MN elements


def budget(x: torch.Tensor, weight: torch.Tensor | None = None, bias: torch.Tensor | None = None, *, backward: bool = False) -> Budget:
    """Compulsory traffic of the forward (or, with ``backward=True``, the backward) pass.

    Forward: read x, weight, bias; write y and float32 mean, rstd. Backward: read x, dy
    (x's dtype), weight and float32 mean, rstd; write dx, dweight, dbias. ``weight`` and
    ``bias`` default to x's dtype.
    """
    m, n = rows_cols(x)
    size = x.element_size()
    w_size = weight.element_size() if weight is not None else size
    b_size = bias.element_size() if bias is not None else w_size
    if not backward:
        return Budget(
            read_bytes=m * n * size + n * (w_size + b_size),
            write_bytes=m * n * size + 2 * m * 4,
            label="layer_norm forward",
        )
    return Budget(
        read_bytes=2 * m * n * size + n * w_size + 2 * m * 4,
        write_bytes=m * n * size + n * (w_size + b_size),
        label="layer_norm backward",
    )


def unfused_traffic(x: torch.Tensor, weight: torch.Tensor | None = None, bias: torch.Tensor | None = None) -> Budget:
    """Traffic of ``unfused`` in x's dtype (weight and bias the same): the sum of its line comments."""
    m, n = rows_cols(x)
    size = x.element_size()
    reads = (m * n) + (m * n + m) + (m * n) + (m * n) + m + m + (m * n + m) + (m * n + n) + (m * n + n)
    writes = m + (m * n) + (m * n) + m + m + m + (m * n) + (m * n) + (m * n)
    return Budget(read_bytes=reads * size, write_bytes=writes * size, label="layer_norm forward, op by op")
