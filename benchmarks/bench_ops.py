"""Host time a call of an op defined as the subjects define theirs under torch.compile (``_common.define_op``: a
``torch.library.Library`` op whose autograd falls through) against ``torch.library.custom_op`` (docs/kernels.md,
"Host time a call"). A stand-in op that returns a tensor it holds, so the dispatch is all that is timed, called
directly and from a torch.compile'd function (its graph calls the op, as a compiled model calls ours), beside a plain
Python function. On a GPU the calls take CUDA tensors; without one, CPU tensors (CI's host):

    PYTHONPATH=$PWD python3 benchmarks/bench_ops.py [--calls 2000] [--out DIR]
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from benchmarks._common import add_out_option, header, markdown_table, write_output_to  # noqa: E402
from benchmarks.bench_host import host_us  # noqa: E402

HEADERS = ["definition", "called, us", "in a compiled function, us"]


@functools.cache
def _stand_ins(device: str) -> dict:
    """{definition: callable of one tensor}: a Python function, the op as ``define_op`` makes it, the op as
    ``custom_op`` makes it. Each returns the same held tensor. The ops are defined once a process, so on one device."""
    if _stand_ins.cache_info().currsize:  # a second device: its namespace is taken
        raise ValueError(f"bench_ops defines its stand-in ops once a process, not again for {device}")
    from reference_kernels._common import define_op

    held = torch.zeros(8, 64, device=device)
    lib = torch.library.Library("bench_ops", "DEF")

    def fake(x):
        return torch.empty_like(x)

    library_op = define_op("probe(Tensor x) -> Tensor", lambda x: held, fake, lib=lib)

    @torch.library.custom_op("bench_ops::custom_probe", mutates_args=())
    def custom_op(x: torch.Tensor) -> torch.Tensor:
        return held

    custom_op.register_fake(fake)
    _stand_ins.lib = lib  # kept alive: a Library's registrations go with it
    return {"a Python function": lambda x: held, "define_op (torch.library.Library)": library_op,
            "torch.library.custom_op": torch.ops.bench_ops.custom_probe.default}


def device() -> str:
    """Where the stand-in ops' tensors live: the GPU where there is one, else the CPU."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def measure(calls: int, device: str) -> list[dict]:
    """One row a definition: host us a call, called and from a compiled function (best of three runs)."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    x = torch.zeros(8, 64, device=device)
    rows = []
    for name, fn in _stand_ins(device).items():
        compiled = torch.compile(lambda t, fn=fn: fn(t))
        figures = {}
        for how, call in (("called", lambda: fn(x)), ("compiled", lambda: compiled(x))):
            figures[how] = min(host_us(call, calls, sync=sync) for _ in range(3))
        rows.append({"definition": name, **figures})
    return rows


def table(rows: list[dict]) -> str:
    return markdown_table(HEADERS, [[r["definition"], f"{r['called']:.1f}", f"{r['compiled']:.1f}"] for r in rows])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls timed a case (default 2000)")
    add_out_option(parser)
    args = parser.parse_args(argv)
    if args.calls < 1:
        parser.error("--calls must be >= 1")
    out = write_output_to(args.out, __file__)
    head = header() + f", tensors on {device()}"
    rows = measure(args.calls, device())
    print(head + "\n\n" + table(rows))
    if out is not None:
        (out / "bench_ops.json").write_text(json.dumps({"header": head, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
