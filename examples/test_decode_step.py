"""A batch-1 decode step: eager PyTorch is launch-bound, a CUDA graph recovers the gap.

One new token at batch 1 goes through a small transformer (two pre-norm blocks, attention
over a fixed-length context held in a KV cache, a gated MLP) to its logits. Each kernel
does a few microseconds of work, and eager PyTorch spends longer launching it than the GPU
spends running it: the report says "launch-bound (..% of the wall time idle)". There are
two ways out, and the tests measure both:

* ``torch.compile`` fuses the elementwise work (norms, activations, residual adds) into
  fewer kernels;
* ``torch.compile(mode="reduce-overhead")`` replays the whole step as one CUDA graph.

``fusion.profile(fn, ..., graph_replay=True)`` measures what a graph would recover of the
eager step without compiling anything: it replays the call from a ``torch.cuda.CUDAGraph``
and the report gives that time next to the eager wall time (docs/launch_bound.md). On CPU
there are no launches to save: the kernel counts are checked there, the timings are not.
"""

import pytest
import torch
import torch.nn.functional as F

D, HEADS, CONTEXT, VOCAB, LAYERS = 256, 4, 127, 1024, 2

on_gpu = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="launch overhead and CUDA graphs are GPU figures; on CPU the tests check kernel counts only",
)


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

    def forward(self, x, k_cache, v_cache):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        k = torch.cat([k_cache, k], dim=2)  # the context's keys, then the new token's
        v = torch.cat([v_cache, v], dim=2)
        y = F.scaled_dot_product_attention(q, k, v)  # one query: no causal mask needed
        return self.out(y.transpose(1, 2).reshape(b, t, d))


class MLP(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.gate = torch.nn.Linear(d, 4 * d, bias=False)
        self.up = torch.nn.Linear(d, 4 * d, bias=False)
        self.down = torch.nn.Linear(4 * d, d, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Block(torch.nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.attn_norm = RMSNorm(d)
        self.attn = Attention(d, heads)
        self.mlp_norm = RMSNorm(d)
        self.mlp = MLP(d)

    def forward(self, x, k_cache, v_cache):
        x = x + self.attn(self.attn_norm(x), k_cache, v_cache)
        return x + self.mlp(self.mlp_norm(x))


class DecodeStep(torch.nn.Module):
    """Logits of the next token, given one token and a KV cache of ``CONTEXT`` positions."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, D)
        self.layers = torch.nn.ModuleList([Block(D, HEADS) for _ in range(LAYERS)])
        self.norm = RMSNorm(D)
        self.head = torch.nn.Linear(D, VOCAB, bias=False)
        cache = (LAYERS, 1, HEADS, CONTEXT, D // HEADS)
        self.register_buffer("k_cache", torch.randn(cache))  # stands in for a prompt's keys and values
        self.register_buffer("v_cache", torch.randn(cache))

    def forward(self, token):
        x = self.embed(token)
        for i, layer in enumerate(self.layers):
            x = layer(x, self.k_cache[i], self.v_cache[i])
        return self.head(self.norm(x))


@pytest.fixture
def model(fusion):
    torch.manual_seed(0)
    torch._dynamo.reset()
    yield DecodeStep().to(fusion.device).eval()
    torch._dynamo.reset()


@pytest.fixture
def token(fusion):
    return torch.tensor([[7]], device=fusion.device)


@torch.no_grad()
def test_the_eager_step_launches_dozens_of_small_kernels_and_its_report_fits_a_screen(fusion, model, token):
    report = fusion.profile(model, token)
    # Per block: two norms of six kernels, four GEMMs, two cats, attention, SiLU, product, two adds.
    assert report.kernel_count >= 2 * 20, str(report)
    text = str(report)  # more than 30 kernels: the module summary and the top 10 rows only
    assert "per module (repeated structure folded):" in text and "top 10 of" in text, text
    assert len(text.splitlines()) <= 40, text


@on_gpu
@torch.no_grad()
def test_the_eager_step_is_launch_bound_and_a_cuda_graph_recovers_most_of_the_idle_time(fusion, model, token):
    report = fusion.profile(model, token, graph_replay=True)
    assert report.launch_bound, str(report)  # kernels of a few us, the GPU idle most of the wall time
    assert report.graph_time_s is not None, report.graph_note
    assert report.graph_recovered_share > 0.5, str(report)


@torch.no_grad()
def test_compiling_the_step_fuses_it_into_fewer_kernels(fusion, model, token):
    eager = fusion.profile(model, token)
    compiled = fusion.profile(torch.compile(model), token)
    assert compiled.kernel_count < eager.kernel_count, str(compiled)
    torch.testing.assert_close(compiled.output, eager.output, rtol=1e-4, atol=1e-4)


@torch.no_grad()
def test_the_reduce_overhead_step_replays_one_graph_and_recovers_most_of_the_eager_gap(fusion, model, token):
    step = torch.compile(model, mode="reduce-overhead")
    for _ in range(3):  # compile, record the graph, replay it
        logits = step(token).clone()  # a graph's outputs are overwritten by its next replay: keep a copy
    torch.testing.assert_close(logits, model(token), rtol=1e-4, atol=1e-4)
    eager = fusion.profile(model, token, graph_replay=True)  # timed: median wall and device time
    graphed = fusion.profile(step, token, graph_replay=True)
    if fusion.device != "cuda":
        assert graphed.kernel_count < eager.kernel_count, str(graphed)  # on CPU: compiled, no graph
        return
    assert "already replays CUDA graph" in (graphed.graph_note or ""), str(graphed)
    gap = eager.launch_overhead_s  # median wall less median device time: what eager spends not running kernels
    recovered = (eager.median_wall_time_s - graphed.median_wall_time_s) / gap
    assert recovered > 0.5, f"reduce-overhead recovers {recovered:.0%} of the eager step's idle time\n{eager}\n{graphed}"
