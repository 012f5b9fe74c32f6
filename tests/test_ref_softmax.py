"""reference_kernels.softmax: the fused kernel against the five-op reference, on every path.

Without a GPU the kernel runs under Triton's interpreter (tests/conftest.py), so shapes are
small; ``max_row`` shrinks the on-chip row limit so that short rows take the wide-row
plans. The split plan with programs waiting on each other cannot run under the
interpreter: its tests carry the ``gpu`` marker.

Plans are checked as properties of the device they are made for (``_device.DESCRIPTIONS``) and of the choices they
are made with: the defaults, and the tuned ones of ``reference_kernels/tuned/90.json``, whose bands the plans must
follow. Under the interpreter ``softmax.fused`` plans with the defaults; the tests of a tuned path (one reduction,
the staged plan, narrow rows on aligned vectors, more rows a program) run it through the ``tuned_sm90`` fixture.
"""

from __future__ import annotations

import dataclasses
import inspect
import re

import pytest
import torch
import triton
import triton.language as tl

from reference_kernels import _device, _softmax_held, _split_walk, softmax
from reference_kernels._common import ELEMS_PER_THREAD, THREAD_MAX_REGS, next_power_of_2
from reference_kernels._ragged import Phased, edge_words, in_row, phased, ragged_width, row_origin
from reference_kernels._split_walk import split_group

# The interpreter computes masked-off lanes with numpy, which warns about their nan.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# The GPUs plans are made for in these tests (datasheet figures), and the choices: the defaults that run anywhere,
# and those measured on sm_90 (tuned/90.json), whatever this Triton is.
DEVICES = list(_device.DESCRIPTIONS.values())
H200 = _device.DESCRIPTIONS["H200"]
SM90 = [d for d in DEVICES if d.arch // 10 == 9]  # the GPUs the held plans are made for
DEFAULT = softmax.DEFAULT_TUNING
TUNED = _device.tuned("softmax", 90, softmax.DEFAULT_TUNING)
TUNINGS = {"default": DEFAULT, "sm_90 tuned": TUNED}
# Fused output against the five ops run in float32 and rounded to the dtype; atol is a
# fraction of each row's largest value (assert_close_to_row_scale).
TOLERANCES = {
    torch.float32: dict(atol=1e-6, rtol=1e-5),
    torch.float16: dict(atol=1e-3, rtol=1e-3),
    torch.bfloat16: dict(atol=4e-3, rtol=1.6e-2),
}

SHAPES = [
    ((1, 1), None),  # a single one-wide row
    ((37, 1), None),  # one-wide rows, many per program, ragged last program
    ((5, 7), None),  # rows plan, width not a power of two
    ((3, 64), None),  # rows plan, power-of-two width
    ((2, 3, 33), None),  # leading dims flattened
    ((4, 100), 32),  # wide-row plan, last step ragged
    ((3, 128), 32),  # wide-row plan, steps fill the row exactly
    ((2, 1000), 16),  # wide-row plan, 63 steps a row
]


def reference(x: torch.Tensor) -> torch.Tensor:
    return softmax.unfused(x.float()).to(x.dtype)


def poisoned_like(x: torch.Tensor) -> torch.Tensor:
    return torch.full(x.shape, float("nan"), dtype=x.dtype, device=x.device)


def assert_close_to_row_scale(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, equal_nan: bool = False) -> None:
    """``assert_close`` with the absolute tolerance a fraction of each row's largest |expected|.

    A softmax row n wide holds values near 1/n: against a fixed bf16 atol of 4e-3 an
    all-zero output passes at n = 65536. Scaled by its row's peak, atol only absorbs the
    rounding of values far below that peak, and a zero or unwritten row fails.
    """
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    expected = expected.double()
    scale = expected.abs().nan_to_num(0.0).amax(dim=-1, keepdim=True).clamp_min(torch.finfo(torch.float64).tiny)
    torch.testing.assert_close(actual.double() / scale, expected / scale, equal_nan=equal_nan, **TOLERANCES[dtype])


@pytest.fixture
def launches(monkeypatch):
    """The keyword arguments (the kernel's constexprs) of each launch the softmax makes, the launches still made."""
    seen = []
    launch, run = softmax.launch_kernel, softmax.split_run
    monkeypatch.setattr(softmax, "launch_kernel", lambda *args, **kwargs: seen.append(kwargs) or launch(*args, **kwargs))
    monkeypatch.setattr(softmax, "split_run", lambda *args, **kwargs: seen.append(kwargs) or run(*args, **kwargs))
    return seen


def test_the_row_scaled_tolerance_fails_a_wide_all_zero_output_that_a_fixed_atol_passes():
    expected = torch.softmax(torch.randn(4, 65536, generator=torch.Generator().manual_seed(0)), dim=-1).bfloat16()
    zeros = torch.zeros_like(expected)
    torch.testing.assert_close(zeros, expected, **TOLERANCES[torch.bfloat16])  # the fixed atol: vacuous here
    with pytest.raises(AssertionError, match="Tensor-likes are not close"):
        assert_close_to_row_scale(zeros, expected, torch.bfloat16)
    one_row_unwritten = expected.clone()
    one_row_unwritten[2] = 0
    with pytest.raises(AssertionError, match="Tensor-likes are not close"):
        assert_close_to_row_scale(one_row_unwritten, expected, torch.bfloat16)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape, max_row", SHAPES, ids=str)
def test_fused_matches_the_five_op_reference_and_writes_every_element(shape, max_row, dtype):
    x = torch.randn(shape, device=DEVICE).mul_(4).to(dtype)
    out = poisoned_like(x)
    y = softmax.fused(x, out=out, max_row=max_row)
    assert y is out
    assert not y.isnan().any(), "an output element was left unwritten"
    assert_close_to_row_scale(y, reference(x), dtype)


@pytest.mark.parametrize("shape, max_row", [((37, 1), None), ((5, 7), None), ((4, 100), 32)], ids=str)
def test_the_output_fused_allocates_itself_has_every_element_written(shape, max_row, unwritten_reads_nan):
    x = torch.randn(shape, device=DEVICE)
    y = softmax.fused(x, max_row=max_row)
    assert not y.isnan().any(), "an output element was left unwritten"
    assert_close_to_row_scale(y, reference(x), torch.float32)


@pytest.mark.parametrize(
    "make",
    [
        lambda b: b[:, ::2],  # column stride 2: copied to contiguous
        lambda b: b[::2],  # row stride twice the width: read in place
        lambda b: b.t(),  # transposed
        lambda b: b.view(4, 6, 10).permute(1, 0, 2),  # leading dims that do not flatten
    ],
    ids=["strided-columns", "strided-rows", "transposed", "permuted"],
)
def test_non_contiguous_input_gives_the_same_result_as_its_contiguous_copy(make):
    x = make(torch.randn(24, 10, device=DEVICE))
    assert_close_to_row_scale(softmax.fused(x), reference(x.contiguous()), torch.float32)


@pytest.mark.parametrize("max_row", [None, 8], ids=["rows", "wide"])
def test_nan_and_inf_rows_come_out_as_torch_softmax_gives_them(max_row):
    x = torch.randn(6, 40, device=DEVICE)
    x[0] = -float("inf")  # all -inf: nan
    x[1, 3] = float("nan")  # a nan: the row is nan
    x[2, 5] = float("inf")  # a +inf: the row is nan
    x[3, :20] = -float("inf")  # partly -inf (whole steps of it in the wide-row plan): zeros there
    x[4, 10] = -float("inf")
    y = softmax.fused(x, max_row=max_row)
    assert_close_to_row_scale(y, torch.softmax(x, dim=-1), torch.float32, equal_nan=True)


def test_empty_input_returns_an_empty_result():
    assert softmax.fused(torch.empty(0, 5, device=DEVICE)).shape == (0, 5)
    assert softmax.fused(torch.empty(3, 0, device=DEVICE)).shape == (3, 0)


@pytest.mark.parametrize(
    "bad, error, words",
    [
        (torch.zeros(3, 4, dtype=torch.int32), TypeError, "dtype int32"),
        (torch.zeros(3, 4, dtype=torch.float64), TypeError, "dtype float64"),
        (torch.tensor(1.0), ValueError, "at least 1 dimension"),
        ([[1.0, 2.0]], TypeError, "torch.Tensor"),
    ],
    ids=["int32", "float64", "scalar", "list"],
)
def test_bad_input_raises_a_clear_error(bad, error, words):
    if isinstance(bad, torch.Tensor):
        bad = bad.to(DEVICE)
    with pytest.raises(error, match=words):
        softmax.fused(bad)


def test_a_cpu_tensor_is_refused_when_the_interpreter_is_off(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="CUDA"):
        softmax.fused(torch.randn(2, 3))


def test_an_out_tensor_of_the_wrong_shape_is_refused():
    x = torch.randn(2, 3, device=DEVICE)
    with pytest.raises(ValueError, match="shape"):
        softmax.fused(x, out=torch.empty(3, 2, device=DEVICE))


@pytest.mark.parametrize("tuning", TUNINGS)
@pytest.mark.parametrize("dev", DEVICES, ids=lambda d: d.name)
def test_plans_hold_rows_up_to_max_row_wide_in_one_program_and_pack_narrow_rows(dev, tuning):
    t = TUNINGS[tuning]
    for es in (2, 4):
        widest = softmax.plan(8192, softmax.MAX_ROW, es, dev, tuning=t)
        assert (widest.mode, widest.block_m, widest.block_n) == ("rows", 1, softmax.MAX_ROW)
        assert widest.num_warps * 32 * ELEMS_PER_THREAD == softmax.MAX_ROW  # 32 elements a thread
        # registers capped at what two such programs an SM need
        assert widest.max_regs == softmax._resident_regs(widest.num_warps, 2, dev) > 0
        assert softmax.plan(8192, softmax.MAX_ROW + 1, es, dev, tuning=t).mode != "rows"
    narrow = softmax.plan(524288, 256, 2, dev, tuning=t)
    assert (narrow.mode, narrow.block_n, narrow.block_m * narrow.block_n) == ("rows", 256, softmax.ROWS_TILE)
    assert softmax.plan(3, 256, 2, dev, tuning=t).block_m == 4  # never more rows a program than rows


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_packed_rows_narrower_than_16_take_compile_time_strides_and_are_right(n, dtype):
    x = torch.randn(301, n, dtype=dtype, device=DEVICE)  # the last program's rows ragged
    out = poisoned_like(x)
    softmax.fused(x, out=out)
    assert not out.isnan().any(), "an output element was left unwritten"
    assert_close_to_row_scale(out, softmax.unfused(x.float()).to(dtype), dtype)
    assert softmax._narrow(Phased.plain(x, out), n) == n
    # rows of a wider tensor (stride 2n), a width that is no power of two, 16 columns: runtime strides
    wide = torch.randn(301, 2 * n, dtype=dtype, device=DEVICE)[:, :n]
    out = poisoned_like(wide)
    softmax.fused(wide, out=out)
    assert not out.isnan().any()
    assert_close_to_row_scale(out, softmax.unfused(wide.float()).to(dtype), dtype)
    assert softmax._narrow(Phased.plain(wide, out), n) == 0
    for cols in (16, 32, 2048):  # multiples of 16: Triton knows their strides' alignment
        t = torch.empty(4, cols, dtype=dtype)
        assert softmax._narrow(Phased.plain(t, t), cols) == 0


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [3, 24, 60, 200], ids=lambda n: f"{n} wide")
def test_packed_rows_that_are_no_multiple_of_16_take_a_compile_time_width_and_are_right(n, dtype):
    """Odd (3), 8 x odd (24: 16-byte rows in 16-bit), 4 x odd (60: the router of a 60-expert MoE) and 200 (on 256
    lanes): packed rows on Triton's own accesses load as vectors of their alignment (_narrow)."""
    x = torch.randn(67, n, dtype=dtype, device=DEVICE) * 4  # the last program's rows ragged
    x[5] += 80.0  # a row whose max is far above its first element (SHIFT's redo)
    for rows, packed in ((x, True), (torch.cat([x, x], 1)[:, :n], False)):
        out = poisoned_like(rows)
        softmax.fused(rows, out=out)
        assert not out.isnan().any(), "an output element was left unwritten"
        assert_close_to_row_scale(out, softmax.unfused(rows.float()).to(dtype), dtype)
        # Triton's own accesses, not aligned vectors, whatever the tuning
        assert not any(softmax._phase_rows(n, rows.element_size(), t) for t in TUNINGS.values())
        assert softmax._narrow(Phased.plain(rows, out), n) == (n if packed else 0)
    t = torch.empty(4, softmax.PACKED_N_MAX + 2, dtype=dtype)  # past the bound: one compile a width is enough
    assert softmax._narrow(Phased.plain(t, t), t.shape[1]) == 0


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [66, 72, 100], ids=lambda n: f"{n} wide")
def test_packed_rows_of_the_narrow_band_keep_a_compile_time_width_where_it_is_a_multiple_of_its_tuned_one(
        n, dtype, tuned_sm90, launches):
    """In the band that reads unaligned rows as aligned vectors (sm_90: 64..128), packed rows of 4 x odd (100) and
    8 x odd (72) measured faster on Triton's accesses at a compile-time width; 2 x odd (66) keeps the vectors. The
    defaults have no such band: Triton's own accesses."""
    t = TUNED
    assert t.narrow_phased[0] <= n <= t.narrow_phased[1] and t.narrow_packed_multiple == 4
    x = torch.randn(37, n, dtype=dtype, device=DEVICE) * 4
    out = poisoned_like(x)
    softmax.fused(x, out=out)  # planned with the tuned choices (tuned_sm90)
    assert not out.isnan().any(), "an output element was left unwritten"
    assert_close_to_row_scale(out, softmax.unfused(x.float()).to(dtype), dtype)
    packed = n % 4 == 0  # Triton's accesses at a compile-time width, else aligned vectors
    assert (launches[-1]["NARROW"], launches[-1]["VEC"] > 1) == ((n, False) if packed else (0, True))
    es = x.element_size()
    assert softmax._phase_rows(n, es, t) and softmax._packed_band(Phased.plain(x, out), n, t) == (n % 4 == 0)
    wide = torch.cat([x, x], 1)[:, :n]  # rows of a wider tensor: aligned vectors
    assert not softmax._packed_band(Phased.plain(wide, poisoned_like(wide)), n, t)
    out = poisoned_like(wide)
    softmax.fused(wide, out=out)
    assert launches[-1]["VEC"] > 1
    assert not out.isnan().any()
    assert_close_to_row_scale(out, softmax.unfused(wide.float()).to(dtype), dtype)
    assert not softmax._phase_rows(n, es, DEFAULT) and not softmax._packed_band(Phased.plain(x, x), n, DEFAULT)


