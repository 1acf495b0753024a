// fp8 P V: the S accumulator seen in the value order of the e4m3 A operand, the key order of
// sm90ws/fp8_key_order.h (apart from it: that header stays free of CuTe for the V^T pre-pass).
#pragma once

#include <cute/tensor.hpp>

#include "sm90ws/fp8_key_order.h"

namespace cutlassfa::sm90ws {

// The S accumulator ((2, 2, N/8), MMA_M, 1) of an e4m3 S = Q K^T, re-viewed in the value order of the
// e4m3 A operand of P V, ((4, 2, 2), MMA_M, N/32): A value (v0, v1, v2) of group n is the S value of
// column pair v0 % 2, chunk 4n + 2 v2 + v0 / 2, row half v1. Only a view: the packing into e4m3 bytes
// (convert_p_fp8, sm90ws/utils.h) walks it in order.
template <class AccLayout>
CUTE_HOST_DEVICE auto acc_as_fp8_a_operand(AccLayout acc_layout) {
  using namespace cute;
  static_assert(decltype(rank<0>(acc_layout))::value == 3 && decltype(rank(acc_layout))::value == 3);
  static_assert(decltype(size<2>(acc_layout))::value == 1, "one wgmma spans the keys");
  static_assert(decltype(size<0, 2>(acc_layout))::value % 4 == 0, "whole 32-key groups");
  // The chunk mode N/8 as (chunk pair half, chunk pair, group): (2, 2, N/32).
  auto chunks = logical_divide(get<0, 2>(acc_layout), Tile<cute::Layout<Shape<_2, _2>>>{});  // ((2, 2), N/32)
  auto value = make_layout(make_layout(get<0, 0>(acc_layout), get<0, 0, 0>(chunks)),   // v0: (column, chunk)
                           get<0, 1>(acc_layout),                                       // v1: row half
                           get<0, 0, 1>(chunks));                                       // v2: the chunk pair
  return make_layout(value, get<1>(acc_layout), get<0, 1>(chunks));
}

}  // namespace cutlassfa::sm90ws
