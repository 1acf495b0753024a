// Compile-time configuration of the SM90 (Hopper, sm_90a) tensor-core forward kernel: warpgroup MMA
// (wgmma) for both GEMMs, everything else as the SM80 kernel. The copy side (cp.async tiles,
// swizzled shared layouts, O epilogue) is inherited from sm80::FwdTraits unchanged; this struct
// adds the two wgmma TiledMMAs and the GMMA views of the same shared memory.
#pragma once

#include <cute/tensor.hpp>
#include <cute/arch/mma_sm90.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>

#include "sm80/kernel_traits.h"

namespace cutlassfa::sm90 {

using namespace cute;

// Tile per head dim. A warpgroup (4 warps) owns 64 query rows; kBlockM / 64 warpgroups share each
// K/V tile in shared memory.
template <int kHeadDim> struct TileConfig;
template <> struct TileConfig<64>  { static constexpr int kBlockM = 128, kBlockN = 128; };
template <> struct TileConfig<128> { static constexpr int kBlockM = 128, kBlockN = 128; };

template <int kHeadDim_, int kBlockM_, int kBlockN_, class Element_>
struct FwdTraits : sm80::FwdTraits<kHeadDim_, kBlockM_, kBlockN_, kBlockM_ / 16, Element_, Element_> {
  using Base = sm80::FwdTraits<kHeadDim_, kBlockM_, kBlockN_, kBlockM_ / 16, Element_, Element_>;
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kNWarpGroups = kBlockM / 64;
  static_assert(kBlockM % 64 == 0, "a warpgroup MMA covers 64 rows");
  static_assert(Base::kNThreads == 128 * kNWarpGroups);
  static_assert(kHeadDim % 64 == 0, "the 128-byte swizzle atom spans 64 16-bit columns");

  // ---- MMA: S = Q K^T (both operands in shared memory), O += P V (P from registers) ---------------
  // Warpgroup w owns rows [64w, 64w + 64); within it warp j owns 16 rows, and a thread holds the
  // same (row, row + 8) x (2 columns per 8) pattern as the SM80 16x8 accumulator, so the SM80
  // softmax and mask run on a re-viewed accumulator (sm90/layout.h).
  using AtomLayout = Layout<Shape<Int<kNWarpGroups>, _1, _1>>;
  using TiledMmaS = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<Int<kBlockM>, Int<kBlockN>, Int<kHeadDim>>>(),
      AtomLayout{}));
  // V is stored as rows of head_dim (the N index of P V is contiguous): an MN-major B operand.
  using TiledMmaO = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<Int<kBlockM>, Int<kHeadDim>, Int<kBlockN>>,
                           GMMA::Major::K, GMMA::Major::MN>(),
      AtomLayout{}));

  // ---- GMMA views of the shared tiles --------------------------------------------------------------
  // Layout_K_SW128 for 16-bit types is 8 rows x 64 columns with the 16-byte chunk XORed by the row:
  // byte for byte the SM80 Swizzle<3,3,3> tile the cp.async copies write (Base::SmemLayoutQ/KV,
  // the same tile_to_shape order), carried here with the flag wgmma descriptors are built from.
  using SmemLayoutAtom = GMMA::Layout_K_SW128_Atom<Element>;
  using SmemLayoutQMma = decltype(tile_to_shape(SmemLayoutAtom{}, Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  using SmemLayoutKMma = decltype(tile_to_shape(SmemLayoutAtom{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  using SmemLayoutVtMma = decltype(composition(
      SmemLayoutKMma{}, make_layout(Shape<Int<kHeadDim>, Int<kBlockN>>{}, GenRowMajor{})));  // (d, kBlockN)
  static_assert(cosize(SmemLayoutQMma{}) == cosize(typename Base::SmemLayoutQ{}));
  static_assert(cosize(SmemLayoutKMma{}) == cosize(typename Base::SmemLayoutKV{}));

  static constexpr int kSmemSize = Base::kSmemSize;
};

template <int kHeadDim, class Element>
using DefaultFwdTraits = FwdTraits<kHeadDim, TileConfig<kHeadDim>::kBlockM, TileConfig<kHeadDim>::kBlockN, Element>;

}  // namespace cutlassfa::sm90
