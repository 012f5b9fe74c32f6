"""A training step of a Llama-style block, profiled the way it is written: forward, backward,
optimizer step and zero_grad in one region, and phase by phase in three. Backward kernels
carry the module of the forward op they differentiate; the default budget of a step holds
the weights, gradients and optimizer state it reads and updates."""

import pytest
import torch

from pytest_fusioncheck import Budget


class RMSNorm(torch.nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


class Block(torch.nn.Module):
    """Pre-norm SwiGLU MLP with a residual, as in Llama's decoder layers."""

    def __init__(self, d=256, hidden=688):
        super().__init__()
        self.norm = RMSNorm(d)
        self.gate_proj = torch.nn.Linear(d, hidden, bias=False)
        self.up_proj = torch.nn.Linear(d, hidden, bias=False)
        self.down_proj = torch.nn.Linear(hidden, d, bias=False)

    def forward(self, x):
        h = self.norm(x)
        return x + self.down_proj(torch.nn.functional.silu(self.gate_proj(h)) * self.up_proj(h))


@pytest.fixture
def model(fusion):
    torch.manual_seed(0)
    return Block().to(fusion.device)


@pytest.fixture
def opt(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)


@pytest.fixture
def x(fusion):
    return torch.randn(512, 256, device=fusion.device)


def _loss(model, x):
    return model(x).float().pow(2).mean()


# CPU: the gradients' fill, 14 forward ops (the loss's pow and mean among them), 22
# backward ops (gradient accumulation included) and the fused optimizer's kernel with its
# step-count add.
@pytest.mark.max_kernels(cpu=39, cuda=48)
def test_a_whole_training_step_is_one_region_with_every_phases_kernels(fusion, model, opt, x):
    def step():
        opt.zero_grad(set_to_none=False)
        _loss(model, x).backward()
        opt.step()

    report = fusion.profile(step)
    backward = [k for k in report.kernels if k.op in ("aten::mm", "aten::silu_backward")]
    assert backward and all(k.module for k in backward), report.table()
    # the step reads weights, gradients and both AdamW moments, and writes all but the input
    assert "optimizer state" in report.budget.label and "gradients" in report.budget.label


def test_each_phase_of_a_training_step_in_its_own_region(fusion, model, opt, x):
    _loss(model, x).backward()
    opt.step()  # a first step makes AdamW's state: the regions below see a steady step
    with fusion.region("forward") as fwd:
        loss = _loss(model, x)
    with fusion.region("backward") as bwd:
        loss.backward()
    with fusion.region("optimizer") as step:
        opt.step()
        opt.zero_grad(set_to_none=False)
    fusion.assert_max_kernels({"cpu": 14, "cuda": 17}[fusion.device], report=fwd.report)
    fusion.assert_max_kernels({"cpu": 22, "cuda": 28}[fusion.device], report=bwd.report)
    assert {k.module for k in bwd.report.kernels if k.op == "aten::mm"} == {"gate_proj", "up_proj", "down_proj"}
    # the optimizer region: one fused update over all parameters, then the gradient fills
    params = list(model.parameters())
    grads = [p.grad for p in params]
    state = [t for s in opt.state.values() for t in s.values()]
    budget = Budget.from_tensors(reads=[params, grads, state], writes=[params, state, grads])
    fusion.assert_hbm_bytes_within(budget, slack=1.05, report=step.report)


@pytest.mark.no_graph_breaks
def test_a_compiled_forward_and_backward_keep_the_rms_norm_fused(fusion, model, x):
    compiled = torch.compile(model)
    report = fusion.profile(lambda: _loss(compiled, x).backward())
    generated = [k for k in report.kernels if k.op.startswith("fused")]
    assert generated, report.table()
    # forward: the norm with the residual's operand, the SwiGLU product; backward: their
    # gradients; the GEMMs stay library calls
    fusion.assert_max_kernels({"cpu": 24, "cuda": 33}[fusion.device])
