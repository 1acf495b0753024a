// Softcap (Gemma 2, Grok): every score s = q.k becomes c * tanh(scale * s / c) before the mask and
// the softmax. The host folds c into the softmax scale (params.h: softcap_pre = scale / c,
// softmax_scale = c), so the kernels only replace s by tanh(s * softcap_pre), rules.h's softcap_tanh.
#pragma once

#include <cute/tensor.hpp>

#include "cutlassfa/rules.h"

namespace cutlassfa {

template <class TensorS>
__forceinline__ __device__ void apply_softcap(TensorS& acc_s, float softcap_pre) {
  CUTE_UNROLL
  for (int i = 0; i < cute::size(acc_s); ++i) { acc_s(i) = rules::softcap_tanh(acc_s(i) * softcap_pre); }
}

}  // namespace cutlassfa
