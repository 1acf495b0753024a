// Device helpers shared by the CUDA-core kernels (naive, small_tile, large_tile): element types,
// 16-byte global loads, warp reductions.
//
// NVRTC-compilable for sm_61 (tests/test_nvrtc_sm61.py): includes only params.h and the fp16/bf16
// headers, uses `long long` for 64-bit offsets and only conversion intrinsics that exist on sm_61.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cutlassfa/params.h"

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

// Last key column (inclusive) visible to query row `row` under the bottom-right aligned causal mask:
// query i sees key j iff j <= i + seqlen_k - seqlen_q.
__device__ __forceinline__ int causal_last_key(int row, int seqlen_q, int seqlen_k) {
  return row + seqlen_k - seqlen_q;
}

}  // namespace simt
}  // namespace cutlassfa
