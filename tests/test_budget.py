"""Budgets and byte sizes: behaviour that mutation testing (docs/mutation.md) found no test pinning.

Each test states what a user would see go wrong: a byte count in a marker read wrongly,
a size printed wrongly, a budget that counts a tensor twice or not at all.
"""

import functools

import pytest
import torch

from pytest_fusioncheck.budget import Budget, callable_modules, default_budget, distinct_bytes, format_bytes, parse_bytes

KiB, MiB, GiB, TiB = 2**10, 2**20, 2**30, 2**40


# --- parse_bytes: what max_hbm_bytes("...") accepts -------------------------------------


@pytest.mark.parametrize(
    "text, value",
    [
        ("3 B", 3), ("3 kB", 3 * 10**3), ("3 MB", 3 * 10**6), ("3 GB", 3 * 10**9), ("3 TB", 3 * 10**12),
        ("3 KiB", 3 * KiB), ("3 MiB", 3 * MiB), ("3 GiB", 3 * GiB), ("3 TiB", 3 * TiB),
        ("128 MIB", 128 * MiB), ("  64kb  ", 64_000), (".5 KiB", 512), ("1E3", 1000), ("1e+3 B", 1000),
        ("1e-3 GB", 1_000_000),
    ],
)
def test_every_unit_reads_as_its_power_of_1000_or_1024_in_any_case_and_spacing(text, value):
    assert parse_bytes(text) == value


def test_zero_bytes_and_whole_floats_are_byte_counts():
    assert parse_bytes(0) == 0
    assert parse_bytes(0.0) == 0
    assert parse_bytes(1536.0) == 1536


@pytest.mark.parametrize(
    "value, message",
    [
        (True, "expected a byte count, got the boolean True"),
        (-3, "a byte count cannot be negative, got -3"),
        (-1.0, "a byte count must be a non-negative number, got -1.0"),
        (float("nan"), "a byte count must be a non-negative number, got nan"),
        (None, "expected a byte count (int or string such as '128 MiB'), got NoneType"),
        ([1024], "expected a byte count (int or string such as '128 MiB'), got list"),
        ("12 parsecs", "cannot read '12 parsecs' as a byte count: use an int or a number with one of the units "
                       "B, kB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024), e.g. \"128 MiB\""),
    ],
)
def test_a_value_that_is_not_a_byte_count_is_refused_with_the_reason(value, message):
    with pytest.raises(ValueError) as info:
        parse_bytes(value)
    assert str(info.value) == message


# --- format_bytes: sizes in every table and message -------------------------------------