def test_the_planner_refuses_a_wide_row_plan_it_does_not_have():
    with pytest.raises(ValueError, match="unknown wide-row plan 'looped'"):
        softmax.plan(2048, 65536, 4, H200, wide="looped")


def _comment_terms(fn) -> list[tuple[str, str]]:
    """The (read, write) element expressions of each ``# read X elements ; write Y elements`` comment."""
    return re.findall(r"# read (.+?) elements ; write (.+?) elements", inspect.getsource(fn))


def _evaluate(expression: str, **dims: int) -> int:
    """``"MN + M"`` with M, N given: each term an optional integer times a product of dimensions."""
    total = 0
    for term in expression.split("+"):
        coefficient, letters = re.fullmatch(r"\s*(\d*)([A-Z]+)\s*", term).groups()
        value = int(coefficient or 1)
        for letter in letters:
            value *= dims[letter]
        total += value
    return total


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_unfused_traffic_is_the_sum_of_the_unfused_line_comments(dtype):
    m, n = 6, 10
    x = torch.empty(m, n, dtype=dtype)
    terms = _comment_terms(softmax.unfused)
    assert len(terms) == 5, "the unfused softmax is five ops, one comment each"
    traffic = softmax.unfused_traffic(x)
    assert traffic.read_bytes == sum(_evaluate(r, M=m, N=n) for r, _ in terms) * x.element_size()
    assert traffic.write_bytes == sum(_evaluate(w, M=m, N=n) for _, w in terms) * x.element_size()


