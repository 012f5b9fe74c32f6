"""Attention forward on the GPU: ours against torch SDPA (flash backend) and the unfused chain.

Shapes as in the FlashAttention-2 paper's benchmarks: 16384 tokens a batch (batch = 16384 /
seq) and a model width of 2048 (heads = 2048 / head_dim), for seq 512 to 8192, head_dim 64
and 128, causal and not. TFLOPS count the two matmuls, 4 * B * H * N^2 * D, halved when
causal (the convention of FlashAttention's benchmarks); times are medians with the L2
flushed between runs. "bytes" are the fused budget (q, k, v read once, o written once) and
``attention.unfused_traffic`` (the N x N scores written and read by each op of the chain).
``--variants`` also times launch plans around ``attention._attention_settings``' pick, through
pointers and through TMA (the sweep behind the plan table, docs/kernels.md "attention");
``--ws-variants`` prints instead the warp-specialised kernel's plans (``_attention_ws``: two or three
consumers, one tile a program or the walk) against cuDNN, graph replays, the plan's pick marked (the A/B behind
``_attention_ws.plan``; ``--width`` and ``--tokens`` set the shapes). ``--impls ...,cudnn`` adds SDPA's cuDNN backend, the yardstick of issue 55. ``--plugin-bytes`` prints instead
what the plugin itself counts of one head, fused vs unfused, as N grows.

    PYTHONPATH=. python3 benchmarks/bench_attention.py                     # full table, bf16
    PYTHONPATH=. python3 benchmarks/bench_attention.py --quick --out gpu-results   # also gpu-results/bench_attention.{txt,json}
    PYTHONPATH=. python3 benchmarks/bench_attention.py --quick --variants --seqs 2048,8192
    PYTHONPATH=. python3 benchmarks/bench_attention.py --quick --impls ours,flash,cudnn --seqs 2048,4096,16384
    PYTHONPATH=. python3 benchmarks/bench_attention.py --dtype float16 --impls ours,flash
    PYTHONPATH=. python3 benchmarks/bench_attention.py --ws-variants --width 768 --tokens 8192 --seqs 512,1024,2048,4096
    PYTHONPATH=. python3 benchmarks/bench_attention.py --plugin-bytes 1024,2048,4096,8192,16384,32768
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from benchmarks._common import add_out_option, bench_ms, header, markdown_table  # noqa: E402
from benchmarks._common import require_cuda, write_output_to  # noqa: E402
from reference_kernels import _attention_ws, _device, attention  # noqa: E402
from reference_kernels._common import graph_device_ms  # noqa: E402

TOKENS = 16384
MODEL_WIDTH = 2048
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
IMPLS = ("ours", "flash", "cudnn", "unfused")
DEFAULT_IMPLS = ("ours", "flash", "unfused")
MiB = 2**20


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter timing runs")
    parser.add_argument("--seqs", default="512,1024,2048,4096,8192", help="comma-separated sequence lengths")
    parser.add_argument("--head-dims", default="64,128", help="comma-separated head dims (64, 128)")
    parser.add_argument("--causal", default="both", choices=("both", "yes", "no"))
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    parser.add_argument("--impls", default=",".join(DEFAULT_IMPLS),
                        help=f"comma-separated, of {', '.join(IMPLS)} (cudnn: SDPA's cuDNN backend, issue 55's yardstick)")
    parser.add_argument("--variants", action="store_true", help="also time launch plans around the default")
    parser.add_argument("--ws-variants", action="store_true",
                        help="instead: the warp-specialised kernel's plans against cuDNN, graph TFLOPS (sm_90, 16-bit)")
    parser.add_argument("--width", type=int, default=MODEL_WIDTH, help=f"model width: heads = width / head_dim "
                        f"(default {MODEL_WIDTH})")
    parser.add_argument("--tokens", type=int, default=TOKENS, help=f"tokens a batch: batch = tokens / seq (default {TOKENS})")
    parser.add_argument("--plugin-bytes", default="", metavar="SEQS",
                        help="instead: the plugin's kernels and modelled bytes, fused vs unfused, at these sequence "
                             "lengths (one batch, one head of 64, causal; e.g. 1024,2048,4096,8192,16384,32768)")
    parser.add_argument("--json", default="", help="write every figure to this file (default with --out: DIR/bench_attention.json)")
    add_out_option(parser)
    args = parser.parse_args(argv)
    unknown = set(args.impls.split(",")) - set(IMPLS)
    if unknown:
        parser.error(f"unknown impls {', '.join(sorted(unknown))}; choose from {', '.join(IMPLS)}")
    return args


def flops(b: int, h: int, n: int, d: int, causal: bool) -> float:
    return 4.0 * b * h * n * n * d / (2 if causal else 1)


def sdpa(q, k, v, causal, backend: str = "FLASH_ATTENTION"):
    """torch's SDPA on one backend (``SDPBackend``'s name: flash, or cuDNN's ``CUDNN_ATTENTION``)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(getattr(SDPBackend, backend)):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def plan_variants(default: attention._Plan) -> list[tuple[str, attention._Plan]]:
    """The default plan's neighbours in tile shape, warps and stages, through pointers and through TMA
    (``--variants``)."""
    P = attention._Plan
    out = [("default", default)]
    seen = {default}
    for tma in (False, True):
        for bm, bn in ((128, 64), (128, 128), (64, 64), (128, 32), (64, 32)):
            for warps in (4, 8):
                for stages in (2, 3, 4):
                    plan = P(bm, bn, warps, stages, tma)
                    if plan not in seen:
                        seen.add(plan)
                        out.append((f"{bm}x{bn} w{warps} s{stages}" + (" tma" if tma else ""), plan))
    return out


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    require_cuda(__file__)
    out_dir = write_output_to(args.out, __file__)
    json_file = args.json or (str(out_dir / "bench_attention.json") if out_dir else "")
    timing = dict(warmup_ms=10, rep_ms=40) if args.quick else dict(warmup_ms=25, rep_ms=100)
    dtype = DTYPES[args.dtype]
    impls = args.impls.split(",")
    causals = {"both": (False, True), "yes": (True,), "no": (False,)}[args.causal]
    print(header(), flush=True)
    if args.plugin_bytes:
        plugin_bytes([int(x) for x in args.plugin_bytes.split(",")], dtype, args.dtype, json_file)
        return
    if args.ws_variants:
        ws_variants(args, dtype, causals, json_file)
        return
    print("launch plans: attention._attention_settings (docs/kernels.md, attention)", flush=True)

    records, rows = [], []
    for d in (int(x) for x in args.head_dims.split(",")):
        for n in (int(x) for x in args.seqs.split(",")):
            b, h = max(1, args.tokens // n), args.width // d
            torch.manual_seed(0)
            q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=dtype) for _ in range(3))
            fused_bytes = attention.budget(q, k, v).total
            for causal in causals:
                shape = f"{b}x{h}x{n}x{d}"
                rec = {"dtype": args.dtype, "shape": shape, "causal": causal, "tflops": {},
                       "fused_bytes": fused_bytes,
                       "unfused_bytes": attention.unfused_traffic(q, k, v, causal=causal).total,
                       "plan": attention._attention_settings(d, dtype, n)._asdict()}
                fns = {
                    "ours": lambda: attention.fused(q, k, v, causal=causal),
                    "flash": lambda: sdpa(q, k, v, causal),
                    "cudnn": lambda: sdpa(q, k, v, causal, "CUDNN_ATTENTION"),
                    "unfused": lambda: attention.unfused(q, k, v, causal=causal),
                }
                work = flops(b, h, n, d, causal)
                if "ours" in impls or "flash" in impls:
                    try:
                        expected = sdpa(q, k, v, causal).float()
                        rec["max_abs_err_vs_flash"] = (attention.fused(q, k, v, causal=causal).float() - expected).abs().max().item()
                        del expected
                    except Exception as exc:
                        print(f"  check failed at {shape}: {type(exc).__name__}: {exc}"[:300], flush=True)
                for name in impls:
                    try:
                        ms = bench_ms(fns[name], **timing)
                        rec["tflops"][name] = work / (ms * 1e-3) / 1e12
                    except Exception as exc:  # flash missing for a dtype, the chain out of memory: n/a
                        print(f"  {name} failed at {shape}: {type(exc).__name__}: {exc}"[:300], flush=True)
                        rec["tflops"][name] = None
                    torch.cuda.empty_cache()
                if args.variants:
                    rec["variants"] = {}
                    out = torch.empty_like(q)
                    scale = d**-0.5
                    for label, plan in plan_variants(attention._attention_settings(d, dtype, n)):
                        try:
                            ms = bench_ms(lambda: attention._launch(q, k, v, out, causal, scale, plan), **timing)
                            rec["variants"][label] = work / (ms * 1e-3) / 1e12
                            print(f"  variant {shape} causal={causal} {label}: {rec['variants'][label]:.0f} TFLOPS", flush=True)
                        except Exception as exc:  # out of shared memory or registers: skipped
                            print(f"  variant {label} failed: {type(exc).__name__}: {exc}"[:300], flush=True)
                records.append(rec)
                rows.append(table_row(rec, impls))
                print(" | ".join(str(c) for c in rows[-1]), flush=True)
            del q, k, v
            torch.cuda.empty_cache()
    print()
    print(markdown_table(table_headers(impls), rows))
    if json_file:
        Path(json_file).write_text(json.dumps({"header": header(), "records": records}, indent=1))


