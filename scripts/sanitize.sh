#!/usr/bin/env bash
# compute-sanitizer's memcheck, racecheck, synccheck and initcheck over every GPU backend on the small
# test matrix of scripts/sanitize_cases.py: host arrays, and CUDA tensors in strided layouts with a
# strided out= (PyTorch with CUDA needed; pass --no-strided to leave them out). Prints each tool's
# error summary; fails on any error.
#   bash scripts/sanitize.sh [--no-strided] [backend...]
set -uo pipefail
# Every tensor its own cudaMalloc: with PyTorch's caching allocator a read past a view's end can land
# in the same cached block and go unseen by memcheck.
export PYTORCH_NO_CUDA_MEMORY_CACHING=1
status=0
for tool in memcheck racecheck synccheck initcheck; do
  extra=""
  [ "$tool" = memcheck ] && extra="--leak-check full"
  log=$(mktemp)
  start=$(date +%s)
  compute-sanitizer --tool "$tool" $extra --error-exitcode 99 --print-limit 20 \
    python3 scripts/sanitize_cases.py "$@" >"$log" 2>&1
  rc=$?
  echo "$tool: exit $rc in $(( $(date +%s) - start )) s; $(grep -E 'ERROR SUMMARY|runs over' "$log" | tr '\n' ' ')"
  if [ $rc -ne 0 ]; then
    status=1
    grep -E -m 30 'Invalid|Race|race|Uninitialized|ERROR|FAIL|Error' "$log"
  fi
  rm -f "$log"
done
exit $status
