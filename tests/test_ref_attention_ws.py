"""reference_kernels._attention_ws: the warp-specialised Gluon attention forward (sm_90, 16-bit).

Without a GPU: its plan fits every described device's shared memory; ``attention.fused`` takes it only where it runs
and takes the tensors, and runs the Triton kernel after a compile failure; ``launch`` refuses what it cannot take; the
kernel compiles for sm_90 into wgmma, TMA and ``setmaxnreg`` without spills (scripts/attn_sass.py). On a GPU
(``gpu``): it matches SDPA at ragged lengths, causal and not, through strided views, and ``fused`` runs it.
"""

from __future__ import annotations

import dataclasses
import importlib.util

import pytest
import torch
import torch.nn.functional as F

from pytest_fusioncheck import profile
from reference_kernels import _attention_ws, _device, _launch, attention
from test_ref_attention import SASS_SCRIPT, TOLERANCES, qkv, reference
from test_ref_held import compile_for_sm90, pretend_an_sm90_machine

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's masked-off lanes

# --------------------------------------------------------------------------- plan


@pytest.mark.parametrize("name", sorted(_device.DESCRIPTIONS))
@pytest.mark.parametrize("head_dim", [64, 128])
def test_the_plan_fits_every_described_devices_resources_or_is_none(name, head_dim):
    device = _device.DESCRIPTIONS[name]
    plan = _attention_ws.plan(head_dim, 2, device)
    need = _attention_ws.consumer_regs(head_dim, _attention_ws.BLOCK_N)
    candidates = [_attention_ws.WsPlan(_attention_ws.BLOCK_N, _attention_ws.STAGES, c) for c in (3, 2)]
    fitting = [p for p in candidates
               if _attention_ws.fits_device(head_dim, 2, p, device) and _attention_ws.regs(p, device)[1] >= need]
    assert (plan and plan._replace(walk=False)) == (fitting[0] if fitting else None)  # the most consumers that fit
    if plan is not None:
        assert plan.walk == _attention_ws.walks(head_dim, 2, plan, device)
        launch_regs, consumer = _attention_ws.regs(plan, device)
        assert launch_regs * 32 * _attention_ws.warps(plan) <= device.regs_per_sm and consumer >= need
    if name in ("H100", "H200"):  # the GPUs it runs on: three consumers at d 64, two at d 128 (192 registers)
        assert plan is not None and plan.consumers == (3 if head_dim == 64 else 2)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_pairs_counts_what_each_tile_computes_padding_included(causal):
    for seq_len in (1, 63, 64, 100, 191, 192, 193, 1000, 1024):
        for rows in (64, 128, 192):
            brute = sum(min(t + rows, seq_len) if causal else seq_len  # a tile's rows see the keys its last row sees
                        for t in range(0, seq_len, rows) for _ in range(rows))
            assert _attention_ws.pairs(seq_len, rows, causal) == brute
            assert brute >= (seq_len * (seq_len + 1) // 2 if causal else seq_len * seq_len)  # every pair covered
            if seq_len % rows == 0 and not causal:
                assert brute == seq_len * seq_len  # no padding


@pytest.mark.parametrize("name", sorted(_device.DESCRIPTIONS))
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_a_sequences_plan_is_a_fitting_one_of_least_modelled_time(name, head_dim, causal):
    device = _device.DESCRIPTIONS[name]
    need = _attention_ws.consumer_regs(head_dim, _attention_ws.BLOCK_N)
    fitting = [p for p in (_attention_ws.WsPlan(_attention_ws.BLOCK_N, _attention_ws.STAGES, c) for c in (3, 2))
               if _attention_ws.fits_device(head_dim, 2, p, device) and _attention_ws.regs(p, device)[1] >= need]
    for seq_len in (1, 100, 384, 512, 1000, 1024, 1536, 2048, 4096, 8192, 16384, 32767):
        plan = _attention_ws.plan(head_dim, 2, device, seq_len, causal)
        if not fitting:
            assert plan is None
            continue
        assert plan._replace(walk=False) in fitting and plan.walk == _attention_ws.walks(head_dim, 2, plan, device)

        def time(p):
            return _attention_ws.pairs(seq_len, p.consumers * _attention_ws.BLOCK_M, causal) / \
                _attention_ws.CONSUMER_GAIN ** p.consumers
        assert time(plan) == min(time(p) for p in fitting)
        if seq_len % 384 == 0 and not causal:  # neither tile pads: the most consumers
            assert plan._replace(walk=False) == fitting[0]


@pytest.mark.parametrize("name", sorted(_device.DESCRIPTIONS))
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("consumers", [2, 3])
def test_a_plan_walks_where_its_counters_and_qs_second_slot_fit(name, head_dim, consumers):
    device = _device.DESCRIPTIONS[name]
    ring = _attention_ws.WsPlan(_attention_ws.BLOCK_N, _attention_ws.STAGES, consumers)
    walk = ring._replace(walk=True)
    spare = _attention_ws.regs(ring, device)[1] - _attention_ws.consumer_regs(head_dim, ring.block_n)
    fits = _attention_ws.fits_device(head_dim, 2, walk, device) and spare >= _attention_ws._WALK_REGS
    assert _attention_ws.walks(head_dim, 2, ring, device) == fits
    # q's second slot: the consumers' q tiles once more
    assert _attention_ws.smem_bytes(head_dim, 2, walk) - _attention_ws.smem_bytes(head_dim, 2, ring) == \
        2 * head_dim * consumers * _attention_ws.BLOCK_M
    if name in ("H100", "H200"):  # d 64's two consumers walk; three hold no register to spare, d 128 no second slot
        assert fits == (head_dim == 64 and consumers == 2)


def test_three_consumers_give_way_where_their_taller_tile_pads_more_than_their_gain():
    h100 = _device.DESCRIPTIONS["H100"]
    # N 1024: three consumers' 192-row tiles compute 1152 rows (1/8 more), their gain is 1.05: two
    assert _attention_ws.plan(64, 2, h100, 1024) == _attention_ws.WsPlan(128, 3, 2, walk=True)  # two consumers walk
    assert _attention_ws.plan(64, 2, h100, 1536).consumers == 3  # eight tiles of 192, twelve of 128: no padding
    assert _attention_ws.plan(64, 2, h100, 16384, causal=True).consumers == 3  # the last of 86 tiles a third used
    assert _attention_ws.plan(64, 2, h100) == _attention_ws.plan(64, 2, h100, 1 << 20)  # no length: a long one


def test_a_consumers_registers_are_its_tiles_and_the_rest():
    assert _attention_ws.consumer_regs(64, 128) == 160  # three consumers' share, 160: no spill (Triton 3.6)
    assert _attention_ws.consumer_regs(128, 128) == 192  # past three consumers' 160 (it spills there)
    assert _attention_ws.consumer_regs(64, 64) == 112


@pytest.mark.parametrize("name", sorted(_device.DESCRIPTIONS))
@pytest.mark.parametrize("consumers", [2, 3])
def test_the_register_split_fits_the_register_file_and_leaves_the_loader_its_share(name, consumers):
    device = _device.DESCRIPTIONS[name]
    plan = _attention_ws.WsPlan(64, 3, consumers)
    launch_regs, consumer_regs = _attention_ws.regs(plan, device)
    threads = 32 * _attention_ws.warps(plan)
    assert threads == 128 * (consumers + 1)  # a warpgroup a consumer, and the loader's
    assert launch_regs % 8 == 0 and consumer_regs % 8 == 0  # setmaxnreg's and the allocator's steps
    assert launch_regs * threads <= device.regs_per_sm  # the program resides
    assert 128 * (consumers * consumer_regs + _attention_ws.LOADER_REGS) <= threads * launch_regs  # the split fits
    assert _attention_ws.LOADER_REGS <= consumer_regs <= 255


def test_the_register_split_of_one_program_an_sm90_sm_is_its_whole_file():
    h100, plan = _device.DESCRIPTIONS["H100"], _attention_ws.WsPlan(128, 3)
    assert _attention_ws.regs(plan, h100) == (168, 240)  # 12 warps: 64512 of 65536 registers
    assert _attention_ws.regs(plan._replace(consumers=3), h100) == (128, 160)  # 16 warps


def test_no_plan_where_the_ring_does_not_fit():
    small = dataclasses.replace(_device.DESCRIPTIONS["H100"], smem_per_sm=100 << 10, smem_per_block=100 << 10)
    assert _attention_ws.plan(128, 2, small) is None  # 32 KB of q + 3 x 64 KB of k and v
    assert _attention_ws.plan(64, 2, small) is None  # 16 KB + 3 x 32 KB
    assert _attention_ws.plan(64, 2, dataclasses.replace(small, smem_per_sm=113 << 10, smem_per_block=113 << 10))


# --------------------------------------------------------------------------- the route through attention.fused


@pytest.fixture
def a_machine_that_runs_it(monkeypatch):
    pretend_an_sm90_machine(monkeypatch, _attention_ws)


WS_PLAN = attention._Plan(32, 16, 4, 1, ws=True)  # the interpreter's tiles, asking for the warp-specialised kernel


def test_fused_takes_the_ws_kernel_only_where_it_runs_takes_the_tensors_and_the_scale_is_positive(
        a_machine_that_runs_it, monkeypatch):
    launched = []
    monkeypatch.setattr(_attention_ws, "launch", lambda q, k, v, out, causal, qk_scale: launched.append(
        (q.shape, causal, qk_scale)))
    takes = [True]
    monkeypatch.setattr(_attention_ws, "fits", lambda *tensors: takes[0])
    q, k, v = qkv((1, 2, 37, 64), torch.bfloat16)
    with _launch.replays_off():  # nothing recorded of the stand-in launch
        attention.fused(q, k, v, causal=True, plan=WS_PLAN)
        assert launched == [((1, 2, 37, 64), True, pytest.approx(attention._LOG2E / 8))]
        expected = reference(q, k, v)
        for why, plan, scale in (("tensors it cannot take", WS_PLAN, None), ("a plan without it", WS_PLAN._replace(
                ws=False), None), ("a negative scale", WS_PLAN, -0.125)):
            takes[0] = why != "tensors it cannot take"
            got = attention.fused(q, k, v, plan=plan, scale=scale)
            torch.testing.assert_close(got, reference(q, k, v, scale=scale) if scale else expected,
                                       **TOLERANCES[torch.bfloat16], msg=why)
        assert len(launched) == 1
        monkeypatch.setattr(_attention_ws, "_capable", lambda device_index: False)  # not sm_90
        takes[0] = True
        torch.testing.assert_close(attention.fused(q, k, v, plan=WS_PLAN), expected, **TOLERANCES[torch.bfloat16])
    assert len(launched) == 1


def test_a_compile_failure_warns_once_disables_it_and_the_triton_kernel_runs(a_machine_that_runs_it, monkeypatch):
    from triton.compiler.errors import CompilationError

    calls = []

    def fails(*args):
        calls.append(args)
        raise CompilationError(None, None, "tma.async_copy_global_to_shared has been removed")

    monkeypatch.setattr(_attention_ws, "launch", fails)
    monkeypatch.setattr(_attention_ws, "fits", lambda *tensors: True)
    q, k, v = qkv((1, 1, 37, 64), torch.float16, seed=1)
    with _launch.replays_off():
        with pytest.warns(RuntimeWarning, match="warp-specialised attention does not compile with Triton "
                                                ".*CompilationError"):
            got = attention.fused(q, k, v, causal=True, plan=WS_PLAN)
        torch.testing.assert_close(got, reference(q, k, v, causal=True), **TOLERANCES[torch.float16])
        assert not _attention_ws.available()
        attention.fused(q, k, v, plan=WS_PLAN)
    assert len(calls) == 1  # not tried again in this process


def test_fits_and_launch_refuse_what_it_cannot_take(monkeypatch):
    q = torch.empty(1, 2, 64, 128, dtype=torch.bfloat16)
    assert not _attention_ws.fits(q, q, q, q)  # not CUDA
    if _attention_ws.gluon is None:
        pytest.skip("this Triton has no Gluon")
    with pytest.raises(ValueError, match="16-bit dtype on CUDA"):
        _attention_ws.launch(q, q, q, q, False, 1.0)
    monkeypatch.setattr(_attention_ws, "_tensors_ok", lambda *tensors: True)  # CPU tensors standing in
    cases = [
        (dict(qk_scale=-1.0), "qk_scale must be positive"),
        (dict(ws_plan=_attention_ws.WsPlan(96, 2)), "block_n 64 or 128"),
        (dict(ws_plan=_attention_ws.WsPlan(128, 1)), "at least two stages"),  # the consumers would wait forever
        (dict(ws_plan=_attention_ws.WsPlan(128, 4)), "bytes of shared memory, more than"),  # 288 KB at head_dim 128
        (dict(ws_plan=_attention_ws.WsPlan(128, 2, 4)), "two or three consumers"),
        (dict(ws_plan=_attention_ws.WsPlan(128, 3, 3, walk=True)), "a walk takes two consumers"),
        (dict(ws_plan=_attention_ws.WsPlan(128, 3, 2, walk=True)), "q's two slots beside the ring"),  # d 128
    ]
    for kwargs, words in cases:
        with pytest.raises(ValueError, match=words):
            _attention_ws.launch(q, q, q, q, False, **{"qk_scale": 1.0, **kwargs})


def test_fits_asks_one_16_bit_dtype_and_shape_a_head_dim_of_64_or_128_and_tma_describable_tensors(monkeypatch):
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))  # CPU tensors standing in
    q = torch.empty(2, 2, 64, 128, dtype=torch.float16)
    assert _attention_ws.fits(q, q, q, q)
    assert not _attention_ws.fits(q.float(), q.float(), q.float(), q.float())
    assert not _attention_ws.fits(q, q.bfloat16(), q, q)
    assert not _attention_ws.fits(q[..., :96], q[..., :96], q[..., :96], q[..., :96])  # head_dim 96
    assert not _attention_ws.fits(q, q[:, :1], q, q)
    odd = torch.empty(2, 2, 64, 128 + 4, dtype=torch.float16)[..., :128]  # a row stride of 264 bytes
    assert not _attention_ws.fits(odd, q, q, q)
    inner = torch.empty(2, 64, 2, 128, dtype=torch.float16).transpose(1, 2)  # (B, N, H, D) storage
    assert _attention_ws.fits(inner, inner, inner, q)
    small = dataclasses.replace(_device.DESCRIPTIONS["H100"], smem_per_sm=100 << 10, smem_per_block=100 << 10)
    monkeypatch.setattr(_attention_ws._device, "of", lambda device: small)
    assert not _attention_ws.fits(q, q, q, q)  # the ring does not fit this device's shared memory


