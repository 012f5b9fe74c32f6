"""assert_matches_reference: float64 reference, per-dtype tolerances, messages, input safety, records."""

import copy
import dataclasses
import math
from typing import NamedTuple

import pytest
import torch

from pytest_fusioncheck.numerics import (
    TOLERANCES,
    NumericsMismatch,
    assert_matches_reference,
    tolerance_for,
)
import collections


def _twice(x):
    return x * 2


def _wrong_twice(x):
    """A 'kernel' that gets one element of 3x4 wrong by 0.5."""
    y = x * 2
    y[1, 2] += 0.5
    return y


def test_a_wrong_kernel_fails_with_the_worst_element_and_both_values():
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    with pytest.raises(AssertionError) as info:
        assert_matches_reference(_wrong_twice, _twice, x)
    message = str(info.value)
    ref = torch.arange(12, dtype=torch.float64) * 2
    rel_l2 = 0.5 / float(torch.linalg.vector_norm(ref))
    assert "out: shape (3, 4), dtype torch.float32" in message
    assert "mismatched elements: 1 of 12" in message
    assert "max abs error:       0.5\n" in message
    assert f"max rel error:       {0.5 / 12:.8g}" in message
    assert f"relative L2 error:   {rel_l2:.8g}" in message
    assert "worst element:       out[1, 2]: fused 12.5, reference 12" in message
    assert "rtol=1e-05, atol=1e-05 (TOLERANCES[torch.float32])" in message


def test_the_worst_element_is_the_one_furthest_over_its_tolerance_not_the_largest_error():
    # Element 0 is off by 1e-3 on a value of 1e3 (within rtol); element 1 by 1e-4 on 1e-3.
    x = torch.tensor([1000.0, 0.001], dtype=torch.float64)

    def fused(x):
        return x + torch.tensor([1e-3, 1e-4], dtype=torch.float64)

    with pytest.raises(AssertionError) as info:
        assert_matches_reference(fused, lambda x: x, x, rtol=1e-5, atol=1e-7)
    assert "mismatched elements: 1 of 2" in str(info.value)
    assert "worst element:       out[1]: fused 0.0011, reference 0.001" in str(info.value)


def test_a_correct_fused_kernel_passes_and_reports_its_small_errors():
    torch.manual_seed(0)
    x = torch.randn(16, 257)

    def fused_softmax(x):  # one pass in float32, a different order from the reference
        e = torch.exp(x - x.amax(dim=-1, keepdim=True))
        return e * (1.0 / e.sum(dim=-1, keepdim=True))

    result = assert_matches_reference(fused_softmax, lambda x: torch.softmax(x, dim=-1), x)
    assert 0 < result.max_abs_error < 1e-6
    assert 0 < result.rel_l2_error < 1e-5
    assert result.outputs[0].path == "out" and result.outputs[0].mismatches == 0


def test_an_error_that_passes_in_bfloat16_fails_in_float32():
    # 1 + 2**-7 is the next bfloat16 after 1.0: an error of one bfloat16 ulp.
    def fused(x):
        return x * 1.0078125

    result = assert_matches_reference(fused, lambda x: x, torch.ones(8, dtype=torch.bfloat16))
    assert result.max_abs_error == 0.0078125
    with pytest.raises(AssertionError, match=r"TOLERANCES\[torch.float32\]"):
        assert_matches_reference(fused, lambda x: x, torch.ones(8, dtype=torch.float32))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
def test_each_dtype_uses_its_own_row_of_the_table(dtype):
    rtol, atol = TOLERANCES[dtype]
    x = torch.ones(4, dtype=dtype)
    # The float64 reference can sit anywhere: fused is exactly 1, the reference 1 + delta.
    within = (rtol + atol) / 2
    assert_matches_reference(lambda x: x, lambda x: x * (1 + within), x)
    with pytest.raises(AssertionError, match=rf"TOLERANCES\[{dtype}\]"):
        assert_matches_reference(lambda x: x, lambda x: x * (1 + 2 * (rtol + atol)), x)


def test_the_table_is_looser_for_lower_precision_and_takes_dtypes_or_names():
    assert TOLERANCES[torch.bfloat16] == TOLERANCES["bfloat16"] == tolerance_for(torch.bfloat16)
    order = [torch.float64, torch.float32, torch.float16, torch.bfloat16]
    rtols = [TOLERANCES[d][0] for d in order]
    assert rtols == sorted(rtols)
    assert tolerance_for(torch.int32) == (0.0, 0.0)
    assert tolerance_for(torch.complex64) == TOLERANCES[torch.float32]


def test_nan_in_the_fused_output_never_passes_even_with_huge_tolerances():
    def fused(x):
        y = x.clone()
        y[2] = float("nan")
        return y

    with pytest.raises(AssertionError) as info:
        assert_matches_reference(fused, lambda x: x, torch.ones(5), rtol=1e9, atol=1e9)
    message = str(info.value)
    assert "mismatched elements: 1 of 5" in message
    assert "NaN where the reference has none: 1" in message
    assert "worst element:       out[2]: fused nan, reference 1" in message


def test_nan_passes_only_where_the_reference_has_nan_too():
    x = torch.tensor([float("nan"), 2.0, 3.0])
    assert_matches_reference(lambda x: x * 2, lambda x: x * 2, x)
    # flipped: [6, 4, nan] against [nan, 4, 6]: a NaN in each, at different places
    with pytest.raises(AssertionError, match="mismatched elements: 2 of 3"):
        assert_matches_reference(lambda x: x.flip(0) * 2, lambda x: x * 2, x)
    with pytest.raises(AssertionError, match=r"worst element:       out\[0\]: fused 0, reference nan"):
        assert_matches_reference(lambda x: torch.nan_to_num(x), lambda x: x, x)


