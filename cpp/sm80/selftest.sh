#!/usr/bin/env bash
# Build (nvcc only, no CMake / Python package) and run the tensor-core self-test, cpp/sm80/selftest.cu.
#   bash cpp/sm80/selftest.sh [check]      (check: correctness only, no timings)
# Run from the repository root; ARCH (default 90a) picks the target. BUILD_DIR (default /tmp/sm80_selftest),
# BUILD_ONLY=1, JOBS and NVCC_FLAGS as cpp/selftest_build.sh says.
source "$(dirname "${BASH_SOURCE[0]}")/../selftest_build.sh"
arch=${ARCH:-90a}
selftest_setup /tmp/sm80_selftest
# The head dims selftest.cu checks; this build carries the mma.sync family only.
head_dims="32 64 128"
selftest_config_h CUTLASSFA_SM80_HEAD_DIMS_CSV="$(selftest_csv "$head_dims")"
sources=(cpp/sm80/launch.cu cpp/sm80/selftest.cu)
selftest_instances sm80 instantiate $head_dims
selftest_build_and_run "$@"
