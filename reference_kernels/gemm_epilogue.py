"""Matmul with its epilogue fused: ``act(a @ b + bias) + residual`` in one kernel.

The bias add, the activation and the residual add are applied to the fp32 accumulator
tile in registers, before the tile's single store, so the (M, N) intermediate never
leaves the chip. The unfused version writes and re-reads it three more times.

Three kernels share one epilogue (the Triton ones in ``_gemm_kernels``, the Gluon one in ``_gemm_ws``; this
module holds the plan, the launches and the public functions):

* ``_gemm_epilogue_tma_kernel``: Hopper style (sm_90+): a persistent grid of one
  program an SM (a config's last field) walking the output tiles in grouped order,
  operands fetched by TMA through host-side tensor descriptors, stores through TMA
  (optionally in two column halves, which frees shared memory for a deeper pipeline).
* ``_gemm_epilogue_kernel``: the plain tiled ``tl.dot`` kernel with pointer loads,
  used on older GPUs, when a stride or address breaks TMA's 16-byte rules, and
  under the interpreter.
* ``_gemm_ws._gemm_ws_kernel``: a warp-specialised "ping-pong" kernel in Gluon for 16-bit
  inputs on sm_90 (two consumer warpgroups on alternate tiles, one's epilogue under the
  other's MMAs, a TMA loader warp): timed beside the TMA kernel's configs (``_WS_CONFIGS``, and
  ``_WS_SMALL_CONFIGS`` for problems of few tiles).

``_gemm_path`` and ``_gemm_configs`` are the launch heuristics: which kernel, which
tile shapes; when several configs remain, the launcher times each once per shape
bucket (``_TUNING_ROUNDS`` rounds, each candidate's best) and keeps the fastest (``_tuned``).

Small and skinny problems (few output tiles for 132 SMs) get smaller tiles, or split-K:
``_gemm_splitk_kernel`` writes fp32 partial sums of a K range to a workspace and
``_splitk_epilogue_kernel`` sums them and applies the epilogue once (two launches).
Candidates come from a cost model (``_ranked_configs``); each shape bucket (M, N, K rounded
up to powers of two) times its candidates once per process. On CUDA the library's paths are timed
too (``LIBRARY``: cuBLAS's product, then the epilogue kernel; ``LIBRARY_LT``: cuBLASLt's own epilogue, where it
computes all of it). docs/kernels.md, "gemm_epilogue".
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
from triton.compiler.errors import CompilationError

from pytest_fusioncheck.budget import Budget

from . import _gemm_common, _gemm_ws
from ._gemm_common import _tma_ok
from ._gemm_kernels import _gemm_epilogue_kernel, _gemm_epilogue_tma_kernel, _gemm_splitk_kernel, _splitk_epilogue_kernel
from ._common import (cdiv, check_tensor, define_op, graph_device_ms, inference_result, interpreting, traced_result,
                      tracing)
from ._device import Device, of as device_of
from ._launch import Calls, decline, launch as launch_kernel, library, unrecorded

_INPUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_ACTIVATION_CODES = {None: 0, "relu": 1, "gelu": 2}  # 3: gelu(approximate="tanh"); 4 / 5: 3 / 2 in PTX fast-math
_APPROXIMATIONS = ("none", "tanh")


# --------------------------------------------------------------------------- plan: launch heuristics

# A config: (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, EPILOGUE_SPLIT, num_stages, num_warps, programs an SM,
# SPLIT_K). EPILOGUE_SPLIT and programs an SM are read by the persistent TMA kernel only; SPLIT_K > 1
# takes the two split-K kernels instead of the one-kernel paths.
_TMA_CONFIGS = [
    # The four that came within 10% of the best at 4096^3 or 8192^3 on the H200 (docs/kernels.md,
    # "gemm_epilogue"): the list for problems of at least two waves of 128x256 tiles.
    (128, 256, 64, 8, 1, 3, 8, 1, 1),
    (128, 256, 64, 8, 2, 3, 8, 1, 1),
    (128, 256, 64, 8, 2, 4, 8, 1, 1),
    (128, 128, 64, 8, 1, 4, 8, 1, 1),
]
_TILED_CONFIGS = [
    (128, 256, 64, 8, 1, 3, 8, 1, 1),
    (128, 128, 64, 8, 1, 4, 8, 1, 1),
    (128, 128, 32, 8, 1, 4, 4, 1, 1),
]
_INTERPRETER_CONFIG = (32, 32, 16, 2, 1, 1, 1, 1, 1)
_IEEE_CONFIG = (64, 64, 32, 8, 1, 3, 4, 1, 1)  # fp32 without TF32: the FMA dot, one modest tile, no tuning
# Tile shapes the cost model ranks below two waves of 128x256 tiles: (BLOCK_M, BLOCK_N, BLOCK_K,
# num_stages, num_warps, the share of an SM's matrix rate its main loop is assumed to reach). BLOCK_M
# 64 is one warpgroup's wgmma height; the shares are guesses ordered by tile size: the timing of
# the ranked candidates, not the model, picks the config.
_TILE_SHAPES = [
    (128, 256, 64, 3, 8, 0.85),
    (128, 128, 64, 4, 8, 0.75),
    (64, 256, 64, 4, 8, 0.65),
    (64, 128, 64, 4, 4, 0.55),
    (64, 64, 64, 6, 4, 0.40),
]
_SPLITS = (2, 3, 4, 6, 8)  # split-K factors the model considers
_MIN_K_STEPS = 4  # BLOCK_K steps each K range keeps, so its loads still pipeline
# The share of the device's peaks (``Device.mma_flops_per_sm``, ``dram_bytes_per_s``) that cuBLAS's mm and a copy
# reach: on the H200 790 of 989 TFLOP/s and 4.0 of 4.8 TB/s. fp32 (TF32) runs at half the 16-bit rate.
_REACHED = 0.8
_WAVE_S = 1e-6  # pipeline fill and epilogue, per wave of tiles
_SECOND_LAUNCH_S = 2e-6  # split-K's epilogue launch and its gap
_CANDIDATES = 4  # ranked configs timed per shape bucket
# Short K (at most _TWO_PER_SM_MAX_K, 16-bit, TMA path): the exact GELU epilogue takes about as long as a
# tile's few K steps and no MMA overlaps it in one program (no warp specialisation in Triton 3.6), so a
# fifth candidate runs two programs an SM, 128x128 tiles with the epilogue stored in halves (3 stages,
# 112 KB of shared memory each): one program's epilogue under the other's MMAs (docs/kernels.md,
# "gemm_epilogue"). The timing, not the model, decides whether it is kept. H200, bf16: it won 4 of 5
# buckets at K = 768 (7-13%) and 2 of 3 at K = 3072 (4%), and none of 6 at K = 4096 (1-15% slower).
_TWO_PER_SM_CONFIG = (128, 128, 64, 8, 2, 3, 8, 2, 1)
_TWO_PER_SM_MAX_K = 3072
# The warp-specialised ping-pong kernel (_gemm_ws: two consumer warpgroups on alternate tiles, one's epilogue under
# the other's MMAs, a TMA loader warp), 16-bit on the TMA path where Gluon runs it (compute capability 9.x): two more
# timed candidates, 128x128 and 64x128 tiles a consumer. H200, bf16 + bias + exact GELU, TFLOPS, best ws / the best
# candidate before: 2048x768x3072 454 / 375, 8192x768x3072 562 / 477, 1024x3072x768 348 / 304, 4096^3 723 / 706;
# level at 512x768x3072 and 128x4096x4096 (docs/kernels.md, "gemm_epilogue").
_WS_CONFIGS = [_gemm_ws.WsConfig(128, 128, 64, 8, 6, 1), _gemm_ws.WsConfig(64, 128, 64, 8, 8, 1)]
# Problems of fewer than _WS_SMALL_WAVES waves of 64x128 tiles also time smaller tiles (more of them: every SM busy):
# H200, bf16 + bias + exact GELU, TFLOPS, forced against the tuned choice: 64x768x3072 50 (64x32) / 43, 512x3072x768
# 224 (64x64) / 209, 1024x3072x768 357 (128x64) / 339 (docs/kernels.md, "gemm_epilogue").
_WS_SMALL_CONFIGS = [_gemm_ws.WsConfig(128, 64, 64, 8, 8, 1), _gemm_ws.WsConfig(64, 64, 64, 8, 8, 1),
                     _gemm_ws.WsConfig(64, 32, 64, 8, 8, 1)]
_WS_SMALL_WAVES = 2
# Rounds of timing over a bucket's candidates (the second in reverse order; each candidate's best counts). H200: at
# large shapes one config read 537 and 643 TF at M 8192 and 16384 of the same K and N, and a config of 579 TF in one
# sweep was passed over for one of 534 in the next (docs/kernels.md, "gemm_epilogue": the tuning).
_TUNING_ROUNDS = 2
# The library's paths, two more timed candidates on CUDA (docs/kernels.md, "gemm_epilogue": the library's paths):
# LIBRARY, cuBLAS's product (torch.mm) and the whole epilogue after it in the epilogue kernel; LIBRARY_LT, cuBLASLt's
# own epilogue (torch._addmm_activation, addmm), only where that computes all of it (_lt_epilogue).
LIBRARY = "library"
LIBRARY_LT = "library_lt"
_LIBRARIES = (LIBRARY, LIBRARY_LT)
_tuned: dict = {}  # shape bucket -> the config its timing picked
_timings: dict = {}  # shape bucket -> [(config, ms)] of its tuning, for benchmarks/bench_gemm_epilogue.py


def _gemm_path(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> str:
    """'tma' on sm_90+ when every operand meets TMA's rules, else 'tiled'."""
    if interpreting() or a.device.type != "cuda" or a.shape[1] == 0:
        return "tiled"
    if torch.cuda.get_device_capability(a.device)[0] < 9:
        return "tiled"
    b_ok = _tma_ok(b) or _tma_ok(b.T)
    return "tma" if (_tma_ok(a) and b_ok and _tma_ok(out)) else "tiled"