def test_an_inf_must_match_the_reference_in_sign_and_position():
    x = torch.tensor([1.0, float("inf"), -2.0])
    assert_matches_reference(lambda x: x, lambda x: x, x)
    with pytest.raises(AssertionError, match=r"out\[1\]: fused -inf, reference inf"):
        assert_matches_reference(lambda x: torch.where(x.isinf(), -x, x), lambda x: x, x)
    with pytest.raises(AssertionError, match=r"out\[1\]: fused 3.4028235e\+38, reference inf"):
        assert_matches_reference(lambda x: torch.nan_to_num(x), lambda x: x, x, rtol=1.0, atol=1.0)


def test_the_check_does_not_modify_the_inputs_and_the_fused_fn_gets_the_originals():
    x = torch.randn(4, 4)
    before = x.clone()
    seen = []

    def fused(t):
        seen.append((t is x, t.dtype))
        return t * 2

    def reference_that_scribbles_on_its_input(t):
        t.mul_(2)
        return t

    assert_matches_reference(fused, reference_that_scribbles_on_its_input, x)
    assert seen == [(True, torch.float32)]
    assert x.dtype == torch.float32
    assert torch.equal(x, before)


def test_the_reference_sees_the_inputs_as_they_were_before_the_fused_call():
    x = torch.zeros(3)

    def fused_in_place(t):  # mutating its own input is the fused fn's business
        return t.add_(1)

    assert_matches_reference(fused_in_place, lambda t: t + 1, x)
    assert torch.equal(x, torch.ones(3))


def test_the_reference_gets_float64_copies_through_modules_and_nested_arguments():
    linear = torch.nn.Linear(3, 2)
    weight_before = linear.weight.detach().clone()
    x = torch.randn(5, 3, requires_grad=True)
    idx = torch.tensor([0, 2])
    seen = {}

    def fused(module, inputs, *, scale):
        return module(inputs["x"][0]) * scale

    def reference(module, inputs, *, scale):
        seen["param"] = module.weight.dtype
        seen["x"] = (inputs["x"][0].dtype, inputs["x"][0].requires_grad, inputs["x"][1] is inputs["x"][0])
        seen["idx"] = inputs["idx"].dtype
        module.weight.data.zero_()
        return module(inputs["x"][0]) * scale + (module.weight.sum() * 0)

    inputs = {"x": [x, x], "idx": idx}
    with pytest.raises(AssertionError):  # the reference zeroed its own weight copy
        assert_matches_reference(fused, reference, linear, inputs, scale=2.0)
    assert seen == {"param": torch.float64, "x": (torch.float64, True, True), "idx": torch.int64}
    assert linear.weight.dtype == torch.float32
    assert torch.equal(linear.weight.detach(), weight_before)
    assert inputs["x"][0] is x and x.dtype == torch.float32


def test_tuple_and_dict_outputs_are_compared_and_the_failing_one_is_named():
    x = torch.ones(2, 3)

    def fused(x):
        return x, {"y": x * 3, "z": x + 1}

    def reference(x):
        return x, {"y": x * 2, "z": x + 1}

    with pytest.raises(AssertionError) as info:
        assert_matches_reference(fused, reference, x)
    message = str(info.value)
    assert "out[1]['y']: shape (2, 3), dtype torch.float32" in message
    assert "mismatched elements: 6 of 6" in message
    assert "out[0]:" not in message and "out[1]['z']:" not in message

    result = assert_matches_reference(reference, reference, x)
    assert [o.path for o in result.outputs] == ["out[0]", "out[1]['y']", "out[1]['z']"]


def test_a_structure_mismatch_names_the_path():
    x = torch.ones(2)
    with pytest.raises(NumericsMismatch) as info:
        assert_matches_reference(lambda x: (x, {"y": x}), lambda x: (x, {"y": x, "w": x}), x)
    assert "out[1]: structure mismatch: keys only in the reference: 'w'" in str(info.value)

    with pytest.raises(AssertionError, match=r"out: structure mismatch: fused returned a tuple of length 1, "
                                             r"the reference returned a tuple of length 2"):
        assert_matches_reference(lambda x: (x,), lambda x: (x, x), x)

    with pytest.raises(AssertionError, match=r"out\[0\]: structure mismatch: fused returned NoneType None"):
        assert_matches_reference(lambda x: [None], lambda x: [x], x)


def test_a_shape_or_dtype_kind_mismatch_is_a_clear_failure():
    x = torch.ones(2, 3)
    with pytest.raises(AssertionError, match=r"out: shape mismatch: fused \(3, 2\) \(torch.float32\), "
                                             r"reference \(2, 3\) \(torch.float64\)"):
        assert_matches_reference(lambda x: x.t(), lambda x: x, x)
    with pytest.raises(AssertionError, match=r"out: dtype mismatch: fused is torch.int64 \(integer\), "
                                             r"the reference returned torch.float64 \(floating point\)"):
        assert_matches_reference(lambda x: x.long(), lambda x: x, x)


def test_explicit_rtol_and_atol_override_the_table():
    x = torch.ones(4)

    def fused(x):
        return x * 1.001

    with pytest.raises(AssertionError):
        assert_matches_reference(fused, lambda x: x, x)
    result = assert_matches_reference(fused, lambda x: x, x, rtol=2e-3, atol=0)
    assert result.outputs[0].tolerance_source == "explicit rtol and atol"
    assert (result.outputs[0].rtol, result.outputs[0].atol) == (2e-3, 0)
    with pytest.raises(AssertionError, match=r"rtol=1e-05, atol=0.01 \(explicit atol, rtol from TOLERANCES"):
        assert_matches_reference(lambda x: x * 1.02, lambda x: x, x, atol=1e-2)


