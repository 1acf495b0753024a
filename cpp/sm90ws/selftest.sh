#!/usr/bin/env bash
# Build (nvcc only, no CMake / Python package) and run the warp-specialized Hopper kernel's self-test,
# cpp/sm90ws/selftest.cu, on an sm_90 GPU.
#   bash cpp/sm90ws/selftest.sh [check|bench]  (check: correctness only; bench: timings only)
# Run from the repository root. BUILD_DIR (default /tmp/sm90ws_selftest) holds the objects;
# BUILD_ONLY=1 compiles and links without running (for machines without a GPU); HEAD_DIMS (default
# "64 96 128 192 256") the head dims to instantiate and test; VARLEN_HEAD_DIMS (default: 64 and 128
# where listed) those of the varlen instantiation; JOBS (default: all at once) how many
# objects compile together; NVCC_FLAGS extra flags (-DNDEBUG, -Xptxas=-v); TILES tile overrides for
# measurements, "d=kBlockM,kBlockN,kStages,pingpong ..." (e.g. TILES="64=128,128,2,1 256=128,80,2,1";
# sm90ws/tile_config.h, TileConfig). BENCH_SHAPES="B,H,N ..." sets the timed shapes (default 4,16,8192).
# The build steps every self-test shares: cpp/selftest_build.sh.
source "$(dirname "${BASH_SOURCE[0]}")/../selftest_build.sh"
arch=90a  # wgmma and TMA
selftest_setup /tmp/sm90ws_selftest
head_dims="${HEAD_DIMS:-64 96 128 192 256}"
varlen_head_dims=${VARLEN_HEAD_DIMS-$(for d in $head_dims; do case $d in 64|128) echo -n "$d ";; esac; done)}
# launch.cu's fp32 switches need one fp32 head dim. selftest.cu runs no fp32 call, and its fp32 refusal
# is at d = 128 on half-sized buffers, so 128 stays out of this list.
fp32_head_dims=64
selftest_config_h CUTLASSFA_SM90_ARCH_STRING=90a CUTLASSFA_HAS_SM90=1 CUTLASSFA_HAS_SM90WS=1
# What cpp/CMakeLists.txt writes for this family: sm90ws/head_dims.h and sm90ws/tile_overrides.h.
mkdir -p "$build/generated/sm90ws"
sed -e "s/@CUTLASSFA_SM90WS_HEAD_DIMS_CSV@/$(selftest_csv "$head_dims")/" \
    -e "s/@CUTLASSFA_SM90WS_VARLEN_HEAD_DIMS_CSV@/$(selftest_csv "$varlen_head_dims")/" \
    -e "s/@CUTLASSFA_SM90WS_FP32_HEAD_DIMS_CSV@/$(selftest_csv "$fp32_head_dims")/" cpp/sm90ws/head_dims.h.in \
    > "$build/generated/sm90ws/head_dims.h"
: > "$build/generated/sm90ws/tile_overrides.h"  # included by sm90ws/tile_config.h
for t in ${TILES:-}; do
  echo "#define CUTLASSFA_SM90WS_TILE_D${t%%=*} ${t#*=}" >> "$build/generated/sm90ws/tile_overrides.h"
done
sources=(cpp/sm90ws/launch.cu cpp/sm90ws/selftest.cu cpp/src/workspace.cpp cpp/src/backends.cpp cpp/src/split_fp32.cu)
selftest_instances sm90ws instantiate $head_dims
selftest_instances sm90ws instantiate_varlen $varlen_head_dims
selftest_instances sm90ws instantiate_fp32 $fp32_head_dims
family_flags="-DCUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED -lineinfo"
selftest_build_and_run "$@"