# torch.backends.cuda.matmul.allow_tf32 reads this through a module __getattr__: 0.7 us a call, the getter 0.05 (CPU)
_allow_tf32 = getattr(torch._C, "_get_cublas_allow_tf32", None) or (lambda: torch.backends.cuda.matmul.allow_tf32)


def _input_precision(dtype: torch.dtype) -> str:
    """tl.dot's precision: fp32 inputs use TF32 only where torch's matmul flag allows it."""
    if dtype == torch.float32 and not _allow_tf32():
        return "ieee"
    return "tf32"


def _estimate_s(M: int, N: int, K: int, tile: tuple, split: int, elt: int, device: Device) -> float:
    """Modelled seconds of one config on ``device``: waves of tiles at the tile's share of an SM's rate, or the
    compulsory bytes (plus split-K's fp32 partials written and read) at copy speed, whichever is longer."""
    BM, BN, BK, _, _, share = tile
    units = cdiv(M, BM) * cdiv(N, BN) * split
    waves = cdiv(units, device.sms)
    k_steps = cdiv(cdiv(K, BK), split)
    rate = _REACHED * device.mma_flops_per_sm * share * (0.5 if elt == 4 else 1.0)
    compute = waves * 2 * BM * BN * k_steps * BK / rate
    nbytes = elt * (M * K + K * N + M * N) + (8 * split * M * N if split > 1 else 0)
    copy_s = nbytes / (_REACHED * device.dram_bytes_per_s)
    return max(compute, copy_s) + waves * _WAVE_S + (_SECOND_LAUNCH_S if split > 1 else 0)


