"""The reference kernels as users call them: eager time, graph-replay time and host time a call, side by side.

Every other kernel benchmark times CUDA-graph replays (device time). A user calls ``fused(x)`` eagerly, so what
they get is the kernel behind its host path. Per subject, over shapes from public model configs (``SHAPES``: kept
here, the issue's shapes among them), for ours, torch eager, torch.compile and Liger-Kernel (where it has the op),
and for attention SDPA's cuDNN backend (``EXTRA_IMPLS``: a column of its subject's table); ``ours_compiled`` is ours
called inside a torch.compile'd function (the subject's opaque op, as a compiled model calls it), a column beside:

* **eager**: ``triton.testing.do_bench`` (CUDA events around each call, the L2 flushed between calls): the
  host path shows wherever it exceeds the kernel;
* **graph**: calls replayed from a CUDA graph (``device_ms``): the kernel alone;
* **host**: microseconds of Python a call, 24 calls back to back after a synchronisation (``bench_host.host_us``):
  few, so that launches do not wait for queue space behind slower kernels (300 calls of a 200 us kernel read
  the kernel's time).

Bandwidth subjects read as % of a same-size device copy (compulsory bytes), the GEMM as TFLOPS. ``ours / best``
compares eager figures: ours against the best other implementation. Prints one table per subject:

    PYTHONPATH=$PWD python3 benchmarks/bench_eager.py [--subjects softmax,layer_norm_fwd] [--quick] [--out DIR]

``--out DIR`` also writes ``DIR/bench_eager.json``, the data BENCHMARKS.md's tables are made from
(``--tables FILE`` prints them from a recorded file, no GPU).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from benchmarks import _common  # noqa: E402

# (rows, columns, dtype) and where the shape comes from; GEMMs (M, K, N); attention (batch, heads, seq, head_dim)
SHAPES = {
    "softmax": [((131072, 77), "bfloat16", "77-token prompts (CLIP text)"), ((16384, 2048), "float16", "attention rows, 2k"),
                ((65536, 197), "float32", "ViT-B/16 attention rows"), ((4096, 32000), "bfloat16", "Llama-2 vocab"),
                ((4096, 100277), "bfloat16", "GPT-4 tokenizer vocab"), ((1024, 256000), "bfloat16", "Gemma vocab"),
                ((8, 4096), "bfloat16", "decode, 8 rows")],
    "layer_norm_fwd": [((16384, 1600), "float16", "GPT-2 XL"), ((16384, 2304), "bfloat16", "Gemma-2 2B"),
                       ((8192, 7168), "bfloat16", "DeepSeek-V3 hidden"), ((4096, 14336), "float16", "Llama-3 FFN"),
                       ((32768, 1152), "float32", "SigLIP so400m"), ((8192, 4608), "float32", "Gemma-2 27B"),
                       ((8, 4096), "bfloat16", "decode, 8 rows")],
    "gemm": [((16, 4096, 4096), "bfloat16", "decode, 16 tokens"), ((256, 4096, 1024), "bfloat16", "small batch"),
             ((1000, 1000, 1000), "bfloat16", "odd sizes"), ((8192, 1152, 4304), "bfloat16", "SigLIP MLP"),
             ((64, 8192, 28672), "bfloat16", "Llama-3 70B FFN, 64 tokens")],
    "attention": [((4, 16, 2048, 128), "bfloat16", "d=128, 2k"), ((1, 16, 8192, 128), "bfloat16", "d=128, 8k"),
                  ((1, 16, 16384, 128), "bfloat16", "d=128, 16k"), ((8, 12, 1024, 64), "bfloat16", "d=64 (GPT-2)")],
    "bias_gelu_dropout": [((16384, 8192), "bfloat16", "the fused MLP activation, 8k"),
                          ((8192, 3072), "bfloat16", "BERT-base MLP"), ((4096, 14336), "bfloat16", "Llama-3 FFN"),
                          ((8, 3072), "bfloat16", "decode, 8 rows")],
}
SHAPES["layer_norm_bwd"] = SHAPES["layer_norm_fwd"]
SHAPES["attention_full"] = SHAPES["attention"]  # "attention" is causal, "attention_full" not
DROPOUT = 0.1
SUBJECTS = tuple(SHAPES)
IMPLS = ("ours", "torch", "compile", "liger")
EXTRA_IMPLS = {"attention": ("cudnn",), "attention_full": ("cudnn",)}  # a subject's own yardsticks, a column each
# ours called inside a torch.compile'd function (the subject's opaque op, as a compiled model calls it): a column where
# recorded, never the "best other"
OURS_COMPILED = "ours_compiled"
EPS = 1e-5


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def _compiled(fn):
    torch._dynamo.reset()
    return torch.compile(fn, dynamic=False)


def _in_compiled(fn, *args):
    """A call of ``fn(*args)`` inside a torch.compile'd function (compiled on its first call)."""
    compiled = _compiled(fn)
    return lambda: compiled(*args)


