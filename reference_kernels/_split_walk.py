"""The split walk: persistent programs taking row tiles twice, shared by softmax and the layer-norm forward.

A program of ``_softmax_split_kernel`` or ``_layer_norm_fwd_split_kernel`` walks tiles: a
whole row (``GROUP`` 1, "persistent") or one of a row's ``GROUP`` slices ("split"). Each tile
is walked twice, statistics then the normalising pass, and the grid (a few programs an SM)
keeps the tiles in flight well under the L2, so the second pass re-reads from there. The
slices of a row publish their partial statistics and wait for each other
(``exchange_partials``): tiles come from a relaxed atomic ticket that a program takes only
*after* its wait, so the tiles handed out form a prefix and no program holds two slices of
one row; the lowest unfinished row always completes as long as ``GROUP`` programs fit on the
GPU at once (the subjects cap ``GROUP`` at 16, far below that). docs/kernels.md ("The split
walk") has the measured reasons for each part.

The Triton helpers below are the walk's bookkeeping; ``split_group`` and ``split_launch``
size a launch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import cdiv, interpreting
from ._device import sm_count
from ._launch import launch as launch_kernel

# The walk sized for the L2 (softmax's and the layer-norm forward's "split" plans): slices not held in registers walked
# in SPLIT_CHUNK_BYTES steps by SPLIT_PER_SM programs of SPLIT_WARPS warps an SM (3 x 132 x 64 KiB in flight: 26 MB),
# a row in at most MAX_SPLIT_GROUP slices (programs that wait on each other: far below what a GPU holds at once)
SPLIT_CHUNK_BYTES = 16384
SPLIT_PER_SM = 3
SPLIT_WARPS = 8
MAX_SPLIT_GROUP = 16

# Arrival counters sit one 128-byte line apart, so that the programs spinning on one row
# do not queue behind those spinning on the next (docs/kernels.md, "The split walk").
COUNTER_STRIDE_INTS = 32
COUNTER_STRIDE = tl.constexpr(COUNTER_STRIDE_INTS)
# Spin until the int32 at $1 is >= $2: an acquire load a try (every thread: each then holds
# its own acquire), with a nanosleep back-off from 32 to 256 ns (``spin_asm``'s cap) between tries
# so that the waiters of a row cost its counter's line a few requests a microsecond, not one a clock.
def spin_asm(max_ns: int = 256) -> str:
    """The spin's PTX with its back-off capped at ``max_ns`` (0: no sleep between tries)."""
    sleep = f"""nanosleep.u32 %ns;
shl.b32 %ns, %ns, 1;
min.u32 %ns, %ns, {max_ns};
""" if max_ns > 0 else ""
    return f"""{{
.reg .pred %p_done;
.reg .u32 %ns;
mov.u32 %ns, {min(32, max_ns) if max_ns > 0 else 0};
SPIN_TRY:
ld.acquire.gpu.global.u32 $0, [$1];
setp.ge.s32 %p_done, $0, $2;
@%p_done bra SPIN_DONE;
{sleep}bra SPIN_TRY;
SPIN_DONE:
}}"""


_SPIN_ASM = tl.constexpr(spin_asm(256))


@triton.jit
def first_tile(sync_ptr, n_rows, GROUP: tl.constexpr):
    """A split-walk program's first tile: its program id (round robin) when GROUP == 1, else a ticket."""
    if GROUP == 1:
        return tl.program_id(0)
    else:
        return tl.atomic_add(sync_ptr + n_rows * COUNTER_STRIDE, 1, sem="relaxed")


