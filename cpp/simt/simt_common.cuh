// Device helpers shared by the CUDA-core kernels (naive, small_tile, large_tile): element types,
// 16-byte global loads, warp reductions, per-entry extents and the mask.
//
// NVRTC-compilable for sm_61 (tests/test_nvrtc_simt.py): includes only params.h, rules.h and the
// fp16/bf16 headers, uses `long long` for 64-bit offsets and only conversion intrinsics that exist on sm_61.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/opaque.h"
#include "cutlassfa/params.h"
#include "cutlassfa/rules.h"

namespace cutlassfa {
namespace simt {

// ------------------------------------------------------------------------------------------------
// Element types. Global tensors are read as raw bits (`Storage`) in 16-byte chunks (`uint4`) and
// converted to fp32 when they are written to shared memory; all math is fp32.
// ------------------------------------------------------------------------------------------------
template <typename T>
struct ElementTraits;

template <>
struct ElementTraits<float> {
  using Storage = float;
  static constexpr int kVec = 4;  // elements per 16-byte chunk
  __device__ __forceinline__ static void unpack(const uint4& r, float* f) {
    f[0] = __uint_as_float(r.x);
    f[1] = __uint_as_float(r.y);
    f[2] = __uint_as_float(r.z);
    f[3] = __uint_as_float(r.w);
  }
  __device__ __forceinline__ static unsigned bits(Storage x) { return __float_as_uint(x); }
  __device__ __forceinline__ static float to_float(Storage x) { return x; }
  __device__ __forceinline__ static Storage from_float(float x) { return x; }
};

template <>
struct ElementTraits<__half> {
  using Storage = unsigned short;
  static constexpr int kVec = 8;
  __device__ __forceinline__ static float to_float(Storage x) { return __half2float(__ushort_as_half(x)); }
  __device__ __forceinline__ static Storage from_float(float x) { return __half_as_ushort(__float2half_rn(x)); }
  __device__ __forceinline__ static unsigned bits(Storage x) { return x; }
  __device__ __forceinline__ static void unpack(const uint4& r, float* f) {
    const unsigned w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      f[2 * i] = to_float(static_cast<Storage>(w[i] & 0xffffu));
      f[2 * i + 1] = to_float(static_cast<Storage>(w[i] >> 16));
    }
  }
};

// bf16: __bfloat162float / __float2bfloat16 exist on every architecture (software on sm_61).
template <>
struct ElementTraits<__nv_bfloat16> {
  using Storage = unsigned short;
  static constexpr int kVec = 8;
  __device__ __forceinline__ static float to_float(Storage x) {
    return __bfloat162float(__ushort_as_bfloat16(x));
  }
  __device__ __forceinline__ static Storage from_float(float x) {
    return __bfloat16_as_ushort(__float2bfloat16(x));
  }
  __device__ __forceinline__ static unsigned bits(Storage x) { return x; }
  __device__ __forceinline__ static void unpack(const uint4& r, float* f) {
    const unsigned w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      f[2 * i] = to_float(static_cast<Storage>(w[i] & 0xffffu));
      f[2 * i + 1] = to_float(static_cast<Storage>(w[i] >> 16));
    }
  }
};

