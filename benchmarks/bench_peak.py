"""The plugin's peak bandwidth against an independent copy timed in the same process (GPU).

``roofline.measure_copy_bandwidth("cuda")`` three times, then at each of its sizes alone,
against ``triton.testing.do_bench`` of one 2 GiB-each-way device copy, and the previous
method (one 1 GiB copy per event pair, median of 10) for comparison. Prints bytes/s and
writes the JSON that ``tests/data/peak_h200.json`` holds (docs/roofline.md, "Peak bandwidth").

    PYTHONPATH=$PWD python3 benchmarks/bench_peak.py --out DIR [--write-data [PATH]]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)
from _common import OUT_HELP, header, require_cuda, write_output_to  # noqa: E402

from pytest_fusioncheck.roofline import _GPU_COPY_SIZES, measure_copy_bandwidth  # noqa: E402

DATA = os.path.join(ROOT, "tests", "data", "peak_h200.json")


def independent_copy(nbytes: int = 2 << 30, reps: int = 3) -> list[float]:
    import triton.testing

    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    ms = [triton.testing.do_bench(lambda: dst.copy_(src), warmup=25, rep=200) for _ in range(reps)]
    return [2 * nbytes / (m * 1e-3) for m in ms]


def lone_copy(nbytes: int = 1 << 29, reps: int = 10) -> float:
    """The previous method: one copy per event pair, median of ``reps``."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    times = []
    for _ in range(reps + 2):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e-3)
    return 2 * nbytes / statistics.median(times[2:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", metavar="DIR", default=".", help=OUT_HELP)
    parser.add_argument("--write-data", nargs="?", const=DATA, default=None, metavar="PATH")
    opts = parser.parse_args()
    require_cuda(__file__)
    os.makedirs(opts.out, exist_ok=True)
    write_output_to(opts.out, __file__)
    print(header())
    res: dict = {"plugin_new": [measure_copy_bandwidth("cuda") for _ in range(3)]}
    for n in _GPU_COPY_SIZES:
        res[f"plugin_size_{n >> 20}MiB"] = measure_copy_bandwidth("cuda", nbytes=n)
    res["do_bench_4GiB"] = independent_copy()
    res["old_method_1GiB"] = lone_copy()
    for key, value in res.items():
        values = value if isinstance(value, list) else [value]
        print(f"{key:24s} " + ", ".join(f"{v / 1e12:.3f} TB/s" for v in values))
    if opts.write_data:
        with open(opts.write_data, "w") as fh:
            json.dump(res, fh, indent=1)
        print(f"wrote {opts.write_data}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
