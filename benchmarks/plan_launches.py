"""Which layer-norm or softmax launches a plan setting or a code change alters, without a GPU (docs/kernels.md,
"Planning").

An A/B on the GPU (``sweep.py --set``) times the widths a setting reaches; this script finds them. It plans
``layer_norm.forward`` and ``backward`` (``--subject softmax``: softmax) for a GPU description
(``_device.DESCRIPTIONS``, its tuned file where there is one) at many widths, dtypes and two row layouts (packed; rows
16-element aligned with a gap), records each launch's kernel, grid, arguments and options instead of running it, and
prints the widths whose launches differ between the default planning and the planning under ``--set`` (the same
settings as ``sweep.py``'s), or between a planning ``--save``d before a code change and the code's now (``--against``):

    PYTHONPATH=$PWD python3 benchmarks/plan_launches.py --set "layer_norm.tuning.fwd_params_first=None"
    PYTHONPATH=$PWD python3 benchmarks/plan_launches.py --device A100 --set layer_norm._SLIVER=1 --widths 1000,2064
    PYTHONPATH=$PWD python3 benchmarks/plan_launches.py --subject softmax --save /tmp/before.json   # then change code
    PYTHONPATH=$PWD python3 benchmarks/plan_launches.py --subject softmax --against /tmp/before.json

The held kernels are planned as on sm_90 wherever the description's arch is 9.x; the Triton release is taken to be the
tuned file's, so that the file applies as on the GPU it was measured on.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import sys
from pathlib import Path
from typing import Iterator

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DIRECTIONS = {"layer_norm": ("forward", "backward"), "softmax": ("softmax",)}


def default_widths() -> list[int]:
    """Narrow widths every third, 256-20000 every 37th, model widths, powers of two and their neighbours, wide rows."""
    w = set(range(1, 300, 3)) | set(range(256, 20000, 37))
    w |= {768, 999, 1000, 1152, 1280, 1600, 2304, 3072, 5120, 7168, 11008, 12288, 14336, 28672, 30522, 50257, 100000}
    for p in range(4, 19):
        w |= {(1 << p) + d for d in (-17, -16, -15, -8, -1, 0, 1, 8, 15, 16, 17, 64)}
    return sorted(v for v in w if v > 0)


class _OnGpu(torch.Tensor):
    """A CPU tensor the planners take for a CUDA one (they read ``is_cuda``; launches are recorded, never run)."""

    @property
    def is_cuda(self) -> bool:
        return True


@contextlib.contextmanager
def planning_for(name: str, launches: list) -> Iterator[None]:
    """Inside, the reference kernels plan for the GPU described as ``name`` and append each launch to ``launches``."""
    import triton

    for subject in DIRECTIONS:  # first: every module a plan reaches is patched below
        importlib.import_module(f"reference_kernels.{subject}")
    from reference_kernels import _device, _held, _launch, _layer_norm_held, _softmax_held

    dev = _device.DESCRIPTIONS[name]
    tuned = _device._files().get(dev.arch)
    held = dev.arch // 10 == 9

    def record(kernel, grid, *args, **options):
        name = getattr(kernel, "__name__", None) or getattr(getattr(kernel, "fn", None), "__name__", repr(kernel))
        shown = tuple((tuple(a.shape), tuple(a.stride()), str(a.dtype)) if isinstance(a, torch.Tensor) else a
                      for a in args)
        launches.append((name, tuple(grid), shown, tuple(sorted((k, repr(v)) for k, v in options.items()))))

    # in every module of the package that has them: not the interpreter, launches recorded, the description's SMs
    everywhere = {"interpreting": lambda: False, "launch_kernel": record, "sm_count": lambda device: dev.sms}
    patches = [(m, attr, value) for key, m in list(sys.modules.items()) if key.startswith("reference_kernels") and m
               for attr, value in everywhere.items() if hasattr(m, attr)]
    patches += [(_device, "of", lambda device: dev), (_held, "available", lambda device_index=None: held),
                (_layer_norm_held, "available", lambda device_index=None: held),
                (_softmax_held, "available", lambda device_index=None: held),
                (_launch, "_replays_enabled", False)]  # every call plans
    if tuned is not None:  # the file applies as on the GPU it was measured on
        patches.append((triton, "__version__", tuned["triton"] + "0"))
    saved = [(m, attr, getattr(m, attr)) for m, attr, _ in patches]
    try:
        for m, attr, value in patches:
            setattr(m, attr, value)
        yield
    finally:
        for m, attr, value in saved:
            setattr(m, attr, value)


def _tensor(n_rows: int, n_cols: int, dtype: torch.dtype, stride: int | None = None) -> torch.Tensor:
    t = torch.empty(n_rows, n_cols, dtype=dtype) if stride is None else torch.empty(n_rows, stride, dtype=dtype)[:, :n_cols]
    return t.as_subclass(_OnGpu)


def launches_of(direction: str, n_rows: int, n_cols: int, dtype: torch.dtype, layout: str) -> list:
    """The launches of one layer-norm forward or backward call, or softmax's (inside ``planning_for``); an error is one
    entry."""
    from reference_kernels import _device, layer_norm, softmax

    stride = None if layout == "packed" else -(-n_cols // 16) * 16 + 16
    x = _tensor(n_rows, n_cols, dtype, stride)
    if direction == "softmax":
        try:
            softmax._launch(x, _tensor(n_rows, n_cols, dtype), softmax.plan(n_rows, n_cols, x.element_size(),
                                                                            _device.of(x.device)))
        except (ValueError, RuntimeError) as exc:
            return [("error", type(exc).__name__, str(exc))]
        return []
    w, b = _tensor(1, n_cols, dtype)[0], _tensor(1, n_cols, dtype)[0]
    mean, rstd = _tensor(1, n_rows, torch.float32)[0], _tensor(1, n_rows, torch.float32)[0]
    out = _tensor(n_rows, n_cols, dtype, stride)
    try:
        if direction == "forward":
            layer_norm._forward_any(x, w, b, out, mean, rstd, 1e-5, None)
        else:
            dw, db = _tensor(1, n_cols, dtype)[0], _tensor(1, n_cols, dtype)[0]
            layer_norm._backward_any(_tensor(n_rows, n_cols, dtype, stride), x, w, mean, rstd, out, dw, db, None, None,
                                     None)
    except (ValueError, RuntimeError) as exc:
        return [("error", type(exc).__name__, str(exc))]
    return []


def plan_all(device: str, widths: list[int], dtypes: list[str], subject: str = "layer_norm") -> dict:
    """{(dtype, direction, layout, rows, width): launches} for every case of ``subject``."""
    table = {}
    for dname in dtypes:
        for n in widths:
            for rows in ((4096, 5) if n <= 20000 else (64,)):
                for layout in ("packed", "aligned"):
                    for direction in DIRECTIONS[subject]:
                        launches: list = []
                        with planning_for(device, launches):
                            error = launches_of(direction, rows, n, DTYPES[dname], layout)
                        table[(dname, direction, layout, rows, n)] = error or launches
    return table


def runs(widths: list[int], gap: int = 40) -> str:
    """Widths as runs of neighbours (``gap`` apart at most): '768, 1008-1107'."""
    out: list[list[int]] = []
    for w in sorted(widths):
        if out and w - out[-1][1] <= gap:
            out[-1][1] = w
        else:
            out.append([w, w])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in out)


def saved_form(table: dict) -> dict:
    """``table`` as ``--save`` writes it and ``--against`` reads it back: keys joined by "|", values through JSON."""
    return json.loads(json.dumps({"|".join(map(str, key)): value for key, value in table.items()}))


def _keyed(saved: dict) -> dict:
    """``saved_form``'s table with its keys split again (widths and rows as ints)."""
    return {tuple(int(p) if p.isdigit() else p for p in key.split("|")): value for key, value in saved.items()}


