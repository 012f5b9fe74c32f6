"""The warp-specialised GEMM + epilogue kernel (reference_kernels/_gemm_ws.py: a Gluon ping-pong kernel for sm_90, two
consumer warpgroups on alternate tiles and a TMA loader warp).

It is a Gluon kernel, which Triton's interpreter does not run, so CI checks what it can without a GPU: that it
compiles for sm_90 with the installed Triton (scripts/ws_sass.py; Gluon's names move between releases) into what
the design says (12 warps, wgmma, the consumers' and the loader's ``setmaxnreg``, TMA loads and stores, no spills,
the shared memory ``smem_bytes`` budgets), that ``available`` is False off an sm_90 GPU and under the interpreter,
and that ``fits`` and ``launch`` refuse what the kernel cannot take. Its results are the ``gpu`` tests below: on an
H200, against a float32 reference, into an output poisoned with NaN.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from reference_kernels import _gemm_common, _gemm_ws
from reference_kernels import gemm_epilogue as ge
from reference_kernels._common import interpreting
from test_ref_gemm_epilogue import TOLERANCES
from test_ref_held import compile_for_sm90, pretend_an_sm90_machine

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "ws_sass.py"
CASES = ["bf16:gelu", "fp16:gelu:residual:kmajor", "bf16:tanh:64x128", "bf16:gelu:64x32"]  # the last: the smallest tile


@pytest.fixture(scope="module")
def compiled_for_sm90():
    """scripts/ws_sass.py over CASES (test_ref_held.compile_for_sm90; it skips where this Triton's Gluon lacks the
    Hopper ops the kernel needs, as the script reports): {case: what came out}."""
    return compile_for_sm90(SCRIPT, CASES)


@pytest.mark.parametrize("case", CASES)
def test_the_ws_kernel_compiles_for_sm90_into_wgmma_tma_and_setmaxnreg_without_spills(compiled_for_sm90, case):
    result = compiled_for_sm90[case]
    assert result["warps"] == 12, result  # a consumer warpgroup by default, one worker's, the loader's 4 (1 used)
    assert result["shared"] <= result["smem_bytes"] == _gemm_ws.smem_bytes(result["config"]), result
    assert result["shared"] < _gemm_ws.SMEM_PER_BLOCK, result
    if result["registers"] is None:  # no cuobjdump / nvdisasm in this Triton build: the compile is all there is
        return
    assert result["registers"] * 32 * result["warps"] <= 65536, result  # one program an SM: the register file
    assert result["hgmma"] > 0, result
    assert result["utmaldg"] > 0 and result["utmastg"] > 0, result
    assert result["stack"] == 0 and not result["local"] and result["stl"] == 0 and result["ldl"] == 0, result
    regs = result["setmaxnreg"]
    assert _gemm_ws.CONSUMER_REGS in regs["alloc"], result  # the consumer worker takes its registers
    assert _gemm_ws.LOADER_REGS in regs["dealloc"], result  # the loader gives its up
    # the default partition (consumer 0) gets the rest of the warpgroups' registers
    rest = 3 * result["registers"] - _gemm_ws.CONSUMER_REGS - _gemm_ws.LOADER_REGS
    assert rest in regs["alloc"] + regs["dealloc"], result


def _script():
    spec = importlib.util.spec_from_file_location("ws_sass", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_scripts_cases_name_the_kernels_activation_codes_and_configs(monkeypatch):
    ws_sass = _script()
    monkeypatch.setattr(_gemm_common, "TANH_FAST", True)
    monkeypatch.setattr(_gemm_common, "EXACT_FAST", True)
    default = tuple(_gemm_ws.DEFAULT_CONFIG)[:6] + (_gemm_ws.DEFAULT_CONFIG[6:] or (_gemm_ws.EPILOGUE_SPLIT,))
    spec = ws_sass.parse("bf16:gelu")
    assert (spec["activation"], spec["flags"], spec["config"]) == (5, set(), default)
    spec = ws_sass.parse("fp16:tanh:residual:kmajor:64x128")
    assert (spec["dtype"], spec["activation"], spec["flags"]) == ("fp16", 4, {"residual", "kmajor"})
    assert spec["config"] == tuple(ge._WS_CONFIGS[1])  # the tuning's 64x128 candidate
    assert ws_sass.parse("bf16:64x32")["config"] == tuple(ge._WS_SMALL_CONFIGS[2])
    assert ws_sass.parse("bf16:256x64")["config"] == (256, 64) + default[2:]  # no candidate: the default's rest
    assert ws_sass.parse("bf16:relu:s4:split1")["config"][4:] == (4, 1, 1)
    assert ws_sass.parse("bf16")["activation"] == 0
    for bad in ("fp32:gelu", "bf16:silu", "bf16:gelu:128"):
        with pytest.raises(SystemExit):
            ws_sass.parse(bad)


# --------------------------------------------------------------------------- available


@pytest.fixture
def a_machine_that_runs_it(monkeypatch):
    pretend_an_sm90_machine(monkeypatch, _gemm_ws)


def test_the_kernel_is_unavailable_without_an_sm90_gpu_and_under_the_interpreter():
    if not torch.cuda.is_available() or interpreting():
        assert not _gemm_ws.available()
    else:
        capable = torch.cuda.get_device_capability()[0] == 9
        assert _gemm_ws.available() == (_gemm_ws.gluon is not None and capable)


def test_available_asks_for_gluon_no_interpreter_a_gpu_and_compute_capability_9(a_machine_that_runs_it, monkeypatch):
    assert _gemm_ws.available()
    with monkeypatch.context() as m:
        m.setattr(_gemm_ws, "interpreting", lambda: True)
        assert not _gemm_ws.available()
    with monkeypatch.context() as m:
        m.setattr(_gemm_ws.torch.cuda, "is_available", lambda: False)
        assert not _gemm_ws.available()
    with monkeypatch.context() as m:
        m.setattr(_gemm_ws, "gluon", None)
        assert not _gemm_ws.available()
    monkeypatch.undo()
    _gemm_ws._capable.cache_clear()
    for major, capable in ((8, False), (9, True), (10, False)):  # wgmma and setmaxnreg are sm_90's
        monkeypatch.setattr(_gemm_ws.torch.cuda, "get_device_capability", lambda index=None, major=major: (major, 0))
        assert _gemm_ws._capable(None) == capable
        _gemm_ws._capable.cache_clear()


# --------------------------------------------------------------------------- what fits and launch refuse


def _bad_inputs(device):
    """(what is wrong, (a, b, out, bias, residual), the refusal's message) for 64x128 @ 128x256 problems."""
    bf16 = dict(dtype=torch.bfloat16, device=device)
    a, b, out = torch.randn(64, 128, **bf16), torch.randn(128, 256, **bf16), torch.empty(64, 256, **bf16)
    bias, residual = torch.randn(256, **bf16), torch.randn(64, 256, **bf16)
    return [
        ("fp32", (a.float(), b.float(), out.float(), None, None), "16-bit dtype"),
        ("mixed dtypes", (a, b.half(), out, None, None), "16-bit dtype"),
        ("cpu", (a.cpu(), b.cpu(), out.cpu(), None, None), "CUDA tensors"),
        ("cpu b", (a, b.cpu(), out, None, None), "CUDA tensors"),
        ("inner dimensions", (a, b[:96], out, None, None), "shapes do not chain"),
        ("out shape", (a, b, out[:, :128], None, None), "shapes do not chain"),
        ("empty", (a[:, :0], b[:0], out, None, None), "empty problem"),
        ("1-D", (a[0], b, out, None, None), "2-D"),
        # a row stride of 100 elements: 200 bytes, not a multiple of 16
        ("a row stride", (torch.randn(64, 100, **bf16)[:, :96], b[:96], out, None, None), "a breaks TMA"),
        ("b strides", (a, torch.randn(128, 512, **bf16)[:, ::2], out, None, None), "b breaks TMA"),
        ("out row stride", (a, b[:, :250], torch.empty(64, 250, **bf16), None, None), "TMA"),
        ("bias shape", (a, b, out, bias[:128], None), r"bias must be a \(256,\) tensor"),
        ("bias dtype", (a, b, out, bias.half(), None), r"bias must be a \(256,\) tensor"),
        ("bias stride", (a, b, out, torch.randn(512, **bf16)[::2], None), "bias must have a unit stride"),
        ("residual shape", (a, b, out, bias, residual[:32]), r"residual must be a \(64, 256\) tensor"),
    ]


# CPU tensors: the refusals before the device check say what is wrong, the others that CUDA tensors are needed
_CHECKED_BEFORE_THE_DEVICE = {"fp32", "mixed dtypes", "cpu", "inner dimensions", "out shape", "empty", "1-D"}


def _refused(case, args, message):
    assert not _gemm_ws.fits(*args), case
    if _gemm_ws.gluon is None:
        return
    with pytest.raises(ValueError, match=f"_gemm_ws.launch: .*{message}"):
        _gemm_ws.launch(*args, ge._activation_code("gelu"))


def test_fits_is_false_and_launch_says_why_for_tensors_the_kernel_cannot_take():
    for case, args, message in _bad_inputs("cpu"):
        if case == "cpu b":
            continue  # on CPU every tensor is on the CPU
        _refused(case, args, message if case in _CHECKED_BEFORE_THE_DEVICE else "CUDA tensors")


def test_the_shared_memory_a_config_takes_is_its_ring_its_two_output_tiles_and_barriers():
    # 6 stages of 128x64 + 64x128 bf16, two 128x64 output halves, 14 mbarriers, 1 KiB of alignment: what the kernel
    # compiled with at most (test_the_ws_kernel_compiles_...) and under the 227 KiB a block may take
    budget = _gemm_ws.smem_bytes(_gemm_ws.DEFAULT_CONFIG)
    assert budget == 2 * (6 * (128 * 64 + 64 * 128) + 2 * 128 * 64) + 8 * 14 + 1024 == 230512 <= _gemm_ws.SMEM_PER_BLOCK
    assert _gemm_ws.smem_bytes(_gemm_ws.DEFAULT_CONFIG, epilogue_split=1) > _gemm_ws.SMEM_PER_BLOCK  # whole tiles
    assert _gemm_ws.smem_bytes(_gemm_ws.DEFAULT_CONFIG._replace(stages=7)) > _gemm_ws.SMEM_PER_BLOCK
    assert _gemm_ws.smem_bytes(_gemm_ws.DEFAULT_CONFIG._replace(epilogue_split=1)) == _gemm_ws.smem_bytes(
        _gemm_ws.DEFAULT_CONFIG, epilogue_split=1)  # a config's own split
    for config in ge._WS_CONFIGS + ge._WS_SMALL_CONFIGS:  # gemm_epilogue's candidates fit
        assert _gemm_ws.smem_bytes(config) <= _gemm_ws.SMEM_PER_BLOCK, config


@pytest.mark.parametrize("config, split, message", [
    ((128, 128, 64, 8, 7, 1), None, "shared memory"),
    ((64, 128, 64, 8, 9, 1), None, "shared memory"),
    ((128, 128, 64, 8, 4, 1), 1, "spills"),  # a whole 128x128 tile: 56 bytes of stack
    ((128, 256, 64, 8, 3, 1), None, "spills"),  # ~1.6 KB of stack
    ((128, 128, 64, 8, 6, 2), None, "programs an SM"),
    ((96, 128, 64, 8, 4, 1), None, "unsupported tile"),
    ((128, 512, 64, 8, 2, 1), None, "unsupported tile"),
    ((128, 128, 64, 8, 4, 1), 3, "unsupported tile"),
], ids=str)
def test_launch_refuses_a_config_the_kernel_cannot_run(monkeypatch, config, split, message):
    # launch checks the config after the tensors (_why_not), which only CUDA tensors pass: skip that check here
    if _gemm_ws.gluon is None:
        pytest.skip("this Triton has no Gluon")
    monkeypatch.setattr(_gemm_ws, "_why_not", lambda *args: None)
    a, b, out = (torch.empty(s, dtype=torch.bfloat16) for s in ((256, 256), (256, 256), (256, 256)))
    with pytest.raises(ValueError, match=message):
        _gemm_ws.launch(a, b, out, None, None, 0, config=config, epilogue_split=split)


# --------------------------------------------------------------------------- results (GPU)


@pytest.fixture
def hopper():
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the kernel is sm_90's")
    assert _gemm_ws.available(), "an sm_90 GPU with this Triton's Gluon should run it"


def _operands(M, K, N, dtype, residual, kmajor):
    a = torch.randn(M, K, device="cuda").to(dtype)
    weight = torch.randn(N, K, device="cuda") / K**0.5  # nn.Linear's (N, K)
    b = weight.to(dtype).T if kmajor else weight.T.contiguous().to(dtype)
    bias = torch.randn(N, device="cuda").to(dtype)
    r = torch.randn(M, N, device="cuda").to(dtype) if residual else None
    return a, b, bias, r


def _check(M, K, N, dtype, residual, kmajor, activation="gelu", approximate="none", config=None):
    """launch into an output poisoned with NaN, against the float32 computation of the same (rounded) inputs."""
    a, b, bias, r = _operands(M, K, N, dtype, residual, kmajor)
    assert _gemm_ws.fits(a, b, torch.empty(M, N, device="cuda", dtype=dtype), bias, r)
    out = torch.full((M, N), float("nan"), device="cuda", dtype=dtype)
    y = _gemm_ws.launch(a, b, out, bias, r, ge._activation_code(activation, approximate), config=config)
    assert y is out
    assert not out.isnan().any(), f"{out.isnan().sum().item()} output elements were left unwritten"
    want = ge.unfused(a.float(), b.float(), bias.float(), activation, r.float() if r is not None else None,
                      approximate=approximate)
    torch.testing.assert_close(out.float(), want, **TOLERANCES[dtype])


SHAPES = [(2048, 768, 3072), (1000, 744, 3000), (128, 4096, 4096)]  # M, K, N: 3 tiles a program; ragged; 32 tiles


@pytest.mark.gpu
@pytest.mark.parametrize("kmajor", [False, True], ids=["b_row_major", "b_k_major"])
@pytest.mark.parametrize("residual", [False, True], ids=["no_residual", "residual"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("mkn", SHAPES, ids=str)
def test_launch_matches_a_float32_reference_and_writes_every_element(hopper, mkn, dtype, residual, kmajor):
    _check(*mkn, dtype, residual, kmajor)


@pytest.mark.gpu
@pytest.mark.parametrize("kmajor", [False, True], ids=["b_row_major", "b_k_major"])
@pytest.mark.parametrize("mkn", SHAPES, ids=str)
# whole tiles (split 1) at 128x64: no spills (at 128x128, 56 bytes of stack: launch refuses it)
@pytest.mark.parametrize("config", [_gemm_ws.WsConfig(64, 128, 64, 8, 6, 1), (128, 64, 64, 8, 8, 1, 1),
                                    (64, 256, 64, 8, 4, 1, 2), *ge._WS_CONFIGS[1:], *ge._WS_SMALL_CONFIGS], ids=str)
def test_other_tiles_stages_and_an_unsplit_epilogue_match_too(hopper, config, mkn, kmajor):
    _check(*mkn, torch.bfloat16, True, kmajor, config=config)


@pytest.mark.gpu
@pytest.mark.parametrize("activation, approximate", [(None, "none"), ("relu", "none"), ("gelu", "tanh")], ids=str)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_each_activation_matches(hopper, dtype, activation, approximate):
    _check(1000, 744, 3000, dtype, True, False, activation, approximate)


@pytest.mark.gpu
def test_an_in_place_residual_add_adds_it_once(hopper):
    a, b, bias, r = _operands(1000, 744, 3000, torch.bfloat16, True, True)
    want = ge.unfused(a.float(), b.float(), bias.float(), "gelu", r.float())
    _gemm_ws.launch(a, b, r, bias, r, ge._activation_code("gelu"))  # out is the residual
    torch.testing.assert_close(r.float(), want, **TOLERANCES[torch.bfloat16])


@pytest.mark.gpu
def test_the_compiled_kernel_on_the_gpu_has_12_warps_no_spills_and_the_shared_memory_budgeted(hopper):
    a, b, bias, r = _operands(2048, 768, 3072, torch.bfloat16, True, False)
    out = torch.empty(2048, 3072, device="cuda", dtype=torch.bfloat16)
    _, compiled = _gemm_ws.launch(a, b, out, bias, r, ge._activation_code("gelu"), return_compiled=True)
    assert compiled.metadata.num_warps == 12
    assert compiled.metadata.shared <= _gemm_ws.smem_bytes(_gemm_ws.DEFAULT_CONFIG) <= _gemm_ws.SMEM_PER_BLOCK
    assert getattr(compiled, "n_spills", 0) == 0


@pytest.mark.gpu
def test_fits_is_false_and_launch_says_why_for_cuda_tensors_the_kernel_cannot_take(hopper):
    for case, args, message in _bad_inputs("cuda"):
        _refused(case, args, message)


@pytest.mark.gpu
def test_launch_refuses_a_config_over_the_shared_memory_of_a_block_on_the_gpu(hopper):
    a, b, bias, _ = _operands(256, 256, 256, torch.bfloat16, False, False)
    out = torch.empty(256, 256, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="shared memory"):
        _gemm_ws.launch(a, b, out, bias, None, 0, config=_gemm_ws.DEFAULT_CONFIG._replace(stages=7))
