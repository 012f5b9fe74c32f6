"""reference_kernels.attention: the fused forward against the unfused chain, its budget and its traffic.

Without a GPU the kernel runs under Triton's interpreter (tests/conftest.py) on small
shapes: sequences of 1 to 100, ragged ones (37, 65, 100) included, walked in 32 x 16 tiles
(``attention._INTERPRETER_PLAN``) so that every program takes several unmasked blocks and
the masked ragged / diagonal ones. The GPU plans' tile shapes run under the interpreter
too (``plan=``). Tests marked ``gpu`` compare with torch's SDPA at model shapes and profile
the fused and unfused versions with the plugin.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from pytest_fusioncheck import profile
from reference_kernels import _device, _launch, attention

# The interpreter computes masked-off lanes with numpy, which may warn about them.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# Fused output against the unfused chain computed in float32 and rounded to the dtype: the
# 16-bit kernels round p to the dtype before p @ v (as FlashAttention does), and outputs
# near 2-4 are a 16-bit ulp of 2e-3 (fp16) / 1.6e-2 (bf16) apart.
TOLERANCES = {
    torch.float16: dict(atol=2e-3, rtol=2e-3),
    torch.bfloat16: dict(atol=2e-2, rtol=1.6e-2),
    torch.float32: dict(atol=1e-5, rtol=1e-5),
}

SHAPES = [
    (1, 1, 1, 64),  # one query, one key
    (1, 2, 37, 64),  # ragged: two 16-key blocks + 5, causal diagonal cut mid-block
    (2, 1, 65, 64),  # ragged by one: four whole blocks + 1, three query blocks
    (1, 1, 100, 64),  # four query blocks, the last one ragged
    (1, 1, 48, 128),  # head_dim 128, a whole number of blocks (no ragged stage)
]


def qkv(shape, dtype, seed=0, qk_gain=1.0):
    """q, k, v from a fixed seed; ``qk_gain`` > 1 sharpens the softmax (maxima jump between blocks)."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(shape, generator=g) for _ in range(3))
    return (q * qk_gain).to(DEVICE, dtype), (k * qk_gain).to(DEVICE, dtype), v.to(DEVICE, dtype)


def reference(q, k, v, **kwargs):
    return attention.unfused(q.float(), k.float(), v.float(), **kwargs).to(q.dtype)


# --------------------------------------------------------------------------- numerics


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_fused_matches_the_unfused_chain_and_writes_every_element(shape, dtype, causal, unwritten_reads_nan):
    q, k, v = qkv(shape, dtype)
    y = attention.fused(q, k, v, causal=causal)
    assert y.shape == q.shape and y.dtype == dtype and y.is_contiguous()
    assert not y.isnan().any(), "an output element was left unwritten"
    torch.testing.assert_close(y, reference(q, k, v, causal=causal), **TOLERANCES[dtype])


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_a_sharp_softmax_whose_max_moves_between_blocks_is_rescaled_right(dtype, causal):
    # Scores with a standard deviation near 16: each row's running max jumps by many units
    # between key blocks, so a wrong rescale of l or of the accumulator shows.
    q, k, v = qkv((1, 2, 65, 64), dtype, seed=1, qk_gain=4.0)
    torch.testing.assert_close(attention.fused(q, k, v, causal=causal), reference(q, k, v, causal=causal), **TOLERANCES[dtype])


@pytest.mark.parametrize("scale", [0.3, -0.125], ids=["0.3", "negative"])
def test_an_explicit_scale_is_applied_before_the_max(scale):
    q, k, v = qkv((1, 1, 37, 64), torch.float32, seed=2)
    torch.testing.assert_close(
        attention.fused(q, k, v, causal=True, scale=scale), reference(q, k, v, causal=True, scale=scale), **TOLERANCES[torch.float32]
    )


