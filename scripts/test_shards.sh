#!/usr/bin/env bash
# The test suite as N pytest processes in parallel, each running one disjoint part (tests/conftest.py,
# --shard I/N: whole modules balanced by test count, a slow test counted as 150), for machines whose
# suite outlasts one sequential run's time budget (the GPU machine: the whole suite with
# CUTLASSFA_REQUIRE_GPU=1 and --run-slow). Then the tests marked `exclusive` (wall-clock and device-memory
# measurements that other processes would disturb) run alone, with the whole machine.
#   SHARDS=4 OUT=/tmp/out bash scripts/test_shards.sh [pytest args...]   (default args: tests)
# Each part logs to $OUT/tests-shard<I>.log, the exclusive run to $OUT/tests-exclusive.log; prints each
# one's summary line, exits non-zero when any fails (or was cut short by a timeout around this script:
# its summary line is missing).
set -uo pipefail
shards=${SHARDS:-4}
out=${OUT:-/tmp/out}
mkdir -p "$out"
[ $# -gt 0 ] || set -- tests
# The parts share the cores: numpy's BLAS and OpenMP would otherwise start one thread per core in every
# part, and the CPU-bound tests slow each other down several-fold.
threads=$(( $(nproc) / shards )); [ "$threads" -ge 1 ] || threads=1
summary() { grep -E '^(=+ )?[0-9]+ (passed|failed|skipped|error|deselected)' "$1" | tail -1; }
pids=()
for i in $(seq 0 $((shards - 1))); do
  OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads MKL_NUM_THREADS=$threads \
    python3 -m pytest -q -rfEs -p no:cacheprovider --shard "$i/$shards" "$@" >"$out/tests-shard$i.log" 2>&1 &
  pids+=($!)
done
status=0
# pytest exit code 5: the part collected no tests (fewer modules than parts, or no exclusive test)
for i in "${!pids[@]}"; do
  wait "${pids[$i]}"
  rc=$?
  [ $rc -eq 0 ] || [ $rc -eq 5 ] || status=1
  echo "part $i/$shards (exit $rc): $(summary "$out/tests-shard$i.log")"
done
python3 -m pytest -q -rfEs -p no:cacheprovider --shard exclusive "$@" >"$out/tests-exclusive.log" 2>&1
rc=$?
[ $rc -eq 0 ] || [ $rc -eq 5 ] || status=1
echo "exclusive (exit $rc): $(summary "$out/tests-exclusive.log")"
grep -h -E "^(FAILED|ERROR) " "$out"/tests-shard*.log "$out/tests-exclusive.log" | head -40
exit $status
