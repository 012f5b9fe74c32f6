"""How often the CPU kernel model agrees with what CUDA really launches.

Runs every corpus case (eager and compiled) through ``pytest_fusioncheck.profile`` on
CPU and on CUDA and compares kernel counts. Needs a GPU for the CUDA half.

    PYTHONPATH=. python3 benchmarks/cpu_model_agreement.py [--out DIR]
"""

from __future__ import annotations

import argparse
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _common import add_out_option, write_output_to  # noqa: E402
from corpus import cases  # noqa: E402

from pytest_fusioncheck import profile  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_out_option(parser)
    write_output_to(parser.parse_args().out, __file__)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU for the comparison")
        return 1
    rows = []
    for name, make in cases(compiled=True):
        counts = {}
        names = {}
        for device in ("cpu", "cuda"):
            torch._dynamo.reset()
            fn, args = make(device, 1)
            r = profile(fn, *args)
            counts[device] = r.kernel_count
            names[device] = ", ".join(k.short_name for k in r.kernels)
        rows.append((name, counts["cpu"], counts["cuda"], counts["cpu"] == counts["cuda"], names["cpu"], names["cuda"]))
    agree = sum(1 for r in rows if r[3])
    print("| case | CPU model | CUDA | agree | CPU kernels | CUDA kernels |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} | {'yes' if r[3] else 'no'} | {r[4]} | {r[5]} |")
    print(f"\nagreement: {agree}/{len(rows)} cases ({agree / len(rows):.0%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
