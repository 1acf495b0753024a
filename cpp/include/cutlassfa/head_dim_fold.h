// The one fold behind every head-dim switch: common/static_switch.h's, launch.h's tile_switch and the decode
// launch's instantiation choice differ only in what they return where no compiled width runs a call.
#pragma once

#include <type_traits>

namespace cutlassfa {

// f(std::integral_constant<int, d>) for the compiled head dim d of kHeadDims (ascending) that runs head_dim:
// equal to it, or with kPadded the next larger one (its columns past head_dim zero-padded); `none` where there
// is none, never a silent fallback to another width.
template <bool kPadded, int... kHeadDims, class R, class F>
R head_dim_fold(int head_dim, R none, F&& f) {
  R result = none;
  (((kPadded ? head_dim <= kHeadDims : head_dim == kHeadDims)
        ? (result = f(std::integral_constant<int, kHeadDims>{}), true)
        : false) ||
   ...);
  return result;
}

}  // namespace cutlassfa
