"""A batch-1 decode step eager, compiled and compiled with mode="reduce-overhead" (issue 14).

The model is ``examples/test_decode_step.py``'s ``DecodeStep`` (two pre-norm blocks, a KV
cache of 127 positions, one new token). Each variant is profiled by the plugin with
``graph_replay=True``, which times it (median device time and median unprofiled wall time
a call, synchronised, L2 flushed) and replays it from a CUDA graph (docs/launch_bound.md).
The table gives, per variant: kernels, device time, wall time, launch overhead share
((wall - device) / wall), the graph replay's time a call (or why there is none: a
reduce-overhead call already replays a graph), and the share of the eager step's idle time
(eager wall - eager device) that the variant's wall time, or its graph replay, recovers.

    PYTHONPATH=. python3 benchmarks/bench_decode.py [--dtype float32|bfloat16] [--out DIR]

``--device cpu`` runs the same table on CPU as a smoke test (no graphs there).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

import torch  # noqa: E402

from benchmarks._common import add_out_option, header, markdown_table, write_output_to  # noqa: E402
from pytest_fusioncheck.capture import profile_call  # noqa: E402
from pytest_fusioncheck.report import format_time  # noqa: E402
from test_decode_step import DecodeStep  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


# name -> (the callable made of the model, warm-up calls: reduce-overhead records its graph
# on the second call and replays it from the third)
VARIANTS = {
    "eager": (lambda model: model, 1),
    "compiled": (lambda model: torch.compile(model), 1),
    "reduce-overhead": (lambda model: torch.compile(model, mode="reduce-overhead"), 3),
}


def measure(name: str, fn: object, warmup: int, token: torch.Tensor, device: str) -> dict:
    with torch.no_grad():
        report = profile_call(fn, (token,), {}, warmup=warmup, device=device, label=name, graph_replay=True)
    return {
        "variant": name,
        "kernels": report.kernel_count,
        "device_time_s": report.time_s,
        "wall_time_s": report.wall_time_s,
        "launch_overhead_share": report.launch_overhead_share,
        "launch_bound": report.launch_bound,
        "graph_time_s": report.graph_time_s,
        "graph_note": report.graph_note,
        "time_source": report.time_source,
    }


def recovered(eager: dict, seconds: float | None) -> float | None:
    """The share of the eager step's idle time (wall - device) that ``seconds`` a call
    recovers; ``None`` on CPU (no launch overhead there) or without a figure."""
    if eager["launch_overhead_share"] is None:
        return None
    gap = (eager["wall_time_s"] or 0.0) - (eager["device_time_s"] or 0.0)
    if seconds is None or gap <= 0:
        return None
    return (eager["wall_time_s"] - seconds) / gap


def _pct(share: float | None) -> str:
    return "n/a" if share is None else f"{share:.0%}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    add_out_option(parser)
    args = parser.parse_args()
    out = write_output_to(args.out, __file__)
    torch.manual_seed(0)
    model = DecodeStep().to(args.device, DTYPES[args.dtype]).eval()
    token = torch.tensor([[7]], device=args.device)
    print(f"{header()}; decode step: batch 1, {args.dtype}, {args.device}")
    rows = []
    for name, (make, warmup) in VARIANTS.items():
        torch._dynamo.reset()  # each variant compiles the model afresh
        rows.append(measure(name, make(model), warmup, token, args.device))
    eager = rows[0]
    for row in rows:
        row["recovered_by_wall"] = recovered(eager, row["wall_time_s"])
        row["recovered_by_graph"] = recovered(eager, row["graph_time_s"])
    table = [
        [
            r["variant"], r["kernels"], format_time(r["device_time_s"]), format_time(r["wall_time_s"]),
            _pct(r["launch_overhead_share"]), "yes" if r["launch_bound"] else "no",
            format_time(r["graph_time_s"]) if r["graph_time_s"] is not None else "n/a",
            _pct(r["recovered_by_wall"]) if r is not eager else "-", _pct(r["recovered_by_graph"]),
        ]
        for r in rows
    ]
    print(markdown_table(
        ["variant", "kernels", "device time", "wall a call", "launch overhead", "launch-bound", "graph replay a call",
         "eager idle recovered (wall)", "eager idle recovered (graph replay)"],
        table,
    ))
    for r in rows:
        if r["graph_note"]:
            print(f"- {r['variant']}: no graph replay: {r['graph_note']}")
    print("times: " + rows[0]["time_source"] + "; graph replay: CUDA events around back-to-back replays")
    if out is not None:
        (out / "bench_decode.json").write_text(json.dumps({"header": header(), "dtype": args.dtype, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
