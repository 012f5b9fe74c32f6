"""reference_kernels.gemm_epilogue: act(a @ b + bias) + residual against mm, add, act, add.

Without a GPU the kernels run under Triton's interpreter (tests/conftest.py) with 32x32x16
tiles, so small shapes still span several tiles and ragged edges. On a GPU, shapes whose
K and N are multiples of 8 take the TMA persistent kernel on sm_90+ and the others the
tiled kernel; ``_gemm_path`` says which, and a test checks that choice.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from types import SimpleNamespace

import pytest
import torch

from reference_kernels import _device, _gemm_common, _gemm_kernels, _gemm_ws
from reference_kernels import gemm_epilogue as ge
from reference_kernels._common import interpreting

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
H200 = _device.DESCRIPTIONS["H200"]  # the GPU the config lists were measured on
# Fused (fp32 epilogue, one rounding) against unfused (rounded to the dtype after every op).
TOLERANCES = {
    torch.float16: dict(atol=4e-3, rtol=4e-3),
    torch.bfloat16: dict(atol=3e-2, rtol=2e-2),
}

CASES = [
    # (M, N, K), dtype, bias, activation, residual
    ((70, 56, 40), torch.bfloat16, True, "gelu", True),  # every epilogue step; ragged M and K tiles
    ((67, 45, 33), torch.bfloat16, True, "gelu", False),  # N, K not multiples of 8: tiled path on GPU
    ((96, 64, 48), torch.float16, False, "relu", True),  # relu with residual, no bias
    ((33, 17, 9), torch.float16, False, None, True),  # plain matmul plus residual, K under one tile
    ((64, 40, 24), torch.float16, True, None, False),  # bias only
    ((1, 8, 8), torch.bfloat16, True, "relu", False),  # a single row
    ((40, 24, 0), torch.bfloat16, True, "gelu", True),  # K = 0: the epilogue of a zero product
]


def operands(M, N, K, dtype, bias=True, residual=True, device=DEVICE):
    a = torch.randn(M, K, device=device).to(dtype)
    b = (torch.randn(K, N, device=device) / max(K, 1) ** 0.5).to(dtype)
    c = torch.randn(N, device=device).to(dtype) if bias else None
    r = torch.randn(M, N, device=device).to(dtype) if residual else None
    return a, b, c, r


def poisoned(M, N, dtype):
    return torch.full((M, N), float("nan"), dtype=dtype, device=DEVICE)


@pytest.mark.parametrize("mnk, dtype, has_bias, activation, has_residual", CASES, ids=str)
def test_fused_matches_the_four_op_reference_and_writes_every_element(mnk, dtype, has_bias, activation, has_residual):
    a, b, bias, residual = operands(*mnk, dtype, has_bias, has_residual)
    out = poisoned(mnk[0], mnk[1], dtype)
    y = ge.fused(a, b, bias, activation, residual, out=out)
    assert y is out
    assert not y.isnan().any(), "an output element was left unwritten"
    torch.testing.assert_close(y, ge.unfused(a, b, bias, activation, residual), **TOLERANCES[dtype])


def test_the_output_fused_allocates_itself_has_every_element_written(unwritten_reads_nan):
    a, b, bias, residual = operands(70, 56, 40, torch.bfloat16)  # ragged M and K tiles
    y = ge.fused(a, b, bias, "gelu", residual)
    assert not y.isnan().any(), "an output element was left unwritten"
    torch.testing.assert_close(y, ge.unfused(a, b, bias, "gelu", residual), **TOLERANCES[torch.bfloat16])


@pytest.mark.parametrize("path", ["tiled", "tma"])
def test_each_kernel_writes_every_output_element(path):
    if path == "tma" and DEVICE == "cuda" and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("TMA needs sm_90")
    M, N, K = 70, 56, 40
    a, b, bias, residual = operands(M, N, K, torch.bfloat16)
    out = poisoned(M, N, torch.bfloat16)
    ge._run(a, b, out, bias, residual, ge._activation_code("gelu"), path=path)
    assert not out.isnan().any(), "an output element was left unwritten"
    torch.testing.assert_close(out, ge.unfused(a, b, bias, "gelu", residual), **TOLERANCES[torch.bfloat16])


def test_the_split_epilogue_stores_both_column_halves_of_each_tile():
    if DEVICE == "cuda" and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("TMA needs sm_90")
    config = (32, 32, 16, 2, 2, 1, 1, 1, 1) if interpreting() else (128, 256, 64, 8, 2, 3, 8, 1, 1)
    M, N, K = (50, 48, 24) if interpreting() else (200, 400, 72)
    a, b, bias, residual = operands(M, N, K, torch.float16)
    out = poisoned(M, N, torch.float16)
    ge._run(a, b, out, bias, residual, ge._activation_code("relu"), path="tma", config=config)
    assert not out.isnan().any(), "an output element was left unwritten"
    torch.testing.assert_close(out, ge.unfused(a, b, bias, "relu", residual), **TOLERANCES[torch.float16])


@pytest.mark.parametrize("per_sm, split, stages", [(1, 1, 1), (2, 2, 3), (2, 1, 2)], ids=str)
def test_a_persistent_grid_of_one_or_two_programs_an_sm_writes_every_tile(per_sm, split, stages):
    """Each program walks tiles with a stride of programs-an-SM x SMs (the interpreter counts 3 SMs)."""
    if DEVICE == "cuda" and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("TMA needs sm_90")
    if interpreting():
        config, (M, N, K) = (32, 32, 16, 2, split, 1, 1, per_sm, 1), (150, 136, 40)  # 25 tiles over 3 or 6 programs
    else:
        config, (M, N, K) = (128, 128, 64, 8, split, stages, 8, per_sm, 1), (2200, 4104, 136)  # 594 tiles, ragged edges
    a, b, bias, residual = operands(M, N, K, torch.bfloat16)
    out = poisoned(M, N, torch.bfloat16)
    ge._run(a, b, out, bias, residual, ge._activation_code("gelu"), path="tma", config=config)
    assert not out.isnan().any(), "an output element was left unwritten"
    torch.testing.assert_close(out, ge.unfused(a, b, bias, "gelu", residual), **TOLERANCES[torch.bfloat16])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("degree", [9, 7, 5])
def test_every_exact_gelu_fit_stays_within_one_ulp_of_torch_gelu(degree, dtype):
    """a @ I is exact in the fp32 accumulator, so the output is GELU(a + bias) rounded once: within
    one ulp of the float64 GELU of the same values, from the far negative tail to large inputs."""
    x = torch.linspace(-10, 10, 64 * 32, device=DEVICE).reshape(64, 32)
    a, bias = x.to(dtype), (torch.rand(32, device=DEVICE) - 0.5).to(dtype)
    eye = torch.eye(32, device=DEVICE, dtype=dtype)
    out = poisoned(64, 32, dtype)
    for path in ("tiled", "tma") if DEVICE == "cpu" or torch.cuda.get_device_capability()[0] >= 9 else ("tiled",):
        ge._run(a, eye, out, bias, None, ge._activation_code("gelu"), path=path, gelu_degree=degree)
        v = a.double() + bias.double()
        want = (v * 0.5 * torch.special.erfc(-v / 2**0.5)).to(dtype)  # F.gelu's 1 + erf cancels to 0 below -8
        ulp = want.float().abs().clamp_min(torch.finfo(dtype).tiny) * torch.finfo(dtype).eps
        apart = ((out.float() - want.float()).abs() / ulp).round()
        assert apart.max().item() <= 1, f"{path}: {apart.max().item()} ulps from the exact GELU"


def test_an_unknown_gelu_fit_degree_is_refused():
    a, b, bias, _ = operands(16, 16, 16, torch.bfloat16, residual=False)
    with pytest.raises(ValueError, match="degree 6"):
        ge._run(a, b, poisoned(16, 16, torch.bfloat16), bias, None, ge._activation_code("gelu"), gelu_degree=6)


def test_a_transposed_weight_is_read_in_place_and_gives_the_same_result():
    a, _, bias, _ = operands(48, 40, 32, torch.bfloat16, residual=False)
    weight = torch.randn(40, 32, device=DEVICE).div(32**0.5).to(torch.bfloat16)  # nn.Linear layout (N, K)
    y = ge.fused(a, weight.T, bias, "gelu")
    torch.testing.assert_close(y, ge.unfused(a, weight.T.contiguous(), bias, "gelu"), **TOLERANCES[torch.bfloat16])


def test_a_row_strided_a_gives_the_same_result_as_its_contiguous_copy():
    big = torch.randn(40, 64, device=DEVICE).to(torch.float16)
    a = big[:, :24]  # row stride 64, 24 columns
    _, b, bias, _ = operands(40, 16, 24, torch.float16, residual=False)
    torch.testing.assert_close(ge.fused(a, b, bias, "relu"), ge.fused(a.contiguous(), b, bias, "relu"))


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # interpreter: exp(-2u) = inf is intended
def test_tanh_gelu_matches_torch_tanh_gelu_and_differs_from_exact_gelu():
    a, b, bias, _ = operands(64, 48, 32, torch.float16, residual=False)
    a = a * 3
    tanh = ge.fused(a, b, bias, "gelu", approximate="tanh")
    torch.testing.assert_close(tanh, ge.unfused(a, b, bias, "gelu", approximate="tanh"), **TOLERANCES[torch.float16])
    assert (tanh.float() - ge.fused(a, b, bias, "gelu").float()).abs().max() > 1e-3


@pytest.mark.parametrize("activation", [None, "relu", "gelu"])
def test_nan_in_a_turns_its_output_row_nan_as_in_torch(activation):
    a, b, bias, residual = operands(40, 32, 24, torch.bfloat16)
    a[3, 5] = float("nan")
    y = ge.fused(a, b, bias, activation, residual)
    ref = ge.unfused(a, b, bias, activation, residual)
    assert y[3].isnan().all()
    assert torch.equal(y.isnan(), ref.isnan())


@pytest.mark.parametrize("activation", [None, "relu"])
def test_inf_in_a_gives_the_inf_and_nan_pattern_torch_gives(activation):
    a, b, _, _ = operands(40, 32, 24, torch.float16, residual=False)
    a[2, 0] = float("inf")
    a[7, 1] = -float("inf")
    y, ref = ge.fused(a, b, None, activation), ge.unfused(a, b, None, activation)
    assert torch.equal(y.isnan(), ref.isnan())
    assert torch.equal(y.isinf(), ref.isinf())
    assert torch.equal(y[y.isinf()], ref[ref.isinf()])


@pytest.mark.gpu
def test_gelu_of_plus_inf_is_inf_and_of_minus_inf_is_nan_as_torch_cuda_gives():
    # torch's CPU GELU returns NaN for +inf; its CUDA kernel and ours return +inf.
    a = torch.zeros(16, 16, device=DEVICE, dtype=torch.bfloat16)
    b = torch.eye(16, device=DEVICE, dtype=torch.bfloat16)
    bias = torch.zeros(16, device=DEVICE, dtype=torch.bfloat16)
    bias[0], bias[1] = float("inf"), -float("inf")
    y, ref = ge.fused(a, b, bias, "gelu"), ge.unfused(a, b, bias, "gelu")
    assert torch.equal(y.isnan(), ref.isnan()) and torch.equal(y.isinf(), ref.isinf())
    assert (y[:, 0] == float("inf")).all() and y[:, 1].isnan().all()


@pytest.mark.gpu
@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("approximate", ["tanh", "none"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_each_gelu_code_rounds_as_float64_gelu_from_tail_to_tail(monkeypatch, dtype, approximate, fast):
    """Both GELUs with and without PTX fast-math (``_gemm_common.TANH_FAST``, ``EXACT_FAST``: codes 4 and 5 on
    CUDA): a @ I + bias is a + bias exactly, so each output is the epilogue's GELU of one input,
    checked against torch's float64 GELU rounded to the dtype (torch's float32 tanh form loses
    1 + tanh(u) to cancellation in the tail) over [-12, 12], where the tail underflows, and at
    +-inf and NaN."""
    monkeypatch.setattr(_gemm_common, "TANH_FAST", fast)
    monkeypatch.setattr(_gemm_common, "EXACT_FAST", fast)
    n = 256
    x = torch.linspace(-12, 12, 64 * n, device=DEVICE).reshape(64, n)
    x[:, :3] = 0.0  # columns 0-2 take +inf, -inf and NaN from the bias (in a, inf * 0 would spread NaN)
    a = x.to(dtype)
    b = torch.eye(n, device=DEVICE, dtype=dtype)
    bias = torch.zeros(n, device=DEVICE, dtype=dtype)
    bias[:3] = torch.tensor([float("inf"), -float("inf"), float("nan")])
    y = torch.empty(64, n, device=DEVICE, dtype=dtype)
    code = ge._activation_code("gelu", approximate)
    kernel = ge._gemm_configs(ge._gemm_path(a, b, y), 64, n, n, dtype, a.device)[0]  # ours, not the library's path
    ge._run(a, b, y, bias, None, code, config=kernel)
    assert (y[:, 0] == float("inf")).all() and y[:, 1:3].isnan().all()
    ref = torch.nn.functional.gelu(a.double() + bias.double(), approximate=approximate).to(dtype)
    ulp = 2**-7 if dtype == torch.bfloat16 else 2**-10
    torch.testing.assert_close(y[:, 3:], ref[:, 3:], atol=1e-6, rtol=ulp)
    # the library's paths: after cuBLAS's product our epilogue, as exact; cuBLASLt's tanh GELU loses 1 + tanh(u) to
    # cancellation in the negative tail (fp16: 8 ulps of outputs under 1e-5, docs/kernels.md, "gemm_epilogue")
    for config in ge._LIBRARIES if approximate == "tanh" else (ge.LIBRARY,):
        ge._run(a, b, y, bias, None, code, config=config)
        assert (y[:, 0] == float("inf")).all() and y[:, 1:3].isnan().all()
        torch.testing.assert_close(y[:, 3:], ref[:, 3:], atol=1e-5 if config == ge.LIBRARY_LT else 1e-6, rtol=ulp)


def test_fast_math_gelu_codes_are_chosen_by_their_flags(monkeypatch):
    for tanh_fast, exact_fast in [(True, True), (True, False), (False, True), (False, False)]:
        monkeypatch.setattr(_gemm_common, "TANH_FAST", tanh_fast)
        monkeypatch.setattr(_gemm_common, "EXACT_FAST", exact_fast)
        assert _gemm_common.fast_activation(ge._activation_code("gelu", "tanh")) == (4 if tanh_fast else 3)
        assert _gemm_common.fast_activation(ge._activation_code("gelu")) == (5 if exact_fast else 2)
        assert _gemm_common.fast_activation(ge._activation_code("relu")) == 1
        assert _gemm_common.fast_activation(ge._activation_code(None)) == 0


@pytest.mark.gpu
def test_a_large_problem_is_tuned_over_the_config_list_and_still_matches():
    a, b, bias, _ = operands(1024, 1024, 1024, torch.bfloat16, residual=False)
    out = torch.full((1024, 1024), float("nan"), device=DEVICE, dtype=torch.bfloat16)
    path, config = ge._run(a, b, out, bias, None, ge._activation_code("gelu"))
    assert config in ge._gemm_configs(path, 1024, 1024, 1024, torch.bfloat16, a.device)
    torch.testing.assert_close(out, ge.unfused(a, b, bias, "gelu"), **TOLERANCES[torch.bfloat16])


@pytest.mark.gpu
def test_aligned_operands_take_the_tma_path_on_hopper_and_ragged_ones_the_tiled_path():
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("TMA needs sm_90")
    a, b, _, _ = operands(64, 64, 64, torch.bfloat16)
    out = torch.empty(64, 64, device=DEVICE, dtype=torch.bfloat16)
    assert ge._gemm_path(a, b, out) == "tma"
    assert ge._gemm_path(a, b.T.contiguous().T, out) == "tma"  # K-major b (a transposed weight)
    a2, b2, _, _ = operands(64, 60, 36, torch.bfloat16)  # 36 * 2 bytes is not a multiple of 16
    assert ge._gemm_path(a2, b2, torch.empty(64, 60, device=DEVICE, dtype=torch.bfloat16)) == "tiled"


# --------------------------------------------------------------------------- bad input


def test_bad_input_raises_a_clear_error():
    a, b, bias, residual = operands(8, 16, 8, torch.bfloat16)
    cases = [
        ((a.double(), b.double()), {}, TypeError, "dtype float64"),
        ((a, b.half()), {}, TypeError, "share a dtype"),
        ((a[0], b), {}, ValueError, "2 dimension"),
        ((a, b[:4]), {}, ValueError, "inner dimensions"),
        ((a, b, bias[:8]), {}, ValueError, r"bias must have shape \(16,\)"),
        ((a, b, bias.half()), {}, TypeError, "bias has dtype"),
        ((a, b, bias), {"residual": residual[:, :8]}, ValueError, r"residual must have shape \(8, 16\)"),
        ((a, b), {"activation": "silu"}, ValueError, "unknown activation 'silu'"),
        ((a, b), {"approximate": "fast"}, ValueError, "unknown approximate"),
        ((a, b), {"activation": "relu", "approximate": "tanh"}, ValueError, "'gelu' only"),
        (("a", b), {}, TypeError, "must be a torch.Tensor"),
        ((a, b), {"out": residual.T}, ValueError, "out must be a contiguous"),
    ]
    for args, kwargs, error, message in cases:
        with pytest.raises(error, match=message):
            ge.fused(*args, **kwargs)


def test_cpu_tensors_are_refused_when_the_interpreter_is_off(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    a, b, _, _ = operands(8, 8, 8, torch.float16, device="cpu")
    with pytest.raises(ValueError, match="CUDA"):
        ge.fused(a, b)


# --------------------------------------------------------------------------- budget


def traffic_comments(fn):
    """(code, read elements, write elements) of each '# read ... ; write ...' comment in fn."""

    def count(expr, dims):
        total = 0
        for term in expr.replace("elements", "").split("+"):
            coef, letters = re.fullmatch(r"\s*(\d*)([A-Z]+)\s*", term).groups()
            value = int(coef or 1)
            for letter in letters:
                value *= dims[letter]
            total += value
        return total

    lines = []
    for line in inspect.getsource(fn).splitlines():
        m = re.search(r"^\s*(.*?)\s*# read (.*) ; write (.*)$", line)
        if m:
            lines.append((m.group(1), lambda d, r=m.group(2), w=m.group(3): (count(r, d), count(w, d))))
    return lines


def test_unfused_traffic_comments_add_up_to_the_four_op_chain():
    dims = dict(M=300, N=200, K=100)
    ops = [(code, f(dims)) for code, f in traffic_comments(ge.unfused) if "relu" not in code]
    ops_called = [code.split("=")[1].strip().split("(")[0] for code, _ in ops]
    assert ops_called == ["torch.mm", "y + bias", "F.gelu", "y + residual"]
    reads = sum(r for _, (r, _) in ops)
    writes = sum(w for _, (_, w) in ops)
    M, N, K = 300, 200, 100
    assert (reads, writes) == (M * K + K * N + 4 * M * N + N, 4 * M * N)


@pytest.mark.parametrize("has_bias, has_residual", [(False, False), (True, False), (True, True)])
def test_budget_reads_each_operand_once_and_writes_the_output_once(has_bias, has_residual):
    M, N, K = 4096, 1024, 512
    meta = dict(device="meta", dtype=torch.bfloat16)
    a, b = torch.empty(M, K, **meta), torch.empty(K, N, **meta)
    bias = torch.empty(N, **meta) if has_bias else None
    residual = torch.empty(M, N, **meta) if has_residual else None
    got = ge.budget(a, b, bias, "gelu", residual)
    assert got.read_bytes == 2 * (M * K + K * N + has_bias * N + has_residual * M * N)
    assert got.write_bytes == 2 * M * N


def test_budget_is_the_unfused_traffic_less_three_round_trips_of_the_intermediate():
    M, N, K = 4096, 1024, 512
    meta = dict(device="meta", dtype=torch.bfloat16)
    a, b, bias, residual = (torch.empty(s, **meta) for s in ((M, K), (K, N), (N,), (M, N)))
    dims = dict(M=M, N=N, K=K)
    unfused_bytes = 2 * sum(sum(f(dims)) for code, f in traffic_comments(ge.unfused) if "relu" not in code)
    assert unfused_bytes - ge.budget(a, b, bias, "gelu", residual).total == 2 * 6 * M * N


def test_launch_metadata_declares_the_budget_bytes():
    a, b, bias, residual = operands(64, 32, 16, torch.float16)
    out = torch.empty(64, 32, device=DEVICE, dtype=torch.float16)
    args = dict(M=64, N=32, K=16, c_ptr=out, HAS_BIAS=True, HAS_RESIDUAL=True)
    meta = _gemm_common._launch_metadata((1,), SimpleNamespace(name="_gemm_epilogue_kernel"), args)
    assert meta["bytes"] == ge.budget(a, b, bias, "gelu", residual).total
    assert meta["flops"] == 2 * 64 * 32 * 16


# --------------------------------------------------------------------------- split-K


def _split_config(split):
    """A split-K config small enough for the interpreter (32x32x16 tiles), or a GPU one."""
    return (32, 32, 16, 2, 1, 1, 1, 1, split) if interpreting() else (64, 128, 64, 8, 1, 4, 4, 1, split)


SPLIT_CASES = [
    # (M, N, K), dtype, bias, activation, residual, split: ragged M/N tiles and uneven K ranges
    ((50, 40, 88), torch.bfloat16, True, "gelu", True, 4),  # 6 K steps (interpreter) in ranges of 1, 2, 1, 2
    ((70, 56, 72), torch.float16, False, "relu", True, 3),
    ((33, 48, 64), torch.bfloat16, True, None, False, 2),
    ((40, 24, 96), torch.float16, False, None, False, 2),  # the plain product: the epilogue pass only sums
    ((1, 64, 96), torch.bfloat16, True, "gelu", False, 3),  # one row (decode): Triton passes an M of 1 as an int
]


@pytest.mark.parametrize("path", ["tiled", "tma"])
@pytest.mark.parametrize("mnk, dtype, has_bias, activation, has_residual, split", SPLIT_CASES, ids=str)
def test_split_k_sums_every_k_range_and_applies_the_epilogue_once(path, mnk, dtype, has_bias, activation,
                                                                   has_residual, split):
    if path == "tma" and DEVICE == "cuda" and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("TMA needs sm_90")
    M, N, K = mnk if interpreting() else (mnk[0] * 4, mnk[1] * 8, mnk[2] * 16)
    a, b, bias, residual = operands(M, N, K, dtype, has_bias, has_residual)
    out = poisoned(M, N, dtype)
    ge._run(a, b, out, bias, residual, ge._activation_code(activation), path=path, config=_split_config(split))
    assert not out.isnan().any(), "an output element was left unwritten"
    # An epilogue applied per range (bias added split times, GELU of partial sums) would be far off.
    torch.testing.assert_close(out, ge.unfused(a, b, bias, activation, residual), **TOLERANCES[dtype])


def test_split_k_is_deterministic_and_agrees_with_one_range():
    a, b, bias, residual = operands(50, 40, 88, torch.bfloat16)
    code = ge._activation_code("gelu")
    outs = []
    for split in (3, 3, 1):
        out = poisoned(50, 40, torch.bfloat16)
        ge._run(a, b, out, bias, residual, code, path="tiled", config=_split_config(split))
        outs.append(out)
    assert torch.equal(outs[0], outs[1]), "the K ranges are summed in a fixed order"
    torch.testing.assert_close(outs[0], outs[2], **TOLERANCES[torch.bfloat16])


def test_a_split_larger_than_the_k_steps_is_clamped_and_k_zero_still_gets_its_epilogue():
    for K in (16, 0):  # one K step (interpreter) or none: a single range
        a, b, bias, residual = operands(40, 24, K, torch.bfloat16)
        out = poisoned(40, 24, torch.bfloat16)
        ge._run(a, b, out, bias, residual, ge._activation_code("gelu"), path="tiled", config=_split_config(8))
        assert not out.isnan().any()
        torch.testing.assert_close(out, ge.unfused(a, b, bias, "gelu", residual), **TOLERANCES[torch.bfloat16])


@pytest.mark.parametrize("has_bias, has_residual", [(False, False), (True, True)])
def test_the_split_k_launches_declare_the_budget_plus_the_fp32_partials_written_and_read(has_bias, has_residual):
    M, N, K, S = 64, 32, 48, 3
    a, b, bias, residual = operands(M, N, K, torch.float16, has_bias, has_residual)
    out = torch.empty(M, N, device=DEVICE, dtype=torch.float16)
    main = _gemm_kernels._splitk_metadata((1,), SimpleNamespace(name="_gemm_splitk_kernel"), dict(M=M, N=N, K=K, SPLIT_K=S, a=a))
    kernel = SimpleNamespace(name="_splitk_epilogue_kernel")
    ws = torch.empty(S, M, N, device=DEVICE)
    epi = _gemm_kernels._splitk_epilogue_metadata((1,), kernel, dict(M=M, N=N, SPLIT_K=S, ws_ptr=ws, c_ptr=out, HAS_BIAS=has_bias,
                                                          HAS_RESIDUAL=has_residual))
    partials = 4 * S * M * N
    assert main["bytes"] + epi["bytes"] == ge.budget(a, b, bias, "gelu", residual).total + 2 * partials
    assert main["bytes"] == 2 * (M * K + K * N) + partials
    assert main["flops"] == 2 * M * N * K and epi["flops"] == (S - 1) * M * N
    assert "split=3" in main["name"] and "split=3" in epi["name"]
    # the library's path: the epilogue reads the product cuBLAS wrote into out (its dtype), in place
    lib = _gemm_kernels._splitk_epilogue_metadata((1,), kernel, dict(M=M, N=N, SPLIT_K=1, ws_ptr=out, c_ptr=out, HAS_BIAS=False,
                                                          HAS_RESIDUAL=has_residual))
    assert lib["bytes"] == 2 * 2 * M * N + (2 * M * N if has_residual else 0)


# --------------------------------------------------------------------------- config choice


SWEEP_SHAPES = [(m, k, n) for m in (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
                for k, n in ((768, 3072), (3072, 768), (4096, 4096), (4096, 11008), (11008, 4096), (4096, 14336),
                             (5120, 13824), (8192, 28672))]


@pytest.mark.parametrize("dev", [d for d in _device.DESCRIPTIONS.values() if d.arch >= 90], ids=lambda d: d.name)
@pytest.mark.parametrize("elt", [2, 4])
def test_every_ranked_config_is_launchable_and_small_outputs_get_enough_programs(elt, dev):
    """On every GPU with TMA (sm_90+) the candidates fit a block's shared memory and keep most SMs busy."""
    sms = dev.sms
    for M, K, N in SWEEP_SHAPES:
        configs = ge._ranked_configs("tma", M, N, K, elt, dev)
        assert 1 <= len(configs) <= max(ge._CANDIDATES, len(ge._TMA_CONFIGS)) + 1 and len(set(configs)) == len(configs)
        programs = []
        for BM, BN, BK, _, esplit, stages, warps, _, split in configs:
            assert BK == (64 if elt == 2 else 32), "fp32 tiles halve BLOCK_K to fit shared memory"
            epilogue_tile = BM * BN * elt // esplit if split == 1 else 0  # the TMA store's staging tile
            assert stages * (BM + BN) * BK * elt + epilogue_tile <= dev.smem_per_block, "fits a block's shared memory"
            tiles = triton_cdiv(M, BM) * triton_cdiv(N, BN)
            if split > 1:
                assert tiles < sms and triton_cdiv(K, BK) >= split * ge._MIN_K_STEPS
            programs.append(tiles * split)
        # The old single 128x256 config gave 128x4096x4096 16 programs for 132 SMs: no candidate list
        # may leave most SMs idle when the problem has the K to split or the output to cut, and the work to
        # outweigh a wave's fill and split-K's second launch (a few microseconds at the device's peak)
        busy_s = 2 * M * N * K / (sms * dev.mma_flops_per_sm)
        if (M * N >= 64 * 128 * sms or K >= 128 * ge._MIN_K_STEPS) and busy_s >= 3e-6:
            assert max(programs) >= sms // 2, (M, K, N, configs)


