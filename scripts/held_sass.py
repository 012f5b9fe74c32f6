"""Compile the shared-memory (held) Gluon kernels for sm_90 on any machine, GPU or not, and say what came out.

    python scripts/held_sass.py softmax:bf16:50257 layer_norm:bf16:fp32:10468 [--json] [--sass DIR]

A case is ``softmax:DTYPE:N``, ``softmax_split:DTYPE:N:GROUP`` (rows in GROUP slices),
``layer_norm:DTYPE:PARAM_DTYPE:N``, ``layer_norm_stream:DTYPE:PARAM_DTYPE:N`` (rows too wide to hold, streamed past the
held weight and bias) or ``layer_norm_bwd:DTYPE:PARAM_DTYPE:N`` (DTYPE bf16, fp16 or fp32; the last is the backward). Per case: the shared
memory and registers the compiled kernel takes, its SASS instruction count, and whether every copy into shared memory
is a 16-byte ``cp.async`` and the body's stores 16-byte vectors (what the aligned-down row start is for:
docs/kernels.md, "Rows held in shared memory"). ``--sass DIR`` writes each case's SASS there, for comparing two
versions of a kernel instruction by instruction. It uses Triton's own ptxas, cuobjdump and nvdisasm, and Triton's
private offline-compile entry points (GluonASTSource, GPUTarget), so it needs no GPU but may need updating when
Triton moves them. Run it without TRITON_INTERPRET: under the interpreter Triton's library functions are not
compilable. tests/test_ref_held.py runs it.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import _sass  # noqa: E402

SIGNATURES = {
    "softmax": ["x_ptr:*X", "y_ptr:*X", "n_rows:i32", "n_cols:i32"],
    "softmax_split": ["x_ptr:*X", "y_ptr:*X", "part_ptr:*fp32", "sync_ptr:*i32", "n_rows:i32", "n_cols:i32",
                      "slice_cols:i32"],
    "layer_norm": ["x_ptr:*X", "w_ptr:*P", "b_ptr:*P", "y_ptr:*X", "mean_ptr:*fp32", "rstd_ptr:*fp32", "n_rows:i32",
                   "n_cols:i32", "eps:fp32"],
    "layer_norm_stream": ["x_ptr:*X", "w_ptr:*P", "b_ptr:*P", "y_ptr:*X", "mean_ptr:*fp32", "rstd_ptr:*fp32",
                        "n_rows:i32", "n_cols:i32", "eps:fp32"],
    "layer_norm_bwd": ["x_ptr:*X", "dy_ptr:*X", "w_ptr:*P", "mean_ptr:*fp32", "rstd_ptr:*fp32", "dx_ptr:*X",
                       "dw_part_ptr:*fp32", "db_part_ptr:*fp32", "n_rows:i32", "n_cols:i32"],
}


def compile_case(case: str) -> dict:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    from reference_kernels import _held, _layer_norm_held, _softmax_held, _split_walk

    subject, *rest = case.split(":")
    if subject == "softmax":
        dtype, n = rest[0], int(rest[1])
        param, kernel = None, _softmax_held._softmax_held_kernel
    elif subject == "softmax_split":
        dtype, n, group = rest[0], int(rest[1]), int(rest[2])
        param, kernel = None, _softmax_held._softmax_held_split_kernel
    elif subject in ("layer_norm", "layer_norm_stream", "layer_norm_bwd"):
        dtype, param, n = rest[0], rest[1], int(rest[2])
        kernel = {"layer_norm": _layer_norm_held._layer_norm_fwd_held_kernel,
                  "layer_norm_stream": _layer_norm_held._layer_norm_fwd_stream_kernel,
                  "layer_norm_bwd": _layer_norm_held._layer_norm_bwd_held_kernel}[subject]
    else:
        raise SystemExit(f"unknown subject in {case!r}: softmax, softmax_split, layer_norm, layer_norm_stream"
                         " or layer_norm_bwd")
    elem = 4 if dtype == "fp32" else 2
    signature = {}
    for entry in SIGNATURES[subject]:
        name, ty = entry.split(":")
        signature[name] = ty.replace("X", dtype).replace("P", param or dtype)
    constexprs = {"BLOCK": _held.BLOCK, "NSEG": _held.segments(n, elem), "VEC": 16 // elem, "num_warps": _held.WARPS}
    max_regs = _held.MAX_REGS
    if subject.startswith("softmax"):
        constexprs["WIDEN"] = _softmax_held.widen_rows()
    if subject == "softmax_split":  # its launch's slices (_softmax_held.split_shape)
        group, slice_cols = _softmax_held.split_shape(n, elem, group)
        constexprs.update(GROUP=group, BLOCK_G=triton.next_power_of_2(group), NSEG=_held.segments(slice_cols, elem),
                          SPIN=_split_walk.spin_asm(_softmax_held.SPIN_MAX_NS))
    if subject == "layer_norm":  # its launch's shape: warps and segments (_layer_norm_held.fwd_shape)
        warps, block, nseg, _ = _layer_norm_held.fwd_shape(n, elem, elem + 2 * (4 if param == "fp32" else 2))
        constexprs.update(BLOCK=block, NSEG=nseg, JOINT=_layer_norm_held.fwd_joint(elem), WIDEN=True,
                          num_warps=warps)
    if subject == "layer_norm_stream":  # the streamed forward: rows in registers, the weight and bias in shared memory
        shape = _layer_norm_held.stream_shape(n, elem, 2 * (4 if param == "fp32" else 2))
        if shape is None:
            raise SystemExit(f"{case}: the streamed forward does not take these rows (stream_shape)")
        constexprs.update(BLOCK=shape.block, NSEG=shape.nseg, WIDEN=True, num_warps=shape.warps,
                          RECENTRE=_layer_norm_held.stream_recentre(elem))
        max_regs = shape.max_regs
    if subject == "layer_norm_bwd":  # its launch's shape: segments, ring, warps, registers (_layer_norm_held.bwd_shape)
        shape = _layer_norm_held.bwd_shape(n, elem, 4 if param == "fp32" else 2)
        constexprs.update(BLOCK=shape.block, NSEG=shape.nseg, RING=shape.ring, PAIRED=_layer_norm_held.paired(shape),
                          REG_SHARES=shape.reg_shares, WIDEN=_layer_norm_held.bwd_widen(shape, n),
                          num_warps=shape.warps)
        max_regs = shape.max_regs
    signature.update({name: "constexpr" for name in constexprs})
    # pointers 16-byte aligned, as the launchers' fits() require; the width as a launch specialises it (Triton marks an
    # integer argument divisible by 16, so aligned widths compile apart from ragged ones)
    attrs = {(i,): [["tt.divisibility", 16]] for i, (name, ty) in enumerate(signature.items())
             if ty.startswith("*") or (name == "n_cols" and n % 16 == 0)}
    compiled = triton.compile(GluonASTSource(kernel, signature, constexprs=constexprs, attrs=attrs),
                              target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": constexprs["num_warps"], "maxnreg": max_regs})
    ptx = compiled.asm["ptx"]
    copies = re.findall(r"cp\.async\.(\w+)\.shared\.global \[[^]]*\], \[[^]]*\], (\w+)", ptx)
    result = {
        "case": case,
        "shared": compiled.metadata.shared,
        "copies": len(copies),
        "copies_16_byte": bool(copies) and all(kind == "cg" and size == "0x10" for kind, size in copies),
        "vector_stores": "st.global.v4.b32" in ptx,
        "vector_loads": bool(re.search(r"ld\.global(\.\w+)*\.v4\.b32", ptx)),
        "register_cap": max_regs,  # the launch's maxnreg, which the compile used
    }
    usage, sass = _sass.disassemble(compiled.asm["cubin"])
    result.update(registers=_sass.resource(usage, "REG"), stack=_sass.resource(usage, "STACK"),
                  instructions=len(re.findall(_sass.INSTRUCTION, sass, re.M)) if sass else None, sass=sass)
    return result


def main() -> None:
    from reference_kernels import _held

    _sass.main(__doc__.splitlines()[0], "held_sass.py", compile_case, lambda: _held.gluon is not None)


if __name__ == "__main__":
    main()
