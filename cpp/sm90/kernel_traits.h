// Compile-time configuration of the SM90 (Hopper, sm_90a) tensor-core forward kernel: warpgroup MMA
// (wgmma) for both GEMMs. The copy side (cp.async tiles, swizzled shared layouts, O epilogue) is the
// shared common/tile_copy.h; this struct adds the two wgmma TiledMMAs and the GMMA views of the same
// shared memory.
#pragma once

#include <cute/tensor.hpp>
#include <cute/arch/mma_sm90.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>

#include "common/tile_copy.h"
#include "sm90/tile_config.h"  // the tile shapes (read by the planner too)

namespace cutlassfa::sm90 {

using namespace cute;

// kHeadDimQK : columns of Q and K (the K dimension of S = Q K^T).
// kHeadDim   : columns of V and O. Equal for fp16/bf16 inputs; fp32 inputs run with Q and K
//              pre-split into fp16 [hi | lo] column halves (kHeadDimQK = 2 kHeadDim, kSplitQK).
// ElementOut : Element, or float for fp32 inputs.
// kMinBlocksPerSm: CTAs per SM the register allocation must allow (__launch_bounds__).
template <int kHeadDimQK_, int kHeadDim_, int kBlockM_, int kBlockN_, class Element_, class ElementOut_,
          int kMinBlocksPerSm_>
struct FwdTraits {
  using Element = Element_;
  using ElementOut = ElementOut_;
  static constexpr int kHeadDimQK = kHeadDimQK_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kNWarpGroups = kBlockM / 64;
  static constexpr int kNThreads = 128 * kNWarpGroups;
  static constexpr int kMinBlocksPerSm = kMinBlocksPerSm_;
  // fp32 inputs (fp32 O): S = Qhi Khi^T + Qhi Klo^T + Qlo Khi^T over the [hi | lo] halves of Q and K
  // (warpgroup_gemm_split, common/wgmma.h).
  static constexpr bool kSplitQK = cute::is_same_v<ElementOut, float>;
  static_assert(kHeadDimQK == (kSplitQK ? 2 : 1) * kHeadDim, "Q and K: d columns, or [hi | lo] for fp32 inputs");
  static_assert(kBlockM % 64 == 0, "a warpgroup MMA covers 64 rows");
  static_assert(kHeadDim % 32 == 0 && kHeadDimQK % 32 == 0, "a 64- or 128-byte swizzle atom spans the columns");

  // ---- Copy side: the Q/K tiles and the V/O tiles (cp.async partitions, swizzled layouts, O epilogue)
  using CopyQK = TileCopyTraits<kHeadDimQK, kBlockM, kBlockN, kNThreads, Element, Element>;
  using CopyVO = TileCopyTraits<kHeadDim, kBlockM, kBlockN, kNThreads, Element, ElementOut>;
  static_assert(CopyQK::kNThreads == kNThreads);
  // 16 B a thread, the threads of a row covering one swizzle-atom row: Q and K (kHeadDimQK columns)
  // and V (kHeadDim) differ when fp32's [hi | lo] Q and K are 128-byte rows and V is not (d = 96).
  using GmemTiledCopyQK = typename CopyQK::GmemTiledCopyQKV;
  using GmemTiledCopyV = typename CopyVO::GmemTiledCopyQKV;
  using SmemLayoutQ = typename CopyQK::SmemLayoutQ;   // (kBlockM, kHeadDimQK)
  using SmemLayoutK = typename CopyQK::SmemLayoutKV;  // (kBlockN, kHeadDimQK)
  using SmemLayoutV = typename CopyVO::SmemLayoutKV;  // (kBlockN, kHeadDim)
  using SmemLayoutO = typename CopyVO::SmemLayoutO;   // (kBlockM, kHeadDim), over the Q tile
  using SmemCopyAtomO = typename CopyVO::SmemCopyAtomO;
  using GmemTiledCopyO = typename CopyVO::GmemTiledCopyO;

