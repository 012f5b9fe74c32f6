"""The pipeline's shape (docs/architecture.md): state kept per session and per test, nothing
shared between two sessions in one process, reports' tensors released at teardown, every
switch restored after a profiled call, no import cycles and no torch import at plugin load."""

from __future__ import annotations

import ast
import os
import subprocess
import sys

import pytest
import torch

import pytest_fusioncheck
from pytest_fusioncheck import profile
from pytest_fusioncheck.state import current_log

PACKAGE = os.path.dirname(pytest_fusioncheck.__file__)

ENFORCED = """
import torch
from pytest_fusioncheck import assert_bandwidth_bound_within

def test_bandwidth(fusion):
    fusion.profile(torch.add, torch.ones(64), torch.ones(64))
    assert_bandwidth_bound_within(0.9)
"""


def test_two_sessions_in_one_process_share_no_settings_and_no_reports(run_pytest, pytester):
    pytester.makepyfile(test_enforced=ENFORCED)
    before = len(current_log().reports)
    first = run_pytest("--fusion-device=cpu", "--fusion-enforce-cpu-timing", "--fusion-peak-bandwidth=1e15")
    first.assert_outcomes(failed=1)
    first.stdout.fnmatch_lines(["*of peak bandwidth < required 90%*"])
    second = run_pytest("--fusion-device=cpu")  # same process: reported, not enforced, a fresh peak
    second.assert_outcomes(passed=1)
    assert len(current_log().reports) == before  # neither session's reports reached this test's log


FREED = """
import gc, weakref, torch
from pytest_fusioncheck import assert_max_kernels

refs = []

def make(x):
    return x * 2

def test_profiles(fusion):
    x = torch.randn(1024)
    report = fusion.profile(make, x)
    refs.append(weakref.ref(report.output))
    refs.append(weakref.ref(x))
    assert report.median_time_s is not None  # timed at capture (the test names a timed figure): nothing kept after
    assert_max_kernels(1)

def test_after_teardown_the_tensors_are_gone():
    gc.collect()
    assert refs and all(r() is None for r in refs), [r() is None for r in refs]
"""


def test_a_profiled_tests_tensors_are_freed_after_its_teardown(run_pytest, pytester):
    pytester.makepyfile(test_freed=FREED)
    run_pytest("-p", "no:randomly").assert_outcomes(passed=2)


def test_the_inductor_switches_and_launcher_hooks_are_restored_after_a_profiled_call():
    import torch._inductor.config as inductor_config
    from torch._inductor.codegen.cpp import CppScheduling

    cache, profile_flag = inductor_config.fx_graph_cache, inductor_config.cpp.enable_kernel_profile
    define_kernel = CppScheduling.define_kernel
    seen = {}

    def look(x):
        seen["cache"] = inductor_config.fx_graph_cache
        seen["define_kernel"] = CppScheduling.define_kernel
        return x + 1

    profile(look, torch.ones(4))
    assert seen["cache"] is False and seen["define_kernel"] is not define_kernel  # on during the call
    assert inductor_config.fx_graph_cache == cache
    assert inductor_config.cpp.enable_kernel_profile == profile_flag
    assert CppScheduling.define_kernel is define_kernel


def _imports(path: str, package: str = PACKAGE) -> set[str]:
    """Modules of ``package`` that ``path`` imports (at any depth of the file)."""
    tree = ast.parse(open(path).read())
    rel = os.path.relpath(path, package).replace(os.sep, "/")
    here = rel.split("/")[:-1]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = here[: len(here) - (node.level - 1)] if node.level > 1 else here
            target = base + (node.module.split(".") if node.module else [])
            names = [target + [a.name] for a in node.names] if not node.module else [target]
            for t in names:
                candidate = "/".join(t)
                if os.path.exists(os.path.join(package, candidate + ".py")):
                    out.add(candidate)
                elif os.path.isdir(os.path.join(package, candidate)):
                    out.add(candidate + "/__init__")
    return out


def _module_graph(package: str = PACKAGE) -> dict[str, set[str]]:
    graph = {}
    for root, _, files in os.walk(package):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(root, f)
                graph[os.path.relpath(path, package)[:-3].replace(os.sep, "/")] = _imports(path, package)
    return graph


KERNELS = os.path.join(os.path.dirname(PACKAGE), "reference_kernels")


@pytest.mark.parametrize("package, members", [(PACKAGE, ("plugin", "state")), (KERNELS, ("softmax", "_gemm_ws"))],
                         ids=["pytest_fusioncheck", "reference_kernels"])
def test_the_package_has_no_import_cycles(package, members):
    graph = _module_graph(package)
    assert all(m in graph for m in members)
    visiting, done, cycles = set(), set(), []

    def visit(node, path):
        if node in visiting:
            cycles.append(path[path.index(node):] + [node])
            return
        if node in done:
            return
        visiting.add(node)
        for nxt in graph.get(node, ()):
            visit(nxt, path + [node])
        visiting.discard(node)
        done.add(node)

    for node in graph:
        visit(node, [])
    assert not cycles, cycles


