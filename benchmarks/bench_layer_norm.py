"""Layer norm forward and backward on the GPU: ours against torch eager, torch.compile, Liger-Kernel.

Bandwidth counts compulsory bytes (forward: read x + write y;
backward: read x, dy + write dx; the small weight, bias, mean, rstd, dweight and dbias
are left out); ``%copy`` compares it with a device-to-device copy of the same size timed
in the same run. Inputs are 256 to 512 MiB, well over the H200's 60 MB L2.

    PYTHONPATH=. python3 benchmarks/bench_layer_norm.py                 # forward and backward
    PYTHONPATH=. python3 benchmarks/bench_layer_norm.py --quick --passes backward --widths 65536
    PYTHONPATH=. python3 benchmarks/bench_layer_norm.py --sweep --impls ours  # launch-plan variants too
    PYTHONPATH=. python3 benchmarks/bench_layer_norm.py --quick --out gpu-results  # also gpu-results/bench_layer_norm.{txt,json}
    PYTHONPATH=. python3 benchmarks/bench_layer_norm.py --sweep --impls ours,torch --widths 1025,4097,12345  # ragged rows

A width given with ``--widths`` that the anchor shapes lack is timed with 2^27 elements.

``--sweep`` times, for the backward, the measured plans and the register-lean kernel
(``variant="lean"``) with a few of its neighbours, in the same run.

Liger-Kernel is optional (``pip install liger-kernel``); without it its column reads n/a.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402

from benchmarks._common import bandwidth_cli, copy_gbps, device_ms, gbps, header, markdown_table, time_impls  # noqa: E402
from benchmarks._common import bandwidth_headers as table_headers  # noqa: E402
from benchmarks import _common  # noqa: E402
from benchmarks._common import json_path, write_output_to  # noqa: E402
from benchmarks._common import bandwidth_row as table_row  # noqa: E402
from reference_kernels import _device, layer_norm  # noqa: E402
from reference_kernels._common import next_power_of_2  # noqa: E402

SHAPES = [(131072, 1024), (32768, 4096), (8192, 16384), (2048, 65536)]
ELEMENTS = 2**27  # a width asked for with --widths that SHAPES lacks (a ragged one, say) gets this many elements


def shapes(widths: set) -> list[tuple[int, int]]:
    """SHAPES, or the ones of ``widths`` (--widths), each width SHAPES lacks with ``ELEMENTS`` elements."""
    if not widths:
        return SHAPES
    known = dict((n, m) for m, n in SHAPES)
    return [(known.get(n, max(1, ELEMENTS // n)), n) for n in sorted(widths)]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
EPS = 1e-5


def liger_ops():
    """(forward, backward) of Liger-Kernel's layer norm, or (None, None) without it."""
    return _common.liger_ops("layer_norm") or (None, None)


def forward_fns(x, w, b, impls) -> dict:
    n = x.shape[-1]
    fns = {"ours": lambda: layer_norm.forward(x, w, b, EPS), "torch": lambda: F.layer_norm(x, (n,), w, b, EPS)}
    if "compile" in impls:
        torch._dynamo.reset()
        compiled = torch.compile(lambda t, w_, b_: F.layer_norm(t, (n,), w_, b_, EPS), dynamic=False)
        fns["compile"] = lambda: compiled(x, w, b)
    liger_fwd, _ = liger_ops()
    if liger_fwd is not None:
        fns["liger"] = lambda: liger_fwd(x, w, b, EPS)
    return fns


def backward_fns(x, w, b, dy, mean, rstd, impls) -> dict:
    n = x.shape[-1]
    mask = [True, True, True]

    def aten(dy_, x_, mean_, rstd_, w_, b_):
        return torch.ops.aten.native_layer_norm_backward(dy_, x_, [n], mean_, rstd_, w_, b_, mask)

    # torch's own forward statistics, in the dtype and shape its backward expects.
    _, m1, r1 = torch.ops.aten.native_layer_norm(x, [n], w, b, EPS)
    fns = {
        "ours": lambda: layer_norm.backward(dy, x, w, mean, rstd),
        "torch": lambda: aten(dy, x, m1, r1, w, b),
    }
    if "compile" in impls:
        torch._dynamo.reset()
        compiled = torch.compile(aten, dynamic=False)
        fns["compile"] = lambda: compiled(dy, x, m1, r1, w, b)
    _, liger_bwd = liger_ops()
    if liger_bwd is not None:
        fns["liger"] = lambda: liger_bwd(dy, x, w, b, mean, rstd)
    return fns


def _sm_device(sm: int) -> _device.Device:
    """The device the plans are made for: this GPU's description (``sm`` its SMs)."""
    here = _device.of(torch.device("cuda")) if torch.cuda.is_available() else _device.INTERPRETER
    return dataclasses.replace(here, sms=sm)


