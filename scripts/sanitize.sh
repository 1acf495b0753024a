#!/usr/bin/env bash
# compute-sanitizer's memcheck, racecheck, synccheck and initcheck over every GPU backend on the small
# test matrix of scripts/sanitize_cases.py. Prints each tool's error summary; fails on any error.
#   bash scripts/sanitize.sh [backend...]
set -uo pipefail
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