def triton_cdiv(x, y):
    return -(-x // y)


def test_big_problems_keep_the_measured_big_tile_list():
    assert ge._ranked_configs("tma", 8192, 8192, 8192, 2, H200) == ge._TMA_CONFIGS
    assert ge._ranked_configs("tiled", 8192, 8192, 8192, 2, H200) == ge._TILED_CONFIGS


def test_short_k_problems_with_more_tiles_than_sms_also_time_two_programs_an_sm():
    two = ge._TWO_PER_SM_CONFIG
    assert two[7] == 2 and two in ge._ranked_configs("tma", 8192, 3072, 768, 2, H200)  # 1536 tiles of 128x128
    assert two in ge._ranked_configs("tma", 2048, 3072, 768, 2, H200)  # 384 tiles
    assert two in ge._ranked_configs("tma", 16384, 768, 3072, 2, H200)  # K = 3072: 768 tiles
    assert two not in ge._ranked_configs("tma", 512, 3072, 768, 2, H200)  # 96 tiles: the second would idle
    assert two not in ge._ranked_configs("tma", 8192, 3072, 4096, 2, H200)  # long K: the main loop dominates
    assert two not in ge._ranked_configs("tiled", 8192, 3072, 768, 2, H200)  # one program a tile there
    assert two not in ge._ranked_configs("tma", 8192, 3072, 768, 4, H200)  # fp32: its tiles halve BLOCK_K


def test_16_bit_tma_problems_also_time_the_warp_specialised_kernel_where_it_runs():
    ws, small = ge._WS_CONFIGS, ge._WS_SMALL_CONFIGS
    assert all(isinstance(c, _gemm_ws.WsConfig) for c in ws + small) and len(ws) == 2 and len(small) == 3
    for M, N, K in ((2048, 3072, 768), (8192, 8192, 8192), (4096, 3072, 768)):  # 768+ tiles of 64x128
        configs = ge._ranked_configs("tma", M, N, K, 2, H200, ws=True)
        assert configs[-2:] == ws and configs[:-2] == ge._ranked_configs("tma", M, N, K, 2, H200)
    # under two waves of 64x128 tiles (264 on 132 SMs) the smaller tiles too: 128x4096x4096 64 tiles, 2048x768 192
    for M, N, K in ((128, 4096, 4096), (2048, 768, 3072), (64, 3072, 768)):
        configs = ge._ranked_configs("tma", M, N, K, 2, H200, ws=True)
        assert configs[-5:] == ws + small and configs[:-5] == ge._ranked_configs("tma", M, N, K, 2, H200)
    assert ge._ranked_configs("tma", 2112, 1024, 768, 2, H200, ws=True)[-2:] == ws  # 33 x 8 = 264 tiles: two waves
    assert ge._ranked_configs("tma", 2048, 1024, 768, 2, H200, ws=True)[-3:] == small  # 256
    assert not set(ws) & set(ge._ranked_configs("tma", 2048, 3072, 768, 4, H200, ws=True))  # fp32
    assert not set(ws) & set(ge._ranked_configs("tiled", 2048, 3072, 768, 2, H200, ws=True))
    assert not set(ws) & set(ge._gemm_configs("tma", 2048, 3072, 768, torch.bfloat16, torch.device("cpu")))


def test_a_warp_specialised_config_launches_its_kernel_and_is_dropped_where_that_cannot_take_the_tensors(
        monkeypatch):
    calls, launched = [], []
    monkeypatch.setattr(_gemm_ws, "launch", lambda *args: calls.append(args))
    a, b, c, _ = operands(64, 48, 32, torch.float32, True, residual=False)
    out = poisoned(64, 48, torch.float32)
    ge._launch("tma", ge._WS_CONFIGS[0], a, b, out, c, None, 2)
    assert len(calls) == 1 and calls[0][7] == ge._WS_CONFIGS[0] and calls[0][5] == 2  # the code as given
    # in _run: a WS candidate beside one other, where the kernel does not take the tensors, is never timed
    tile = (32, 32, 16, 2, 1, 1, 1, 1, 1)
    monkeypatch.setattr(ge, "_gemm_configs", lambda *args, **kwargs: [tile, ge._WS_CONFIGS[0]])
    monkeypatch.setattr(_gemm_ws, "fits", lambda *args: False)
    real = ge._launch
    monkeypatch.setattr(ge, "_launch", lambda path, cfg, *args: (launched.append(cfg), real(path, cfg, *args)))
    path, config = ge._run(a, b, out, c, None, ge._activation_code("gelu"))
    assert config == tile and launched == [tile] and len(calls) == 1
    torch.testing.assert_close(out, ge.unfused(a, b, c, "gelu"), rtol=1e-4, atol=1e-4)


def test_a_warp_specialised_kernel_that_fails_to_compile_is_dropped_from_the_tuning_with_one_warning(monkeypatch):
    from triton.compiler.errors import CompilationError

    def broken(*args):
        raise CompilationError(None, None, "tma.async_copy_global_to_shared has been removed")

    tile = (32, 32, 16, 2, 1, 1, 1, 1, 1)
    monkeypatch.setattr(ge, "_tuned", {})
    monkeypatch.setattr(ge, "_timings", {})
    monkeypatch.setattr(_gemm_ws, "_DISABLED", [])
    monkeypatch.setattr(ge, "_gemm_configs", lambda *args, **kwargs: [ge._WS_CONFIGS[0], tile])
    monkeypatch.setattr(_gemm_ws, "fits", lambda *args: True)
    monkeypatch.setattr(_gemm_ws, "launch", broken)
    monkeypatch.setattr(ge, "graph_device_ms", lambda fn, sets: (fn(sets[0]), 1.0)[1])
    monkeypatch.setattr(ge, "_timing_sets", lambda a, b: [(a, b)])
    a, b, c, _ = operands(64, 48, 32, torch.float32, True, residual=False)
    out = poisoned(64, 48, torch.float32)
    with pytest.warns(RuntimeWarning, match="warp-specialised GEMM does not compile with Triton .*CompilationError"):
        path, config = ge._run(a, b, out, c, None, ge._activation_code("gelu"))
    assert config == tile and _gemm_ws._DISABLED
    torch.testing.assert_close(out, ge.unfused(a, b, c, "gelu"), rtol=1e-4, atol=1e-4)
    assert not _gemm_ws.available()


def test_the_model_splits_k_when_few_tiles_cover_a_long_k_and_never_when_k_is_short():
    best = ge._ranked_configs("tma", 128, 4096, 4096, 2, H200)[0]
    assert best[-1] > 1, best  # 128x4096 output, K = 4096: split
    assert all(c[-1] == 1 for c in ge._ranked_configs("tma", 8192, 3072, 768, 2, H200))


def test_the_model_weighs_the_devices_own_rates():
    """Split-K buys SMs with bytes (fp32 partials written and read): on a GPU whose DRAM is slow for its SMs the model
    ranks the one-range configs first at the shape where the H200's balance splits."""
    starved = dataclasses.replace(H200, dram_bytes_per_s=H200.dram_bytes_per_s / 20)
    assert ge._ranked_configs("tma", 128, 4096, 4096, 2, H200)[0][-1] > 1
    assert ge._ranked_configs("tma", 128, 4096, 4096, 2, starved)[0][-1] == 1
    tile = ge._TILE_SHAPES[0]
    fast = dataclasses.replace(H200, mma_flops_per_sm=2 * H200.mma_flops_per_sm)
    assert ge._estimate_s(8192, 8192, 8192, tile, 1, 2, fast) < ge._estimate_s(8192, 8192, 8192, tile, 1, 2, H200)


@pytest.fixture
def fresh_tuning(monkeypatch):
    """An empty bucket cache and a fake timer: config -> ms, with a log of what was timed."""
    monkeypatch.setattr(ge, "_tuned", {})
    monkeypatch.setattr(ge, "_timings", {})
    a_cfg, b_cfg = (32, 32, 16, 2, 1, 1, 1, 1, 1), (32, 32, 16, 2, 1, 1, 1, 1, 2)
    monkeypatch.setattr(ge, "_gemm_configs", lambda *args, **kwargs: [a_cfg, b_cfg])
    timed, launched = [], []
    real_launch = ge._launch

    def launch(path, cfg, *args, **kwargs):
        launched.append(cfg)
        real_launch(path, cfg, *args, **kwargs)

    readings = {a_cfg: [2.0], b_cfg: [1.0]}  # a config's timings in turn (the last one repeats)

    def time_ms(fn, sets):
        before = len(launched)
        fn(sets[0])
        cfg = launched[before]
        timed.append(cfg)
        return readings[cfg][min(len(readings[cfg]), sum(c == cfg for c in timed)) - 1]

    monkeypatch.setattr(ge, "_launch", launch)
    monkeypatch.setattr(ge, "graph_device_ms", time_ms)
    monkeypatch.setattr(ge, "_timing_sets", lambda a, b: [(a, b)])
    return SimpleNamespace(a=a_cfg, b=b_cfg, timed=timed, readings=readings)


def test_each_shape_bucket_times_its_candidates_once_and_reuses_the_fastest(fresh_tuning):
    code = ge._activation_code("gelu")

    def run(M, N, K, dtype=torch.bfloat16, bias=True):
        a, b, c, _ = operands(M, N, K, dtype, bias, residual=False)
        out = poisoned(M, N, dtype)
        _, config = ge._run(a, b, out, c, None, code)
        torch.testing.assert_close(out, ge.unfused(a, b, c, "gelu"), **TOLERANCES[dtype])
        return config

    assert ge._TUNING_ROUNDS == 2
    assert run(50, 40, 24) == fresh_tuning.b  # timed both, twice (the second round in reverse), kept the faster
    assert fresh_tuning.timed == [fresh_tuning.a, fresh_tuning.b, fresh_tuning.b, fresh_tuning.a]
    assert list(ge._timings.values()) == [[(fresh_tuning.a, 2.0), (fresh_tuning.b, 1.0)]]
    # M 64, N 64, K 32 bucket: cached, not timed again (strides stay 16-byte multiples, so that on
    # a GPU both calls take the TMA path: the path is part of the bucket)
    assert run(60, 48, 32) == fresh_tuning.b
    assert len(fresh_tuning.timed) == 4
    for other in (dict(M=70, N=40, K=24), dict(M=50, N=40, K=24, dtype=torch.float16),
                  dict(M=50, N=40, K=24, bias=False)):
        before = len(fresh_tuning.timed)
        assert run(**other) == fresh_tuning.b
        assert len(fresh_tuning.timed) == before + 4, f"{other} is a bucket of its own"
    assert len(ge._tuned) == 4


def test_a_candidate_read_slow_once_is_still_picked_on_its_best_round(fresh_tuning, monkeypatch):
    # b's first reading is a slow moment of the GPU (3.0), its second its speed (0.8): the best of each counts
    fresh_tuning.readings.update({fresh_tuning.a: [1.0, 1.2], fresh_tuning.b: [3.0, 0.8]})
    a, b, c, _ = operands(50, 40, 24, torch.bfloat16, True, residual=False)
    assert ge._run(a, b, poisoned(50, 40, torch.bfloat16), c, None, ge._activation_code("gelu"))[1] == fresh_tuning.b
    assert list(ge._timings.values()) == [[(fresh_tuning.a, 1.0), (fresh_tuning.b, 0.8)]]
    monkeypatch.setattr(ge, "_TUNING_ROUNDS", 1)  # one round: the slow reading decides
    ge._tuned.clear()
    fresh_tuning.timed.clear()
    assert ge._run(a, b, poisoned(50, 40, torch.bfloat16), c, None, ge._activation_code("gelu"))[1] == fresh_tuning.a
    assert fresh_tuning.timed == [fresh_tuning.a, fresh_tuning.b]


def test_tuning_an_in_place_residual_add_adds_the_residual_once(fresh_tuning):
    # out is the residual: the timed candidates must not write it, or each launch adds it again.
    a, b, bias, residual = operands(50, 40, 24, torch.bfloat16)
    expected = ge.unfused(a, b, bias, "gelu", residual=residual)
    out = residual.clone()
    ge.fused(a, b, bias, "gelu", residual=out, out=out)
    assert fresh_tuning.timed == [fresh_tuning.a, fresh_tuning.b, fresh_tuning.b, fresh_tuning.a]  # both, twice
    torch.testing.assert_close(out, expected, **TOLERANCES[torch.bfloat16])


def test_nothing_is_timed_or_cached_while_a_cuda_graph_is_captured(fresh_tuning, monkeypatch):
    monkeypatch.setattr(ge, "_capturing", lambda device: True)
    a, b, bias, _ = operands(50, 40, 24, torch.bfloat16, residual=False)
    out = poisoned(50, 40, torch.bfloat16)
    _, config = ge._run(a, b, out, bias, None, ge._activation_code("gelu"))
    assert config == fresh_tuning.a and not fresh_tuning.timed and not ge._tuned
    torch.testing.assert_close(out, ge.unfused(a, b, bias, "gelu"), **TOLERANCES[torch.bfloat16])


def test_bucket_rounds_up_to_a_power_of_two():
    assert [ge._bucket(n) for n in (0, 1, 2, 3, 64, 65, 768, 11008)] == [1, 1, 2, 4, 64, 128, 1024, 16384]


# --------------------------------------------------------------------------- the library's path

LIBRARY_CASES = [
    # (M, N, K), dtype, bias, activation, approximate, residual: what cuBLASLt's epilogue takes alone (a bias, then a
    # ReLU, the tanh GELU or nothing) and what only the epilogue kernel after cuBLAS's product computes (the exact GELU,
    # an activation without a bias, a residual)
    ((70, 56, 40), torch.bfloat16, True, "gelu", "tanh", False),
    ((70, 56, 40), torch.bfloat16, True, "gelu", "none", True),
    ((67, 45, 33), torch.float16, True, "relu", "none", False),
    ((33, 17, 9), torch.float16, False, "gelu", "none", True),
    ((64, 40, 24), torch.float16, True, None, "none", False),
    ((5, 8, 8), torch.bfloat16, False, None, "none", False),
    ((40, 24, 0), torch.bfloat16, True, "gelu", "none", True),  # K = 0: the epilogue of a zero product
]


@pytest.mark.parametrize("mnk, dtype, has_bias, activation, approximate, has_residual", LIBRARY_CASES, ids=str)
def test_the_library_paths_match_the_reference_and_write_every_element(mnk, dtype, has_bias, activation,
                                                                        approximate, has_residual):
    a, b, bias, residual = operands(*mnk, dtype, has_bias, has_residual)
    code = ge._activation_code(activation, approximate)
    for config in ge._LIBRARIES:
        out = poisoned(mnk[0], mnk[1], dtype)
        if config == ge.LIBRARY_LT and not ge._lt_epilogue(bias, residual, code):
            with pytest.raises(ValueError, match="cuBLASLt's epilogue computes"):
                ge._run(a, b, out, bias, residual, code, config=config)
            continue
        assert ge._run(a, b, out, bias, residual, code, config=config)[1] == config
        assert not out.isnan().any(), f"{config}: an output element was left unwritten"
        torch.testing.assert_close(out, ge.unfused(a, b, bias, activation, residual, approximate), **TOLERANCES[dtype])


@pytest.mark.parametrize("config, approximate, has_residual, steps",
                         [("library_lt", "tanh", False, ["_Call"]), ("library", "tanh", False, ["_Call", "k"]),
                          ("library", "none", True, ["_Call", "k"])], ids=str)
def test_a_problem_that_takes_a_library_path_replays_its_op_and_the_epilogue_launch_it_needs(
        monkeypatch, config, approximate, has_residual, steps):
    monkeypatch.setattr(ge, "_gemm_configs", lambda *args, **kwargs: [config])  # as if it won the timing
    for how in ("planned: first call", "recorded", "replayed", "replayed"):
        a, b, bias, residual = operands(50, 40, 24, torch.bfloat16, residual=has_residual)
        y = ge.fused(a, b.T.contiguous().T, bias, "gelu", residual, approximate)  # a Linear's weight, transposed
        assert ge.CALLS.last == how
        torch.testing.assert_close(y, ge.unfused(a, b, bias, "gelu", residual, approximate),
                                   **TOLERANCES[torch.bfloat16])
    recorded = [type(s).__name__ for s in next(iter(ge.CALLS.table.values())).launches]
    assert recorded == [s if s != "k" else ("_Bound" if DEVICE == "cuda" else "_Relaunch") for s in steps]


def test_the_plugin_sees_what_a_library_path_launches_and_the_bytes_it_moves_past_the_budget(monkeypatch):
    """cuBLASLt's epilogue alone is one op at the budget; cuBLAS's product and the epilogue kernel after it are two,
    the product written and read once more (2 M N elements past the budget)."""
    from pytest_fusioncheck import profile

    M, N, K = 50, 40, 24
    a, b, bias, residual = operands(M, N, K, torch.bfloat16)
    for config, kwargs, kernels, extra in ((ge.LIBRARY, dict(residual=residual), 2, 2 * 2 * M * N),
                                           (ge.LIBRARY_LT, dict(approximate="tanh"), 1, 0)):
        monkeypatch.setattr(ge, "_gemm_configs", lambda *args, config=config, **kw: [config])
        report = profile(ge.fused, a, b, bias, **kwargs)
        assert report.kernel_count == kernels, str(report)
        assert report.bytes == ge.budget(a, b, bias, residual=kwargs.get("residual")).total + extra, str(report)


def test_the_library_paths_are_timed_beside_the_kernels_where_they_take_the_epilogue(fresh_tuning, monkeypatch):
    monkeypatch.setattr(ge, "_gemm_configs", lambda *args, **kwargs: [fresh_tuning.a, ge.LIBRARY, ge.LIBRARY_LT])
    fresh_tuning.readings[ge.LIBRARY] = [0.5]
    a, b, bias, residual = operands(50, 40, 24, torch.bfloat16)
    out = poisoned(50, 40, torch.bfloat16)
    assert ge._run(a, b, out, bias, residual, ge._activation_code("gelu"))[1] == ge.LIBRARY
    # cuBLASLt's epilogue computes no exact GELU and no residual: not a candidate here
    assert fresh_tuning.timed == [fresh_tuning.a, ge.LIBRARY, ge.LIBRARY, fresh_tuning.a]
    torch.testing.assert_close(out, ge.unfused(a, b, bias, "gelu", residual), **TOLERANCES[torch.bfloat16])
    # an in-place residual add (out is the residual): the library's product would overwrite it before it is read
    expected = ge.unfused(a, b, bias, "gelu", residual)
    ge._tuned.clear()
    assert ge._run(a, b, residual, bias, residual, ge._activation_code("gelu"))[1] == fresh_tuning.a
    torch.testing.assert_close(residual, expected, **TOLERANCES[torch.bfloat16])
    with pytest.raises(ValueError, match="must not share memory"):
        ge._run(a, b, residual, bias, residual, ge._activation_code("gelu"), config=ge.LIBRARY)


def test_the_library_paths_are_candidates_on_cuda_only(monkeypatch, allow_tf32):
    allow_tf32(False)
    monkeypatch.setattr(ge, "interpreting", lambda: False)
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert ge._gemm_configs("tiled", 4096, 4096, 4096, torch.float32, cuda) == [ge._IEEE_CONFIG, *ge._LIBRARIES]
    assert not set(ge._LIBRARIES) & set(ge._gemm_configs("tiled", 4096, 4096, 4096, torch.float32, cpu))


@pytest.mark.gpu
@pytest.mark.parametrize("mkn", [(16, 4096, 4096), (1, 4096, 4096), (256, 4096, 1024), (1000, 1000, 1000)], ids=str)
def test_small_problems_are_as_fast_as_cublaslt_bias_gelu_where_both_compute_the_tanh_gelu(mkn):
    """The library's path is a timed candidate: where no kernel config matches cuBLASLt (small M, odd sizes) the plan
    takes it, so ours with the tanh GELU keeps up with ``torch._addmm_activation`` (within timing noise)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: benchmarks/
    from benchmarks.bench_gemm_epilogue import rotated_device_ms

    M, K, N = mkn

    def make():
        a, b, bias, _ = operands(M, N, K, torch.bfloat16, residual=False)
        return a, b, bias

    ours = rotated_device_ms(make, lambda a, b, bias: ge.fused(a, b, bias, "gelu", approximate="tanh"))
    lt = rotated_device_ms(make, lambda a, b, bias: torch._addmm_activation(bias, a, b, use_gelu=True))
    assert lt / ours >= 0.9, f"ours {ours * 1e3:.1f} us, _addmm_activation {lt * 1e3:.1f} us"


# --------------------------------------------------------------------------- fp32 inputs


@pytest.fixture
def allow_tf32():
    """Set torch's TF32 matmul flag (a property monkeypatch cannot restore) for one test."""
    saved = torch.backends.cuda.matmul.allow_tf32

    def set_(value):
        torch.backends.cuda.matmul.allow_tf32 = value

    yield set_
    torch.backends.cuda.matmul.allow_tf32 = saved


def test_fp32_inputs_use_tf32_only_where_torch_allows_it(monkeypatch, allow_tf32):
    allow_tf32(False)
    assert ge._input_precision(torch.float32) == "ieee" and ge._allow_tf32() is False  # a call's key reads the flag
    monkeypatch.setattr(ge, "interpreting", lambda: False)
    assert ge._gemm_configs("tiled", 4096, 4096, 4096, torch.float32, torch.device("cpu")) == [ge._IEEE_CONFIG]
    allow_tf32(True)
    assert ge._input_precision(torch.float32) == "tf32" and ge._allow_tf32() is True
    assert ge._input_precision(torch.bfloat16) == "tf32"  # unused for 16-bit inputs
    assert all(c[2] == 32 for c in ge._gemm_configs("tma", 512, 3072, 768, torch.float32, torch.device("cpu")))


@pytest.mark.parametrize("tf32", [False, True])
@pytest.mark.parametrize("split", [1, 3])
def test_fp32_inputs_match_a_float64_reference(allow_tf32, tf32, split):
    allow_tf32(tf32)
    M, N, K = (50, 40, 88) if interpreting() else (200, 320, 1408)
    a, b, bias, residual = operands(M, N, K, torch.float32)
    out = poisoned(M, N, torch.float32)
    config = _split_config(split)
    config = config[:2] + (min(config[2], 32),) + config[3:]
    ge._run(a, b, out, bias, residual, ge._activation_code("gelu"), config=config)
    want = ge.unfused(a.double(), b.double(), bias.double(), "gelu", residual.double())
    rel = ((out.double() - want).norm() / want.norm()).item()
    assert rel < (2e-3 if tf32 else 1e-5), rel  # TF32 rounds operands to 10 mantissa bits


@pytest.mark.gpu
def test_fp32_without_tf32_is_full_precision_on_the_gpu(allow_tf32):
    allow_tf32(False)
    a, b, bias, _ = operands(256, 512, 1024, torch.float32, residual=False)
    a = a + 1.0  # a TF32 product of these is off by about 1e-4 relative
    want = ge.unfused(a.double(), b.double(), bias.double(), "gelu")
    y = ge.fused(a, b, bias, "gelu")
    assert ((y.double() - want).norm() / want.norm()).item() < 1e-5


# --------------------------------------------------------------------------- speed (GPU)


@pytest.mark.gpu
@pytest.mark.parametrize("mkn", [(128, 4096, 4096), (512, 768, 3072), (2048, 768, 3072), (64, 4096, 11008)], ids=str)
def test_small_and_skinny_shapes_stay_above_their_measured_ratio_to_cublaslt_bias_gelu(mkn):
    """A regression floor at the shapes issue 12 named, against ``torch._addmm_activation``
    (cuBLASLt's bias + GELU epilogue), device time of CUDA-graph replays over rotated inputs
    (benchmarks/bench_gemm_epilogue.py): ours in the exact GELU, which no library computes, against
    its tanh GELU. The target is 0.9x; the exact GELU reads 0.79-0.95x at small M and K <= 1152
    (BENCHMARKS.md, "GEMM + bias + GELU"), so the floor is 0.6x: a fall below it is a regression,
    not the open gap."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: benchmarks/
    from benchmarks.bench_gemm_epilogue import rotated_device_ms

    M, K, N = mkn

    def make():
        a, b, bias, _ = operands(M, N, K, torch.bfloat16, residual=False)
        return a, b, bias

    ours = rotated_device_ms(make, lambda a, b, bias: ge.fused(a, b, bias, "gelu"))
    lt = rotated_device_ms(make, lambda a, b, bias: torch._addmm_activation(bias, a, b, use_gelu=True))
    assert lt / ours >= 0.6, f"ours {ours * 1e3:.1f} us, _addmm_activation {lt * 1e3:.1f} us"


@pytest.mark.gpu
def test_a_small_m_problem_is_far_faster_than_on_the_old_single_small_problem_config():
    """128x4096x4096 took one 128x128 config (32 tiles for 132 SMs): 36 TFLOPS in issue 12. The
    ranked candidates (smaller tiles, split-K) measured 1.97x the old config's speed on the H200
    (host-timed tuning; 214 TFLOPS in the benchmark): a 1.5x floor guards the choice."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: benchmarks/
    from benchmarks.bench_gemm_epilogue import rotated_device_ms

    def make():
        a, b, bias, _ = operands(128, 4096, 4096, torch.bfloat16, residual=False)
        return a, b, bias

    def old(a, b, bias):
        out = torch.empty(128, 4096, device=DEVICE, dtype=torch.bfloat16)
        ge._run(a, b, out, bias, None, ge._activation_code("gelu"), config=(128, 128, 64, 8, 1, 3, 8, 1, 1))

    ours = rotated_device_ms(make, lambda a, b, bias: ge.fused(a, b, bias, "gelu"))
    assert rotated_device_ms(make, old) / ours >= 1.5


def test_timing_sets_copy_a_and_b_with_their_strides_until_they_exceed_twice_the_l2(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(L2_cache_size=1 << 16))
    a = torch.randn(64, 80)[:, :48]  # row stride 80
    b = torch.randn(40, 48).T  # a transposed (N, K) weight
    sets = ge._timing_sets(a, b)
    set_bytes = 4 * (64 * 48 + 48 * 40)
    assert sets[0][0] is a and sets[0][1] is b
    assert len(sets) == -(-2 * (1 << 16) // set_bytes)
    for x, y in sets[1:]:
        assert x.stride() == a.stride() and y.stride() == b.stride()
        assert torch.equal(x, a) and torch.equal(y, b) and x.data_ptr() != a.data_ptr()
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(L2_cache_size=1))
    assert len(ge._timing_sets(a, b)) == 1  # operands already larger than the L2: no copies