@pytest.mark.parametrize(
    "plan",
    [
        attention._Plan(128, 64, 8, 3),  # the GPU's 16-bit tiles: one program, most rows past N
        attention._Plan(32, 16, 8, 2),  # the GPU's fp32 tiles at head_dim 128
        attention._Plan(16, 16, 1, 1),  # the smallest: block_m == block_n, one diagonal block
        attention._Plan(64, 16, 4, 1),  # four blocks on each diagonal
        attention._Plan(128, 64, 8, 3, tma=True),  # through TMA: rows past N read as zeros, not written
        attention._Plan(32, 16, 4, 1, tma=True),  # through TMA, several blocks masked and unmasked
    ],
    ids=lambda p: f"{p.block_m}x{p.block_n}" + ("_tma" if p.tma else ""),
)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_every_tile_shape_gives_the_same_answer(plan, causal):
    q, k, v = qkv((1, 1, 100, 64), torch.bfloat16, seed=3)
    y = attention.fused(q, k, v, causal=causal, plan=plan)
    torch.testing.assert_close(y, reference(q, k, v, causal=causal), **TOLERANCES[torch.bfloat16])


def test_causal_row_i_ignores_keys_and_values_after_i():
    q, k, v = qkv((1, 1, 65, 64), torch.float32, seed=4)
    k2, v2 = k.clone(), v.clone()
    k2[..., 40:, :] = 100.0  # would dominate every row that could see them
    v2[..., 40:, :] = 1e4  # (not nan: 0 * nan is nan, in torch's p @ v as in ours)
    y, y2 = attention.fused(q, k, v, causal=True), attention.fused(q, k2, v2, causal=True)
    assert torch.equal(y[..., :40, :], y2[..., :40, :])  # masked keys weigh exactly 0
    torch.testing.assert_close(y2, reference(q, k2, v2, causal=True), atol=1e-2, rtol=1e-5)  # later rows see them
    assert (y2[..., 40:, :] - y[..., 40:, :]).abs().max() > 1


def test_the_tolerance_rejects_a_result_that_misses_the_last_key_or_the_mask():
    q, k, v = qkv((1, 2, 37, 64), torch.bfloat16)
    y = attention.fused(q, k, v)
    torch.testing.assert_close(y, reference(q, k, v), **TOLERANCES[torch.bfloat16])
    with pytest.raises(AssertionError, match="Tensor-likes are not close"):
        torch.testing.assert_close(y, reference(q, k[..., :-1, :], v[..., :-1, :]), **TOLERANCES[torch.bfloat16])
    with pytest.raises(AssertionError, match="Tensor-likes are not close"):
        torch.testing.assert_close(y, reference(q, k, v, causal=True), **TOLERANCES[torch.bfloat16])


@pytest.mark.parametrize(
    "make",
    [
        lambda x: x.transpose(1, 2).contiguous().transpose(1, 2),  # (B, N, H, D) storage, the usual projection layout
        lambda x: torch.stack([x, torch.zeros_like(x)], dim=-1)[..., 0],  # head_dim stride 2
    ],
    ids=["heads-inner", "strided-head-dim"],
)
@pytest.mark.parametrize("tma", [False, True], ids=["pointers", "tma"])
def test_strided_inputs_give_the_result_of_their_contiguous_copies(make, tma):
    q, k, v = qkv((2, 2, 37, 64), torch.float16, seed=5)
    qs, ks, vs = make(q), make(k), make(v)
    assert not qs.is_contiguous()
    plan = attention._INTERPRETER_PLAN._replace(tma=tma) if DEVICE == "cpu" else None
    got = attention.fused(qs, ks, vs, causal=True, plan=plan)
    torch.testing.assert_close(got, attention.fused(q, k, v, causal=True, plan=plan), atol=0, rtol=0)


def test_a_tma_plan_runs_through_pointers_where_tma_cannot_describe_the_tensors(monkeypatch):
    # heads-inner layout whose head stride (100 elements of 2 bytes) breaks TMA's 16-byte rule: the pointer kernel runs
    launched = []
    monkeypatch.setattr(attention, "launch_kernel", lambda kernel, *a, **kw: launched.append(kernel.fn.__name__))
    q = torch.empty(1, 2, 8, 64 + 36, device=DEVICE, dtype=torch.float16)[..., :64]
    aligned = torch.empty(1, 2, 8, 64, device=DEVICE, dtype=torch.float16)
    fp32 = aligned.float()  # fp32 takes pointers: its dots on TMA's tiles spill (the sm_90 compile test below)
    with _launch.replays_off():  # nothing recorded of these stand-in launches
        attention.fused(q, q, q, plan=attention._Plan(16, 16, 4, 1, tma=True))
        attention.fused(aligned, aligned, aligned, plan=attention._Plan(16, 16, 4, 1, tma=True))
        attention.fused(fp32, fp32, fp32, plan=attention._Plan(16, 16, 4, 1, tma=True))
    assert launched == ["_attention_fwd_kernel", "_attention_fwd_tma_kernel", "_attention_fwd_kernel"]


