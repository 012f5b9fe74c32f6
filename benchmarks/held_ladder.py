"""Where the held softmax's time goes: the kernel with its passes cut away, under three ways of handing out rows.

    PYTHONPATH=$PWD python3 benchmarks/held_ladder.py --widths 17000,30522,50257 --dtypes bfloat16 [--variants ...]

A variant is a pass and a schedule (docs/kernels.md, "A program a row"). The passes, each over rows copied into shared
memory by ``cp.async`` segment by segment as the held kernel copies them (``_held.copy_segment``):

- ``copy``: each segment waited for and stored back out unchanged (what the structure alone costs);
- ``max``: a max pass over the row (the landing, the edge masks and one block reduction), then the row scaled by
  one number;
- ``softmax``: the held softmax's own passes (``_softmax_held._tile_max_sum`` and ``_tile_output``).

The schedules: ``walk`` (persistent programs, as many as shared memory fits, walking rows pid, pid + programs, ...,
the next row copied behind the output pass), ``ticket`` (the same programs taking their next row from a relaxed
atomic counter, which the last program out resets) and ``row`` (a program a row, the grid as many programs as rows).
Beside them: ``shipped`` (``_softmax_held.launch`` as the planner runs it) and two plain Triton copies of the same
bytes, ``triton_copy`` (one 4096-element block a program) and ``triton_copy_walk`` (a persistent grid-stride loop,
four programs an SM). Each variant's output is checked first: the copies against the input, the softmax variants
bitwise against ``shipped``. Prints % of a device-to-device copy of the same bytes (``_common.copy_gbps``), device
time of graph replays over two input sets.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from benchmarks._common import add_out_option, copy_gbps, gbps, header, markdown_table, write_output_to  # noqa: E402
from reference_kernels import _common, _softmax_held  # noqa: E402
from reference_kernels._held import (BLOCK, MAX_REGS, WARPS, async_copy, copy_segment, edge_columns, gl,  # noqa: E402
                                     gluon, land_segment, per_sm, row_start, segments, widen)

PASSES = {"copy": 0, "max": 1, "softmax": 2}
SCHEDULES = {"walk": 0, "ticket": 1, "row": 2}
OTHERS = ("shipped", "triton_copy", "triton_copy_walk")
VARIANTS = tuple(f"{p}_{s}" for p in PASSES for s in SCHEDULES) + OTHERS
DEFAULT_VARIANTS = ("copy_walk", "copy_row", "max_walk", "softmax_walk", "softmax_ticket", "softmax_row", "shipped",
                    "triton_copy", "triton_copy_walk")


def parse_variants(text: str | None) -> tuple[str, ...]:
    """The comma-separated variant names asked for (default ``DEFAULT_VARIANTS``); unknown ones refused."""
    names = tuple(n.strip() for n in text.split(",") if n.strip()) if text else DEFAULT_VARIANTS
    unknown = [n for n in names if n not in VARIANTS]
    if unknown or not names:
        raise SystemExit(f"unknown variant(s) {unknown}; choose from {', '.join(VARIANTS)}")
    return names


if gluon is not None:

    @gluon.jit
    def _ladder_kernel(x_ptr, y_ptr, ctr_ptr, n_rows, n_cols, BLOCK: gl.constexpr, NSEG: gl.constexpr,
                       VEC: gl.constexpr, PASS: gl.constexpr, SCHED: gl.constexpr, WIDEN: gl.constexpr,
                       num_warps: gl.constexpr):
        layout: gl.constexpr = gl.BlockedLayout([VEC], [32], [num_warps], [0])
        edge_layout: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
        vec_layout: gl.constexpr = gl.BlockedLayout([1, VEC], [32, 1], [num_warps, 1], [1, 0])
        buf = gl.allocate_shared_memory(x_ptr.dtype.element_ty, [NSEG, BLOCK], gl.SwizzledSharedLayout(1, 1, 1, [0]))
        idx = gl.arange(0, BLOCK, layout=layout)
        eidx = gl.arange(0, 2 * VEC, layout=edge_layout)
        NEXT: gl.constexpr = SCHED != 2  # the next row copied behind the output pass (there is none a program a row)
        pid = gl.program_id(0)
        n_progs = gl.num_programs(0)
        row = pid
        abase, shift = row_start(row, n_cols, VEC)
        for s in gl.static_range(NSEG):
            copy_segment(buf, x_ptr, abase, s, gl.cdiv(n_cols + shift, VEC), idx, BLOCK, VEC)
        while row < n_rows:
            end = shift + n_cols
            if SCHED == 1:
                nxt = n_progs + gl.atomic_add(ctr_ptr, 1, sem="relaxed")
            else:
                nxt = row + n_progs  # SCHED 2: the grid covers the rows, so there is no next row
            nabase, nshift = row_start(gl.minimum(nxt, n_rows - 1), n_cols, VEC)
            n_vecs = gl.where(nxt < n_rows, gl.cdiv(n_cols + nshift, VEC), 0)
            if PASS == 2:  # the held softmax's own passes; its output pass below, as _softmax_held._tile_output's
                ecol, emask, ev = _softmax_held._tile_edges(x_ptr, abase, shift, end, eidx, VEC)
                c, total = _softmax_held._tile_max_sum(buf, idx, shift, end, layout, vec_layout, BLOCK, NSEG, VEC,
                                                       WIDEN)
                scale = 1.0 / total
            else:
                ecol, emask = edge_columns(eidx, shift, end, VEC)
                ev = gl.load(x_ptr + abase + ecol, mask=emask, other=0.0)
                if PASS == 0:
                    for s in gl.static_range(NSEG):
                        async_copy.wait_group(NSEG - 1 - s)
                    scale = 1.0
                else:
                    m = gl.full([BLOCK // VEC], float("-inf"), gl.float32, gl.SliceLayout(1, vec_layout))
                    for s in gl.static_range(NSEG):
                        v = land_segment(buf, s, idx, shift, end, float("-inf"), layout, BLOCK, NSEG, WIDEN)
                        v2 = gl.convert_layout(gl.reshape(v, [BLOCK // VEC, VEC]), vec_layout)
                        m = gl.maximum(m, gl.max(v2, axis=1))
                    scale = 1.0 / (gl.abs(gl.max(m, axis=0)) + 1.0)
            first_v = gl.cdiv(shift, VEC)
            last_v = end // VEC
            for u in range(NSEG):
                col = u * BLOCK + idx
                vi = col // VEC
                if PASS == 0:
                    y = buf.index(u).load(layout)
                elif PASS == 1:
                    y = (widen(buf.index(u).load(layout), WIDEN) * scale).to(y_ptr.dtype.element_ty)
                else:
                    v = widen(buf.index(u).load(layout), WIDEN)
                    y = (_softmax_held._exp_from(v, c) * scale).to(y_ptr.dtype.element_ty)
                gl.store(y_ptr + abase + col, y, mask=(vi >= first_v) & (vi < last_v))
                if NEXT:
                    copy_segment(buf, x_ptr, nabase, u, n_vecs, idx, BLOCK, VEC)
            if PASS == 2:
                gl.store(y_ptr + abase + ecol, (_softmax_held._exp_from(ev, c) * scale).to(y_ptr.dtype.element_ty),
                         mask=emask)
            else:
                gl.store(y_ptr + abase + ecol, (ev.to(gl.float32) * scale).to(y_ptr.dtype.element_ty), mask=emask)
            abase = nabase
            shift = nshift
            row = nxt
        async_copy.wait_group(0)
        if SCHED == 1:  # the last program out resets the ticket for the next launch on this stream
            done = gl.atomic_add(ctr_ptr + 1, 1, sem="acq_rel")
            if done == n_progs - 1:
                gl.atomic_xchg(ctr_ptr, 0, sem="relaxed")
                gl.atomic_xchg(ctr_ptr + 1, 0, sem="relaxed")


@triton.jit
def _triton_copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr, WALK: tl.constexpr):
    pid = tl.program_id(0)
    if WALK:
        for b in range(pid, tl.cdiv(n, BLOCK), tl.num_programs(0)):
            _copy_block(x_ptr, y_ptr, b, n, BLOCK)
    else:
        _copy_block(x_ptr, y_ptr, pid, n, BLOCK)


@triton.jit
def _copy_block(x_ptr, y_ptr, b, n, BLOCK: tl.constexpr):
    # full blocks unmasked: a mask against an n of no multiple of 16 would cost the loads their 16-byte vectors
    start = tl.cast(b, tl.int64) * BLOCK
    offs = start + tl.arange(0, BLOCK)
    if start + BLOCK <= n:
        tl.store(y_ptr + offs, tl.load(x_ptr + offs))
    else:
        tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


def launcher(name: str, sms: int, counter: torch.Tensor):
    """``launch((x, y))`` of variant ``name`` (``VARIANTS``) on ``sms`` SMs; ``counter``: two zeroed int32s (tickets)."""
    if name == "shipped":
        return lambda s: _softmax_held.launch(s[0], s[1])
    if name.startswith("triton_copy"):
        walk = name.endswith("_walk")

        def copy(s, block=4096):
            n = s[0].numel()
            _triton_copy_kernel[(4 * sms if walk else triton.cdiv(n, block),)](s[0], s[1], n, BLOCK=block, WALK=walk,
                                                                               num_warps=8)
        return copy
    pass_name, sched_name = name.split("_")
    pass_, sched = PASSES[pass_name], SCHEDULES[sched_name]

    def held(s):
        x2, y2 = s
        n_rows, n_cols = x2.shape
        es = x2.element_size()
        grid = n_rows if sched == 2 else max(1, min(n_rows, per_sm(n_cols, es) * sms))
        _ladder_kernel[(grid,)](x2, y2, counter, n_rows, n_cols, BLOCK=BLOCK, NSEG=segments(n_cols, es), VEC=16 // es,
                                PASS=pass_, SCHED=sched, WIDEN=_softmax_held.widen_rows(), num_warps=WARPS,
                                maxnreg=MAX_REGS)
    return held


def run_width(n: int, dtype: torch.dtype, mib: int, names: tuple[str, ...], sms: int) -> dict:
    """{variant: % of copy} at (rows of ``mib`` MiB, ``n`` columns), each variant checked first (a failed check: its
    error instead of a figure)."""
    rows = max(1, mib * 2**20 // (n * dtype.itemsize))
    nbytes = 2 * rows * n * dtype.itemsize
    copy = copy_gbps(nbytes)
    sets = [(torch.randn(rows, n, device="cuda", dtype=dtype), torch.empty(rows, n, device="cuda", dtype=dtype))
            for _ in range(2)]
    counter = torch.zeros(2, dtype=torch.int32, device="cuda")
    x, y = sets[0]
    expected = torch.empty_like(x)
    _softmax_held.launch(x, expected)
    out = {}
    for name in names:
        launch = launcher(name, sms, counter)
        y.fill_(float("nan"))
        for _ in range(2):  # twice: a ticket counter left dirty would show in the second
            launch(sets[0])
        torch.cuda.synchronize()
        want = x if name.startswith(("copy", "triton_copy")) else expected if name.startswith("softmax") else None
        if want is not None and not torch.equal(y, want):
            out[name] = "wrong result"
            continue
        if counter.any():
            out[name] = f"ticket counter left at {counter.tolist()}"
            continue
        ms = _common.graph_device_ms(launch, sets)
        out[name] = round(100 * gbps(nbytes, ms) / copy, 1)
    return out


def compile_sm90(name: str, n: int, dtype: torch.dtype) -> dict:
    """Variant ``name``'s ladder kernel compiled for sm_90 with this Triton, no GPU needed (Triton's offline-compile
    entry points, as scripts/held_sass.py): its shared memory and its ``cp.async`` sites in the PTX."""
    import re

    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    pass_name, sched_name = name.split("_")
    es = dtype.itemsize
    ty = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}[dtype]
    signature = {"x_ptr": f"*{ty}", "y_ptr": f"*{ty}", "ctr_ptr": "*i32", "n_rows": "i32", "n_cols": "i32"}
    constexprs = {"BLOCK": BLOCK, "NSEG": segments(n, es), "VEC": 16 // es, "PASS": PASSES[pass_name],
                  "SCHED": SCHEDULES[sched_name], "WIDEN": _softmax_held.widen_rows(), "num_warps": WARPS}
    signature.update({k: "constexpr" for k in constexprs})
    compiled = triton.compile(GluonASTSource(_ladder_kernel, signature, constexprs=constexprs,
                                             attrs={(0,): [["tt.divisibility", 16]], (1,): [["tt.divisibility", 16]]}),
                              target=GPUTarget("cuda", 90, 32), options={"num_warps": WARPS, "maxnreg": MAX_REGS})
    return {"variant": name, "width": n, "segments": constexprs["NSEG"], "shared": compiled.metadata.shared,
            "copy_sites": len(re.findall(r"cp\.async\.cg\.shared\.global", compiled.asm["ptx"]))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", default="17000,30522,50257")
    parser.add_argument("--dtypes", default="bfloat16")
    parser.add_argument("--mib", type=int, default=128, help="MiB each input reads (the sweep's default)")
    parser.add_argument("--variants", help=f"comma-separated, of {', '.join(VARIANTS)}")
    parser.add_argument("--compile-only", action="store_true",
                        help="compile the ladder variants for sm_90 and print what came out (no GPU needed)")
    add_out_option(parser)
    args = parser.parse_args()
    names = parse_variants(args.variants)
    widths = [int(w) for w in args.widths.split(",")]
    if args.compile_only:
        if gluon is None:
            raise SystemExit("this Triton has no Gluon")
        for dtype_name in args.dtypes.split(","):
            for n in widths:
                for name in names:
                    if name not in OTHERS:
                        print(json.dumps(compile_sm90(name, n, getattr(torch, dtype_name))), flush=True)
        return
    if gluon is None or not _softmax_held.available():
        raise SystemExit("the held ladder runs the held kernels: a CUDA GPU of compute capability 9.x and a Triton with "
                         "Gluon, not the interpreter")
    write_output_to(args.out, __file__)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"# held ladder: {header()}; inputs of {args.mib} MiB, % of copy\n")
    table = []
    for dtype_name in args.dtypes.split(","):
        dtype = getattr(torch, dtype_name)
        for n in widths:
            if not _softmax_held.fits(*(torch.empty(1, n, device="cuda", dtype=dtype),) * 2):
                table.append([dtype_name, n] + ["does not fit"] * len(names))
                continue
            result = run_width(n, dtype, args.mib, names, sms)
            table.append([dtype_name, n] + [result[name] for name in names])
            print(f"{dtype_name} {n}: {result}", flush=True)
    print("\n" + markdown_table(["dtype", "width", *names], table))


if __name__ == "__main__":
    main()
