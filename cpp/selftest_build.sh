# The build of the standalone self-tests (nvcc only, no CMake / Python package), sourced by
# cpp/sm80/selftest.sh and cpp/sm90ws/selftest.sh; each states only what is its own. From the repository
# root, a family's script sets `arch` and calls, in order:
#   selftest_setup <default build dir>          the build dir (BUILD_DIR overrides), CUTLASS's include dir
#   selftest_config_h [NAME=VALUE ...]          cutlassfa/config.h: these placeholders over the defaults
#   selftest_instances <family> <stem> <d ...>  <family>/<stem>.cu.in per head dim, added to `sources`
#   selftest_build_and_run [selftest args]      compile `sources` (plus `family_flags`), link, run
# It may write other generated headers under "$build/generated" in between.
# Environment for every family: BUILD_DIR; BUILD_ONLY=1 compiles and links without running (machines
# without a GPU); JOBS (default: all at once) how many objects compile together; NVCC_FLAGS extra flags
# (-DNDEBUG, -Xptxas=-v).
set -uo pipefail

sources=()
family_flags=""

selftest_setup() {
  build=${BUILD_DIR:-$1}
  mkdir -p "$build/generated/cutlassfa"
  rm -f "$build"/*.o  # the link takes every object: none left from another head-dim list
  inc=$(python3 -c "import cutlass_library,os;print(os.path.dirname(cutlass_library.__file__)+'/source/include')" \
        2>/dev/null)
  if [ -z "$inc" ]; then  # the lent GPU machine has no network: the CUTLASS wheel travels in .whl/
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
    inc=/tmp/site/cutlass_library/source/include
  fi
}

# "64 96 128" -> "64, 96, 128", the lists of config.h.in.
selftest_csv() { echo $1 | sed 's/ /, /g'; }

# What CMake writes into cutlassfa/config.h (read by common/static_switch.h and src/backends.cpp): the
# defaults are the mma.sync family alone on `arch`; a family names what differs.
selftest_config_h() {
  local -A value=(
    [CUTLASSFA_SMALL_TILE_HEAD_DIMS_CSV]="32, 64, 128" [CUTLASSFA_LARGE_TILE_HEAD_DIMS_CSV]="32, 64, 128"
    [CUTLASSFA_SM80_HEAD_DIMS_CSV]="32, 64, 128" [CUTLASSFA_SM90_HEAD_DIMS_CSV]="64, 128"
    [CUTLASSFA_SM90_DECODE_HEAD_DIMS_CSV]="64, 128" [CUTLASSFA_TENSORCORE_FP32_MAX_HEAD_DIM]=128
    [CUTLASSFA_SM90WS_FP8_HEAD_DIMS_CSV]=""
    [CUTLASSFA_ARCH_STRING]=$arch [CUTLASSFA_SM80_ARCH_STRING]=$arch [CUTLASSFA_SM90_ARCH_STRING]=""
    [CUTLASSFA_HAS_CUDA]=1 [CUTLASSFA_HAS_SM80]=1 [CUTLASSFA_HAS_SM90]=0 [CUTLASSFA_HAS_SM90DECODE]=0
    [CUTLASSFA_HAS_SM90WS]=0
  )
  local setting name edits=()
  for setting in "$@"; do value[${setting%%=*}]=${setting#*=}; done
  for name in "${!value[@]}"; do edits+=(-e "s|@$name@|${value[$name]}|"); done
  local out="$build/generated/cutlassfa/config.h"
  sed "${edits[@]}" cpp/include/cutlassfa/config.h.in > "$out"
  # A placeholder left: config.h.in has a setting this script does not know yet.
  if grep -q '@[A-Z0-9_]*@' "$out"; then
    echo "no value for $(grep -o '@[A-Z0-9_]*@' "$out" | tr '\n' ' ')(cpp/selftest_build.sh)"
    exit 1
  fi
}

# The instantiation files of a head-dim list, named as cpp/CMakeLists.txt names them
# (sm90ws/instantiate_varlen.cu.in -> sm90ws_varlen_hdim128.cu).
selftest_instances() {
  local family=$1 stem=$2 d
  shift 2
  local name=${stem/instantiate/$family}
  for d in "$@"; do
    sed "s/@HEAD_DIM@/$d/g" "cpp/$family/$stem.cu.in" > "$build/generated/${name}_hdim$d.cu"
    sources+=("$build/generated/${name}_hdim$d.cu")
  done
}

selftest_build_and_run() {
  local gencode="-gencode=arch=compute_$arch,code=sm_$arch"
  local flags="-O3 -std=c++17 --expt-relaxed-constexpr $family_flags $gencode -I$inc -Icpp/include -Icpp"
  flags+=" -I$build/generated ${NVCC_FLAGS:-}"
  local start f p pids=()
  start=$(date +%s)
  for f in "${sources[@]}"; do
    nvcc $flags -c "$f" -o "$build/$(basename "$f" .cu).o" &
    pids+=($!)
    if [ "${#pids[@]}" -ge "${JOBS:-${#sources[@]}}" ]; then
      wait "${pids[0]}" || { echo "compile failed"; exit 1; }
      pids=("${pids[@]:1}")
    fi
  done
  for p in "${pids[@]}"; do wait "$p" || { echo "compile failed"; exit 1; }; done
  nvcc $gencode "$build"/*.o -o "$build/selftest" || exit 1
  echo "built in $(( $(date +%s) - start )) s"
  [ "${BUILD_ONLY:-0}" = 1 ] && exit 0
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader 2>/dev/null
  "$build/selftest" "$@"
}
