// The O(N^2) baseline: attention in three steps through global memory.
//
//   naive_scores_kernel   S = (scale * log2 e) Q K^T       -> workspace (B * Hq, seqlen_q, seqlen_k) fp32
//   naive_softmax_kernel  P = exp2(S - rowmax) / rowsum  in place (causal mask applied here), lse
//   naive_pv_kernel       O = P V
//
// The scores are kept in log2 units (Q K^T times softmax_scale_log2 = softmax_scale * log2 e) so the
// softmax is exp2f(s - m) and lse = (m + log2 l) * ln 2. Every kernel walks its tiles with a grid-stride
// loop over one flattened index (tile fastest, then batch * head), so any batch * heads fits the grid.
//
// NVRTC-compilable for sm_61: includes only params.h and the fp16/bf16 headers.
#pragma once

#include "simt_common.cuh"

namespace cutlassfa {
namespace simt {

constexpr int kNaiveTile = 16;  // 16 x 16 output tiles, 16 x 16 threads, 16-wide reduction chunks

// Workspace row of S for (bh, row): 64-bit offsets.
__device__ __forceinline__ long long naive_s_offset(long long bh, int row, const FwdParams& p) {
  return (bh * p.seqlen_q + row) * static_cast<long long>(p.seqlen_k);
}

// S tile (16 queries x 16 keys) per block iteration. Key tiles that the causal mask hides from every
// row of the query tile are skipped (the softmax never reads them).
template <typename T>
__global__ void __launch_bounds__(kNaiveTile* kNaiveTile) naive_scores_kernel(const FwdParams params, float* S) {
  using Storage = typename ElementTraits<T>::Storage;
  using Tr = ElementTraits<T>;
  __shared__ float sQ[kNaiveTile][kNaiveTile + 1];  // (rows, d chunk)
  __shared__ float sK[kNaiveTile][kNaiveTile + 1];  // (keys, d chunk)
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int m_tiles = (params.seqlen_q + kNaiveTile - 1) / kNaiveTile;
  const int n_tiles = (params.seqlen_k + kNaiveTile - 1) / kNaiveTile;
  const long long tiles = static_cast<long long>(n_tiles) * m_tiles * params.batch * params.heads_q;
  for (long long t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int n_tile = static_cast<int>(t % n_tiles);
    const int m_tile = static_cast<int>((t / n_tiles) % m_tiles);
    const long long bh = t / (static_cast<long long>(n_tiles) * m_tiles);
    const int b = static_cast<int>(bh / params.heads_q), h = static_cast<int>(bh % params.heads_q);
    const int h_kv = h / params.heads_ratio;
    const int m0 = m_tile * kNaiveTile, n0 = n_tile * kNaiveTile;
    if ((params.window_right >= 0)) {
      const int last_row = min(m0 + kNaiveTile, params.seqlen_q) - 1;
      if (n0 > causal_last_key(last_row, params.seqlen_q, params.seqlen_k)) continue;  // uniform per block
    }
    const Storage* gQ = static_cast<const Storage*>(params.q) + b * params.q_batch_stride + h * params.q_head_stride;
    const Storage* gK =
        static_cast<const Storage*>(params.k) + b * params.k_batch_stride + h_kv * params.k_head_stride;
    const int row = m0 + ty, key = n0 + tx;
    float acc = 0.f;
    for (int d0 = 0; d0 < params.head_dim; d0 += kNaiveTile) {
      // Thread (ty, tx) loads Q[m0 + ty][d0 + tx] and K[n0 + ty][d0 + tx]: coalesced along d.
      sQ[ty][tx] = m0 + ty < params.seqlen_q ? Tr::to_float(gQ[(m0 + ty) * params.q_row_stride + d0 + tx]) : 0.f;
      sK[ty][tx] = n0 + ty < params.seqlen_k ? Tr::to_float(gK[(n0 + ty) * params.k_row_stride + d0 + tx]) : 0.f;
      __syncthreads();
#pragma unroll
      for (int d = 0; d < kNaiveTile; ++d) acc = fmaf(sQ[ty][d], sK[tx][d], acc);
      __syncthreads();
    }
    if (row < params.seqlen_q && key < params.seqlen_k) {
      S[naive_s_offset(bh, row, params) + key] = acc * params.softmax_scale_log2;
    }
  }
}

// One warp per row: max, sum, normalize; masked keys (past the causal limit) get P = 0.
// A row that sees no key writes P = 0 everywhere and lse = -inf.
__global__ void __launch_bounds__(256) naive_softmax_kernel(const FwdParams params, float* S) {
  const float kNegInf = __int_as_float(0xff800000);
  const int lane = threadIdx.x % 32;
  const long long rows = static_cast<long long>(params.batch) * params.heads_q * params.seqlen_q;
  const long long warps_per_grid = static_cast<long long>(gridDim.x) * (blockDim.x / 32);
  for (long long r = blockIdx.x * static_cast<long long>(blockDim.x / 32) + threadIdx.x / 32; r < rows;
       r += warps_per_grid) {
    const int row = static_cast<int>(r % params.seqlen_q);
    const long long bh = r / params.seqlen_q;
    float* s = S + naive_s_offset(bh, row, params);
    const int visible =
        (params.window_right >= 0)
            ? max(0, min(params.seqlen_k, causal_last_key(row, params.seqlen_q, params.seqlen_k) + 1))
            : params.seqlen_k;
    float m = kNegInf;
    for (int j = lane; j < visible; j += 32) m = fmaxf(m, s[j]);
    m = group_max<32>(m);
    float l = 0.f;
    for (int j = lane; j < visible; j += 32) l += exp2f(s[j] - m);
    l = group_sum<32>(l);
    const float inv_l = l > 0.f ? 1.f / l : 0.f;
    for (int j = lane; j < params.seqlen_k; j += 32) s[j] = j < visible ? exp2f(s[j] - m) * inv_l : 0.f;
    if (params.lse != nullptr && lane == 0) {
      // ln(sum_j exp(scale * q.k_j)) = (m + log2 l) * ln 2, with m and s in log2 units.
      params.lse[r] = visible > 0 ? (m + log2f(l)) * 0.693147180559945309f : kNegInf;
    }
  }
}

// O tile (16 queries x 16 head-dim columns) per block iteration; the key loop stops at the causal
// limit of the tile's last row (P is 0 beyond each row's own limit).
template <typename T>
__global__ void __launch_bounds__(kNaiveTile* kNaiveTile) naive_pv_kernel(const FwdParams params, const float* S) {
  using Storage = typename ElementTraits<T>::Storage;
  using Tr = ElementTraits<T>;
  __shared__ float sP[kNaiveTile][kNaiveTile + 1];  // (rows, keys)
  __shared__ float sV[kNaiveTile][kNaiveTile + 1];  // (keys, d)
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int m_tiles = (params.seqlen_q + kNaiveTile - 1) / kNaiveTile;
  const int d_tiles = params.head_dim / kNaiveTile;
  const long long tiles = static_cast<long long>(d_tiles) * m_tiles * params.batch * params.heads_q;
  for (long long t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int d_tile = static_cast<int>(t % d_tiles);
    const int m_tile = static_cast<int>((t / d_tiles) % m_tiles);
    const long long bh = t / (static_cast<long long>(d_tiles) * m_tiles);
    const int b = static_cast<int>(bh / params.heads_q), h = static_cast<int>(bh % params.heads_q);
    const int h_kv = h / params.heads_ratio;
    const int m0 = m_tile * kNaiveTile, c0 = d_tile * kNaiveTile;
    int n_end = params.seqlen_k;
    if ((params.window_right >= 0)) {
      const int last_row = min(m0 + kNaiveTile, params.seqlen_q) - 1;
      n_end = max(0, min(n_end, causal_last_key(last_row, params.seqlen_q, params.seqlen_k) + 1));
    }
    const Storage* gV =
        static_cast<const Storage*>(params.v) + b * params.v_batch_stride + h_kv * params.v_head_stride;
    const int row = m0 + ty;
    float acc = 0.f;
    for (int n0 = 0; n0 < n_end; n0 += kNaiveTile) {
      // Thread (ty, tx) loads P[m0 + ty][n0 + tx] and V[n0 + ty][c0 + tx].
      sP[ty][tx] = (row < params.seqlen_q && n0 + tx < n_end) ? S[naive_s_offset(bh, row, params) + n0 + tx] : 0.f;
      sV[ty][tx] = n0 + ty < n_end ? Tr::to_float(gV[(n0 + ty) * params.v_row_stride + c0 + tx]) : 0.f;
      __syncthreads();
#pragma unroll
      for (int j = 0; j < kNaiveTile; ++j) acc = fmaf(sP[ty][j], sV[j][tx], acc);
      __syncthreads();
    }
    if (row < params.seqlen_q) {
      Storage* gO = static_cast<Storage*>(params.o) + b * params.o_batch_stride + h * params.o_head_stride;
      gO[row * params.o_row_stride + c0 + tx] = Tr::from_float(acc);
    }
  }
}

}  // namespace simt
}  // namespace cutlassfa
