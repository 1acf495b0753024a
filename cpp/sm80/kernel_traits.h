// Compile-time configuration of the SM80 tensor-core forward kernel: one traits struct per
// (head dim, tile, dtype) holds every choice the kernel makes (MMA atom, ldmatrix atoms, fp32 staging,
// shared-memory size) on top of the shared copy side (common/tile_copy.h). The kernel itself only
// reads these names.
#pragma once

#include <cute/tensor.hpp>

#include <cutlass/numeric_types.h>

#include "common/tile_copy.h"
#include "sm80/tile_config.h"  // the tile shapes (read by the planner too)

namespace cutlassfa::sm80 {

using namespace cute;

// Element    : the MMA input type, cutlass::half_t or cutlass::bfloat16_t.
// ElementOut : the type O is written in: Element, or float for fp32 inputs.
// ElementIn  : the type q, k, v are read in: Element, or float (then Element = half_t and S is
//              computed in split precision, kSplitQK).
template <int kHeadDim_, int kBlockM_, int kBlockN_, int kNWarps_, class Element_, class ElementOut_,
          class ElementIn_ = Element_>
struct FwdTraits : TileCopyTraits<kHeadDim_, kBlockM_, kBlockN_, kNWarps_ * 32, Element_, ElementOut_> {
  using Copy = TileCopyTraits<kHeadDim_, kBlockM_, kBlockN_, kNWarps_ * 32, Element_, ElementOut_>;
  using Element = Element_;
  using ElementOut = ElementOut_;
  using ElementIn = ElementIn_;
  using ElementAccum = float;

  // fp32 inputs: x = hi + lo, hi = fp16(x), lo = fp16(x - hi) (|lo| <= 2^-11 |x|), and
  // S = Qhi Khi^T + Qhi Klo^T + Qlo Khi^T in fp32 (lo lo^T, ~2^-22 relative, dropped): three fp16
  // GEMMs instead of one. Rounding q and k once to fp16 gave max abs errors up to 6.3e-3 on the HW4
  // shapes (score error ~2^-11 |q||k| sqrt(d)); V and P stay single fp16 (their rounding is
  // averaged by the P V sum: < 1e-3 there).
  static constexpr bool kSplitQK = cute::is_same_v<ElementIn, float>;
  static_assert(cute::is_same_v<ElementIn, Element> || (kSplitQK && cute::is_same_v<Element, cutlass::half_t> &&
                                                         cute::is_same_v<ElementOut, float>),
                "inputs are the MMA type, or fp32 (fp16 split MMAs, fp32 output)");

  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kNWarps = kNWarps_;
  static constexpr int kNThreads = kNWarps * 32;

  static_assert(cute::is_same_v<Element, cutlass::half_t> || cute::is_same_v<Element, cutlass::bfloat16_t>,
                "tensor-core inputs are fp16 or bf16");
  static_assert(cute::is_same_v<ElementOut, Element> || cute::is_same_v<ElementOut, float>,
                "O is written in the input type or in fp32");
  static_assert(kBlockM % (16 * kNWarps) == 0, "each warp owns whole 16-row MMA slabs of the Q tile");
  static_assert(kBlockN % 16 == 0, "kBlockN is a multiple of the MMA's N tile (16) and K step (16)");

  // ---- MMA -------------------------------------------------------------------------------------
  // Warps are stacked along M: warp w owns rows [16w, 16w+16) of every 16*kNWarps-row slab, so the
  // softmax of a row never leaves its warp (quad shuffles only). The N permutation of 16 makes each
  // warp take two 16x8 atoms side by side, so one ldmatrix.x4 feeds the B operand of both.
  using MmaAtom = std::conditional_t<cute::is_same_v<Element, cutlass::half_t>,
                                     MMA_Atom<SM80_16x8x16_F32F16F16F32_TN>,
                                     MMA_Atom<SM80_16x8x16_F32BF16BF16F32_TN>>;
  using TiledMma = TiledMMA<MmaAtom, Layout<Shape<Int<kNWarps>, _1, _1>>, Tile<Int<16 * kNWarps>, _16, _16>>;

  // V seen as V^T (kHeadDim, kBlockN) so that O = P V is a TN GEMM like S = Q K^T; the transpose is
  // done by ldmatrix.trans on the way to registers, not in memory.
  using SmemLayoutVt = decltype(composition(
      typename Copy::SmemLayoutKV{}, make_layout(Shape<Int<kHeadDim>, Int<kBlockN>>{}, GenRowMajor{})));
  using SmemLayoutVtNoSwizzle = decltype(get_nonswizzle_portion(SmemLayoutVt{}));