# --------------------------------------------------------------------------- sm_90 compiles (no GPU)

SASS_CASES = [f"ws:{dtype}:d{d}{causal}" for dtype, d in (("bf16", 64), ("bf16", 128), ("fp16", 128))
              for causal in ("", ":causal")] + ["ws:bf16:d128:128x64:s3", "ws:fp16:d64:c2:128x64:s4:causal",
                                                  "ws:bf16:d64:c2", "ws:bf16:d64:c3:192x64:causal",
                                                  "ws:bf16:d64:c2:walk", "ws:fp16:d64:c2:walk:causal"]
# Stack a thread its compiles are known to take: Triton 3.9 spills 24 bytes in d 64's causal default (three consumers
# at 160 registers, its need: consumer_regs), Triton 3.6 none
KNOWN_STACK = {"ws:bf16:d64:causal": 24}


@pytest.fixture(scope="module")
def compiled_for_sm90():
    return compile_for_sm90(SASS_SCRIPT, SASS_CASES, gluon=True)


@pytest.mark.parametrize("case", SASS_CASES)
def test_the_kernel_compiles_for_sm90_into_wgmma_tma_and_setmaxnreg_without_spills(compiled_for_sm90, case):
    sm90 = _device.DESCRIPTIONS["H100"]
    result = compiled_for_sm90[case]
    plan = _attention_ws.WsPlan(*result["plan"])
    assert result["warps"] == _attention_ws.warps(plan), result  # a warpgroup a consumer and the loader's (1 warp used)
    assert result["shared"] <= result["smem_bytes"] <= sm90.smem_per_block, result
    if result["registers"] is None:  # no cuobjdump / nvdisasm in this Triton build: the compile is all there is
        return
    launch_regs, consumer_regs = _attention_ws.regs(plan, sm90)
    assert result["registers"] == launch_regs, result  # the plan's programs an SM reside at once
    assert result["stack"] <= KNOWN_STACK.get(case, 0) and not result["local"], result
    assert result["stl"] == 0 or case in KNOWN_STACK, result
    assert result["hgmma"] > 0 and result["utmaldg"] > 0 and result["utmastg"] > 0 and result["ldgsts"] == 0, result
    assert consumer_regs in result["setmaxnreg"]["alloc"], result
    assert _attention_ws.LOADER_REGS in result["setmaxnreg"]["dealloc"], result