  // ---- MMA: S = Q K^T (both operands in shared memory), O += P V (P from registers) ---------------
  // Warpgroup w owns rows [64w, 64w + 64); within it warp j owns 16 rows, and a thread holds the
  // same (row, row + 8) x (2 columns per 8) pattern as the mma.sync 16x8 accumulator, so the shared
  // softmax and mask run on a re-viewed accumulator (sm90/utils.h).
  using AtomLayout = Layout<Shape<Int<kNWarpGroups>, _1, _1>>;
  using TiledMmaS = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<Int<kBlockM>, Int<kBlockN>, Int<kHeadDimQK>>>(),
      AtomLayout{}));
  // V is stored as rows of head_dim (the N index of P V is contiguous): an MN-major B operand.
  using TiledMmaO = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<Int<kBlockM>, Int<kHeadDim>, Int<kBlockN>>,
                           GMMA::Major::K, GMMA::Major::MN>(),
      AtomLayout{}));

  // ---- GMMA views of the shared tiles --------------------------------------------------------------
  // Layout_K_SW128 for 16-bit types is 8 rows x 64 columns with the 16-byte chunk XORed by the row:
  // byte for byte the Swizzle<3,3,3> tile the cp.async copies write (common/tile_copy.h) (same tile_to_shape
  // order), carried here with the flag wgmma descriptors are built from.
  // 128-byte swizzle for rows of 64k 16-bit columns, 64-byte for the others (d = 96): the same atoms
  // as the copy layouts of common/tile_copy.h, so both views address the same bytes.
  template <int kCols>
  using SmemLayoutAtom = cute::conditional_t<kCols % 64 == 0, GMMA::Layout_K_SW128_Atom<Element>,
                                             GMMA::Layout_K_SW64_Atom<Element>>;
  using SmemLayoutQMma = decltype(tile_to_shape(SmemLayoutAtom<kHeadDimQK>{}, Shape<Int<kBlockM>, Int<kHeadDimQK>>{}));
  using SmemLayoutKMma = decltype(tile_to_shape(SmemLayoutAtom<kHeadDimQK>{}, Shape<Int<kBlockN>, Int<kHeadDimQK>>{}));
  using SmemLayoutVMma = decltype(tile_to_shape(SmemLayoutAtom<kHeadDim>{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  using SmemLayoutVtMma = decltype(composition(
      SmemLayoutVMma{}, make_layout(Shape<Int<kHeadDim>, Int<kBlockN>>{}, GenRowMajor{})));  // (d, kBlockN)
  static_assert(cosize(SmemLayoutQMma{}) == cosize(SmemLayoutQ{}));
  static_assert(cosize(SmemLayoutKMma{}) == cosize(SmemLayoutK{}));
  static_assert(cosize(SmemLayoutVMma{}) == cosize(SmemLayoutV{}));

  static constexpr int kSmemSizeQKV =
      (cosize(SmemLayoutQ{}) + cosize(SmemLayoutK{}) + cosize(SmemLayoutV{})) * sizeof(Element);
  static constexpr int kSmemSizeO = cosize(SmemLayoutO{}) * sizeof(ElementOut);
  static_assert(kSmemSizeO <= cosize(SmemLayoutQ{}) * sizeof(Element), "O is staged over the Q tile");
  // A paged cache (the general kernel): the block-table entries of a coming K/V tile (kBlockN keys span
  // at most kBlockN pages), then its rows' offsets in K and in V, each in two slots, one per tile
  // parity (sm90/flash_fwd_kernel.h).
  static constexpr int kPageSlots = kBlockN;
  static constexpr int kSmemSizePages = 2 * kPageSlots * sizeof(int) + 2 * 2 * kBlockN * sizeof(int64_t);
  static constexpr int kSmemSize = kSmemSizeQKV + kSmemSizePages;
  static_assert(kSmemSize * kMinBlocksPerSm <= 227 * 1024, "the CTAs of one SM fit its shared memory");
};

// fp16 / bf16 in and out.
template <int kHeadDim, class Element>
using DefaultFwdTraits = FwdTraits<kHeadDim, kHeadDim, TileConfig<kHeadDim>::kBlockM, TileConfig<kHeadDim>::kBlockN,
                                   Element, Element, TileConfig<kHeadDim>::kMinBlocksPerSm>;

// fp32 in and out: Q' = [Qhi Qlo], K' = [Khi Klo] (2 d columns), V in fp16.
template <int kHeadDim>
using Fp32FwdTraits = FwdTraits<2 * kHeadDim, kHeadDim, TileConfigFp32<kHeadDim>::kBlockM,
                                TileConfigFp32<kHeadDim>::kBlockN, cutlass::half_t, float,
                                TileConfigFp32<kHeadDim>::kMinBlocksPerSm>;

}  // namespace cutlassfa::sm90
