#!/usr/bin/env bash
# Real swarm throughput of another commit against this tree, interleaved:
#   benchmarks/train_before_after.sh BASE [ROUNDS]
# exports BASE with `git archive`, then runs `python -m benchmarks.train_cluster --only local`
# alternately in the two trees (each imports its own gwtf: PYTHONPATH and the working folder)
# and prints each run's table rows. Heavy: run it alone (flock /tmp/gwtf-heavy.lock ...).
set -euo pipefail
cd "$(dirname "$0")/.."
BASE=${1:?usage: benchmarks/train_before_after.sh BASE [ROUNDS]}
ROUNDS=${2:-2}
PY=${PY:-$PWD/.venv/bin/python}
HERE=$PWD
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
git archive "$BASE" | tar -x -C "$TMP"
for r in $(seq 1 "$ROUNDS"); do
  for tree in base this; do
    dir=$HERE
    [ "$tree" = base ] && dir=$TMP
    echo "=== round $r, $tree ($(date +%T))"
    (cd "$dir" && PYTHONPATH=$dir "$PY" -m benchmarks.train_cluster --only local | grep '^| tiny')
  done
done
