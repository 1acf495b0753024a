#!/usr/bin/env bash
# Build (nvcc only, no CMake / Python package) and run the warp-specialized Hopper kernel's self-test,
# cpp/sm90ws/selftest.cu, on an sm_90 GPU.
#   bash cpp/sm90ws/selftest.sh [check|bench]      (check: correctness only; bench: timings only)
#   bash cpp/sm90ws/selftest.sh fp8 [check|bench]  fp8 attention, cpp/sm90ws/selftest_fp8.cu, at FP8_HEAD_DIMS
#                                                  (default "64 128 256"); BUILD_DIR default /tmp/sm90ws_fp8
#   bash cpp/sm90ws/selftest.sh layout             fp8 P V's key order against CuTe's layouts, on the CPU
#                                                  (cpp/sm90ws/fp8_layout_check.cu; prints PASS)
# Run from the repository root. BUILD_DIR (default /tmp/sm90ws_selftest) holds the objects;
# BUILD_ONLY=1 compiles and links without running (for machines without a GPU); HEAD_DIMS (default
# "64 96 128 192 256") the head dims to instantiate and test; VARLEN_HEAD_DIMS (default: 64 and 128
# where listed) those of the varlen instantiation; ALIBI_HEAD_DIMS and SOFTCAP_HEAD_DIMS (default none)
# those of the ALiBi and softcap ones; JOBS (default: all at once) how many
# objects compile together; NVCC_FLAGS extra flags (-DNDEBUG, -Xptxas=-v); TILES tile overrides for
# measurements, "d=kBlockM,kBlockN,kStages,pingpong ..." (e.g. TILES="64=128,128,2,1 256=128,80,2,1";
# sm90ws/tile_config.h, TileConfig; "FP8_D128=128,128,2,1" for the fp8 rows). BENCH_SHAPES="B,H,N ..." sets the timed shapes (default 4,16,8192).
# The build steps every self-test shares: cpp/selftest_build.sh.
source "$(dirname "${BASH_SOURCE[0]}")/../selftest_build.sh"
arch=90a  # wgmma and TMA
mode=${1:-}
if [ "$mode" = fp8 ] || [ "$mode" = layout ]; then shift; fi
selftest_setup "$([ "$mode" = fp8 ] && echo /tmp/sm90ws_fp8 || echo /tmp/sm90ws_selftest)"
if [ "$mode" = fp8 ]; then  # the fp8 instantiations alone
  head_dims="" varlen_head_dims="" fp32_head_dims="" alibi_head_dims="" softcap_head_dims=""
  fp8_head_dims="${FP8_HEAD_DIMS:-64 128 256}"
else
  head_dims="${HEAD_DIMS:-64 96 128 192 256}"
  varlen_head_dims=${VARLEN_HEAD_DIMS-$(for d in $head_dims; do case $d in 64|128) echo -n "$d ";; esac; done)}
  # launch.cu's fp32 switches need one fp32 head dim. selftest.cu runs no fp32 call, and its fp32 refusal
  # is at d = 128 on half-sized buffers, so 128 stays out of this list.
  fp32_head_dims=64
  fp8_head_dims=""
  alibi_head_dims="${ALIBI_HEAD_DIMS:-}" softcap_head_dims="${SOFTCAP_HEAD_DIMS:-}"  # the package's tests check them
fi
selftest_config_h CUTLASSFA_SM90_ARCH_STRING=90a CUTLASSFA_HAS_SM90=1 CUTLASSFA_HAS_SM90WS=1 \
  "CUTLASSFA_SM90WS_FP8_HEAD_DIMS_CSV=$(selftest_csv "$fp8_head_dims")"
# What cpp/CMakeLists.txt writes for this family: sm90ws/head_dims.h and sm90ws/tile_overrides.h.
mkdir -p "$build/generated/sm90ws"
sed -e "s/@CUTLASSFA_SM90WS_HEAD_DIMS_CSV@/$(selftest_csv "$head_dims")/" \
    -e "s/@CUTLASSFA_SM90WS_VARLEN_HEAD_DIMS_CSV@/$(selftest_csv "$varlen_head_dims")/" \
    -e "s/@CUTLASSFA_SM90WS_FP32_HEAD_DIMS_CSV@/$(selftest_csv "$fp32_head_dims")/" \
    -e "s/@CUTLASSFA_SM90WS_ALIBI_HEAD_DIMS_CSV@/$(selftest_csv "$alibi_head_dims")/" \
    -e "s/@CUTLASSFA_SM90WS_SOFTCAP_HEAD_DIMS_CSV@/$(selftest_csv "$softcap_head_dims")/" cpp/sm90ws/head_dims.h.in \
    > "$build/generated/sm90ws/head_dims.h"
: > "$build/generated/sm90ws/tile_overrides.h"  # included by sm90ws/tile_config.h
for t in ${TILES:-}; do
  name=${t%%=*}  # "128" (fp16 / bf16), or a row name of sm90ws/tile_config.h: "FP8_D128", "F32_D64"
  case $name in [0-9]*) name=D$name;; esac
  echo "#define CUTLASSFA_SM90WS_TILE_$name ${t#*=}" >> "$build/generated/sm90ws/tile_overrides.h"
done
family_flags="-DCUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED -lineinfo"
if [ "$mode" = layout ]; then  # host code only: no GPU, no sm_90a
  nvcc -O1 -std=c++17 --expt-relaxed-constexpr $family_flags -I"$inc" -Icpp/include -Icpp -I"$build/generated" \
    cpp/sm90ws/fp8_layout_check.cu -o "$build/fp8_layout_check" || exit 1
  exec "$build/fp8_layout_check"
fi
test_source=cpp/sm90ws/selftest.cu
[ "$mode" = fp8 ] && test_source=cpp/sm90ws/selftest_fp8.cu
sources=(cpp/sm90ws/launch.cu cpp/sm90ws/fp8_v_transpose.cu "$test_source" cpp/src/workspace.cpp cpp/src/backends.cpp
         cpp/src/split_fp32.cu)
selftest_instances sm90ws instantiate $head_dims
selftest_instances sm90ws instantiate_varlen $varlen_head_dims
selftest_instances sm90ws instantiate_alibi $alibi_head_dims
selftest_instances sm90ws instantiate_softcap $softcap_head_dims
selftest_instances sm90ws instantiate_fp32 $fp32_head_dims
selftest_instances sm90ws instantiate_fp8 $fp8_head_dims
selftest_build_and_run "$@"