def test_budget_is_one_read_and_one_write_a_quarter_of_the_five_ops():
    x = torch.empty(4096, 4096)  # the DESIGN.md figure: five ops 512 MB, fused 128 MB
    assert softmax.budget(x).read_bytes == softmax.budget(x).write_bytes == 4096 * 4096 * 4
    assert softmax.budget(x).total == 128 * 2**20
    assert softmax.unfused_traffic(x).total == 512 * 2**20 + 4 * 4096 * 4
    assert softmax.budget(torch.empty(2, 3, 5, dtype=torch.bfloat16)).total == 2 * 30 * 2


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "n",
    # narrow, power-of-two edges, and the ragged vocabulary and hidden widths of real models
    # (BERT 30522, GPT-2 50257, Llama-3 128256, Qwen 151936) that start rows unaligned
    [1, 2, 3, 255, 256, 1000, 4096, 8191, 8192, 8193, 8500, 8704, 16383, 16384, 17000, 20000, 30522, 32768, 33000, 50257,
     100000, 128256, 151936],
)
def test_default_plans_match_torch_softmax_across_widths(n, dtype):
    x = torch.randn(max(3, 2**20 // n), n, device="cuda", dtype=dtype)
    out = poisoned_like(x)
    softmax.fused(x, out=out)
    assert not out.isnan().any(), "an output element was left unwritten"
    assert_close_to_row_scale(out, torch.softmax(x.float(), -1).to(dtype), dtype)


@pytest.mark.parametrize(
    "wide, expected_mode",
    [("persistent", "persistent"), (None, "split")],
    ids=["persistent", "split (the default for fp32; one program a row here)"],
)
def test_each_wide_row_plan_matches_the_reference_on_ragged_rows(wide, expected_mode):
    x = torch.randn(5, 333, device=DEVICE)  # max_row=64: six steps, the last one ragged
    plan = softmax.plan(5, 333, 4, _device.of(x.device), max_row=64, wide=wide)
    assert plan.mode == expected_mode
    out = poisoned_like(x)
    softmax._launch(x, out, plan)
    assert_close_to_row_scale(out, reference(x), torch.float32)
    if wide is None:  # the plan fused makes
        assert_close_to_row_scale(softmax.fused(x, max_row=64), reference(x), torch.float32)


# The wide-row plans of docs/kernels.md ("The split walk"): "persistent"
# (one program walks whole rows) runs anywhere; "split" with several programs a row waits on
# its peers, so under the interpreter it runs one program a row and its waiting form is
# tested on the GPU only. The interpreter's 3 "SMs" (_common.INTERPRETER_SMS): 3 programs walk several rows each.
WIDE_SHAPES = [
    ((7, 333), 64),  # six steps a row, the last one 13 wide; 7 rows over 3 programs
    ((5, 128), 32),  # steps fill the row exactly
    ((1, 70), 16),  # one row: programs without a tile
    ((4, 60), 48),  # one 64-wide step a row: held in registers for pass two (HOLD), no re-read
    ((11, 60), 48),  # held, 11 rows over 3 programs: each loads its next row before its reductions (EARLY)
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape, max_row", WIDE_SHAPES, ids=str)
def test_persistent_wide_row_plan_matches_the_reference_on_ragged_rows(shape, max_row, dtype):
    x = torch.randn(shape, device=DEVICE).mul_(4).to(dtype)
    plan = softmax.plan(*shape, x.element_size(), _device.of(x.device), max_row=max_row, wide="persistent")
    assert (plan.mode, plan.group) == ("persistent", 1)
    out = poisoned_like(x)
    softmax._launch(x, out, plan)
    assert not out.isnan().any(), "an output element was left unwritten"
    assert_close_to_row_scale(out, reference(x), dtype)


@pytest.mark.parametrize("wide", ["persistent", "split"])
def test_wide_row_candidates_give_nan_and_inf_rows_as_torch_softmax_does(wide):
    x = torch.randn(6, 40, device=DEVICE)
    x[0] = -float("inf")  # all -inf: nan
    x[1, 3] = float("nan")  # a nan: the row is nan
    x[2, 5] = float("inf")  # a +inf: the row is nan
    x[3, :20] = -float("inf")  # whole steps of -inf: zeros there, no nan
    x[4, 10] = -float("inf")
    plan = softmax.plan(6, 40, 4, _device.of(x.device), max_row=8, wide=wide)
    assert plan.mode == wide
    y = poisoned_like(x)
    softmax._launch(x, y, plan)
    assert_close_to_row_scale(y, torch.softmax(x, dim=-1), torch.float32, equal_nan=True)


# The staged plan (_softmax_fwd_kernel, one row a step): whole rows in registers; 16-bit rows walked by persistent
# programs with the next rows' loads pipelined through shared memory (STAGES > 0; on the GPU, the interpreter runs the
# same loop unpipelined), fp32 rows one program a row. A tuned choice (tuned/90.json, "staged_cols"): its tests plan
# with it (tuned_sm90), forced with wide="staged" at any width it holds.
STAGED_SHAPES = [
    (7, 333),  # ragged width, rows at every phase; 7 rows over the interpreter's 3 x per_sm programs
    (40, 64),  # aligned, more rows than programs
    (2, 1000),  # fewer rows than programs
    (5, 1),  # one-wide rows: the body is empty, the edges carry the row
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", STAGED_SHAPES, ids=str)
def test_the_staged_plan_matches_the_reference_and_gives_nan_and_inf_rows_as_torch(shape, dtype, tuned_sm90):
    x = torch.randn(shape, device=DEVICE).mul_(4).to(dtype)
    x[0, 0] = float("nan")  # the row is nan
    x[1, : shape[1] // 2] = -float("inf")  # zeros there (a one-wide row keeps its element)
    plan = softmax.plan(*shape, x.element_size(), tuned_sm90, wide="staged")
    # 16-bit rows: persistent programs, pipelined; fp32 rows: one program a row
    assert plan.mode == "staged" and plan.per_sm >= 1 and (plan.stages >= 1) == (x.element_size() < 4)
    out = poisoned_like(x)
    softmax._launch(x, out, plan)
    assert out[0].isnan().all() and not out[1:].isnan().any(), "an output element was left unwritten"
    assert_close_to_row_scale(out, torch.softmax(x.float(), -1).to(dtype), dtype, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("offset", [0, 1, 3], ids=["aligned", "phase 1", "phase 3"])
def test_the_staged_plan_reads_rows_of_a_wider_tensor_at_any_phase(offset, dtype, tuned_sm90):
    big = torch.randn(9, 70, device=DEVICE).to(dtype)
    x = big[:, offset:offset + 64]  # an aligned width whose rows start off the 16-byte grid: a wider block
    plan = softmax.plan(9, 64, x.element_size(), tuned_sm90, wide="staged")
    out = poisoned_like(x)
    softmax._launch(x, out, plan)
    assert_close_to_row_scale(out, reference(x), dtype)


@pytest.mark.parametrize("dev", DEVICES, ids=lambda d: d.name)
def test_the_staged_plan_is_the_default_in_its_tuned_band_and_never_with_the_default_choices(dev):
    # tuned/90.json (docs/kernels.md, "The staged plan"): rows in staged_cols, fp32 all of them, 16-bit ones that fill
    # staged_lane_use_16bit of their power of two (an unaligned row counts its widest phase); the held plan is asked
    # first where it is taken (the tests of "held" below), so not here
    t = TUNED
    lo, hi = t.staged_cols
    widths = sorted({*range(lo - 300, hi + 400, 101), lo - 1, lo, 28000, 30522, 32000, hi - 1, hi, hi + 1})
    for n in widths:
        for es in (2, 4):
            fills = es == 4 or n / next_power_of_2(n) >= t.staged_lane_use_16bit
            staged = lo <= n and ragged_width(n, es) <= hi and fills
            assert (softmax.plan(2048, n, es, dev, tuning=t, held=False).mode == "staged") == staged, (n, es)
            assert softmax.plan(2048, n, es, dev, tuning=DEFAULT, held=False).mode != "staged", (n, es)
            assert softmax.plan(2048, n, es, dev, tuning=t, max_row=4096).mode != "staged"  # tests' wide-row plans
    with pytest.raises(ValueError, match=f"staged plan takes rows of {lo}-{hi} columns .* not {hi + 1}"):
        softmax.plan(2048, hi + 1, 2, dev, tuning=t, wide="staged")
    with pytest.raises(ValueError, match="staged plan takes no rows"):  # no band measured: no staged plan
        softmax.plan(2048, 1000, 2, dev, tuning=DEFAULT, wide="staged")


@pytest.mark.parametrize("dev", DEVICES, ids=lambda d: d.name)
def test_the_staged_plan_holds_a_row_a_step_in_one_piece_with_as_many_programs_as_registers_and_shared_memory_fit(dev):
    t = TUNED
    smem = dev.smem_per_block - softmax.STAGED_SMEM_SPARE
    for n, es in [(32768, 2), (32768, 4), (30522, 2), (28000, 2), (20000, 4), (16385, 4), (1000, 2), (333, 4), (1, 2)]:
        p = softmax.plan(2048, n, es, dev, tuning=t, wide="staged")
        vec = 1 if ragged_width(n, es) == n else 16 // es
        lanes = next_power_of_2(-(-n // vec) * vec)
        # one piece, the row's own power of two (pieces lost at 25049 and 28000, docs/kernels.md), STAGED_ELEMS a
        # thread on 4 to 32 warps
        assert (p.block_m, p.block_n, p.pieces) == (1, lanes, (lanes, 0, 0)), (n, es, p)
        assert p.num_warps == max(4, min(32, lanes // (32 * softmax.STAGED_ELEMS))), (n, es, p)
        if es == 4:  # fp32: one program a row
            assert p.stages == 0
            in_flight = 0
        else:  # 16-bit: as many rows in flight (stages - 1) as the shared memory a block may take holds
            assert 1 <= p.stages <= softmax.STAGED_STAGES
            assert p.stages == softmax.STAGED_STAGES or p.stages * lanes * es > smem
            in_flight = max(0, p.stages - 1) * lanes * es
        # programs an SM: as many as its registers (at the rows cap) and shared memory hold
        regs = p.num_warps * 32 * p.max_regs
        assert p.max_regs == softmax._resident_regs(16, 2, dev) and p.per_sm * regs <= dev.regs_per_sm
        assert p.per_sm * in_flight <= smem
        assert p.per_sm == 1 or (p.per_sm + 1) * regs > dev.regs_per_sm or (p.per_sm + 1) * in_flight > smem
    widest = softmax.plan(2048, 32768, 2, dev, tuning=t, held=False)
    assert (widest.mode, widest.num_warps, widest.per_sm) == ("staged", 32, 1) and widest.stages >= 2
    assert softmax.plan(2048, 20000, 4, dev, tuning=t, held=False).pieces == (32768, 0, 0)


@pytest.mark.parametrize("dev", DEVICES, ids=lambda d: d.name)
def test_registers_are_capped_so_that_the_programs_an_sm_a_plan_counts_on_are_resident_at_once(dev):
    for warps in (2, 4, 8, 16, 32):
        assert softmax._resident_regs(warps, 1, dev) == 0  # one program an SM: the compiler's choice
        for per_sm in (2, 3, 4, 5):
            regs = softmax._resident_regs(warps, per_sm, dev)
            threads = warps * 32 * per_sm
            assert 0 < regs <= THREAD_MAX_REGS and regs * threads <= dev.regs_per_sm
            assert regs % 8 == 0 or regs == THREAD_MAX_REGS  # Triton's steps of 8
            assert regs == THREAD_MAX_REGS or (regs + 8) * threads > dev.regs_per_sm


@pytest.mark.parametrize("tuning", TUNINGS)
@pytest.mark.parametrize("dev", DEVICES, ids=lambda d: d.name)
def test_the_wide_row_walks_are_sized_for_the_l2(dev, tuning):
    t = TUNINGS[tuning]
    for n in (16385, 20000, 33000, 40000, 50257, 65536, 65537, 100000, 128256, 262144, 262145, 600000, 1 << 24):
        for es in (2, 4):
            # persistent: one 16-warp program an SM, one 64 KiB chunk of loads in flight
            p = softmax.plan(2048, n, es, dev, tuning=t, wide="persistent")
            assert (p.mode, p.group, p.per_sm, p.num_warps, p.max_regs) == ("persistent", 1, 1, 16, 0), (n, es, p)
            assert p.block_n * es == softmax.PERSISTENT_CHUNK_BYTES
            # split: fp32 rows of up to MAX_SPLIT_GROUP slices from SPLIT_HOLD_MIN_ROW_BYTES take one 64 KiB step a
            # slice, held in registers by one 16-warp program an SM; other rows 16 KiB steps, up to SPLIT_PER_SM
            # 8-warp programs an SM with the registers that leaves them
            p = softmax.plan(2048, n, es, dev, tuning=t, wide="split")
            hold = es == 4 and (softmax.SPLIT_HOLD_MIN_ROW_BYTES <= n * es
                                <= softmax.MAX_SPLIT_GROUP * softmax.SPLIT_SLICE_BYTES)
            if hold:
                assert (p.block_n * es, p.num_warps, p.per_sm, p.max_regs) == (softmax.SPLIT_SLICE_BYTES, 16, 1, 0)
            else:
                assert (p.block_n * es, p.num_warps) == (softmax.SPLIT_CHUNK_BYTES, 8), (n, es, p)
                assert p.per_sm == softmax.SPLIT_PER_SM and p.max_regs == softmax._resident_regs(8, p.per_sm, dev)
            # slices of at most SPLIT_SLICE_BYTES, none empty, a row waiting on MAX_SPLIT_GROUP programs at most; what
            # pass two reads again, every resident program's slice, stays in the L2 for rows of up to MAX_SPLIT_GROUP
            # slices (wider rows' slices do not, and fewer programs an SM lost there: docs/kernels.md)
            group, slice_cols = split_group(n, p.block_n, p.group)
            assert p.mode == "split" and group == p.group <= softmax.MAX_SPLIT_GROUP, (n, es, p)
            capped = n * es > softmax.MAX_SPLIT_GROUP * softmax.SPLIT_SLICE_BYTES
            assert slice_cols * es <= softmax.SPLIT_SLICE_BYTES or capped, (n, es, p)
            assert (p.group - 1) * slice_cols < n
            assert capped or p.per_sm * min(n, slice_cols) * es * dev.sms <= dev.l2_bytes, (n, es, p)
            # the plan for the row: persistent for 16-bit rows the tuning's "persistent" takes, else split (held and
            # the staged plan are asked first: their tests)
            w, chunk = ragged_width(n, es), softmax.PERSISTENT_CHUNK_BYTES // es
            persistent = (t.persistent is not None and es == 2 and n * es <= t.persistent[0]
                          and w / (-(-w // chunk) * chunk) >= t.persistent[1])
            p = softmax.plan(2048, n, es, dev, tuning=t, held=False)
            assert p.mode in ("staged", "persistent" if persistent else "split"), (n, es, p)
    assert split_group(20000, 4096, 2) == (2, 3 * 4096)
    assert split_group(5 * 4096, 4096, 4) == (3, 2 * 4096)  # never an empty slice
    assert softmax.plan(4, 1 << 24, 4, dev, tuning=t, wide="split").group == softmax.MAX_SPLIT_GROUP  # capped
    # unaligned rows read as aligned vectors: the tile covers the row's width, a phase that carries a row past it
    # leaves its last elements to the edges
    for n in range(1, softmax.MAX_ROW + 1, 89):
        for es in (2, 4):
            p = softmax.plan(1000, n, es, dev, tuning=t, held=False)
            if p.mode == "rows":
                assert p.block_n == next_power_of_2(n), (n, es, p)
    # where a launch's programs do not run at once (the interpreter), none may wait on another
    one_at_a_time = dataclasses.replace(dev, concurrent=False)
    assert softmax.plan(2048, 65536, 4, one_at_a_time, tuning=t, wide="persistent").mode == "persistent"
    assert softmax.plan(2048, 65536, 4, dev, tuning=t, held=False).group > 1
    assert softmax.plan(2048, 65536, 4, one_at_a_time, tuning=t, held=False).group == 1  # nothing to wait for
    with pytest.raises(ValueError, match="interpreter"):
        softmax.plan(2048, 65536, 4, one_at_a_time, tuning=t, wide="split")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "shape, block_n, group",
    [
        ((3000, 1000), 128, 4),  # 8 steps a row in 4 slices, thousands of waiting rows
        ((64, 4099), 64, 3),  # 65 steps: slices of 22, 22 and 21, the last step 3 wide
        ((33, 70000), 4096, 16),  # 18 steps: 9 slices of 2, ragged last step
        ((40, 9000), 1024, 9),  # one step a slice (held in registers), the last step 808 wide
        ((64, 250), 64, 3),  # 16-bit: slices of 2 steps; the last slice empty or one element, by the row's phase
        ((2048, 65536), None, None),  # the split heuristic at an anchor shape
        ((3, 262144 + 5), None, None),  # the split heuristic past the widest anchor, ragged
    ],
    ids=str,
)
def test_split_plan_waiting_on_its_peers_matches_the_reference_every_time(shape, block_n, group, dtype):
    x = torch.randn(shape, device="cuda").mul_(4).to(dtype)
    x[1, 7] = float("nan")
    x[2, : shape[1] // 2] = -float("inf")
    expected = torch.softmax(x.float(), dim=-1).to(dtype)
    dev = _device.of(x.device)
    if block_n is None:
        plan = softmax.plan(*shape, x.element_size(), dev, wide="split")
    else:  # max_row: chunks of block_n even where the row would fit one program
        plan = dataclasses.replace(softmax.plan(*shape, x.element_size(), dev, max_row=block_n, wide="split"), group=group)
    assert (plan.mode, plan.block_n) == ("split", block_n or plan.block_n)
    for _ in range(3):  # a missing wait or fence shows up as a result that changes
        out = poisoned_like(x)
        softmax._launch(x, out, plan)
        assert not out[0].isnan().any() and out[1].isnan().all()
        assert_close_to_row_scale(out, expected, dtype, equal_nan=True)


@pytest.mark.gpu
@pytest.mark.parametrize("wide", ["persistent", "split"])
@pytest.mark.parametrize("n", [16385, 65536, 100000, 262144])
def test_wide_row_candidates_match_torch_softmax_across_widths(wide, n):
    x = torch.randn(max(1, 2**22 // n), n, device="cuda", dtype=torch.bfloat16)
    plan = softmax.plan(*x.shape, 2, _device.of(x.device), wide=wide)
    y = poisoned_like(x)
    softmax._launch(x, y, plan)
    assert not y.isnan().any(), "an output element was left unwritten"
    assert_close_to_row_scale(y, torch.softmax(x.float(), -1).bfloat16(), torch.bfloat16)


@pytest.mark.parametrize("n", [259, 333, 1023])
def test_edge_words_on_programs_of_several_rows_read_no_row_past_the_tensor(n, monkeypatch):
    # Edge words serve the rows plan from PHASED_ROWS_MIN_COLS (2048: one row a program); at 256 a program takes 2-4
    # rows, and the last program's rows past M once read their edges from past the tensor (an illegal address on
    # the H200 at the sweep's 128 MiB; the GPU's shape here is the sweep's, where that read left the allocation)
    monkeypatch.setattr(softmax, "PHASED_ROWS_MIN_COLS", 256)
    rows = (2**27 // (2 * n) - 1) | 1 if DEVICE == "cuda" else 37  # odd: the last program's block runs past M
    plan = softmax.plan(rows, n, 2, _device.of(torch.device(DEVICE)))
    assert softmax._edge_words(n, 2, plan.tuning)
    assert plan.mode == "rows" and plan.block_m > 1 and rows % plan.block_m
    x = torch.randn(rows, n, device=DEVICE).mul_(3).bfloat16()
    y = softmax.fused(x)
    assert_close_to_row_scale(y, torch.softmax(x.float(), -1).bfloat16(), torch.bfloat16)


# Rows that do not start 16-byte aligned (reference_kernels/_ragged.py): every row at its own
# phase, rows of a wider tensor, outputs at odd offsets. Each case runs the rows plan and, with
# max_row, the wide-row walk; results are compared element by element and nothing is left unwritten.
# The rows plan runs with the default choices and with the sm_90 tuned ones, which read some narrow rows as aligned
# vectors and take one reduction for 16-bit rows of 256-2047 (softmax.Tuning).
RAGGED = [
    (9, 13),  # bf16: 8 a vector, every phase 0..7 among the rows; rows shorter than two vectors
    (6, 3),  # rows inside one vector, some straddling two
    (5, 50),  # a body of whole vectors between the edges (rows plan: Triton's scalar path)
    (6, 100),  # tuned: rows plan reading aligned vectors (softmax._phase_rows), several rows a program
    (3, 2051),  # rows plan reading aligned vectors, one row a program
    (9, 127),  # every phase; from phase 2 a row runs past its 128-lane tile (the rest are edges)
    (3, 4095),  # the same, one row a program
]
# The rows plan only (the wide-row walk's 8-wide steps are slow under the interpreter here)
RAGGED_PIECES = [
    (9, 2049),  # two pieces (2048 + one vector: softmax._row_pieces) at every phase
    (3, 1025),  # fp32: two pieces on Triton's scalar path (1024 + 1); tuned 16-bit: aligned vectors, edges as words
    (9, 1031),  # the same band's widest phases (Tuning.odd_16bit)
]
RAGGED_CASES = ([pytest.param(shape, m, False, id=f"{shape}-{m}") for shape in RAGGED for m in (None, 8)]
                + [pytest.param(shape, None, False, id=f"{shape}-None") for shape in RAGGED_PIECES]
                + [pytest.param(shape, None, True, id=f"{shape}-None-tuned") for shape in RAGGED + RAGGED_PIECES])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape, max_row, tuned", RAGGED_CASES)
def test_rows_at_every_phase_match_the_reference(shape, max_row, tuned, dtype, request):
    if tuned:
        request.getfixturevalue("tuned_sm90")
    x = torch.randn(shape, device=DEVICE).mul_(3).to(dtype)
    out = poisoned_like(x)
    softmax.fused(x, out=out, max_row=max_row)
    assert not out.isnan().any(), "an output element was left unwritten"
    assert_close_to_row_scale(out, reference(x), dtype)


@pytest.mark.parametrize("max_row", [None, 8], ids=["rows", "persistent"])
@pytest.mark.parametrize("offset, width", [(3, 40), (4, 41), (0, 37)], ids=["odd phase", "same phase, wider stride", "wider stride"])
def test_rows_of_a_wider_tensor_are_read_in_place_or_from_a_copy_and_match(offset, width, max_row):
    big = torch.randn(7, 45, device=DEVICE)
    x = big[:, offset:offset + width]
    out = poisoned_like(x)
    softmax.fused(x, out=out, max_row=max_row)
    assert not out.isnan().any()
    assert_close_to_row_scale(out, reference(x), torch.float32)
    before = big.clone()
    softmax.fused(x, max_row=max_row)
    assert torch.equal(big, before), "the input was written"


@pytest.mark.parametrize("max_row", [None, 8], ids=["rows", "persistent"])
def test_an_out_at_an_odd_offset_gets_every_element(max_row):
    x = torch.randn(5, 21, device=DEVICE).half()
    buf = torch.full((5 * 21 + 3,), float("nan"), dtype=x.dtype, device=DEVICE)
    out = buf[3:].view(5, 21)
    softmax.fused(x, out=out, max_row=max_row)
    assert buf[:3].isnan().all(), "written before out"
    assert not out.isnan().any()
    assert_close_to_row_scale(out, reference(x), torch.float16)


@pytest.mark.parametrize("shape", [(4, 1000), (3, 2049), (3, 8704)], ids=str)  # 8704: one 16384-lane tile
def test_large_logits_keep_full_float32_precision(shape):
    # exp(x - max), exactly as written: folding the shift into one FMA (2^(x log2 e - max log2 e))
    # loses |x| 2^-24 in the exponent, 6e-4 relative at logits of 1e4
    x = torch.randn(shape, device=DEVICE) * 3 + 1e4
    torch.testing.assert_close(softmax.fused(x).double(), torch.softmax(x.double(), -1), atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("tuning", TUNINGS)
def test_aligned_16_bit_rows_of_8192_lanes_and_a_second_piece_in_the_tuned_band_take_fewer_registers(tuning):
    # Tuning.tail_regs_16bit (sm_90: 256-512 lanes at 48 registers, docs/kernels.md "One reduction": five 8-warp
    # programs an SM instead of four, bf16 8704 81-83 -> 86%, 8448 82-83 -> 89%; 8200 (8192 + 8) lost 98 -> 66%,
    # unaligned rows 1-4 points); the defaults keep the rows cap
    t = TUNINGS[tuning]
    band = t.tail_regs_16bit
    assert (band is None) == (t is DEFAULT)
    for first in (4096, 8192):
        for second in (0, 8, 128, 255, 256, 384, 512, 513, 1024):
            pieces = (first, second, 0)
            taken = band is not None and first == 8192 and band[0] <= second <= band[1]
            assert softmax._rows_regs(pieces, 1, 2, 64, t) == (band[2] if taken else 64), pieces
            assert softmax._rows_regs(pieces, 8, 2, 64, t) == 64  # unaligned rows keep the rows cap
            assert softmax._rows_regs(pieces, 1, 4, 64, t) == 64  # and fp32
    assert softmax._rows_regs((8192, 256, 8), 1, 2, 64, t) == 64  # three pieces
    assert [softmax._row_pieces(n, 1, 2, t)[:2] for n in (8200, 8448, 8704)] == [(8192, 8), (8192, 256), (8192, 512)]


@pytest.mark.parametrize("tuning", TUNINGS)
def test_fp32_rows_take_the_tunings_rows_tile_and_16_bit_rows_the_default_one(tuning):
    # Tuning.rows_tile_fp32 (sm_90: Liger's one fp32 row of 1024 a program on 4 warps; docs/kernels.md, "softmax");
    # 16-bit rows keep ROWS_TILE, as fp32 ones do with the defaults; rows of the tile and wider are one a program
    t = TUNINGS[tuning]
    assert (t.rows_tile_fp32 == softmax.ROWS_TILE) == (t is DEFAULT)
    for n in (1, 7, 100, 256, 300, 512, 1000, 1024, 1536, 2048, 4096):
        for es, tile in ((4, t.rows_tile_fp32), (2, softmax.ROWS_TILE)):
            p = softmax.plan(1 << 16, n, es, H200, tuning=t, held=False)
            assert (p.mode, p.block_n, p.block_m) == ("rows", next_power_of_2(n), max(1, tile // next_power_of_2(n)))
            assert n > 1024 or p.num_warps == 4, (n, es, p)


@pytest.mark.parametrize("tuning", TUNINGS)
def test_16_bit_rows_masking_the_tuned_share_of_their_lanes_take_more_rows_a_program(tuning):
    # Tuning.masked_rows (sm_90: a quarter or more of 1024 lanes masked, 4096 elements a program; docs/kernels.md,
    # "The rows kernel": 600 86 -> 92%, 768 95 -> 99% bf16): multiples of 8 held in one piece (520 = 512 + 8 in
    # pieces lost 92 -> 85); odd rows and other blocks keep ROWS_TILE; the defaults have no such band
    t = TUNINGS[tuning]
    taken = set()
    for n in range(1, 1100):
        masked = (t.masked_rows is not None and n % 8 == 0 and next_power_of_2(n) == t.masked_rows[0]
                  and n <= (1 - t.masked_rows[1]) * t.masked_rows[0] and softmax._row_pieces(n, 1, 2, t)[1] == 0)
        tile = max(softmax.ROWS_TILE, t.masked_rows[2]) if masked else softmax.ROWS_TILE
        p = softmax.plan(1 << 20, n, 2, H200, tuning=t, held=False)
        assert p.block_m == max(1, tile // next_power_of_2(n)), (n, p)
        if masked:
            taken.add(n)
            assert p.num_warps * 32 * ELEMS_PER_THREAD == p.block_m * p.block_n  # 32 elements a thread
        assert softmax.plan(3, n, 2, H200, tuning=t).block_m <= 4  # never more rows a program than rows
    assert bool(taken) == (t is TUNED)


@pytest.mark.parametrize("dtype, n", [(torch.bfloat16, 600), (torch.float16, 600), (torch.float32, 256)], ids=str)
def test_rows_on_the_tuned_tiles_match_the_reference_with_a_ragged_last_block(dtype, n, tuned_sm90, launches):
    # 16-bit rows of 600 four a program (Tuning.masked_rows), fp32 rows of 256 four a program (Tuning.rows_tile_fp32)
    x = torch.randn(7, n, device=DEVICE).mul_(4).to(dtype)  # two programs of four rows, the second one short
    assert softmax.plan(7, n, x.element_size(), tuned_sm90).block_m == 4
    out = poisoned_like(x)
    softmax.fused(x, out=out)
    assert launches[-1]["BLOCK_M"] == 4
    assert not out.isnan().any(), "an output element was left unwritten"
    assert_close_to_row_scale(out, reference(x), dtype)


@pytest.mark.parametrize("tuning", TUNINGS)
def test_16_bit_rows_take_one_reduction_only_in_the_bands_of_their_tuning(tuning):
    # Tuning.shift_16bit (sm_90: 256-2047 and 8193-32768, docs/kernels.md "One reduction"; level or lower at 2048-8192,
    # lower at odd widths under 16); fp32 rows keep exp(x - max), full precision; the defaults take no band
    t = TUNINGS[tuning]
    assert bool(t.shift_16bit) == (t is TUNED)
    for n in range(1, 40000):
        assert softmax._shift(n, 2, t) == any(lo <= n <= hi for lo, hi in t.shift_16bit), n
        assert not softmax._shift(n, 4, t)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
# rows plan: many rows a program (300), pieces (4097: 4096 + 8 at every phase), ragged phases (1000); staged (64);
# the wide-row walk (max_row 64: 64-wide steps, one program a row under the interpreter) on aligned rows
@pytest.mark.parametrize("shape, wide, max_row", [
    ((8, 300), None, None), ((8, 4097), None, None), ((8, 1000), None, None), ((8, 64), "staged", None),
    ((8, 320), None, 64)], ids=str)
def test_16_bit_rows_shifted_by_their_first_element_redo_the_rows_that_shift_cannot_take(shape, wide, max_row, dtype,
                                                                                         launches):
    t = dataclasses.replace(TUNED, shift_16bit=((1, 32768),))  # one reduction at every width the plans take it
    x = torch.randn(shape, device=DEVICE).mul_(3).to(dtype)
    x[1, 0] = -200.0  # the max 200 above the first element: exp(x - first) overflows, so the row is redone
    x[2, 0] = -float("inf")  # a first element of -inf: nan against it, redone; the rest of the row is finite
    x[3, 0] = float("inf")  # torch: the row is nan
    x[4, 5] = float("nan")
    x[5] = -float("inf")  # torch: nan
    x[6, 0] = x[6].float().max().item() - 60.0  # 60 under the max: kept shifted, e^60 in the sum
    plan = softmax.plan(*shape, x.element_size(), _device.of(x.device), tuning=t, wide=wide, max_row=max_row)
    assert plan.mode == ("split" if max_row else wide or "rows")
    out = poisoned_like(x)
    softmax._launch(x, out, plan)
    assert launches and all(kwargs["SHIFT"] for kwargs in launches), "the launch did not take one reduction"
    expected = torch.softmax(x.float(), -1).to(dtype)
    assert torch.equal(out.isnan(), expected.isnan()), "nan where torch has none, or an element left unwritten"
    assert_close_to_row_scale(out, expected, dtype, equal_nan=True)
    in_place = x.clone()  # the redo reloads x: in place, nothing of the block is stored before it
    softmax._launch(in_place, in_place, plan)
    assert torch.equal(in_place.isnan(), out.isnan()) and torch.equal(in_place.nan_to_num(), out.nan_to_num())


def test_the_split_walk_sums_against_the_first_element_only_on_aligned_16_bit_tiles_of_several_steps_where_tuned(
        monkeypatch):
    # docs/kernels.md, "The split walk": bf16 / fp16 20000 76 -> 82 / 77 -> 82, 49152 72 -> 75 / 73 -> 76; not on
    # ragged rows (50257 lost), fp32 (exp(x - max): full precision), a tile of one step held for pass two, nor the
    # persistent plan (65536 bf16 lost)
    runs = []
    monkeypatch.setattr(softmax, "split_run", lambda *args, **kwargs: runs.append(kwargs))

    def shift(plan, n, dtype=torch.bfloat16):
        x = torch.zeros(2, n, dtype=dtype, device=DEVICE)
        r = phased(x, torch.empty_like(x))
        softmax._launch_split(r, 2, n, plan)
        return runs[-1]["SHIFT"]

    split = softmax.Plan("split", 1, 8192, 8, 4, 3, 80, device=H200, tuning=TUNED)
    assert shift(split, 16 * 8192)  # four slices of four steps
    assert not shift(dataclasses.replace(split, tuning=DEFAULT), 16 * 8192)  # a band measured on the H200 only
    assert not shift(split, 16 * 8192 - 1)  # ragged rows
    assert not shift(split, 16 * 8192, torch.float32)  # fp32
    assert not shift(dataclasses.replace(split, group=16), 16 * 8192)  # a tile of one step, held for pass two
    assert not shift(dataclasses.replace(split, mode="persistent", group=1, per_sm=1), 65536)
    for t in TUNINGS.values():
        assert shift(softmax.plan(2, 128256, 2, H200, tuning=t, held=False), 128256) == t.split_shift_16bit


@pytest.mark.parametrize("tuning", TUNINGS)
def test_rows_are_held_in_a_few_power_of_two_pieces_that_cover_every_whole_vector(tuning):
    t = TUNINGS[tuning]
    pieces = lambda n, vec, es, **kw: softmax._row_pieces(n, vec, es, t, **kw)  # noqa: E731
    assert pieces(4097, 8, 2) == (4096, 8, 0)  # bf16: the last vector of a phase-7 row ends at 4104
    assert pieces(4097, 4, 4) == (4096, 4, 0)
    assert pieces(4095, 8, 2) == (4096, 0, 0)  # a phase past 4096 leaves only edge elements there
    assert pieces(2049, 8, 2) == (2048, 8, 0)
    assert pieces(4096, 1, 2) == (4096, 0, 0)
    assert pieces(300, 1, 2) == (512, 0, 0)  # narrower rows: only just above a power of two
    assert pieces(200, 8, 2) == (256, 0, 0)  # under PIECES_MIN_COLS: the row's power of two
    assert pieces(5120, 1, 2, max_pieces=1) == (8192, 0, 0)
    assert [softmax._piece_warps(n) for n in (1032, 2056, 4104, 10240, 20000)] == [2, 2, 4, 8, 16]
    assert pieces(12345, 8, 2, max_pieces=3)[2] > 0 or t is DEFAULT  # a third piece where allowed (12352 lanes)
    for n in range(1, 20000, 97):
        for vec, size in ((1, 2), (1, 4), (4, 4), (8, 2)):
            got = pieces(n, vec, size, max_pieces=3)
            need = (n + vec - 1) // vec * vec if vec > 1 else n
            assert sum(got) >= need, (n, vec, got)
            assert all(p == 0 or p & (p - 1) == 0 for p in got) and (got[2] == 0 or got[1] > 0), (n, vec, got)
            assert all(p == 0 or p % vec == 0 for p in got), (n, vec, got)


@pytest.mark.parametrize("tuning", TUNINGS)
def test_a_row_goes_in_pieces_only_where_its_power_of_two_masks_the_tunings_share_of_its_lanes(tuning):
    # Tuning.piece_waste: (under 4096 lanes, wider 16-bit, wider ragged fp32, wider aligned fp32). sm_90: rows under
    # 4096 only just above a power of two (1025, 2049: 50%; 768, 1536, 2560 lost 6-8 points in pieces); wider 16-bit
    # ones from 20% (5120, 10000, 12288 gained 7-16 points), ragged fp32 from 30% (6144 lost 5), aligned fp32 never (as
    # Liger's tile: 8704 92 -> 95.5%); the defaults one share for all
    t = TUNINGS[tuning]
    narrow, wide_16, ragged_32, aligned_32 = t.piece_waste
    assert (len(set(t.piece_waste)) == 1) == (t is DEFAULT)
    for n in range(1, 20000, 7):
        for vec, es in ((1, 2), (1, 4), (4, 4), (8, 2)):
            need = (n + vec - 1) // vec * vec
            single = next_power_of_2(need)
            least = narrow if need < 4096 else wide_16 if es < 4 else aligned_32 if vec == 1 else ragged_32
            got = softmax._row_pieces(n, vec, es, t)
            if n < softmax.PIECES_MIN_COLS or single - need < least * single:
                assert got == (single, 0, 0), (n, vec, es, got)
            else:  # in pieces where two cover the row in fewer lanes
                assert got[2] == 0 and sum(got) <= single and (got[1] > 0) == (sum(got) < single), (n, vec, es, got)


@pytest.mark.parametrize("tuning", TUNINGS)
def test_the_rows_plan_reads_aligned_vectors_only_in_the_bands_of_its_tuning(tuning):
    # from PHASED_ROWS_MIN_COLS whatever the tuning (docs/kernels.md, "Ragged rows"), and in its narrow band (sm_90:
    # 64..128) and its band of odd 16-bit rows (sm_90: 1025-1039), whose edges are read as words as from
    # PHASED_ROWS_MIN_COLS
    t = TUNINGS[tuning]

    def inside(band, n):
        return band is not None and band[0] <= n <= band[1]

    assert (t.narrow_phased is None and t.odd_16bit is None) == (t is DEFAULT)
    for n in range(1, 4200):
        for es in (2, 4):
            odd = es == 2 and n % 2 == 1 and inside(t.odd_16bit, n)
            wide = n >= softmax.PHASED_ROWS_MIN_COLS
            assert softmax._phase_rows(n, es, t) == (wide or inside(t.narrow_phased, n) or odd), (n, es)
            assert softmax._edge_words(n, es, t) == (wide or odd), (n, es)


def test_phased_reads_in_place_where_the_phases_agree_and_copies_where_they_do_not():
    x = torch.randn(4, 64, device=DEVICE)
    r = phased(x, torch.empty_like(x))
    assert (r.vec, r.phase, r.y_out) == (1, 0, None) and r.x is x  # aligned: Triton's own specialisation
    x = torch.randn(4, 50, device=DEVICE, dtype=torch.bfloat16)
    r = phased(x, torch.empty_like(x))
    assert (r.vec, r.phase, r.y_out) == (8, 0, None) and r.x.data_ptr() == x.data_ptr()
    big = torch.randn(4, 60, device=DEVICE)
    x = big[:, 4:54]  # phase 0 (fp32: 4 a vector), stride 60 = 50 + 10, 10 % 4 != 0: copied
    r = phased(x, torch.empty(4, 50, device=DEVICE))
    assert r.x.data_ptr() != big.data_ptr() + 16 and r.stride_x == 50 and r.y_out is None
    x = big[:, 4:56]  # stride 60 = 52 + 8: the phases agree row for row, read in place
    y = torch.empty(4, 52, device=DEVICE)
    r = phased(x, y)
    assert (r.vec, r.phase, r.stride_x, r.stride_y) == (4, 0, 60, 52) and r.x.data_ptr() == x.data_ptr()
    x = big[:, 1:51]  # phase 1 against an output at phase 0: both run on fresh tensors
    r = phased(x, torch.empty(4, 50, device=DEVICE))
    assert r.phase == 0 and r.y_out is None and r.stride_x == 50
    buf = torch.empty(4 * 50 + 1, device=DEVICE)
    r = phased(torch.randn(4, 50, device=DEVICE), buf[1:].view(4, 50))  # an out at phase 1
    assert r.y_out is not None and r.phase == 0


def test_resident_programs_follow_the_compiled_kernels_registers_warps_and_shared_memory():
    from reference_kernels._split_walk import resident_per_sm

    # the H200 figures behind the register caps (docs/kernels.md, "Ragged rows"; ncu occupancy)
    assert resident_per_sm(106, 8, 0) == 2  # the split kernel before its cap: two of the three planned
    assert resident_per_sm(80, 8, 0) == 3
    assert resident_per_sm(95, 16, 0) == 1  # the phased rows kernel before its cap: 25% occupancy
    assert resident_per_sm(57, 16, 0) == 2
    assert resident_per_sm(32, 4, 0) == 16  # threads, not registers, bound it
    assert resident_per_sm(32, 4, 100 * 1024) == 2  # shared memory (with 1 KiB reserved a program)
    assert resident_per_sm(255, 32, 0) == 0  # does not fit at all


def test_a_split_launch_sizes_its_grid_from_the_programs_the_compiled_kernel_keeps_resident(monkeypatch):
    import types

    sms = H200.sms
    monkeypatch.setattr(_split_walk, "interpreting", lambda: False)
    monkeypatch.setattr(_split_walk, "sm_count", lambda device: sms)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: types.SimpleNamespace())
    monkeypatch.setattr(_split_walk, "RESIDENT", {})
    grids = []

    class FakeKernel:
        __name__ = "_fake_split_kernel"

        def __init__(self, regs):
            self.regs = regs

        def warmup(self, *args, grid, **launch):
            return types.SimpleNamespace(n_regs=self.regs, metadata=types.SimpleNamespace(num_warps=launch["num_warps"], shared=0))

        def __getitem__(self, grid):
            return lambda *args, **launch: grids.append((grid, args[-1]))

    unused = torch.empty(1)
    cuda = torch.device("cuda", 0)
    make = lambda part, sync, n_programs: (n_programs,)  # noqa: E731
    assert _split_walk.split_run(FakeKernel(106), make, 100000, 1, 3, cuda, unused, num_warps=8) == 2 * sms
    assert grids[-1] == ((2 * sms,), 2 * sms)  # two resident an SM, not the three planned
    assert _split_walk.split_run(FakeKernel(80), make, 100000, 1, 3, cuda, unused, num_warps=4) == 3 * sms
    assert _split_walk.split_run(FakeKernel(200), make, 100, 1, 1, cuda, unused, num_warps=16) == 100  # one an SM: no check


@pytest.mark.gpu
@pytest.mark.parametrize("plan_mode", ["split", "held"])
@pytest.mark.parametrize("dtype, shape", [(torch.bfloat16, (1024, 128256)), (torch.float32, (512, 262144)), (torch.bfloat16, (512, 262144))], ids=str)
def test_split_plans_finish_with_right_results_while_another_stream_holds_the_sms(dtype, shape, plan_mode):
    """The split walk's programs, and the held plan's slices, wait on each other; with matmuls on another stream
    holding SMs not all of them are resident, and every launch must still finish and be right."""
    x = torch.randn(shape, device="cuda").mul_(4).to(dtype)
    plan = softmax.plan(*shape, x.element_size(), _device.of(x.device), held=plan_mode == "held")
    assert plan.mode == plan_mode and plan.group > 1, plan
    expected = torch.softmax(x.float(), -1).to(dtype)
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) / 90.0
    c = torch.empty_like(a)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(40):  # ~50 ms of work on every SM
            torch.mm(a, a, out=c)
    outs = [poisoned_like(x) for _ in range(5)]
    for out in outs:
        softmax._launch(x, out, plan)
    torch.cuda.synchronize()
    for out in outs:
        assert not out.isnan().any()
        assert_close_to_row_scale(out, expected, dtype)



@triton.jit
def _edge_words_probe(x_ptr, lo_ptr, hi_ptr, col_ptr, x_phase, n_cols, stride, VEC: tl.constexpr):
    """Row r's edges by ``_ragged.edge_words``: each word's two values where they are the row's own (nan
    elsewhere), and the row column of its even element, at out[r, 0:VEC]."""
    row = tl.program_id(0)
    base, ph = row_origin(x_phase, tl.cast(row, tl.int64), stride, VEC)
    lo, hi, v = edge_words(x_ptr, base, ph, n_cols, VEC)
    out = row * VEC + tl.arange(0, 2)[:, None] * (VEC // 2) + tl.arange(0, VEC // 2)[None, :]
    tl.store(lo_ptr + out, tl.where(in_row(v, ph, n_cols), lo, float("nan")))
    tl.store(hi_ptr + out, tl.where(in_row(v + 1, ph, n_cols), hi, float("nan")))
    tl.store(col_ptr + out, v - ph)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("n", [3, 13, 50], ids=["inside one vector", "two vectors, no body", "a body between"])
def test_edge_words_give_every_element_outside_the_body_once_at_every_phase(n, dtype):
    x = torch.randn(24, n, device=DEVICE).to(dtype)  # 8 elements a vector: rows start at every phase
    r = phased(x, torch.empty_like(x))
    assert r.vec == 8
    lo, hi = (torch.empty(24, 8, device=DEVICE) for _ in range(2))
    cols = torch.empty(24, 8, dtype=torch.int32, device=DEVICE)
    _edge_words_probe[(24,)](r.x, lo, hi, cols, r.phase, n, r.stride_x, VEC=8)
    for row in range(24):
        ph = (r.phase + row * r.stride_x) % 8
        first = -(-ph // 8) * 8
        last = max((ph + n) // 8 * 8, first)
        outside = [c for c in range(n) if not first <= ph + c < last]  # the row's columns outside the body
        got = {}
        for values, shift in ((lo[row], 0), (hi[row], 1)):
            for j in range(8):
                if not values[j].isnan():
                    col = int(cols[row, j]) + shift
                    assert col not in got, f"row {row}: column {col} twice"
                    got[col] = float(values[j])
        assert sorted(got) == outside, f"row {row} at phase {ph}"
        assert all(got[c] == float(x[row, c]) for c in outside)


# The held plan (_softmax_held): rows of 16385+ columns in shared memory, a Gluon kernel. It runs on CUDA GPUs only
# (Gluon has no interpreter), so on CPU its plan choice, sizes and fallbacks are tested; the kernel on the GPU. Its
# plans are made for compute capability 9 (the H100 and H200 descriptions), with the tuned choices and variations of
# them: whole rows and rows in slices follow the tuning's bands and the device's shared memory.
HELD_TUNINGS = {**TUNINGS,
                "no aligned fp32 band": dataclasses.replace(TUNED, held_fp32_aligned=()),
                "more programs an SM": dataclasses.replace(TUNED, held_per_sm=(3, 2))}
HELD_PLAN_WIDTHS = sorted({*range(9000, 70000, 1009), 9000, 12288, 12289, 12345, 14001, 16000, 16383, 16384, 16385,
                           17000, 18401, 18432, 21001, 24000, 25049, 26001, 28001, 28672, 29001, 30522, 32000, 32767,
                           32768, 32769, 40001, 40960, 49152, 50257, 56000, 56001, 60000, 60001, 65536, 100003, 128256,
                           151936, 200001, 262144, 600000})


def test_the_held_plan_is_never_available_under_the_interpreter_or_off_cuda():
    if softmax.interpreting() or not torch.cuda.is_available():
        assert not _softmax_held.available()
        for dev in SM90 + [_device.of(torch.device(DEVICE))]:  # the default planner asks available()
            assert softmax.plan(4096, 50257, 2, dev).mode != "held"


def test_the_held_plan_holds_a_row_from_its_aligned_down_start_and_as_many_programs_an_sm_as_shared_memory_fits():
    assert _softmax_held.BLOCK == 2048
    for dev in SM90:
        per_sm = lambda n, es: _softmax_held.per_sm(n, es, device=dev)  # noqa: E731
        # a row and up to 15 bytes before it, in segments of 2048: 50257 + 7 -> 25 segments of 4 KiB, two an SM
        assert _softmax_held.segments(50257, 2) == 25 and per_sm(50257, 2) == 2
        assert _softmax_held.segments(16384, 4) == 9  # 16384 + 3 columns
        assert per_sm(17000, 2) == 4  # 36 KiB rows: four, bounded by 64 registers x 8 warps
        assert per_sm(65536, 2) == 1 and per_sm(30522, 4) == 1
        assert per_sm(120000, 2) == 0  # 236 KiB: over what one block may take
        # fp32 rows of no multiple of 16 columns at three, two, one program an SM, and past what one block may take
        assert [per_sm(n, 4) for n in (18401, 21001, 27470, 28001, 30522, 40001, 60001)] == [3, 2, 2, 2, 1, 1, 0]
    a100 = _device.DESCRIPTIONS["A100"]  # less shared memory an SM: fewer programs
    assert _softmax_held.per_sm(50257, 2, device=a100) < _softmax_held.per_sm(50257, 2, device=H200)


@pytest.mark.parametrize("tuning", HELD_TUNINGS)
@pytest.mark.parametrize("dev", SM90, ids=lambda d: d.name)
def test_rows_are_held_whole_in_the_tuned_bands_where_enough_programs_an_sm_fit(dev, tuning):
    # tuned/90.json (docs/kernels.md, "Rows held in shared memory"): rows wider than MAX_ROW, and 16-bit rows of no
    # multiple of 16 columns from held_ragged_16bit_from (12345 84 -> 90); fp32 rows of a multiple of 16 columns only in
    # held_fp32_aligned (32768 level: the staged plan); where held_per_sm programs an SM fit (16-bit at one an SM mixed,
    # so two). The defaults: every row wider than MAX_ROW that fits. Elsewhere the plan without it.
    t = HELD_TUNINGS[tuning]
    whole_16bit_ragged = set()
    for n in HELD_PLAN_WIDTHS:
        for es in (2, 4):
            p = softmax.plan(4096, n, es, dev, tuning=t, held=True)
            fits = _softmax_held.per_sm(n, es, device=dev) >= t.held_per_sm[es >= 4]
            ragged_16 = es == 2 and n % 16 != 0 and 0 < t.held_ragged_16bit_from <= n
            in_band = es == 2 or n % 16 != 0 or any(lo <= n <= hi for lo, hi in t.held_fp32_aligned)
            whole = fits and (n > softmax.MAX_ROW or ragged_16) and in_band
            if whole:
                assert p == softmax.Plan("held", 1, _softmax_held.BLOCK, _softmax_held.WARPS, 1,
                                         _softmax_held.per_sm(n, es, device=dev), _softmax_held.MAX_REGS), (n, es, p)
                if n <= softmax.MAX_ROW:
                    whole_16bit_ragged.add(n)
            else:
                assert p.mode != "held" or p.group > 1, (n, es, p)
                if p.mode != "held":  # the plan without it
                    assert p == softmax.plan(4096, n, es, dev, tuning=t, held=False), (n, es, p)
            # never where a test forces a plan, nor with held=False
            assert softmax.plan(4096, n, es, dev, tuning=t, held=False).mode != "held"
            assert softmax.plan(4096, n, es, dev, tuning=t, held=True, max_row=4096).mode != "held"
            if n > softmax.MAX_ROW:
                assert softmax.plan(4096, n, es, dev, tuning=t, held=True, wide="persistent").mode == "persistent"
    assert bool(whole_16bit_ragged) == (t.held_ragged_16bit_from > 0)


@pytest.mark.parametrize("tuning", HELD_TUNINGS)
@pytest.mark.parametrize("dev", SM90, ids=lambda d: d.name)
def test_rows_too_wide_to_hold_whole_are_held_in_the_fewest_slices_that_leave_enough_programs_an_sm(dev, tuning):
    # rows wider than MAX_ROW of which fewer than held_per_sm programs an SM hold whole (16-bit past ~56000, fp32 past
    # ~57000 on sm_90) in the fewest slices, up to MAX_SPLIT_GROUP, of which SPLIT_PER_SM programs an SM fit; where none
    # do, the plan without it (docs/kernels.md, "Rows in slices")
    t = HELD_TUNINGS[tuning]
    per_sm = lambda n, es: _softmax_held.per_sm(n, es, device=dev)  # noqa: E731
    sliced = set()
    for n in HELD_PLAN_WIDTHS:
        for es in (2, 4):
            p = softmax.plan(4096, n, es, dev, tuning=t, held=True)
            shapes = [_softmax_held.split_shape(n, es, asked) for asked in range(2, softmax.MAX_SPLIT_GROUP + 1)]
            enough = [group for group, cols in shapes if group > 1 and per_sm(cols, es) >= softmax.SPLIT_PER_SM]
            if n > softmax.MAX_ROW and per_sm(n, es) < t.held_per_sm[es >= 4] and enough:
                sliced.add((n, es))
                group, slice_cols = _softmax_held.split_shape(n, es, p.group)
                assert (p.mode, p.group, p.block_n, p.num_warps, p.max_regs) == (
                    "held", min(enough), _softmax_held.BLOCK, _softmax_held.WARPS, _softmax_held.MAX_REGS), (n, es, p)
                assert group == p.group and p.per_sm == per_sm(slice_cols, es) >= softmax.SPLIT_PER_SM
            else:
                assert p.mode != "held" or p.group == 1, (n, es, p)
    assert sliced and ((50257, 2) in sliced) == (t.held_per_sm[0] > 2)  # 16-bit rows two programs an SM hold
    assert softmax.plan(4096, 600000, 2, dev, tuning=t, held=True).mode == "split"  # 16 slices leave two an SM
    # slices of a multiple of 16 bytes (each with its row's phase), none empty, the last one what is left
    assert _softmax_held.split_shape(128256, 2, 4) == (4, 32064)
    assert _softmax_held.split_shape(50257, 2, 2) == (2, 25136) and 25136 % 8 == 0 and 50257 - 25136 > 0
    assert _softmax_held.split_shape(10, 4, 8) == (3, 4)  # 4 + 4 + 2: fewer slices than asked, none empty
    assert _softmax_held.split_shape(100, 2, 1) == (1, 104)


def test_the_held_split_launcher_refuses_rows_it_cannot_take_with_a_clear_error():
    x = torch.randn(3, 40)
    with pytest.raises(ValueError, match="whose slices fit shared memory"):
        _softmax_held.launch_split(x, torch.empty_like(x), 4)
    assert not _softmax_held.split_fits(x, torch.empty_like(x), 4)  # CPU tensors


def test_a_held_plan_falls_back_to_the_plan_without_it_where_the_kernel_does_not_take_the_rows(monkeypatch):
    # off CUDA (here), and on the GPU for rows that do not lie packed or start off the 16-byte grid (a column slice):
    # the launcher runs the plan the planner gives without "held", with the same result
    big = torch.randn(5, 48, device=DEVICE)
    x = big[:, 1:41]
    assert not _softmax_held.fits(x, torch.empty(5, 40, device=DEVICE))
    for group in (1, 4):
        plan = softmax.Plan("held", 1, _softmax_held.BLOCK, _softmax_held.WARPS, group, per_sm=2, max_regs=64,
                            device=_device.of(x.device))
        calls = []
        monkeypatch.setattr(_softmax_held, "launch", lambda *args: calls.append(args))
        monkeypatch.setattr(_softmax_held, "launch_split", lambda *args: calls.append(args))
        out = poisoned_like(x)
        softmax._launch(x, out, plan)
        assert not calls
        assert_close_to_row_scale(out, reference(x), torch.float32)


def test_the_held_launcher_gives_each_row_its_own_program(monkeypatch, recorded_kernel):
    # a program a row: the block scheduler hands the next row to whichever SM frees room (docs/kernels.md, "A program
    # a row")
    kernel = recorded_kernel
    monkeypatch.setattr(_softmax_held, "_softmax_held_kernel", kernel, raising=False)  # absent without Gluon
    monkeypatch.setattr(_softmax_held, "fits", lambda x2, y2: True)
    x = torch.empty(5000, 30522, dtype=torch.bfloat16)
    _softmax_held.launch(x, torch.empty_like(x))
    (grid, kwargs), = kernel.launches
    assert grid == (5000,) and kwargs["NSEG"] == 15 and kwargs["VEC"] == 8


def test_the_held_split_launcher_gives_each_slice_its_own_program(monkeypatch, recorded_kernel):
    # a program a slice, each taking its tile's ticket as it starts (docs/kernels.md, "Rows in slices")
    kernel = recorded_kernel
    monkeypatch.setattr(_softmax_held, "_softmax_held_split_kernel", kernel, raising=False)  # absent without Gluon
    monkeypatch.setattr(_softmax_held, "split_fits", lambda x2, y2, group: True)
    monkeypatch.setattr(_split_walk, "interpreting", lambda: False)
    x = torch.empty(1000, 128256, dtype=torch.bfloat16)
    _softmax_held.launch_split(x, torch.empty_like(x), 4)
    (grid, kwargs), = kernel.launches
    assert grid == (4 * 1000,)  # 32064-column slices
    assert kwargs["GROUP"] == 4 and kwargs["NSEG"] == 16
    assert kwargs["SPIN"] == _split_walk.spin_asm(_softmax_held.SPIN_MAX_NS) and "min.u32 %ns, %ns, 256" in kwargs["SPIN"]
    monkeypatch.setattr(_softmax_held, "SPIN_MAX_NS", 0)  # no back-off: the wait's loop without nanosleep
    _softmax_held.launch_split(x, torch.empty_like(x), 4)
    assert "nanosleep" not in kernel.launches[-1][1]["SPIN"] and "ld.acquire.gpu" in kernel.launches[-1][1]["SPIN"]


def test_the_held_launcher_refuses_rows_it_cannot_take_with_a_clear_error():
    x = torch.randn(3, 40)
    with pytest.raises(ValueError, match="packed, 16-byte aligned CUDA rows"):
        _softmax_held.launch(x, torch.empty_like(x))


HELD_WIDTHS = [(torch.bfloat16, 12345), (torch.float16, 14001), (torch.float16, 32768), (torch.bfloat16, 16385), (torch.bfloat16, 17000), (torch.float16, 30522), (torch.bfloat16, 33000),
               (torch.bfloat16, 50257), (torch.float16, 50257), (torch.bfloat16, 56000), (torch.float32, 16385),
               (torch.float32, 17001), (torch.float32, 21001),  # fp32 whole: 3, 2 programs an SM
               (torch.float32, 30522), (torch.float32, 40001), (torch.float32, 56001),  # and one (the widest)
               # in slices (2, 4, 5, 6 of 16-bit; 4, 4, 6 of fp32), vocabularies and odd widths
               (torch.bfloat16, 60000), (torch.bfloat16, 128256), (torch.float16, 151936), (torch.bfloat16, 200001),
               (torch.float32, 65536), (torch.float32, 60001), (torch.float32, 100003),
               (torch.float32, 18432), (torch.float32, 28672),  # fp32 aligned, whole: three and two an SM
               (torch.float32, 32000), (torch.float32, 49152)]  # and one


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 3, 301])
@pytest.mark.parametrize("dtype, n", HELD_WIDTHS, ids=str)
def test_the_held_plan_matches_torch_and_writes_every_element_with_nan_and_inf_rows_as_torch(dtype, n, rows):
    dev = _device.of(torch.device("cuda"))
    assert softmax.plan(rows, n, torch.tensor([], dtype=dtype).element_size(), dev).mode == "held"
    x = torch.randn(rows, n, device="cuda").mul_(4).to(dtype)
    if rows > 1:
        x[1, : n // 2] = -float("inf")  # zeros there
        x[1, n - 1] = 60.0  # a large logit at the row's last element (an edge)
        x[2, 0] = float("nan")  # the row is nan
    out = poisoned_like(x)
    softmax.fused(x, out=out)
    expected = torch.softmax(x.float(), -1).to(dtype)
    if rows > 2:
        assert out[2].isnan().all()
        out, expected = torch.cat([out[:2], out[3:]]), torch.cat([expected[:2], expected[3:]])
    assert not out.isnan().any(), "an output element was left unwritten"
    assert_close_to_row_scale(out, expected, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, fill", [(torch.float32, torch.finfo(torch.float32).min), (torch.float32, -1.5e38),
                                         (torch.bfloat16, torch.finfo(torch.bfloat16).min), (torch.bfloat16, -1.5e38),
                                         (torch.bfloat16, -1e30), (torch.float16, torch.finfo(torch.float16).min)],
                         ids=str)
@pytest.mark.parametrize("n", [50257, 128256], ids=["whole rows", "in slices"])
def test_the_held_plan_gives_a_fully_masked_row_at_a_huge_negative_value_the_uniform_softmax(dtype, fill, n):
    # an attention-style mask at finfo.min over a whole row: torch gives 1/N. A running max that starts above the
    # row's values (the first one-pass version started at -1e38) gave nan; so did 16-bit exponents folded into one
    # FMA, x log2(e) - max log2(e), which lose |max| 2^-24 of the exponent (1e31 at -1.5e38; docs/kernels.md)
    x = torch.randn(4, n if dtype != torch.float32 else {50257: 17001, 128256: 65536}[n], device="cuda").to(dtype)
    x[1] = fill
    x[2, 5:] = fill  # five real logits, the rest masked
    plan = softmax.plan(4, x.shape[1], x.element_size(), _device.of(x.device))
    assert plan.mode == "held" and (plan.group > 1) == (n == 128256)
    out = softmax.fused(x)
    expected = torch.softmax(x.float(), -1).to(dtype)
    assert not out.isnan().any()
    assert_close_to_row_scale(out, expected, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [50257, 128256], ids=["whole rows", "in slices"])
def test_the_held_plan_gives_rows_of_minus_inf_and_of_plus_inf_as_torch(n):
    x = torch.randn(4, n, device="cuda").bfloat16()
    x[0] = -float("inf")
    x[1, 7] = float("inf")
    out = softmax.fused(x)
    expected = torch.softmax(x.float(), -1).bfloat16()
    assert out[:2].isnan().all() and expected[:2].isnan().all()
    assert_close_to_row_scale(out[2:], expected[2:], torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("offset", [1, 8], ids=["off the 16-byte grid", "aligned, not packed"])
def test_the_held_plan_falls_back_on_rows_of_a_wider_tensor_on_the_gpu(offset):
    big = torch.randn(64, 50257 + 16, device="cuda").bfloat16()
    x = big[:, offset:offset + 50257]
    assert not _softmax_held.fits(x, torch.empty(x.shape, device="cuda", dtype=x.dtype))
    assert_close_to_row_scale(softmax.fused(x), torch.softmax(x.float(), -1).bfloat16(), torch.bfloat16)


@pytest.mark.gpu
def test_the_held_plan_keeps_full_float32_precision_at_large_logits():
    # exponents as (x - max) log2(e): the folded x log2(e) - max log2(e) loses |max| 2^-24 (6e-4 at 1e4)
    x = torch.randn(64, 17001, device="cuda", dtype=torch.float64).mul_(3).add_(1e4)
    assert softmax.plan(64, 17001, 4, _device.of(x.device)).mode == "held"
    out = softmax.fused(x.float())
    expected = torch.softmax(x.float().double(), -1)
    assert ((out.double() - expected).abs() / expected).max().item() < 2e-5
