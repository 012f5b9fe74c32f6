"""Compile the attention forward kernels (reference_kernels/attention.py: ``_attention_fwd_kernel`` through pointers,
``_attention_fwd_tma_kernel`` through TMA descriptors; ``_attention_ws``'s warp-specialised Gluon kernel) for sm_90 on
any machine, GPU or not, and say what came out.

    python scripts/attn_sass.py ptr:bf16:d128 tma:bf16:d128:128x64:w8:s3 ws:bf16:d64:causal [--json] [--sass DIR]

A case is ``KIND:DTYPE:dHEAD_DIM[:BMxBN][:wWARPS][:sSTAGES][:causal]``: KIND ``ptr``, ``tma`` or ``ws``; DTYPE bf16,
fp16 or fp32 (``ws``: 16-bit only); HEAD_DIM 64 or 128; the tile, warps and stages default to ``attention._PLANS``' plan
for that head_dim and element size (the one ``fused`` launches on a GPU), ``ws``'s to ``_attention_ws.plan`` on an sm_90
(``plan``'s consumers of 64 rows; ``:cK`` consumers, ``:ROWSxBN`` and ``:sSTAGES`` vary; ``:walk`` compiles the persistent
walk, ``_attention_walk_kernel``). The compile is the one a
launch on contiguous (B, H, N, D) tensors with N a multiple of 16 asks for: pointers, strides and the sequence length
16-divisible, a positive scale (the FMA form), ``ex2.approx``, tensor-core dots (fp32: IEEE).

Per case: the plan, registers, stack and local memory (cuobjdump), shared memory, the SASS's HGMMAs, TMA loads
(UTMALDG), ``cp.async`` copies (LDGSTS), local stores and loads (STL, LDL: spills) and its instruction count. Like
scripts/ws_sass.py it uses Triton's own ptxas, cuobjdump and nvdisasm and its offline-compile entry points
(ASTSource, GPUTarget), so it needs no GPU; run it without TRITON_INTERPRET. tests/test_ref_attention.py and
test_ref_attention_ws.py run it.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import _sass  # noqa: E402

KINDS = ("ptr", "tma", "ws")
DTYPES = {"bf16": 2, "fp16": 2, "fp32": 4}


def parse(case: str) -> dict:
    """A case's kernel kind, dtype, head_dim, causal flag and plan (``attention._Plan``)."""
    from reference_kernels import attention

    parts = case.split(":")
    if len(parts) < 3 or parts[0] not in KINDS or parts[1] not in DTYPES or not re.fullmatch(r"d\d+", parts[2]):
        raise SystemExit(f"{case!r}: KIND:DTYPE:dHEAD_DIM[:BMxBN][:wWARPS][:sSTAGES][:causal], KIND {' or '.join(KINDS)}, "
                         f"DTYPE {', '.join(DTYPES)}")
    kind, dtype, head_dim = parts[0], parts[1], int(parts[2][1:])
    if head_dim not in attention._HEAD_DIMS:
        raise SystemExit(f"{case!r}: head_dim {head_dim}, not one of {attention._HEAD_DIMS}")
    if kind == "ws":
        return _parse_ws(case, dtype, head_dim, parts[3:])
    plan = attention._PLANS[(head_dim, DTYPES[dtype])]
    if kind == "tma":
        plan = plan._replace(tma=True)
    causal = False
    for part in parts[3:]:
        if part == "causal":
            causal = True
        elif re.fullmatch(r"\d+x\d+", part):
            block_m, block_n = (int(v) for v in part.split("x"))
            plan = plan._replace(block_m=block_m, block_n=block_n)
        elif re.fullmatch(r"w\d+", part):
            plan = plan._replace(num_warps=int(part[1:]))
        elif re.fullmatch(r"s\d+", part):
            plan = plan._replace(num_stages=int(part[1:]))
        else:
            raise SystemExit(f"{case!r}: unknown part {part!r} (a tile BMxBN, wWARPS, sSTAGES or causal)")
    return {"kind": kind, "dtype": dtype, "head_dim": head_dim, "causal": causal, "plan": plan}


def _parse_ws(case: str, dtype: str, head_dim: int, parts: list[str]) -> dict:
    from reference_kernels import _attention_ws, _device

    if DTYPES[dtype] != 2:
        raise SystemExit(f"{case!r}: the warp-specialised kernel takes 16-bit tensors only")
    plan = _attention_ws.plan(head_dim, 2, _device.DESCRIPTIONS["H100"])
    causal = False
    for part in parts:  # the consumers first: the tile's rows are theirs
        if re.fullmatch(r"c[23]", part):
            plan = plan._replace(consumers=int(part[1:]))
    for part in parts:
        if part == "causal":
            causal = True
        elif part == "walk":
            plan = plan._replace(walk=True)
        elif re.fullmatch(r"c[23]", part):
            continue
        elif re.fullmatch(r"\d+x\d+", part) and int(part.split("x")[0]) == plan.consumers * _attention_ws.BLOCK_M:
            plan = plan._replace(block_n=int(part.split("x")[1]))
        elif re.fullmatch(r"s\d+", part):
            plan = plan._replace(stages=int(part[1:]))
        else:
            raise SystemExit(f"{case!r}: unknown part {part!r} (cCONSUMERS, a tile of CONSUMERS x"
                             f" {_attention_ws.BLOCK_M} rows ROWSxBN, sSTAGES, walk or causal)")
    return {"kind": "ws", "dtype": dtype, "head_dim": head_dim, "causal": causal, "plan": plan}


