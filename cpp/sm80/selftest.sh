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
flags="-O3 -std=c++17 --expt-relaxed-constexpr -gencode=arch=compute_$arch,code=sm_$arch -I$inc -Icpp/include -Icpp"
start=$(date +%s)
pids=()
for f in cpp/src/inst/sm80_hdim32.cu cpp/src/inst/sm80_hdim64.cu cpp/src/inst/sm80_hdim128.cu \
         cpp/sm80/launch_tensorcore.cu cpp/sm80/selftest.cu; do
  nvcc $flags -c "$f" -o "$build/$(basename "$f" .cu).o" &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || { echo "compile failed"; exit 1; }; done
nvcc -gencode=arch=compute_$arch,code=sm_$arch "$build"/*.o -o "$build/selftest" || exit 1
echo "built in $(( $(date +%s) - start )) s"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader 2>/dev/null
"$build/selftest" "$@"
