// The one parameter struct that flows Python -> binding -> dispatch -> every kernel family.
//
// Kept free of any #include so that the CUDA-core kernels which include it stay compilable by NVRTC
// (the sm_61 build check), where the standard headers are not available.
#pragma once

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define CUTLASSFA_HOST_DEVICE __host__ __device__
#else
#define CUTLASSFA_HOST_DEVICE
#endif

namespace cutlassfa {

// kFloat8E4M3 (float8_e4m3fn): a KV cache's dtype with an fp16 / bf16 q (FwdParams::kv_fp8), or q, k and v of
// fp8 attention (dtype kFloat8E4M3, o in out_dtype).
enum class DType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2, kFloat8E4M3 = 3 };

// Bytes of one element of `dtype`.
CUTLASSFA_HOST_DEVICE constexpr int dtype_bytes(DType dtype) {
  return dtype == DType::kFloat32 ? 4 : dtype == DType::kFloat8E4M3 ? 1 : 2;
}

// The widest head dim any backend takes (the validator's bound; the kernels are compiled up to it).
constexpr int kMaxHeadDim = 256;

// Tensors are (batch, heads, seqlen, head_dim) with arbitrary strides in elements, except that the
// head_dim stride is 1. lse is (batch, heads_q, seqlen_q) float32 with the strides below.
// Members have defaults (`FwdParams p{};`): a plain dense call sets only the tensors, shapes and scale.
struct FwdParams {
  const void* q;  // (batch, heads_q,  seqlen_q, head_dim)
  const void* k;  // (batch, heads_kv, seqlen_k, head_dim)
  const void* v;  // (batch, heads_kv, seqlen_k, head_dim)
  void* o;        // (batch, heads_q,  seqlen_q, head_dim), of out_dtype
  float* lse;     // (batch, heads_q,  seqlen_q) or nullptr when not asked for

  long long q_batch_stride, q_head_stride, q_row_stride;
  long long k_batch_stride, k_head_stride, k_row_stride;
  long long v_batch_stride, v_head_stride, v_row_stride;
  long long o_batch_stride, o_head_stride, o_row_stride;

  int batch;
  int heads_q;
  int heads_kv;     // heads_q is a multiple of heads_kv (GQA / MQA)
  int heads_ratio;  // heads_q / heads_kv: query head h reads key/value head h / heads_ratio
  int seqlen_q;     // >= 1 when a kernel is launched; with cu_seqlens_q the longest sequence (grid size)
  int seqlen_k;     // >= 1 when a kernel is launched; keys per entry, or the capacity of a KV cache
  int head_dim;     // a multiple of 8, 8..kMaxHeadDim

  float softmax_scale;       // usually 1/sqrt(head_dim); the cap when softcap_pre > 0
  float softmax_scale_log2;  // softmax_scale * log2(e): kernels use exp2f(x * scale_log2 - m)

  // Softcap: when > 0, every score s = q.k becomes tanh(s * softcap_pre) before the mask and the
  // softmax, and softmax_scale is the cap c (softcap_pre = scale / c): c * tanh(scale * s / c) is
  // then the capped score in softmax units, with no other change to the kernels. 0 disables it.
  float softcap_pre = 0.f;

  // Which keys a query sees (python/cutlassfa/masks.py is the definition): with offset = L - Nq for
  // an entry of Nq queries and L keys, query i sees key j iff
  //     i + offset - window_left <= j <= i + offset + window_right   and   leftpad <= j < L,
  // -1 meaning unbounded on that side. Causal is (-1, 0). A row that sees no key writes O = 0 and
  // lse = -inf.
  int window_left = -1;
  int window_right = -1;

  // Per-entry lengths. Every pointer is a device array, nullptr when not given.
  //  - cu_seqlens_q / cu_seqlens_k (batch + 1): varlen. Entry b's queries are rows
  //    [cu_seqlens_q[b], cu_seqlens_q[b+1]) of q, o (and of lse's row axis); its keys are rows
  //    [cu_seqlens_k[b], cu_seqlens_k[b+1]) of k, v. The batch strides are then 0.
  //  - seqlens_k (batch): KV cache. Entry b has L = seqlens_k[b] + seqlens_k_added keys (the keys
  //    appended this call), clamped to [0, seqlen_k] (the capacity) so that a bad length never reads
  //    outside the cache. Every length rule is rules.h's.
  //  - leftpad_k (batch): keys before leftpad_k[b] are hidden (clamped to [0, L]); alignment unchanged.
  const int* cu_seqlens_q = nullptr;
  const int* cu_seqlens_k = nullptr;
  int total_q = 0;  // varlen: rows of q and o (what a TMA descriptor over the packed array spans)
  int total_k = 0;  // varlen: rows of k and v
  const int* seqlens_k = nullptr;
  int seqlens_k_added = 0;
  const int* leftpad_k = nullptr;

