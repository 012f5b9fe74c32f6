"""The cases the plugin is checked on: eager and compiled, small enough for CPU.

Each case is ``(name, make)`` where ``make(device, scale)`` returns ``(fn, args)``.
``scale`` grows the tensors (1 for CPU checks, larger for byte measurements on a GPU).
Used by ``bench_overhead.py`` (the fidelity corpus is ``tests/fidelity_cases.py``).
"""

from __future__ import annotations

import torch


def five_op_softmax(x):
    m = x.max(dim=-1, keepdim=True).values  # read MN ; write M
    z = x - m  # read MN + M ; write MN
    e = z.exp()  # read MN ; write MN
    s = e.sum(dim=-1, keepdim=True)  # read MN ; write M
    return e / s  # read MN + M ; write MN


def bias_gelu(x, b):
    return torch.nn.functional.gelu(x + b)


class MLP(torch.nn.Module):
    """A transformer MLP block: LayerNorm, Linear, GELU, Linear, residual add."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(d)
        self.up = torch.nn.Linear(d, 4 * d)
        self.down = torch.nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


def _softmax(device, scale):
    return five_op_softmax, (torch.randn(64 * scale, 1024, device=device),)


def _torch_softmax(device, scale):
    return (lambda x: torch.softmax(x, -1)), (torch.randn(64 * scale, 1024, device=device),)


def _linear_gelu(device, scale):
    lin = torch.nn.Linear(256, 256).to(device)
    return (lambda x: torch.nn.functional.gelu(lin(x))), (torch.randn(16 * scale, 256, device=device),)


def _layer_norm(device, scale):
    ln = torch.nn.LayerNorm(1024).to(device)
    return ln, (torch.randn(64 * scale, 1024, device=device),)


def _mlp(device, scale):
    return MLP(256).to(device), (torch.randn(16 * scale, 256, device=device),)


def _bias_gelu(device, scale):
    return bias_gelu, (torch.randn(64 * scale, 1024, device=device), torch.randn(1024, device=device))


EAGER = {
    "five_op_softmax": _softmax,
    "torch.softmax": _torch_softmax,
    "linear+gelu": _linear_gelu,
    "layer_norm": _layer_norm,
    "mlp_block": _mlp,
    "bias+gelu": _bias_gelu,
}


def cases(compiled: bool = True):
    """(name, make) for every eager case and, with ``compiled``, its torch.compile twin."""
    out = [(name, make) for name, make in EAGER.items()]
    if compiled:
        for name, make in EAGER.items():
            def make_compiled(device, scale, _make=make):
                fn, args = _make(device, scale)
                return torch.compile(fn), args

            out.append((f"compiled {name}", make_compiled))
    return out
