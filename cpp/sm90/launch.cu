// launch_sm90: the wgmma tensor-core family's entry point (sm_90a only; the planner checked the device,
// cutlassfa/dispatch.h), what it covers and the tile of a call. fp16 / bf16 go straight to the kernels
// instantiated from the head-dim list (cpp/sm90/instantiate.cu.in); fp32 is split into fp16 hi/lo by a
// pre-pass first (launch_fp32.cu).
#include <cuda_runtime.h>

#include <algorithm>

#include <cutlass/numeric_types.h>

#include "common/alignment.h"
#include "common/static_switch.h"
#include "cutlassfa/launch.h"
#include "cutlassfa/params.h"
#include "sm90/launch_fwd.h"
#include "sm90/tile_config.h"

namespace cutlassfa {

bool sm90_covers(const FwdParams& p) {
  if (p.dtype == DType::kFloat8E4M3) { return false; }  // fp8 attention: the warp-specialized kernel's
  if (p.dtype != DType::kFloat32) { return p.head_dim <= std::max({CUTLASSFA_SM90_HEAD_DIMS}); }
  // The fp32 pre-pass lays out dense (batch, heads, seqlen) tensors of a compiled head dim; paged
  // caches, varlen batches and zero-padded head dims run on the mma.sync family, which splits fp32
  // inside its kernel.
  bool const dense_compiled =
      head_dim_listed<CUTLASSFA_SM90_HEAD_DIMS>(p.head_dim) && p.head_dim <= CUTLASSFA_TENSORCORE_FP32_MAX_HEAD_DIM;
  bool const indirect = p.block_table != nullptr || p.cu_seqlens_q != nullptr || p.cu_seqlens_k != nullptr;
  return dense_compiled && !indirect;
}

KernelTile sm90_tile(const FwdParams& params) {
  bool const fp32 = params.dtype == DType::kFloat32;
  return tile_switch<true, CUTLASSFA_SM90_HEAD_DIMS>(params.head_dim, [&](auto head_dim) {
    constexpr int kHeadDim = decltype(head_dim)::value;
    using Tile = sm90::TileConfig<kHeadDim>;  // DefaultFwdTraits
    if constexpr (kHeadDim <= CUTLASSFA_TENSORCORE_FP32_MAX_HEAD_DIM) {
      using Fp32 = sm90::TileConfigFp32<kHeadDim>;  // Fp32FwdTraits
      if (fp32) { return KernelTile{kHeadDim, Fp32::kBlockM, Fp32::kBlockN}; }
    }
    return KernelTile{kHeadDim, Tile::kBlockM, Tile::kBlockN};
  });
}

cudaError_t launch_sm90(const FwdParams& params, cudaStream_t stream) {
  if (!tensorcore_aligned(params)) { return cudaErrorInvalidValue; }
  if (!sm90_covers(params)) { return cudaErrorNotSupported; }
  if (params.batch == 0 || params.heads_q == 0 || params.seqlen_q == 0) { return cudaSuccess; }
  if (params.dtype == DType::kFloat32) { return sm90::launch_fp32(params, stream); }
  return fp16_switch(params.dtype, [&](auto element) {
    using Element = decltype(element);
    return padded_head_dim_switch<CUTLASSFA_SM90_HEAD_DIMS>(params.head_dim, [&](auto head_dim) {
      return sm90::run_fwd<decltype(head_dim)::value, Element>(params, stream);
    });
  });
}

}  // namespace cutlassfa