def test_integer_outputs_are_compared_exactly():
    x = torch.tensor([[1.0, 5.0, 2.0]])
    assert_matches_reference(lambda x: x.argmax(dim=-1), lambda x: x.argmax(dim=-1), x)
    with pytest.raises(AssertionError, match=r"(?s)fused 1, reference 2.*exact comparison for integer outputs"):
        assert_matches_reference(lambda x: x.argmax(dim=-1) + 0, lambda x: x.argmax(dim=-1) + 1, x)


def test_bad_tolerances_are_rejected_before_anything_runs():
    calls = []
    with pytest.raises(ValueError, match="rtol must be a finite number >= 0, got -1"):
        assert_matches_reference(calls.append, calls.append, torch.ones(1), rtol=-1)
    assert calls == []


def test_a_dtype_without_a_default_tolerance_asks_for_one():
    x = torch.ones(4).to(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="no default tolerance for outputs of dtype torch.float8_e4m3fn"):
        assert_matches_reference(lambda x: x, lambda x: x, x)
    result = assert_matches_reference(lambda x: x, lambda x: x, x, rtol=0.25, atol=0.1)
    assert result.max_abs_error == 0


def test_an_error_in_the_reference_says_it_ran_on_float64_copies():
    def reference(x):
        raise RuntimeError("expected scalar type Float but found Double")

    with pytest.raises(RuntimeError) as info:
        assert_matches_reference(lambda x: x, reference, torch.ones(1))
    assert any("float64 copies" in note for note in info.value.__notes__)


def test_python_number_outputs_are_compared_as_float64():
    result = assert_matches_reference(lambda: 1.0 + 1e-12, lambda: 1.0)
    assert math.isclose(result.max_abs_error, 1e-12, rel_tol=1e-3)
    assert result.outputs[0].dtype == "float64"


def test_a_module_reference_runs_in_float64_with_its_parameters_copied():
    import torch

    torch.manual_seed(0)
    block = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU())
    x = torch.randn(4, 8)
    result = assert_matches_reference(block, block, x)
    assert block[0].weight.dtype == torch.float32  # the user's module is left as it was
    assert result.max_abs_error < 1e-5


def test_a_numerics_failure_in_a_profiled_test_carries_the_kernel_table(run_pytest, pytester):
    pytester.makepyfile(
        """
import torch

def wrong_softmax(x):
    return torch.softmax(x, -1) * 1.01

def test_wrong(fusion):
    x = torch.randn(8, 16)
    fusion.profile(wrong_softmax, x)
    fusion.assert_matches_reference(wrong_softmax, lambda t: torch.softmax(t, -1), x)
"""
    )
    result = run_pytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*max abs error*", "*latest fusion report of this test:*", "*aten::_softmax*", "*aten::mul*"])


# --- records: model outputs, dataclasses, named tuples, caches (docs/numerics.md) ---------


