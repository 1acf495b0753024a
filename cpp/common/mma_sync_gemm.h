// The warp-level mma.sync GEMMs with their ldmatrix software pipeline (gemm_ss: S = Q K^T, gemm_rs:
// O += P V), and the accumulator-to-A-operand view that keeps P in registers between the two. Shared by
// the two mma.sync families: sm80/ (the tile kernels, through sm80/gemm.h) and sm90decode/.
#pragma once

#include <cute/tensor.hpp>

namespace cutlassfa {

using namespace cute;

// The accumulator of S = Q K^T reused as the A operand of O = P V without leaving registers: two
// neighbouring 16x8 C atoms (columns n, n+8) are exactly the k and k+8 halves of one 16x16 A atom,
// so ((2, 2), MMA_M, MMA_N) becomes ((2, 2, 2), MMA_M, MMA_N / 2).
template <class Layout>
__forceinline__ __device__ auto acc_layout_to_a_operand(Layout acc_layout) {
  static_assert(decltype(size<0>(acc_layout))::value == 4);
  static_assert(decltype(size<2>(acc_layout))::value % 2 == 0, "pairs of 16x8 atoms make one K=16 step");
  auto l = logical_divide(acc_layout, Shape<Underscore, Underscore, _2>{});  // ((2, 2), MMA_M, (2, MMA_N / 2))
  return make_layout(make_layout(get<0>(l), get<2, 0>(l)), get<1>(l), get<2, 1>(l));
}

// acc += A B^T over one tile, A (MMA, MMA_M, MMA_K) and B (MMA, MMA_N, MMA_K) fed by ldmatrix.
// B is loaded one ldmatrix (two 16x8 MMA atoms along N) ahead of the MMAs that use it, and A one
// K step ahead, rather than a whole K slice of B ahead: a slice of B is 2 registers per 8 columns of
// the tile (32 at kBlockN = 128), and registers are the scarce resource of these kernels.
// kASmem = false: A is already in registers (P of O = P V) and tCsA is ignored.
template <bool kASmem, class TensorAcc, class TensorA, class TensorB, class TensorSA, class TensorSB,
          class TiledMma, class TiledCopyA, class TiledCopyB, class ThrCopyA, class ThrCopyB>
__forceinline__ __device__ void gemm_pipelined(TensorAcc& acc, TensorA& tCrA, TensorB& tCrB, TensorSA const& tCsA,
                                               TensorSB const& tCsB, TiledMma const& tiled_mma,
                                               TiledCopyA const& smem_tiled_copy_A, TiledCopyB const& smem_tiled_copy_B,
                                               ThrCopyA const& smem_thr_copy_A, ThrCopyB const& smem_thr_copy_B) {
  Tensor tCrB_view = smem_thr_copy_B.retile_D(tCrB);  // (CPY, CPY_N, CPY_K)
  constexpr int kSteps = decltype(size<2>(tCrB))::value;
  constexpr int kChunks = decltype(size<1>(tCrB_view))::value;  // ldmatrix per K step of B
  constexpr int kAtomsPerChunk = decltype(size<1>(tCrB))::value / kChunks;
  static_assert(kChunks * kAtomsPerChunk == decltype(size<1>(tCrB))::value);
  CUTE_STATIC_ASSERT_V(size<1>(tCsB) == size<1>(tCrB_view));
  CUTE_STATIC_ASSERT_V(size<2>(tCrA) == size<2>(tCrB));
  auto load_a = [&](int k) {
    if constexpr (kASmem) {
      Tensor tCrA_view = smem_thr_copy_A.retile_D(tCrA);  // (CPY, CPY_M, CPY_K)
      copy(smem_tiled_copy_A, tCsA(_, _, k), tCrA_view(_, _, k));
    }
  };
  load_a(0);
  copy(smem_tiled_copy_B, tCsB(_, 0, 0), tCrB_view(_, 0, 0));
  CUTE_UNROLL
  for (int k = 0; k < kSteps; ++k) {
    CUTE_UNROLL
    for (int c = 0; c < kChunks; ++c) {
      if (c + 1 < kChunks) {
        copy(smem_tiled_copy_B, tCsB(_, c + 1, k), tCrB_view(_, c + 1, k));
      } else if (k + 1 < kSteps) {
        load_a(k + 1);
        copy(smem_tiled_copy_B, tCsB(_, 0, k + 1), tCrB_view(_, 0, k + 1));
      }
      CUTE_UNROLL
      for (int n = c * kAtomsPerChunk; n < (c + 1) * kAtomsPerChunk; ++n) {
        CUTE_UNROLL
        for (int m = 0; m < size<1>(tCrA); ++m) { cute::gemm(tiled_mma, tCrA(_, m, k), tCrB(_, n, k), acc(_, m, n)); }
      }
    }
  }
}

// acc += A B^T with both operands in shared memory (S = Q K^T).
template <class TensorAcc, class TensorA, class TensorB, class TensorSA, class TensorSB, class TiledMma,
          class TiledCopyA, class TiledCopyB, class ThrCopyA, class ThrCopyB>
__forceinline__ __device__ void gemm_ss(TensorAcc& acc, TensorA& tCrA, TensorB& tCrB, TensorSA const& tCsA,
                                        TensorSB const& tCsB, TiledMma const& tiled_mma,
                                        TiledCopyA const& smem_tiled_copy_A, TiledCopyB const& smem_tiled_copy_B,
                                        ThrCopyA const& smem_thr_copy_A, ThrCopyB const& smem_thr_copy_B) {
  gemm_pipelined<true>(acc, tCrA, tCrB, tCsA, tCsB, tiled_mma, smem_tiled_copy_A, smem_tiled_copy_B, smem_thr_copy_A,
                       smem_thr_copy_B);
}

// acc += A B^T with A already in registers (P) and B in shared memory (V^T): O += P V.
template <class TensorAcc, class TensorA, class TensorB, class TensorSB, class TiledMma, class TiledCopyB,
          class ThrCopyB>
__forceinline__ __device__ void gemm_rs(TensorAcc& acc, TensorA& tCrA, TensorB& tCrB, TensorSB const& tCsB,
                                        TiledMma const& tiled_mma, TiledCopyB const& smem_tiled_copy_B,
                                        ThrCopyB const& smem_thr_copy_B) {
  gemm_pipelined<false>(acc, tCrA, tCrB, tCsB, tCsB, tiled_mma, smem_tiled_copy_B, smem_tiled_copy_B, smem_thr_copy_B,
                        smem_thr_copy_B);
}

}  // namespace cutlassfa