def _ranked_configs(path: str, M: int, N: int, K: int, elt: int, device: Device, ws: bool = False) -> list[tuple]:
    """The configs to time for one problem: the measured big-tile list when 128x256 tiles fill two
    waves, else the cost model's best ``_CANDIDATES`` of the smaller tiles and split-K factors; with ``ws``
    (the warp-specialised kernel runs here), 16-bit TMA problems also time ``_WS_CONFIGS``, and ``_WS_SMALL_CONFIGS``
    where 64x128 tiles fill fewer than ``_WS_SMALL_WAVES`` waves.

    Split-K is considered only while the output has fewer tiles than SMs, keeping at least
    ``_MIN_K_STEPS`` K steps a range and at most three waves. fp32 inputs halve BLOCK_K and drop the
    128x256 tile (shared memory).
    """
    sms = device.sms
    if cdiv(M, 128) * cdiv(N, 256) >= 2 * sms:
        configs = list(_TMA_CONFIGS if path == "tma" else _TILED_CONFIGS)
    else:
        scored = []
        for tile in _TILE_SHAPES:
            BM, BN, BK, stages, warps, _ = tile
            tiles = cdiv(M, BM) * cdiv(N, BN)
            k_steps = cdiv(K, BK)
            for split in (1,) + _SPLITS:
                if split > 1 and (tiles >= sms or k_steps < split * _MIN_K_STEPS or tiles * split > 3 * sms):
                    continue
                config = (BM, BN, BK, 8, 1, stages, warps, 1, split)
                scored.append((_estimate_s(M, N, K, tile, split, elt, device), config))
        configs = [config for _, config in sorted(scored)[:_CANDIDATES]]
    short_k = path == "tma" and elt == 2 and K <= _TWO_PER_SM_MAX_K
    if short_k and cdiv(M, 128) * cdiv(N, 128) > sms and _TWO_PER_SM_CONFIG not in configs:
        configs.append(_TWO_PER_SM_CONFIG)  # more tiles than SMs: the second program an SM has work
    if elt == 4:  # fp32: BLOCK_K 32, and no 128x256 tile (its fp32 output tile alone takes 128 KB)
        configs = [(c[0], c[1], min(c[2], 32)) + c[3:] for c in configs if c[0] * c[1] <= 128 * 128]
        configs = configs or [(128, 128, 32, 8, 1, 4, 8, 1, 1)]
    if ws and path == "tma" and elt == 2:
        small = cdiv(M, 64) * cdiv(N, 128) < _WS_SMALL_WAVES * sms
        configs += [c for c in _WS_CONFIGS + (_WS_SMALL_CONFIGS if small else []) if c not in configs]
    return configs


