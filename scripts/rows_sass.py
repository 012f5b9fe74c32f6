"""Compile the layer norm's rows kernels (reference_kernels/_layer_norm_kernels.py: the forward's
``_layer_norm_fwd_kernel``, the backward's ``_layer_norm_bwd_kernel`` in rows mode) for sm_90 on any machine, GPU or
not, and say what came out.

    python scripts/rows_sass.py bf16:2560:4096:4 bf16:2560:4096:4:widen bf16:5120:4096+1024:4:joint:packed:r64 [--json]
    python scripts/rows_sass.py bwd:bf16:4096:8:1 bwd:bf16:4096:8:1:sum dwdb:256:8:splits

A case is ``DTYPE:N:PIECES:WARPS[:FLAG...][:rREGS]`` for aligned rows (N a multiple of 16, one row a program): DTYPE
bf16, fp16 or fp32; PIECES the first piece's lanes, or ``A+B`` for two pieces (``_aligned_16bit_pieces``, the
forward's rows in pieces); WARPS the program's warps; flags ``joint`` (JOINT statistics), ``packed`` (x held as loaded
through the reduction), ``widen`` (bf16 widened by a shift and an AND, ``_math.widen``: what ``rows_widen_bands``
turns on); ``rREGS`` a ptxas register cap (the launch's ``maxnreg``). The cases are what ``layer_norm._forward_launch``
launches for such rows; the script takes them as given, it does not plan.

Per case: registers and stack (cuobjdump), the SASS's instruction count, its PRMTs (the compiler's bf16 widening
extracts the high element with one), and whether the PTX has the widening's AND. Like scripts/held_sass.py it uses
Triton's own ptxas, cuobjdump and nvdisasm and its offline-compile entry points (ASTSource, GPUTarget), so it needs
no GPU; run it without TRITON_INTERPRET. tests/test_ref_layer_norm.py runs it.

A backward case is ``bwd:DTYPE:BLOCK_N:WARPS:BLOCK_M[:sum]`` (``sum``: SUM_HERE, the shares summed by the last group in
the launch, ``_sum_shares_if_last``); it says, besides registers and stack, the PTX's global atomics by their ordering
(``releases``: ``.release`` RMWs; ``acquires``: ``ld.acquire`` loads) and its loads through to L2 (``ld.cg``; vectors).
``dwdb:BLOCK_N:WARPS[:splits]`` says the same of the shares' sum (``_layer_norm_dwdb_kernel``, bf16 dweight and dbias;
``splits``: SPLITS, the splits' sums added by each column block's last split).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import _sass  # noqa: E402

FLAGS = ("joint", "packed", "widen")
POINTERS = ("x_ptr", "w_ptr", "b_ptr", "y_ptr")


def parse(case: str) -> dict:
    """A case's dtype, width, pieces (a 3-tuple), warps, flags and register cap (None: ptxas's choice)."""
    parts = case.split(":")
    if len(parts) < 4 or parts[0] not in ("bf16", "fp16", "fp32"):
        raise SystemExit(f"{case!r}: DTYPE:N:PIECES:WARPS[:FLAG...][:rREGS], DTYPE bf16, fp16 or fp32")
    dtype, n, pieces, warps, *rest = parts
    if not (n.isdigit() and int(n) % 16 == 0 and re.fullmatch(r"\d+(\+\d+)?", pieces) and warps.isdigit()):
        raise SystemExit(f"{case!r}: N a multiple of 16, PIECES A or A+B, WARPS a number")
    lanes = [int(p) for p in pieces.split("+")]
    flags, cap = set(), None
    for part in rest:
        if part in FLAGS:
            flags.add(part)
        elif re.fullmatch(r"r\d+", part):
            cap = int(part[1:])
        else:
            raise SystemExit(f"{case!r}: unknown part {part!r} (flags {', '.join(FLAGS)}; rREGS a register cap)")
    return {"dtype": dtype, "n": int(n), "pieces": (lanes + [0, 0])[:3], "warps": int(warps), "flags": flags,
            "cap": cap}


def compile_case(case: str) -> dict:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from reference_kernels import layer_norm

    if case.startswith(("bwd:", "dwdb:")):
        return compile_backward_case(case)
    spec = parse(case)
    kernel = layer_norm._layer_norm_fwd_kernel
    scalars = {"mean_ptr": "*fp32", "rstd_ptr": "*fp32", "x_phase": "i32", "n_rows": "i32", "n_cols": "i32",
               "stride_x": "i32", "stride_y": "i32", "eps": "fp32"}
    scalars.update({name: f"*{spec['dtype']}" for name in POINTERS})
    constexprs = {"BLOCK_M": 1, "BLOCK_N": spec["pieces"][0], "BLOCK_T": spec["pieces"][1],
                  "BLOCK_U": spec["pieces"][2], "VEC": 1, "JOINT": "joint" in spec["flags"],
                  "PACKED": "packed" in spec["flags"], "NARROW": 0, "PARAMS_FIRST": False,
                  "WIDEN": "widen" in spec["flags"]}
    signature = {name: scalars.get(name, "constexpr") for name in kernel.arg_names}
    # pointers 16-byte aligned and the width and strides multiples of 16, as Triton specialises an aligned launch
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(kernel.arg_names)
             if signature[name].startswith("*") or name in ("n_cols", "stride_x", "stride_y")}
    options = {"num_warps": spec["warps"], **({"maxnreg": spec["cap"]} if spec["cap"] else {})}
    compiled = triton.compile(ASTSource(kernel, signature, constexprs=constexprs, attrs=attrs),
                              target=GPUTarget("cuda", 90, 32), options=options)
    usage, sass = _sass.disassemble(compiled.asm["cubin"])
    return {
        "case": case,
        "registers": _sass.resource(usage, "REG"),
        "stack": _sass.resource(usage, "STACK"),
        "instructions": len(re.findall(_sass.INSTRUCTION, sass, re.M)) if sass else None,
        "prmt": len(re.findall(r"\bPRMT\b", sass)) if sass else None,
        "widening_and": "0xffff0000" in compiled.asm["ptx"].lower(),
        "sass": sass,
    }


def compile_backward_case(case: str) -> dict:
    """``bwd:DTYPE:BLOCK_N:WARPS:BLOCK_M[:sum]``: the backward's rows kernel as ``layer_norm._backward_launch`` launches
    it in rows mode (16-byte aligned pointers), with SUM_HERE where ``sum`` is given; ``dwdb:...``: the shares' sum."""
    from reference_kernels import _layer_norm_kernels

    if case.startswith("dwdb:"):
        parts = case.split(":")[1:]
        if len(parts) not in (2, 3) or not all(p.isdigit() for p in parts[:2]) or parts[2:] not in ([], ["splits"]):
            raise SystemExit(f"{case!r}: dwdb:BLOCK_N:WARPS[:splits]")
        kernel = _layer_norm_kernels._layer_norm_dwdb_kernel
        types = {"dw_ptr": "*bf16", "db_ptr": "*bf16", "count_ptr": "*i32", "n_groups": "i32", "n_cols": "i32",
                 "groups_per_split": "i32"}
        types.update({name: "*fp32" for name in ("dw_part_ptr", "db_part_ptr", "dw_mid_ptr", "db_mid_ptr")})
        constexprs = {"BLOCK_G": 16, "BLOCK_N": int(parts[0]), "SPLITS": parts[2:] == ["splits"]}
        return _compiled_facts(case, kernel, types, constexprs, int(parts[1]))
    parts = case.split(":")[1:]
    if (len(parts) not in (4, 5) or parts[0] not in ("bf16", "fp16", "fp32") or not all(p.isdigit() for p in parts[1:4])
            or parts[4:] not in ([], ["sum"])):
        raise SystemExit(f"{case!r}: bwd:DTYPE:BLOCK_N:WARPS:BLOCK_M[:sum], DTYPE bf16, fp16 or fp32")
    dtype, block_n, warps, block_m = parts[0], *map(int, parts[1:4])
    kernel = _layer_norm_kernels._layer_norm_bwd_kernel
    types = {"mean_ptr": "*fp32", "rstd_ptr": "*fp32", "dw_part_ptr": "*fp32", "db_part_ptr": "*fp32",
             "count_ptr": "*i32"}
    types.update({name: f"*{dtype}" for name in ("x_ptr", "dy_ptr", "w_ptr", "dx_ptr", "part_ptr", "dw_ptr", "db_ptr")})
    types.update({name: "i32" for name in ("n_rows", "n_cols", "stride_x", "stride_dy", "stride_dx", "rows_per_group",
                                           "n_chunks")})
    constexprs = {"MODE": 0, "BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_C": 1, "PREFETCH": False, "NARROW": 0,
                  "SUM_HERE": parts[4:] == ["sum"]}
    return _compiled_facts(case, kernel, types, constexprs, warps)


