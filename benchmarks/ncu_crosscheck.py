"""Kernel counts and bytes of the plugin against Nsight Compute, case by case (GPU).

The script re-runs itself under ``ncu`` (DRAM bytes read + written per kernel, only
kernels inside the plugin's NVTX ranges), then matches ncu's kernels, in launch order, to
the reports the child built. Prints, per case: kernels counted by the plugin and by ncu,
modelled and measured bytes and their ratio. Inputs are several times the 60 MB L2.

    PYTHONPATH=. python3 benchmarks/ncu_crosscheck.py [--scale 128] [--out DIR]

``--out DIR`` (default: the current directory) receives ncu's raw CSV, the child's reports,
``ncu_crosscheck.json`` and a copy of the printed table (``ncu_crosscheck.txt``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import OUT_HELP, write_output_to  # noqa: E402
from corpus import cases  # noqa: E402

from pytest_fusioncheck import counters  # noqa: E402
from pytest_fusioncheck.capture import profile_call  # noqa: E402

MiB = 2**20


def child(scale: int, json_path: str) -> None:
    reports = {}
    for name, make in cases(compiled=True):
        torch._dynamo.reset()
        fn, args = make("cuda", scale)
        r = profile_call(fn, args, {}, warmup=1, device="cuda", label=name)
        reports[name] = [r.to_dict()]
    with open(json_path, "w") as fh:
        json.dump(reports, fh)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scale", type=int, default=1024)
    parser.add_argument("--out", metavar="DIR", default=".", help=OUT_HELP)
    parser.add_argument("--child", default=None)
    opts = parser.parse_args()
    if opts.child:
        child(opts.scale, opts.child)
        return 0
    write_output_to(opts.out, __file__)
    log = os.path.join(opts.out, "ncu_raw.csv")
    js = os.path.join(opts.out, "ncu_child_reports.json")
    cmd = counters.ncu_command(counters.find_ncu(), log, [sys.executable, __file__, "--scale", str(opts.scale), "--child", js])
    print("$", " ".join(cmd))
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0 or not os.path.exists(js):
        print(proc.stdout[-3000:], proc.stderr[-3000:])
        return 1
    with open(log) as fh:
        kernels = counters.parse_ncu_csv(fh.read())
    by_label: dict[str, list] = {}
    for k in kernels:
        by_label.setdefault(k.label, []).append(k)
    # The same cases again, outside ncu: under ncu, CUPTI belongs to ncu and the
    # profiler sees no device kernels, so the plugin's own figures come from here.
    rows = []
    for name, make in cases(compiled=True):
        torch._dynamo.reset()
        fn, args = make("cuda", opts.scale)
        r = profile_call(fn, args, {}, warmup=1, device="cuda", label=name)
        got = by_label.get(name, [])
        meas = sum(k.bytes for k in got)
        rows.append((name, r.kernel_count, len(got), r.bytes, meas, [k.short_name for k in r.kernels], [k.name[:40] for k in got]))
        del fn, args, r
        torch.cuda.empty_cache()
    agree = sum(1 for row in rows if row[1] == row[2])
    print(f"kernel counts equal in {agree}/{len(rows)} cases (plugin's CUDA count vs ncu's count in the same NVTX range)")
    print("| case | plugin kernels | ncu kernels | modelled | measured (DRAM r+w) | measured/modelled |")
    print("|---|---|---|---|---|---|")
    for name, n, m, model, meas, _, _ in rows:
        ratio = f"{meas / model:.3f}" if model else "-"
        print(f"| {name} | {n} | {m} | {model / MiB:.1f} MiB | {meas / MiB:.1f} MiB | {ratio} |")
    with open(os.path.join(opts.out, "ncu_crosscheck.json"), "w") as fh:
        json.dump(rows, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
