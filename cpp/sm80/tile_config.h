// The tile shapes of the SM80 tensor-core kernel per head dim (fp16 / bf16, and fp32 inputs), free of
// CuTe: kernel_traits.h builds its traits from them, and launch.cu tells the planner the tile of a call
// (sm80_tile, cutlassfa/launch.h).
#pragma once

namespace cutlassfa::sm80 {

// Tile shape per head dim, 4 warps. FlashAttention-2 uses 128 x 128 (d = 32, 64) and 128 x 64
// (d = 128) on H100; with this kernel 128 x 128 spills under the 255-register cap (nvcc 13, sm_90a:
// d=64 ~230 B, d=32 ~150 B): the accumulators (acc_o + acc_s = 192 floats per thread at 128x128
// d=64) leave too little room for the ldmatrix/cp.async addresses and softmax state.
//   d = 32 : 128 x  64   smem 16 KB   acc_o 32 + acc_s 64 floats per thread, no spills
//   d = 64 : 128 x  64   smem 32 KB   acc_o 64 + acc_s 64, no spills
//   d = 128: 128 x  64   smem 64 KB   acc_o 128 + acc_s 64: spills ~224 B (hoisted global offsets,
//            row sums) and is still the fastest measured (H200, same run as FA2, fp16): each warp
//            owns 32 rows, so every K/V fragment read by ldmatrix feeds two MMA rows, half the shared
//            memory traffic per FLOP of the spill-free 64 x 128 (16 rows per warp): 8x16x4096
//            3.05 vs 3.34 ms, 2x16x16384 12.90 vs 14.06 ms (FA2 3.20-3.32 and 13.24-13.50 ms).
template <int kHeadDim> struct TileConfig;
template <> struct TileConfig<32>  { static constexpr int kBlockM = 128, kBlockN = 64,  kNWarps = 4; };
template <> struct TileConfig<64>  { static constexpr int kBlockM = 128, kBlockN = 64,  kNWarps = 4; };
template <> struct TileConfig<96>  { static constexpr int kBlockM = 128, kBlockN = 64,  kNWarps = 4; };
template <> struct TileConfig<128> { static constexpr int kBlockM = 128, kBlockN = 64,  kNWarps = 4; };
// d = 256: 64-row Q tiles (one 16-row slab a warp) keep the O accumulator at 128 registers a thread.
template <> struct TileConfig<256> { static constexpr int kBlockM = 64,  kBlockN = 64,  kNWarps = 4; };
// Adding a head dim: a TileConfig line here (when none fits) and the head dim in CMakeLists.txt's
// CUTLASSFA_SM80_HEAD_DIMS (cpp/README.md).

// fp32 inputs (split-fp16 S, see FwdTraits::kSplitQK): Q and K take two fp16 tiles each (hi, lo) and
// the raw fp32 K or V tile needs a staging buffer, so smem is Q 2x, K 2x, V 1x in fp16 plus one
// fp32 K/V tile. d = 32, 64 keep the fp16 tiles (36 KB, 72 KB); d = 128 at 64 x 128 would need
// 192 KB, so it drops to 64 x 32 (72 KB, under the 99 KB of sm_86/sm_89; not a tuned shape).
template <int kHeadDim> struct TileConfigFp32 : TileConfig<kHeadDim> {};
template <> struct TileConfigFp32<96>  { static constexpr int kBlockM = 64, kBlockN = 32, kNWarps = 4; };
template <> struct TileConfigFp32<128> { static constexpr int kBlockM = 64, kBlockN = 32, kNWarps = 4; };

}  // namespace cutlassfa::sm80