@pytest.fixture(scope="module")
def tiny_llama():
    """A random-weight two-layer Hugging Face LlamaForCausalLM (no download) and token ids."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval(), torch.randint(0, 64, (2, 7))


_LLAMA_TENSORS = ["out.logits"] + [f"out.cache.layers[{i}].{kv}" for i in (0, 1) for kv in ("keys", "values")]


def test_a_hugging_face_llama_matches_itself_with_its_logits_and_kv_cache_compared(tiny_llama):
    model, ids = tiny_llama
    result = assert_matches_reference(model, model, ids, use_cache=True)
    assert [o.path for o in result.outputs if o.dtype == "float32"] == _LLAMA_TENSORS
    assert "out.cache.layers[0].is_initialized" in [o.path for o in result.outputs]  # bools compared exactly


def test_a_llama_with_one_perturbed_layer_fails_naming_the_logits_and_that_layers_cached_values(tiny_llama):
    model, ids = tiny_llama
    perturbed = copy.deepcopy(model)
    with torch.no_grad():
        perturbed.model.layers[1].self_attn.v_proj.weight.add_(0.1)
    with pytest.raises(NumericsMismatch) as info:
        assert_matches_reference(perturbed, model, ids, use_cache=True)
    assert [p.split(":")[0] for p in info.value.problems] == ["out.logits", "out.cache.layers[1].values"]
    assert "worst element:       out.cache.layers[1].values[" in str(info.value)


def test_a_compiled_llama_matches_the_eager_one_with_its_kv_cache(tiny_llama):
    # aot_eager: dynamo rebuilds the output and cache objects as with inductor, whose C++ build
    # takes some 20 s on a cold CPU cache
    model, ids = tiny_llama
    result = assert_matches_reference(torch.compile(model, backend="aot_eager"), model, ids, use_cache=True)
    assert [o.path for o in result.outputs if o.dtype == "float32"] == _LLAMA_TENSORS


@dataclasses.dataclass
class _Step:
    hidden: torch.Tensor
    aux: dict
    name: str


def test_a_dataclass_output_is_compared_field_by_field():
    x = torch.ones(2, 3)
    result = assert_matches_reference(lambda x: _Step(x * 2, {"loss": x.sum()}, "fwd"),
                                      lambda x: _Step(x * 2, {"loss": x.sum()}, "fwd"), x)
    assert [o.path for o in result.outputs] == ["out.hidden", "out.aux['loss']"]
    with pytest.raises(NumericsMismatch) as info:
        assert_matches_reference(lambda x: _Step(x * 2, {"loss": x.sum()}, "bwd"),
                                 lambda x: _Step(x * 2, {"loss": x.sum() + 1}, "fwd"), x)
    assert [p.split(":")[0] for p in info.value.problems] == ["out.aux['loss']", "out.name"]


class _TopK(NamedTuple):
    values: torch.Tensor
    indices: torch.Tensor


def test_a_namedtuple_output_names_its_fields_in_the_path():
    x = torch.tensor([[1.0, 5.0, 2.0]])
    with pytest.raises(NumericsMismatch) as info:
        assert_matches_reference(lambda x: _TopK(*x.topk(2)), lambda x: _TopK(x.topk(2)[0], x.topk(2)[1].flip(-1)), x)
    assert [p.split(":")[0] for p in info.value.problems] == ["out.indices"]
    assert "worst element:       out.indices[0, 0]: fused 1, reference 2" in str(info.value)


class _LegacyCache:
    """A cache in the style of older transformers releases: lists of tensors per layer."""

    def __init__(self, keys, values):
        self.key_cache, self.value_cache = list(keys), list(values)
        self.dtype = keys[0].dtype
        self._seen_tokens = object()  # private: not compared
        self.update = lambda: None  # callable: not compared
        self.owner = self  # a cycle: compared once

    def __repr__(self):
        return f"{type(self).__name__}({len(self.key_cache)} layers)"


class _OtherCache(_LegacyCache):
    pass


def test_an_object_holding_tensors_is_walked_by_its_public_attributes():
    x = torch.ones(2, 3)
    result = assert_matches_reference(lambda x: _LegacyCache([x], [x * 2]), lambda x: _LegacyCache([x], [x * 2]), x)
    assert [o.path for o in result.outputs] == ["out.key_cache[0]", "out.value_cache[0]"]  # dtype: by kind
    with pytest.raises(NumericsMismatch) as info:
        assert_matches_reference(lambda x: {"cache": _LegacyCache([x, x], [x, x])},
                                 lambda x: {"cache": _LegacyCache([x, x], [x, x + 1])}, x)
    assert [p.split(":")[0] for p in info.value.problems] == ["out['cache'].value_cache[1]"]


def test_an_attribute_only_one_side_has_is_a_structure_mismatch_naming_it():
    x = torch.ones(2)
    extra = _LegacyCache([x], [x])
    extra.offset = 3
    with pytest.raises(NumericsMismatch) as info:
        assert_matches_reference(lambda x: extra, lambda x: _LegacyCache([x], [x]), x)
    assert info.value.problems == ["out: structure mismatch: attributes only in the fused output: 'offset'"]


def test_a_dtype_attribute_is_compared_by_kind_like_the_tensors_it_describes():
    with pytest.raises(NumericsMismatch) as info:
        assert_matches_reference(lambda x: _LegacyCache([x.long()], [x.long()]), lambda x: _LegacyCache([x], [x]),
                                 torch.ones(2))
    assert "out.dtype: dtype mismatch: fused is torch.int64 (integer), the reference returned torch.float64 " \
           "(floating point)" in info.value.problems


def test_objects_of_different_types_are_a_structure_mismatch_naming_both():
    x = torch.ones(2)
    with pytest.raises(NumericsMismatch) as info:
        assert_matches_reference(lambda x: [_OtherCache([x], [x])], lambda x: [_LegacyCache([x], [x])], x)
    assert info.value.problems == [
        "out[0]: structure mismatch: fused returned _OtherCache _OtherCache(1 layers), "
        "the reference returned _LegacyCache _LegacyCache(1 layers)"
    ]


@dataclasses.dataclass
class _Meta:
    name: str


def test_objects_without_tensors_are_still_compared_by_equality():
    assert_matches_reference(lambda: (torch.ones(1), _Meta("a")), lambda: (torch.ones(1), _Meta("a")))
    with pytest.raises(NumericsMismatch) as info:
        assert_matches_reference(lambda: (torch.ones(1), _Meta("a")), lambda: (torch.ones(1), _Meta("b")))
    assert info.value.problems == [
        "out[1]: structure mismatch: fused returned _Meta _Meta(name='a'), the reference returned _Meta _Meta(name='b')"
    ]


# --- behaviour that mutation testing found no test pinning (docs/mutation.md) ------------


def _mismatch(fused_out, ref_out, **tolerances):
    """The NumericsMismatch raised for outputs ``fused_out`` against ``ref_out``."""
    with pytest.raises(NumericsMismatch) as info:
        assert_matches_reference(lambda: fused_out, lambda: ref_out, **tolerances)
    return info.value


def _line(error, start):
    """The one line of ``error``'s message that starts (after indentation) with ``start``."""
    (line,) = [ln.strip() for ln in str(error).splitlines() if ln.strip().startswith(start)]
    return line


def _result(fused_out, ref_out, **tolerances):
    return assert_matches_reference(lambda: fused_out, lambda: ref_out, **tolerances)


# --- tolerances -------------------------------------------------------------------------


def test_a_row_added_for_a_torch_dtype_is_found_by_name_and_by_dtype():
    assert TOLERANCES.get(torch.float8_e4m3fn, "no row") == "no row"
    TOLERANCES[torch.float8_e4m3fn] = (0.125, 0.0625)
    try:
        assert "float8_e4m3fn" in TOLERANCES
        assert TOLERANCES.get(torch.float8_e4m3fn) == (0.125, 0.0625)
        assert tolerance_for(torch.float8_e4m3fn) == (0.125, 0.0625)
    finally:
        del TOLERANCES["float8_e4m3fn"]