// One 16-byte chunk (kVec elements) of a row: a vector load when `vec` (pointer and strides allow
// 16-byte alignment), element loads otherwise. Packed into uint4 so both paths unpack alike.
template <typename T>
__device__ __forceinline__ uint4 load_chunk(const typename ElementTraits<T>::Storage* p, bool vec) {
  using Tr = ElementTraits<T>;
  if (vec) return __ldg(reinterpret_cast<const uint4*>(p));
  unsigned w[4];
  if (Tr::kVec == 4) {
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = Tr::bits(p[i]);
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = Tr::bits(p[2 * i]) | (Tr::bits(p[2 * i + 1]) << 16);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// Stores 4 consecutive fp32 values as T: one 16-byte (fp32) or 8-byte (fp16/bf16) store when `vec`.
template <typename T>
__device__ __forceinline__ void store4(typename ElementTraits<T>::Storage* p, const float* f, bool vec) {
  using Tr = ElementTraits<T>;
  if (vec) {
    if (Tr::kVec == 4) {
      *reinterpret_cast<float4*>(p) = make_float4(f[0], f[1], f[2], f[3]);
    } else {
      const unsigned lo = Tr::bits(Tr::from_float(f[0])) | (Tr::bits(Tr::from_float(f[1])) << 16);
      const unsigned hi = Tr::bits(Tr::from_float(f[2])) | (Tr::bits(Tr::from_float(f[3])) << 16);
      *reinterpret_cast<uint2*>(p) = make_uint2(lo, hi);
    }
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) p[i] = Tr::from_float(f[i]);
  }
}

// True when the pointer and every stride allow 16-byte chunks: base % 16 == 0, strides % kVec == 0.
template <typename T>
__device__ __forceinline__ bool chunk_aligned(const void* ptr, long long s0, long long s1, long long s2) {
  constexpr long long kVec = ElementTraits<T>::kVec;
  return (reinterpret_cast<unsigned long long>(ptr) & 15ull) == 0 && s0 % kVec == 0 && s1 % kVec == 0 &&
         s2 % kVec == 0;
}

// ------------------------------------------------------------------------------------------------
// Reductions over the `Width` consecutive lanes that share a row (Width a power of two <= 32).
// ------------------------------------------------------------------------------------------------
template <int Width>
__device__ __forceinline__ float group_max(float x) {
#pragma unroll
  for (int off = Width / 2; off > 0; off /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, off));
  return x;
}

template <int Width>
__device__ __forceinline__ float group_sum(float x) {
#pragma unroll
  for (int off = Width / 2; off > 0; off /= 2) x += __shfl_xor_sync(0xffffffffu, x, off);
  return x;
}

// ------------------------------------------------------------------------------------------------
// Per-entry extents and the mask: rules.h's lengths and row range, with the trip counts of
// python/cutlassfa/masks.py (tile_trips). Everything here is
// evaluated once per tile, never per element. Host-callable too: selftest.cu checks the tile trips
// and the element mask against the pair-by-pair rule without a GPU.
// ------------------------------------------------------------------------------------------------
struct TileTrips {
  int first, unmasked_begin, unmasked_end, last;  // first <= unmasked_begin <= unmasked_end <= last
  __host__ __device__ __forceinline__ bool is_masked(int n_block) const {
    return n_block < unmasked_begin || n_block >= unmasked_end;
  }
};

struct EntryMask {
  int nq;            // queries of the entry (rows >= nq of a tile do nothing)
  int nk;            // keys of the entry: L
  int leftpad;       // keys [0, leftpad) are hidden, 0 <= leftpad <= nk
  int window_left;   // -1: unbounded
  int window_right;  // -1: unbounded
  long long q_row0;  // first row of the entry in q, o and lse (varlen), else 0
  long long k_row0;  // first row of the entry in k and v (varlen without pages), else 0

  // Keys [lo, hi) that query `row` sees (rules.h), lo == hi when none.
  __host__ __device__ __forceinline__ void row_range(int row, int& lo, int& hi) const {
    lo = min(rules::mask_row_lo(row, nq, nk, window_left, leftpad), nk);
    hi = max(rules::mask_row_hi(row, nq, nk, window_right), lo);
  }

  // Key tiles of block_n keys that rows [row_start, row_stop) visit; see masks.tile_trips for why the
  // first and last rows suffice (lo and hi never decrease with the row).
  __host__ __device__ __forceinline__ TileTrips tile_trips(int row_start, int row_stop, int block_n) const {
    TileTrips t{0, 0, 0, 0};
    if (row_stop <= row_start) return t;
    int lo_first, hi_first, lo_last, hi_last;
    row_range(row_start, lo_first, hi_first);
    row_range(row_stop - 1, lo_last, hi_last);
    if (hi_last <= lo_first) return t;  // every row's range is empty
    t.first = lo_first / block_n;
    t.last = (hi_last + block_n - 1) / block_n;
    t.unmasked_begin = min(max((lo_last + block_n - 1) / block_n, t.first), t.last);
    t.unmasked_end = min(max(hi_first / block_n, t.unmasked_begin), t.last);
    return t;
  }
};