WS_PLANS = {"c3": _attention_ws.WsPlan(128, 3, 3), "c2": _attention_ws.WsPlan(128, 3, 2),
            "walk": _attention_ws.WsPlan(128, 3, 2, True)}


def ws_variants(args: argparse.Namespace, dtype: torch.dtype, causals: tuple, json_file: str) -> None:
    """Each of ``WS_PLANS`` that fits the device (``_attention_ws.plan``'s rules) and cuDNN's SDPA, graph-replay
    TFLOPS (``graph_device_ms``), the plan's pick marked ``*``, each plan's largest error against SDPA in fp32."""
    if not _attention_ws.available(torch.cuda.current_device()):
        raise SystemExit("--ws-variants: the warp-specialised kernel does not run here (sm_90, Gluon)")
    device = _device.of(torch.device("cuda"))
    elt = torch.empty((), dtype=dtype).element_size()
    names = list(WS_PLANS) + ["cudnn"]
    records, rows = [], []
    for d in (int(x) for x in args.head_dims.split(",")):
        need = _attention_ws.consumer_regs(d, _attention_ws.BLOCK_N)
        runs = {name: p for name, p in WS_PLANS.items()
                if _attention_ws.fits_device(d, elt, p, device) and _attention_ws.regs(p, device)[1] >= need
                and (not p.walk or _attention_ws.walks(d, elt, p, device))}
        for n in (int(x) for x in args.seqs.split(",")):
            b, h = max(1, args.tokens // n), args.width // d
            torch.manual_seed(0)
            q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=dtype) for _ in range(3))
            out = torch.empty_like(q)
            for causal in causals:
                work = flops(b, h, n, d, causal)
                pick = _attention_ws.plan(d, elt, device, n, causal)
                expected = sdpa(q.float(), k.float(), v.float(), causal, "MATH")
                rec = {"shape": f"{b}x{h}x{n}x{d}", "causal": causal, "plan": list(pick) if pick else None,
                       "tflops": {}, "max_abs_err": {}}
                for name, p in runs.items():
                    launch = lambda _: _attention_ws.launch(q, k, v, out, causal, d**-0.5 * attention._LOG2E, p)  # noqa: E731,B023
                    launch(None)
                    rec["max_abs_err"][name] = (out.float() - expected).abs().max().item()
                    rec["tflops"][name] = work / graph_device_ms(launch, [None], replays=10) / 1e9
                cudnn = lambda _: sdpa(q, k, v, causal, "CUDNN_ATTENTION")  # noqa: E731,B023
                rec["tflops"]["cudnn"] = work / graph_device_ms(cudnn, [None], replays=10) / 1e9
                records.append(rec)
                picked = next((name for name, p in runs.items() if p == pick), None)
                rows.append([rec["shape"], "yes" if causal else "no"]
                            + [("n/a" if name not in rec["tflops"] else f"{rec['tflops'][name]:.0f}"
                                + ("*" if name == picked else "")) for name in names]
                            + [f"{max(rec['max_abs_err'].values(), default=0):.1e}"])
                print(" | ".join(rows[-1]), flush=True)
            del q, k, v, out
            torch.cuda.empty_cache()
    print()
    print(markdown_table(["shape", "causal"] + [f"{name} TFLOPS" for name in names] + ["max err vs SDPA (fp32)"], rows))
    if json_file:
        Path(json_file).write_text(json.dumps({"header": header(), "records": records}, indent=1))


