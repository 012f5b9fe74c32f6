"""bias + GELU + dropout(p): ours against torch eager, torch.compile and the copy roofline.

Bandwidth counts compulsory bytes only (read x and bias, write y); "% copy" is against a
device-to-device copy of the same byte count measured in the same run. Times are medians
with the L2 flushed between runs. ``--variants`` adds the sweep behind docs/kernels.md
("bias_gelu_dropout"): the first ("measured") kernel without the random draw (p=0), with 7
Philox rounds, with the GELU without fast-math or in its tanh form, and with other tiles
(BLOCK_M, BLOCK_N, num_warps); then the lean kernel (the default: same mask, fewer
instructions an element) with its tiles and programs per SM. ``--kernel measured`` makes the first kernel the "ours (fused)" row.

    PYTHONPATH=. python3 benchmarks/bench_bias_gelu_dropout.py [--quick] [--variants] [--out DIR]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from benchmarks._common import add_out_option, copy_gbps, device_ms, gbps, header, markdown_table, require_cuda
from benchmarks._common import write_output_to
from reference_kernels import bias_gelu_dropout as bgd


def chain(x, bias, p):
    return F.dropout(F.gelu(x + bias), p, training=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one shape, shorter timings")
    parser.add_argument("--variants", action="store_true", help="also time kernel variants")
    parser.add_argument("--p", type=float, default=0.1)
    parser.add_argument("--kernel", choices=bgd._VARIANTS, default=bgd._KERNEL_VARIANT,
                        help="kernel variant behind bgd.fused (default: the module's)")
    add_out_option(parser)
    args = parser.parse_args()
    require_cuda(__file__)
    write_output_to(args.out, __file__)
    bgd._KERNEL_VARIANT = args.kernel
    rep = dict(calls=5, reps=3) if args.quick else dict(calls=10, reps=5)  # device_ms's
    shapes = [((16384, 8192), torch.bfloat16)]
    if not args.quick:
        shapes += [((16384, 8192), torch.float16), ((8192, 8192), torch.float32), ((4096, 65536), torch.bfloat16)]
    compiled = torch.compile(chain, dynamic=False)
    p = args.p

    print(header())
    rows, variant_rows = [], []
    for shape, dtype in shapes:
        torch.manual_seed(0)
        x = torch.randn(shape, device="cuda", dtype=dtype)
        bias = torch.randn(shape[-1], device="cuda", dtype=dtype)
        nbytes = bgd.budget(x, bias, p).total
        copy = copy_gbps(nbytes)
        label = f"{dtype} {shape[0]}x{shape[1]}".replace("torch.", "")

        y = bgd.fused(x, bias, p, seed=1)
        ok = torch.allclose(y.float(), bgd.unfused(x, bias, p, seed=1).float(), atol=2e-2, rtol=2e-2)
        keep_rate = (y != 0).float().mean().item()
        print(f"{label}: matches unfused={ok}, keep rate={keep_rate:.4f} (1-p={1 - p})", flush=True)

        def row(table, name, ms):
            bw = gbps(nbytes, ms)
            table.append([label, name, f"{ms:.3f}", f"{bw:.0f}", f"{100 * bw / copy:.0f}%"])

        row(rows, "copy (same bytes)", nbytes / copy / 1e6)
        impls = {
            "ours (fused)": lambda: bgd.fused(x, bias, p, seed=1),
            "torch eager": lambda: chain(x, bias, p),
            "torch.compile": lambda: compiled(x, bias, p),
        }
        for name, fn in impls.items():
            row(rows, name, device_ms(fn, **rep)[0])

        if args.variants and dtype == torch.bfloat16:
            M, N = x.numel() // shape[-1], shape[-1]
            extra = {
                "measured, p=0 (no random draw)": lambda: bgd._launch(x, bias, 0.0, 1, variant="measured"),
                "measured, 7 Philox rounds": lambda: bgd._launch(x, bias, p, 1, rounds=7, variant="measured"),
                "measured, gelu without fast-math": lambda: bgd._launch(x, bias, p, 1, gelu_mode=0),
                "measured, tanh gelu": lambda: bgd.fused(x, bias, p, seed=1, approximate="tanh"),
            }
            for cfg in [(1, 4096, 4), (1, 4096, 8), (1, 8192, 4), (2, 8192, 16), (1, 2048, 2), (4, 2048, 8)]:
                if cfg != bgd._launch_config(M, N):
                    extra[f"measured, tiles {cfg}"] = lambda cfg=cfg: bgd._launch(x, bias, p, 1, config=cfg, variant="measured")
            # The lean kernel: same mask, fewer instructions an element (docs/kernels.md, "bias_gelu_dropout").
            lean = bgd._launch(x, bias, p, 1, variant="lean")
            measured = bgd._launch(x, bias, p, 1, variant="measured")
            print(f"{label}: lean drops the same elements={torch.equal(lean != 0, measured != 0)}, "
                  f"max |lean - measured|={(lean.float() - measured.float()).abs().max().item():.3g}", flush=True)
            sms = torch.cuda.get_device_properties(x.device).multi_processor_count
            extra["lean"] = lambda: bgd._launch(x, bias, p, 1, variant="lean")
            extra["lean, p=0"] = lambda: bgd._launch(x, bias, 0.0, 1, variant="lean")
            for degree in (5, 7):  # the GELU fit's degree for 16-bit outputs (scripts/gelu_fit.py)
                extra[f"lean, GELU degree {degree}"] = lambda d=degree: bgd._launch(x, bias, p, 1, variant="lean",
                                                                                   gelu_degree=d)
            # 8 elements a thread (39 registers, sm_90 compile) leave room for 48 warps an SM, 16 (59) for 32.
            for cfg in [(1, 8192, 16), (1, 4096, 16), (1, 2048, 8), (2, 4096, 16), (1, 4096, 8)]:
                col_tiles = -(-N // cfg[1])  # the grid's second axis
                for per_sm in (2, 3, 4, 6):
                    extra[f"lean, tiles {cfg}, {per_sm} programs/SM"] = lambda cfg=cfg, k=per_sm * sms // col_tiles: (
                        bgd._launch(x, bias, p, 1, variant="lean", config=cfg, programs=k))
            for cfg in [(1, 8192, 16), (1, 4096, 8)]:  # no loop: the hardware schedules one program a tile
                extra[f"lean, tiles {cfg}, one program a tile"] = lambda cfg=cfg: bgd._launch(
                    x, bias, p, 1, variant="lean", config=cfg, programs=M)
            for name, fn in extra.items():
                row(variant_rows, name, device_ms(fn, **rep)[0])

    headers = ["input", "implementation", "ms", "GB/s", "% copy"]
    print()
    print(markdown_table(headers, rows))
    if variant_rows:
        print()
        print(markdown_table(headers, variant_rows))


if __name__ == "__main__":
    main()
