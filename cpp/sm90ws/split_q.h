// fp32 Q on the warp-specialized kernel: the producer loads a tile's Q as it is (kBlockM x d floats,
// into the staging buffer), and each consumer warpgroup splits its own 64 rows into the [hi | lo] fp16
// rows of the Q tile that its S = Q K^T reads (common/split_half.h), before its first GEMM of the tile.
// Q then costs the fp32 read alone, where the pre-pass read it, wrote the halves and the kernel read
// them back. K and V, read by every Q tile of their head, still come split by the pre-pass.
#pragma once

#include <cute/tensor.hpp>

#include <cutlass/arch/barrier.h>

#include "common/split_half.h"
#include "sm90ws/kernel_traits.h"

namespace cutlassfa::sm90ws {

using namespace cute;

// thread_idx: 0 .. kNConsumerThreads - 1 among the consumers; the whole warpgroup calls it. The Q tile
// (q_buffer) holds this warpgroup's O of its last tile until its epilogue has read it back (O is
// staged over Q, kernel_traits.h), hence the barrier before the writes; the fence and the barrier
// after them make the writes visible to wgmma, which reads shared memory through the async proxy.
template <class Traits>
__forceinline__ __device__ void split_q_rows(typename Traits::SharedStorage& storage, int q_buffer, int thread_idx) {
  static_assert(Traits::kSplitQK);
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kGroupsPerRow = kHeadDim / 8;  // eight floats a thread and step
  int const wg = thread_idx / 128;
  uint32_t const barrier = static_cast<uint32_t>(NamedBarriers::kEpilogue0) + wg;
  Tensor sQf = make_tensor(make_smem_ptr(storage.q_load(q_buffer)), typename Traits::SmemLayoutQLoad{});  // (kBlockM, d)
  Tensor sQ = make_tensor(make_smem_ptr(storage.q_tile(q_buffer)), typename Traits::SmemLayoutQ{});  // (kBlockM, 2d)
  cutlass::arch::NamedBarrier::sync(128, barrier);
  CUTE_NO_UNROLL  // unrolled, its addresses were hoisted out of the tile loop and held: 200 bytes spilled at d = 64
  for (int i = 0; i < 64 * kGroupsPerRow / 128; ++i) {
    int const group = thread_idx % 128 + 128 * i;
    int const row = 64 * wg + group / kGroupsPerRow;
    int const col = group % kGroupsPerRow * 8;
    // 16-byte chunks stay whole under the 128-byte swizzle: four floats, or eight halves.
    SplitEight const s = split_eight(*reinterpret_cast<float4 const*>(&sQf(row, col)),
                                     *reinterpret_cast<float4 const*>(&sQf(row, col + 4)));
    *reinterpret_cast<uint4*>(&sQ(row, col)) = s.hi;
    *reinterpret_cast<uint4*>(&sQ(row, col + kHeadDim)) = s.lo;
  }
  cutlass::arch::fence_view_async_shared();
  cutlass::arch::NamedBarrier::sync(128, barrier);
}

}  // namespace cutlassfa::sm90ws
