#!/usr/bin/env bash
# One call on the lent GPU machine: install the package (no network there; the CUTLASS wheel travels in
# .whl/), then run whatever steps are named, logging each under $OUT.
#   bash scripts/gpu_session.sh [--arch 90a] STEP...
# The copy there has no .git: put the commit and dirty flag of the checkout in front of the call, so
# bench and check results record them:
#   CUTLASSFA_COMMIT=$(git rev-parse HEAD) \
#   CUTLASSFA_DIRTY=$(git status --porcelain --untracked-files=no | grep -q . && echo 1 || echo 0) bash ...
# Tests, the gate and the sanitizer run with CUTLASSFA_REQUIRE_GPU=1: a GPU test that skips, or a GPU
# backend that cannot run, is a failure (a missing optional package excepted).
# Steps: build | tests | gpu-tests | check | bench-quick | bench | overhead | sanitize | cmd:'<shell command>'
set -uo pipefail
arch=90a
defines=()
while [ $# -gt 0 ]; do
  case "$1" in
    --arch) arch=$2; shift 2 ;;
    --no-tensorcore) defines+=(-C cmake.define.CUTLASSFA_TENSORCORE=OFF); shift ;;
    *) break ;;
  esac
done
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export CUTLASSFA_REQUIRE_GPU=1

install() {
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || return 1
  export PYTHONPATH=/tmp/site
  local start=$(date +%s)
  # Kernels exported by another build of these sources (cpp/prebuilt_kernels.cmake), packed as
  # .kernels.tar.xz: linked instead of compiled; a build they do not match refuses them, then builds all.
  local prebuilt=()
  if [ -f .kernels.tar.xz ] && mkdir -p /tmp/kernels && tar -xJf .kernels.tar.xz -C /tmp/kernels; then
    prebuilt=(-C cmake.define.CUTLASSFA_KERNELS_FROM=/tmp/kernels)
  fi
  python3 -m pip install -q --no-build-isolation --no-deps \
    -C cmake.define.CMAKE_CUDA_ARCHITECTURES="$arch" "${defines[@]}" "${prebuilt[@]}" . >"$OUT/build.log" 2>&1
  local rc=$?
  if [ $rc -ne 0 ] && [ ${#prebuilt[@]} -gt 0 ]; then
    echo "prebuilt kernels refused or failed ($(grep -m1 -o 'CUTLASSFA_KERNELS_FROM.*' "$OUT/build.log" | cut -c1-160)); building all"
    python3 -m pip install -q --no-build-isolation --no-deps -C cmake.define.CUTLASSFA_KERNELS_FROM= \
      -C cmake.define.CMAKE_CUDA_ARCHITECTURES="$arch" "${defines[@]}" . >"$OUT/build.log" 2>&1
    rc=$?
  fi
  echo "build rc=$rc in $(( $(date +%s) - start )) s (arch $arch)"
  [ $rc -eq 0 ] || tail -40 "$OUT/build.log"
  return $rc
}

status=0
install || exit 1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
for step in "$@"; do
  echo "=== $step"
  case "$step" in
    build) ;;
    # The whole suite, slow tests included, in $SHARDS parallel parts (one sequential run outlasts a
    # 10-minute device call): scripts/test_shards.sh. A test still running after 120 s has every
    # thread's stack dumped into its part's log (a hang shows where it waits).
    tests) SHARDS=${SHARDS:-4} OUT="$OUT" bash scripts/test_shards.sh --run-slow -o faulthandler_timeout=120 tests 2>&1 |
             tee "$OUT/tests.log" | tail -45 ;;
    gpu-tests) python3 -m pytest -q -rs -m gpu tests 2>&1 | tee "$OUT/gpu-tests.log" | tail -25 ;;
    check) python3 -m cutlassfa.cli check --json "$OUT/check.json" 2>&1 | tee "$OUT/check.log" | tail -40 ;;
    bench-quick) python3 -m cutlassfa.cli bench --quick --json "$OUT/bench-quick.json" 2>&1 | tee "$OUT/bench-quick.log" | tail -40 ;;
    bench) python3 -m cutlassfa.cli bench --json "$OUT/bench.json" --plot "$OUT/bench.png" 2>&1 | tee "$OUT/bench.log" | tail -80 ;;
    overhead) python3 -m cutlassfa.cli bench --overhead --json "$OUT/overhead.json" 2>&1 | tee "$OUT/overhead.log" | tail -20 ;;
    sanitize) bash scripts/sanitize.sh 2>&1 | tee "$OUT/sanitize.log" | tail -30 ;;
    cmd:*) bash -c "${step#cmd:}" 2>&1 | tee -a "$OUT/cmd.log" | tail -60 ;;
    *) echo "unknown step $step"; status=2 ;;
  esac
  [ ${PIPESTATUS[0]} -eq 0 ] || status=1
done
exit $status
