"""GEMM + bias + GELU (bf16): ours against torch.mm and the ways PyTorch users write it.

Prints, per square size, TFLOPS (2*M*N*K over the median time, L2 flushed between
runs) and the percentage of torch.mm's TFLOPS measured in the same run for: torch.mm
alone, our fused kernel (exact GELU), the eager chain mm + bias + gelu,
``torch._addmm_activation`` (cuBLASLt's own bias+GELU epilogue, which uses the tanh
GELU), and torch.compile of the chain. ``--variants`` adds our kernel without an
epilogue, with the tanh GELU, and each candidate config with each exact-GELU fit (degree 9,
7, 5): the sweep behind docs/kernels.md ("gemm_epilogue").

    PYTHONPATH=. python3 benchmarks/bench_gemm_epilogue.py [--quick] [--variants] [--out DIR]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from benchmarks._common import add_out_option, bench_ms, header, markdown_table, write_output_to
from reference_kernels import gemm_epilogue as ge


def chain(a, b, bias):
    return F.gelu(torch.mm(a, b) + bias)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter timings")
    parser.add_argument("--variants", action="store_true", help="also time epilogue variants and each config")
    parser.add_argument("--sizes", type=int, nargs="+", default=[4096, 8192])
    add_out_option(parser)
    args = parser.parse_args()
    write_output_to(args.out, __file__)
    rep = dict(warmup_ms=25, rep_ms=60) if args.quick else dict(warmup_ms=25, rep_ms=200)
    dtype = torch.bfloat16
    compiled = torch.compile(chain, dynamic=False)

    print(header())
    rows, variant_rows = [], []
    for n in args.sizes:
        torch.manual_seed(0)
        a = torch.randn(n, n, device="cuda", dtype=dtype)
        b = torch.randn(n, n, device="cuda", dtype=dtype)
        bias = torch.randn(n, device="cuda", dtype=dtype)
        flops = 2.0 * n**3

        ours = ge.fused(a, b, bias, "gelu")  # first call tunes the config list
        ref = ge.unfused(a.float(), b.float(), bias.float(), "gelu")
        rel = ((ours.float() - ref).norm() / ref.norm()).item()
        key = next(k for k in ge._tuned if k[1:4] == (n, n, n) and k[6] == ge._activation_code("gelu"))
        config = ge._tuned[key]

        impls = {
            "torch.mm": lambda: torch.mm(a, b),
            "ours (mm+bias+gelu fused)": lambda: ge.fused(a, b, bias, "gelu"),
            "eager mm+bias+gelu": lambda: chain(a, b, bias),
            "_addmm_activation(gelu, tanh)": lambda: torch._addmm_activation(bias, a, b, use_gelu=True),
            "torch.compile(mm+bias+gelu)": lambda: compiled(a, b, bias),
        }
        times = {name: bench_ms(fn, **rep) for name, fn in impls.items()}
        mm_tflops = flops / (times["torch.mm"] * 1e-3) / 1e12
        for name, ms in times.items():
            tflops = flops / (ms * 1e-3) / 1e12
            rows.append([f"{n}x{n}x{n}", name, f"{ms:.3f}", f"{tflops:.0f}", f"{100 * tflops / mm_tflops:.0f}%"])
        print(f"{n}^3: path={key[0]} config={config} rel_err_vs_fp32={rel:.2e}", flush=True)

        if args.variants:
            out = torch.empty(n, n, device="cuda", dtype=dtype)
            path = key[0]
            extra = {  # the tuned config, so that only one more kernel is compiled for each
                "ours, no epilogue": lambda: ge._run(a, b, out, None, None, 0, path=path, config=config),
                "ours, bias+gelu(tanh)": lambda: ge._run(a, b, out, bias, None, ge._activation_code("gelu", "tanh"),
                                                         path=path, config=config),
            }
            gelu = ge._activation_code("gelu")
            for cfg in ge._gemm_configs(key[0], n, n, n):
                for degree in (9, 7, 5):  # the exact GELU's fit (_math.gelu): erfcc's 9, then 2 and 4 FMAs fewer
                    extra[f"ours cfg {cfg}, GELU degree {degree}"] = (
                        lambda cfg=cfg, d=degree: ge._run(a, b, out, bias, None, gelu, path=path, config=cfg,
                                                          gelu_degree=d)
                    )
            for name, fn in extra.items():
                ms = bench_ms(fn, **rep)
                tflops = flops / (ms * 1e-3) / 1e12
                pct = f"{100 * tflops / mm_tflops:.0f}%"
                variant_rows.append([f"{n}x{n}x{n}", name, f"{ms:.3f}", f"{tflops:.0f}", pct])

    headers = ["shape (MxNxK)", "implementation", "ms", "TFLOPS", "% of torch.mm"]
    print()
    print(markdown_table(headers, rows))
    if variant_rows:
        print()
        print(markdown_table(headers, variant_rows))


if __name__ == "__main__":
    main()
