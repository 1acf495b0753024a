// large_tile: CUDA-core FlashAttention-2 with larger tiles in opt-in shared memory (sm_80 and up;
// every configuration fits the 99 KB per block of sm_86 / sm_89).
#include "launch_flash_simt.h"

namespace cutlassfa {

static_assert(simt::LargeTile<32>::kSmemBytes <= 99 * 1024, "large_tile must fit 99 KB (sm_86)");
static_assert(simt::LargeTile<64>::kSmemBytes <= 99 * 1024, "large_tile must fit 99 KB (sm_86)");
static_assert(simt::LargeTile<128>::kSmemBytes <= 99 * 1024, "large_tile must fit 99 KB (sm_86)");

cudaError_t launch_large_tile(const FwdParams& params, cudaStream_t stream) {
  return simt::launch_flash_simt<simt::LargeTile>(params, stream);
}

}  // namespace cutlassfa
