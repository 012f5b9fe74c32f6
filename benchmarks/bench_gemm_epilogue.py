"""GEMM + bias + GELU: ours against cuBLAS, cuBLASLt's own epilogue, the eager chain and torch.compile.

Sweeps M from 1 to 16384 tokens (1000: odd) over (K, N) of public model layers (BERT / GPT-2 768x3072 and
back, Llama-2 4096 / 11008, Mistral 14336, Llama-2-13B 5120 / 13824, Llama-2-70B 8192 / 28672, SigLIP
1152 / 4304) and odd sizes (1000 x 1000; 4095 x 4097, whose rows break TMA's 16-byte rule), and prints,
per shape, TFLOPS (2*M*N*K over the device time) for: ours (``fused``, exact GELU, with the config its
shape bucket tuned to, the library's paths among them: ``gemm_epilogue.LIBRARY``, ``LIBRARY_LT``), ours with
``approximate="tanh"`` (``ours_tanh``: the function cuBLASLt's epilogue computes), ``torch.mm`` alone,
``torch._addmm_activation`` (cuBLASLt's bias + GELU epilogue, tanh GELU), the eager chain
``gelu(mm + bias)`` and ``torch.compile`` of the chain (``dynamic=True``: one compilation for the
sweep). Then, per dtype, the worst shape's ratio of ours to ``_addmm_activation`` (exact GELU against
its tanh GELU, issue 12's literal target), of ours_tanh to it (the same function on both sides) and
of ours to the eager chain (issue 12's target: >= 0.9x and > 1x at every shape), and the shapes that
miss it.

Times are device times: calls replayed from a CUDA graph, rotating over enough input sets
(at least 128 MiB, twice the H200's L2) that no call finds its operands in L2
(``rotated_device_ms``). ``--variants`` also lists the candidate timings each bucket's
tuning took (``gemm_epilogue._timings``). docs/kernels.md, "gemm_epilogue".

    PYTHONPATH=. python3 benchmarks/bench_gemm_epilogue.py [--dtypes bfloat16,float16] [--ms 64,128]
        [--quick] [--budget-s 150] [--variants] [--set _gemm_common.TANH_FAST=False]
        [--configs "(64,128,64,8,1,4,4,1,2)"]
        [--out DIR]    (DIR/bench_gemm_epilogue.json; --tables FILE prints its summary again, no GPU)

``--configs`` also times each given config (``gemm_epilogue._launch``'s tuple: BLOCK_M, BLOCK_N, BLOCK_K,
GROUP_M, epilogue split, stages, warps, programs an SM, split-K; or ``ws(BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M,
stages, programs an SM[, epilogue split])``, a ``_gemm_ws.WsConfig`` of the warp-specialised kernel; ";"-separated)
at every shape, forced instead of tuned, and prints them fastest first beside the tuned one.
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from benchmarks._common import add_out_option, header, markdown_table, require_cuda, write_output_to  # noqa: E402
from benchmarks.sweep import apply_settings  # noqa: E402
from reference_kernels import gemm_epilogue as ge  # noqa: E402
from reference_kernels._common import graph_device_ms  # noqa: E402

MS = [1, 16, 64, 128, 256, 512, 1000, 1024, 2048, 4096, 8192, 16384]
# (K, N) of public model layers, and odd sizes: 1000 (no multiple of 16), 4095 x 4097 (rows that break TMA's 16 bytes)
KNS = [(768, 3072), (3072, 768), (4096, 4096), (4096, 11008), (11008, 4096), (4096, 14336), (5120, 13824),
       (8192, 28672), (1152, 4304), (1000, 1000), (4095, 4097)]
# --quick (scripts/gpu_check.sh's gemm stage): issue 12's small, skinny and square shapes, a few minutes of device time
QUICK_MS = [128, 512, 2048, 8192]
QUICK_KNS = [(768, 3072), (3072, 768), (4096, 4096)]
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
IMPLS = ["ours", "ours_tanh", "mm", "addmm_act", "eager", "compile"]


def chain(a, b, bias):
    return F.gelu(torch.mm(a, b) + bias)


def rotated_device_ms(make, fn, min_bytes: int = 128 << 20, reps: int = 7) -> float:
    """Milliseconds a call of ``fn(*make())``: calls over rotating input sets captured in one CUDA
    graph, the graph replayed ``reps`` times, the median replay over the calls in it.

    ``make()`` returns one input set; enough sets are made that together they read ``min_bytes``
    (so a call's operands were evicted from L2 by the calls between), at most 32. The first call
    of each set runs outside the graph (ours tunes its bucket there).
    """
    sets = [make()]
    set_bytes = sum(t.numel() * t.element_size() for t in sets[0] if isinstance(t, torch.Tensor))
    n = max(1, min(32, math.ceil(min_bytes / set_bytes)))
    sets += [make() for _ in range(n - 1)]
    for s in sets:
        fn(*s)
    return graph_device_ms(lambda s: fn(*s), sets, replays=reps)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", default="bfloat16,float16")
    parser.add_argument("--ms", default="", help="comma-separated M values to keep (default: all)")
    parser.add_argument("--kns", default="", help="comma-separated KxN pairs to keep, e.g. 768x3072 (default: all)")
    parser.add_argument("--impls", default=",".join(IMPLS))
    parser.add_argument("--quick", action="store_true", help=f"the issue's headline shapes only (M {QUICK_MS}, KxN "
                        f"{', '.join(f'{k}x{n}' for k, n in QUICK_KNS)}) where --ms / --kns do not name others")
    parser.add_argument("--budget-s", type=float, default=0, help="stop starting shapes after this many seconds")
    parser.add_argument("--variants", action="store_true", help="also print each bucket's candidate timings")
    parser.add_argument("--configs", default="", help='";"-separated config tuples to time at each shape, forced')
    parser.add_argument("--set", action="append", default=[], metavar="MODULE.CONSTANT=VALUE",
                        help="set a reference_kernels constant first (as benchmarks/sweep.py), e.g. "
                             "_gemm_common.TANH_FAST=False")
    parser.add_argument("--tables", metavar="FILE", help="print the summary of a recorded bench_gemm_epilogue.json "
                        "(no GPU)")
    add_out_option(parser)
    args = parser.parse_args(argv)
    if args.tables:
        data = json.loads(Path(args.tables).read_text())
        print(f"# gemm + bias + gelu sweep: {data['header']}")
        impls = [x for x in IMPLS if any(x in r["tflops"] for r in data["records"])]
        _summarise(data["records"], impls)
        return 0
    settings = apply_settings(args.set)
    forced = _parse_configs(args.configs)
    require_cuda(__file__)
    out = write_output_to(args.out, __file__)
    ms = [int(m) for m in args.ms.split(",") if m] or (QUICK_MS if args.quick else MS)
    kns = ([tuple(int(v) for v in kn.split("x")) for kn in args.kns.split(",") if kn]
           or (QUICK_KNS if args.quick else KNS))
    impls = args.impls.split(",")
    compiled = torch.compile(chain, dynamic=True)
    print(f"# gemm + bias + gelu sweep: {header()}" + (f"; set {', '.join(settings)}" if settings else ""))
    t0 = time.monotonic()
    records = []
    gen = torch.Generator(device="cuda").manual_seed(0)
    for dname in args.dtypes.split(","):
        dtype = DTYPES[dname]
        for m in ms:
            for k, n in kns:
                if args.budget_s and time.monotonic() - t0 > args.budget_s:
                    break

                def make(m=m, k=k, n=n):
                    a = torch.randn(m, k, device="cuda", dtype=dtype, generator=gen)
                    b = (torch.randn(k, n, device="cuda", dtype=dtype, generator=gen) / k**0.5).to(dtype)
                    bias = torch.randn(n, device="cuda", dtype=dtype, generator=gen)
                    return a, b, bias

                fns = {
                    "ours": lambda a, b, bias: ge.fused(a, b, bias, "gelu"),
                    "ours_tanh": lambda a, b, bias: ge.fused(a, b, bias, "gelu", approximate="tanh"),
                    "mm": lambda a, b, bias: torch.mm(a, b),
                    "addmm_act": lambda a, b, bias: torch._addmm_activation(bias, a, b, use_gelu=True),
                    "eager": chain,
                    "compile": compiled,
                }
                rec = {"dtype": dname, "M": m, "K": k, "N": n, "tflops": {}}
                a, b, bias = make()
                path, config = ge._run(a, b, torch.empty(m, n, device="cuda", dtype=dtype), bias, None,
                                       ge._activation_code("gelu"))
                ref = ge.unfused(a.float(), b.float(), bias.float(), "gelu")
                rec["rel_err"] = ((ge.fused(a, b, bias, "gelu").float() - ref).norm() / ref.norm()).item()
                if "ours_tanh" in impls:
                    ref = ge.unfused(a.float(), b.float(), bias.float(), "gelu", approximate="tanh")
                    tanh = ge.fused(a, b, bias, "gelu", approximate="tanh").float()
                    rec["rel_err_tanh"] = ((tanh - ref).norm() / ref.norm()).item()
                if config in ge._LIBRARIES:
                    rec["path"], rec["config"] = config, [config]
                else:
                    rec["path"] = "ws" if isinstance(config, ge._gemm_ws.WsConfig) else path
                    rec["config"] = list(config)
                del a, b, bias, ref
                for name in impls:
                    try:
                        msec = rotated_device_ms(make, fns[name])
                        rec["tflops"][name] = round(2 * m * n * k / (msec * 1e-3) / 1e12, 1)
                    except Exception as exc:  # an anchor failing at a shape is a result, not a crash
                        rec["tflops"][name] = None
                        rec.setdefault("errors", {})[name] = f"{type(exc).__name__}: {exc}"[:200]
                if forced:
                    rec["configs"] = _time_configs(make, forced, m, k, n)
                records.append(rec)
                t = rec["tflops"]
                cells = " ".join(f"{x}={t.get(x)}" for x in impls)
                print(f"{dname} {m}x{k}x{n} {cells} cfg={config} err={rec['rel_err']:.1e} "
                      f"[{time.monotonic() - t0:.0f}s]", flush=True)
                torch.cuda.empty_cache()
    _summarise(records, impls)
    if args.variants:
        print("\nCandidate timings per bucket (ms, device time of CUDA-graph replays over copies of a and b twice the L2):")
        for key, timed in ge._timings.items():
            print(f"  {key[1]} M<={key[3]} N<={key[4]} K<={key[5]}: " + ", ".join(f"{c} {t:.4f}" for c, t in timed))
    if out:
        cell = lambda c: [c] if c in ge._LIBRARIES else list(c)  # noqa: E731
        timings = [{"bucket": [str(v) for v in key], "timed": [[cell(c), t] for c, t in timed]}
                   for key, timed in ge._timings.items()]
        (out / "bench_gemm_epilogue.json").write_text(
            json.dumps({"header": header(), "settings": settings, "records": records, "timings": timings}, indent=1))
    return 0


def _summarise(records: list[dict], impls: list[str]) -> None:
    rows, misses, worst = [], [], {}
    for rec in records:
        t = rec["tflops"]
        lt = t.get("addmm_act")
        ratios = {"addmm_act": _ratio(t.get("ours"), lt), "addmm_act, both tanh": _ratio(t.get("ours_tanh"), lt),
                  "eager": _ratio(t.get("ours"), t.get("eager"))}
        rows.append([rec["dtype"], f"{rec['M']}x{rec['K']}x{rec['N']}"] + [t.get(x) or "n/a" for x in impls]
                    + [f"{r:.2f}x" if r else "n/a" for r in ratios.values()]
                    + [_config_cell(rec["config"])])
        for what, ratio in ratios.items():
            if ratio is None:
                continue
            w = worst.setdefault((rec["dtype"], what), (ratio, rec))
            if ratio < w[0]:
                worst[(rec["dtype"], what)] = (ratio, rec)
        vs_lt, vs_tanh, vs_eager = ratios.values()
        if vs_lt is not None and (vs_lt < 0.9 or (vs_eager is not None and vs_eager <= 1.0)):
            misses.append(f"{rec['dtype']} {rec['M']}x{rec['K']}x{rec['N']}: {vs_lt:.2f}x addmm_act"
                          + (f" ({vs_tanh:.2f}x with both tanh)" if vs_tanh else "")
                          + (f", {vs_eager:.2f}x eager" if vs_eager else ""))
    print()
    print(markdown_table(["dtype", "MxKxN"] + [f"{x} TFLOPS" for x in impls]
                         + ["ours/addmm_act", "ours_tanh/addmm_act", "ours/eager", "ours tile, split"], rows))
    print()
    for (dname, what), (ratio, rec) in sorted(worst.items()):
        print(f"worst ours/{what} {dname}: {ratio:.2f}x at {rec['M']}x{rec['K']}x{rec['N']}")
    print(f"shapes below target (0.9x addmm_act or not faster than eager): {len(misses)} of {len(records)}")
    for line in misses:
        print("  " + line)


def _config_cell(config: list) -> str:
    """A tuned config, short: the tile and split-K of the TMA / tiled kernels' nine fields, the tile of the
    warp-specialised kernel's seven (``_gemm_ws.WsConfig``, "ws"), or the library's path."""
    if len(config) == 1 and config[0] in ge._LIBRARIES:
        return config[0]
    tile = "x".join(map(str, config[:3]))
    return f"{tile} s{config[8]}" if len(config) >= 9 else f"{tile} ws"


def _parse_configs(text: str) -> list[tuple]:
    """``--configs``: ";"-separated tuples of nine ints, or ``ws(...)`` of six or seven (a ``WsConfig``), refused with
    a clear message otherwise."""
    configs = []
    for item in filter(None, (part.strip() for part in text.split(";"))):
        ws = item.startswith("ws(")
        try:
            config = tuple(ast.literal_eval(item[2:] if ws else item))
        except (ValueError, SyntaxError, TypeError):
            raise SystemExit(f"--configs {item!r}: not a tuple literal") from None
        if not all(isinstance(v, int) for v in config) or len(config) not in ((6, 7) if ws else (9,)):
            raise SystemExit(f"--configs {item!r}: " + (
                "expected ws(BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, stages, programs an SM[, epilogue split])" if ws else
                "expected nine ints (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, epilogue split, stages, warps, programs an "
                "SM, split-K)"))
        configs.append(ge._gemm_ws.WsConfig(*config) if ws else config)
    return configs


def _time_configs(make, configs: list[tuple], m: int, k: int, n: int) -> list[list]:
    """TFLOPS of each forced config at one shape (None where it fails to compile or launch), printed fastest first."""
    timed = []
    for config in configs:
        def run(a, b, bias, config=config):
            out = torch.empty(a.shape[0], b.shape[1], device=a.device, dtype=a.dtype)
            ge._run(a, b, out, bias, None, ge._activation_code("gelu"), config=config)
            return out
        try:
            timed.append([list(config), round(2 * m * n * k / (rotated_device_ms(make, run) * 1e-3) / 1e12, 1)])
        except Exception as exc:  # a config that does not fit (shared memory, registers) is a result
            timed.append([list(config), None, f"{type(exc).__name__}: {exc}"[:120]])
    for row in sorted(timed, key=lambda r: -(r[1] or 0)):
        print(f"    {tuple(row[0])}: {row[1]} TFLOPS" + (f" ({row[2]})" if len(row) > 2 else ""))
    return timed


def _ratio(ours, anchor):
    return ours / anchor if ours and anchor else None


if __name__ == "__main__":
    sys.exit(main())
