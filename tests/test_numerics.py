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