def plugin_bytes(seqs: list[int], dtype: torch.dtype, dtype_name: str, json_file: str) -> None:
    """What the plugin sees of one head (B = H = 1, D = 64, causal): kernels and modelled bytes.

    The point of the seed in numbers: the unfused chain's bytes grow as N^2 (the scores go
    through HBM once per op), the fused kernel's as N (q, k, v read once, o written once).
    """
    from pytest_fusioncheck import profile

    records, rows = [], []
    for n in seqs:
        torch.manual_seed(0)
        q, k, v = (torch.randn(1, 1, n, 64, device="cuda", dtype=dtype) for _ in range(3))
        fused = profile(attention.fused, q, k, v, causal=True)
        try:
            unfused = profile(attention.unfused, q, k, v, causal=True)
        except torch.OutOfMemoryError:
            unfused = None
        rec = {"seq": n, "fused_kernels": fused.kernel_count, "fused_bytes": fused.bytes,
               "budget": attention.budget(q, k, v).total,
               "unfused_kernels": unfused.kernel_count if unfused else None,
               "unfused_bytes": unfused.bytes if unfused else None,
               "unfused_commented": attention.unfused_traffic(q, k, v, causal=True).total}
        records.append(rec)
        ratio = f"{rec['unfused_bytes'] / rec['fused_bytes']:.0f}x" if unfused and rec["fused_bytes"] else "n/a"
        rows.append([dtype_name, n, rec["fused_kernels"], f"{rec['fused_bytes'] / MiB:.2f}",
                     "n/a" if unfused is None else rec["unfused_kernels"],
                     "n/a" if unfused is None else f"{rec['unfused_bytes'] / MiB:.0f}",
                     f"{rec['unfused_commented'] / MiB:.0f}", ratio])
        print(" | ".join(str(c) for c in rows[-1]), flush=True)
        del q, k, v, fused, unfused
        torch.cuda.empty_cache()
    print()
    print(markdown_table(["dtype", "N", "fused kernels", "fused MiB (plugin)", "unfused kernels",
                          "unfused MiB (plugin)", "unfused MiB (line comments)", "unfused / fused"], rows))
    if json_file:
        Path(json_file).write_text(json.dumps({"header": header(), "plugin_bytes": records}, indent=1))


def table_headers(impls: list[str]) -> list[str]:
    cols = ["dtype", "B x H x N x D", "causal"] + [f"{name} TFLOPS" for name in impls]
    cols += [f"ours / {name}" for name in ("flash", "cudnn") if "ours" in impls and name in impls]
    return cols + ["fused MiB", "unfused MiB", "unfused / fused bytes", "max err vs flash"]


def table_row(rec: dict, impls: list[str]) -> list[object]:
    t = rec["tflops"]
    row: list[object] = [rec["dtype"], rec["shape"], "yes" if rec["causal"] else "no"]
    row += ["n/a" if t.get(name) is None else f"{t[name]:.0f}" for name in impls]
    for name in ("flash", "cudnn"):
        if "ours" in impls and name in impls:
            row.append(f"{t['ours'] / t[name]:.2f}x" if t.get("ours") and t.get(name) else "n/a")
    err = rec.get("max_abs_err_vs_flash")
    row += [f"{rec['fused_bytes'] / MiB:.0f}", f"{rec['unfused_bytes'] / MiB:.0f}",
            f"{rec['unfused_bytes'] / rec['fused_bytes']:.0f}x", "n/a" if err is None else f"{err:.1e}"]
    return row


if __name__ == "__main__":
    main()
