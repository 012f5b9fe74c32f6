#!/usr/bin/env bash
# Mutation testing of pytest_fusioncheck's pure-logic modules with mutmut (issue 16).
#
#   bash scripts/mutation.sh budget baseline numerics
#
# Installs mutmut (pinned) into .mutmut-venv/, a venv layered on the project's .venv, on
# first use; mutates each named module (pytest_fusioncheck/<name>.py, which must be listed
# in [tool.mutmut] only_mutate in pyproject.toml); runs the fast tests of [tool.mutmut] on
# every mutant, one at a time; prints the per-module score table and writes it to
# mutants/score.md. Not run in CI: about 12 minutes on 2 cores. docs/mutation.md explains
# how to read the table and lists the mutants accepted as equivalent.
set -euo pipefail
cd "$(dirname "$0")/.."

modules=("$@")
[ ${#modules[@]} -gt 0 ] || modules=(budget baseline numerics)
PYTHON=${PYTHON:-.venv/bin/python}
tools=.mutmut-venv

if ! "$tools/bin/python" -c "import mutmut" 2>/dev/null; then
    echo "installing mutmut into $tools (once)"
    "$PYTHON" -m venv "$tools"
    project_site=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    tools_site=$("$tools/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    # torch, pytest and the plugin come from the project's venv; only mutmut lives here.
    echo "import site; site.addsitedir('$project_site')" > "$tools_site/_project_venv.pth"
    "$tools/bin/pip" install --quiet "mutmut==3.8.1"
fi

"$tools/bin/python" scripts/mutation_score.py --check "${modules[@]}"
globs=()
for m in "${modules[@]}"; do globs+=("pytest_fusioncheck.$m.*"); done

# A fresh copy every run, so that no result cached from older source is counted.
rm -rf mutants
mkdir -p mutants
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1  # the machine has 2 cores, shared
start=$(date +%s)
"$tools/bin/python" -m mutmut run --max-children 1 "${globs[@]}" > mutants/run.log 2>&1 || {
    echo "mutmut failed; the end of mutants/run.log:" >&2
    tr '\r' '\n' < mutants/run.log | tail -n 40 >&2
    exit 1
}
"$tools/bin/python" scripts/mutation_score.py --seconds $(( $(date +%s) - start )) "${modules[@]}"