def _gemm_configs(path: str, M: int, N: int, K: int, dtype: torch.dtype = torch.bfloat16,
                  device: torch.device | None = None) -> list[tuple]:
    """Candidate configs: one under the interpreter, else ``_IEEE_CONFIG`` for IEEE fp32 or ``_ranked_configs``, and
    on CUDA the library's paths (``LIBRARY``, ``LIBRARY_LT``) beside them."""
    if interpreting():
        return [_INTERPRETER_CONFIG]
    device = device or torch.device("cuda")
    library_path = list(_LIBRARIES) if device.type == "cuda" else []
    if _input_precision(dtype) == "ieee":
        return [_IEEE_CONFIG] + library_path
    elt = torch.empty((), dtype=dtype).element_size()
    ws = device.type == "cuda" and _gemm_ws.available(device.index)
    return _ranked_configs(path, M, N, K, elt, device_of(device), ws) + library_path


def _bucket(n: int) -> int:
    """The shape bucket of one dimension: n rounded up to a power of two."""
    return 1 << max(0, n - 1).bit_length()


def _timing_sets(a: torch.Tensor, b: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(a, b) and enough copies (same strides) that the sets read twice the L2 together, at most 16:
    a candidate timed over them finds its operands in DRAM, as a call in a model does."""
    set_bytes = a.numel() * a.element_size() + b.numel() * b.element_size()
    l2 = torch.cuda.get_device_properties(a.device).L2_cache_size
    n = max(1, min(16, -(-2 * l2 // max(set_bytes, 1))))
    copy = lambda t: torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device).copy_(t)  # noqa: E731
    return [(a, b)] + [(copy(a), copy(b)) for _ in range(n - 1)]


# --------------------------------------------------------------------------- launchers


def _launch(path, cfg, a, b, out, bias, residual, activation_code, gelu_degree=None):
    if cfg in _LIBRARIES:
        _library(a, b, out, bias, residual, activation_code, gelu_degree, lt=cfg == LIBRARY_LT)
        return
    if isinstance(cfg, _gemm_ws.WsConfig):  # the warp-specialised kernel (it maps the GELUs to fast-math itself)
        _gemm_ws.launch(a, b, out, bias, residual, activation_code, gelu_degree, cfg)
        return
    M, K = a.shape
    N = b.shape[1]
    BM, BN, BK, GROUP_M, SPLIT, stages, warps, per_sm, split_k = cfg
    split_k = max(1, min(split_k, cdiv(K, BK)))  # K = 0 or a short K: one range
    dot_flags = dict(DOT_IN_FP32=interpreting(), INPUT_PRECISION=_input_precision(a.dtype))
    epi_flags = _epilogue_flags(bias, residual, activation_code, gelu_degree)
    rs = residual.stride() if residual is not None else (0, 0)
    b_kmajor = path == "tma" and not _tma_ok(b)
    if path == "tma":
        from triton.tools.tensor_descriptor import TensorDescriptor

        a_arg = TensorDescriptor(a, [M, K], [a.stride(0), 1], [BM, BK])
        if b_kmajor:
            bt = b.T
            b_arg = TensorDescriptor(bt, [N, K], [bt.stride(0), 1], [BN, BK])
        else:
            b_arg = TensorDescriptor(b, [K, N], [b.stride(0), 1], [BK, BN])
    else:
        a_arg, b_arg = a, b
    tiles = cdiv(M, BM) * cdiv(N, BN)
    if split_k > 1:
        # docs/kernels.md, "gemm_epilogue": two launches, fp32 partials (4 * split_k * M * N bytes
        # written, then read) between them.
        ws = torch.empty((split_k, M, N), device=a.device, dtype=torch.float32)
        launch_kernel(_gemm_splitk_kernel, (tiles * split_k,),
            a_arg, b_arg, ws, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
            BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK, GROUP_M=GROUP_M, SPLIT_K=split_k, USE_TMA=path == "tma",
            B_KMAJOR=b_kmajor, num_stages=stages, num_warps=warps, **dot_flags,
        )
        _stored_epilogue(ws, out, bias, residual, epi_flags)
    elif path == "tma":
        c_desc = TensorDescriptor(out, [M, N], [out.stride(0), 1], [BM, BN // SPLIT])
        programs = per_sm * device_of(a.device).sms
        launch_kernel(_gemm_epilogue_tma_kernel, (min(programs, tiles),),
            a_arg, b_arg, c_desc, bias, residual, M, N, K, rs[0], rs[1],
            BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK, GROUP_M=GROUP_M, EPILOGUE_SPLIT=SPLIT,
            NUM_PROGRAMS=programs, B_KMAJOR=b_kmajor, num_stages=stages, num_warps=warps, **dot_flags, **epi_flags,
        )
    else:
        launch_kernel(_gemm_epilogue_kernel, (tiles,),
            a, b, out, bias, residual, M, N, K,
            a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0), out.stride(1), rs[0], rs[1],
            BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK, GROUP_M=GROUP_M, num_stages=stages, num_warps=warps,
            **dot_flags, **epi_flags,
        )


def _epilogue_flags(bias, residual, activation_code, gelu_degree) -> dict:
    """The epilogue's constexprs; a GELU in PTX fast-math on CUDA (``_gemm_common.fast_activation``)."""
    degree = _gemm_common.GELU_DEGREE if gelu_degree is None else gelu_degree
    if degree not in (5, 7, 9):
        raise ValueError(f"GELU fit of degree {degree}: 5, 7 or 9")
    if not interpreting():
        activation_code = _gemm_common.fast_activation(activation_code)
    return dict(HAS_BIAS=bias is not None, ACTIVATION=activation_code, HAS_RESIDUAL=residual is not None,
                GELU_DEGREE=degree)


def _stored_epilogue(ws, out, bias, residual, epi_flags):
    """The epilogue over a stored product ``ws``: split-K's (S, M, N) fp32 partials, or the library's (M, N) result."""
    M, N = out.shape
    split_k = ws.shape[0] if ws.dim() == 3 else 1
    rs = residual.stride() if residual is not None else (0, 0)
    EM, EN = (16, 128) if not interpreting() else (16, 32)
    launch_kernel(_splitk_epilogue_kernel, (cdiv(M, EM), cdiv(N, EN)),
        ws, out, bias, residual, M, N, out.stride(0), rs[0], rs[1],
        SPLIT_K=split_k, BLOCK_M=EM, BLOCK_N=EN, num_warps=4, **epi_flags,
    )


def _library(a, b, out, bias, residual, activation_code, gelu_degree=None, lt=False):
    """The library's paths. ``lt``: cuBLASLt's epilogue alone, one op (``torch._addmm_activation``: a bias then a
    ReLU or the tanh GELU; ``addmm``: a bias), where it computes the whole epilogue (``_lt_epilogue``). Else cuBLAS's
    product into ``out`` (``torch.mm``), then the whole epilogue in the epilogue kernel over ``out`` in place: a
    second launch, ``out`` read and written once more, the product rounded to ``out``'s dtype first as the unfused
    chain rounds it (docs/kernels.md, "gemm_epilogue": the library's paths)."""
    if lt:
        if not _lt_epilogue(bias, residual, activation_code):
            raise ValueError("cuBLASLt's epilogue computes a bias, then a ReLU, the tanh GELU or nothing, and no "
                             "residual")
        if activation_code:
            library(torch._addmm_activation, bias, a, b, use_gelu=activation_code == 3, out=out)
        else:
            library(torch.addmm, bias, a, b, out=out)
        return
    if _residual_in_out(residual, out):
        raise ValueError("the library's path writes the product into out before the residual is read: "
                         "out and residual must not share memory")
    library(torch.mm, a, b, out=out)
    if bias is not None or activation_code or residual is not None:
        _stored_epilogue(out, out, bias, residual, _epilogue_flags(bias, residual, activation_code, gelu_degree))


def _lt_epilogue(bias, residual, activation_code) -> bool:
    """Whether cuBLASLt's epilogue computes the whole epilogue: a bias, then a ReLU, the tanh GELU or nothing."""
    return bias is not None and residual is None and activation_code in (0, 1, 3)


def _residual_in_out(residual, out) -> bool:
    """Whether the residual shares memory with the output (an in-place residual add)."""
    return residual is not None and residual.untyped_storage().data_ptr() == out.untyped_storage().data_ptr()


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def _run(a, b, out, bias, residual, activation_code, path=None, config=None, gelu_degree=None):
    """Pick the path and config, then launch; returns (path, config).

    Several candidate configs are timed once per shape bucket (M, N, K each rounded up to a power
    of two, with the dtype, the epilogue, b's layout and the device) and the fastest is kept in
    ``_tuned``: a later problem of the same bucket reuses it untimed. Timing is device time of
    CUDA-graph replays over copies of a and b that together exceed twice the L2 (``graph_device_ms``), the best of
    ``_TUNING_ROUNDS`` rounds over the candidates, every other one in reverse order (a clock that moves while they
    are timed favours none of them). While a CUDA graph is being
    captured nothing is timed: an untuned bucket takes the model's first candidate, uncached.
    ``path``, ``config`` and ``gelu_degree`` force a choice (tests and benchmarks use them).
    """
    M, K = a.shape
    N = b.shape[1]
    path = path or _gemm_path(a, b, out)
    configs = [config] if config else _gemm_configs(path, M, N, K, a.dtype, a.device)
    ws_ok = any(isinstance(c, _gemm_ws.WsConfig) for c in configs) and _gemm_ws.fits(a, b, out, bias, residual)
    if not config:  # the warp-specialised kernel's configs only where it takes these tensors, the library's likewise
        takes = {LIBRARY: not _residual_in_out(residual, out),
                 LIBRARY_LT: _lt_epilogue(bias, residual, activation_code)}
        configs = [c for c in configs
                   if (ws_ok or not isinstance(c, _gemm_ws.WsConfig)) and takes.get(c, True)]
    if len(configs) > 1:
        key = (path, a.dtype, _input_precision(a.dtype), _bucket(M), _bucket(N), _bucket(K), bias is not None,
               activation_code, residual is not None, b.stride(0) == 1, a.device, gelu_degree, ws_ok)
        if key in _tuned:
            configs = [_tuned[key]]
        elif _capturing(a.device):
            decline("an untuned GEMM captured in a CUDA graph takes the first candidate, untimed")
        else:
            with unrecorded():  # timed once a bucket: a replay launches the chosen config only
                kept, launches = [], []
                # The candidates write a scratch output: ``out`` may be the residual itself (an
                # in-place residual add), which a second launch would then add twice.
                scratch = torch.empty_like(out)
                for c in configs:  # compile them all first, so no timing follows an idle compile
                    def launch(s, c=c):
                        _launch(path, c, s[0], s[1], scratch, bias, residual, activation_code, gelu_degree)

                    try:
                        launch((a, b))
                    except triton.runtime.errors.OutOfResources:  # a tile this GPU's shared memory cannot hold
                        continue
                    except CompilationError as error:  # the Gluon kernel on a Triton whose Gluon moved on
                        if not isinstance(c, _gemm_ws.WsConfig):
                            raise
                        _gemm_ws.disable(error)
                        continue
                    kept.append(c)
                    launches.append(launch)
                if not launches:
                    raise RuntimeError(f"no candidate config of a {M}x{K} @ {K}x{N} GEMM fits this GPU: {configs}")
                configs = kept
                sets = _timing_sets(a, b)
                times = [graph_device_ms(launch, sets) for launch in launches]
                for _ in range(1, _TUNING_ROUNDS if len(launches) > 1 else 1):  # again, in reverse: the best of each
                    again = [graph_device_ms(launch, sets) for launch in reversed(launches)][::-1]
                    times = [min(t, u) for t, u in zip(times, again)]
                del sets, scratch
                _timings[key] = list(zip(configs, times))
                _tuned[key] = configs[min(range(len(configs)), key=times.__getitem__)]
            configs = [_tuned[key]]
    _launch(path, configs[0], a, b, out, bias, residual, activation_code, gelu_degree)
    return path, configs[0]


# --------------------------------------------------------------------------- public functions


def _check(a, b, bias, activation, residual, approximate) -> int:
    check_tensor(a, "a", dtypes=_INPUT_DTYPES, ndim=2)
    check_tensor(b, "b", dtypes=_INPUT_DTYPES, ndim=2)
    if b.dtype != a.dtype:
        raise TypeError(f"a and b must share a dtype, got {a.dtype} and {b.dtype}")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"cannot multiply a {tuple(a.shape)} by b {tuple(b.shape)}: inner dimensions differ")
    if b.device != a.device:
        raise ValueError(f"a is on {a.device} but b is on {b.device}")
    M, N = a.shape[0], b.shape[1]
    for name, t, shape in (("bias", bias, (N,)), ("residual", residual, (M, N))):
        if t is None:
            continue
        check_tensor(t, name, dtypes=(a.dtype,), ndim=len(shape))
        if tuple(t.shape) != shape:
            raise ValueError(f"{name} must have shape {shape} for a {tuple(a.shape)} @ b {tuple(b.shape)}, "
                             f"got {tuple(t.shape)}")
        if t.device != a.device:
            raise ValueError(f"{name} is on {t.device} but a is on {a.device}")
    if activation not in _ACTIVATION_CODES:
        raise ValueError(f"unknown activation {activation!r}; choose 'gelu', 'relu' or None")
    if approximate not in _APPROXIMATIONS:
        raise ValueError(f"unknown approximate={approximate!r}; choose 'none' or 'tanh'")
    if approximate == "tanh" and activation != "gelu":
        raise ValueError("approximate='tanh' applies to activation='gelu' only")
    return _activation_code(activation, approximate)


