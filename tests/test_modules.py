"""Kernels attributed to the nn.Module that launched them, and reports of whole models
summarised per module with repeated structure folded (issue 15, items 1-2 in part)."""

from __future__ import annotations

import pytest
import torch

from fidelity_cases import Attention, GPT2MLP
from pytest_fusioncheck import FusionAssertionError, assert_max_kernels, profile
from pytest_fusioncheck.sources.bytes_model import merge_module_paths, module_from_stack_key


class Block(torch.nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.ln = torch.nn.LayerNorm(d)
        self.attn = Attention(d, 4)
        self.mlp = GPT2MLP(d)

    def forward(self, x):
        return self.mlp(self.attn(self.ln(x)))


class Model(torch.nn.Module):
    def __init__(self, d: int = 32, layers: int = 4) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList([Block(d) for _ in range(layers)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


@pytest.fixture
def model():
    torch._dynamo.reset()
    yield Model().eval()
    torch._dynamo.reset()


def test_each_eager_kernel_names_the_module_that_launched_it(model):
    report = profile(model, torch.randn(2, 8, 32))
    modules = [k.module for k in report.kernels]
    assert modules[:8] == [
        "layers.0.ln", "layers.0.attn.c_attn", "layers.0.attn", "layers.0.attn.c_proj",
        "layers.0.mlp.c_fc", "layers.0.mlp", "layers.0.mlp.c_proj", "layers.0.mlp",
    ]
    assert modules[8] == "layers.1.ln" and modules[-1] == "layers.3.mlp"
    assert " module " in report.table().splitlines()[0]
    assert report.to_dict()["kernels"][0]["module"] == "layers.0.ln"


def test_a_module_passed_as_an_argument_is_attributed_too():
    block = Block(32).eval()
    report = profile(lambda m, x: m(x), block, torch.randn(2, 8, 32))
    assert report.kernels[0].module == "ln" and report.kernels[1].module == "attn.c_attn"


def test_a_compiled_models_generated_kernels_name_their_module(model):
    report = profile(torch.compile(model), torch.randn(2, 8, 32))
    generated = [k for k in report.kernels if k.name.startswith("cpp_")]
    assert generated and all(k.module and k.module.startswith("layers.") for k in generated), str(report)


class Residual(torch.nn.Module):
    def __init__(self, d: int = 32) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(d, d)

    def forward(self, x):
        return x + torch.nn.functional.gelu(self.fc(x)) * 2  # ops of the root's own forward


@pytest.mark.parametrize("form", ["eager", "compiled"])
def test_the_kernels_of_a_models_own_forward_name_the_model_eager_and_compiled(form):
    torch._dynamo.reset()
    model = Residual().eval()
    report = profile(model if form == "eager" else torch.compile(model), torch.randn(8, 32))
    assert [k.module for k in report.kernels if not k.op.endswith("addmm")] and all(
        k.module == ("fc" if k.op.endswith("addmm") else "Residual") for k in report.kernels), str(report)

    def outside(x):  # reaches the model, runs none of its forward: its kernel is in no module
        return (x.exp() * 3).sum() + model.fc.bias.sum()

    report = profile(torch.compile(outside), torch.randn(8, 32))
    generated = [k for k in report.kernels if k.op.startswith("fused")]
    assert generated and all(k.module is None for k in generated), str(report)


def test_a_compiled_models_extern_kernels_name_the_module_their_wrapper_call_ran_for(model):
    """GEMMs stay ATen/cuBLAS calls in the compiled graph's wrapper: no module forward runs,
    so they took the root's name; the wrapper's comment names their source nodes."""
    report = profile(torch.compile(model), torch.randn(2, 8, 32))
    extern = [k for k in report.kernels if not k.name.startswith("cpp_")]
    assert extern, str(report)
    modules = [k.module for k in extern]
    assert all(m and m.startswith("layers.") for m in modules), str(report)
    assert {"layers.0.attn.c_attn", "layers.3.mlp.c_proj"} <= set(modules), str(report)


def test_a_generated_kernel_inductor_reuses_across_layers_names_their_common_module_not_the_last_one(model):
    """Inductor emits one kernel for identical code in several layers; naming it after the
    last layer compiled (``layers.3``) put layer 0's kernel in layer 3."""
    report = profile(torch.compile(model), torch.randn(2, 8, 32))
    names = [k.name for k in report.kernels if k.name.startswith("cpp_")]
    reused = {n for n in names if names.count(n) > 1}
    assert reused, str(report)  # the four layers share kernels
    for k in report.kernels:
        if k.name in reused:
            assert k.module is not None and k.module.startswith("layers.*"), str(report)


@pytest.mark.parametrize(
    "old, new, merged",
    [
        (None, "layers.0.mlp", "layers.0.mlp"),
        ("layers.0.mlp", "layers.0.mlp", "layers.0.mlp"),
        ("layers.0.mlp", "layers.1.mlp", "layers.*.mlp"),
        ("layers.*.mlp", "layers.3.mlp", "layers.*.mlp"),
        ("layers.0.norm", "layers.1.attn", "layers.*"),
        ("encoder.ln", "decoder.ln", None),
        ("layers.0", "layers.0.mlp", "layers.0"),
    ],
)
def test_module_paths_of_a_shared_kernel_merge_to_their_common_form(old, new, merged):
    assert merge_module_paths(old, new) == merged


def test_a_long_report_leads_with_the_per_module_summary_folded_by_repeated_structure(model):
    report = profile(model, torch.randn(2, 8, 32))
    assert report.kernel_count == 32
    text = str(report)
    assert text.index("per module (repeated structure folded):") < text.index("  #  kernel")
    assert "  layers.*.mlp: 2 kernels x 4," in text
    assert "  layers.*.ln: 1 kernel x 4," in text
    # then the ten kernels that took the most time, and where the other 22 rows are
    assert "top 10 of 32 rows by time:" in text and "  ... 22 more rows not shown; every row: report.table()" in text
    assert len(report.text(full=True).splitlines()) == len(text.splitlines()) + 32 - 12  # every row, no heading or closing line
    with pytest.raises(FusionAssertionError, match=r"(?s)32 kernels launched, limit 10.*layers\.\*\.attn\.c_attn: 1 kernel x 4.*top 10 of 32 rows"):
        assert_max_kernels(10, report=report)


def test_a_short_report_or_one_without_modules_has_no_module_summary():
    assert "per module" not in str(profile(torch.softmax, torch.randn(4, 4), -1))


@pytest.mark.parametrize(
    "qualname, path",
    [
        ("L['self'].layers.0.ln", "layers.0.ln"),
        ("L['self'].layers[0].mlp", "layers.0.mlp"),
        ("L['model']._modules['layers']._modules['0']", "layers.0"),
        ("L['self']", ""),
        ("L['self'].c_fc", "c_fc"),
    ],
)
def test_dynamos_module_stack_paths_read_as_module_paths(qualname, path):
    assert module_from_stack_key(qualname) == path


# --------------------------------------------------------------------------- baseline per module

from pytest_fusioncheck import baseline as baseline_mod  # noqa: E402


def test_a_baseline_comparison_names_the_module_patterns_whose_kernels_grew():
    before = {"layers.0.mlp": 2, "layers.1.mlp": 2, "layers.0.ln": 1, "layers.1.ln": 1, "head": 1}
    after = {"layers.0.mlp": 3, "layers.1.mlp": 3, "layers.0.ln": 1, "layers.1.ln": 1, "head": 2, "new": 1}
    assert baseline_mod.modules_grown(before, after) == (("layers.*.mlp", 4, 6), ("head", 1, 2), ("new", 0, 1))
    assert baseline_mod.modules_grown(after, before) == ()
    assert baseline_mod.module_pattern("model.layers.12.self_attn") == "model.layers.*.self_attn"
    assert baseline_mod.module_counts(["a", None, "a", "b"]) == {"a": 2, "b": 1}
    old = baseline_mod.make_record("t::x", "cpu", ["k"] * 7, modules=before)
    new = baseline_mod.make_record("t::x", "cpu", ["k"] * 10, modules=after)
    text = baseline_mod.compare(old, new).describe()
    assert "modules with more kernels:\n    layers.*.mlp: 4 -> 6\n    head: 1 -> 2\n    new: 0 -> 1" in text
    with pytest.raises(ValueError, match="'modules' should map module paths to kernel counts"):
        baseline_mod.make_record("t::x", "cpu", ["k"], modules={"a": -1})


MODEL_FILE = """
import pytest, torch

class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)
    def forward(self, x):
        return torch.nn.functional.gelu(self.fc(x)){extra}

class Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = torch.nn.LayerNorm(16)
        self.mlp = MLP()
    def forward(self, x):
        return x + self.mlp(self.ln(x))

class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([Layer() for _ in range(3)])
    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x

def test_model(fusion):
    with torch.no_grad():
        fusion.profile(Model(), torch.randn(4, 16))
"""


def test_a_model_whose_mlp_launches_more_kernels_fails_against_its_baseline_naming_the_mlp(run_pytest, pytester):
    pytester.makepyfile(test_m=MODEL_FILE.format(extra=""))
    run_pytest("--fusion-baseline", "base.json", "--fusion-update-baseline").assert_outcomes(passed=1)
    import json

    entry = next(iter(json.loads((pytester.path / "base.json").read_text())["entries"].values()))
    assert entry["cpu"]["modules"]["layers.0.mlp.fc"] >= 1 and entry["cpu"]["modules"]["layers.2.ln"] == 1
    pytester.makepyfile(test_m=MODEL_FILE.format(extra=" * 2"))  # one more kernel in every layer's mlp
    result = run_pytest("--fusion-baseline", "base.json")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*modules with more kernels:*", "*layers.*.mlp: 3 -> 6*"])
    assert "layers.*.ln:" not in result.stdout.str()


def test_the_whole_model_example_runs_with_module_paths_in_its_tables(run_pytest, pytester):
    """examples/test_whole_model.py as CI runs it: eager and compiled, per-module tables."""
    from pathlib import Path

    source = Path(__file__).resolve().parents[1] / "examples" / "test_whole_model.py"
    pytester.makepyfile(test_whole=source.read_text())
    result = run_pytest("--fusion-report")
    result.assert_outcomes(passed=2)
    # the summary shows the modules by time (which one is cut varies run to run): any folded layer will do
    result.stdout.fnmatch_lines(["*per module (repeated structure folded):*", "  layers.*: * kernels x 2, *"])
    result.stdout.fnmatch_lines(["*aten::mm*layers.1.mlp.down*"])  # the compiled model's extern GEMM
