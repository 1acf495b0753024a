// The O(N^2) baseline: attention in three steps through global memory.
//
//   naive_scores_kernel   S = (scale * log2 e) Q K^T       -> workspace (B * Hq, seqlen_q, seqlen_k) fp32
//   naive_softmax_kernel  P = exp2(S - rowmax) / rowsum  in place over each row's keys [lo, hi), lse
//   naive_pv_kernel       O = P V                          over [lo, hi) of each row
//
// The mask (window, leftpad, per-entry lengths) is simt_common.cuh's EntryMask: the scores and P V
// kernels visit only the key tiles that tile_trips gives their 16 rows, the softmax only [lo, hi)
// of its row, so S outside those ranges is never written nor read. With softcap the scores are
// tanh(q.k * softcap_pre) * softmax_scale_log2 (softmax_scale is then the cap); ALiBi's term follows.
//
// Any head dim: the reduction chunks and output tiles past params.head_dim read zero and store
// nothing. The scores are kept in log2 units (Q K^T times softmax_scale_log2 = softmax_scale * log2 e) so the
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

// S tile (16 queries x 16 keys) per block iteration. Tiles past the entry's queries and key tiles
// that no row of the query tile sees are skipped (uniform per block).
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
  const bool softcap = params.softcap_pre > 0.f;
  const float kNegInf = __int_as_float(0xff800000);
  for (long long t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int n_tile = static_cast<int>(t % n_tiles);
    const int m_tile = static_cast<int>((t / n_tiles) % m_tiles);
    const long long bh = t / (static_cast<long long>(n_tiles) * m_tiles);
    const int b = static_cast<int>(bh / params.heads_q), h = static_cast<int>(bh % params.heads_q);
    const int h_kv = h / params.heads_ratio;
    const int m0 = m_tile * kNaiveTile, n0 = n_tile * kNaiveTile;
    const EntryMask entry = entry_mask(params, b);
    const int rows_valid = min(kNaiveTile, entry.nq - m0);
    if (rows_valid <= 0) continue;
    const TileTrips trips = entry.tile_trips(m0, m0 + rows_valid, kNaiveTile);
    if (n_tile < trips.first || n_tile >= trips.last) continue;
    const Storage* gQ = static_cast<const Storage*>(params.q) + b * params.q_batch_stride +
                        h * params.q_head_stride + entry.q_row0 * params.q_row_stride;  // (nq, D)
    // Thread (ty, tx) loads key n0 + ty; keys outside [leftpad, L) or on a missing page read as zero.
    const int load_key = n0 + ty;
    const bool key_exists =
        load_key >= entry.leftpad && load_key < entry.nk && key_page_exists(params, b, load_key);
    const Storage* gK_row = static_cast<const Storage*>(params.k) + h_kv * params.k_head_stride +
                            (key_exists ? key_offset(params, entry, b, load_key, params.k_batch_stride,
                                                     params.k_row_stride)
                                        : 0);  // (D)
    const int row = m0 + ty, key = n0 + tx;
    float acc = 0.f;
    for (int d0 = 0; d0 < params.head_dim; d0 += kNaiveTile) {
      // Thread (ty, tx) loads Q[m0 + ty][d0 + tx] and K[n0 + ty][d0 + tx]: coalesced along d.
      const bool col_exists = d0 + tx < params.head_dim;
      sQ[ty][tx] = row < entry.nq && col_exists ? Tr::to_float(gQ[row * params.q_row_stride + d0 + tx]) : 0.f;
      sK[ty][tx] = key_exists && col_exists ? Tr::to_float(gK_row[d0 + tx]) : 0.f;
      __syncthreads();
#pragma unroll
      for (int d = 0; d < kNaiveTile; ++d) acc = fmaf(sQ[ty][d], sK[tx][d], acc);
      __syncthreads();
    }
    if (row < entry.nq && key < entry.nk) {
      float s = (softcap ? rules::softcap_tanh(acc * params.softcap_pre) : acc) * params.softmax_scale_log2;
      if (params.alibi_slopes != nullptr) {  // ALiBi (rules.h), in log2 units: slope * log2(e) per key of distance
        const float slope = params.alibi_slopes[b * params.alibi_batch_stride + h];
        s -= slope * 1.44269504088896341f * rules::alibi_distance(row, entry.nq, entry.nk, key);
      }
      // A key on a missing page counts as masked (rules.h): -inf, which the softmax maps to P = 0.
      const bool key_there = key < entry.leftpad || key_page_exists(params, b, key);
      S[naive_s_offset(bh, row, params) + key] = key_there ? s : kNegInf;
    }
  }
}