def test_the_sass_script_reads_a_ws_case_and_defaults_to_the_plan_on_an_sm90():
    spec = importlib.util.spec_from_file_location("attn_sass", SASS_SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    case = script.parse("ws:bf16:d128")
    assert case["plan"] == _attention_ws.plan(128, 2, _device.DESCRIPTIONS["H100"]) and not case["causal"]
    case = script.parse("ws:fp16:d128:128x64:s2:causal")
    assert case["plan"] == _attention_ws.WsPlan(64, 2) and case["causal"] and case["kind"] == "ws"
    assert script.parse("ws:bf16:d64:128x64:c2")["plan"] == _attention_ws.WsPlan(64, 3, 2)  # any order
    assert script.parse("ws:bf16:d64:192x64")["plan"] == _attention_ws.WsPlan(64, 3, 3)  # d 64's three consumers
    assert script.parse("ws:bf16:d64:c2:walk")["plan"] == _attention_ws.WsPlan(128, 3, 2, walk=True)
    for bad in ("ws:fp32:d128", "ws:bf16:d128:64x64", "ws:bf16:d128:w8", "ws:bf16:d128:inorder", "ws:bf16:d64:c4",
                "ws:bf16:d64:128x64", "ws:bf16:d64:p2"):
        with pytest.raises(SystemExit):
            script.parse(bad)


# --------------------------------------------------------------------------- GPU


def _needs_it():
    if not _attention_ws.available():
        pytest.skip("the warp-specialised attention runs on sm_90 with Gluon only")


def _sdpa_check(q, k, v, causal, got):
    """``got`` against SDPA in float32: within the dtype's tolerance, no worse than torch's own kernel against a
    float64 reference (plus one output rounding)."""
    expected = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
    torch.testing.assert_close(got.float(), expected, **TOLERANCES[q.dtype])
    exact = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal)
    sdpa = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    error = (got.double() - exact).abs().max().item()
    assert error <= 2 * (sdpa.double() - exact).abs().max().item() + torch.finfo(q.dtype).eps


