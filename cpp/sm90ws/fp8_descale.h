// The scales one tile applies, read when the tile starts: for fp8 attention, q_descale x k_descale folded
// into the softmax scale (the scores are computed on the e4m3 values as they are) and v_descale into the
// epilogue's 1 / l; for fp16 / bf16 / fp32, the call's softmax scale and 1.
#pragma once

#include "cutlassfa/params.h"

namespace cutlassfa::sm90ws {

struct TileScales {
  float scale_log2;  // raw score -> log2 units of P: softmax_scale x log2(e) (x q_descale x k_descale)
  float scale;       // raw score -> natural-log units (lse): softmax_scale (x q_descale x k_descale)
  float o_scale;     // O's factor beside 1 / l: v_descale, or 1
};

// A descale of (batch, K/V head) as params.h lays it out: nullptr is 1.
__forceinline__ __device__ float descale_at(const float* descale, long long batch_stride, long long head_stride,
                                            int batch, int head_kv) {
  return descale == nullptr ? 1.f : __ldg(descale + batch * batch_stride + head_kv * head_stride);
}

template <bool kFp8>
__forceinline__ __device__ TileScales tile_scales(FwdParams const& p, int batch, int head_kv) {
  if constexpr (kFp8) {
    float const qk = descale_at(p.q_descale, p.q_descale_batch_stride, p.q_descale_head_stride, batch, head_kv) *
                     descale_at(p.k_descale, p.k_descale_batch_stride, p.k_descale_head_stride, batch, head_kv);
    float const v = descale_at(p.v_descale, p.v_descale_batch_stride, p.v_descale_head_stride, batch, head_kv);
    return {p.softmax_scale_log2 * qk, p.softmax_scale * qk, v};
  } else {
    return {p.softmax_scale_log2, p.softmax_scale, 1.f};
  }
}

}  // namespace cutlassfa::sm90ws