def _compiled_facts(case: str, kernel, types: dict, constexprs: dict, warps: int) -> dict:
    """A backward kernel compiled for sm_90 (arguments typed by ``types``, the rest constexprs): its registers, stack,
    atomics by ordering and loads through to L2."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = {name: types.get(name, "constexpr") for name in kernel.arg_names}
    # pointers 16-byte aligned and the width and strides multiples of 16, as Triton specialises an aligned launch
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(kernel.arg_names)
             if signature[name][0] == "*" or name in ("n_cols", "stride_x", "stride_dy", "stride_dx")}
    compiled = triton.compile(ASTSource(kernel, signature, constexprs=constexprs, attrs=attrs),
                              target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
    ptx = compiled.asm["ptx"]
    usage, sass = _sass.disassemble(compiled.asm["cubin"])
    return {
        "case": case,
        "registers": _sass.resource(usage, "REG"),
        "stack": _sass.resource(usage, "STACK"),
        "releases": len(re.findall(r"\b(?:atom|red)\.global\.gpu\.(?:release|acq_rel)\.", ptx)),
        "acquires": len(re.findall(r"\bld\.global\.gpu\.acquire\.", ptx)),
        "atomics": len(re.findall(r"\b(?:atom|red)\.global", ptx)),
        "l2_loads": len(re.findall(r"\bld\.global\.cg\.", ptx)),
        "l2_vector_loads": len(re.findall(r"\bld\.global\.cg\.v\d", ptx)),
        "sass": sass,
    }


def main() -> None:
    _sass.main(__doc__.splitlines()[0], "rows_sass.py", compile_case, lambda: True)


if __name__ == "__main__":
    main()