def test_an_empty_batch_or_sequence_gives_an_empty_result():
    for shape in ((0, 2, 8, 64), (1, 2, 0, 64)):
        q = torch.empty(shape, device=DEVICE, dtype=torch.float16)
        assert attention.fused(q, q, q, causal=True).shape == shape


# --------------------------------------------------------------------------- bad input


def test_bad_input_raises_a_clear_error():
    q, k, v = qkv((1, 2, 16, 64), torch.float16)
    cases = [
        ((q.int(), k, v), {}, TypeError, "q has dtype int32"),
        ((q, k.double(), v), {}, TypeError, "k has dtype float64"),
        ((q, k, v.bfloat16()), {}, TypeError, "share a dtype"),
        ((q, k[:, :1], v), {}, ValueError, r"one shape .*\(1, 2, 16, 64\), \(1, 1, 16, 64\)"),
        ((q, k, v[..., :8, :]), {}, ValueError, "one shape"),
        ((q[0], k[0], v[0]), {}, ValueError, "q must have 4 dimension"),
        # Under the interpreter any device passes the per-tensor check, so the pair check speaks;
        # on a GPU the meta tensor is refused on its own first.
        ((q, k, torch.empty(1, 2, 16, 64, dtype=torch.float16, device="meta")), {}, ValueError,
         "one device" if DEVICE == "cpu" else "v is on meta"),
        (tuple(t[..., :32] for t in (q, k, v)), {}, ValueError, "head_dim must be one of 64, 128, got 32"),
        (tuple(torch.cat([t, t[..., :32]], -1) for t in (q, k, v)), {}, ValueError, "head_dim must be one of 64, 128, got 96"),
        (("q", k, v), {}, TypeError, "q must be a torch.Tensor"),
        ((q, k, v), {"scale": float("inf")}, ValueError, "scale must be finite"),
        ((q, k, v), {"plan": attention._Plan(32, 24, 4, 1)}, ValueError, "block_n must be a power of two"),
        ((q, k, v), {"plan": attention._Plan(16, 32, 4, 1)}, ValueError, "dividing block_m"),
    ]
    for args, kwargs, error, words in cases:
        with pytest.raises(error, match=words):
            attention.fused(*args, **kwargs)


