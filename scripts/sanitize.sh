#!/usr/bin/env bash
# compute-sanitizer's memcheck, racecheck, synccheck and initcheck over every GPU backend on the small
# test matrix of scripts/sanitize_cases.py: host arrays, and CUDA tensors in strided layouts with a
# strided out= (PyTorch with CUDA needed; pass --no-strided to leave them out). Prints each tool's
# error summary; fails on any error.
#   bash scripts/sanitize.sh [--no-strided] [backend...]
# TOOLS="racecheck synccheck" runs only those (default: memcheck memcheck-variants racecheck synccheck
# initcheck).
set -uo pipefail
# Every tensor its own cudaMalloc: with PyTorch's caching allocator a read past a view's end can land
# in the same cached block and go unseen by memcheck.
export PYTORCH_NO_CUDA_MEMORY_CACHING=1
status=0
# memcheck's leak check runs over the plain cases; the variants' accesses are checked in a memcheck run
# of their own. The leak check currently reports blocks PyTorch's allocator took for the strided test
# tensors although no reference is left over and nothing grows over 200 calls (bench/NOTES-variants.md:
# an open question, not a pass).
for tool in ${TOOLS:-memcheck memcheck-variants racecheck synccheck initcheck}; do
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