def test_loading_the_plugin_imports_neither_torch_nor_triton():
    code = "import sys, pytest_fusioncheck.plugin; print('torch' in sys.modules, 'triton' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


# Python's own documented names that start with an underscore (frames, named tuples): not torch's.
_PYTHON_UNDERSCORE_API = {"_getframe", "_fields", "_asdict", "_replace", "_make"}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_api_uses(trees: dict[str, ast.Module]) -> list[str]:
    """Where modules other than ``_compat.py`` reach a private torch/Triton API, by an AST
    scan: an import of a private module or name of torch or Triton (``torch._inductor``,
    ``from torch import _dynamo``), an attribute chain from ``torch``/``triton`` with a
    private link (``torch._C``), or a private attribute read on any object
    (``x._orig_mod``, ``getattr(x, "_schema")``) whose name the package itself does not
    define (its own ``_helpers`` and ``self._state`` pass)."""
    own: set[str] = set()
    for tree in trees.values():
        for n in ast.walk(tree):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                own.add(n.name)
            elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                own.add(n.id)
            elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store):
                own.add(n.attr)
            elif isinstance(n, ast.arg):
                own.add(n.arg)
    own -= {"_orig_mod", "_torchdynamo_orig_callable", "_version", "_schema"} & own  # never ours, even if assigned
    found = []
    for path, tree in trees.items():
        if os.path.basename(path) == "_compat.py":
            continue
        for n in ast.walk(tree):
            where = f"{os.path.relpath(path, PACKAGE)}:{getattr(n, 'lineno', 0)}"
            if isinstance(n, ast.Import):
                found += [f"{where}: import {a.name}" for a in n.names
                          if a.name.split(".")[0] in ("torch", "triton") and any(map(_private, a.name.split(".")[1:]))]
            elif isinstance(n, ast.ImportFrom) and n.level == 0 and n.module:
                parts = n.module.split(".")
                if parts[0] in ("torch", "triton") and (any(map(_private, parts[1:])) or any(_private(a.name) for a in n.names)):
                    found.append(f"{where}: from {n.module} import ...")
            elif isinstance(n, ast.Attribute) and _private(n.attr) and n.attr not in _PYTHON_UNDERSCORE_API:
                chain = ast.unparse(n)
                if chain.split(".")[0] in ("torch", "triton") or n.attr not in own:
                    found.append(f"{where}: {chain}")
            elif (isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("getattr", "hasattr", "setattr")
                  and len(n.args) > 1 and isinstance(n.args[1], ast.Constant) and isinstance(n.args[1].value, str)
                  and _private(n.args[1].value) and n.args[1].value not in own | _PYTHON_UNDERSCORE_API):
                found.append(f"{where}: {ast.unparse(n)}")
    return found


def _package_trees() -> dict[str, ast.Module]:
    return {os.path.join(root, f): ast.parse(open(os.path.join(root, f)).read())
            for root, _, files in os.walk(PACKAGE) for f in files if f.endswith(".py")}


def test_private_torch_apis_are_reached_only_through_compat():
    assert private_api_uses(_package_trees()) == []


def test_the_private_api_scan_finds_each_kind_of_use():
    sample = ast.parse(
        "import torch._dynamo\n"
        "from torch._inductor.virtualized import V\n"
        "from torch import _C\n"
        "def f(model, func):\n"
        "    torch._C._autograd\n"
        "    model._orig_mod\n"
        "    getattr(func, '_schema', None)\n"
        "    self_made = model._mine\n"
        "def g(x):\n"
        "    x._mine = 1\n"
        "    return sys._getframe(1), x._fields, x.__dict__\n"
    )
    found = private_api_uses({os.path.join(PACKAGE, "sample.py"): sample})
    assert sorted(line.split(": ", 1)[1] for line in found) == sorted([
        "import torch._dynamo", "from torch._inductor.virtualized import ...", "from torch import ...",
        "torch._C._autograd", "torch._C", "model._orig_mod", "getattr(func, '_schema', None)",
    ])


# Where a report's fields may be written: capture builds a report, the sources fill theirs;
# report.py's own methods (release). Everything after capture returns reads it.
_REPORT_WRITERS = ("capture.py", "report.py", f"sources{os.sep}")


def report_writes(trees: dict[str, ast.Module]) -> list[str]:
    """``path:line: target`` for each assignment to a ``FusionReport`` field (or a list
    field grown in place) on a variable named like a report, outside ``_REPORT_WRITERS``."""
    import dataclasses

    from pytest_fusioncheck.report import FusionReport

    fields = {f.name for f in dataclasses.fields(FusionReport)}
    found = []
    for path, tree in trees.items():
        rel = os.path.relpath(path, PACKAGE)
        if rel.startswith(_REPORT_WRITERS):
            continue
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("append", "extend", "insert"):
                targets = [node.func.value]
            for t in targets:
                if (isinstance(t, ast.Attribute) and t.attr in fields and isinstance(t.value, ast.Name)
                        and t.value.id in ("report", "r", "rep", "fused", "unfused")):
                    found.append(f"{rel}:{node.lineno}: {ast.unparse(t)}")
    return found