def test_a_float8_output_without_tolerances_names_the_table_rows():
    with pytest.raises(ValueError) as info:
        tolerance_for(torch.float8_e4m3fn)
    assert str(info.value) == (
        "no default tolerance for outputs of dtype torch.float8_e4m3fn: pass rtol= and atol= to "
        "assert_matches_reference (TOLERANCES covers bfloat16, float16, float32, float64)"
    )


@pytest.mark.parametrize(
    "given, missing",
    [({}, "rtol and atol"), ({"rtol": 0.1}, "atol"), ({"atol": 0.1}, "rtol")],
)
def test_a_float8_comparison_names_exactly_the_tolerances_still_missing(given, missing):
    out = torch.ones(2, dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError) as info:
        _result(out, out, **given)
    assert str(info.value) == f"no default tolerance for outputs of dtype torch.float8_e4m3fn: pass {missing} explicitly"


@pytest.mark.parametrize(
    "given, rtol, atol, source",
    [
        ({}, 1.6e-2, 1e-2, "TOLERANCES[torch.bfloat16]"),
        ({"atol": 0.5}, 1.6e-2, 0.5, "explicit atol, rtol from TOLERANCES[torch.bfloat16]"),
        ({"rtol": 0.5}, 0.5, 1e-2, "explicit rtol, atol from TOLERANCES[torch.bfloat16]"),
    ],
)
def test_a_tolerance_not_given_comes_from_the_bfloat16_row(given, rtol, atol, source):
    out = torch.ones(3, dtype=torch.bfloat16)
    (comparison,) = _result(out, out.double(), **given).outputs
    assert (comparison.rtol, comparison.atol, comparison.tolerance_source) == (rtol, atol, source)


@pytest.mark.parametrize(
    "fused, ref, source",
    [
        (torch.tensor([True, False]), torch.tensor([True, True]), "exact comparison for bool outputs"),
        (torch.tensor([1, 2]), torch.tensor([1, 3]), "exact comparison for integer outputs"),
    ],
    ids=["bool", "integer"],
)
def test_bool_and_integer_outputs_say_they_are_compared_exactly(fused, ref, source):
    error = _mismatch(fused, ref)
    assert _line(error, "tolerances:") == f"tolerances:          rtol=0, atol=0 ({source})"


def test_a_bool_output_against_an_integer_reference_is_a_dtype_kind_mismatch():
    error = _mismatch(torch.tensor([True]), torch.tensor([1]))
    assert error.problems == [
        "out: dtype mismatch: fused is torch.bool (bool), the reference returned torch.int64 (integer)"
    ]


def test_a_complex_output_against_a_real_reference_is_a_dtype_kind_mismatch():
    error = _mismatch(torch.ones(2, dtype=torch.complex64), torch.ones(2, dtype=torch.float64))
    assert error.problems == [
        "out: dtype mismatch: fused is torch.complex64 (complex), "
        "the reference returned torch.float64 (floating point)"
    ]


def test_an_error_exactly_at_the_allowed_difference_passes():
    result = _result(torch.tensor([1.5], dtype=torch.float64), torch.tensor([1.0], dtype=torch.float64),
                     rtol=0.0, atol=0.5)
    assert result.max_abs_error == 0.5


def test_nan_in_both_outputs_passes_even_with_zero_tolerances():
    nan = float("nan")
    out = torch.tensor([nan, 1.0])
    assert _result(out, torch.tensor([nan, 1.0], dtype=torch.float64), rtol=0.0, atol=0.0).max_abs_error == 0.0


def test_integers_beyond_float64_precision_that_differ_by_one_fail_with_an_error_of_one():
    big = 2**53
    error = _mismatch(torch.tensor([big + 1]), torch.tensor([big]))
    (comparison,) = error.comparisons
    assert comparison.mismatches == 1 and comparison.max_abs_error == 1.0


def test_complex_outputs_that_differ_only_in_the_imaginary_part_fail():
    fused = torch.tensor([1 + 2j], dtype=torch.complex128)
    error = _mismatch(fused, torch.tensor([1 + 3j], dtype=torch.complex128))
    assert error.comparisons[0].max_abs_error == 1.0


# --- figures --------------------------------------------------------------------------


def test_the_relative_error_counts_references_below_one():
    result = _result(torch.tensor([0.6], dtype=torch.float64), torch.tensor([0.5], dtype=torch.float64), atol=1.0, rtol=0.0)
    assert result.max_rel_error == pytest.approx(0.2)


def test_an_all_zero_reference_gives_zero_relative_errors_when_matched_and_infinite_ones_when_not():
    zeros = torch.zeros(3, dtype=torch.float64)
    matched = _result(zeros.clone(), zeros)
    assert (matched.max_rel_error, matched.rel_l2_error) == (0.0, 0.0)
    off = _result(torch.tensor([1e-9, 0.0, 0.0], dtype=torch.float64), zeros, rtol=0.0, atol=1e-6)
    assert off.max_rel_error == math.inf and off.rel_l2_error == math.inf


def test_an_empty_output_matches_with_zero_errors_and_describes_itself():
    empty = torch.empty(0, 4)
    result = _result(empty, empty.double())
    assert (result.max_abs_error, result.max_rel_error, result.rel_l2_error) == (0.0, 0.0, 0.0)
    assert "  mismatched elements: 0 of 0 (0%)" in str(result)


