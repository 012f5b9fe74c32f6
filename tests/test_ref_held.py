"""The kernels that hold rows in shared memory (reference_kernels/_held.py, _softmax_held.py, _layer_norm_held.py:
the softmax, the layer norm's forward and its backward).

They are Gluon kernels, which Triton's interpreter does not run, so CI checks what it can without a GPU: that they
compile for sm_90 with the installed Triton (Gluon's names move between releases, and a kernel that no longer compiles
would otherwise surface only on a GPU), that the copies and stores come out as 16-byte vectors, and that a compile
failure at run time falls back to the other plans with one warning. The kernels' results are the ``gpu`` tests of
tests/test_ref_softmax.py and tests/test_ref_layer_norm.py (``-k held``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from reference_kernels import _device, _held, _layer_norm_held, _softmax_held, layer_norm, softmax


DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the fallbacks below run where the tests run
SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "held_sass.py"
CASES = ["softmax:bf16:50257", "softmax:fp16:30522", "softmax:fp32:17001", "softmax:fp32:40001",
         "softmax_split:bf16:128256:4", "softmax_split:fp32:100003:6",
         "layer_norm:bf16:bf16:12345", "layer_norm:bf16:fp32:10468", "layer_norm:fp32:fp32:17000",
         "layer_norm:bf16:bf16:6001", "layer_norm:bf16:bf16:2049",
         "layer_norm_bwd:bf16:bf16:3001", "layer_norm_bwd:fp16:fp32:10468", "layer_norm_bwd:fp16:fp16:1100",
         "layer_norm_bwd:bf16:bf16:7001", "layer_norm:bf16:bf16:8704", "layer_norm_bwd:bf16:bf16:5120",
         "layer_norm_bwd:fp16:fp16:5120"]
# Stack a thread that a case's sm_90 compile is known to take: aligned bf16 backward rows of five segments, with the
# shares in registers at 168 (Triton 3.6), spill 8 bytes, fp16's none (docs/kernels.md, "Shares in registers")
KNOWN_STACK = {"layer_norm_bwd:bf16:bf16:5120": 8}


def compile_for_sm90(script: Path, cases: list[str], gluon: bool = True) -> dict:
    """An offline-compile script (scripts/held_sass.py, scripts/ws_sass.py, scripts/rows_sass.py) over ``cases``, in a
    process of its own without TRITON_INTERPRET (under the interpreter Triton's library functions cannot be
    compiled): {case: what came out}; with ``gluon`` (the script compiles Gluon kernels) the test skips where this
    Triton has no Gluon."""
    if gluon and _held.gluon is None:
        pytest.skip("this Triton has no Gluon")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, str(script), *cases, "--json"], capture_output=True, text=True, env=env,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    results = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    if results and "unavailable" in results[0]:
        pytest.skip(results[0]["unavailable"])
    return {r["case"]: r for r in results}


@pytest.fixture(scope="module")
def compiled_for_sm90():
    """scripts/held_sass.py over CASES: {case: what came out}."""
    return compile_for_sm90(SCRIPT, CASES)


@pytest.mark.parametrize("case", CASES)
def test_the_held_kernels_compile_for_sm90_with_this_triton_into_16_byte_copies_and_stores(compiled_for_sm90, case):
    result = compiled_for_sm90[case]
    assert result["copies"] > 0 and result["copies_16_byte"], result  # every copy a 16-byte cp.async
    assert result["vector_stores"], result  # the body stored as 16-byte vectors (the edges element by element)
    assert result["shared"] <= _held.SMEM_PER_BLOCK, result
    backward = case.startswith("layer_norm_bwd:")
    # the launch's cap: the backward's is the register file of the programs that fit (_layer_norm_held.bwd_shape)
    assert backward or result["register_cap"] == _held.MAX_REGS, result
    if case.startswith("softmax"):  # what _held.per_sm counts a program (its segments and the reductions' scratch),
        # so that the programs an SM the plan launches are resident at once
        _, dtype, n, *group = case.split(":")
        elem = 4 if dtype == "fp32" else 2
        cols = _softmax_held.split_shape(int(n), elem, int(group[0]))[1] if group else int(n)
        assert result["shared"] <= _held.segments(cols, elem) * _held.BLOCK * elem + _held.SMEM_RESERVED, result
        if not group:  # a program a row copies its row once, no next row behind it
            per_segment = _held.BLOCK * elem // (16 * 32 * _held.WARPS)  # 16-byte copies a thread a segment
            assert result["copies"] == _held.segments(cols, elem) * per_segment, result
    if result["registers"] is not None:
        assert result["registers"] <= result["register_cap"], result
        if backward or case.startswith("softmax"):  # their caps leave them no spills (but the known ones)
            assert (result["stack"] or 0) <= KNOWN_STACK.get(case, 0), result


# The streamed forward (rows too wide to hold): its rows in registers, no copies into shared memory. Stack a thread its
# sm_90 compiles are known to take at the whole register file (Triton 3.6): the widest 16-bit rows and fp32 rows spill a
# little, and were measured so (docs/kernels.md, "Rows streamed past the held weight")
STREAM_CASES = ["layer_norm_stream:bf16:bf16:50257", "layer_norm_stream:fp16:fp16:57337",
                "layer_norm_stream:bf16:fp32:24001", "layer_norm_stream:fp32:fp32:22001",
                "layer_norm_stream:bf16:bf16:37409",
                # narrower rows, several programs an SM (_layer_norm_held.stream_shape): 2, 5, 5 and 7 segments
                "layer_norm_stream:bf16:bf16:999", "layer_norm_stream:fp32:fp32:4097", "layer_norm_stream:fp32:fp32:9001",
                "layer_norm_stream:fp32:fp32:12345", "layer_norm_stream:bf16:bf16:555"]  # 7 segments; one warp
STREAM_KNOWN_STACK = {"layer_norm_stream:bf16:bf16:50257": 16, "layer_norm_stream:fp16:fp16:57337": 24,
                      "layer_norm_stream:fp32:fp32:22001": 40, "layer_norm_stream:fp32:fp32:9001": 8,
                      "layer_norm_stream:fp32:fp32:12345": 24}  # 16 before the fp32 recentring branch


def test_the_streamed_forward_compiles_for_sm90_into_16_byte_loads_and_stores_within_its_known_spills():
    results = compile_for_sm90(SCRIPT, STREAM_CASES)
    stacks = {}
    for case in STREAM_CASES:
        result = results[case]
        assert result["copies"] == 0 and result["vector_loads"] and result["vector_stores"], result
        _, dtype, param, n = case.split(":")
        wb = 2 * (4 if param == "fp32" else 2)
        shape = _layer_norm_held.stream_shape(int(n), 4 if dtype == "fp32" else 2, wb)
        assert result["register_cap"] == shape.max_regs, result
        # the weight and bias held whole in shared memory, at most a block's
        assert shape.nseg * shape.block * wb <= result["shared"] <= _held.SMEM_PER_BLOCK, result
        stacks[case] = result["stack"] or 0
    # with the Triton the segment limits were measured with (Triton 3.9 spills 136 bytes a thread at 28 16-bit segments)
    if _held.tuned_triton() and all(results[c]["registers"] is not None for c in STREAM_CASES):
        assert all(stacks[c] <= STREAM_KNOWN_STACK.get(c, 0) for c in STREAM_CASES), stacks


def pretend_an_sm90_machine(monkeypatch, module):
    """``module.available()`` (``_held``, ``_gemm_ws``) as on an H200 with a working Gluon, whatever this machine is;
    a fresh ``disable()`` record."""
    monkeypatch.setattr(module, "_DISABLED", [])
    monkeypatch.setattr(module, "interpreting", lambda: False)
    monkeypatch.setattr(module.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(module, "_capable", lambda device_index: True)
    if module.gluon is None:
        monkeypatch.setattr(module, "gluon", object())


@pytest.fixture
def a_machine_that_runs_them(monkeypatch):
    pretend_an_sm90_machine(monkeypatch, _held)


def _compile_failure():
    from triton.compiler.errors import CompilationError

    return CompilationError(None, None, "async_copy_global_to_shared has been removed; call async_load instead")


def test_a_compile_failure_disables_the_held_kernels_with_one_warning(a_machine_that_runs_them):
    assert _held.available()
    with pytest.warns(RuntimeWarning, match="held.*do not compile with Triton .*CompilationError"):
        _held.disable(_compile_failure())
    assert not _held.available() and not _softmax_held.available() and not _layer_norm_held.available()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _held.disable(_compile_failure())  # once is enough


def test_the_held_plans_are_only_for_compute_capability_9(monkeypatch):
    # their sizes are sm_90's shared memory (228 KiB an SM): an A100's 164 KiB would not hold two 100 KiB rows
    _held._capable.cache_clear()
    monkeypatch.setattr(_held.torch.cuda, "get_device_capability", lambda index=None: (8, 0))
    assert not _held._capable(None)
    _held._capable.cache_clear()
    monkeypatch.setattr(_held.torch.cuda, "get_device_capability", lambda index=None: (9, 0))
    assert _held._capable(None)
    _held._capable.cache_clear()


@pytest.mark.parametrize("group", [1, 4], ids=["whole rows", "in slices"])
def test_a_softmax_whose_held_kernel_fails_to_compile_runs_the_plan_without_it(a_machine_that_runs_them, monkeypatch,
                                                                               group):
    def broken(*args):
        raise _compile_failure()

    monkeypatch.setattr(_softmax_held, "split_fits", lambda x2, y2, group: True)
    monkeypatch.setattr(_softmax_held, "launch_split", broken)
    x = torch.randn(4, 40, device=DEVICE)
    plan = softmax.Plan("held", 1, _held.BLOCK, _held.WARPS, group, per_sm=2, max_regs=_held.MAX_REGS,
                        device=_device.of(x.device))
    out = torch.full_like(x, float("nan"))
    with pytest.warns(RuntimeWarning, match="do not compile"):
        softmax._launch(x, out, plan)
    torch.testing.assert_close(out, torch.softmax(x, -1), rtol=1e-5, atol=1e-6)
    assert not _softmax_held.available()


def test_a_layer_norm_whose_held_kernel_fails_to_compile_runs_the_plans_without_it(a_machine_that_runs_them,
                                                                                   monkeypatch):
    def broken(*args):
        raise _compile_failure()

    tuning = dataclasses.replace(layer_norm.DEFAULT_TUNING, held_fwd_min_cols=((2, 8), (4, 8)))
    monkeypatch.setattr(layer_norm, "DEFAULT_TUNING", tuning)
    monkeypatch.setattr(_device, "tuned_here", lambda device: False)
    monkeypatch.setattr(_layer_norm_held, "fits", lambda *args: True)
    monkeypatch.setattr(_layer_norm_held, "launch", broken)
    x, weight, bias = (torch.randn(shape, device=DEVICE) for shape in ((5, 41), 41, 41))
    assert layer_norm._held_forward(x, weight, bias, torch.empty_like(x), tuning)
    with pytest.warns(RuntimeWarning, match="do not compile"):
        y, mean, rstd = layer_norm.forward(x, weight, bias)
    torch.testing.assert_close(y, torch.nn.functional.layer_norm(x, (41,), weight, bias), rtol=1e-5, atol=1e-5)
    assert not layer_norm._held_forward(x, weight, bias, torch.empty_like(x), tuning)


def test_the_register_bound_choices_hold_only_on_the_triton_they_were_measured_with(monkeypatch):
    # the layer-norm backward's shares in registers and the softmax's bf16 widening were sized on sm_90 compiles of
    # one Triton release (_held.TUNED_TRITON); another allocates registers its own way and would spill them
    monkeypatch.setattr(_held.triton, "__version__", _held.TUNED_TRITON + "0")
    assert _held.tuned_triton() and _softmax_held.widen_rows()
    assert _layer_norm_held.bwd_shape(3001, 2, 2).reg_shares
    monkeypatch.setattr(_held.triton, "__version__", "3.9.0")
    assert not _held.tuned_triton() and not _softmax_held.widen_rows()
    assert _layer_norm_held.bwd_shape(3001, 2, 2) == (4, 1024, 3, 2, 4, 128, False)  # shares in shared memory
