// small_tile: CUDA-core FlashAttention-2 within 48 KB of shared memory (sm_61 and up).
#include "launch_flash_simt.h"

namespace cutlassfa {
namespace {

template <typename T, int D>
struct SmallTileLaunch {
  static_assert(simt::SmallTile<D>::kSmemBytes <= 48 * 1024, "small_tile must fit 48 KB (sm_61)");
  static cudaError_t run(const FwdParams& params, cudaStream_t stream) {
    return simt::launch_flash_simt_kernel<simt::SmallTile<D>, T>(params, stream);
  }
};

}  // namespace

cudaError_t launch_small_tile(const FwdParams& params, cudaStream_t stream) {
  return simt::dispatch_flash_simt<SmallTileLaunch, CUTLASSFA_SMALL_TILE_HEAD_DIMS>(params, stream);
}

}  // namespace cutlassfa