def cases(subject: str, shape: tuple, dtype: torch.dtype, dev: str = "cuda") -> tuple[dict, float, str]:
    """({impl: call}, work a call, unit): the work is compulsory bytes ("B") or FLOPs ("FLOP")."""
    from benchmarks.bench_attention import sdpa
    from reference_kernels import attention, bias_gelu_dropout, gemm_epilogue, layer_norm, softmax

    F = torch.nn.functional
    if subject == "softmax":
        x = torch.randn(shape, device=dev).to(dtype)
        fns = {"ours": lambda: softmax.fused(x), "torch": lambda: torch.softmax(x, -1)}
        fns[OURS_COMPILED] = _in_compiled(softmax.fused, x)
        compiled = _compiled(lambda t: torch.softmax(t, -1))
        fns["compile"] = lambda: compiled(x)
        liger = _common.liger_ops("softmax")
        if liger:
            fns["liger"] = lambda: liger[0](x)[0]
        return fns, 2 * x.numel() * x.element_size(), "B"
    if subject in ("layer_norm_fwd", "layer_norm_bwd"):
        n = shape[1]
        x = torch.randn(shape, device=dev).to(dtype)
        w, b = torch.randn(n, device=dev).to(dtype), torch.randn(n, device=dev).to(dtype)
        liger = _common.liger_ops("layer_norm") or (None, None)
        if subject == "layer_norm_fwd":
            fns = {"ours": lambda: layer_norm.fused(x, w, b, EPS), "torch": lambda: F.layer_norm(x, (n,), w, b, EPS)}
            fns[OURS_COMPILED] = _in_compiled(lambda x_, w_, b_: layer_norm.fused(x_, w_, b_, EPS), x, w, b)
            compiled = _compiled(lambda t, w_, b_: F.layer_norm(t, (n,), w_, b_, EPS))
            fns["compile"] = lambda: compiled(x, w, b)
            if liger[0]:
                fns["liger"] = lambda: liger[0](x, w, b, EPS)
            return fns, 2 * x.numel() * x.element_size(), "B"
        dy = torch.randn_like(x)
        _, mean, rstd = layer_norm.forward(x, w, b, EPS)
        _, m1, r1 = torch.ops.aten.native_layer_norm(x, [n], w, b, EPS)

        def aten(dy_, x_, m_, r_, w_, b_):
            return torch.ops.aten.native_layer_norm_backward(dy_, x_, [n], m_, r_, w_, b_, [True, True, True])

        fns = {"ours": lambda: layer_norm.backward(dy, x, w, mean, rstd), "torch": lambda: aten(dy, x, m1, r1, w, b)}
        fns[OURS_COMPILED] = _in_compiled(layer_norm.backward, dy, x, w, mean, rstd)
        compiled = _compiled(aten)
        fns["compile"] = lambda: compiled(dy, x, m1, r1, w, b)
        if liger[1]:
            fns["liger"] = lambda: liger[1](dy, x, w, b, mean, rstd)
        return fns, 3 * x.numel() * x.element_size(), "B"
    if subject == "gemm":
        m, k, n = shape
        a = torch.randn(m, k, device=dev).to(dtype)
        wt = torch.randn(n, k, device=dev).to(dtype)  # a Linear's weight; b = wt.T
        bias = torch.randn(n, device=dev).to(dtype)
        fns = {"ours": lambda: gemm_epilogue.fused(a, wt.T, bias, approximate="tanh"),
               "torch": lambda: torch._addmm_activation(bias, a, wt.T, use_gelu=True)}  # cuBLASLt's GELU: tanh form
        fns[OURS_COMPILED] = _in_compiled(lambda a_, w_, b_: gemm_epilogue.fused(a_, w_.T, b_, approximate="tanh"),
                                          a, wt, bias)
        compiled = _compiled(lambda a_, w_, b_: F.gelu(F.linear(a_, w_, b_), approximate="tanh"))
        fns["compile"] = lambda: compiled(a, wt, bias)
        return fns, 2 * m * k * n, "FLOP"
    if subject in ("attention", "attention_full"):
        bsz, heads, seq, d = shape
        causal = subject == "attention"
        q, k, v = (torch.randn(shape, device=dev).to(dtype) for _ in range(3))
        fns = {"ours": lambda: attention.fused(q, k, v, causal=causal),
               "torch": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
               "cudnn": lambda: sdpa(q, k, v, causal, "CUDNN_ATTENTION")}  # issue 55's yardstick
        fns[OURS_COMPILED] = _in_compiled(lambda q_, k_, v_: attention.fused(q_, k_, v_, causal=causal), q, k, v)
        return fns, (2 if causal else 4) * bsz * heads * seq * seq * d, "FLOP"  # causal: half the scores
    if subject == "bias_gelu_dropout":
        x = torch.randn(shape, device=dev).to(dtype)
        bias = torch.randn(shape[1], device=dev).to(dtype)
        fns = {"ours": lambda: bias_gelu_dropout.fused(x, bias, DROPOUT),
               "torch": lambda: F.dropout(F.gelu(x + bias), DROPOUT)}
        fns[OURS_COMPILED] = _in_compiled(lambda x_, b_: bias_gelu_dropout.fused(x_, b_, DROPOUT), x, bias)
        compiled = _compiled(lambda t, b_: F.dropout(F.gelu(t + b_), DROPOUT))
        fns["compile"] = lambda: compiled(x, bias)
        return fns, 2 * x.numel() * x.element_size(), "B"  # x read, the output written (no mask stored)
    raise ValueError(f"unknown subject {subject!r}; choose from {', '.join(SUBJECTS)}")