def _activation_code(activation, approximate="none") -> int:
    """The kernels' ACTIVATION code for a user's activation and GELU approximation (before
    ``_fast_activation`` maps a GELU to its PTX fast-math code on CUDA)."""
    if activation == "gelu":
        return 3 if approximate == "tanh" else 2
    return _ACTIVATION_CODES[activation]


CALLS = Calls("gemm_epilogue.fused")  # a problem's first call plans, its second records, later ones replay (_launch.py)


def fused(a, b, bias=None, activation="gelu", residual=None, approximate="none", out=None):
    """``act(a @ b + bias) + residual`` in one Triton kernel (two on the split-K path that small-M,
    long-K problems take); fp32 accumulation, output in a's dtype. On CUDA each shape bucket's
    first call also times the library's paths and keeps one where it is faster: cuBLASLt's own
    epilogue (one op, where it computes all of this: a bias, then a ReLU, the tanh GELU or nothing),
    or cuBLAS's product then the epilogue kernel (two launches; docs/kernels.md, "gemm_epilogue").

    a: (M, K), b: (K, N) (row-major, or the transpose of a contiguous (N, K) weight),
    bias: (N,), residual: (M, N), all fp16, all bf16 or all fp32 (fp32 products in TF32 when
    ``torch.backends.cuda.matmul.allow_tf32`` is set, else in full fp32 on one untuned, slow
    config). ``activation`` is "gelu" (exact
    erf form unless ``approximate="tanh"``), "relu" or None. ``out``, when given, is a
    contiguous (M, N) tensor of a's dtype to write into. Under ``torch.compile``: the op
    ``reference_kernels::gemm_epilogue`` (``out`` then takes a copy of its result).
    """
    if tracing():
        result = traced_result(_GEMM_EPILOGUE_OP(a, b, bias, activation, residual, approximate), out,
                               "gemm_epilogue.fused")
    else:
        result = _calls(a, b, bias, activation, residual, approximate, out)
    return inference_result("gemm_epilogue.fused", (a, b, bias, residual), result)


