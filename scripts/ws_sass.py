"""Compile the warp-specialised GEMM + epilogue kernel (reference_kernels/_gemm_ws.py) for sm_90 on any machine, GPU
or not, and say what came out.

    python scripts/ws_sass.py bf16:gelu fp16:gelu:residual:kmajor bf16:tanh:64x128 [--json] [--sass DIR]

A case is ``DTYPE[:ACTIVATION][:FLAG...][:BMxBN][:sSTAGES][:splitN]``: DTYPE bf16 or fp16; ACTIVATION none, relu,
gelu (the exact one) or tanh (the tanh GELU), as the kernel gets them on CUDA (``_gemm_common.fast_activation``:
gelu 5, tanh 4), default none; flags ``residual`` (a contiguous residual), ``kmajor`` (b the transpose of a
contiguous (N, K) weight), ``nobias``, ``ragged`` (N = 744, so N and the residual's row stride are not multiples of
16 and their loads do not pair up; else N = 768); ``BMxBN`` a consumer's tile, with the stages, BLOCK_K, GROUP_M and
epilogue split of the ``gemm_epilogue._WS_CONFIGS`` or ``_WS_SMALL_CONFIGS`` entry of that tile (else
``_gemm_ws.DEFAULT_CONFIG``'s); ``sN`` N stages; ``split1`` / ``split2`` the epilogue split (whole tiles or column
halves). The compile is the one ``_gemm_ws.launch`` asks for at such a problem on an H200 (132 programs, the JIT's
specialisation of its arguments).

Per case: registers, stack and local memory (cuobjdump), shared memory (and ``smem_bytes``, the host's budget of
it), warps, the SASS's HGMMAs, the USETMAXREG register counts (``alloc``: TRY_ALLOC, ``dealloc``: DEALLOC), TMA loads
and stores (UTMALDG, UTMASTG), local stores and loads (STL, LDL: spills) and its instruction count. ``--sass DIR``
writes each case's SASS there. Like scripts/held_sass.py it uses Triton's own ptxas, cuobjdump and nvdisasm and its
private offline-compile entry points (GluonASTSource, GPUTarget, mangle_type), so it needs no GPU but may need
updating when Triton moves them; checked with Triton 3.6 and 3.9. Run it without TRITON_INTERPRET.
tests/test_ref_gemm_ws.py runs it.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import _sass  # noqa: E402

ACTIVATIONS = {"none": 0, "relu": 1, "gelu": 2, "tanh": 3}  # gemm_epilogue's codes before _gemm_common.fast_activation
FLAGS = ("residual", "kmajor", "nobias", "ragged")
PROGRAMS = 132  # an H200's SMs: launch's NUM_PROGRAMS at one program an SM
M, K = 1024, 3072  # M and K are not specialised (do_not_specialize): any values compile the same kernel


def parse(case: str) -> dict:
    """A case's dtype, activation code (as the kernel gets it), flags and config (a 7-tuple with the split)."""
    from reference_kernels import _gemm_common, _gemm_ws
    from reference_kernels import gemm_epilogue as ge

    dtype, *rest = case.split(":")
    if dtype not in ("bf16", "fp16"):
        raise SystemExit(f"{case!r}: the dtype is bf16 or fp16")
    activation, flags, tile, stages, split = "none", set(), None, None, None
    for part in rest:
        if part in ACTIVATIONS:
            activation = part
        elif part in FLAGS:
            flags.add(part)
        elif re.fullmatch(r"\d+x\d+", part):
            tile = tuple(int(v) for v in part.split("x"))
        elif re.fullmatch(r"s\d+", part):
            stages = int(part[1:])
        elif re.fullmatch(r"split[12]", part):
            split = int(part[5:])
        else:
            raise SystemExit(f"{case!r}: unknown part {part!r} (activation {', '.join(ACTIVATIONS)}; flags "
                             f"{', '.join(FLAGS)}; a tile BMxBN; sN stages; split1 or split2)")
    config = tuple(_gemm_ws.DEFAULT_CONFIG)
    if tile:
        known = [tuple(c) for c in ge._WS_CONFIGS + ge._WS_SMALL_CONFIGS if tuple(c[:2]) == tile]
        config = known[0] if known else tile + config[2:]
    if stages:
        config = config[:4] + (stages,) + config[5:]
    if len(config) < 7:
        config += (_gemm_ws.EPILOGUE_SPLIT,)
    if split:
        config = config[:6] + (split,)
    return {"dtype": dtype, "activation": _gemm_common.fast_activation(ACTIVATIONS[activation]), "flags": flags,
            "config": config[:7]}


