"""The corpus the byte model and the CPU kernel model are checked on (docs/bytes.md).

Two lists, each of ``Case(name, kind, make)`` where ``make(device)`` returns ``(fn, args)``:

* ``FIDELITY``: GPU cases at >= 4x the H200's 60 MB L2, so DRAM counters see every byte
  (writes left in the L2 at a kernel's end are not counted). Eager / compiled /
  hand-written Triton, fp32 / bf16 / fp16, cuBLAS and cuBLASLt GEMMs with bias, split-K
  shapes, looped and persistent reductions, TMA kernels, attention, gathers, in-place and
  ``out=`` ops, non-contiguous inputs, the reference kernels. ``kind`` says how a kernel's
  modelled bytes must relate to Nsight Compute's DRAM bytes: ``"compulsory"`` (within
  10%), ``"gemm"`` (modelled = compulsory bytes, never above measured).
* ``BLOCKS``: real-model blocks (GPT-2 / BERT / Llama shapes, small token counts) in
  eager and compiled form, fp32, cheap enough for CPU: the CPU kernel model is compared
  with the CUDA kernel count recorded on the H200 (``tests/data/fidelity_h200.json``).

``benchmarks/fidelity.py`` runs them and writes that file; ``tests/test_fidelity.py``
checks against it (CPU) and against ncu (GPU).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F

MiB = 2**20


@dataclass(frozen=True)
class Case:
    name: str
    kind: str  # "compulsory" or "gemm": how modelled bytes must relate to measured
    make: Callable[[str], tuple[Callable[..., Any], tuple]]


def _rand(*shape: int, dtype=torch.float32, device="cuda") -> torch.Tensor:
    return torch.randn(*shape, dtype=dtype, device=device)


# --------------------------------------------------------------------------- functions


def five_op_softmax(x):
    m = x.max(dim=-1, keepdim=True).values  # read MN ; write M
    z = x - m  # read MN + M ; write MN
    e = z.exp()  # read MN ; write MN
    s = e.sum(dim=-1, keepdim=True)  # read MN ; write M
    return e / s  # read MN + M ; write MN


def bias_gelu(x, b):
    return F.gelu(x + b)


def layer_norm_gelu(x, w, b):
    return F.gelu(F.layer_norm(x, (x.shape[-1],), w, b))


def rms_norm(x, w, eps: float = 1e-6):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def softmax_last(x):
    return torch.softmax(x, dim=-1)


def add_inplace(x, y):
    return x.add_(y)


def add_out(x, y, out):
    return torch.add(x, y, out=out)


def transpose_copy(x):
    return x.t().contiguous()


def cast_bf16(x):
    return x.to(torch.bfloat16)


def mul_inplace(x):
    x.mul_(2.0)
    return x


def slice_add(x, y):
    return x[:, : y.shape[1]] + y


def sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def column_sum(x):
    return x.sum(dim=0)


# --------------------------------------------------------------------------- blocks


class GPT2MLP(torch.nn.Module):
    """GPT-2's MLP: c_fc, GELU (tanh), c_proj, with the residual add."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.c_fc = torch.nn.Linear(d, 4 * d)
        self.c_proj = torch.nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class LlamaMLP(torch.nn.Module):
    """Llama's SwiGLU MLP: down(silu(gate(x)) * up(x)), no biases."""

    def __init__(self, d: int, hidden: int) -> None:
        super().__init__()
        self.gate_proj = torch.nn.Linear(d, hidden, bias=False)
        self.up_proj = torch.nn.Linear(d, hidden, bias=False)
        self.down_proj = torch.nn.Linear(hidden, d, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class BertSelfOutput(torch.nn.Module):
    """BERT's attention output: dense, dropout (eval: identity), residual, LayerNorm."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.dense = torch.nn.Linear(d, d)
        self.dropout = torch.nn.Dropout(0.1)
        self.LayerNorm = torch.nn.LayerNorm(d, eps=1e-12)

    def forward(self, hidden, residual):
        return self.LayerNorm(self.dropout(self.dense(hidden)) + residual)


class LlamaRMSNorm(torch.nn.Module):
    def __init__(self, d: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)


class Attention(torch.nn.Module):
    """A GPT-2-style attention: fused QKV projection, SDPA (causal), output projection."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.c_attn = torch.nn.Linear(d, 3 * d)
        self.c_proj = torch.nn.Linear(d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.c_attn(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(b, t, d))


class BertEmbeddings(torch.nn.Module):
    """BERT's embeddings: word + position + token type, then LayerNorm."""

    def __init__(self, vocab: int, d: int, positions: int) -> None:
        super().__init__()
        self.word = torch.nn.Embedding(vocab, d)
        self.position = torch.nn.Embedding(positions, d)
        self.token_type = torch.nn.Embedding(2, d)
        self.norm = torch.nn.LayerNorm(d, eps=1e-12)

    def forward(self, ids):
        pos = torch.arange(ids.shape[1], device=ids.device)
        e = self.word(ids) + self.position(pos)[None] + self.token_type(torch.zeros_like(ids))
        return self.norm(e)


def _module(factory: Callable[[], torch.nn.Module], *shapes: tuple, compiled: bool = False):
    def make(device: str):
        torch.manual_seed(0)
        module = factory().to(device).eval()
        args = tuple(torch.randn(*s, device=device) for s in shapes)
        return (torch.compile(module) if compiled else module), args

    return make


def _embeddings(compiled: bool):
    def make(device: str):
        torch.manual_seed(0)
        module = BertEmbeddings(30522, 768, 512).to(device).eval()
        ids = torch.randint(0, 30522, (4, 128), device=device)
        return (torch.compile(module) if compiled else module), (ids,)

    return make


_BLOCKS = {
    "gpt2 mlp (768, 256 tokens)": lambda c: _module(lambda: GPT2MLP(768), (256, 768), compiled=c),
    "llama mlp (1024->2816, 256 tokens)": lambda c: _module(lambda: LlamaMLP(1024, 2816), (256, 1024), compiled=c),
    "bert attention output + layer norm (768)": lambda c: _module(lambda: BertSelfOutput(768), (256, 768), (256, 768), compiled=c),
    "llama rmsnorm (4096, 256 tokens)": lambda c: _module(lambda: LlamaRMSNorm(4096), (256, 4096), compiled=c),
    "gpt2 attention (768, 12 heads, 2x128)": lambda c: _module(lambda: Attention(768, 12), (2, 128, 768), compiled=c),
    "bert embeddings (30522 x 768, 4x128)": _embeddings,
}
BLOCKS: list[Case] = [
    Case(f"{'compiled' if compiled else 'eager'} {name}", "block", make(compiled))
    for name, make in _BLOCKS.items()
    for compiled in (False, True)
]


# --------------------------------------------------------------------------- fidelity


def _f(fn: Callable[..., Any], *shapes_dtypes: Any, compiled: bool = False):
    """A case calling ``fn`` on fresh tensors: each of ``shapes_dtypes`` is (shape, dtype)."""

    def make(device: str):
        torch.manual_seed(0)
        args = tuple(_rand(*shape, dtype=dtype, device=device) for shape, dtype in shapes_dtypes)
        return (torch.compile(fn) if compiled else fn), args

    return make


def _out(device: str):
    x, y = _rand(32768, 4096, device=device), _rand(32768, 4096, device=device)
    return add_out, (x, y, torch.empty_like(x))


def _embedding(device: str):
    table = _rand(128256, 4096, dtype=torch.bfloat16, device=device)  # Llama-3 vocab: 1 GiB
    ids = torch.randint(0, 128256, (32768,), device=device)
    return F.embedding, (ids, table)


def _linear(m: int, k: int, n: int, dtype, bias: bool = True):
    def make(device: str):
        torch.manual_seed(0)
        lin = torch.nn.Linear(k, n, bias=bias, device=device, dtype=dtype)
        return lin, (_rand(m, k, dtype=dtype, device=device),)

    return make


def _sdpa(device: str):
    q, k, v = (_rand(8, 32, 2048, 128, dtype=torch.bfloat16, device=device) for _ in range(3))
    return sdpa, (q, k, v)


def _compiled_mlp(device: str):
    torch.manual_seed(0)
    mlp = GPT2MLP(4096).to(device=device, dtype=torch.bfloat16)
    return torch.compile(mlp), (_rand(16384, 4096, dtype=torch.bfloat16, device=device),)


def _reference(subject: str, device: str):
    import reference_kernels

    torch.manual_seed(0)
    mod = reference_kernels.load(subject)
    if subject == "softmax":
        return mod.fused, (_rand(8192, 8192, device=device),)
    if subject == "layer_norm":
        x = _rand(32768, 4096, dtype=torch.bfloat16, device=device)
        return mod.fused, (x, _rand(4096, dtype=torch.bfloat16, device=device), _rand(4096, dtype=torch.bfloat16, device=device))
    if subject == "gemm_epilogue":
        a = _rand(8192, 4096, dtype=torch.bfloat16, device=device)
        b = _rand(4096, 8192, dtype=torch.bfloat16, device=device)
        return mod.fused, (a, b, _rand(8192, dtype=torch.bfloat16, device=device))
    x = _rand(8192, 14336, dtype=torch.bfloat16, device=device)
    return mod.fused, (x, _rand(14336, dtype=torch.bfloat16, device=device))


def _ref(subject: str):
    return lambda device: _reference(subject, device)


BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
FIDELITY: list[Case] = [
    Case("eager add fp32 32768x4096", "compulsory", _f(torch.add, ((32768, 4096), FP32), ((32768, 4096), FP32))),
    Case("eager bias+gelu bf16 16384x8192", "compulsory", _f(bias_gelu, ((16384, 8192), BF16), ((8192,), BF16))),
    Case("eager five-op softmax fp32 8192x8192", "compulsory", _f(five_op_softmax, ((8192, 8192), FP32))),
    Case("eager softmax fp32 8192x8192", "compulsory", _f(softmax_last, ((8192, 8192), FP32))),
    Case("eager softmax bf16 4096x50257 (GPT-2 vocab)", "compulsory", _f(softmax_last, ((4096, 50257), BF16))),
    Case("eager layer_norm bf16 32768x4096", "compulsory", _f(lambda x, w, b: F.layer_norm(x, (4096,), w, b), ((32768, 4096), BF16), ((4096,), BF16), ((4096,), BF16))),
    Case("eager column sum fp32 16384x8192", "compulsory", _f(column_sum, ((16384, 8192), FP32))),
    Case("eager add_ in place fp32 32768x4096", "compulsory", _f(add_inplace, ((32768, 4096), FP32), ((32768, 4096), FP32))),
    Case("eager add out= fp32 32768x4096", "compulsory", _out),
    Case("eager transpose copy fp32 8192x8192 (non-contiguous)", "compulsory", _f(transpose_copy, ((8192, 8192), FP32))),
    Case("eager cast fp32->bf16 32768x4096", "compulsory", _f(cast_bf16, ((32768, 4096), FP32))),
    Case("eager embedding bf16 128256x4096, 32768 ids", "compulsory", _embedding),
    Case("compiled bias+gelu fp16 16384x8192", "compulsory", _f(bias_gelu, ((16384, 8192), FP16), ((8192,), FP16), compiled=True)),
    Case("compiled layer_norm+gelu fp32 16384x4096 (looped reduction)", "compulsory", _f(layer_norm_gelu, ((16384, 4096), FP32), ((4096,), FP32), ((4096,), FP32), compiled=True)),
    Case("compiled softmax fp32 65536x1024 (persistent reduction)", "compulsory", _f(softmax_last, ((65536, 1024), FP32), compiled=True)),
    Case("compiled softmax bf16 4096x32000 (Llama-2 vocab)", "compulsory", _f(softmax_last, ((4096, 32000), BF16), compiled=True)),
    Case("compiled rms_norm bf16 32768x4096", "compulsory", _f(rms_norm, ((32768, 4096), BF16), ((4096,), BF16), compiled=True)),
    Case("compiled mul_ in place fp32 32768x4096", "compulsory", _f(mul_inplace, ((32768, 4096), FP32), compiled=True)),
    Case("compiled slice+add fp32 16384x8192[:, :4096]", "compulsory", _f(slice_add, ((16384, 8192), FP32), ((16384, 4096), FP32), compiled=True)),
    Case("reference softmax fp32 8192x8192", "compulsory", _ref("softmax")),
    Case("reference layer_norm bf16 32768x4096", "compulsory", _ref("layer_norm")),
    Case("reference bias_gelu_dropout bf16 8192x14336", "compulsory", _ref("bias_gelu_dropout")),
    Case("reference gemm_epilogue bf16 8192x4096x8192 (TMA)", "gemm", _ref("gemm_epilogue")),
    Case("eager mm bf16 8192x8192x8192", "gemm", _f(torch.mm, ((8192, 8192), BF16), ((8192, 8192), BF16))),
    Case("eager linear+bias bf16 8192x4096->16384 (cuBLASLt)", "gemm", _linear(8192, 4096, 16384, BF16)),
    Case("eager linear+bias fp16 128x8192->8192 (small M)", "gemm", _linear(128, 8192, 8192, FP16)),
    Case("eager linear fp32 64x16384->16384 (split-K shape)", "gemm", _linear(64, 16384, 16384, FP32, bias=False)),
    Case("compiled gpt2 mlp bf16 16384x4096", "gemm", _compiled_mlp),
    Case("eager sdpa bf16 8x32x2048x128 causal (flash)", "gemm", _sdpa),
]

CASES = {c.name: c for c in FIDELITY + BLOCKS}


# --------------------------------------------------------------------------- the code users write
# Training steps, optimizer steps, losses, partial-touch ops, closures and whole models, as
# users call them (issue 54). Rules (benchmarks/fidelity.py, docs/bytes.md):
# "multi": every launch of a multi-launch op moving >= 16 MiB within 15% of ncu;
# "partial": ops that touch part of a tensor, modelled never above measured (+10%), and
#   every kernel moving >= 16 MiB within 10%;
# "step": a training step: every kernel measured (ncu's count = the plugin's), GEMMs at
#   compulsory bytes never above measured, other kernels moving >= 16 MiB within 10%.


def _training_step(device: str):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(4096, 11008), torch.nn.GELU(), torch.nn.Linear(11008, 4096),
    ).to(device=device, dtype=torch.bfloat16)
    x = _rand(8192, 4096, dtype=torch.bfloat16, device=device)

    def step():
        model.zero_grad(set_to_none=False)
        model(x).float().sum().backward()

    model(x).float().sum().backward()  # the gradients exist before the profiled step
    return step, ()


def _adamw(flavour: str):
    def make(device: str):
        torch.manual_seed(0)
        params = [torch.nn.Parameter(_rand(4096, 4096, device=device)) for _ in range(6)]
        for p in params:
            p.grad = torch.randn_like(p)
        opt = torch.optim.AdamW(params, **{flavour: True})
        return opt.step, ()

    return make


def _cross_entropy(compiled: bool):
    def make(device: str):
        torch.manual_seed(0)
        logits = _rand(8192, 50257, dtype=torch.bfloat16, device=device)
        target = torch.randint(0, 50257, (8192,), device=device)
        fn = (lambda z, t: F.cross_entropy(z, t))
        return (torch.compile(fn) if compiled else fn), (logits, target)

    return make


def _index_add(device: str):
    torch.manual_seed(0)
    target = torch.zeros(1 << 20, 256, device=device)  # 1 GiB; 65536 rows touched
    index = torch.randperm(1 << 20, device=device)[: 1 << 16]
    source = _rand(1 << 16, 256, device=device)
    return (lambda: target.index_add_(0, index, source)), ()


def _scatter_add(device: str):
    torch.manual_seed(0)
    target = torch.zeros(1 << 20, 256, device=device)
    index = torch.randperm(1 << 20, device=device)[: 1 << 16, None].expand(1 << 16, 256)
    source = _rand(1 << 16, 256, device=device)
    return (lambda: target.scatter_add_(0, index, source)), ()


def _fill(device: str):
    x = torch.empty(32768, 4096, device=device)
    return (lambda: x.zero_()), ()


def _conv_bn(device: str):
    torch.manual_seed(0)
    block = torch.nn.Sequential(torch.nn.Conv2d(256, 256, 3, padding=1), torch.nn.BatchNorm2d(256), torch.nn.ReLU())
    block = block.to(device=device, dtype=torch.bfloat16, memory_format=torch.channels_last).eval()
    x = _rand(64, 256, 56, 56, dtype=torch.bfloat16, device=device).to(memory_format=torch.channels_last)
    return (lambda t: block(t)), (x,)


def _fp8_gemm(device: str):
    torch.manual_seed(0)
    a = _rand(8192, 8192, device=device).to(torch.float8_e4m3fn)
    b = _rand(8192, 8192, device=device).to(torch.float8_e4m3fn).t()  # column-major, as _scaled_mm needs
    one = torch.ones((), device=device)
    return (lambda x, y: torch._scaled_mm(x, y, one, one, out_dtype=torch.bfloat16)), (a, b)


def _closure_over_compiled_mlp(device: str):
    torch.manual_seed(0)
    mlp = torch.compile(GPT2MLP(4096).to(device=device, dtype=torch.bfloat16))
    x = _rand(16384, 4096, dtype=torch.bfloat16, device=device)
    return (lambda: mlp(x)), ()


USER_CODE: list[Case] = [
    Case("training step bf16 Linear 4096->11008, GELU, back, 8192 tokens", "step", _training_step),
    Case("fused AdamW step fp32 6x4096x4096", "multi", _adamw("fused")),
    Case("foreach AdamW step fp32 6x4096x4096", "multi", _adamw("foreach")),
    Case("eager cross_entropy bf16 8192x50257", "partial", _cross_entropy(False)),
    Case("compiled cross_entropy bf16 8192x50257", "partial", _cross_entropy(True)),
    Case("eager index_add_ fp32 65536 of 1048576 rows x 256", "partial", _index_add),
    Case("eager scatter_add_ fp32 65536 of 1048576 rows x 256", "partial", _scatter_add),
    Case("eager zero_ fp32 32768x4096 (a fill)", "partial", _fill),
    Case("eager conv3x3 + batchnorm + relu bf16 64x256x56x56 (channels last)", "gemm", _conv_bn),
    Case("eager fp8 GEMM 8192^3 (_scaled_mm, bf16 out)", "gemm", _fp8_gemm),
    Case("lambda over a compiled gpt2 mlp bf16 16384x4096", "gemm", _closure_over_compiled_mlp),
]

CASES.update({c.name: c for c in USER_CODE})