def _compile_ws(spec: dict) -> tuple:
    """The Gluon kernel compiled as ``_attention_ws.launch`` asks, on contiguous (B, H, N, D) tensors, N a multiple
    of 16."""
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import mangle_type

    from reference_kernels import _attention_ws, _device

    plan, head_dim = spec["plan"], spec["head_dim"]
    launch_regs, consumer_regs = _attention_ws.regs(plan, _device.DESCRIPTIONS["H100"])
    t = torch.empty(1, 1, 4096, head_dim, dtype={"bf16": torch.bfloat16, "fp16": torch.float16}[spec["dtype"]])
    descs = _attention_ws.descriptors(t, t, t, t, plan.block_n)
    signature = {name: mangle_type(d) for name, d in zip(("q_desc", "k_desc", "v_desc", "o_desc"), descs)}
    signature.update(n_heads="i32", seq_len="i32", qk_scale="fp32")
    if plan.walk:  # the walk's tile counts
        signature.update(n_m="i32", bh_total="i32", sect="i32", n_tiles="i32")
    constexprs = {"BN": plan.block_n, "HEAD_DIM": head_dim, "STAGES": plan.stages, "CAUSAL": spec["causal"],
                  "CONSUMERS": plan.consumers, "CONSUMER_REGS": consumer_regs, "LOADER_REGS": _attention_ws.LOADER_REGS}
    signature.update({name: "constexpr" for name in constexprs})
    attrs = {(list(signature).index("seq_len"),): [["tt.divisibility", 16]]}
    kernel = _attention_ws._attention_walk_kernel if plan.walk else _attention_ws._attention_ws_kernel
    compiled = triton.compile(GluonASTSource(kernel, signature, constexprs=constexprs,
                                             attrs=attrs), target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": 4, "maxnreg": launch_regs})
    return compiled, list(plan), _attention_ws.smem_bytes(head_dim, 2, plan)


def compile_case(case: str) -> dict:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from reference_kernels import attention

    spec = parse(case)
    if spec["kind"] == "ws":
        compiled, plan_fields, host_smem = _compile_ws(spec)
        return _report(case, compiled, plan_fields, smem_bytes=host_smem)
    plan, dtype, head_dim = spec["plan"], spec["dtype"], spec["head_dim"]
    tma = spec["kind"] == "tma"
    kernel = attention._attention_fwd_tma_kernel if tma else attention._attention_fwd_kernel
    constexprs = {"HEAD_DIM": head_dim, "BLOCK_M": plan.block_m, "BLOCK_N": plan.block_n, "CAUSAL": spec["causal"],
                  "FAST_EXP": True, "DOT_IN_FP32": False, "DOT_PRECISION": "ieee" if dtype == "fp32" else "tf32",
                  "SCALE_FMA": True}
    constexprs = {k: v for k, v in constexprs.items() if k in kernel.arg_names}  # an older kernel's, for A/Bs
    signature = {}
    for name in kernel.arg_names:
        if name in constexprs:
            signature[name] = "constexpr"
        elif name.endswith("_desc"):  # q and o blocks of block_m rows, k and v of block_n
            rows = plan.block_m if name[0] in "qo" else plan.block_n
            signature[name] = f"tensordesc<{dtype}[1,1,{rows},{head_dim}]>"
        elif name.endswith("_ptr"):
            signature[name] = f"*{dtype}"
        else:
            signature[name] = "fp32" if name == "qk_scale" else "i32"
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(kernel.arg_names)
             if signature[name].startswith("*") or name.startswith("stride") or name == "seq_len"}
    compiled = triton.compile(ASTSource(kernel, signature, constexprs=constexprs, attrs=attrs),
                              target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": plan.num_warps, "num_stages": plan.num_stages})
    return _report(case, compiled, list(plan[:4]))


def _report(case: str, compiled, plan_fields: list, **extra) -> dict:
    usage, sass = _sass.disassemble(compiled.asm["cubin"])

    def count(pattern):
        return len(re.findall(pattern, sass, re.M)) if sass else None

    result = {"case": case, "plan": plan_fields, "warps": compiled.metadata.num_warps,
              "shared": compiled.metadata.shared, **extra}
    for name, key in (("registers", "REG"), ("stack", "STACK"), ("local", "LOCAL")):
        result[name] = _sass.resource(usage, key)
    result.update(hgmma=count(r"\bHGMMA\."), utmaldg=count(r"\bUTMALDG\b"), utmastg=count(r"\bUTMASTG\b"),
                  ldgsts=count(r"\bLDGSTS\b"), stl=count(r"\bSTL\b"), ldl=count(r"\bLDL\b"),
                  setmaxnreg=_sass.setmaxnreg(sass),
                  instructions=count(_sass.INSTRUCTION), sass=sass)
    return result


def main() -> None:
    _sass.main(__doc__.splitlines()[0], "attn_sass.py", compile_case, lambda: True)


if __name__ == "__main__":
    main()