def _calls(a, b, bias, activation, residual, approximate, out=None):
    """The call's launches (recorded or replayed), and the op's implementation."""
    tf32 = _allow_tf32()  # fp32 inputs' precision (_input_precision)
    return CALLS((activation, approximate, tf32), (a, b, bias, residual, out),
                 lambda: _fused(a, b, bias, activation, residual, approximate, out))


def _fake(a, b, bias, activation, residual, approximate):
    _check(a, b, bias, activation, residual, approximate)
    return torch.empty((a.shape[0], b.shape[1]), dtype=a.dtype, device=a.device)


_GEMM_EPILOGUE_OP = define_op("gemm_epilogue(Tensor a, Tensor b, Tensor? bias, str? activation, Tensor? residual, "
                              "str approximate) -> Tensor", _calls, _fake)


def _fused(a, b, bias, activation, residual, approximate, out):
    code = _check(a, b, bias, activation, residual, approximate)
    M, N = a.shape[0], b.shape[1]
    if out is None:
        out = torch.empty((M, N), device=a.device, dtype=a.dtype)
    else:
        check_tensor(out, "out", dtypes=(a.dtype,), ndim=2)
        if tuple(out.shape) != (M, N) or not out.is_contiguous() or out.device != a.device:
            raise ValueError(f"out must be a contiguous ({M}, {N}) tensor on {a.device}")
    if M and N:
        _run(a, b, out, bias, residual, code)
    return out


