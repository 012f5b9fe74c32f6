"""The plugin's kernel counts and modelled bytes against Nsight Compute, case by case (GPU).

Runs the corpus of ``tests/fidelity_cases.py`` (``FIDELITY``: >= 4x the L2; ``BLOCKS``:
real-model blocks, fp32; ``USER_CODE``: training and optimizer steps, losses, partial-touch
ops, closures, as users write them) twice: once under ``ncu`` in a child process (DRAM bytes read +
written per kernel, only kernels inside the plugin's NVTX ranges, one range per case
named after it), once in this process through ``profile_call`` (under ncu, CUPTI belongs
to ncu and the profiler sees no device kernels, so the plugin's own figures come from
here). Prints, per case and per kernel: the plugin's count and ncu's, modelled and
measured bytes, and the verdict of the case's rule (docs/bytes.md):

* ``compulsory``: each kernel's modelled bytes within 10% of measured;
* ``gemm``: GEMM kernels modelled at their compulsory bytes, never above measured
  beyond what the L2 can hold back (writes still in the L2 when a kernel ends are not
  DRAM traffic yet: at most the L2's size); other kernels of the case within 10%;
* ``multi``, ``partial``, ``step``: see ``verdict``.

    PYTHONPATH=$PWD python3 benchmarks/fidelity.py --out DIR [--only 'A|B'] [--write-data [PATH]]
    PYTHONPATH=$PWD python3 benchmarks/fidelity.py --from-data [--only 'A|B']   # the recorded table, no GPU

``--write-data`` also writes ``tests/data/fidelity_h200.json`` (what the CPU tests and
the GPU tests of ``tests/test_fidelity.py`` check against).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, ROOT)
from _common import OUT_HELP, header, markdown_table, write_output_to  # noqa: E402
from fidelity_cases import BLOCKS, FIDELITY, USER_CODE  # noqa: E402

from pytest_fusioncheck.sources import bytes_ncu as counters  # noqa: E402
from pytest_fusioncheck.capture import profile_call  # noqa: E402

MiB = 2**20
DATA = os.path.join(ROOT, "tests", "data", "fidelity_h200.json")
GEMM_NAME = re.compile(r"nvjet|gemm|cutlass|sm90_xmma|ampere_|sm80_|_mm_|matmul|flash|fmha|sdpa|attention", re.I)


def label(name: str) -> str:
    """An NVTX-safe label for a case (ncu's range column splits on quotes and colons)."""
    return re.sub(r"[^A-Za-z0-9_.+=>-]+", "_", name)


def selected(only: str | None):
    parts = [p for p in (only or "").split("|") if p]
    return [c for c in FIDELITY + BLOCKS + USER_CODE if not parts or any(p in c.name for p in parts)]


def run_case(case) -> dict:
    torch._dynamo.reset()
    fn, args = case.make("cuda")
    report = profile_call(fn, args, {}, warmup=1, device="cuda", label=label(case.name), timing=False)
    out = {
        "kernels": [
            {"name": k.name, "bytes": k.bytes, "bytes_estimate": k.bytes_estimate, "op": k.op, "time_s": k.time_s}
            for k in report.kernels
        ],
        "copies": [{"name": k.name, "bytes": k.bytes} for k in report.copies],
        "budget": report.budget.total if report.budget else None,
    }
    del fn, args, report
    torch.cuda.empty_cache()
    return out


def child(only: str | None, path: str) -> None:
    for case in selected(only):
        run_case(case)
    with open(path, "w") as fh:
        fh.write("done")


def is_gemm(kernel_name: str) -> bool:
    return bool(GEMM_NAME.search(kernel_name))


# Kernels moving less than this are judged only by "never above measured" in the partial,
# multi and step rules: their traffic is within what the L2 and DRAM sectors blur.
LARGE = 16 * MiB
# Per-kind tolerance for kernels at or above LARGE (docs/bytes.md).
TOLERANCE = {"compulsory": 0.10, "gemm": 0.10, "partial": 0.10, "step": 0.10, "multi": 0.15}


def verdict(kind: str, model: dict, measured: list[int], l2_bytes: int) -> tuple[bool, list[str]]:
    """Whether a case meets its rule, and a note per kernel that misses it:

    * ``compulsory``: every kernel within 10% of measured;
    * ``gemm``, ``step``: GEMM kernels at compulsory bytes never above measured beyond what
      the L2 holds back; the others within 10% (``step``: those moving >= 16 MiB);
    * ``partial``: every kernel never above measured + 10%, those moving >= 16 MiB within 10%;
    * ``multi``: every launch moving >= 16 MiB within 15%.

    Every rule needs ncu's kernel count to equal the plugin's (every kernel measured). Outside
    ``compulsory`` (cases of >= 4x the L2 per kernel), a kernel may be modelled above what
    DRAM saw by up to the L2's size: writes still in the L2 when it ends, and reads of what the
    previous kernel left there (a training step's 86 MiB gradient fill measured 57-60 MiB).
    A kernel that carries 0 because its op's bytes went to the op's main kernel (a cuDNN
    convolution's separate bias pass) is judged with that kernel: the op's total against the
    op's measured total."""
    kernels = model["kernels"]
    if len(kernels) != len(measured):
        return False, [f"count: plugin {len(kernels)}, ncu {len(measured)}"]
    notes = []
    tolerance = TOLERANCE[kind]
    lenient = kind != "compulsory"
    groups = _op_groups(kernels)
    for i, (k, meas) in enumerate(zip(kernels, measured)):
        if k["bytes"] is None:
            notes.append(f"#{i} unmodelled")
            continue
        group = groups[i]
        if lenient and len(group) > 1:
            if i != group[0]:
                continue  # judged with the op's first kernel, as one
            modelled, meas = sum(kernels[j]["bytes"] or 0 for j in group), sum(measured[j] for j in group)
            gemm = any(is_gemm(kernels[j]["name"]) for j in group)
        else:
            modelled, gemm = k["bytes"], is_gemm(k["name"])
        if kind in ("gemm", "step") and gemm:
            if modelled > meas + l2_bytes:
                notes.append(f"#{i} GEMM modelled {modelled / MiB:.1f} MiB > measured {meas / MiB:.1f} MiB")
            continue
        if lenient and meas <= modelled <= meas + l2_bytes:
            continue  # the L2 held some of its traffic back
        if kind == "partial" and modelled > 1.10 * meas + 4096:
            notes.append(f"#{i} {k['name'][:40]}: modelled {modelled / MiB:.2f} MiB above measured {meas / MiB:.2f} MiB")
            continue
        if kind not in ("compulsory", "gemm") and meas < LARGE:
            continue
        if meas and abs(modelled - meas) / meas > tolerance:
            notes.append(f"#{i} {k['name'][:40]}: modelled {modelled / MiB:.1f} MiB vs measured {meas / MiB:.1f} MiB")
    return not notes, notes


def _op_groups(kernels: list[dict]) -> list[list[int]]:
    """For each kernel, the indices of the kernels of its op launch: a run of consecutive
    kernels of one ATen op of which at most one carries bytes (the op's bytes went to its
    main kernel, docs/bytes.md). Other kernels, and launches sharing an op's bytes (a
    multi-tensor apply's), stand alone."""
    groups: list[list[int]] = [[i] for i in range(len(kernels))]
    i = 0
    while i < len(kernels):
        op = kernels[i].get("op") or ""
        j = i + 1
        while j < len(kernels) and op.startswith("aten::") and kernels[j].get("op") == op:
            j += 1
        run = list(range(i, j))
        if len(run) > 1 and sum(1 for m in run if kernels[m]["bytes"]) <= 1:
            for m in run:
                groups[m] = run
        i = j
    return groups


def recorded_table(path: str, only: str | None, l2_bytes: int = 60 * MiB) -> str:
    """The table of recorded cases (``--from-data``: no GPU needed), each case's rule applied
    to its recorded figures; ``l2_bytes`` is the recording GPU's L2 (the H200's)."""
    with open(path) as fh:
        cases = json.load(fh)["cases"]
    rows = []
    for case in selected(only):
        entry = cases.get(case.name)
        if entry is None:
            rows.append([case.name, case.kind, "-", "-", "-", "-", "-", "not recorded"])
            continue
        measured = [k.get("bytes_measured") for k in entry["kernels"]]
        counted = entry["cuda_kernel_count"] == entry["ncu_kernel_count"]
        if case.kind == "block":
            ok, notes = counted, []
        elif counted:
            ok, notes = verdict(case.kind, {"kernels": entry["kernels"]}, measured, l2_bytes)
        else:
            ok, notes = False, [f"count: plugin {entry['cuda_kernel_count']}, ncu {entry['ncu_kernel_count']}"]
        modelled = sum(k["bytes"] or 0 for k in entry["kernels"])
        meas = sum(m or 0 for m in measured) if counted else 0
        rows.append([
            case.name, case.kind, entry["cuda_kernel_count"], entry["ncu_kernel_count"],
            f"{modelled / MiB:.1f}", f"{meas / MiB:.1f}", f"{meas / modelled:.2f}" if modelled and meas else "-",
            "yes" if ok else "NO: " + "; ".join(notes)[:160],
        ])
    return markdown_table(["case", "rule", "plugin kernels", "ncu kernels", "modelled MiB", "measured MiB", "measured/modelled", "rule met"], rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", metavar="DIR", default=".", help=OUT_HELP)
    parser.add_argument("--only", default=None, help="run only cases whose name contains one of these |-separated strings (with --write-data: the others stay recorded)")
    parser.add_argument("--write-data", nargs="?", const=DATA, default=None, metavar="PATH",
                        help=f"write the data file the tests check against (default {os.path.relpath(DATA, ROOT)})")
    parser.add_argument("--from-data", nargs="?", const=DATA, default=None, metavar="PATH",
                        help="print the table of the recorded cases (no GPU) and exit")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.child:
        child(opts.only, opts.child)
        return 0
    if opts.from_data:
        print(recorded_table(opts.from_data, opts.only))
        return 0
    os.makedirs(opts.out, exist_ok=True)
    write_output_to(opts.out, __file__)
    print(header())
    log = os.path.join(opts.out, "fidelity_ncu.csv")
    done = os.path.join(opts.out, "fidelity_child.done")
    argv = [sys.executable, __file__, "--child", done] + (["--only", opts.only] if opts.only else [])
    cmd = counters.ncu_command(counters.find_ncu(), log, argv)
    print("$", " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=ROOT))
    if proc.returncode != 0 or not os.path.exists(done):
        print(proc.stdout[-3000:], proc.stderr[-3000:])
        return 1
    with open(log) as fh:
        ncu_kernels = counters.parse_ncu_csv(fh.read())
    by_label: dict[str, list] = {}
    for k in ncu_kernels:
        by_label.setdefault(k.label, []).append(k)

    l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
    results = {}
    rows = []
    for case in selected(opts.only):
        model = run_case(case)
        got = by_label.get(label(case.name), [])
        measured = [k.bytes for k in got]
        ok, notes = verdict(case.kind, model, measured, l2) if case.kind != "block" else (len(got) == len(model["kernels"]), [])
        results[case.name] = {
            "kind": case.kind,
            "cuda_kernel_count": len(model["kernels"]),
            "ncu_kernel_count": len(got),
            "kernels": [dict(k, bytes_measured=m) for k, m in zip(model["kernels"], measured)] if len(got) == len(model["kernels"]) else model["kernels"],
            "ncu_names": [k.name for k in got],
            "copies": model["copies"],
            "budget": model["budget"],
            "ok": ok,
            "notes": notes,
            "recorded": header(),
        }
        modelled = sum(k["bytes"] or 0 for k in model["kernels"])
        meas = sum(measured)
        rows.append([
            case.name, case.kind, len(model["kernels"]), len(got),
            f"{modelled / MiB:.1f}", f"{meas / MiB:.1f}", f"{meas / modelled:.3f}" if modelled else "-",
            "yes" if ok else "NO: " + "; ".join(notes)[:160],
        ])
    print(markdown_table(["case", "rule", "plugin kernels", "ncu kernels", "modelled MiB", "measured MiB", "measured/modelled", "rule met"], rows))
    counted = sum(1 for r in results.values() if r["cuda_kernel_count"] == r["ncu_kernel_count"])
    met = sum(1 for r in results.values() if r["ok"] and r["kind"] != "block")
    fid = sum(1 for r in results.values() if r["kind"] != "block")
    print(f"kernel count = ncu's in {counted}/{len(results)} cases; byte rule met in {met}/{fid} fidelity cases")
    with open(os.path.join(opts.out, "fidelity.json"), "w") as fh:
        json.dump(results, fh, indent=1)
    if opts.write_data:
        os.makedirs(os.path.dirname(os.path.abspath(opts.write_data)), exist_ok=True)
        cases = {}
        if opts.only and os.path.exists(opts.write_data):  # a part re-run: the other cases stay
            with open(opts.write_data) as fh:
                cases = json.load(fh).get("cases", {})
        cases.update(results)
        with open(opts.write_data, "w") as fh:
            json.dump({"device": header(), "cases": cases}, fh, indent=1, sort_keys=True)
        print(f"wrote {opts.write_data}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
