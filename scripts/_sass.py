"""What scripts/*_sass.py share: a compiled kernel's cubin read with Triton's own cuobjdump
and nvdisasm, and the command line that compiles cases and prints what came out."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Callable

INSTRUCTION = r"^\s+/\*[0-9a-f]{4,}\*/\s+\S"  # one SASS instruction line of nvdisasm -c


def disassemble(cubin: bytes) -> tuple[str, str]:
    """(``cuobjdump -res-usage``, ``nvdisasm -c``) of a cubin with the tools Triton bundles; ("", "") where this Triton
    build has none."""
    import triton

    tools = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    try:
        usage = subprocess.run([str(tools / "cuobjdump"), "-res-usage", f.name], capture_output=True, text=True).stdout
        sass = subprocess.run([str(tools / "nvdisasm"), "-c", f.name], capture_output=True, text=True).stdout
    except OSError:
        return "", ""
    finally:
        os.unlink(f.name)
    return usage, sass


def resource(usage: str, key: str) -> int | None:
    """A resource count of ``cuobjdump -res-usage`` (REG, STACK, LOCAL, ...); None where it is not there."""
    found = re.search(rf"\b{key}:(\d+)", usage)
    return int(found.group(1)) if found else None


def setmaxnreg(sass: str) -> dict | None:
    """The register counts a warp-specialised kernel's ``setmaxnreg`` asks for: ``alloc`` (USETMAXREG.TRY_ALLOC) and
    ``dealloc`` (USETMAXREG.DEALLOC), each sorted, from ``nvdisasm -c``'s text; None without it."""
    if not sass:
        return None

    def counts(kind):  # e.g. USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0xf0 ; USETMAXREG.DEALLOC.CTAPOOL 0x18
        return sorted({int(v, 16) for v in re.findall(rf"USETMAXREG\.{kind}\S*\s+(?:\w+,\s*)?(0x[0-9a-f]+)", sass)})

    return {"alloc": counts("TRY_ALLOC"), "dealloc": counts("DEALLOC")}


def main(description: str, script: str, compile_case: Callable[[str], dict], has_gluon: Callable[[], bool]) -> None:
    """Compile each case named on the command line and print what ``compile_case`` says of it (its "sass" entry goes
    to ``--sass DIR`` instead); ``has_gluon`` is asked first, after the interpreter check."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("cases", nargs="+", metavar="CASE")
    parser.add_argument("--json", action="store_true", help="one JSON object a line instead of a table")
    parser.add_argument("--sass", metavar="DIR", help="write each case's SASS to DIR/<case>.sass")
    args = parser.parse_args()
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise SystemExit(f"{script}: unset TRITON_INTERPRET (the interpreter's library functions do not compile)")
    if not has_gluon():
        print(json.dumps({"unavailable": "this Triton has no Gluon"}) if args.json else "this Triton has no Gluon")
        return
    for case in args.cases:
        result = compile_case(case)
        sass = result.pop("sass")
        if args.sass:
            Path(args.sass).mkdir(parents=True, exist_ok=True)
            (Path(args.sass) / f"{case.replace(':', '_')}.sass").write_text(sass)
        print(json.dumps(result) if args.json else "  ".join(f"{k}={v}" for k, v in result.items()))
