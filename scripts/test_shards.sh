#!/usr/bin/env bash
# The test suite as N pytest processes in parallel, each running one disjoint part (tests/conftest.py,
# --shard I/N: whole modules balanced by test count), for machines whose suite outlasts one sequential
# run's time budget (the GPU machine: the whole suite with CUTLASSFA_REQUIRE_GPU=1 and --run-slow).
#   SHARDS=4 OUT=/tmp/out bash scripts/test_shards.sh [pytest args...]   (default args: tests)
# Each part logs to $OUT/tests-shard<I>.log; prints each part's summary line, exits non-zero when any
# part fails (or was cut short by a timeout around this script: its summary line is missing).
set -uo pipefail
shards=${SHARDS:-4}
out=${OUT:-/tmp/out}
mkdir -p "$out"
[ $# -gt 0 ] || set -- tests
pids=()
for i in $(seq 0 $((shards - 1))); do
  python3 -m pytest -q -rs -p no:cacheprovider --shard "$i/$shards" "$@" >"$out/tests-shard$i.log" 2>&1 &
  pids+=($!)
done
status=0
for i in "${!pids[@]}"; do
  wait "${pids[$i]}"
  rc=$?
  # pytest exit code 5: this part collected no tests (fewer modules than parts)
  [ $rc -eq 0 ] || [ $rc -eq 5 ] || status=1
  echo "part $i/$shards (exit $rc): $(grep -E '^(=+ )?[0-9]+ (passed|failed|skipped|error|deselected)' "$out/tests-shard$i.log" | tail -1)"
done
grep -h -E "^(FAILED|ERROR) " "$out"/tests-shard*.log | head -40
exit $status
