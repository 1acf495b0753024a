// The one parameter struct that flows Python -> binding -> dispatch -> every kernel family.
//
// Kept free of any #include so that the CUDA-core kernels which include it stay compilable by NVRTC
// (the sm_61 build check), where the standard headers are not available.
#pragma once

namespace cutlassfa {

enum class DType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

// Tensors are (batch, heads, seqlen, head_dim) with arbitrary strides in elements, except that the
// head_dim stride is 1. lse is (batch, heads_q, seqlen_q) float32, contiguous.
struct FwdParams {
  const void* q;  // (batch, heads_q,  seqlen_q, head_dim)
  const void* k;  // (batch, heads_kv, seqlen_k, head_dim)
  const void* v;  // (batch, heads_kv, seqlen_k, head_dim)
  void* o;        // (batch, heads_q,  seqlen_q, head_dim), same dtype as q
  float* lse;     // (batch, heads_q,  seqlen_q) or nullptr when not asked for

  long long q_batch_stride, q_head_stride, q_row_stride;
  long long k_batch_stride, k_head_stride, k_row_stride;
  long long v_batch_stride, v_head_stride, v_row_stride;
  long long o_batch_stride, o_head_stride, o_row_stride;

  int batch;
  int heads_q;
  int heads_kv;     // heads_q is a multiple of heads_kv (GQA / MQA)
  int heads_ratio;  // heads_q / heads_kv: query head h reads key/value head h / heads_ratio
  int seqlen_q;     // >= 1 when a kernel is launched
  int seqlen_k;     // >= 1 when a kernel is launched
  int head_dim;     // 32, 64 or 128

  float softmax_scale;       // usually 1/sqrt(head_dim)
  float softmax_scale_log2;  // softmax_scale * log2(e): kernels use exp2f(x * scale_log2 - m)

  // Bottom-right aligned causal mask, as FlashAttention-2: query i sees key j iff
  // j <= i + seqlen_k - seqlen_q. A row that sees no key writes O = 0 and lse = -inf.
  bool causal;
  DType dtype;
};

}  // namespace cutlassfa
