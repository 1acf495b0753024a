// large_tile: CUDA-core FlashAttention-2 with larger tiles in opt-in shared memory (sm_80 and up).
// Where the device's opt-in limit per block is below the tile's (99 KB on sm_86 / sm_89 against
// 162 KB for D=64), the compact variant runs instead.
#include "launch_flash_simt.h"

namespace cutlassfa {
namespace {

template <typename T, int D>
struct LargeTileLaunch {
  static_assert(simt::LargeTileCompact<D>::kSmemBytes <= 99 * 1024, "must fit 99 KB (sm_86)");
  static_assert(simt::LargeTile<D>::kSmemBytes <= 163 * 1024, "must fit 163 KB (sm_80)");
  static cudaError_t run(const FwdParams& params, cudaStream_t stream) {
    using Primary = simt::LargeTile<D>;
    using Compact = simt::LargeTileCompact<D>;
    if constexpr (Primary::kSmemBytes != Compact::kSmemBytes) {
      int device = 0, optin = 0;
      cudaError_t err = cudaGetDevice(&device);
      if (err == cudaSuccess) err = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
      if (err != cudaSuccess) return err;
      if (optin < Primary::kSmemBytes) return simt::launch_flash_simt_kernel<Compact, T>(params, stream);
    }
    return simt::launch_flash_simt_kernel<Primary, T>(params, stream);
  }
};

}  // namespace

cudaError_t launch_large_tile(const FwdParams& params, cudaStream_t stream) {
  return simt::dispatch_flash_simt<LargeTileLaunch, CUTLASSFA_LARGE_TILE_HEAD_DIMS>(params, stream);
}

}  // namespace cutlassfa