  // Paged KV cache: k and v are (num_pages, heads_kv, page_size, d) with the batch strides above
  // taken as page strides; key position p of entry b is row p % page_size of page
  // block_table[b * block_table_stride + p / page_size]; a page index outside [0, num_pages) is no
  // page (rules.h: its keys are masked, never read). seqlen_k is then the capacity of one entry,
  // max_pages * page_size.
  const int* block_table = nullptr;
  long long block_table_stride = 0;
  int page_size = 0;
  int page_size_log2 = -1;  // log2(page_size) when it is a power of two (shifts, not divisions), else -1
  int num_pages = 0;

  // lse strides (the row stride is 1): (batch, heads_q, seqlen_q) compact, or (heads_q, total_q) for
  // varlen (batch stride 0, rows offset by cu_seqlens_q).
  long long lse_batch_stride = 0;  // set with lse
  long long lse_head_stride = 0;

  // Attention sinks (gpt-oss): sink logits in natural-log units, float32, one per query head; nullptr for
  // none. Query row i of head h reads sinks[h * sinks_head_stride + i * sinks_row_stride] (the row stride
  // is 0 but in a GQA-packed problem, whose rows are query heads: dispatch.cpp). Each row's softmax
  // gains e^sink in its denominator and no value: rules.h's lse_with_sink, applied where a row's final lse
  // is formed (the tile epilogues, the decode kernel's warp merge, the split combine, the CUDA-core
  // kernels). -inf is no sink.
  const float* sinks = nullptr;
  long long sinks_head_stride = 1;
  long long sinks_row_stride = 0;

  // ALiBi (Bloom, MPT): the score of query i and key j of an entry gains -slope * |i + L - Nq - j| (L its keys:
  // the mask's diagonal, rules.h alibi_distance) in softmax units, after softcap; slope of entry b and query
  // head h: alibi_slopes[b * alibi_batch_stride + h], float32 on the device (batch stride 0: one per head);
  // nullptr for none. Kernels add -(slope / softmax_scale) * distance to the raw score. Never GQA-packed.
  const float* alibi_slopes = nullptr;
  long long alibi_batch_stride = 0;

  // Split keys (Flash-Decoding): when num_splits > 1, split s of a tile attends to its share of the
  // key tiles and writes its normalized fp32 O to o_accum[s][b][h][row][d] and its lse to
  // lse_accum[s][b][h][row] (compact, seqlen_q rows); a combine kernel merges them into o and lse.
  int num_splits = 1;
  float* o_accum = nullptr;
  float* lse_accum = nullptr;

  DType dtype;  // of q (and of k and v unless kv_fp8)
  // Of o: dtype, except for fp8 attention (dtype kFloat8E4M3): bfloat16 or float16.
  DType out_dtype = DType::kFloat32;

  // FP8 KV caches: k and v (and the appended keys) are float8 e4m3, q and o fp16 / bf16 (`dtype`). Key j of
  // entry b and K/V head h is k[...] * k_descale[b * k_descale_batch_stride + h * k_descale_head_stride] (float32
  // on the device; strides 0 for one scale per tensor; nullptr: 1), v likewise. The decode kernel reads them;
  // every other kernel runs a copy dequantized into `dtype` (launch.h, dequantized_params: kv_fp8 off).
  bool kv_fp8 = false;
  const float* k_descale = nullptr;
  const float* v_descale = nullptr;
  long long k_descale_batch_stride = 0, k_descale_head_stride = 0;
  long long v_descale_batch_stride = 0, v_descale_head_stride = 0;
  // FP8 attention (dtype kFloat8E4M3: q, k and v e4m3, kv_fp8 set too): query head h of entry b is
  // q[...] * q_descale[b * q_descale_batch_stride + (h / heads_ratio) * q_descale_head_stride], indexed by its
  // K/V head as FlashAttention-3's; k_descale and v_descale as above. nullptr: 1.
  const float* q_descale = nullptr;
  long long q_descale_batch_stride = 0, q_descale_head_stride = 0;

  // Terms of a score beyond scale * q.k (softcap, ALiBi): the general kernels' steps apply them (sm80, sm90);
  // the warp-specialized kernel takes no such call, the decode kernel ALiBi only (their *_covers, launch.h).
  CUTLASSFA_HOST_DEVICE bool has_score_terms() const { return softcap_pre > 0.f || alibi_slopes != nullptr; }
};

}  // namespace cutlassfa
