#!/usr/bin/env bash
# An earlier build against this tree's, on one GPU machine in one device call: each is built for 90a into
# its own directory, then every bench grid named runs with the earlier build, the later one, and the
# earlier one again (so that drift in the GPU's clock shows as a before/before difference), and
# scripts/compare_bench.py reports the later / earlier speed per grid.
#   bash scripts/bench_before_after.sh OLD_TREE 'GRID ARGS' ['GRID ARGS' ...]
# OLD_TREE: a source tree of the earlier commit (e.g. `git archive` of it, carried in an ignored folder).
# Example: bash scripts/bench_before_after.sh .old '--quick' '--decode --quick --graph'
# AGAIN=0 skips the second earlier run of the grids (not of --overhead, whose figures are the noisiest).
# SAME_TIMER=1 also times every case of each grid with one script for both builds (scripts/ab_time.py: the
# same inputs and timer whatever each build's bench does; two alternating rounds), and compares those.
# $OUT gets compare.log and bench.tgz (every grid's before-N / after-N / again-N JSON and log, and the
# build logs: the device tool brings back few files). Needs .whl/ (the CUTLASS wheel).
set -uo pipefail
old=$1; shift
root=$PWD
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
build() {  # build SOURCE TARGET
  local start=$(date +%s)
  PYTHONPATH=/tmp/site python3 -m pip install -q --no-build-isolation --no-deps --target "$2" \
    -C cmake.define.CMAKE_CUDA_ARCHITECTURES=90a -C build-dir="/tmp/build-$(basename "$2")" "$1" \
    >"$OUT/build-$(basename "$2").log" 2>&1 || { tail -30 "$OUT/build-$(basename "$2").log"; return 1; }
  echo "built $1 in $(( $(date +%s) - start )) s"
}
build "$old" /tmp/site_before & b1=$!
build . /tmp/site_after & b2=$!
wait $b1 || exit 1
wait $b2 || exit 1
n=0
for grid in "$@"; do
  n=$((n + 1))
  for run in before after $([ "${AGAIN:-1}" = 1 ] || [[ "$grid" == *--overhead* ]] && echo again); do
    site=/tmp/site_$([ "$run" = after ] && echo after || echo before)
    # shellcheck disable=SC2086
    (cd /tmp && PYTHONPATH="$site:/tmp/site" python3 -m cutlassfa.cli bench $grid --no-progress \
      --json "$OUT/$run-$n.json" >"$OUT/$run-$n.log" 2>&1) || echo "grid $n ($run) failed: $(tail -3 "$OUT/$run-$n.log")"
  done
  echo "grid $n: $grid" | tee -a "$OUT/compare.log"
  if [[ "$grid" == *--overhead* ]]; then  # no grid rows: the per-call table of each run
    for run in before after again; do echo "  $run:"; grep -E "^(torch|numpy|cupy)" "$OUT/$run-$n.log"; done |
      tee -a "$OUT/compare.log"
    continue
  fi
  python3 scripts/compare_bench.py "$OUT/before-$n.json" "$OUT/after-$n.json" | tee -a "$OUT/compare.log"
  if [ "${SAME_TIMER:-0}" = 1 ] && [ -f "$OUT/after-$n.json" ]; then
    graph=$([[ "$grid" == *--graph* ]] && echo --graph)
    for round in 1 2; do
      for run in before after; do
        (cd /tmp && PYTHONPATH="/tmp/site_$run:/tmp/site" python3 "$root/scripts/ab_time.py" \
          --tag "$run$round" $graph --cases-from "$OUT/after-$n.json" \
          >>"$OUT/same-timer-$n.jsonl" 2>>"$OUT/same-timer-$n.log") ||
          echo "same timer, grid $n ($run $round) failed: $(tail -2 "$OUT/same-timer-$n.log")"
      done
    done
    python3 scripts/ab_time.py --compare "$OUT/same-timer-$n.jsonl" before after | sed 's/^/  (same timer) /' |
      tee -a "$OUT/compare.log"
  fi
  [ -f "$OUT/again-$n.json" ] && python3 scripts/compare_bench.py "$OUT/before-$n.json" "$OUT/again-$n.json" |
    sed 's/^/  (before again) /' | tee -a "$OUT/compare.log"
done
(cd "$OUT" && tar czf bench.tgz ./*.json ./*.log $(ls ./*.jsonl 2>/dev/null) &&
  rm -f ./*.json ./*.jsonl before-*.log after-*.log again-*.log build-*.log same-timer-*.log)