@pytest.mark.parametrize(
    "n, text",
    [
        (None, "-"), (0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (1536, "1.5 KiB"), (MiB - 1, "1024.0 KiB"),
        (3 * MiB, "3.0 MiB"), (GiB, "1.0 GiB"), (TiB, "1.0 TiB"), (1024 * TiB, "1024.0 TiB"), (-2048, "-2.0 KiB"),
    ],
)
def test_sizes_print_in_the_largest_binary_unit_below_1024(n, text):
    assert format_bytes(n) == text


# --- distinct_bytes: each storage region once -------------------------------------------


def test_an_empty_tensor_moves_no_bytes():
    assert distinct_bytes([torch.empty(0), torch.empty(0, 8)]) == 0
    assert distinct_bytes([torch.empty(0), torch.ones(4)]) == 16


def test_a_slice_counts_its_own_bytes_from_its_offset():
    base = torch.zeros(100)
    assert distinct_bytes([base[10:20]]) == 40
    assert distinct_bytes([base[90:]]) == 40


def test_overlapping_and_touching_slices_count_their_union():
    base = torch.zeros(100)
    assert distinct_bytes([base[40:100], base[0:60]]) == 400
    assert distinct_bytes([base[0:10], base[10:30]]) == 120
    assert distinct_bytes([base[0:10], base[20:30]]) == 80
    assert distinct_bytes([base[0:10], base[20:30], base[25:40]]) == 40 + 80
    assert distinct_bytes([base[0:10], base[20:30], base[40:50]]) == 3 * 40


def test_a_slice_passed_twice_beside_another_counts_each_slice_once():
    base = torch.zeros(100)
    assert distinct_bytes([base[10:20], base[10:20], base[30:40]]) == 80


def test_an_empty_view_adds_nothing_to_its_storages_bytes():
    base = torch.zeros(10)
    assert distinct_bytes([base[::2], base[:0]]) == 20


def test_interleaved_strided_views_count_every_element_once():
    base = torch.zeros(10)
    assert distinct_bytes([base[::2]]) == 20
    assert distinct_bytes([base[::2], base[1::2]]) == 40


def test_a_transposed_tensor_counts_all_its_bytes():
    assert distinct_bytes([torch.zeros(4, 8).t()]) == 128


def test_the_element_size_of_each_dtype_counts():
    assert distinct_bytes([torch.zeros(8, dtype=torch.float16), torch.zeros(8, dtype=torch.float64)]) == 16 + 64


def _parts_bytes(*parts):
    return sum(p.numel() * p.element_size() for p in parts)


def test_a_sparse_coo_tensor_counts_its_indices_and_values():
    t = torch.sparse_coo_tensor(torch.tensor([[0, 1, 2], [2, 0, 1]]), torch.ones(3), (3, 3))
    assert distinct_bytes([t]) == _parts_bytes(t._indices(), t._values()) == 3 * 2 * 8 + 3 * 4


@pytest.mark.parametrize(
    "convert, parts",
    [
        (lambda d: d.to_sparse_csr(), ("crow_indices", "col_indices", "values")),
        (lambda d: d.to_sparse_csc(), ("ccol_indices", "row_indices", "values")),
        (lambda d: d.to_sparse_bsr((2, 2)), ("crow_indices", "col_indices", "values")),
        (lambda d: d.to_sparse_bsc((2, 2)), ("ccol_indices", "row_indices", "values")),
    ],
    ids=["csr", "csc", "bsr", "bsc"],
)
def test_compressed_sparse_tensors_count_their_index_and_value_tensors(convert, parts):
    dense = torch.zeros(4, 4)
    dense[0, 1] = dense[3, 2] = 1.0
    t = convert(dense)
    expected = _parts_bytes(*(getattr(t, name)() for name in parts))
    assert expected > 0
    assert distinct_bytes([t]) == expected


# --- Budget -------------------------------------------------------------------------------


def test_budget_from_tensors_finds_tensors_in_every_container_and_module():
    a, b, c, d, e = (torch.zeros(n) for n in (1, 2, 3, 4, 5))
    norm = torch.nn.BatchNorm1d(6)  # 2 parameters and 3 buffers
    module_bytes = sum(_parts_bytes(t) for t in (*norm.parameters(), *norm.buffers()))
    budget = Budget.from_tensors(
        reads=[{"a": a, "nested": [b, (c,)]}, {d}, frozenset({e}), "not a tensor", 7, norm],
        writes=(a,),
        label="mixed",
    )
    assert budget.read_bytes == (1 + 2 + 3 + 4 + 5) * 4 + module_bytes
    assert budget.write_bytes == 4
    assert budget.label == "mixed"
    assert Budget.from_tensors(reads=[a]).label == ""


@pytest.mark.parametrize("field", ["read_bytes", "write_bytes"])
@pytest.mark.parametrize("bad", [-1, True, 1.0, "8"])
def test_a_budget_refuses_anything_but_a_non_negative_int_naming_the_field(field, bad):
    with pytest.raises(ValueError) as info:
        Budget(**{field: bad})
    assert str(info.value) == f"Budget.{field} must be a non-negative int, got {bad!r}"


def test_a_zero_budget_is_allowed():
    assert Budget(read_bytes=0, write_bytes=0).total == 0


def test_adding_budgets_adds_each_figure_and_joins_the_labels_that_exist():
    a = Budget(read_bytes=10, write_bytes=5, label="attention")
    b = Budget(read_bytes=1, write_bytes=2, label="mlp")
    unlabelled = Budget(read_bytes=100, write_bytes=200)
    assert a + b == Budget(11, 7, "attention + mlp")
    assert (a + unlabelled).label == "attention"
    assert (unlabelled + b).label == "mlp"
    assert (unlabelled + unlabelled).label == ""
    with pytest.raises(TypeError):
        a + 1


def test_a_budget_prints_its_label_total_reads_and_writes():
    assert str(Budget(read_bytes=2 * KiB, write_bytes=KiB, label="softmax")) == "softmax: 3.0 KiB (read 2.0 KiB, write 1.0 KiB)"
    assert str(Budget(read_bytes=10, write_bytes=5)) == "15 B (read 10 B, write 5 B)"


def test_a_budget_as_json_holds_every_figure_and_the_label():
    assert Budget(read_bytes=10, write_bytes=5, label="x").to_dict() == {
        "read_bytes": 10, "write_bytes": 5, "total": 15, "label": "x",
    }


# --- the default budget: which modules a callable is or wraps -----------------------------


def test_callable_modules_finds_the_module_behind_each_kind_of_wrapper():
    module = torch.nn.Linear(2, 2)
    assert callable_modules(module) == [module]
    assert callable_modules(module.forward) == [module]
    assert callable_modules(functools.partial(torch.add, other=module)) == [module]
    assert callable_modules(functools.partial(functools.partial(lambda m, x: m(x), module))) == [module]

    @functools.wraps(module.forward)
    def decorated(x):
        return module(x)

    assert callable_modules(decorated) == [module]


def test_callable_modules_finds_every_module_of_nested_partials():
    first, second, third = torch.nn.Linear(1, 1), torch.nn.Linear(1, 1), torch.nn.Linear(1, 1)
    inner = functools.partial(lambda m, x: m(x), third)
    found = callable_modules(functools.partial(lambda *a: None, first, second, inner))
    assert sorted(map(id, found)) == sorted(map(id, (first, second, third)))


def test_a_compiled_function_leads_to_the_module_whose_method_it_compiles():
    module = torch.nn.Linear(2, 2)
    assert callable_modules(torch.compile(module.forward)) == [module]


def test_callable_modules_lists_a_module_once_and_skips_none_classes_and_cycles():
    module, other = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    found = callable_modules(functools.partial(lambda *a: None, module, other, None, module))
    assert sorted(map(id, found)) == sorted(map(id, (module, other)))

    def loop():
        pass

    loop.__wrapped__ = loop
    assert callable_modules(loop) == []

    def of_a_class():
        pass

    of_a_class.__wrapped__ = torch.nn.Linear  # a class, not a module instance
    assert callable_modules(of_a_class) == []


def test_the_default_budget_says_whether_it_holds_module_weights():
    module = torch.nn.Linear(4, 2)  # 8 + 2 parameters
    x = torch.zeros(3, 4)
    out = torch.zeros(3, 2)
    with_weights = default_budget((x,), {}, out, fn=module)
    assert with_weights.label == "default: args and module weights read once, outputs written once"
    assert (with_weights.read_bytes, with_weights.write_bytes) == ((12 + 10) * 4, 6 * 4)
    plain = default_budget((x,), {"bias": torch.zeros(2)}, out)
    assert plain.label == "default: args read once, outputs written once"
    assert (plain.read_bytes, plain.write_bytes) == ((12 + 2) * 4, 6 * 4)


def test_two_tensors_made_from_one_numpy_array_are_counted_once():
    numpy = pytest.importorskip("numpy")
    array = numpy.zeros(8, dtype=numpy.float32)
    assert distinct_bytes([torch.from_numpy(array), torch.from_numpy(array)]) == 32


def test_meta_tensors_without_memory_are_each_counted_by_their_shape():
    shapes_only = [torch.empty(4, device="meta"), torch.empty(4, device="meta")]
    assert Budget.from_tensors(reads=shapes_only).read_bytes == 32