def test_the_result_of_several_outputs_describes_each_on_its_own_lines():
    a, b = torch.ones(2), torch.ones(3)
    text = str(_result((a, b), (a.double(), b.double())))
    assert text.startswith("out[0]: shape (2,), dtype torch.float32 (reference: torch.float64)\n")
    assert "\nout[1]: shape (3,), dtype torch.float32 (reference: torch.float64)\n" in text


def test_the_share_of_mismatched_elements_is_a_percentage():
    error = _mismatch(torch.tensor([1.0, 2.0, 3.0, 5.0]), torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64))
    assert _line(error, "mismatched elements:") == "mismatched elements: 1 of 4 (25%)"


def test_nonfinite_mismatches_do_not_count_nan_that_the_reference_shares():
    nan = float("nan")
    error = _mismatch(torch.tensor([nan, nan, 1.0]), torch.tensor([nan, 1.0, 1.0], dtype=torch.float64))
    (comparison,) = error.comparisons
    assert comparison.nonfinite_mismatches == 1 and comparison.nan_where_reference_has_none == 1


# --- the worst element ------------------------------------------------------------------


def test_the_worst_element_of_a_float32_output_shows_the_reference_rounded_to_float32():
    error = _mismatch(torch.tensor([0.0, 1.5]), torch.tensor([0.0, 0.1], dtype=torch.float64))
    assert _line(error, "worst element:") == (
        "worst element:       out[1]: fused 1.5, reference 0.1 (as float32: 0.1), allowed |diff| 1.1e-05"
    )
    (comparison,) = error.comparisons
    assert comparison.reference_dtype == "float64"
    assert comparison.worst_reference_as_fused_dtype == pytest.approx(0.1, rel=1e-7)
    assert comparison.worst_allowed == pytest.approx(1.1e-5)


def test_the_worst_element_of_a_bfloat16_output_shows_the_reference_rounded_to_bfloat16():
    error = _mismatch(torch.tensor([1.5], dtype=torch.bfloat16), torch.tensor([0.1], dtype=torch.float64))
    rounded = torch.tensor(0.1, dtype=torch.float64).to(torch.bfloat16).item()
    assert rounded != 0.1
    assert error.comparisons[0].worst_reference_as_fused_dtype == rounded
    assert f"reference 0.1 (as bfloat16: {rounded:.8g})" in _line(error, "worst element:")


def test_a_reference_that_returns_float32_is_described_as_float32():
    error = _mismatch(torch.tensor([2.0]), torch.tensor([1.0]))
    assert error.comparisons[0].reference_dtype == "float32"
    assert str(error).splitlines()[1] == "out: shape (1,), dtype torch.float32 (reference: torch.float32)"


def test_the_worst_element_of_a_float64_output_has_no_rounded_reference():
    error = _mismatch(torch.tensor([2.0], dtype=torch.float64), torch.tensor([1.0], dtype=torch.float64))
    assert _line(error, "worst element:") == "worst element:       out[0]: fused 2, reference 1, allowed |diff| 2e-07"


def test_the_worst_element_of_a_complex64_output_shows_the_reference_rounded_to_complex64():
    error = _mismatch(torch.tensor([1 + 1j], dtype=torch.complex64), torch.tensor([1 + 2j], dtype=torch.complex128))
    assert "reference 1+2j (as complex64: 1+2j)" in _line(error, "worst element:")


def test_the_worst_element_of_an_int32_output_against_int64_has_no_rounded_reference():
    error = _mismatch(torch.tensor([5], dtype=torch.int32), torch.tensor([6]))
    assert _line(error, "worst element:") == "worst element:       out[0]: fused 5, reference 6, allowed |diff| 0"


def test_the_worst_element_of_a_bool_output_shows_true_and_false():
    error = _mismatch(torch.tensor([True]), torch.tensor([False]))
    assert _line(error, "worst element:").startswith("worst element:       out[0]: fused True, reference False")


def test_the_worst_element_of_a_0d_output_says_so():
    error = _mismatch(torch.tensor(2.0, dtype=torch.float64), torch.tensor(1.0, dtype=torch.float64))
    assert _line(error, "worst element:").startswith("worst element:       out (0-d): fused 2, reference 1")


def test_the_worst_element_of_a_3d_output_has_its_full_index():
    ref = torch.zeros(2, 3, 4, dtype=torch.float64)
    fused = ref.clone()
    fused[1, 2, 3] = 1.0
    assert _mismatch(fused, ref).comparisons[0].worst_index == (1, 2, 3)


def test_the_worst_element_is_the_furthest_over_its_allowance_with_both_tolerances():
    # Element 0: error 0.1 on 1000 (10x its allowance); element 1: 1e-4 on 1e-3 (about 900x).
    ref = torch.tensor([1000.0, 0.001], dtype=torch.float64)
    error = _mismatch(ref + torch.tensor([0.1, 1e-4], dtype=torch.float64), ref, rtol=1e-5, atol=1e-7)
    assert error.comparisons[0].worst_index == (1,)


def test_the_worst_element_is_the_furthest_over_its_allowance_with_rtol_alone():
    ref = torch.tensor([1000.0, 0.001], dtype=torch.float64)
    error = _mismatch(ref + torch.tensor([0.1, 1e-6], dtype=torch.float64), ref, rtol=1e-5, atol=0.0)
    assert error.comparisons[0].worst_index == (1,)


def test_with_zero_tolerances_the_worst_element_is_the_largest_error_among_the_mismatches():
    ref = torch.zeros(4, dtype=torch.float64)
    fused = torch.tensor([0.0, 0.25, 0.5, 0.0], dtype=torch.float64)
    assert _mismatch(fused, ref, rtol=0.0, atol=0.0).comparisons[0].worst_index == (2,)