def measure(subject: str, shape: tuple, dtype_name: str, quick: bool, calls: int) -> dict:
    """One row's figures: per implementation eager ms, graph ms, host us (None where it failed)."""
    from benchmarks.bench_host import host_us

    fns, work, unit = cases(subject, shape, _dtype(dtype_name))
    rec = {"subject": subject, "shape": list(shape), "dtype": dtype_name, "work": work, "unit": unit, "impls": {}}
    if unit == "B":
        rec["copy_gbps"] = _common.copy_gbps(work)
    timing = dict(calls=5, reps=3) if quick else dict(calls=10, reps=5)
    for name, fn in fns.items():
        try:
            fn()
            torch.cuda.synchronize()
            eager = _common.bench_ms(fn, 10 if quick else 25, 50 if quick else 100)
            graph, timer = _common.device_ms(fn, **timing)
            host = host_us(fn, calls)
            rec["impls"][name] = {"eager_ms": eager, "graph_ms": graph, "graph_timer": timer, "host_us": host}
        except Exception as exc:  # an anchor failing at a shape is a result (n/a), not a crash
            print(f"  {name} failed at {subject} {shape} {dtype_name}: {type(exc).__name__}: {exc}"[:300], flush=True)
            rec["impls"][name] = None
    return rec


def _rate(rec: dict, ms: float | None) -> str:
    if ms is None:
        return "n/a"
    if rec["unit"] == "B":
        return f"{100 * _common.gbps(rec['work'], ms) / rec['copy_gbps']:.0f}%"
    return f"{rec['work'] / (ms * 1e-3) / 1e12:.0f}"


