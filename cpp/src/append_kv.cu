// Appends k_new / v_new (B, Hkv, Nnew, d) into a KV cache at cache_seqlens[b] of each entry, before the
// attention kernel and on its stream: contiguous caches (B, Hkv, capacity, d) or paged caches
// (num_pages, Hkv, page_size, d) through block_table. Bounds-safe for any device values: a position
// past the capacity, a negative length, or a page index outside [0, num_pages) (rules.h: no page) drops
// the row.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cutlassfa/launch.h"
#include "cutlassfa/rules.h"

namespace cutlassfa {
namespace {

template <typename T>
__global__ void append_kv_kernel(const FwdParams params, const AppendKV append) {
  long long const rows = static_cast<long long>(params.batch) * params.heads_kv * append.n_new;
  for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
    int const j = static_cast<int>(r % append.n_new);
    int const h = static_cast<int>((r / append.n_new) % params.heads_kv);
    int const b = static_cast<int>(r / (static_cast<long long>(append.n_new) * params.heads_kv));
    int const start = params.seqlens_k[b];
    long long const position = static_cast<long long>(start) + j;
    if (start < 0 || position >= params.seqlen_k) continue;  // past the capacity: dropped
    long long entry = b, row = position;
    if (params.block_table != nullptr) {
      int const key = static_cast<int>(position);  // < seqlen_k
      int const slot = rules::page_slot_of_key(key, params.page_size, params.page_size_log2);
      int const page = params.block_table[b * params.block_table_stride + slot];
      if (!rules::page_index_valid(page, params.num_pages)) continue;
      entry = page, row = rules::row_in_page(key, slot, params.page_size, params.page_size_log2);
    }
    T* k = const_cast<T*>(static_cast<const T*>(params.k)) + entry * params.k_batch_stride + h * params.k_head_stride +
           row * params.k_row_stride;
    T* v = const_cast<T*>(static_cast<const T*>(params.v)) + entry * params.v_batch_stride + h * params.v_head_stride +
           row * params.v_row_stride;
    const T* k_new = static_cast<const T*>(append.k_new) + b * append.k_new_strides[0] + h * append.k_new_strides[1] +
                     j * append.k_new_strides[2];
    const T* v_new = static_cast<const T*>(append.v_new) + b * append.v_new_strides[0] + h * append.v_new_strides[1] +
                     j * append.v_new_strides[2];
    for (int c = threadIdx.x; c < params.head_dim; c += blockDim.x) {
      k[c] = k_new[c];
      v[c] = v_new[c];
    }
  }
}

template <typename T>
cudaError_t launch(const FwdParams& params, const AppendKV& append, cudaStream_t stream) {
  long long const rows = static_cast<long long>(params.batch) * params.heads_kv * append.n_new;
  if (rows == 0 || params.seqlen_k == 0 || params.seqlens_k == nullptr) return cudaSuccess;
  unsigned const blocks = static_cast<unsigned>(rows < 65536 ? rows : 65536);
  int const threads = params.head_dim <= 64 ? 64 : 128;  // one row of d elements per block
  append_kv_kernel<T><<<blocks, threads, 0, stream>>>(params, append);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_append_kv(const FwdParams& params, const AppendKV& append, cudaStream_t stream) {
  if (params.kv_fp8) return launch<unsigned char>(params, append, stream);  // fp8 caches: bytes copied as they are
  switch (params.dtype) {
    case DType::kFloat32: return launch<float>(params, append, stream);
    case DType::kFloat16: return launch<__half>(params, append, stream);
    case DType::kBFloat16: return launch<__nv_bfloat16>(params, append, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace cutlassfa
