"""Gluon's Hopper ops, imported once for the warp-specialised kernels (``_gemm_ws``, ``_attention_ws``).

Gluon's names move between Triton releases, so the import is guarded: where any of it fails, ``gluon`` (and every
other name here) is None, and each kernel module's ``available()`` says False.
"""

import torch

try:  # Gluon with the Hopper ops: Triton 3.5+; any failure means "not here"
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                                  warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    # TMA copies: async_load / async_store in Triton 3.9 (which keeps the 3.6 names only to raise),
    # async_copy_global_to_shared / async_copy_shared_to_global in 3.6; same arguments
    tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
    tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global
except Exception:  # pragma: no cover - depends on the Triton build
    gluon = gl = TensorDescriptor = fence_async_shared = mbarrier = tma = warpgroup_mma = warpgroup_mma_wait = None
    tma_load = tma_store = None


def smem_layout(block: list, dtype) -> object:
    """The NVMMA shared-memory layout of a TMA block of a 16-bit torch dtype, as wgmma reads it (the descriptors')."""
    return gl.NVMMASharedLayout.get_default_for(block, {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}[dtype])