def test_a_finite_mismatch_is_the_worst_element_when_the_only_nan_is_shared():
    nan = float("nan")
    error = _mismatch(torch.tensor([nan, 1.0, 5.0]), torch.tensor([nan, 1.0, 1.0], dtype=torch.float64))
    assert error.comparisons[0].worst_index == (2,)


def test_a_nan_where_the_reference_has_a_number_is_the_worst_element_before_any_finite_error():
    nan = float("nan")
    error = _mismatch(torch.tensor([9.0, nan]), torch.tensor([1.0, 1.0], dtype=torch.float64))
    assert error.comparisons[0].worst_index == (1,)
    assert _line(error, "worst element:") == "worst element:       out[1]: fused nan, reference 1 (as float32: 1)"


# --- structure --------------------------------------------------------------------------


def test_the_mismatch_error_carries_each_problem_and_each_comparison():
    error = _mismatch((torch.ones(2), torch.ones(2)), (torch.ones(2, dtype=torch.float64), torch.zeros(2, dtype=torch.float64)))
    assert len(error.problems) == 1 and error.problems[0].startswith("out[1]: shape (2,)")
    assert [c.path for c in error.comparisons] == ["out[0]", "out[1]"]


def test_a_dict_output_against_a_tensor_reference_names_the_keys():
    error = _mismatch({"b": 1, "a": 2}, torch.ones(2))
    assert error.problems == [
        "out: structure mismatch: fused returned a dict with keys [\"'a'\", \"'b'\"], "
        "the reference returned a tensor of shape (2,)"
    ]


def test_a_tensor_output_against_a_string_reference_names_both():
    error = _mismatch(torch.ones(2), "done")
    assert error.problems == [
        "out: structure mismatch: fused returned a tensor of shape (2,), the reference returned str 'done'"
    ]


def test_a_dict_output_against_a_list_reference_is_a_structure_mismatch():
    error = _mismatch({"a": torch.ones(1)}, [torch.ones(1)])
    assert error.problems == [
        "out: structure mismatch: fused returned a dict with keys [\"'a'\"], the reference returned a list of length 1"
    ]


def test_dict_outputs_name_every_key_only_one_side_has():
    t = torch.ones(1)
    error = _mismatch({"a": t, "x": t, "y": t}, {"a": t.double(), "b": t.double(), "c": t.double()})
    assert error.problems == [
        "out: structure mismatch: keys only in the reference: 'b', 'c'; keys only in the fused output: 'x', 'y'"
    ]


def test_explicit_tolerances_apply_inside_dict_outputs():
    result = _result({"y": torch.tensor([1.25])}, {"y": torch.tensor([1.0], dtype=torch.float64)}, rtol=0.0, atol=0.5)
    assert result.outputs[0].path == "out['y']" and (result.outputs[0].rtol, result.outputs[0].atol) == (0.0, 0.5)


def test_explicit_tolerances_apply_inside_tuple_outputs():
    result = _result((torch.tensor([1.25]),), (torch.tensor([1.0], dtype=torch.float64),), rtol=0.0, atol=0.5)
    assert (result.outputs[0].path, result.outputs[0].rtol, result.outputs[0].atol) == ("out[0]", 0.0, 0.5)


def test_explicit_tolerances_apply_to_python_number_outputs():
    (comparison,) = _result(1.25, 1.0, rtol=0.0, atol=0.5).outputs
    assert (comparison.path, comparison.rtol, comparison.atol) == ("out", 0.0, 0.5)


def test_a_python_number_against_a_string_names_both():
    assert _mismatch(3, "x").problems == ["out: structure mismatch: fused returned int 3, the reference returned str 'x'"]


@pytest.mark.parametrize("fused, ref", [(None, "x"), ("x", None)], ids=["fused None", "reference None"])
def test_none_on_one_side_only_is_a_structure_mismatch(fused, ref):
    assert _mismatch(fused, ref).problems[0].startswith("out: structure mismatch: fused returned")


@pytest.mark.gpu
def test_a_reference_computed_on_the_cpu_is_compared_with_a_cuda_output():
    fused = torch.tensor([1.0, 2.0], device="cuda")
    (comparison,) = _result(fused, torch.tensor([1.0, 2.0], dtype=torch.float64)).outputs
    assert comparison.ok
    error = _mismatch(fused, torch.tensor([1.0, 3.0], dtype=torch.float64))
    assert error.comparisons[0].worst_index == (1,)


def test_a_tensor_output_against_a_python_float_reference_is_compared_by_value():
    assert _result(torch.tensor(0.5, dtype=torch.float64), 0.5).max_abs_error == 0.0


@pytest.mark.parametrize("value", [True, 3, 1 + 2j], ids=["bool", "int", "complex"])
def test_python_scalar_outputs_that_agree_pass(value):
    (comparison,) = _result(value, value).outputs
    assert comparison.mismatches == 0


def test_python_complex_outputs_are_compared_in_complex128():
    (comparison,) = _result(1 + 2j, 1 + 2j).outputs
    assert comparison.dtype == "complex128" and comparison.rtol == 1e-7


def test_python_int_outputs_that_differ_fail():
    assert _mismatch(3, 4).comparisons[0].max_abs_error == 1.0


@pytest.mark.parametrize("value", ["relu", None, frozenset({1})], ids=["str", "None", "frozenset"])
def test_equal_plain_leaves_pass(value):
    assert _result([torch.ones(1), value], [torch.ones(1, dtype=torch.float64), value]).outputs[0].ok


