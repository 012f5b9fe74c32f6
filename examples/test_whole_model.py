"""A whole small decoder, eager and compiled: kernels pinned per module kind, not as one number.

At model scale "max_kernels(40)" says little when it fails. Here each kernel carries the
``nn.Module`` path that launched it (``layers.1.mlp.up``), the report of a model leads with
a per-module summary that folds repeated layers (``layers.*.mlp: 4 kernels x 2``), and the
tests pin the kernels of each module kind, so a regression names where it happened. Run it
with ``--fusion-baseline`` and the baseline keeps the kernels per module too
(docs/baselines.md).
"""

from collections import Counter

import pytest
import torch
import torch.nn.functional as F

from pytest_fusioncheck.baseline import module_pattern


class RMSNorm(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class Attention(torch.nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(d, 3 * d, bias=False)
        self.out = torch.nn.Linear(d, d, bias=False)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, t, d))


class MLP(torch.nn.Module):
    """Llama's gated MLP: down(silu(gate(x)) * up(x))."""

    def __init__(self, d):
        super().__init__()
        self.gate = torch.nn.Linear(d, 4 * d, bias=False)
        self.up = torch.nn.Linear(d, 4 * d, bias=False)
        self.down = torch.nn.Linear(4 * d, d, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Layer(torch.nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.attn_norm = RMSNorm(d)
        self.attn = Attention(d, heads)
        self.mlp_norm = RMSNorm(d)
        self.mlp = MLP(d)

    def forward(self, x):
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class Decoder(torch.nn.Module):
    def __init__(self, vocab=512, d=64, heads=4, layers=2):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, d)
        self.layers = torch.nn.ModuleList([Layer(d, heads) for _ in range(layers)])
        self.norm = RMSNorm(d)
        self.head = torch.nn.Linear(d, vocab, bias=False)

    def forward(self, ids):
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


@pytest.fixture
def model(fusion):
    torch.manual_seed(0)
    torch._dynamo.reset()
    return Decoder().to(fusion.device).eval()


@pytest.fixture
def ids(fusion):
    return torch.randint(0, 512, (2, 16), device=fusion.device)


def kernels_per_kind(report):
    """Kernels per module pattern (``layers.*.mlp.up``) of a report."""
    return Counter(module_pattern(k.module) for k in report.kernels if k.module)


def test_eager_decoder_kernels_per_module_kind(fusion, model, ids):
    with torch.no_grad():
        report = fusion.profile(model, ids)
    kinds = kernels_per_kind(report)
    # Each RMSNorm is pow, mean, add, rsqrt, mul, mul: six kernels eager.
    assert kinds["layers.*.attn_norm"] == 2 * 6 and kinds["norm"] == 6, str(report)
    # The gated MLP: three GEMMs, the silu and the product. On a GPU cuBLAS may split a
    # GEMM's K into a GEMM kernel and a reduce kernel: up to two kernels a Linear.
    for linear in ("gate", "up", "down"):
        assert 2 <= kinds[f"layers.*.mlp.{linear}"] <= 2 * 2, str(report)
    assert kinds["layers.*.mlp"] == 2 * 2, str(report)
    assert report.kernel_count > 30 and "per module (repeated structure folded)" in str(report)  # led by the summary


@pytest.mark.no_graph_breaks
def test_compiled_decoder_fuses_each_norm_into_one_kernel(fusion, model, ids):
    compiled = torch.compile(model)
    with torch.no_grad():
        report = fusion.profile(compiled, ids)
    kinds = kernels_per_kind(report)
    norms = sum(n for kind, n in kinds.items() if kind.endswith("norm"))
    assert norms <= 2 * 2 + 1, str(report)  # at most one kernel per norm (Inductor fuses it with its neighbours)
    # The GEMMs stay extern kernels (cuBLAS / ATen), each named after its Linear through the
    # source nodes the compiled graph's wrapper lists above its call.
    for linear in ("attn.qkv", "attn.out", "mlp.gate", "mlp.up", "mlp.down"):
        assert kinds[f"layers.*.{linear}"] >= 2, str(report)
    assert kinds["head"] >= 1 and report.kernel_count < 30, str(report)
