// An fp8 cache dequantized into a copy of q's dtype, for the calls the decode kernel does not take (more
// query rows, left padding, a left window bound, softcap, head dims or page sizes it lacks): every other
// kernel then runs the copy as a cache of q's dtype. Keys of entry b and K/V head h are scaled by their
// descales (params.h). A paged cache becomes a pool of B x (its table's pages) pages of the same size,
// page j of entry b at b * pages + j, and a table that names them (-1 where the original entry names no
// page: those keys stay masked). Bounds-safe for any table values.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "cutlassfa/launch.h"
#include "cutlassfa/rules.h"

namespace cutlassfa {
namespace {

__device__ float descale_of(const float* descale, long long batch_stride, long long head_stride, int b, int h) {
  return descale == nullptr ? 1.f : descale[b * batch_stride + h * head_stride];
}

// One block a row of the copy: (slot, K/V head, row), slot an entry (contiguous) or an entry's page.
template <typename T>
__global__ void dequantize_kv_kernel(const FwdParams params, DequantizedKV copy) {
  bool const paged = params.block_table != nullptr;
  int const pages = paged ? params.seqlen_k / params.page_size : 1;  // table entries an entry
  int const rows = paged ? params.page_size : params.seqlen_k;       // rows a slot
  long long const total = static_cast<long long>(params.batch) * pages * params.heads_kv * rows;
  for (long long at = blockIdx.x; at < total; at += gridDim.x) {
    int const r = static_cast<int>(at % rows);
    int const h = static_cast<int>(at / rows % params.heads_kv);
    long long const slot = at / (static_cast<long long>(rows) * params.heads_kv);  // b * pages + j
    int const b = static_cast<int>(slot / pages), j = static_cast<int>(slot % pages);
    long long source = b;
    bool present = true;
    if (paged) {
      int const page = params.block_table[b * params.block_table_stride + j];
      present = rules::page_index_valid(page, params.num_pages);
      source = present ? page : 0;
      if (h == 0 && r == 0 && threadIdx.x == 0) copy.block_table[slot] = present ? static_cast<int>(slot) : -1;
    }
    const __nv_fp8_e4m3* k = static_cast<const __nv_fp8_e4m3*>(params.k) + source * params.k_batch_stride +
                             h * params.k_head_stride + r * params.k_row_stride;
    const __nv_fp8_e4m3* v = static_cast<const __nv_fp8_e4m3*>(params.v) + source * params.v_batch_stride +
                             h * params.v_head_stride + r * params.v_row_stride;
    long long const row = (slot * params.heads_kv + h) * rows + r;  // of the compact copy
    T* k_out = static_cast<T*>(copy.k) + row * params.head_dim;
    T* v_out = static_cast<T*>(copy.v) + row * params.head_dim;
    float const kd = descale_of(params.k_descale, params.k_descale_batch_stride, params.k_descale_head_stride, b, h);
    float const vd = descale_of(params.v_descale, params.v_descale_batch_stride, params.v_descale_head_stride, b, h);
    for (int c = threadIdx.x; c < params.head_dim; c += blockDim.x) {
      k_out[c] = static_cast<T>(present ? static_cast<float>(k[c]) * kd : 0.f);
      v_out[c] = static_cast<T>(present ? static_cast<float>(v[c]) * vd : 0.f);
    }
  }
}

template <typename T>
cudaError_t launch(const FwdParams& params, const DequantizedKV& copy, cudaStream_t stream) {
  long long const rows = static_cast<long long>(params.batch) * params.heads_kv * params.seqlen_k;
  if (rows == 0) return cudaSuccess;
  unsigned const blocks = static_cast<unsigned>(rows < 65536 * 4 ? rows : 65536 * 4);
  dequantize_kv_kernel<T><<<blocks, params.head_dim <= 64 ? 64 : 128, 0, stream>>>(params, copy);
  return cudaGetLastError();
}

}  // namespace

namespace {
// The copy's buffer: K, then V (2 bytes an element, compact), then the table (paged caches).
size_t dequantized_half_bytes(const FwdParams& params) {
  return static_cast<size_t>(params.batch) * params.heads_kv * params.seqlen_k * params.head_dim * 2;
}
}  // namespace

size_t dequantized_kv_bytes(const FwdParams& params) {
  bool const paged = params.block_table != nullptr;
  size_t const table = paged ? static_cast<size_t>(params.batch) * (params.seqlen_k / params.page_size) : 0;
  return 2 * dequantized_half_bytes(params) + table * sizeof(int);
}

DequantizedKV dequantized_kv_in(const FwdParams& params, void* buffer) {
  char* const base = static_cast<char*>(buffer);
  size_t const half = dequantized_half_bytes(params);
  return {base, base + half, reinterpret_cast<int*>(base + 2 * half)};
}

FwdParams dequantized_params(const FwdParams& params, const DequantizedKV& copy) {
  FwdParams p = params;
  bool const paged = params.block_table != nullptr;
  int const rows = paged ? params.page_size : params.seqlen_k;
  p.k = copy.k, p.v = copy.v;
  p.k_row_stride = p.v_row_stride = params.head_dim;
  p.k_head_stride = p.v_head_stride = static_cast<long long>(rows) * params.head_dim;
  p.k_batch_stride = p.v_batch_stride = p.k_head_stride * params.heads_kv;
  if (paged) {
    p.block_table = copy.block_table;
    p.block_table_stride = params.seqlen_k / params.page_size;
    p.num_pages = params.batch * static_cast<int>(p.block_table_stride);
  }
  p.kv_fp8 = false;
  p.k_descale = p.v_descale = nullptr;
  return p;
}

cudaError_t launch_dequantize_kv(const FwdParams& params, const DequantizedKV& copy, cudaStream_t stream) {
  switch (params.dtype) {
    case DType::kFloat16: return launch<__half>(params, copy, stream);
    case DType::kBFloat16: return launch<__nv_bfloat16>(params, copy, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace cutlassfa
