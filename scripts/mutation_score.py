"""The per-module score table of a mutmut run (scripts/mutation.sh calls this).

Reads mutmut's per-file results (``mutants/pytest_fusioncheck/<module>.py.meta``) and the
equivalent mutants listed in docs/mutation.md (table rows whose first cell is a mutant
name in backticks), prints one row per module and writes the table to mutants/score.md.
Also lists the survivors that are not accepted as equivalent (each needs a test or an
entry with its reason), and listed entries that no longer survive (to be removed).

Exit status: 0 when every module kills at least ``THRESHOLD`` of its mutants once the
listed equivalents are left out, 1 otherwise; 2 for a module not in [tool.mutmut].
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
THRESHOLD = 0.85
EQUIVALENT_ROW = re.compile(r"^\|\s*`(pytest_fusioncheck\.[^`]+)`\s*\|")


def only_mutate() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]
    return config["only_mutate"]


def equivalents() -> set[str]:
    doc = ROOT / "docs" / "mutation.md"
    if not doc.exists():
        return set()
    return {m.group(1) for line in doc.read_text().splitlines() if (m := EQUIVALENT_ROW.match(line))}


def statuses(module: str) -> dict[str, str]:
    from mutmut.stats import status_by_exit_code

    meta = ROOT / "mutants" / "pytest_fusioncheck" / f"{module}.py.meta"
    codes = json.loads(meta.read_text())["exit_code_by_key"]
    return {name: status_by_exit_code[code] for name, code in codes.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="+", help="module names, e.g. budget baseline numerics")
    parser.add_argument("--check", action="store_true", help="only check that each module is mutated")
    parser.add_argument("--seconds", type=int, help="wall time of the run, for the footer")
    args = parser.parse_args()

    configured = only_mutate()
    missing = [m for m in args.modules if f"pytest_fusioncheck/{m}.py" not in configured]
    if missing:
        print(f"not in [tool.mutmut] only_mutate of pyproject.toml: {', '.join(missing)}", file=sys.stderr)
        return 2
    if args.check:
        return 0

    accepted = equivalents()
    rows, unexplained, stale, low = [], [], [], []
    for module in args.modules:
        by_name = statuses(module)
        total = len(by_name)
        count = lambda *wanted: sum(1 for s in by_name.values() if s in wanted)  # noqa: E731
        killed = count("killed", "timeout")
        survivors = sorted(n for n, s in by_name.items() if s == "survived")
        equivalent = [n for n in survivors if n in accepted]
        unexplained += [n for n in survivors if n not in accepted]
        prefix = f"pytest_fusioncheck.{module}."
        stale += sorted(n for n in accepted if n.startswith(prefix) and by_name.get(n) != "survived")
        untested = count("no tests")
        other = total - killed - len(survivors) - untested
        score = killed / total if total else 0.0
        net = killed / (total - len(equivalent)) if total > len(equivalent) else 0.0
        if net < THRESHOLD:
            low.append(module)
        rows.append(
            f"| {module} | {total} | {killed} | {len(survivors) - len(equivalent)} | {len(equivalent)} "
            f"| {untested} | {other} | {score:.1%} | {net:.1%} |"
        )

    table = [
        "| module | mutants | killed | survived | equivalent | no tests | other | killed / mutants "
        "| killed / (mutants - equivalent) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        *rows,
    ]
    footer = f"mutmut, {datetime.date.today().isoformat()}"
    if args.seconds is not None:
        footer += f", {args.seconds // 60} min {args.seconds % 60} s"
    text = "\n".join(table) + f"\n\n{footer}\n"
    (ROOT / "mutants").mkdir(exist_ok=True)
    (ROOT / "mutants" / "score.md").write_text(text)
    print(text)
    if unexplained:
        print(f"{len(unexplained)} surviving mutants are neither killed nor listed as equivalent in "
              "docs/mutation.md (see each with `.mutmut-venv/bin/python -m mutmut show NAME`):")
        print("\n".join(f"  {n}" for n in unexplained))
    if stale:
        print("listed as equivalent in docs/mutation.md but no longer surviving (remove them):")
        print("\n".join(f"  {n}" for n in stale))
    if low:
        print(f"below {THRESHOLD:.0%} once equivalents are left out: {', '.join(low)}")
    return 1 if low else 0


if __name__ == "__main__":
    sys.exit(main())