def test_a_cpu_tensor_is_refused_when_the_interpreter_is_off(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    q = torch.randn(1, 1, 16, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match="CUDA"):
        attention.fused(q, q, q)


# --------------------------------------------------------------------------- plan


def test_gpu_plans_take_the_ws_kernel_for_16_bit_inputs_else_64x64_tiles_that_shrink_for_short_sequences(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # the GPU's table (the settings touch no device)
    S = attention._attention_settings
    sixteen = attention._Plan(64, 64, 4, 3, ws=True)  # the Triton tiles where the Gluon kernel does not run
    for dtype in (torch.float16, torch.bfloat16):
        assert S(64, dtype, 4096) == sixteen
        assert S(128, dtype, 4096) == sixteen
    assert S(64, torch.float32, 4096) == attention._Plan(64, 16, 8, 2)
    assert S(128, torch.float32, 4096) == attention._Plan(32, 16, 8, 2)
    assert S(128, torch.bfloat16, 37) == sixteen
    assert S(128, torch.bfloat16, 20) == sixteen._replace(block_m=32, block_n=32)
    assert S(64, torch.bfloat16, 5) == sixteen._replace(block_m=16, block_n=16)
    for plan in attention._PLANS.values():
        assert plan.block_m % plan.block_n == 0 and plan.block_n >= 16
    with pytest.raises(ValueError, match="head_dim must be one of 64, 128, got 256"):
        S(256, torch.bfloat16, 4096)


def test_the_interpreter_walks_small_tiles(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # also on a GPU machine
    assert attention._attention_settings(64, torch.float16, 100) == attention._INTERPRETER_PLAN == attention._Plan(32, 16, 4, 1)


# --------------------------------------------------------------------------- sm_90 compiles (no GPU)

SASS_SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "attn_sass.py"
# every plan fused launches on a GPU, causal and not, through pointers, and the 16-bit ones through TMA (fp32 plans
# never take TMA: _tma_allowed); and the TMA kernel at a 128-row tile
SASS_CASES = [f"{kind}:{dtype}:d{d}{causal}" for kind, dtype, d in
              (("ptr", "bf16", 64), ("ptr", "bf16", 128), ("ptr", "fp32", 64), ("ptr", "fp32", 128), ("tma", "bf16", 64),
               ("tma", "bf16", 128)) for causal in ("", ":causal")] + ["tma:bf16:d128:128x64:w8"]


@pytest.fixture(scope="module")
def compiled_for_sm90():
    """scripts/attn_sass.py over SASS_CASES (test_ref_held.compile_for_sm90): {case: what came out}."""
    from test_ref_held import compile_for_sm90

    return compile_for_sm90(SASS_SCRIPT, SASS_CASES, gluon=False)


@pytest.mark.parametrize("case", SASS_CASES)
def test_each_attention_plan_compiles_for_sm90_without_spills_into_what_its_kernel_loads_with(compiled_for_sm90,
                                                                                               case):
    sm90 = _device.DESCRIPTIONS["H100"]
    result = compiled_for_sm90[case]
    assert result["shared"] <= sm90.smem_per_block, result
    if result["registers"] is None:  # no cuobjdump / nvdisasm in this Triton build: the compile is all there is
        return
    assert result["stack"] == 0 and not result["local"] and result["stl"] == 0 and result["ldl"] == 0, result
    assert result["registers"] * 32 * result["warps"] <= sm90.regs_per_sm, result  # a program fits an SM's registers
    if case.startswith("tma:"):  # TMA brings q, k and v in; nothing through cp.async
        assert result["utmaldg"] > 0 and result["ldgsts"] == 0, result
    else:  # k and v pipelined through cp.async
        assert result["utmaldg"] == 0 and result["ldgsts"] > 0, result
    assert (result["hgmma"] > 0) == (":bf16:" in case), result  # fp32's IEEE dots: no tensor cores


def test_the_sass_script_reads_a_case_and_defaults_to_fuseds_plan():
    import importlib.util

    spec = importlib.util.spec_from_file_location("attn_sass", SASS_SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    case = script.parse("ptr:bf16:d128")
    assert case["plan"] == attention._PLANS[(128, 2)] and not case["causal"] and case["kind"] == "ptr"
    case = script.parse("tma:fp32:d64:128x32:w8:s2:causal")
    assert case["plan"] == attention._Plan(128, 32, 8, 2, tma=True) and case["causal"] and case["dtype"] == "fp32"
    for bad in ("gpu:bf16:d128", "ptr:int8:d128", "ptr:bf16:d96", "ptr:bf16:d64:fast"):
        with pytest.raises(SystemExit):
            script.parse(bad)


# --------------------------------------------------------------------------- budget and traffic


def _comment_terms(fn) -> list[tuple[str, str]]:
    """The (read, write) sides of each ``# read ... ; write ...`` comment of ``fn``."""
    return re.findall(r"# read (.+?) ; write (.+?)$", inspect.getsource(fn), flags=re.M)


def _side_bytes(side: str, element_size: int, **dims: int) -> int:
    """``"BHNN + BHND elements + NN bytes"`` in bytes: each group's terms summed, times its unit."""
    if side.strip() == "nothing":
        return 0
    total = 0
    for expression, unit in re.findall(r"((?:\d*[A-Z]+\s*\+\s*)*\d*[A-Z]+) (elements|bytes)", side):
        count = 0
        for term in expression.split("+"):
            coefficient, letters = re.fullmatch(r"\s*(\d*)([A-Z]+)\s*", term).groups()
            value = int(coefficient or 1)
            for letter in letters:
                value *= dims[letter]
            count += value
        total += count * (element_size if unit == "elements" else 1)
    return total


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_unfused_traffic_is_the_sum_of_the_unfused_line_comments(dtype, causal):
    dims = dict(B=2, H=3, N=40, D=64)
    q = torch.empty(tuple(dims.values()), dtype=dtype, device="meta")
    terms = _comment_terms(attention.unfused)
    assert len(terms) == 7, "scores, scale, mask (ones, triu, fill), softmax, @ v: one comment each"
    if not causal:
        terms = [t for t in terms if "NN bytes" not in "".join(t)]  # the three mask lines
        assert len(terms) == 4
    traffic = attention.unfused_traffic(q, q, q, causal=causal)
    assert traffic.read_bytes == sum(_side_bytes(r, q.element_size(), **dims) for r, _ in terms)
    assert traffic.write_bytes == sum(_side_bytes(w, q.element_size(), **dims) for _, w in terms)


def test_budget_reads_q_k_v_once_and_writes_the_output_once():
    meta = dict(device="meta", dtype=torch.bfloat16)
    q = torch.empty(4, 16, 2048, 128, **meta)  # 2^24 elements, 32 MiB each
    b = attention.budget(q, q, q)
    assert (b.read_bytes, b.write_bytes, b.total) == (96 * 2**20, 32 * 2**20, 128 * 2**20)
    assert attention.budget(q, q, q, causal=True) == b  # masking skips compute, not compulsory bytes
    assert attention.budget(*(torch.empty(1, 2, 37, 64, dtype=torch.float32, device="meta"),) * 3).total == 4 * 2 * 37 * 64 * 4


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_unfused_bytes_grow_as_n_squared_and_fused_bytes_as_n(causal):
    def sized(n):
        q = torch.empty(1, 16, n, 128, device="meta", dtype=torch.bfloat16)
        return attention.budget(q, q, q).total, attention.unfused_traffic(q, q, q, causal=causal).total

    B_H, D, elt = 16, 128, 2
    n_squared = B_H * (6 + 2 * causal) * elt + 4 * causal  # bytes per (query, key) pair: score round trips, mask
    for n in (512, 1024, 2048, 4096, 8192):
        fused, unfused = sized(n)
        assert fused == 4 * B_H * n * D * elt  # linear: q, k, v, o
        assert unfused == n_squared * n * n + fused  # the same linear part plus N^2
        fused2, unfused2 = sized(2 * n)
        assert fused2 == 2 * fused
        assert unfused2 / unfused > 3.5  # toward 4 as the N^2 part takes over
    fused, unfused = sized(4096)
    assert unfused >= 4 * fused  # what the GPU test measures: here 49x (causal 65x)


def test_on_cpu_the_plugin_counts_one_kernel_at_the_budget_fused_and_the_commented_bytes_unfused():
    q, k, v = qkv((2, 2, 65, 64), torch.float16)
    for causal, kernels in ((False, 4), (True, 7)):
        fused = profile(attention.fused, q, k, v, causal=causal)
        assert fused.kernel_count == 1, str(fused)
        assert fused.bytes == attention.budget(q, k, v).total, str(fused)
        unfused = profile(attention.unfused, q, k, v, causal=causal)
        assert unfused.kernel_count == kernels, str(unfused)
        assert unfused.bytes == attention.unfused_traffic(q, k, v, causal=causal).total, str(unfused)


# --------------------------------------------------------------------------- in a model


def _fused_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """A Hugging Face attention function as a user writes one around ``fused``: grouped k/v heads repeated, the
    output (batch, seq, heads, head_dim). Causal, no padding mask."""
    groups = getattr(module, "num_key_value_groups", 1)
    key, value = (t.repeat_interleave(groups, dim=1) for t in (key, value))
    return attention.fused(query, key, value, causal=True, scale=scaling).transpose(1, 2), None


@pytest.mark.parametrize("form", ["eager", "compiled"])
def test_a_llama_whose_attention_is_fused_names_each_layers_kernel_at_its_budget_through_a_lambda(form):
    transformers = pytest.importorskip("transformers")
    from torch._dynamo.utils import counters

    device = DEVICE  # CPU under the interpreter; on a GPU, natively
    transformers.AttentionInterface.register("reference_fused", _fused_attention)
    torch.manual_seed(0)
    dtype = torch.float32 if device == "cpu" else torch.float16  # on sm_90 the warp-specialised kernel
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=1024)).eval().to(device, dtype)  # head_dim 64
    ids = torch.randint(0, 256, (2, 16 if device == "cpu" else 1000), device=device)
    with torch.no_grad():
        model.set_attn_implementation("sdpa")
        expected = model(ids).logits
        model.set_attn_implementation("reference_fused")
        torch._dynamo.reset()
        counters.clear()
        fn = (lambda t: model(t).logits) if form == "eager" else torch.compile(lambda t: model(t).logits)
        report = profile(fn, ids)
        got = fn(ids)
    assert not counters["graph_break"], dict(counters["graph_break"])  # compiled: fused is one opaque op
    torch.testing.assert_close(got, expected, **(dict(atol=1e-4, rtol=1e-4) if device == "cpu" else
                                                  dict(atol=2e-2, rtol=2e-2)))
    ours = [k for k in report.kernels if k.name.startswith("_attention")]
    assert not [k for k in report.kernels if k.name.endswith("::attention")], str(report)  # the op is not a kernel
    # one a layer (compiled: the op's launch, not the op besides it), named by the layer's attention
    assert [k.module for k in ours] == ["model.layers.0.self_attn", "model.layers.1.self_attn"], str(report)
    q = torch.empty(2, 2, ids.shape[1], 64, dtype=dtype, device="meta")
    need = attention.budget(q, q, q).total  # q, k, v read once, the output written once
    for k in ours:
        assert k.bytes is not None and abs(k.bytes - need) <= 0.01 * need, str(report)
        assert k.source.startswith("reference_kernels/"), str(report)  # the launch's line


# --------------------------------------------------------------------------- GPU


def _max_error(y, expected):
    return (y.float() - expected).abs().max().item()


@pytest.mark.gpu
@pytest.mark.parametrize(
    "shape, dtype, causal",
    [
        ((4, 16, 2048, 128), torch.bfloat16, True),
        ((4, 16, 2048, 128), torch.bfloat16, False),
        ((4, 16, 2048, 64), torch.float16, True),
        ((2, 8, 1000, 128), torch.float16, False),  # ragged: 1000 = 7 x 128 + 104
        ((2, 8, 4097, 64), torch.bfloat16, True),  # ragged by one
        ((1, 4, 1024, 128), torch.float32, True),
    ],
    ids=str,
)
def test_matches_torch_sdpa_at_model_shapes(shape, dtype, causal):
    torch.manual_seed(0)
    q, k, v = (torch.randn(shape, device="cuda", dtype=dtype) for _ in range(3))
    ours = attention.fused(q, k, v, causal=causal)
    sdpa = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    exact = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal)
    tol = TOLERANCES[dtype] if dtype != torch.float32 else dict(atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(ours, sdpa, **tol)
    # No worse than torch's own kernel against a float64 reference (plus one output rounding).
    assert _max_error(ours, exact) <= 2 * _max_error(sdpa, exact) + torch.finfo(dtype).eps


@pytest.mark.gpu
def test_the_plugin_sees_one_kernel_at_the_budget_fused_and_over_four_times_the_bytes_unfused():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 8, 4096, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    need = attention.budget(q, k, v).total
    fused = profile(attention.fused, q, k, v, causal=True)
    assert fused.kernel_count == 1, str(fused)
    assert abs(fused.bytes - need) <= 0.1 * need, str(fused)
    unfused = profile(attention.unfused, q, k, v, causal=True)
    assert unfused.kernel_count > 1, str(unfused)
    assert unfused.bytes >= 4 * need, str(unfused)
    assert abs(unfused.bytes - attention.unfused_traffic(q, k, v, causal=True).total) <= 0.01 * unfused.bytes, str(unfused)