@pytest.mark.gpu
@pytest.mark.parametrize("ws_plan", [None, _attention_ws.WsPlan(64, 3), _attention_ws.WsPlan(128, 2),
                                     _attention_ws.WsPlan(128, 3, 2), _attention_ws.WsPlan(64, 4, 3),
                                     _attention_ws.WsPlan(128, 3, 2, walk=True), _attention_ws.WsPlan(64, 4, 2, walk=True)],
                         ids=["default", "64x3", "128x2", "two consumers", "three, 64x4", "walk", "walk, 64x4"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape, dtype", [((2, 3, 1, 128), torch.bfloat16), ((2, 3, 65, 64), torch.float16),
                                          ((2, 3, 1000, 128), torch.bfloat16), ((1, 4, 4097, 64), torch.bfloat16),
                                          ((1, 2, 2048, 128), torch.float16),
                                          ((4, 40, 777, 64), torch.float16)], ids=str)  # a walk: ~8 tiles a program
def test_matches_sdpa_at_ragged_lengths(shape, dtype, causal, ws_plan):
    _needs_it()
    if ws_plan is not None and not _attention_ws.fits_device(shape[-1], 2, ws_plan, _device.of(torch.device("cuda"))):
        pytest.skip(f"{ws_plan} does not fit this GPU at head_dim {shape[-1]}")
    torch.manual_seed(0)
    q, k, v = (torch.randn(shape, device="cuda", dtype=dtype) for _ in range(3))
    out = torch.full_like(q, float("nan"))
    _attention_ws.launch(q, k, v, out, causal, attention._LOG2E / shape[-1] ** 0.5, ws_plan)
    assert not out.isnan().any(), "an output element was left unwritten"
    _sdpa_check(q, k, v, causal, out)


