// The warp-level GEMMs of the SM80 (mma.sync) kernel with their ldmatrix software pipeline, the
// accumulator-to-A-operand view that keeps P in registers, and the fp32 -> fp16 hi/lo split.
#pragma once

#include <cute/tensor.hpp>

#include <cutlass/array.h>
#include <cutlass/numeric_conversion.h>

#include "common/tensor_utils.h"

namespace cutlassfa::sm80 {

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
// the tile (32 at kBlockN = 128), and registers are the scarce resource of this kernel.
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

// fp32 inputs: acc += Ahi Bhi^T + Alo Bhi^T + Ahi Blo^T (the split-fp16 S = Q K^T of
// FwdTraits::kSplitQK; lo lo^T dropped). Per K step both A halves, per ldmatrix chunk both B halves
// are loaded once and feed the three MMAs: 4 ldmatrix per (A, B) tile pair instead of the 6 of
// three gemm_ss calls. Fragments are loaded where they are used; ptxas schedules the ldmatrix early.
template <class TensorAcc, class TensorA, class TensorB, class TensorSA, class TensorSB, class TiledMma,
          class TiledCopyA, class TiledCopyB, class ThrCopyA, class ThrCopyB>
__forceinline__ __device__ void gemm_ss_split(TensorAcc& acc, TensorA& tCrA, TensorB& tCrB, TensorSA const& tCsAhi,
                                              TensorSA const& tCsAlo, TensorSB const& tCsBhi, TensorSB const& tCsBlo,
                                              TiledMma const& tiled_mma, TiledCopyA const& smem_tiled_copy_A,
                                              TiledCopyB const& smem_tiled_copy_B, ThrCopyA const& smem_thr_copy_A,
                                              ThrCopyB const& smem_thr_copy_B) {
  Tensor tCrAlo = make_fragment_like(tCrA);  // (MMA, MMA_M, MMA_K)
  Tensor tCrBlo = make_fragment_like(tCrB);  // (MMA, MMA_N, MMA_K)
  Tensor tCrA_view = smem_thr_copy_A.retile_D(tCrA);      // (CPY, CPY_M, CPY_K)
  Tensor tCrAlo_view = smem_thr_copy_A.retile_D(tCrAlo);  // (CPY, CPY_M, CPY_K)
  Tensor tCrB_view = smem_thr_copy_B.retile_D(tCrB);      // (CPY, CPY_N, CPY_K)
  Tensor tCrBlo_view = smem_thr_copy_B.retile_D(tCrBlo);  // (CPY, CPY_N, CPY_K)
  constexpr int kSteps = decltype(size<2>(tCrB))::value;
  constexpr int kChunks = decltype(size<1>(tCrB_view))::value;
  constexpr int kAtomsPerChunk = decltype(size<1>(tCrB))::value / kChunks;
  CUTE_UNROLL
  for (int k = 0; k < kSteps; ++k) {
    copy(smem_tiled_copy_A, tCsAhi(_, _, k), tCrA_view(_, _, k));
    copy(smem_tiled_copy_A, tCsAlo(_, _, k), tCrAlo_view(_, _, k));
    CUTE_UNROLL
    for (int c = 0; c < kChunks; ++c) {
      copy(smem_tiled_copy_B, tCsBhi(_, c, k), tCrB_view(_, c, k));
      copy(smem_tiled_copy_B, tCsBlo(_, c, k), tCrBlo_view(_, c, k));
      CUTE_UNROLL
      for (int n = c * kAtomsPerChunk; n < (c + 1) * kAtomsPerChunk; ++n) {
        CUTE_UNROLL
        for (int m = 0; m < size<1>(tCrA); ++m) {
          cute::gemm(tiled_mma, tCrA(_, m, k), tCrBlo(_, n, k), acc(_, m, n));
          cute::gemm(tiled_mma, tCrAlo(_, m, k), tCrB(_, n, k), acc(_, m, n));
          cute::gemm(tiled_mma, tCrA(_, m, k), tCrB(_, n, k), acc(_, m, n));
        }
      }
    }
  }
}

// fp32 -> fp16 split of a register fragment of 4-float vectors (CPY = 4, ...), stored to shared
// memory 8 bytes at a time: hi = fp16(x) into tXsHi and, kWithLo, lo = fp16(x - hi) into tXsLo
// (x - hi is exact in fp32; lo may be subnormal, which only costs bits below 2^-24).
template <bool kWithLo, class TensorF, class TensorHi, class TensorLo>
__forceinline__ __device__ void store_split_fp16(TensorF const& rX, TensorHi&& tXsHi, TensorLo&& tXsLo) {
  using Element = typename std::decay_t<TensorHi>::value_type;
  using SmemCopyAtom = Copy_Atom<UniversalCopy<cute::uint64_t>, Element>;
  // Paired conversions (F2FP, HADD2.F32): one instruction per two values. Scalar casts compiled to
  // F2F + PRMT per value.
  Tensor rHi = convert_type<Element>(rX);
  copy(SmemCopyAtom{}, rHi, tXsHi);
  if constexpr (kWithLo) {
    Tensor rHiF = convert_type<float>(rHi);
    CUTE_UNROLL
    for (int i = 0; i < size(rX); ++i) { rHiF(i) = rX(i) - rHiF(i); }
    Tensor rLo = convert_type<Element>(rHiF);
    copy(SmemCopyAtom{}, rLo, tXsLo);
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

}  // namespace cutlassfa::sm80