def compile_case(case: str) -> dict:
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import mangle_type

    from reference_kernels import _gemm_common, _gemm_ws
    from reference_kernels import gemm_epilogue as ge

    spec = parse(case)
    dtype, flags = spec["dtype"], spec["flags"]
    BM, BN, BK, group_m, stages, _, split = spec["config"]
    # host tensors for the descriptors' shapes, strides and layouts only: CPU ones do
    tdt = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    N = 744 if "ragged" in flags else 768
    a = torch.empty(M, K, dtype=tdt)
    b = torch.empty(N, K, dtype=tdt).T if "kmajor" in flags else torch.empty(K, N, dtype=tdt)
    out = torch.empty(M, N, dtype=tdt)
    a_desc, b_desc, c_desc, b_kmajor = _gemm_ws._descriptors(a, b, out, BM, BN, BK, split)
    assert b_kmajor == ("kmajor" in flags), case
    residual = "residual" in flags
    signature = {"a_desc": mangle_type(a_desc), "b_desc": mangle_type(b_desc), "c_desc": mangle_type(c_desc),
                 "bias_ptr": f"*{dtype}", "res_ptr": f"*{dtype}", "M": "i32", "N": "i32", "K": "i32",
                 "stride_rm": "i32", "stride_rn": "i32"}
    constexprs = {"BLOCK_M": BM, "BLOCK_N": BN, "BLOCK_K": BK, "GROUP_M": group_m, "STAGES": stages,
                  "NUM_PROGRAMS": PROGRAMS, "B_KMAJOR": b_kmajor, "EPILOGUE_SPLIT": split,
                  "HAS_BIAS": "nobias" not in flags, "ACTIVATION": spec["activation"], "HAS_RESIDUAL": residual,
                  "GELU_DEGREE": _gemm_common.GELU_DEGREE, "CONSUMER_REGS": _gemm_ws.CONSUMER_REGS,
                  "LOADER_REGS": _gemm_ws.LOADER_REGS}
    # the JIT's specialisation of launch's arguments: a contiguous residual's stride_rn == 1 is a constant; without a
    # residual both strides are 0 (divisible by 16); N and stride_rm (= N) divisible by 16 unless ragged
    divisible = {"bias_ptr", "res_ptr"}
    if residual:
        constexprs["stride_rn"] = 1
        divisible |= set() if "ragged" in flags else {"N", "stride_rm"}
    else:
        divisible |= {"stride_rm", "stride_rn"} | (set() if "ragged" in flags else {"N"})
    signature.update({name: "constexpr" for name in constexprs})
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(signature)
             if name in divisible and signature[name] != "constexpr"}
    compiled = triton.compile(GluonASTSource(_gemm_ws._gemm_ws_kernel, signature, constexprs=constexprs, attrs=attrs),
                              target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    result = {
        "case": case,
        "config": list(spec["config"]),
        "activation": spec["activation"],
        "shared": compiled.metadata.shared,
        "smem_bytes": _gemm_ws.smem_bytes(spec["config"], tdt.itemsize, split),  # the host's estimate
        "warps": compiled.metadata.num_warps,  # all partitions'
    }
    usage, sass = _sass.disassemble(compiled.asm["cubin"])
    for name, key in (("registers", "REG"), ("stack", "STACK"), ("local", "LOCAL")):
        result[name] = _sass.resource(usage, key)

    def count(pattern):
        return len(re.findall(pattern, sass, re.M)) if sass else None

    result.update(
        hgmma=count(r"\bHGMMA\."),
        setmaxnreg=_sass.setmaxnreg(sass),
        utmaldg=count(r"\bUTMALDG\b"),
        utmastg=count(r"\bUTMASTG\b"),
        stl=count(r"\bSTL\b"),
        ldl=count(r"\bLDL\b"),
        instructions=count(_sass.INSTRUCTION),
        sass=sass,
    )
    return result


def main() -> None:
    from reference_kernels import _gemm_ws

    _sass.main(__doc__.splitlines()[0], "ws_sass.py", compile_case, lambda: _gemm_ws.gluon is not None)


if __name__ == "__main__":
    main()
