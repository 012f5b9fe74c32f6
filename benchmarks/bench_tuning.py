"""What a tuned file buys: each subject's plans with the tuned choices against its defaults (docs/kernels.md, "Planning").

A GPU that ``reference_kernels/tuned/`` does not cover, or a Triton other than the file's, plans with the defaults
(``_device.tuning``). This script times both on the GPU it runs on, at model widths, so the table says what those GPUs
lose: the layer norm's forward and backward and softmax over ~64 MB of input, each call replayed from a CUDA graph
(``device_ms``), in % of a same-size device copy timed the same way. Both plans of a width run on the same tensors in
the same process; only the ratio ``default / tuned`` is compared across machines.

    PYTHONPATH=$PWD python3 benchmarks/bench_tuning.py [--widths 768,4096] [--out DIR]
    PYTHONPATH=$PWD python3 benchmarks/bench_tuning.py --tables benchmarks/data/bench_tuning_h100.json   # no GPU
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path
from typing import Iterator

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from benchmarks._common import (add_out_option, copy_gbps, device_ms, gbps, header, markdown_table,  # noqa: E402
                                require_cuda, write_output_to)

# hidden sizes of public model configs (GPT-2 768-1600, ViT/SigLIP 1152, Llama 2048-8192, Mixtral 14336) and two
# ragged widths (999: no multiple of 16; 4097: one past a power of two)
WIDTHS = (768, 1024, 1152, 1600, 2048, 2304, 3072, 4096, 4608, 5120, 7168, 8192, 12288, 14336, 999, 4097)
DTYPES = ("bfloat16", "float32")
SUBJECTS = ("layer norm forward", "layer norm backward", "softmax")
INPUT_BYTES = 64 << 20


@contextlib.contextmanager
def untuned() -> Iterator[None]:
    """Plans inside take the defaults, as on a GPU no tuned file covers; the records made under them are dropped."""
    from reference_kernels import _device, _launch

    saved = _device.tuned_here
    _device.tuned_here = lambda device: False
    _launch.forget()
    try:
        yield
    finally:
        _device.tuned_here = saved
        _launch.forget()


def measure(n_cols: int, dtype: torch.dtype) -> dict:
    """% of copy of each subject at ``n_cols``, tuned and default, on ~``INPUT_BYTES`` of rows."""
    from reference_kernels import layer_norm, softmax

    size = dtype.itemsize
    n_rows = max(64, INPUT_BYTES // (n_cols * size))
    x = torch.randn(n_rows, n_cols, device="cuda", dtype=dtype)
    w, b = (torch.randn(n_cols, device="cuda", dtype=dtype) for _ in range(2))
    dy = torch.randn_like(x)
    _, mean, rstd = layer_norm.forward(x, w, b)
    moved = {"layer norm forward": 2 * x.numel() * size, "layer norm backward": 3 * x.numel() * size,
             "softmax": 2 * x.numel() * size}  # compulsory bytes of the rows (the (N,) parameters and stats aside)
    calls = {"layer norm forward": lambda: layer_norm.forward(x, w, b),
             "layer norm backward": lambda: layer_norm.backward(dy, x, w, mean, rstd),
             "softmax": lambda: softmax.fused(x)}
    copy = {nbytes: copy_gbps(nbytes) for nbytes in set(moved.values())}
    rec = {"n_cols": n_cols, "n_rows": n_rows, "dtype": str(dtype)[6:], "tuned": {}, "default": {}}
    for how, scope in (("tuned", contextlib.nullcontext), ("default", untuned)):
        with scope():
            for subject in SUBJECTS:
                ms, _ = device_ms(calls[subject])
                rec[how][subject] = 100 * gbps(moved[subject], ms) / copy[moved[subject]]
    return rec


HEADERS = ["width", "dtype", "rows"] + [f"{s} {how}" for s in SUBJECTS for how in ("tuned", "default / tuned")]


def table_row(rec: dict) -> list[str]:
    row = [str(rec["n_cols"]), rec["dtype"], str(rec["n_rows"])]
    for subject in SUBJECTS:
        tuned, default = rec["tuned"][subject], rec["default"][subject]
        row += [f"{tuned:.0f}%", f"{default / tuned:.2f}x"]
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", default="", help="comma-separated widths (default: the model widths above)")
    parser.add_argument("--tables", metavar="FILE", help="print the table of a recorded bench_tuning.json (no GPU)")
    add_out_option(parser)
    args = parser.parse_args(argv)
    try:
        widths = [int(w) for w in args.widths.split(",") if w] or list(WIDTHS)
    except ValueError:
        parser.error(f"--widths takes integers, got {args.widths!r}")
    if any(w < 1 for w in widths):
        parser.error("--widths must be >= 1")
    if args.tables:
        data = json.loads(Path(args.tables).read_text())
        note = f"\n\n{data['note']}" if data.get("note") else ""  # rows re-run later, merged in by hand
        print(data["header"] + note + "\n\n" + markdown_table(HEADERS, [table_row(r) for r in data["rows"]]))
        return 0
    require_cuda(__file__)
    out = write_output_to(args.out, __file__)
    print(header())
    rows = [measure(n, getattr(torch, d)) for n in widths for d in DTYPES]
    print(markdown_table(HEADERS, [table_row(r) for r in rows]))
    if out:
        (out / "bench_tuning.json").write_text(json.dumps({"header": header(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
