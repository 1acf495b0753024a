// The fp32 inputs of the SM80 (mma.sync) kernel: the split-fp16 S GEMM and the fp32 -> fp16 hi/lo split
// into shared memory. The GEMMs it shares with sm90decode/ (gemm_ss, gemm_rs, the P operand view) are
// common/mma_sync_gemm.h, included here so that the kernel reaches both through this header.
#pragma once

#include <cute/tensor.hpp>

#include <cutlass/array.h>
#include <cutlass/numeric_conversion.h>

#include "common/mma_sync_gemm.h"
#include "common/tensor_utils.h"

namespace cutlassfa::sm80 {

using namespace cute;

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

}  // namespace cutlassfa::sm80
