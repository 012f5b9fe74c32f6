"""Which of the plugin's pipeline modules a profiled call and a test's call pass through,
and how often the flow goes back upstream (docs/architecture.md: data flows one way).
Runs on CPU.

    PYTHONPATH=$PWD python3 scripts/flow_trace.py

For each entry (``capture.profile_call`` on a small call; ``plugin.pytest_pyfunc_call`` of a
test with a kernel and a bandwidth marker) it records every call between two package
modules below the entry, the leaf modules every stage uses left out (``LEAVES``:
docs/architecture.md, "Leaves used throughout"), and prints the modules entered and the
calls *upstream*: from a module to one above it in the pipeline (``PIPELINE``), e.g. a
verdict that runs the timing, or the report that measures on a read. Calls down the
pipeline and back (capture asking a source for kernels) are the one-way flow.
"""

from __future__ import annotations

import os
import sys
import tempfile
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
PACKAGE = os.path.join(ROOT, "pytest_fusioncheck")
LEAVES = {"budget", "where", "ranges", "graph_breaks", "numerics", "_compat", "state", "options"}
# docs/architecture.md's diagram, top to bottom (modules on one level share a rank).
PIPELINE = [
    {"plugin"}, {"fixture", "api"}, {"capture"}, {"ops", "host_syncs"},
    {"sources/__init__", "sources/kernels_cpu", "sources/kernels_cuda", "sources/bytes_model", "sources/bytes_ncu",
     "sources/time_device", "sources/time_wall", "roofline", "graph_replay"},
    {"report", "headroom"}, {"verdict"},
]
RANK = {m: i for i, level in enumerate(PIPELINE) for m in level}
# The data model: a call into it reads a report (a property, the table), not a step upstream.
DATA = {"report", "headroom"}


def _module(filename: str) -> str | None:
    if not filename.startswith(PACKAGE + os.sep):
        return None
    name = os.path.relpath(filename, PACKAGE)[:-3].replace(os.sep, "/")
    return None if name in LEAVES else name


def trace(entry_file: str, entry_name: str, run) -> tuple[list[str], list[tuple[str, str]]]:
    """The modules entered below the first call of ``entry_name`` in ``entry_file``, in
    order, and every upstream call ``(caller, callee)`` among them."""
    entered: list[str] = []
    upstream: list[tuple[str, str]] = []
    depth = [0]  # >0 while inside the entry

    def prof(frame, event, arg):
        code = frame.f_code
        if event == "call":
            if depth[0] == 0:
                if code.co_name == entry_name and code.co_filename.endswith(entry_file):
                    depth[0] = 1
                return
            depth[0] += 1
            callee = _module(code.co_filename)
            caller = _module(frame.f_back.f_code.co_filename) if frame.f_back is not None else None
            if callee and callee not in entered:
                entered.append(callee)
            if callee and caller and callee not in DATA and RANK.get(callee, 99) < RANK.get(caller, 99):
                upstream.append((caller, callee))
        elif event == "return" and depth[0]:
            depth[0] -= 1

    sys.setprofile(prof)
    try:
        run()
    finally:
        sys.setprofile(None)
    return entered, upstream


TEST = textwrap.dedent("""
    import pytest, torch

    @pytest.mark.max_kernels(5)
    @pytest.mark.bandwidth_bound(0.001)
    def test_softmax(fusion):
        x = torch.randn(256, 256)
        fusion.profile(lambda t: (t - t.max(-1, keepdim=True).values).exp(), x)
""")


def main() -> None:
    import pytest
    import torch

    from pytest_fusioncheck.capture import profile_call

    x = torch.randn(256, 256)
    profile_call(lambda t: t * 2, (x,), {}, device="cpu")  # imports and first-call work outside the trace
    rows = [("capture.profile_call", trace("capture.py", "profile_call", lambda: profile_call(lambda t: t.softmax(-1), (x,), {}, device="cpu")))]
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "test_flow.py"), "w") as f:
            f.write(TEST)
        import importlib.metadata as metadata

        installed = any(e.name == "fusioncheck" for e in metadata.entry_points(group="pytest11"))
        args = [tmp, "-q", "-p", "no:cacheprovider", "--fusion-device=cpu", "-p", "no:randomly"]
        args += [] if installed else ["-p", "pytest_fusioncheck.plugin"]
        rows.append(("plugin.pytest_pyfunc_call", trace("plugin.py", "pytest_pyfunc_call", lambda: pytest.main(args))))
    for name, (entered, upstream) in rows:
        pairs = sorted({f"{a} -> {b}" for a, b in upstream})
        print(f"{name}: {len(entered)} modules entered ({', '.join(entered)}); {len(upstream)} calls upstream"
              + (f" ({'; '.join(pairs)})" if pairs else ""))

if __name__ == "__main__":
    main()
