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
# memcheck's leak check runs without the variant cases: PyTorch's allocator still holds some of their
# tensors' blocks at exit (no tensor alive, no reference count left over, no growth over 200 calls), which
# the leak check reports as leaks; memcheck checks their accesses in a run of its own.
for tool in memcheck memcheck-variants racecheck synccheck initcheck; do
  extra=""
  cases=()
  [ "$tool" = memcheck ] && extra="--leak-check full" && cases=(--no-variants)
  [ "$tool" = memcheck-variants ] && cases=(--variants-only)
  log=$(mktemp)
  start=$(date +%s)
  compute-sanitizer --tool "${tool%-variants}" $extra --error-exitcode 99 --print-limit 20 \
    python3 scripts/sanitize_cases.py "${cases[@]}" "$@" >"$log" 2>&1
  rc=$?
  echo "$tool: exit $rc in $(( $(date +%s) - start )) s; $(grep -E 'ERROR SUMMARY|runs over' "$log" | tr '\n' ' ')"
  if [ $rc -ne 0 ]; then
    status=1
    grep -E -m 30 'Invalid|Race|race|Uninitialized|ERROR|FAIL|Error' "$log"
  fi
  rm -f "$log"
done
exit $status