def changed(before: dict, after: dict) -> dict:
    """{(dtype, direction, layout): widths} where the launches differ (or ``after`` has a case ``before`` lacks)."""
    found: dict = {}
    for key, value in after.items():
        if before.get(key) != value:
            dname, direction, layout, _, n = key
            found.setdefault((dname, direction, layout), set()).add(n)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="H100", help="a _device.DESCRIPTIONS name (default H100)")
    parser.add_argument("--dtypes", default="float32,bfloat16,float16")
    parser.add_argument("--widths", default="", help="comma-separated widths instead of the generated list")
    parser.add_argument("--subject", default="layer_norm", choices=sorted(DIRECTIONS))
    parser.add_argument("--set", action="append", default=[], metavar="MODULE.CONSTANT=VALUE",
                        help="as sweep.py's --set (repeatable); the planning under it is compared with the default")
    parser.add_argument("--save", metavar="FILE", help="write the planning's launches (JSON) for a later --against")
    parser.add_argument("--against", metavar="FILE", help="compare the planning now with one --save wrote")
    args = parser.parse_args(argv)
    from reference_kernels import _device

    if args.device not in _device.DESCRIPTIONS:
        raise SystemExit(f"--device {args.device!r}: choose one of {', '.join(_device.DESCRIPTIONS)}")
    dtypes = [d for d in args.dtypes.split(",") if d]
    unknown = [d for d in dtypes if d not in DTYPES]
    if unknown:
        raise SystemExit(f"--dtypes: unknown {unknown}; choose from {', '.join(DTYPES)}")
    widths = [int(w) for w in args.widths.split(",") if w] or default_widths()
    before = plan_all(args.device, widths, dtypes, args.subject)
    if args.save:
        Path(args.save).write_text(json.dumps({"device": args.device, "subject": args.subject,
                                               "launches": saved_form(before)}))
    if args.against:
        if args.set:
            raise SystemExit("--against compares code, --set a setting: one at a time")
        saved = json.loads(Path(args.against).read_text())
        if (saved["device"], saved["subject"]) != (args.device, args.subject):
            raise SystemExit(f"--against {args.against}: planned for {saved['device']} {saved['subject']}, "
                             f"not {args.device} {args.subject}")
        diff = changed(_keyed(saved["launches"]), _keyed(saved_form(before)))
        print(f"# {args.device} {args.subject}: launches the code now plans otherwise than {args.against}")
    elif not args.set:
        n = sum(len(v) for v in before.values())
        print(f"{len(before)} calls planned for the {args.device}, {n} launches; --set compares a setting with them")
        return 0
    else:
        from benchmarks.sweep import apply_settings

        settings = apply_settings(args.set)
        diff = changed(before, plan_all(args.device, widths, dtypes, args.subject))
        print(f"# {args.device}: launches that {', '.join(settings)} changes ({len(widths)} widths)")
    for (dname, direction, layout), ws in sorted(diff.items()):
        print(f"{dname:9s} {direction:8s} {layout:7s} {len(ws):4d} widths: {runs(sorted(ws))}")
    if not diff:
        print("none: no planned launch changed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
