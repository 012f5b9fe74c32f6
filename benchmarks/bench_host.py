"""Host time a call of the reference kernels against torch's, eager (docs/kernels.md, "Host time a call").

Every other script times the device (CUDA-graph replays); this one times the Python launch path that a graph hides:
``--calls`` calls at 8 rows in bursts of 24 back to back (``host_us``), synchronised between bursts outside the timer,
so the device keeps up and the host is what is measured. A call's planning (the launch-plan rules) and Triton's
launcher are most of it. Prints one table:

    PYTHONPATH=$PWD python3 benchmarks/bench_host.py [--calls 300] [--profile] [--out DIR]
    PYTHONPATH=$PWD python3 benchmarks/bench_host.py --tables benchmarks/data/bench_host_h200.json   # no GPU
    PYTHONPATH=$PWD python3 benchmarks/bench_host.py --python [--calls 2000]   # any machine, CPU under the interpreter
    PYTHONPATH=$PWD python3 benchmarks/bench_host.py --set layer_norm._SUM_HERE_BYTES=0   # an A/B's other run

Each case runs three ways: ours replayed (reference_kernels/_launch.py: the call's record), ours planned each call
(replays off) and torch's own op; and the one call of a key that records (its second: ``recorded_us``). ``--python``
times instead each public call's own Python, around a replay whose work (allocations, launches) is skipped: it
returns the tensors of its last run (``skip_replays``). No GPU needed (tiny shapes; on CPU under
``TRITON_INTERPRET=1``, set for it), so a regression in the wrapper shows on any machine.

``--set MODULE.CONSTANT=VALUE`` (``sweep.py``'s) runs every case under a setting and names it in the header: an A/B is
a run with it and one without on one machine, torch's column the yardstick between them (host figures drift).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from benchmarks._common import add_out_option, header, markdown_table, require_cuda, write_output_to  # noqa: E402


def host_us(fn: Callable[[], object], calls: int = 300, warmup: int = 20,
            sync: Callable[[], None] | None = None, burst: int = 24) -> float:
    """Microseconds of host time a call of ``fn``: ``warmup`` calls (compiles, caches), then ``calls`` calls timed on
    the host's clock in bursts of ``burst`` back to back, a synchronisation (``sync``: the device's, by default
    CUDA's) before each burst and after the last, outside the timer. A burst's launches fit the launch queue, so a
    kernel slower than its host path cannot hold the host back."""
    if calls < 1 or burst < 1:
        raise ValueError(f"calls and burst must be >= 1, got {calls} and {burst}")
    sync = sync or torch.cuda.synchronize
    for _ in range(warmup):
        fn()
    elapsed = 0.0
    for first in range(0, calls, burst):
        sync()
        start = time.perf_counter()
        for _ in range(min(burst, calls - first)):
            fn()
        elapsed += time.perf_counter() - start
    sync()
    return elapsed / calls * 1e6


def recorded_us(fn: Callable[[], object], calls: int = 30, sync: Callable[[], None] | None = None) -> float:
    """Median microseconds of host time of the call that records a key (its second; the records dropped before each
    first), synchronised before and after it, outside the timer."""
    from reference_kernels import _launch

    sync = sync or torch.cuda.synchronize
    times = []
    for _ in range(calls):
        _launch.forget()
        fn()
        sync()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
        sync()
    return sorted(times)[len(times) // 2] * 1e6


def cases(rows: int = 8) -> list[tuple[str, Callable[[], object], Callable[[], object]]]:
    """(name, ours, torch's) at ``rows`` rows: softmax on each plan family, the layer norm forward and backward (and both
    through autograd, as training calls them), bias + GELU + dropout, the GEMM, attention."""
    from reference_kernels import bias_gelu_dropout, layer_norm, softmax

    out = []
    for n, dtype in ((74988, torch.bfloat16), (30522, torch.float32), (4096, torch.bfloat16), (999, torch.bfloat16)):
        x = torch.randn(rows, n, device="cuda").to(dtype)
        y = torch.empty_like(x)
        out.append((f"softmax {rows}x{n} {str(dtype)[6:]}", lambda x=x, y=y: softmax.fused(x, out=y),
                    lambda x=x: torch.softmax(x, -1)))
    for n, dtype in ((4096, torch.bfloat16), (999, torch.bfloat16), (9001, torch.float32)):
        x = torch.randn(rows, n, device="cuda").to(dtype)
        w, b = torch.randn(n, device="cuda").to(dtype), torch.randn(n, device="cuda").to(dtype)
        _, mean, rstd = layer_norm.forward(x, w, b)
        _, t_mean, t_rstd = torch.native_layer_norm(x, (n,), w, b, 1e-5)
        dy = torch.randn_like(x)
        name = f"{rows}x{n} {str(dtype)[6:]}"
        out.append((f"layer norm forward {name}", lambda x=x, w=w, b=b: layer_norm.fused(x, w, b),
                    lambda x=x, w=w, b=b, n=n: torch.nn.functional.layer_norm(x, (n,), w, b)))
        out.append((f"layer norm backward {name}",
                    lambda dy=dy, x=x, w=w, m=mean, r=rstd: layer_norm.backward(dy, x, w, m, r),
                    lambda dy=dy, x=x, w=w, b=b, n=n, m=t_mean, r=t_rstd: torch.ops.aten.native_layer_norm_backward(
                        dy, x, (n,), m, r, w, b, [True, True, True])))
    # as a training step calls it: the forward under autograd, then its backward through the engine
    xwb = tuple(torch.randn(shape, device="cuda").bfloat16().requires_grad_() for shape in ((rows, 4096), 4096, 4096))
    dy = torch.randn(rows, 4096, device="cuda").bfloat16()
    out.append((f"layer norm forward + backward, autograd {rows}x4096 bfloat16",
                lambda xwb=xwb, dy=dy: torch.autograd.grad(layer_norm.fused(*xwb), xwb, dy),
                lambda xwb=xwb, dy=dy: torch.autograd.grad(
                    torch.nn.functional.layer_norm(xwb[0], (4096,), *xwb[1:]), xwb, dy)))
    x = torch.randn(rows, 3072, device="cuda").bfloat16()
    bias = torch.randn(3072, device="cuda").bfloat16()
    out.append((f"bias + GELU + dropout {rows}x3072 bfloat16", lambda: bias_gelu_dropout.fused(x, bias, 0.1),
                lambda: torch.nn.functional.dropout(torch.nn.functional.gelu(x + bias), 0.1)))
    from reference_kernels import attention, gemm_epilogue

    for m, k, n in ((rows, 4096, 4096), (rows, 1000, 1000)):
        a = torch.randn(m, k, device="cuda").bfloat16()
        w = torch.randn(n, k, device="cuda").bfloat16()
        b = torch.randn(n, device="cuda").bfloat16()
        out.append((f"GEMM + bias + GELU {m}x{k}x{n} bfloat16", lambda a=a, w=w, b=b: gemm_epilogue.fused(a, w.T, b),
                    lambda a=a, w=w, b=b: torch._addmm_activation(b, a, w.T, use_gelu=True)))
    q, k, v = (torch.randn(1, 8, 128, 64, device="cuda").bfloat16() for _ in range(3))
    out.append(("attention 1x8x128x64 bfloat16", lambda: attention.fused(q, k, v),
                lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v)))
    return out


def replayed(fn: Callable[[], object], sync: Callable[[], None] | None = None) -> str:
    """What ``fn``'s third call did: "replayed", "recorded" or "planned: <why>" (reference_kernels/_launch.py: a key's
    first call plans, its second records); ``sync``: the device's (CUDA's by default)."""
    from reference_kernels._launch import Calls

    for c in Calls.tables:
        c.last = ""
    fn()  # a key's first call plans
    fn()  # its second records
    fn()
    (sync or torch.cuda.synchronize)()
    return "; ".join(sorted({c.last for c in Calls.tables if c.last})) or "?"


def profile_calls(name: str, fn: Callable[[], object], calls: int) -> None:
    """cProfile ``calls`` calls of ``fn`` (after it has run): the 12 functions of most own time, printed."""
    import cProfile
    import io
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        fn()
    profiler.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(12)
    print(f"## {name}: {calls} calls profiled\n" + "\n".join(text.getvalue().splitlines()[4:]))


def python_cases(device: str) -> list[tuple[str, Callable[[], object], Callable[[], object]]]:
    """(name, ours, torch's) for ``--python``: each public call once, at shapes too small to matter, on ``device``."""
    from reference_kernels import attention, bias_gelu_dropout, gemm_epilogue, layer_norm, softmax

    x, w, b = torch.randn(4, 64, device=device), torch.randn(64, device=device), torch.randn(64, device=device)
    y, dy, wt = torch.empty_like(x), torch.randn_like(x), torch.randn(64, 64, device=device)
    _, mean, rstd = layer_norm.forward(x, w, b)
    _, t_mean, t_rstd = torch.native_layer_norm(x, (64,), w, b, 1e-5)
    xwb = tuple(t.clone().requires_grad_() for t in (x, w, b))
    q, k, v = (torch.randn(1, 2, 32, 64, device=device) for _ in range(3))
    F = torch.nn.functional
    # a block's GEMMs in turn (q, k, v together; out; up; down): four keys, none the last one's
    block = [(torch.randn(4, m, device=device), torch.randn(n, m, device=device), torch.randn(n, device=device))
             for m, n in ((64, 192), (64, 64), (64, 256), (256, 64))]
    return [
        ("softmax.fused", lambda: softmax.fused(x, out=y), lambda: torch.softmax(x, -1, out=y)),
        ("layer_norm.fused", lambda: layer_norm.fused(x, w, b), lambda: F.layer_norm(x, (64,), w, b)),
        ("layer_norm.forward", lambda: layer_norm.forward(x, w, b), lambda: torch.native_layer_norm(x, (64,), w, b, 1e-5)),
        ("layer_norm.backward", lambda: layer_norm.backward(dy, x, w, mean, rstd),
         lambda: torch.ops.aten.native_layer_norm_backward(dy, x, (64,), t_mean, t_rstd, w, b, [True, True, True])),
        ("layer_norm.fused + backward, autograd", lambda: torch.autograd.grad(layer_norm.fused(*xwb), xwb, dy),
         lambda: torch.autograd.grad(F.layer_norm(xwb[0], (64,), *xwb[1:]), xwb, dy)),
        ("bias_gelu_dropout.fused", lambda: bias_gelu_dropout.fused(x, b, 0.1), lambda: F.dropout(F.gelu(x + b), 0.1)),
        ("gemm_epilogue.fused", lambda: gemm_epilogue.fused(x, wt.T, b), lambda: F.gelu(F.linear(x, wt, b))),
        ("attention.fused", lambda: attention.fused(q, k, v), lambda: F.scaled_dot_product_attention(q, k, v)),
        ("gemm_epilogue.fused, four shapes in turn (us for the four)",
         lambda: [gemm_epilogue.fused(a, w.T, c) for a, w, c in block],
         lambda: [F.gelu(F.linear(a, w, c)) for a, w, c in block]),
    ]


def skip_replays() -> list:
    """From now on each recorded replay returns what its next run returns, without running again (its allocations
    and launches skipped): the public call's own Python is what is left to time. Returns what ``restore_replays``
    puts back."""
    from reference_kernels._launch import Calls, _Replay

    saved = []
    for calls in Calls.tables:
        for entry in calls.table.values():
            if entry.__class__ is _Replay:
                def once(slots, scalars, entry=entry, run=entry.run):
                    result = run(slots, scalars)
                    entry.run = lambda slots, scalars: result
                    return result

                saved.append((entry, entry.run))
                entry.run = once
    return saved


def restore_replays(saved: list) -> None:
    for entry, run in saved:
        entry.run = run


PYTHON_HEADERS = ["public call", "ours' Python a call, us (replay skipped)", "torch's op, us (runs)", "ours' call"]


def python_main(calls: int, out: str | None, settings: list[str] = ()) -> None:
    """``--python``: the table of each public call's own Python (``python_cases``, ``skip_replays``), under
    ``settings`` (``--set``)."""
    import json
    import os

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are defined: CPU tensors, the interpreter
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    head = settings_header(settings)
    print(head)
    records = []
    for name, ours, theirs in python_cases(device):
        how = replayed(ours, sync)
        saved = skip_replays()
        try:
            ours_us = host_us(ours, calls, sync=sync)
        finally:
            restore_replays(saved)
        records.append({"case": name, "python_us": ours_us, "torch_us": host_us(theirs, calls, sync=sync), "ours_call": how})
    print(markdown_table(PYTHON_HEADERS, [[r["case"], f"{r['python_us']:.1f}", f"{r['torch_us']:.1f}", r["ours_call"]]
                                          for r in records]))
    if out:
        Path(out, "bench_host_python.json").write_text(json.dumps({"header": head, "rows": records}, indent=1))


def settings_header(settings: list[str]) -> str:
    """Apply the ``--set`` settings the run is under (``sweep.apply_settings``); the machine's header naming them (as
    bench_gemm_epilogue's)."""
    from benchmarks.sweep import apply_settings

    done = apply_settings(list(settings))
    return header() + (f"; set {', '.join(done)}" if done else "")


HEADERS = ["case", "ours, us a call", "ours planned each call", "ours' record (once a key)", "torch", "ours / torch",
           "ours' call"]


def table_row(rec: dict) -> list[str]:
    recorded = rec.get("ours_recorded_us")  # JSON written before the column: n/a
    return [rec["case"], f"{rec['ours_us']:.1f}", f"{rec['ours_planned_us']:.1f}",
            "n/a" if recorded is None else f"{recorded:.1f}", f"{rec['torch_us']:.1f}",
            f"{rec['ours_us'] / rec['torch_us']:.2f}x", rec["ours_call"]]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300, help="calls timed a case (default 300)")
    parser.add_argument("--rows", type=int, default=8, help="rows of each input: few, so the host is what is timed")
    parser.add_argument("--profile", action="store_true",
                        help="also cProfile each case's replayed calls: the top functions by own time, per case")
    parser.add_argument("--tables", metavar="FILE", help="print the table of a recorded bench_host.json (no GPU)")
    parser.add_argument("--python", action="store_true",
                        help="instead: each public call's own Python, its replay's work skipped (any machine)")
    parser.add_argument("--set", action="append", default=[], metavar="MODULE.CONSTANT=VALUE",
                        help="as sweep.py's --set (repeatable): every case under it, named in the header; an A/B is a "
                             "run with it and one without")
    add_out_option(parser)
    args = parser.parse_args(argv)
    if args.calls < 1 or args.rows < 1:
        parser.error("--calls and --rows must be >= 1")
    import json

    if args.tables:
        data = json.loads(Path(args.tables).read_text())
        print(data["header"] + "\n\n" + markdown_table(HEADERS, [table_row(r) for r in data["rows"]]))
        return
    if args.python:
        write_output_to(args.out, __file__)
        python_main(args.calls, args.out, args.set)
        return
    require_cuda(__file__)
    write_output_to(args.out, __file__)
    head = settings_header(args.set)
    print(head)
    from reference_kernels import _launch

    records = []
    for name, ours, theirs in cases(args.rows):
        how = replayed(ours)
        with _launch.replays_off():
            planned = host_us(ours, args.calls)
        recorded = recorded_us(ours)
        a, b = host_us(ours, args.calls), host_us(theirs, args.calls)
        if args.profile:
            profile_calls(name, ours, args.calls)
        records.append({"case": name, "ours_us": a, "ours_planned_us": planned, "ours_recorded_us": recorded,
                        "torch_us": b, "ours_call": how})
    print(markdown_table(HEADERS, [table_row(r) for r in records]))
    if args.out:
        Path(args.out, "bench_host.json").write_text(json.dumps({"header": head, "rows": records}, indent=1))


if __name__ == "__main__":
    main()