// Entry b's extents (rules.h): nq clamped to [0, seqlen_q] (the grid), L to [0, seqlen_k] (the
// capacity, or the longest varlen entry), a varlen entry's first rows and lengths to its packed arrays,
// leftpad to [0, L], so that nothing is read outside the tensors.
__device__ __forceinline__ EntryMask entry_mask(const FwdParams& p, int b) {
  EntryMask e;
  e.q_row0 = 0;
  e.k_row0 = 0;
  e.nq = p.seqlen_q;
  e.nk = p.seqlen_k;
  if (p.cu_seqlens_q != nullptr) {
    e.q_row0 = rules::varlen_entry_begin(p.cu_seqlens_q[b], p.total_q);
    e.nq = rules::varlen_entry_rows(p.cu_seqlens_q[b], p.cu_seqlens_q[b + 1], p.seqlen_q, p.total_q);
  }
  if (p.cu_seqlens_k != nullptr) {
    if (p.block_table == nullptr) e.k_row0 = rules::varlen_entry_begin(p.cu_seqlens_k[b], p.total_k);
    e.nk = rules::varlen_entry_rows(p.cu_seqlens_k[b], p.cu_seqlens_k[b + 1], p.seqlen_k, p.total_k);
  } else if (p.seqlens_k != nullptr) {
    e.nk = rules::cache_entry_keys(p.seqlens_k[b], p.seqlens_k_added, p.seqlen_k);
  }
  e.leftpad = p.leftpad_k != nullptr ? rules::entry_leftpad(p.leftpad_k[b], e.nk) : 0;
  e.window_left = p.window_left;
  e.window_right = p.window_right;
  return e;
}

// Whether key `key` of entry b (below its L) has a row to read: always without pages; with pages,
// when its page index is within [0, num_pages) (rules.h: a key on a missing page is masked, never read).
__device__ __forceinline__ bool key_page_exists(const FwdParams& p, int b, int key) {
  if (p.block_table == nullptr) return true;
  const int slot = rules::page_slot_of_key(key, p.page_size, p.page_size_log2);
  return rules::page_index_valid(p.block_table[b * p.block_table_stride + slot], p.num_pages);
}

// Where key `key` of entry b lives, in elements from the start of k (or v): row k_row0 + key of
// batch b, or row key % page_size of page block_table[b][key / page_size]. Call only for keys below
// the entry's L whose page exists (key_page_exists).
__device__ __forceinline__ long long key_offset(const FwdParams& p, const EntryMask& e, int b, int key,
                                                long long batch_stride, long long row_stride) {
  if (p.block_table == nullptr) return b * batch_stride + (e.k_row0 + key) * row_stride;
  const int slot = rules::page_slot_of_key(key, p.page_size, p.page_size_log2);
  const int page = p.block_table[b * p.block_table_stride + slot];
  return page * batch_stride + rules::row_in_page(key, slot, p.page_size, p.page_size_log2) * row_stride;
}

// Whether some key of [key_begin, key_end) of entry b lies on a missing page, for the whole warp (every
// lane must call): lane i reads the entry of the range's i-th page. Paged caches only.
__device__ __forceinline__ bool any_page_missing(const FwdParams& p, int b, int key_begin, int key_end) {
  bool missing = false;
  if (key_begin < key_end) {
    const int* table = p.block_table + b * p.block_table_stride;
    const int last = rules::page_slot_of_key(key_end - 1, p.page_size, p.page_size_log2);
    for (int slot = rules::page_slot_of_key(key_begin, p.page_size, p.page_size_log2) + static_cast<int>(threadIdx.x % 32);
         slot <= last; slot += 32) {
      missing |= !rules::page_index_valid(table[slot], p.num_pages);
    }
  }
  return __any_sync(0xffffffffu, missing);
}

// Row offset of entry e's lse row `row` of head h.
__device__ __forceinline__ long long lse_offset(const FwdParams& p, const EntryMask& e, int b, int h, int row) {
  return b * p.lse_batch_stride + h * p.lse_head_stride + e.q_row0 + row;
}

}  // namespace simt
}  // namespace cutlassfa
