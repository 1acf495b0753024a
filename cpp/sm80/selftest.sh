#!/usr/bin/env bash
# Build (nvcc only, no CMake / Python package) and run the tensor-core self-test, cpp/sm80/selftest.cu.
#   bash cpp/sm80/selftest.sh [check]      (check: correctness only, no timings)
# Run from the repository root; ARCH (default 90a) picks the target.
set -uo pipefail
arch=${ARCH:-90a}
build=${BUILD_DIR:-/tmp/sm80_selftest}
mkdir -p "$build"
inc=$(python3 -c "import cutlass_library,os;print(os.path.dirname(cutlass_library.__file__)+'/source/include')" 2>/dev/null)
if [ -z "$inc" ]; then  # the lent GPU machine has no network: the CUTLASS wheel travels in .whl/
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
  inc=/tmp/site/cutlass_library/source/include
fi
# What CMake generates: the instantiation files of the head-dim list and cutlassfa/config.h (this build
# carries the mma.sync family only).
head_dims="32 64 128"
mkdir -p "$build/generated/cutlassfa"
sed -e 's/@CUTLASSFA_SMALL_TILE_HEAD_DIMS_CSV@/32, 64, 128/' -e 's/@CUTLASSFA_LARGE_TILE_HEAD_DIMS_CSV@/32, 64, 128/' \
    -e 's/@CUTLASSFA_SM80_HEAD_DIMS_CSV@/32, 64, 128/' -e 's/@CUTLASSFA_TENSORCORE_FP32_MAX_HEAD_DIM@/128/' \
    -e 's/@CUTLASSFA_SM90_HEAD_DIMS_CSV@/64, 128/' -e "s/@CUTLASSFA_ARCH_STRING@/$arch/" \
    -e "s/@CUTLASSFA_SM80_ARCH_STRING@/$arch/" -e 's/@CUTLASSFA_SM90_ARCH_STRING@//' -e 's/@CUTLASSFA_HAS_CUDA@/1/' \
    -e 's/@CUTLASSFA_HAS_SM80@/1/' -e 's/@CUTLASSFA_HAS_SM90@/0/' -e 's/@CUTLASSFA_HAS_SM90WS@/0/' cpp/include/cutlassfa/config.h.in \
    > "$build/generated/cutlassfa/config.h"
sources=(cpp/sm80/launch.cu cpp/sm80/selftest.cu)
for d in $head_dims; do
  sed "s/@HEAD_DIM@/$d/g" cpp/sm80/instantiate.cu.in > "$build/generated/sm80_hdim$d.cu"
  sources+=("$build/generated/sm80_hdim$d.cu")
done
flags="-O3 -std=c++17 --expt-relaxed-constexpr -gencode=arch=compute_$arch,code=sm_$arch -I$inc -Icpp/include -Icpp -I$build/generated"
start=$(date +%s)
pids=()
for f in "${sources[@]}"; do
  nvcc $flags -c "$f" -o "$build/$(basename "$f" .cu).o" &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || { echo "compile failed"; exit 1; }; done
nvcc -gencode=arch=compute_$arch,code=sm_$arch "$build"/*.o -o "$build/selftest" || exit 1
echo "built in $(( $(date +%s) - start )) s"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader 2>/dev/null
"$build/selftest" "$@"
