// The memory contract of the tensor-core families: every tile row they move is one 16-byte vector
// per thread (cp.async for q, k, v; vector stores for o), so each row start must be 16-byte aligned:
// the base pointer, and the batch, head and row strides in multiples of 16 bytes. A stride over an
// extent of 1 is never applied and not checked. Host code only (the validator uses it too).
#pragma once

#include <cstdint>

#include "cutlassfa/params.h"

namespace cutlassfa {

inline bool tensor_aligned16(const void* ptr, long long batch_stride, long long head_stride, long long row_stride,
                             int batch, int heads, int seqlen, int elem_bytes) {
  long long const elems = 16 / elem_bytes;
  auto multiple = [elems](long long stride, long long extent) { return extent <= 1 || stride % elems == 0; };
  return reinterpret_cast<std::uintptr_t>(ptr) % 16 == 0 && multiple(batch_stride, batch) &&
         multiple(head_stride, heads) && multiple(row_stride, seqlen);
}

// q, k, v and o of params all satisfy the tensor-core contract, and the heads are consistent.
inline bool tensorcore_aligned(const FwdParams& p) {
  int const in_bytes = dtype_bytes(p.dtype);
  int const out_bytes = p.dtype == DType::kFloat8E4M3 ? dtype_bytes(p.out_dtype) : in_bytes;  // fp8 attention
  int const kv_bytes = p.kv_fp8 ? dtype_bytes(DType::kFloat8E4M3) : in_bytes;
  // A paged cache: the batch strides step over num_pages pages of page_size rows.
  int const kv_batches = p.block_table != nullptr ? p.num_pages : p.batch;
  int const kv_rows = p.block_table != nullptr ? p.page_size : p.seqlen_k;
  return p.heads_kv >= 1 && p.heads_ratio >= 1 && p.heads_q == p.heads_kv * p.heads_ratio &&
         tensor_aligned16(p.q, p.q_batch_stride, p.q_head_stride, p.q_row_stride, p.batch, p.heads_q, p.seqlen_q,
                          in_bytes) &&
         tensor_aligned16(p.k, p.k_batch_stride, p.k_head_stride, p.k_row_stride, kv_batches, p.heads_kv, kv_rows,
                          kv_bytes) &&
         tensor_aligned16(p.v, p.v_batch_stride, p.v_head_stride, p.v_row_stride, kv_batches, p.heads_kv, kv_rows,
                          kv_bytes) &&
         tensor_aligned16(p.o, p.o_batch_stride, p.o_head_stride, p.o_row_stride, p.batch, p.heads_q, p.seqlen_q,
                          out_bytes);
}

}  // namespace cutlassfa
