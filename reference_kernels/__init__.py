"""Reference fused Triton kernels, each with its unfused PyTorch reference and byte budget.

Every subject module exposes ``fused(...)`` (Triton), ``unfused(...)`` (plain PyTorch,
op by op, with line-by-line traffic comments) and ``budget(...)`` (the analytic
``pytest_fusioncheck.Budget``). ``SUBJECTS`` lists the module names for parametrised
tests and benchmarks; ``load(name)`` imports one.

Without a GPU, set ``TRITON_INTERPRET=1`` before importing triton and the kernels run on
CPU tensors under Triton's interpreter (slow: use small shapes).
"""

from __future__ import annotations

import importlib
from types import ModuleType

SUBJECTS: tuple[str, ...] = ("softmax", "layer_norm", "gemm_epilogue", "bias_gelu_dropout", "attention")


def load(name: str) -> ModuleType:
    if name not in SUBJECTS:
        raise ValueError(f"unknown subject {name!r}; choose one of {', '.join(SUBJECTS)}")
    return importlib.import_module(f"{__name__}.{name}")