def unfused(a, b, bias=None, activation="gelu", residual=None, approximate="none"):
    """The same computation as people write it: one PyTorch op (one kernel) per step."""
    y = torch.mm(a, b)  # read MK + KN elements ; write MN elements
    if bias is not None:
        y = y + bias  # read MN + N elements ; write MN elements
    if activation == "gelu":
        y = F.gelu(y, approximate=approximate)  # read MN elements ; write MN elements
    elif activation == "relu":
        y = F.relu(y)  # read MN elements ; write MN elements
    elif activation is not None:
        raise ValueError(f"unknown activation {activation!r}; choose 'gelu', 'relu' or None")
    if residual is not None:
        y = y + residual  # read 2MN elements ; write MN elements
    return y


def budget(a, b, bias=None, activation="gelu", residual=None, approximate="none") -> Budget:
    """Compulsory traffic: a, b, bias and residual read once, the output written once.

    Works on meta tensors too (``torch.empty(..., device="meta")``), so budgets of
    large problems cost no memory.
    """
    M, K = a.shape
    N = b.shape[1]
    elt = a.element_size()
    reads = M * K + K * N + (N if bias is not None else 0) + (M * N if residual is not None else 0)
    return Budget(read_bytes=elt * reads, write_bytes=elt * M * N, label="gemm_epilogue")