  static constexpr int kSmemSizeQ = kBlockM * kHeadDim * sizeof(Element);
  static constexpr int kSmemSizeKV = kBlockN * kHeadDim * sizeof(Element);  // one of K or V
  static constexpr int kSmemSizeO = kBlockM * kHeadDim * sizeof(ElementOut);
  // kSplitQK: Q hi, Q lo, K hi, K lo, V, then the fp32 staging tile of K or V. O (fp32) aliases Q hi/lo.
  static constexpr int kSmemSizeStage = kSplitQK ? kBlockN * kHeadDim * sizeof(ElementIn) : 0;
  static constexpr int kSmemSize = kSplitQK ? cute::max(2 * kSmemSizeQ + 3 * kSmemSizeKV + kSmemSizeStage, kSmemSizeO)
                                            : cute::max(kSmemSizeQ + 2 * kSmemSizeKV, kSmemSizeO);

  // ---- Copies --------------------------------------------------------------------------------------
  // Registers <- shared: ldmatrix. Q and K are K-major (row = M or N index), V^T needs .trans.
  using SmemCopyAtom = Copy_Atom<SM75_U32x4_LDSM_N, Element>;
  using SmemCopyAtomTransposed = Copy_Atom<SM75_U16x8_LDSM_T, Element>;

  // ---- fp32 inputs (kSplitQK) ------------------------------------------------------------------------
  // K and V: cp.async of 4 floats per thread into a row-major fp32 staging tile; after its own
  // cp.async wait each thread converts exactly the elements it copied (same partition) into the fp16
  // tiles, so the conversion needs no barrier of its own. A warp covers whole contiguous rows
  // (d / 4 threads per row): conflict-free 16-byte smem accesses without a swizzle.
  // Q: the same partition, loaded to registers (LDG.128) once in the prologue.
  // (Defined for every traits type; only kSplitQK ones use it. 8 otherwise keeps it well-formed
  // for head dims wider than 128, which the SM90 kernel's pre-split fp32 Q and K have.)
  // d = 96 (24 chunks a row) does not tile 128 threads: 8 threads a row, 3 chunks each (bank conflicts
  // on the staging tile, accepted for that one size).
  static constexpr int kGmemThreadsPerRowIn =
      kSplitQK && kNThreads % (kHeadDim / 4) == 0 && kHeadDim / 4 <= 32 ? kHeadDim / 4 : 8;
  static_assert(kNThreads % kGmemThreadsPerRowIn == 0 && kGmemThreadsPerRowIn <= 32);
  using GmemLayoutAtomIn = Layout<Shape<Int<kNThreads / kGmemThreadsPerRowIn>, Int<kGmemThreadsPerRowIn>>,
                                  Stride<Int<kGmemThreadsPerRowIn>, _1>>;
  using GmemTiledCopyKVIn = decltype(make_tiled_copy(
      Copy_Atom<SM80_CP_ASYNC_CACHEGLOBAL<cute::uint128_t>, float>{}, GmemLayoutAtomIn{}, Layout<Shape<_1, _4>>{}));
  using GmemTiledCopyQIn = decltype(make_tiled_copy(
      Copy_Atom<UniversalCopy<cute::uint128_t>, float>{}, GmemLayoutAtomIn{}, Layout<Shape<_1, _4>>{}));
  // The fp16 side uses the same partition: 4 halves (8 bytes) per thread, inside one 16-byte swizzle
  // chunk of sQ / sK / sV (store_split_fp16).
  using SmemLayoutStage = Layout<Shape<Int<kBlockN>, Int<kHeadDim>>, Stride<Int<kHeadDim>, _1>>;
  static_assert(!kSplitQK || kBlockM % (kNThreads / kGmemThreadsPerRowIn) == 0);
  static_assert(!kSplitQK || kBlockN % (kNThreads / kGmemThreadsPerRowIn) == 0);
};

template <int kHeadDim, class Element, class ElementOut>
using DefaultFwdTraits = FwdTraits<kHeadDim, TileConfig<kHeadDim>::kBlockM, TileConfig<kHeadDim>::kBlockN,
                                   TileConfig<kHeadDim>::kNWarps, Element, ElementOut>;

// fp32 q, k, v -> split-fp16 MMAs -> fp32 O.
template <int kHeadDim>
using Fp32FwdTraits = FwdTraits<kHeadDim, TileConfigFp32<kHeadDim>::kBlockM, TileConfigFp32<kHeadDim>::kBlockN,
                                TileConfigFp32<kHeadDim>::kNWarps, cutlass::half_t, float, float>;

}  // namespace cutlassfa::sm80