def plan_variants(m: int, n: int, size: int, backward: bool, sm: int) -> list[tuple[str, layer_norm._Plan]]:
    """Launch plans worth timing at this width (``--sweep``), the default first."""
    plans = [("default", layer_norm._layer_norm_settings(m, n, size, backward=backward, device=_sm_device(sm)))]
    if backward and plans[0][1].mode == "rows" and plans[0][1].variant == "measured":
        plans.append(("default, prefetch", plans[0][1]._replace(prefetch=True)))
    P = layer_norm._Plan
    default = plans[0][1]
    if default.variant == "phased":  # unaligned rows (docs/kernels.md, "layer_norm: backward"): its neighbours,
        # then the kernels it replaced (Triton's scalar accesses on these rows)
        plans += [("phased prefetch", default._replace(prefetch=True)),
                  ("phased no register cap", default._replace(max_regs=None)),
                  ("phased half the groups", default._replace(n_groups=max(16, default.n_groups // 2 // 16 * 16)))]
        if default.num_warps >= 8:
            plans.append(("phased 2 vectors a thread", default._replace(num_warps=default.num_warps // 2)))
        for variant in ("measured", "lean"):
            plans.append((f"{variant} (scalar)", layer_norm._layer_norm_settings(m, n, size, backward=True, device=_sm_device(sm),
                                                                                 variant=variant)))
        return plans
    if not backward and default.mode == "rows" and default.max_regs:  # unaligned rows read as aligned vectors
        for warps in (default.num_warps // 2, default.num_warps * 2):
            if 4 <= warps <= 32:
                plans.append((f"phased rows w={warps}", default._replace(num_warps=warps)))
        plans += [("phased rows no register cap", default._replace(max_regs=None)),
                  ("phased rows regs=80", default._replace(max_regs=80))]
    if not backward:
        if n <= 1024:
            for tile, warps in ((2048, 4), (8192, 8)):
                plans.append((f"rows tile={tile} w={warps}", P("rows", max(1, tile // n), next_power_of_2(n), warps)))
        elif n <= 16384:
            for warps in (4, 8, 16):
                if 4 <= n // (32 * warps) <= 64:
                    plans.append((f"rows w={warps}", P("rows", 1, next_power_of_2(n), warps)))
            if n < 16384:  # a row held by a split-walk program (one slice a row) that loads its next row first
                warps = max(1, next_power_of_2(n) // (32 * 16))
                for per_sm in (2, 4, 8):
                    if warps * per_sm <= 64:
                        plans.append((f"split, a row held w={warps} per_sm={per_sm}",
                                      P("split", 1, next_power_of_2(n), warps, group=1, per_sm=per_sm)))
        if n > layer_norm.MAX_ROW:
            plans.append((f"looped chunk={layer_norm._CHUNK} w={layer_norm._LOOPED_WARPS}",
                          P("looped", 1, layer_norm._CHUNK, layer_norm._LOOPED_WARPS)))
        if n >= 16384:
            # softmax's wide-row walk (docs/kernels.md, "The split walk"): persistent
            # programs, chunk bytes x warps; split slices of 16 KB steps; fp32 slices held in registers.
            for chunk_bytes, warps in ((32768, 16), (65536, 16), (65536, 32)):
                chunk = chunk_bytes // size
                plans.append((f"split group=1 chunk={chunk} w={warps}", P("split", 1, chunk, warps, group=1, per_sm=1)))
            for slice_bytes, chunk_bytes, warps, per_sm in ((65536, 16384, 8, 3), (65536, 65536, 16, 1),
                                                             (32768, 32768, 8, 2), (16384, 16384, 4, 4)):
                chunk = chunk_bytes // size
                group = -(-n * size // slice_bytes)
                if 1 < group <= 64:  # every program of a row must be resident at once
                    held = " hold" if slice_bytes == chunk_bytes else ""
                    plans.append((f"split{held} group={group} chunk={chunk} w={warps} per_sm={per_sm}",
                                  P("split", 1, chunk, warps, group=group, per_sm=per_sm)))
        return plans
    # Programs per multiprocessor only changes runtime arguments: one compile serves each row.
    for ppsm in (1, 2, 8):
        if n <= 4096:
            for block_m, warps in ((1, 4), (4096 // n, 8), (4096 // n, 16)):
                groups = max(1, min(triton.cdiv(m, block_m), sm * ppsm))
                plans.append((f"rows bm={block_m} w={warps} ppsm={ppsm}", P("rows", block_m, next_power_of_2(n), warps, groups)))
                if ppsm == 2:  # the next row block in flight while this one is worked on
                    plans.append((f"rows bm={block_m} w={warps} ppsm={ppsm} prefetch",
                                  P("rows", block_m, next_power_of_2(n), warps, groups, prefetch=True)))
        else:
            for mode, chunk, warps in (("one_pass", 4096, 8), ("one_pass", 4096, 16), ("two_pass", 4096, 8)):
                groups = max(1, min(m, sm * ppsm // triton.cdiv(n, chunk)))
                plans.append((f"{mode} chunk={chunk} w={warps} ppsm={ppsm}", P(mode, 1, chunk, warps, groups)))
    # The register-lean kernel (variant="lean"): its own plan, then the
    # neighbours worth a look: the other register cap, the other chunk, one program fewer an SM.
    lean = layer_norm._layer_norm_settings(m, n, size, backward=True, device=_sm_device(sm), variant="lean")
    plans.append((f"lean {lean.mode} bn={lean.block_n} w={lean.num_warps} regs={lean.max_regs} groups={lean.n_groups}", lean))
    other_cap = 80 if lean.max_regs == 64 else 64
    if other_cap * 32 * lean.num_warps <= 65536:
        plans.append((f"lean regs={other_cap}", lean._replace(max_regs=other_cap)))
    plans.append(("lean half the groups", lean._replace(n_groups=max(1, lean.n_groups // 2))))
    if lean.mode != "rows":
        for chunk in (1024, 4096):
            warps = min(32, chunk * size // 512)
            groups = max(1, min(m, sm * max(1, 32 // warps) // triton.cdiv(n, chunk)))
            plans.append((f"lean one_pass bn={chunk} w={warps}", lean._replace(block_n=chunk, num_warps=warps, n_groups=groups)))
    return plans


def main() -> None:
    args, widths, impls, timing = bandwidth_cli(__doc__.splitlines()[0], lambda p: p.add_argument("--passes", default="forward,backward"))
    json_file = json_path(args, write_output_to(args.out, __file__), __file__)
    sm = torch.cuda.get_device_properties(0).multi_processor_count
    print(header(), flush=True)
    records, tables = [], {}
    for direction in args.passes.split(","):
        backward = direction == "backward"
        for dtype_name in args.dtypes.split(","):
            dtype = DTYPES[dtype_name]
            for m, n in shapes(widths):
                x = torch.randn(m, n, device="cuda", dtype=dtype)
                w = torch.randn(n, device="cuda", dtype=dtype)
                b = torch.randn(n, device="cuda", dtype=dtype)
                nbytes = (3 if backward else 2) * x.numel() * x.element_size()
                rec = {"pass": direction, "dtype": dtype_name, "shape": f"{m}x{n}", "bytes": nbytes}
                rec["copy_gbps"] = copy_gbps(nbytes)
                rec["gbps"] = {}
                size = x.element_size()
                y, mean, rstd = layer_norm.forward(x, w, b, EPS)
                if backward:
                    dy = torch.randn_like(x)
                    fns = backward_fns(x, w, b, dy, mean, rstd, impls)
                    ref = torch.ops.aten.native_layer_norm_backward(
                        dy.float(), x.float(), [n], mean.view(-1, 1), rstd.view(-1, 1), w.float(), b.float(), [True] * 3
                    )
                    ours = layer_norm.backward(dy, x, w, mean, rstd)
                    rec["max_abs_err"] = [(o.float() - r).abs().max().item() for o, r in zip(ours, ref)]
                    grads = (torch.empty_like(x), torch.empty_like(w), torch.empty_like(b))
                    run_plan = lambda plan: layer_norm._backward_launch(dy, x, w, mean, rstd, *grads, plan)  # noqa: E731
                else:
                    fns = forward_fns(x, w, b, impls)
                    ref = F.layer_norm(x.float(), (n,), w.float(), b.float(), EPS)
                    rec["max_abs_err"] = (y.float() - ref).abs().max().item()
                    y2 = torch.empty_like(x)
                    run_plan = lambda plan: layer_norm._forward_launch(  # noqa: E731
                        x, w, b, y2, torch.empty_like(mean), torch.empty_like(rstd), EPS, plan
                    )
                rec["plan"] = layer_norm._layer_norm_settings(m, n, size, backward=backward, device=_sm_device(sm))._asdict()
                time_impls(rec, fns, impls, nbytes, timing, f"{m}x{n} {dtype_name} {direction}")
                if args.sweep:
                    rec["sweep"] = {}
                    for label, plan in plan_variants(m, n, size, backward, sm):
                        try:
                            run_plan(plan)
                            if backward:  # the largest of dx's, dweight's and dbias's errors
                                err = max((g.float() - r).abs().max().item() for g, r in zip(grads, ref))
                            else:
                                err = (y2.float() - ref).abs().max().item()
                            rate = gbps(nbytes, device_ms(lambda: run_plan(plan), **timing)[0])
                            rec["sweep"][label] = {"plan": plan._asdict(), "gbps": rate, "max_abs_err": err}
                            print(f"  sweep {direction} {dtype_name} {m}x{n} {label}: {rate:.0f} GB/s "
                                  f"{100 * rate / rec['copy_gbps']:.0f}% err {err:.2e}", flush=True)
                        except Exception as exc:
                            print(f"  sweep {label} failed: {type(exc).__name__}: {exc}"[:300], flush=True)
                records.append(rec)
                tables.setdefault(direction, []).append(table_row(rec, impls))
                print(direction, " | ".join(str(c) for c in tables[direction][-1]), flush=True)
                del x, w, b, y, mean, rstd, fns
                torch.cuda.empty_cache()
    for direction, rows in tables.items():
        print(f"\nLayer norm {direction}")
        print(markdown_table(table_headers(impls), rows))
    if json_file:
        Path(json_file).write_text(json.dumps({"header": header(), "records": records}, indent=1))



if __name__ == "__main__":
    main()