def table(records: list[dict], subject: str) -> str:
    """The subject's table: eager (% of copy or TFLOPS) per implementation, ours against the best other, then ours'
    graph figure and host time beside torch's (and, where ours ran compiled, beside torch.compile's)."""
    rows = []
    mine = [r for r in records if r["subject"] == subject]
    extra = EXTRA_IMPLS.get(subject, ()) + (OURS_COMPILED,)
    impls_shown = IMPLS + tuple(k for k in extra if any(k in r["impls"] for r in mine))
    # host us a call: ours and torch's; where ours was timed compiled, torch.compile's own op beside it
    hosts = ("ours", OURS_COMPILED, "torch", "compile") if OURS_COMPILED in impls_shown else ("ours", "torch")
    hosts = tuple(k for k in hosts if k in ("ours", "torch") or any(r["impls"].get(k) for r in mine))
    for rec in mine:
        impls = rec["impls"]
        eager = {k: v["eager_ms"] for k, v in impls.items() if v}
        others = {k: t for k, t in eager.items() if k not in ("ours", OURS_COMPILED)}
        best = min(others, key=others.get) if others else None
        ours = impls.get("ours") or {}
        ratio = f"{others[best] / eager['ours']:.2f}x {best}" if best and "ours" in eager else "n/a"
        row = ["x".join(map(str, rec["shape"])), rec["dtype"]]
        row += [_rate(rec, eager.get(k)) for k in impls_shown]
        row += [ratio, _rate(rec, ours.get("graph_ms"))]
        row += [f"{impls[k]['host_us']:.0f}" if impls.get(k) else "n/a" for k in hosts]
        rows.append(row)
    unit = "% of copy" if subject not in ("gemm", "attention", "attention_full") else "TFLOPS"
    if subject.startswith("attention"):
        subject += " (causal)" if subject == "attention" else " (not causal)"
    headers = ["shape", "dtype"] + [f"{k} eager" for k in impls_shown] + ["ours / best other", "ours graph"]
    headers += [f"{k} host us" for k in hosts]
    return f"### {subject} (eager and graph in {unit})\n\n" + _common.markdown_table(headers, rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subjects", default=",".join(SUBJECTS), help=f"comma-separated, of {', '.join(SUBJECTS)}")
    parser.add_argument("--quick", action="store_true", help="shorter timing runs")
    parser.add_argument("--calls", type=int, default=24, help="calls a host-time figure (default 24)")
    parser.add_argument("--tables", metavar="FILE", help="print the tables of a recorded bench_eager.json (no GPU)")
    _common.add_out_option(parser)
    args = parser.parse_args(argv)
    subjects = [s for s in args.subjects.split(",") if s]
    unknown = [s for s in subjects if s not in SHAPES]
    if unknown:
        parser.error(f"unknown subject(s) {', '.join(unknown)}; choose from {', '.join(SUBJECTS)}")
    if args.tables:
        data = json.loads(Path(args.tables).read_text())
        print(data["header"])
        recorded = {r["subject"] for r in data["records"]}
        missing = [s for s in subjects if s not in recorded]
        if missing:  # subjects added since the file was recorded: a GPU run fills them in
            print(f"\nnot in this file (run on a GPU): {', '.join(missing)}")
        for subject in subjects:
            if subject in recorded:
                print("\n" + table(data["records"], subject))
        return 0
    _common.require_cuda(__file__)
    out = _common.write_output_to(args.out, __file__)
    head = _common.header()
    print(head)
    records = []
    for subject in subjects:
        for shape, dtype_name, _origin in SHAPES[subject]:
            records.append(measure(subject, shape, dtype_name, args.quick, args.calls))
        print("\n" + table(records, subject), flush=True)
        if out is not None:  # after each subject: a run stopped part-way keeps what it measured
            (out / "bench_eager.json").write_text(json.dumps({"header": head, "records": records}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
