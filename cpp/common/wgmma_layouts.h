// Views of a Hopper warpgroup-MMA (wgmma) accumulator, shared by the two sm_90a kernels (sm90/ and
// sm90ws/): the fragment in the mma.sync shapes (so common/mask.h and the online softmax apply
// unchanged) and the S accumulator re-viewed as the register A operand of O += P V.
#pragma once

#include <cute/tensor.hpp>

namespace cutlassfa {

// A wgmma accumulator fragment is ((2, 2, N/8), MMA_M, MMA_N): per 8-column chunk a thread holds
// columns (2c, 2c+1) of rows r and r+8, exactly the values of one mma.sync 16x8 atom. Regrouped as that
// fragment: ((2, 2), MMA_M, (N/8, MMA_N)).
template <class Layout>
__forceinline__ __device__ auto acc_as_sm80(Layout acc_layout) {
  using namespace cute;
  static_assert(decltype(rank<0>(acc_layout))::value == 3 && decltype(rank(acc_layout))::value == 3);
  return make_layout(make_layout(get<0, 0>(acc_layout), get<0, 1>(acc_layout)), get<1>(acc_layout),
                     make_layout(get<0, 2>(acc_layout), get<2>(acc_layout)));
}

// The S accumulator as the register A operand of O += P V: two neighbouring 8-column chunks are the
// k and k+8 halves of one 64x16 A slice, so ((2, 2, N/8), MMA_M, MMA_N) becomes
// ((2, 2, 2), MMA_M, N/16 * MMA_N).
template <class Layout>
__forceinline__ __device__ auto acc_as_a_operand(Layout acc_layout) {
  using namespace cute;
  static_assert(decltype(size<0, 2>(acc_layout))::value % 2 == 0, "pairs of 8-column chunks make one K=16 slice");
  auto chunks = logical_divide(get<0, 2>(acc_layout), Tile<_2>{});  // ((2, N/16))
  return make_layout(make_layout(get<0, 0>(acc_layout), get<0, 1>(acc_layout), get<0, 0>(chunks)),
                     get<1>(acc_layout), coalesce(make_layout(get<0, 1>(chunks), get<2>(acc_layout))));
}

}  // namespace cutlassfa
