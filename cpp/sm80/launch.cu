// launch_sm80: the mma.sync tensor-core family's entry point. The dtype / head-dim switch onto the
// kernels instantiated from the head-dim list (cpp/sm80/instantiate.cu.in), the fp32 path, and the tile
// of a call for the planner (sm80_tile).
//
// fp32 inputs are read by the kernel itself (run_fwd_fp32): it splits q and k into fp16 hi + lo on
// the way to shared memory and computes S = QK^T with three fp16 MMAs (hi hi, hi lo, lo hi), V and P
// in one fp16 rounding, O in fp32. fp16 holds finite values up to 65504, so |x| <= 1e4 never
// overflows. Rounding q and k once to fp16 (an earlier pre-pass) gave max abs errors of 6.3e-3 on the
// HW4 shapes, over the 5e-3 rule. TF32 atoms keep the same 10 mantissa bits at half the rate.
#include <cuda_runtime.h>

#include <cutlass/numeric_types.h>

#include "common/alignment.h"
#include "common/static_switch.h"
#include "cutlassfa/launch.h"
#include "cutlassfa/params.h"
#include "sm80/launch_fwd.h"
#include "sm80/tile_config.h"

namespace cutlassfa {

KernelTile sm80_tile(const FwdParams& params) {
  bool const fp32 = params.dtype == DType::kFloat32;
  return tile_switch<true, CUTLASSFA_SM80_HEAD_DIMS>(params.head_dim, [&](auto head_dim) {
    constexpr int kHeadDim = decltype(head_dim)::value;
    using Tile = sm80::TileConfig<kHeadDim>;       // DefaultFwdTraits
    using Fp32 = sm80::TileConfigFp32<kHeadDim>;  // Fp32FwdTraits
    return fp32 ? KernelTile{kHeadDim, Fp32::kBlockM, Fp32::kBlockN}
                : KernelTile{kHeadDim, Tile::kBlockM, Tile::kBlockN};
  });
}

cudaError_t launch_sm80(const FwdParams& params, cudaStream_t stream) {
  if (!tensorcore_aligned(params)) { return cudaErrorInvalidValue; }
  if (params.batch == 0 || params.heads_q == 0 || params.seqlen_q == 0) { return cudaSuccess; }
  if (params.dtype == DType::kFloat32) {
    return padded_head_dim_switch<CUTLASSFA_SM80_HEAD_DIMS>(params.head_dim, [&](auto head_dim) {
      constexpr int kHeadDim = decltype(head_dim)::value;
      if constexpr (kHeadDim <= CUTLASSFA_TENSORCORE_FP32_MAX_HEAD_DIM) {
        return sm80::run_fwd_fp32<kHeadDim>(params, stream);
      } else {
        return cudaErrorInvalidValue;
      }
    });
  }
  return fp16_switch(params.dtype, [&](auto element) {
    using Element = decltype(element);
    return padded_head_dim_switch<CUTLASSFA_SM80_HEAD_DIMS>(params.head_dim, [&](auto head_dim) {
      return sm80::run_fwd<decltype(head_dim)::value, Element, Element>(params, stream);
    });
  });
}

}  // namespace cutlassfa