@triton.jit
def tile_start(tile, n_rows, slice_cols, GROUP: tl.constexpr):
    """(row, first column) of ``tile``; past the last tile the last row: a harmless in-bounds prefetch."""
    return tl.minimum(tile // GROUP, n_rows - 1), (tile % GROUP) * slice_cols


@triton.jit
def prefetch_target(start, hi, row, next_row, next_lo, BLOCK_N: tl.constexpr):
    """(row, column) that pass two prefetches at step ``start``: the slice's next step, or after the
    slice's last step [.., hi) the next tile's first."""
    nxt = start + BLOCK_N
    last = nxt >= hi
    return tl.where(last, next_row, row), tl.where(last, next_lo, nxt)


@triton.jit
def exchange_partials(part_ptr, sync_ptr, row, slot, a, b, n_rows, a_other, b_other,
                      GROUP: tl.constexpr, BLOCK_G: tl.constexpr):
    """Publish this slice's partials (a, b) in part[row, slot], wait for the row's GROUP slices, then
    take the next ticket: (every slice's a, every slice's b, next tile), lanes past GROUP a_other, b_other.

    The ticket comes only after the wait, so the tiles handed out form a prefix and no program holds
    two tiles of one row (the module docstring: why that cannot deadlock).
    """
    all_a, all_b = gather_partials(part_ptr, sync_ptr, row, slot, a, b, GROUP, a_other, b_other, GROUP, BLOCK_G)
    return all_a, all_b, next_ticket(sync_ptr, n_rows)


@triton.jit
def gather_partials(part_ptr, sync_ptr, row, slot, a, b, n_arrivals, a_other, b_other,
                    GROUP: tl.constexpr, BLOCK_G: tl.constexpr):
    """``exchange_partials`` without the ticket, for a row that exchanges more than once: part_ptr is this
    exchange's own (M, GROUP, 2) plane, and the wait lasts until the row's counter reaches ``n_arrivals``
    (GROUP for a row's first exchange, 2 GROUP for its second). Take the ticket after the last."""
    part_row = part_ptr + row.to(tl.int64) * (2 * GROUP)
    tl.store(part_row + 2 * slot, a)
    tl.store(part_row + 2 * slot + 1, b)
    arrive_and_wait(sync_ptr + row.to(tl.int64) * COUNTER_STRIDE, n_arrivals)
    g = tl.arange(0, BLOCK_G)
    all_a = tl.load(part_row + 2 * g, mask=g < GROUP, other=a_other, volatile=True)
    all_b = tl.load(part_row + 2 * g + 1, mask=g < GROUP, other=b_other, volatile=True)
    return all_a, all_b


@triton.jit
def next_ticket(sync_ptr, n_rows):
    """The next tile of a split walk (GROUP > 1): taken after a program's last wait on its row."""
    return tl.atomic_add(sync_ptr + n_rows * COUNTER_STRIDE, 1, sem="relaxed")


@triton.jit
def arrive_and_wait(count_ptr, n_peers):
    """Arrive at ``count_ptr`` (release) and wait, with back-off, until ``n_peers`` have arrived (acquire)."""
    tl.debug_barrier()  # every thread's partial stores precede the release
    tl.atomic_add(count_ptr, 1, sem="release", scope="gpu")
    tl.inline_asm_elementwise(_SPIN_ASM, "=r,l,r", [count_ptr, n_peers], dtype=tl.int32, is_pure=False, pack=1)
    tl.debug_barrier()


def split_group(n_cols: int, block_n: int, group: int) -> tuple[int, int]:
    """(programs per row, columns per slice) for ``group`` slices asked: whole chunks a slice, none empty."""
    n_steps = cdiv(n_cols, block_n)
    steps = cdiv(n_steps, max(1, min(group, n_steps)))
    return cdiv(n_steps, steps), steps * block_n


def split_launch(n_rows: int, group: int, per_sm: int, device: torch.device, unused: torch.Tensor, planes: int = 1):
    """(programs, part, sync) of a split-walk launch: ``per_sm`` programs an SM (no more than tiles)
    and ``exchange``'s buffers."""
    part, sync = exchange(n_rows, group, device, unused, planes)
    return _programs(n_rows, group, per_sm, device), part, sync


def exchange(n_rows: int, group: int, device: torch.device, unused: torch.Tensor, planes: int = 1):
    """(part, sync) through which a row's ``group`` > 1 slices exchange: the partials (``planes`` of
    (n_rows, group, 2): one for each exchange a row may make) and zeroed counters (else ``unused``,
    never read). Refused under the interpreter, whose programs run one at a time."""
    if group > 1 and interpreting():
        raise ValueError("the split plan waits on other programs: it cannot run under the interpreter")
    if group == 1:
        return unused, unused
    part = torch.empty((planes, n_rows, group, 2), dtype=torch.float32, device=device)
    sync = torch.zeros((n_rows + 1) * COUNTER_STRIDE_INTS, dtype=torch.int32, device=device)
    return part, sync


def _programs(n_rows: int, group: int, per_sm: int, device: torch.device) -> int:
    return max(1, min(n_rows * group, max(1, per_sm) * sm_count(device)))


# --------------------------------------------------------------------------- co-residency

# Programs an SM of each compiled split-walk kernel, by launch key: read from the compiled
# kernel (registers, shared memory, warps) the first time a key launches (``resident_per_sm``).
RESIDENT: dict = {}


def resident_per_sm(n_regs: int, num_warps: int, shared_bytes: int, *, regs_per_sm: int = 65536,
                    threads_per_sm: int = 2048, smem_per_sm: int = 233472, blocks_per_sm: int = 32) -> int:
    """Programs of a kernel that fit one SM at once (Hopper's limits by default; the caller passes
    the device's): registers go to a warp in steps of 256, and each program reserves 1 KiB of
    shared memory beside its own."""
    regs_per_warp = -(-max(1, n_regs) * 32 // 256) * 256
    by_regs = regs_per_sm // (regs_per_warp * num_warps)
    by_threads = threads_per_sm // (32 * num_warps)
    by_smem = smem_per_sm // (shared_bytes + 1024)
    return max(0, min(by_regs, by_threads, by_smem, blocks_per_sm))


def split_run(kernel, make_args, n_rows: int, group: int, per_sm: int, device: torch.device,
              unused: torch.Tensor, planes: int = 1, **options) -> int:
    """Launch ``kernel`` on a split-walk grid of ``per_sm`` programs an SM, or of as many as the
    compiled kernel keeps resident when that is fewer, so that the planned programs run at
    once (docs/kernels.md, "The split walk"). ``make_args(part, sync, n_programs)`` gives the
    positional arguments; ``planes``: partials planes (``split_launch``). Returns the programs launched."""
    n_programs, part, sync = split_launch(n_rows, group, per_sm, device, unused, planes)
    args = make_args(part, sync, n_programs)
    if per_sm > 1 and not interpreting() and device.type == "cuda":
        resident = _resident(kernel, args, options, device)
        if resident is not None and 0 < resident < per_sm:
            n_programs = _programs(n_rows, group, resident, device)
            args = make_args(part, sync, n_programs)
    launch_kernel(kernel, (n_programs,), *args, **options)
    return n_programs


def _resident(kernel, args: tuple, launch: dict, device: torch.device) -> int | None:
    """Programs an SM of ``kernel`` compiled for ``args`` / ``launch`` (cached per key), or None when
    this Triton cannot say (the plan's figure is used then)."""
    key = (getattr(kernel, "__name__", str(kernel)), device.index,
           tuple(sorted((k, v) for k, v in launch.items() if isinstance(v, (int, bool, str)))),
           tuple(str(a.dtype) if isinstance(a, torch.Tensor) else type(a).__name__ for a in args))
    if key not in RESIDENT:
        try:
            compiled = kernel.warmup(*args, grid=(1,), **launch)
            if hasattr(compiled, "_init_handles"):
                compiled._init_handles()
            props = torch.cuda.get_device_properties(device)
            RESIDENT[key] = resident_per_sm(
                compiled.n_regs, compiled.metadata.num_warps, compiled.metadata.shared,
                regs_per_sm=getattr(props, "regs_per_multiprocessor", 65536),
                threads_per_sm=getattr(props, "max_threads_per_multi_processor", 2048),
                smem_per_sm=getattr(props, "shared_memory_per_multiprocessor", 233472),
            )
        except (AttributeError, TypeError, RuntimeError):  # an older or newer Triton: keep the plan's figure
            RESIDENT[key] = None
    return RESIDENT[key]

