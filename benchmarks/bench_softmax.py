"""Softmax forward on the GPU: ours against torch eager, torch.compile, Liger-Kernel and a copy.

Bandwidth counts compulsory bytes (read x + write y); ``%copy`` compares
it with a device-to-device copy of the same size timed in the same run. Inputs are
64 to 512 MiB, well over the H200's 60 MB L2.

    PYTHONPATH=. python3 benchmarks/bench_softmax.py                  # full table
    PYTHONPATH=. python3 benchmarks/bench_softmax.py --quick --widths 65536,262144 --dtypes bfloat16
    PYTHONPATH=. python3 benchmarks/bench_softmax.py --sweep --impls ours   # time launch-plan variants too
    PYTHONPATH=. python3 benchmarks/bench_softmax.py --quick --sweep --widths 65536,262144 --impls ours,liger  # wide-row candidates
    PYTHONPATH=. python3 benchmarks/bench_softmax.py --quick --out gpu-results   # also gpu-results/bench_softmax.{txt,json}

Liger-Kernel is optional (``pip install liger-kernel``); without it its column reads n/a.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks._common import ANCHORS, bandwidth_cli, copy_gbps, device_ms, gbps, header, markdown_table, time_impls  # noqa: E402
from benchmarks._common import bandwidth_headers as table_headers  # noqa: E402
from benchmarks._common import json_path, liger_ops, write_output_to  # noqa: E402
from benchmarks._common import bandwidth_row as table_row  # noqa: E402
from reference_kernels import _device, softmax  # noqa: E402
from reference_kernels._common import next_power_of_2  # noqa: E402

SHAPES = [(524288, 256), (131072, 1024), (32768, 4096), (8192, 16384), (2048, 65536), (512, 262144)]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def anchor_fns(x: torch.Tensor) -> dict:
    fns = {"torch": lambda: torch.softmax(x, dim=-1)}
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: torch.softmax(t, dim=-1), dynamic=False)
    fns["compile"] = lambda: compiled(x)
    liger = liger_ops("softmax")
    if liger is not None:
        fns["liger"] = lambda: liger[0](x)[0]
    return fns


def plan_variants(m: int, n: int, size: int, dev: _device.Device) -> list[tuple[str, softmax.Plan]]:
    """Launch plans worth timing at this width on ``dev`` (``--sweep``), the default first."""
    default = softmax.plan(m, n, size, dev)
    P = functools.partial(softmax.Plan, device=dev, tuning=default.tuning)
    plans = [("default", default)]
    if n <= 1024:
        for tile, warps in ((2048, 4), (8192, 8)):
            plans.append((f"rows tile={tile} w={warps}", P("rows", max(1, tile // next_power_of_2(n)), next_power_of_2(n), warps)))
    elif n <= 16384:
        for warps in (8, 16, 32):
            if 4 <= n // (32 * warps) <= 32:
                plans.append((f"rows w={warps}", P("rows", 1, next_power_of_2(n), warps)))
    if n > softmax.MAX_ROW:
        # The L2-resident candidates (docs/kernels.md, "The split walk" and "softmax"): the
        # heuristic's pick first, then neighbours in chunk bytes, warps, programs an SM, slices.
        for wide in ("persistent", "split"):
            plans.append((wide, softmax.plan(m, n, size, dev, wide=wide)))
        for chunk_bytes, warps, per_sm in ((32768, 16, 1), (65536, 32, 1), (131072, 32, 1)):
            chunk = chunk_bytes // size
            plans.append((f"persistent chunk={chunk} w={warps} per_sm={per_sm}", P("persistent", 1, chunk, warps, 1, per_sm)))
        split = softmax.plan(m, n, size, dev, wide="split")
        for group, chunk_bytes, warps, per_sm in (
            (split.group, 16384, 8, 2),
            (split.group, 16384, 8, 4),
            (split.group, 8192, 4, 4),
        ):
            chunk = chunk_bytes // size
            plans.append((f"split group={group} chunk={chunk} w={warps} per_sm={per_sm}", P("split", 1, chunk, warps, group, per_sm)))
        # A slice of one step stays in registers for pass two (HOLD): one HBM read, one write.
        for slice_bytes, warps, per_sm in ((65536, 16, 1), (65536, 16, 2), (32768, 8, 2), (32768, 16, 1),
                                           (16384, 4, 4), (16384, 8, 3)):
            chunk = slice_bytes // size
            group = -(-n // chunk)
            if 1 < group <= 64:  # every program of a row must be resident at once
                plans.append((f"split hold group={group} chunk={chunk} w={warps} per_sm={per_sm}",
                              P("split", 1, chunk, warps, group, per_sm)))
    return plans


def plan_record(plan: softmax.Plan) -> dict:
    """A plan's fields for the JSON (its device and tuning are the run's: ``tuning_source``)."""
    return {f.name: getattr(plan, f.name) for f in dataclasses.fields(plan) if f.compare}


def tuning_source(dev: _device.Device) -> str:
    """Which choices ``softmax.plan`` makes its plans with on ``dev``: its tuned file, or the defaults."""
    return f"tuned/{dev.arch}.json" if _device.tuned_here(dev) else "defaults"


def main() -> None:
    args, widths, impls, timing = bandwidth_cli(__doc__.splitlines()[0])
    json_file = json_path(args, write_output_to(args.out, __file__), __file__)
    dev = _device.of(torch.device("cuda"))
    print(header(), flush=True)
    print(f"softmax plans for {dev.name} (sm_{dev.arch}, {dev.sms} SMs) with {tuning_source(dev)}", flush=True)
    records, rows = [], []
    for dtype_name in args.dtypes.split(","):
        dtype = DTYPES[dtype_name]
        for m, n in SHAPES:
            if widths and n not in widths:
                continue
            x = torch.randn(m, n, device="cuda", dtype=dtype)
            nbytes = softmax.budget(x).total
            rec = {"dtype": dtype_name, "shape": f"{m}x{n}", "bytes": nbytes, "copy_gbps": copy_gbps(nbytes), "gbps": {}}
            expected = torch.softmax(x.float(), dim=-1)
            fns = anchor_fns(x) if any(a in impls for a in ANCHORS) else {}
            if "ours" in impls:
                fns["ours"] = lambda: softmax.fused(x)
                rec["max_abs_err"] = (softmax.fused(x).float() - expected).abs().max().item()
                rec["plan"] = plan_record(softmax.plan(m, n, x.element_size(), dev))
            time_impls(rec, fns, impls, nbytes, timing, f"{m}x{n} {dtype_name}")
            if args.sweep:
                x2, y2 = x, torch.empty_like(x)
                rec["sweep"] = {}
                for label, plan in plan_variants(m, n, x.element_size(), dev):
                    try:
                        softmax._launch(x2, y2, plan)
                        err = (y2.float() - expected).abs().max().item()
                        rate = gbps(nbytes, device_ms(lambda: softmax._launch(x2, y2, plan), **timing)[0])
                        rec["sweep"][label] = {"plan": plan_record(plan), "gbps": rate, "max_abs_err": err}
                        print(f"  sweep {dtype_name} {m}x{n} {label}: {rate:.0f} GB/s {100 * rate / rec['copy_gbps']:.0f}% err {err:.2e}", flush=True)
                    except Exception as exc:
                        print(f"  sweep {label} failed: {type(exc).__name__}: {exc}"[:300], flush=True)
            records.append(rec)
            rows.append(table_row(rec, impls))
            print(" | ".join(str(c) for c in rows[-1]), flush=True)
            del x, expected, fns
            torch.cuda.empty_cache()
    print()
    print(markdown_table(table_headers(impls), rows))
    if json_file:
        Path(json_file).write_text(json.dumps({"header": header(), "tuning": tuning_source(dev), "records": records},
                                              indent=1))



if __name__ == "__main__":
    main()
