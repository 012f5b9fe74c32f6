"""Numerics: behaviour that mutation testing (docs/mutation.md) found no test pinning.

Each test states what a kernel engineer calling ``assert_matches_reference`` would see
go wrong: a verdict, a figure or a line of the failure message.
"""

import collections
import math

import pytest
import torch

from pytest_fusioncheck.numerics import TOLERANCES, NumericsMismatch, assert_matches_reference, tolerance_for


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
