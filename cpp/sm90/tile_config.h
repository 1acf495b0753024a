// The tile shapes of the SM90 wgmma kernel per head dim (fp16 / bf16, and fp32 inputs), free of CuTe:
// kernel_traits.h builds its traits from them, and launch.cu tells the planner the tile of a call
// (sm90_tile, cutlassfa/launch.h).
#pragma once

namespace cutlassfa::sm90 {

// Tile per head dim: one warpgroup (4 warps) owns the whole 64-row Q tile, and several CTAs share
// an SM (registers: 168 at d = 64, ~228 at d = 128, no spills; smem 40 / 80 KB), so one CTA's
// softmax overlaps another's MMAs. Measured on an H100 (fp16, same run, TFLOP/s at (8,16,4096) and
// (2,16,16384), non-causal / causal), against 128 x 128 with two warpgroups per CTA (1 CTA per SM,
// both warpgroups in lockstep at the barriers) and 128 x 64 with two warpgroups (2 CTAs per SM):
//   d = 64 : 64 x 128, 3/SM: 456/405, 428/411   128 x 128: 314/286, 331/327   128 x 64: 393/363, 386/386
//   d = 128: 64 x 128, 2/SM: 510/441, 484/491   128 x 128: 449/407, 444/449   128 x 64: 406/393, 421/423
template <int kHeadDim> struct TileConfig;
template <> struct TileConfig<64>  { static constexpr int kBlockM = 64, kBlockN = 128, kMinBlocksPerSm = 3; };
template <> struct TileConfig<96>  { static constexpr int kBlockM = 64, kBlockN = 128, kMinBlocksPerSm = 2; };
template <> struct TileConfig<128> { static constexpr int kBlockM = 64, kBlockN = 128, kMinBlocksPerSm = 2; };
// d = 192, 256: 64-key tiles keep S (32 registers a thread) beside the wide O accumulator (96, 128).
template <> struct TileConfig<192> { static constexpr int kBlockM = 64, kBlockN = 64, kMinBlocksPerSm = 2; };
template <> struct TileConfig<256> { static constexpr int kBlockM = 64, kBlockN = 64, kMinBlocksPerSm = 2; };

// fp32 inputs: Q and K carry 2 d fp16 columns, [hi | lo] (launch_fp32.cu). d = 64: two warpgroups
// share each 64-row K/V tile, 2 CTAs per SM (128 registers); measured on an H100 (ms,
// (2,1,32768) non-causal / causal, (500,1,2048) non-causal / causal) against one warpgroup at
// 64 x 128, 2/SM and 64 x 64, 3/SM and 4/SM:
//   128 x 64, 2/SM: 2.071/1.025, 2.698/1.770     64 x 128, 2/SM: 2.119/1.161, 2.994/1.919
//   64 x 64, 3/SM:  2.097/1.104, 2.743/1.846     64 x 64, 4/SM:  2.026/1.113, 2.768/1.850
// (with Q and K then stored as three blocks, [hi hi lo] and [hi lo hi]). d = 128: the K tile shrinks
// to keep two CTAs per SM (smem 32 + 32 + 16 KB).
template <int kHeadDim> struct TileConfigFp32;
template <> struct TileConfigFp32<64>  { static constexpr int kBlockM = 128, kBlockN = 64, kMinBlocksPerSm = 2; };
template <> struct TileConfigFp32<96>  { static constexpr int kBlockM = 64, kBlockN = 64, kMinBlocksPerSm = 2; };
template <> struct TileConfigFp32<128> { static constexpr int kBlockM = 64, kBlockN = 64, kMinBlocksPerSm = 2; };

}  // namespace cutlassfa::sm90