@pytest.mark.parametrize(
    "fused, ref", [("relu", "gelu"), (frozenset({1}), {1})], ids=["different strings", "equal values of different types"]
)
def test_unequal_or_differently_typed_plain_leaves_fail(fused, ref):
    error = _mismatch(fused, ref)
    assert error.problems[0].startswith("out: structure mismatch: fused returned")


def test_a_leaf_whose_comparison_raises_counts_as_a_mismatch():
    class Opaque:
        def __eq__(self, other):
            raise RuntimeError("ambiguous")

    leaf = Opaque()
    assert _mismatch(leaf, leaf).problems[0].startswith("out: structure mismatch: fused returned Opaque")


# --- float64 copies of the inputs -------------------------------------------------------


def test_an_ordered_dict_argument_reaches_the_reference_as_an_ordered_dict_of_float64():
    seen = []

    def reference(d):
        seen.append(d)
        return d["x"]

    arg = collections.OrderedDict(x=torch.ones(2))
    assert_matches_reference(lambda d: d["x"], reference, arg)
    assert type(seen[0]) is collections.OrderedDict and seen[0]["x"].dtype == torch.float64
    assert arg["x"].dtype == torch.float32


def test_a_list_subclass_argument_reaches_the_reference_as_that_subclass_of_float64():
    class Batch(list):
        pass

    seen = []

    def reference(batch):
        seen.append(batch)
        return batch[0]

    assert_matches_reference(lambda batch: batch[0], reference, Batch([torch.ones(2)]))
    assert type(seen[0]) is Batch and seen[0][0].dtype == torch.float64


def test_containers_that_cannot_be_refilled_reach_the_reference_as_plain_ones_of_float64():
    class Pair(tuple):
        pass

    class Frozen(dict):
        def clear(self):
            raise TypeError("frozen")

    class Fixed(list):
        def __setitem__(self, index, value):
            raise TypeError("fixed length")

    seen = []

    def reference(pair, frozen, fixed):
        seen.append((pair, frozen, fixed))
        return pair[0] + frozen["x"] + fixed[0]

    args = Pair([torch.ones(2)]), Frozen(x=torch.ones(2)), Fixed([torch.ones(2)])
    assert_matches_reference(lambda p, f, l: p[0] + f["x"] + l[0], reference, *args)
    pair, frozen, fixed = seen[0]
    assert type(pair) is tuple and pair[0].dtype == torch.float64
    assert type(frozen) is dict and frozen["x"].dtype == torch.float64
    assert type(fixed) is list and fixed[0].dtype == torch.float64


def test_a_namedtuple_argument_reaches_the_reference_as_that_namedtuple_of_float64():
    Pair = collections.namedtuple("Pair", "x y")

    def reference(pair):
        assert isinstance(pair, Pair) and pair.x.dtype == torch.float64
        return pair.x + pair.y

    assert_matches_reference(lambda pair: pair.x + pair.y, reference, Pair(torch.ones(2), torch.ones(2)))


def test_a_complex64_argument_reaches_the_reference_as_complex128():
    seen = []

    def reference(z):
        seen.append(z.dtype)
        return z

    assert_matches_reference(lambda z: z, reference, torch.ones(2, dtype=torch.complex64))
    assert seen == [torch.complex128]


def test_a_module_argument_that_cannot_be_deep_copied_is_named_with_the_way_out():
    import threading

    class Locked(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lock = threading.Lock()

        def forward(self, x):
            return x

    with pytest.raises(TypeError) as info:
        assert_matches_reference(lambda m, x: x, lambda m, x: x, Locked(), torch.ones(1))
    message = str(info.value)
    assert message.startswith("assert_matches_reference: cannot deep-copy the Locked argument to run the reference in float64 (")
    assert message.endswith("); pass a float64 module built for the reference inside reference_fn instead")


@pytest.mark.parametrize("name, value", [("rtol", True), ("atol", -1), ("atol", float("inf"))])
def test_a_bad_tolerance_is_named_with_its_value(name, value):
    with pytest.raises(ValueError) as info:
        assert_matches_reference(lambda: torch.ones(1), lambda: torch.ones(1), **{name: value})
    assert str(info.value) == f"assert_matches_reference: {name} must be a finite number >= 0, got {value!r}"


def test_an_error_in_the_reference_carries_a_note_saying_it_ran_on_float64_copies():
    def reference(x):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError) as info:
        assert_matches_reference(lambda x: x, reference, torch.ones(1))
    assert info.value.__notes__ == [
        "(raised by reference_fn, which assert_matches_reference runs on float64 copies of the inputs)"
    ]


def test_the_failure_message_is_a_header_then_one_block_per_failing_output():
    ones, zeros = torch.ones(2, dtype=torch.float64), torch.zeros(2, dtype=torch.float64)
    one = _mismatch(ones, zeros)
    assert str(one) == "assert_matches_reference: the fused output does not match the reference\n" + one.problems[0]
    two = _mismatch((ones, ones), (zeros, zeros))
    assert str(two) == "\n".join(["assert_matches_reference: 2 outputs do not match the reference", *two.problems])


def test_a_failing_comparison_in_a_test_hides_the_plugins_own_frames(pytester):
    pytester.makepyfile(
        """
        import torch
        from pytest_fusioncheck import assert_matches_reference

        def test_wrong():
            assert_matches_reference(lambda: torch.ones(2), lambda: torch.zeros(2))
        """
    )
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*NumericsMismatch: assert_matches_reference: the fused output does not match*"])
    assert "numerics.py" not in result.stdout.str()
