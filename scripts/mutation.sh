#!/usr/bin/env bash
# Mutation testing of the modules that decide what a user reads (results/trust.py, report/stats.py,
# report/findings/: the registry, the pairs' and the run's sentences, their rendering): installs
# requirements-mutation.txt into .venv/ and runs mutmut with the unit
# tests [tool.mutmut] in pyproject.toml names, then prints mutants, killed, survived and killed % per
# module and the survivors' names. Figures and why each survivor is harmless: docs/testing.md.
#
# mutmut names a mutated module after its file's path and only counts a test as reaching a mutant when
# the names agree; the package installs scripts/labrunner as `labrunner`, so mutmut runs in a staged
# copy whose top level is what the package installs (labrunner/, tests/, pyproject.toml). The working
# tree is never mutated. Arguments go to `mutmut run` (mutant names, --max-children N).
#
#   scripts/mutation.sh                      # about 10 minutes on a 2-vCPU VM
#   MUTATION_DIR=/tmp/m scripts/mutation.sh  # where the stage goes (default: $TMPDIR/protolab-mutation)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
venv=$root/.venv
stage=${MUTATION_DIR:-${TMPDIR:-/tmp}/protolab-mutation}

"$venv/bin/python" -m pip install --quiet -r "$root/requirements-mutation.txt"

rm -rf "$stage"
mkdir -p "$stage"
cp -r "$root/scripts/labrunner" "$stage/labrunner"
cp -r "$root/tests" "$stage/tests"
cp "$root/pyproject.toml" "$stage/pyproject.toml"
find "$stage" -name __pycache__ -prune -exec rm -rf {} +
# mutmut runs the tests in mutants/, the tests' checkout root (tests/support.py ROOT): the lab's other
# files (matrix.toml, k6/, services/, ...) are the checkout's, linked.
mkdir "$stage/mutants"
for entry in "$root"/* "$root"/.[!.]*; do
    case ${entry##*/} in .venv | tests | pyproject.toml) continue ;; esac
    ln -s "$entry" "$stage/mutants/${entry##*/}"
done

cd "$stage"
# The lab's files (matrix.toml, k6/, services/) stay the checkout's.
export PROTOLAB_HOME=$root
"$venv/bin/mutmut" run "$@" >"$stage/run.log" 2>&1 || { tail -40 "$stage/run.log"; exit 1; }
"$venv/bin/mutmut" results --all true >"$stage/results.txt"

# One line per mutant, "labrunner.results.trust.x_judge__mutmut_3: killed".
awk -F': ' '
    /__mutmut_/ {
        sub(/^ +/, "")
        name = $1; sub(/\.[^.]*__mutmut_[0-9]+$/, "", name)
        total[name]++; status[name, $2]++
        if ($2 != "killed") others[name] = others[name] "  " $1 ": " $2 "\n"
    }
    END {
        printf "%-32s %8s %7s %9s %9s\n", "module", "mutants", "killed", "survived", "killed %"
        for (m in total)
            printf "%-32s %8d %7d %9d %8.1f%%\n", m, total[m], status[m, "killed"], \
                status[m, "survived"], 100 * status[m, "killed"] / total[m]
        for (m in others) printf "\nnot killed in %s:\n%s", m, others[m]
    }' "$stage/results.txt"
echo "details: $stage/results.txt; a mutant's diff: (cd $stage && $venv/bin/mutmut show NAME)"
