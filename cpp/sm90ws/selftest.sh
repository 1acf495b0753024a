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
set -uo pipefail
build=${BUILD_DIR:-/tmp/sm90ws_selftest}
mkdir -p "$build"
rm -f "$build"/*.o  # the link takes every object: none left from another head-dim list
inc=$(python3 -c "import cutlass_library,os;print(os.path.dirname(cutlass_library.__file__)+'/source/include')" 2>/dev/null)
if [ -z "$inc" ]; then  # the lent GPU machine has no network: the CUTLASS wheel travels in .whl/
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
  inc=/tmp/site/cutlass_library/source/include
fi
# What CMake generates: cutlassfa/config.h (read by common/static_switch.h), sm90ws/head_dims.h and the
# instantiation files of the head-dim list.
head_dims="${HEAD_DIMS:-64 96 128 192 256}"
mkdir -p "$build/generated/cutlassfa" "$build/generated/sm90ws"
sed -e 's/@CUTLASSFA_SMALL_TILE_HEAD_DIMS_CSV@/32, 64, 128/' -e 's/@CUTLASSFA_LARGE_TILE_HEAD_DIMS_CSV@/32, 64, 128/' \
    -e 's/@CUTLASSFA_SM80_HEAD_DIMS_CSV@/32, 64, 128/' -e 's/@CUTLASSFA_TENSORCORE_FP32_MAX_HEAD_DIM@/128/' \
    -e 's/@CUTLASSFA_SM90_HEAD_DIMS_CSV@/64, 128/' -e 's/@CUTLASSFA_ARCH_STRING@/90a/' \
    -e 's/@CUTLASSFA_SM80_ARCH_STRING@/90a/' -e 's/@CUTLASSFA_SM90_ARCH_STRING@/90a/' -e 's/@CUTLASSFA_HAS_CUDA@/1/' \
    -e 's/@CUTLASSFA_HAS_SM80@/1/' -e 's/@CUTLASSFA_HAS_SM90@/1/' -e 's/@CUTLASSFA_HAS_SM90WS@/1/' cpp/include/cutlassfa/config.h.in \
    > "$build/generated/cutlassfa/config.h"
varlen_head_dims=${VARLEN_HEAD_DIMS-$(for d in $head_dims; do case $d in 64|128) echo -n "$d ";; esac; done)}
csv() { echo $1 | sed 's/ /, /g'; }
sed -e "s/@CUTLASSFA_SM90WS_HEAD_DIMS_CSV@/$(csv "$head_dims")/" \
    -e "s/@CUTLASSFA_SM90WS_VARLEN_HEAD_DIMS_CSV@/$(csv "$varlen_head_dims")/" \
    -e "s/@CUTLASSFA_SM90WS_FP32_HEAD_DIMS_CSV@//" cpp/sm90ws/head_dims.h.in \
    > "$build/generated/sm90ws/head_dims.h"
: > "$build/generated/sm90ws/tile_overrides.h"  # included by sm90ws/tile_config.h
for t in ${TILES:-}; do
  echo "#define CUTLASSFA_SM90WS_TILE_D${t%%=*} ${t#*=}" >> "$build/generated/sm90ws/tile_overrides.h"
done
sources=(cpp/sm90ws/launch.cu cpp/sm90ws/selftest.cu cpp/src/workspace.cpp cpp/src/backends.cpp cpp/src/split_fp32.cu)
for d in $head_dims; do
  sed "s/@HEAD_DIM@/$d/g" cpp/sm90ws/instantiate.cu.in > "$build/generated/sm90ws_hdim$d.cu"
  sources+=("$build/generated/sm90ws_hdim$d.cu")
done
for d in $varlen_head_dims; do
  sed "s/@HEAD_DIM@/$d/g" cpp/sm90ws/instantiate_varlen.cu.in > "$build/generated/sm90ws_varlen_hdim$d.cu"
  sources+=("$build/generated/sm90ws_varlen_hdim$d.cu")
done
flags="-O3 -std=c++17 --expt-relaxed-constexpr -DCUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED -lineinfo -gencode=arch=compute_90a,code=sm_90a -I$inc -Icpp/include -Icpp -I$build/generated ${NVCC_FLAGS:-}"
start=$(date +%s)
pids=()
for f in "${sources[@]}"; do
  nvcc $flags -c "$f" -o "$build/$(basename "$f" .cu).o" &
  pids+=($!)
  if [ "${#pids[@]}" -ge "${JOBS:-${#sources[@]}}" ]; then
    wait "${pids[0]}" || { echo "compile failed"; exit 1; }
    pids=("${pids[@]:1}")
  fi
done
for p in "${pids[@]}"; do wait "$p" || { echo "compile failed"; exit 1; }; done
nvcc -gencode=arch=compute_90a,code=sm_90a "$build"/*.o -o "$build/selftest" || exit 1
echo "built in $(( $(date +%s) - start )) s"
[ "${BUILD_ONLY:-0}" = 1 ] && exit 0
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader 2>/dev/null
"$build/selftest" "$@"