@pytest.mark.gpu
def test_heads_inner_views_give_the_result_of_their_contiguous_copies():
    _needs_it()
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 1000, 4, 128, device="cuda", dtype=torch.bfloat16).transpose(1, 2) for _ in range(3))
    out, contiguous = torch.empty_like(q.contiguous()), torch.empty_like(q.contiguous())
    _attention_ws.launch(q, k, v, out, True, 0.1)
    _attention_ws.launch(q.contiguous(), k.contiguous(), v.contiguous(), contiguous, True, 0.1)
    assert torch.equal(out, contiguous)


@pytest.mark.gpu
@pytest.mark.parametrize("shape, kernel", [((2, 8, 4096, 128), "_attention_ws_kernel"),
                                           ((4, 12, 1024, 64), "_attention_walk_kernel")], ids=str)
def test_fused_runs_it_as_one_kernel_at_the_budget_and_replays_it(shape, kernel):
    _needs_it()
    torch.manual_seed(0)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    report = profile(attention.fused, q, k, v, causal=True)  # the default plan takes it
    assert report.kernel_count == 1 and kernel in str(report), str(report)
    need = attention.budget(q, k, v).total
    assert abs(report.bytes - need) <= 0.1 * need, str(report)
    first = attention.fused(q, k, v, causal=True)  # a key's first call plans, its second records
    attention.fused(q, k, v, causal=True)
    again = attention.fused(q, k, v, causal=True)
    assert attention.CALLS.last == "replayed" and torch.equal(first, again)
    _sdpa_check(q, k, v, True, again)
