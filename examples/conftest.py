"""Examples run on the GPU when there is one, else on CPU (Triton under its interpreter)."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
