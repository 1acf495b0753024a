// Softcap (Gemma 2, Grok): every score s = q.k becomes c * tanh(scale * s / c) before the mask and
// the softmax. The host folds c into the softmax scale (params.h: softcap_pre = scale / c,
// softmax_scale = c), so the kernels only replace s by tanh(s * softcap_pre).
#pragma once

#include <cute/tensor.hpp>

#include "common/tensor_utils.h"

namespace cutlassfa {

// tanh(x) = 1 - 2 / (e^(2x) + 1): one MUFU.EX2 and one MUFU.RCP. Its absolute error (~1e-7, the
// reciprocal's) is what matters: multiplied by the cap it is the error of the capped score, which the
// softmax sees as a relative error of P. tanh.approx.f32 (~5e-4 relative) would be 100x coarser.
// Large |x|: e^(2x) = inf gives 1, 0 gives -1.
__forceinline__ __device__ float softcap_tanh(float x) {
  return 1.f - __fdividef(2.f, fast_exp2(x * 2.88539008177792681f) + 1.f);  // 2 log2(e)
}

template <class TensorS>
__forceinline__ __device__ void apply_softcap(TensorS& acc_s, float softcap_pre) {
  CUTE_UNROLL
  for (int i = 0; i < size(acc_s); ++i) { acc_s(i) = softcap_tanh(acc_s(i) * softcap_pre); }
}

}  // namespace cutlassfa
