"""Shared launch heuristics and input checks for the reference kernels.

One place for the choices every launcher makes (block size, warps), as Liger-Kernel's
``calculate_settings`` does, so that tuning one subject does not fork the others.
"""

from __future__ import annotations

import os

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def interpreting() -> bool:
    """True when Triton runs kernels under its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def check_tensor(t: object, name: str, *, dtypes=FLOAT_DTYPES, ndim: int | None = None, min_ndim: int | None = None) -> None:
    """Raise a clear ``TypeError``/``ValueError`` when ``t`` is not a usable kernel input.

    Checks: it is a tensor, its dtype is one the kernel supports, its rank, and that its
    device can run Triton here (a CUDA tensor, or any tensor under the interpreter).
    """
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        allowed = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{name} has dtype {str(t.dtype).replace('torch.', '')}; supported: {allowed}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimension(s), got shape {tuple(t.shape)}")
    if min_ndim is not None and t.dim() < min_ndim:
        raise ValueError(f"{name} must have at least {min_ndim} dimension(s), got shape {tuple(t.shape)}")
    if t.device.type != "cuda" and not interpreting():
        raise ValueError(
            f"{name} is on {t.device}; the fused kernels run on CUDA tensors "
            "(or on CPU tensors under TRITON_INTERPRET=1)"
        )
