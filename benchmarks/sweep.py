"""Width sweep of the row kernels: every width a model uses, aligned and ragged, against torch.

Where ``bench_softmax.py`` / ``bench_layer_norm.py`` time a few anchor shapes with every
anchor, this script times many widths with the cheap anchors, to find cliffs: a width at
which ours falls below its target (% of copy) or behind torch. Per subject and dtype it
prints the worst width and its ratio to the best anchor, then the widths below target, first as runs of
neighbouring widths (``miss_runs``: the dense sweep's 130 fp32 misses at 8256-16384 are one row), then one by one;
``--json`` keeps every figure. Every subject is timed at every width; the layer norm's targets cover a band
(forward 256..16384, backward 768..8192), so widths outside it count in the worst figures but not as below target
(``--target-band-only`` times the band alone).

    PYTHONPATH=. python3 benchmarks/sweep.py                         # softmax, sampled widths
    PYTHONPATH=. python3 benchmarks/sweep.py --dense                 # every multiple of 64 up to 16384 too
    PYTHONPATH=. python3 benchmarks/sweep.py --subjects softmax,layer_norm_fwd,layer_norm_bwd --out DIR
    PYTHONPATH=. python3 benchmarks/sweep.py --widths 28672,32000 --set softmax.STAGED_STAGES=2  # an A/B
    PYTHONPATH=. python3 benchmarks/sweep.py --widths 28672,32000 --impls ours --set ...  # an A/B, ours alone
    PYTHONPATH=. python3 benchmarks/sweep.py --widths 1000,12345 --set "softmax.tuning.shift_16bit=()"  # a tuned choice
    PYTHONPATH=. python3 benchmarks/sweep.py --tables benchmarks/data/sweep_layer_norm_h100.json  # a recorded run, no GPU

``--set MODULE.tuning.CHOICE=VALUE`` sets a measured choice (a field of the module's ``Tuning``, ``tuned/<arch>.json``):
the module then plans with it on every device, over its tuned file and its defaults.

After the per-subject summary a per-band table (``BANDS``: the targets' bands) gives each band's widths at target and
the min / median of its aligned (a multiple of 16 columns) and ragged widths.

Anchors: torch eager always, Liger-Kernel when it is installed (it refuses softmax rows over
65536: "n/a" there); ``--compile`` adds ``torch.compile(dynamic=True)`` (one
compilation for every width, so a sweep stays minutes long; a static compile per width
can be faster and is what bench_softmax.py times). Each input reads ``--mib`` MiB (default
128, twice the H200's L2), rows = that / the row's bytes. The copy roofline is one
device-to-device copy of the same size, timed once per run the same way. Times are device times: calls
replayed from a CUDA graph (``device_ms``), so the Python launch path is not timed.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import json
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from benchmarks._common import add_out_option, copy_gbps, device_ms, gbps, header, liger_ops  # noqa: E402
from benchmarks._common import markdown_table, require_cuda, write_output_to  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Row widths of public model configs: MoE router softmaxes over the experts (Mixtral 8, DBRX 16, Qwen1.5-MoE 60,
# OLMoE / Qwen2-MoE 64, Qwen3-MoE 128, DeepSeek-V2 160, DeepSeek-V3 256), attention rows at short sequence lengths
# (BERT 128 / 384 / 512), hidden sizes (BERT, GPT-2, Llama, Mistral, Qwen, ...) and vocabularies (BERT 30522,
# Llama-2 32000, GPT-2 50257, Llama-3 128256, Qwen 151936, ...).
MODEL_WIDTHS = [
    8, 16, 60, 64, 128, 160, 256, 384,
    768, 1024, 1280, 1536, 1600, 2048, 2560, 3072, 3584, 4096, 5120, 6144, 7168, 8192, 11008, 12288,
    13824, 14336, 16384, 18432, 28672, 30522, 32000, 32064, 49152, 50257, 50304, 65024, 65536,
    100352, 128256, 131072, 151936, 152064, 256000, 262144,
]
# Ragged widths the issue named, small odd ones that exercise every phase, and even ones whose packed rows are 4- to
# 16-byte aligned (24, 200, 600, 1000, 1500: "Packed rows" in docs/kernels.md).
NAMED_RAGGED = [1, 3, 7, 13, 24, 100, 200, 333, 600, 999, 1000, 1023, 1025, 1500, 4097, 8191, 12345, 16383, 17000, 33000,
                50257]
# Targets (issue 12), % of copy: softmax >= 90 up to 32768 and >= 80 wider; layer norm
# forward >= 90 at 256..16384; backward >= 80 at 768..8192. None: no target at that width.
TARGETS = {
    "softmax": lambda n: 90 if n <= 32768 else 80,
    "layer_norm_fwd": lambda n: 90 if 256 <= n <= 16384 else None,
    "layer_norm_bwd": lambda n: 80 if 768 <= n <= 8192 else None,
}
# Issue 12's other target: ours never under this share of the best anchor's figure (by subject; none: no such target).
ANCHOR_TARGETS = {"softmax": 0.98}


# The bands the per-band table groups widths into (inclusive), by subject: the targets' bands and what lies around them.
BANDS = {
    "softmax": [(1, 64), (65, 2047), (2048, 16384), (16385, 32768), (32769, 1 << 30)],
    "layer_norm_fwd": [(1, 255), (256, 2047), (2048, 16384), (16385, 1 << 30)],
    "layer_norm_bwd": [(1, 767), (768, 8192), (8193, 1 << 30)],
}


def widths(dense: bool, n_ragged: int, seed: int = 0) -> list[int]:
    """The sweep's widths: model widths, named ragged ones, multiples of 64 (all with ``dense``,
    else every 512th), and ``n_ragged`` log-uniform random widths in 10^4..2.6x10^5 (odd ones too)."""
    step = 64 if dense else 512
    rng = random.Random(seed)
    ragged = {int(10 ** rng.uniform(4, 5.415)) for _ in range(n_ragged)}
    return sorted(set(MODEL_WIDTHS) | set(NAMED_RAGGED) | set(range(step, 16385, step)) | ragged)


def timed(name: str, n: int, band_only: bool = False) -> bool:
    """Whether the sweep times subject ``name`` at width ``n``: every width by default (a cliff outside a target band is
    still a cliff: bf16 layer-norm forward rows of 17000 read 35% of copy before the held plan), or with ``band_only``
    only the widths that have a target (softmax has one at every width)."""
    return not band_only or TARGETS[name](n) is not None


def subject(name: str, x: torch.Tensor, compile_: bool):
    """(bytes moved compulsorily, {impl: fn}) for one subject at input ``x``."""
    from reference_kernels import layer_norm, softmax

    n = x.shape[-1]
    fns: dict = {}
    if name == "softmax":
        fns["ours"] = lambda: softmax.fused(x)
        fns["torch"] = lambda: torch.softmax(x, dim=-1)
        if compile_:
            fn = _compiled(name, lambda t: torch.softmax(t, dim=-1))
            fns["compile"] = lambda: fn(x)
        liger = liger_ops("softmax")
        if liger is not None:
            fns["liger"] = lambda: liger[0](x)[0]
        return softmax.budget(x).total, fns
    w = torch.randn(n, device=x.device, dtype=x.dtype, generator=_GEN)
    b = torch.randn(n, device=x.device, dtype=x.dtype, generator=_GEN)
    if name == "layer_norm_fwd":
        fns["ours"] = lambda: layer_norm.forward(x, w, b)
        fns["torch"] = lambda: F.layer_norm(x, (n,), w, b)
        if compile_:
            fn = _compiled(name, lambda t, w_, b_: F.layer_norm(t, (t.shape[-1],), w_, b_))
            fns["compile"] = lambda: fn(x, w, b)
        liger = liger_ops("layer_norm")
        if liger is not None:
            fns["liger"] = lambda: liger[0](x, w, b, 1e-5)
        return layer_norm.budget(x, w, b).total, fns
    if name == "layer_norm_bwd":
        dy = torch.randn(x.shape, device=x.device, dtype=x.dtype, generator=_GEN)
        _, mean, rstd = layer_norm.forward(x, w, b)
        fns["ours"] = lambda: layer_norm.backward(dy, x, w, mean, rstd)
        xt = x.detach().requires_grad_()
        wt = w.detach().requires_grad_()
        bt = b.detach().requires_grad_()
        yt = F.layer_norm(xt, (n,), wt, bt)
        fns["torch"] = lambda: torch.autograd.grad(yt, (xt, wt, bt), dy, retain_graph=True)
        liger = liger_ops("layer_norm")
        if liger is not None:
            fns["liger"] = lambda: liger[1](dy, x, w, b, mean, rstd)
        return layer_norm.budget(x, w, b, backward=True).total, fns
    raise ValueError(f"unknown subject {name!r}; choose from {sorted(TARGETS)}")


IMPLS = ("ours", "torch", "compile", "liger")


def parse_impls(text: str) -> list[str]:
    """The names of ``--impls`` (empty: every implementation); a name that is not one of ``IMPLS`` is refused."""
    impls = [i.strip() for i in text.split(",") if i.strip()]
    unknown = [i for i in impls if i not in IMPLS]
    if unknown:
        raise SystemExit(f"--impls: unknown {', '.join(unknown)}; choose from {', '.join(IMPLS)}")
    return impls


def select_impls(fns: dict, impls: list[str]) -> dict:
    """The implementations of ``fns`` named in ``impls`` (all of them where it is empty), in their order."""
    return {k: v for k, v in fns.items() if not impls or k in impls}


_COMPILED: dict = {}
_GEN = None


def _compiled(name: str, fn):
    if name not in _COMPILED:
        _COMPILED[name] = torch.compile(fn, dynamic=True)
    return _COMPILED[name]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subjects", default="softmax")
    parser.add_argument("--dtypes", default="float32,bfloat16,float16")
    parser.add_argument("--dense", action="store_true", help="every multiple of 64 up to 16384")
    parser.add_argument("--ragged", type=int, default=40, help="random ragged widths in 10^4..2.6x10^5")
    parser.add_argument("--widths", default="", help="comma-separated widths instead of the generated list")
    parser.add_argument("--compile", action="store_true", help="also time torch.compile(dynamic=True)")
    parser.add_argument("--impls", default="", help="comma-separated implementations to time (of ours, torch, compile,"
                        " liger; default all there are): --impls ours for an A/B of a launch-plan rule, whose anchors"
                        " only cost device time")
    parser.add_argument("--target-band-only", action="store_true",
                        help="time the layer norm only at widths inside its target band (256..16384 forward, 768..8192"
                             " backward); by default every width is timed, outside the band without a target")
    parser.add_argument("--mib", type=int, default=128, help="MiB each input reads")
    parser.add_argument("--json", default="")
    parser.add_argument("--tables", metavar="FILE", help="print the summary and per-band tables of a recorded --json "
                        "file (no GPU): BENCHMARKS.md's")
    parser.add_argument("--set", action="append", default=[], metavar="MODULE.CONSTANT=VALUE",
                        help="set a reference_kernels launch-plan constant first, e.g. softmax.STAGED_STAGES=2, or a "
                             "measured choice of its tuning, e.g. softmax.tuning.shift_16bit=() (VALUE a Python "
                             "literal; repeatable): the A/B runs of docs/kernels.md")
    add_out_option(parser)
    args = parser.parse_args(argv)
    if args.tables:
        data = json.loads(Path(args.tables).read_text())
        print(f"# width sweep: {data['header']}" + (f"; set {', '.join(data['settings'])}" if data["settings"] else ""))
        _tables(data["records"])
        return 0
    settings = apply_settings(args.set)
    impls = parse_impls(args.impls)  # an unknown name is refused before any timing
    require_cuda(__file__)
    out = write_output_to(args.out, __file__)
    ws = [int(w) for w in args.widths.split(",") if w] or widths(args.dense, args.ragged)
    print(f"# width sweep: {header()}; {len(ws)} widths, inputs of {args.mib} MiB"
          + (f"; set {', '.join(settings)}" if settings else ""))
    global _GEN
    _GEN = torch.Generator(device="cuda").manual_seed(0)
    copy = copy_gbps(2 * args.mib * 2**20)
    print(f"copy roofline: {copy:.0f} GB/s (read + write of {args.mib} MiB, the faster of graph and events)")
    records = []
    for name in args.subjects.split(","):
        for dname in args.dtypes.split(","):
            dtype = DTYPES[dname]
            for n in ws:
                if not timed(name, n, args.target_band_only):
                    continue
                rows = max(1, args.mib * 2**20 // (n * torch.empty((), dtype=dtype).element_size()))
                x = torch.randn(rows, n, device="cuda", dtype=dtype, generator=_GEN)  # not the graph-registered default
                nbytes, fns = subject(name, x, args.compile or "compile" in impls)
                fns = select_impls(fns, impls)
                rec = {"subject": name, "dtype": dname, "width": n, "rows": rows, "target": TARGETS[name](n), "pct": {}}
                for impl, fn in fns.items():
                    try:
                        ms, rec.setdefault("timer", {})[impl] = device_ms(fn)
                        rec["pct"][impl] = round(100 * gbps(nbytes, ms) / copy, 1)
                    except Exception as exc:  # an anchor that refuses a width is reported, not fatal
                        rec["pct"][impl] = None
                        rec.setdefault("errors", {})[impl] = f"{type(exc).__name__}: {exc}"[:200]
                records.append(rec)
                del x, fns
            torch.cuda.empty_cache()
    n_failed = _summarise(records)
    path = args.json or (str(out / "sweep.json") if out else "")
    if path:
        Path(path).write_text(json.dumps({"header": header(), "settings": settings, "copy_gbps": copy, "records": records},
                                         indent=1))
    return 1 if n_failed else 0


def apply_settings(items: list[str]) -> list[str]:
    """Set ``reference_kernels.<module>.<CONSTANT>`` to a literal for each ``module.CONSTANT=VALUE``, so that
    one run times a launch-plan rule against the default; returns the settings made, for the header.

    ``module.tuning.CHOICE=VALUE`` sets a measured choice, a field of the module's ``Tuning``, on every device
    (``_set_tuned_choice``).

    Refused with a clear message: a missing ``=`` or module, a constant the module does not have, a
    value that is not a Python literal, or one of another type than the constant's (ints and floats mix;
    None where the constant's annotation allows it, ``X: tuple[int, int] | None = ...``).
    """
    done = []
    for item in items:
        key, sep, value = item.partition("=")
        module_name, dot, attr = key.strip().rpartition(".")
        if not sep or not dot or not attr:
            raise SystemExit(f"--set {item!r}: expected MODULE.CONSTANT=VALUE, e.g. softmax.STAGED_STAGES=2")
        if module_name.endswith(".tuning"):
            done.append(_set_tuned_choice(item, module_name[: -len(".tuning")], attr, value))
            continue
        module = _module(item, module_name)
        if not hasattr(module, attr):
            raise SystemExit(f"--set {item!r}: reference_kernels.{module_name} has no {attr}")
        parsed = _literal(item, value)
        old = getattr(module, attr)
        numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (old, parsed))
        optional = parsed is None and "None" in str(getattr(module, "__annotations__", {}).get(attr, ""))
        if old is not None and type(parsed) is not type(old) and not (numbers or optional):
            raise SystemExit(f"--set {item!r}: {attr} holds {type(old).__name__}, not {type(parsed).__name__}")
        setattr(module, attr, parsed)
        done.append(f"{module_name}.{attr}={parsed!r}")
    from reference_kernels._launch import forget

    forget()  # calls recorded under the old value replay its plan
    return done


def _module(item: str, name: str):
    try:
        return importlib.import_module(f"reference_kernels.{name}")
    except ModuleNotFoundError:
        raise SystemExit(f"--set {item!r}: there is no module reference_kernels.{name}") from None


def _literal(item: str, value: str):
    try:
        return ast.literal_eval(value.strip())
    except (ValueError, SyntaxError):
        raise SystemExit(f"--set {item!r}: {value.strip()!r} is not a Python literal") from None


# Measured choices set by ``--set MODULE.tuning.CHOICE=VALUE``, by subject (the module's name, as _device.tuning's):
# laid over the tuning ``_device.tuning`` gives every plan the module makes without an explicit one.
TUNED_CHOICES: dict[str, dict] = {}
_TYPES = {"int": int, "float": float, "bool": bool, "tuple": tuple, "None": type(None), "str": str}


def _set_tuned_choice(item: str, module_name: str, choice: str, value: str) -> str:
    """``--set MODULE.tuning.CHOICE=VALUE``: the module plans with its ``Tuning`` field CHOICE at VALUE on every device,
    over its tuned file and its defaults (JSON-like lists as tuples, as ``_device`` reads the tuned files). Refused: a
    module without tuned choices, a choice its ``Tuning`` lacks, a value its annotation does not allow."""
    from reference_kernels import _device

    module = _module(item, module_name)
    defaults = getattr(module, "DEFAULT_TUNING", None)
    if defaults is None or not dataclasses.is_dataclass(defaults):
        raise SystemExit(f"--set {item!r}: reference_kernels.{module_name} has no tuned choices (no DEFAULT_TUNING)")
    fields = {f.name: f for f in dataclasses.fields(defaults)}
    if choice not in fields:
        raise SystemExit(f"--set {item!r}: reference_kernels.{module_name}'s tuning has no {choice}; its choices are "
                         f"{', '.join(fields)}")
    parsed = _device._frozen(_literal(item, value))
    allowed = tuple(_TYPES[t.strip()] for t in str(fields[choice].type).split("|") if t.strip() in _TYPES)
    allowed = allowed or (type(getattr(defaults, choice)),)
    if float in allowed:
        allowed += (int,)
    if not isinstance(parsed, allowed) or (isinstance(parsed, bool) and bool not in allowed):
        raise SystemExit(f"--set {item!r}: {choice} holds {fields[choice].type}, not {type(parsed).__name__}")
    if not TUNED_CHOICES:  # once: every plan's tuning gets the choices set
        planned_with = _device.tuning

        def tuning(subject, device, defaults):
            t = planned_with(subject, device, defaults)
            return dataclasses.replace(t, **TUNED_CHOICES[subject]) if TUNED_CHOICES.get(subject) else t

        _device.tuning = tuning
    TUNED_CHOICES.setdefault(module_name, {})[choice] = parsed
    return f"{module_name}.tuning.{choice}={parsed!r}"


def _by_subject(records: list[dict], keep=lambda rec: True) -> dict[tuple[str, str], list[dict]]:
    """The records ``keep`` accepts, grouped by (subject, dtype) in the order they first appear."""
    groups: dict = {}
    for rec in records:
        if keep(rec):
            groups.setdefault((rec["subject"], rec["dtype"]), []).append(rec)
    return groups


def _summarise(records: list[dict]) -> int:
    """Print the per-subject summary, the widths below target, those under their subject's share of the best anchor
    (``ANCHOR_TARGETS``) and those where ours failed; returns how many failed."""
    misses, failed, behind = [], [], []
    for (name, dname), recs in _by_subject(records).items():
        ours = [r for r in recs if r["pct"].get("ours") is not None]
        failed += [[name, dname, r["width"], r.get("errors", {}).get("ours", "no figure")] for r in recs
                   if r["pct"].get("ours") is None]
        below = [r for r in ours if r["target"] is not None and r["pct"]["ours"] < r["target"]]
        ratios = _anchor_ratios(ours)
        # one decimal: a miss by under half a point would otherwise read as its target (79.6 as "80%" under 80%)
        misses += [[name, dname, r["width"], f"{r['pct']['ours']:.1f}%", f"{r['target']}%",
                    " ".join(f"{k} {v:.0f}%" for k, v in r["pct"].items() if k != "ours" and v)] for r in below]
        floor = ANCHOR_TARGETS.get(name)
        behind += [[name, dname, r["width"], f"{r['pct']['ours']:.1f}%", _best_anchor(r), f"{ratio:.3f}x", f"{floor}x"]
                   for ratio, r in sorted(ratios, key=lambda t: t[1]["width"]) if floor is not None and ratio < floor]
    _tables(records)
    if misses:
        print("\nBelow target, in runs (consecutive widths timed, none of them at target):\n")
        print(markdown_table(["subject", "dtype", "widths", "count", "ours %copy, min-max", "target"], miss_runs(records)))
        print("\nBelow target:\n")
        print(markdown_table(["subject", "dtype", "width", "ours %copy", "target", "anchors %copy"], misses))
    if behind:
        print("\nUnder the best anchor's target share:\n")
        print(markdown_table(["subject", "dtype", "width", "ours %copy", "best anchor %copy", "ours / best", "target"],
                             behind))
    if failed:  # ours raised: loud, never a width silently left out of the figures above
        print("\nOurs failed:\n")
        print(markdown_table(["subject", "dtype", "width", "error"], failed))
    return len(failed)


def _anchor_ratios(ours: list[dict]) -> list[tuple[float, dict]]:
    """(ours / the best anchor, record) at each width an anchor was timed (none with --impls ours)."""
    return [(r["pct"]["ours"] / max(v for k, v in r["pct"].items() if k != "ours" and v), r) for r in ours
            if any(v for k, v in r["pct"].items() if k != "ours")]


def _tables(records: list[dict]) -> None:
    """The per-subject summary (median and worst % of copy, the worst ratio to the best anchor, widths below target)
    and the per-band table: what a run prints first, and ``--tables`` prints from its JSON."""
    rows = []
    for (name, dname), recs in _by_subject(records).items():
        ours = [r for r in recs if r["pct"].get("ours") is not None]
        if not ours:
            continue
        worst = min(ours, key=lambda r: r["pct"]["ours"])
        ratios = _anchor_ratios(ours)
        ratio = "-"
        if ratios:
            worst_ratio, worst_ratio_rec = min(ratios, key=lambda t: t[0])
            ratio = f"{worst_ratio:.2f}x at {worst_ratio_rec['width']}"
        below = [r for r in ours if r["target"] is not None and r["pct"]["ours"] < r["target"]]
        rows.append([name, dname, f"{len(ours)} of {len(recs)}",
                     f"{statistics.median(r['pct']['ours'] for r in ours):.0f}%",
                     f"{worst['pct']['ours']:.0f}% at {worst['width']}", ratio, len(below)])
    print()
    print(markdown_table(["subject", "dtype", "widths timed", "median %copy", "worst %copy", "worst ours/best anchor",
                          "below target"], rows))
    print("\nBy band (aligned: a multiple of 16 columns; min / median % of copy):\n")
    print(markdown_table(["subject", "dtype", "band", "widths", "at target", "aligned", "ragged", "ours/best anchor, min"],
                         band_rows(records)))


def miss_runs(records: list[dict]) -> list[list]:
    """The widths below target as runs, per subject and dtype: widths next to each other in the sorted list ours ran
    (with a target) and all below it, e.g. every multiple of 64 from 8256 to 9728 as one row "8256-9728" of 24."""
    runs: list[list] = []
    timed = _by_subject(records, lambda rec: rec["pct"].get("ours") is not None and rec["target"] is not None)
    for (name, dname), recs in timed.items():
        run: list[dict] = []
        for rec in sorted(recs, key=lambda r: r["width"]) + [None]:  # None closes the last run
            if rec is not None and rec["pct"]["ours"] < rec["target"]:
                run.append(rec)
                continue
            if run:
                lo, hi = run[0]["width"], run[-1]["width"]
                pct = [r["pct"]["ours"] for r in run]
                runs.append([name, dname, f"{lo}-{hi}" if hi != lo else f"{lo}", len(run),
                             f"{min(pct):.1f}-{max(pct):.1f}%" if len(run) > 1 else f"{pct[0]:.1f}%",
                             f"{run[0]['target']}%"])
            run = []
    return runs


def _best_anchor(rec: dict) -> str:
    """The fastest anchor of a record and its % of copy, e.g. "liger 95.7%"."""
    name, value = max(((k, v) for k, v in rec["pct"].items() if k != "ours" and v), key=lambda kv: kv[1])
    return f"{name} {value:.1f}%"


def band_rows(records: list[dict]) -> list[list]:
    """Per subject, dtype and band (``BANDS``) of the widths ours ran: how many, how many at their target (of those
    with one), min / median % of copy of the aligned (a multiple of 16 columns, Triton's divisibility) and the ragged
    widths, and the lowest ratio to the best anchor with its width."""
    out = []
    for (name, dname), recs in _by_subject(records, lambda rec: rec["pct"].get("ours") is not None).items():
        for lo, hi in BANDS.get(name, [(1, 1 << 30)]):
            band = [r for r in recs if lo <= r["width"] <= hi]
            if not band:
                continue

            def spread(rs):
                v = [r["pct"]["ours"] for r in rs]
                return f"{min(v):.0f} / {statistics.median(v):.0f}" if v else "-"

            targeted = [r for r in band if r["target"] is not None]
            at = f"{sum(r['pct']['ours'] >= r['target'] for r in targeted)} of {len(targeted)}" if targeted else "-"
            ratios = [(r["pct"]["ours"] / max(v for k, v in r["pct"].items() if k != "ours" and v), r["width"])
                      for r in band if any(v for k, v in r["pct"].items() if k != "ours")]
            ratio = f"{min(ratios)[0]:.2f}x at {min(ratios)[1]}" if ratios else "-"
            label = f"{lo}-{hi}" if hi < 1 << 30 else f"{lo}+"
            out.append([name, dname, label, len(band), at, spread([r for r in band if r["width"] % 16 == 0]),
                        spread([r for r in band if r["width"] % 16]), ratio])
    return out


if __name__ == "__main__":
    sys.exit(main())
