// Merging partial attention results by their log-sum-exp: parts p (key splits, or the warps of the
// decode kernel) each hold a normalized O_p and lse_p (an empty part: O_p = 0, lse_p = -inf); the
// whole is
//     lse = m + log sum_p exp(lse_p - m)   (m = max_p lse_p),    O = sum_p merge_weight(lse_p, lse) O_p.
// A row that no part saw (every lse_p = -inf) gets lse = -inf and weights 0, so O = 0.
#pragma once

#include <cmath>

namespace cutlassfa {

// lse of the merge from the largest part lse `max_lse` and sum_p exp(lse_p - max_lse).
__forceinline__ __device__ float merged_lse(float max_lse, float sum_exp) {
  return max_lse == -INFINITY ? -INFINITY : max_lse + logf(sum_exp);
}

// exp(lse_p - lse): 0 for an empty part, and for every part of an empty merge (no -inf - -inf).
__forceinline__ __device__ float merge_weight(float part_lse, float lse) {
  return lse == -INFINITY ? 0.f : expf(part_lse - lse);
}

}  // namespace cutlassfa