def test_only_capture_and_the_sources_write_a_reports_fields():
    assert report_writes(_package_trees()) == []


def test_the_report_write_scan_finds_assignments_and_in_place_growth():
    sample = ast.parse(
        "def verdict(report, r, other):\n"
        "    report.peak_bandwidth = 1.0\n"
        "    r.time_s += 2\n"
        "    report.warnings.append('w')\n"
        "    other.time_s = 3\n"
        "    report.longrepr = 'not a report field'\n"
    )
    found = report_writes({os.path.join(PACKAGE, "verdict_sample.py"): sample, os.path.join(PACKAGE, "capture.py"): sample})
    assert [line.split(": ", 1)[1] for line in found] == ["report.peak_bandwidth", "r.time_s", "report.warnings"]


def test_every_section_of_docs_kernels_md_that_the_code_names_exists():
    # comments point to docs, not to runs: a section renamed or merged must take its pointers with it
    import glob
    import re

    root = os.path.dirname(PACKAGE)
    headings = set(re.findall(r"^#+ (.+)$", open(os.path.join(root, "docs", "kernels.md")).read(), re.M))
    named = []
    for pattern in ("reference_kernels/*.py", "benchmarks/*.py", "tests/*.py", "scripts/*.py", "*.md", "docs/*.md"):
        for path in glob.glob(os.path.join(root, pattern)):
            text = open(path).read()
            for m in re.finditer(r'kernels\.md(?:\)|\]\([^)]*\))?,?\s+"([^"]+)"', text):
                named.append((os.path.relpath(path, root), re.sub(r"\s*\n\s*#?\s*", " ", m.group(1))))
    assert len(named) > 20
    assert [(path, name) for path, name in named if name not in headings] == []


TUNING_MAX = 30  # module-level tuning constants a subject, over all its modules (issue 55)
# A subject's modules: its public module and the private ones only it imports (kernels, Gluon kernels, plans). The
# modules every subject shares (``_common``, ``_ragged``, ...) are counted as one more subject, "shared".
SUBJECTS = {
    "softmax": ("softmax.py", "_softmax_kernels.py", "_softmax_held.py"),
    "layer_norm": ("layer_norm.py", "_layer_norm_kernels.py", "_layer_norm_held.py"),
    "gemm_epilogue": ("gemm_epilogue.py", "_gemm_kernels.py", "_gemm_common.py", "_gemm_ws.py"),
    "attention": ("attention.py", "_attention_kernels.py", "_attention_ws.py"),
    "bias_gelu_dropout": ("bias_gelu_dropout.py", "_bias_gelu_dropout_kernels.py"),
    "shared": ("__init__.py", "_common.py", "_device.py", "_held.py", "_hopper.py", "_launch.py", "_math.py",
               "_ragged.py", "_split_walk.py"),
}


def tuning_constants(source: str) -> list[str]:
    """Module-level UPPERCASE names bound to a free choice: a literal (a number, string or None, or a tuple or dict of
    them), not a value derived from other names, not a tuple of strings (the names of plans or variants), and not an
    empty list or dict (state the module fills, not a choice)."""
    import re

    def free(value: ast.AST) -> bool:
        if any(isinstance(n, ast.Name) and n.id not in ("dict", "tuple") for n in ast.walk(value)):
            return False
        if isinstance(value, (ast.List, ast.Dict)) and not (value.elts if isinstance(value, ast.List) else value.keys):
            return False
        return not (isinstance(value, ast.Tuple) and value.elts
                    and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in value.elts))

    found = []
    for node in ast.parse(source).body:
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, ast.AnnAssign) else [])
        for target in targets:
            if (isinstance(target, ast.Name) and re.fullmatch(r"_?[A-Z][A-Z0-9_]*", target.id)
                    and node.value is not None and free(node.value)):
                found.append(target.id)
    return found


def test_the_tuning_constant_scan_counts_free_choices_only():
    sample = (
        "A = 4096\n_B: int | None = None\nC = dict(m=1, w=4)\nD = ((1024, 64), (3072, 128))\nE = 'auto'\n"
        "F = 32 * A\nG = ('auto', 'split')\nH = Tuning()\nlower = 3\ndef f():\n    I = 1\n_J: list = []\nK = {}\n"
        "L = [1, 2]\n"
    )
    assert tuning_constants(sample) == ["A", "_B", "C", "D", "E", "L"]


def test_each_kernel_module_belongs_to_one_subject():
    modules = sorted(f for f in os.listdir(KERNELS) if f.endswith(".py"))
    listed = [f for files in SUBJECTS.values() for f in files]
    assert sorted(listed) == modules, "a module of reference_kernels/ in no subject, or in two (SUBJECTS)"


def test_each_subject_keeps_at_most_30_tuning_constants():
    counts = {subject: sum(len(tuning_constants(open(os.path.join(KERNELS, f)).read())) for f in files)
              for subject, files in SUBJECTS.items()}
    assert counts["layer_norm"] > 0 and counts["softmax"] > 0
    over = {s: n for s, n in counts.items() if n > TUNING_MAX}
    assert over == {}, f"tuning constants over the limit (docs/kernels.md, \"Planning\"): {over}"