// One warp per row: max, sum, normalize over the row's keys [lo, hi). A row that sees no key
// writes nothing (P V never reads past [lo, hi)) and lse = -inf (the sink's, with one).
__global__ void __launch_bounds__(256) naive_softmax_kernel(const FwdParams params, float* S) {
  const float kNegInf = __int_as_float(0xff800000);
  const int lane = threadIdx.x % 32;
  const long long rows = static_cast<long long>(params.batch) * params.heads_q * params.seqlen_q;
  const long long warps_per_grid = static_cast<long long>(gridDim.x) * (blockDim.x / 32);
  for (long long r = blockIdx.x * static_cast<long long>(blockDim.x / 32) + threadIdx.x / 32; r < rows;
       r += warps_per_grid) {
    const int row = static_cast<int>(r % params.seqlen_q);
    const long long bh = r / params.seqlen_q;
    const int b = static_cast<int>(bh / params.heads_q), h = static_cast<int>(bh % params.heads_q);
    const EntryMask entry = entry_mask(params, b);
    if (row >= entry.nq) continue;  // uniform per warp
    int lo, hi;
    entry.row_range(row, lo, hi);
    float* s = S + naive_s_offset(bh, row, params);
    float m = kNegInf;
    for (int j = lo + lane; j < hi; j += 32) m = fmaxf(m, s[j]);
    m = group_max<32>(m);
    // Every key of [lo, hi) masked (on missing pages): m = -inf; subtract 0 instead, so P = 0 and l = 0.
    const float m_sub = m == kNegInf ? 0.f : m;
    float l = 0.f;
    for (int j = lo + lane; j < hi; j += 32) l += exp2f(s[j] - m_sub);
    l = group_sum<32>(l);
    float inv_l = l > 0.f ? 1.f / l : 0.f;
    // ln(sum_j exp(scale * q.k_j)) = (m + log2 l) * ln 2, with m and s in log2 units (a NaN l stays NaN).
    float lse = hi > lo && l != 0.f ? (m + log2f(l)) * 0.693147180559945309f : kNegInf;
    if (params.sinks != nullptr) {  // the sink's term (rules.h)
      const float sinked =
          rules::lse_with_sink(lse, params.sinks[h * params.sinks_head_stride + row * params.sinks_row_stride]);
      inv_l *= rules::sink_out_scale(lse, sinked);
      lse = sinked;
    }
    for (int j = lo + lane; j < hi; j += 32) s[j] = exp2f(s[j] - m_sub) * inv_l;
    if (params.lse != nullptr && lane == 0) { params.lse[lse_offset(params, entry, b, h, row)] = lse; }
  }
}

// O tile (16 queries x 16 head-dim columns) per block iteration over the key tiles the rows see;
// each row takes P only inside its own [lo, hi) (0 elsewhere).
template <typename T>
__global__ void __launch_bounds__(kNaiveTile* kNaiveTile) naive_pv_kernel(const FwdParams params, const float* S) {
  using Storage = typename ElementTraits<T>::Storage;
  using Tr = ElementTraits<T>;
  __shared__ float sP[kNaiveTile][kNaiveTile + 1];  // (rows, keys)
  __shared__ float sV[kNaiveTile][kNaiveTile + 1];  // (keys, d)
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int m_tiles = (params.seqlen_q + kNaiveTile - 1) / kNaiveTile;
  const int d_tiles = (params.head_dim + kNaiveTile - 1) / kNaiveTile;
  const long long tiles = static_cast<long long>(d_tiles) * m_tiles * params.batch * params.heads_q;
  for (long long t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int d_tile = static_cast<int>(t % d_tiles);
    const int m_tile = static_cast<int>((t / d_tiles) % m_tiles);
    const long long bh = t / (static_cast<long long>(d_tiles) * m_tiles);
    const int b = static_cast<int>(bh / params.heads_q), h = static_cast<int>(bh % params.heads_q);
    const int h_kv = h / params.heads_ratio;
    const int m0 = m_tile * kNaiveTile, c0 = d_tile * kNaiveTile;
    const EntryMask entry = entry_mask(params, b);
    const int rows_valid = min(kNaiveTile, entry.nq - m0);
    if (rows_valid <= 0) continue;
    const TileTrips trips = entry.tile_trips(m0, m0 + rows_valid, kNaiveTile);
    const int row = m0 + ty;
    const bool col_exists = c0 + tx < params.head_dim;
    int lo = 0, hi = 0;  // keys of this thread's row; none past the entry's queries
    if (row < entry.nq) entry.row_range(row, lo, hi);
    const float* s_row = S + naive_s_offset(bh, row < entry.nq ? row : 0, params);
    const Storage* gV = static_cast<const Storage*>(params.v) + h_kv * params.v_head_stride + c0 + tx;
    float acc = 0.f;
    for (int n_tile = trips.first; n_tile < trips.last; ++n_tile) {
      const int n0 = n_tile * kNaiveTile;
      // Thread (ty, tx) loads P[m0 + ty][n0 + tx] and V[n0 + ty][c0 + tx]; keys outside [leftpad, L)
      // read as zero (0 * NaN would be NaN).
      const int p_key = n0 + tx, v_key = n0 + ty;
      sP[ty][tx] = p_key >= lo && p_key < hi ? s_row[p_key] : 0.f;
      const bool v_exists = v_key >= entry.leftpad && v_key < entry.nk && key_page_exists(params, b, v_key);
      sV[ty][tx] = v_exists && col_exists
                       ? Tr::to_float(gV[key_offset(params, entry, b, v_key, params.v_batch_stride, params.v_row_stride)])
                       : 0.f;
      __syncthreads();
#pragma unroll
      for (int j = 0; j < kNaiveTile; ++j) acc = fmaf(sP[ty][j], sV[j][tx], acc);
      __syncthreads();
    }
    if (row < entry.nq && col_exists) {
      Storage* gO = static_cast<Storage*>(params.o) + b * params.o_batch_stride + h * params.o_head_stride +
                    entry.q_row0 * params.o_row_stride;
      gO[row * params.o_row_stride + c0 + tx] = Tr::from_float(acc);
    }
  }
}

}  // namespace simt
}  // namespace cutlassfa
