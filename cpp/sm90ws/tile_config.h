// The tile shapes of the warp-specialized Hopper kernel per head dim (fp16 / bf16, fp32 and fp8 inputs), free
// of CuTe: kernel_traits.h builds its traits from them, and launch.cu tells the planner the tile of a
// call (sm90ws_tile, cutlassfa/launch.h).
#pragma once

#include "sm90ws/tile_overrides.h"  // generated: empty unless a measurement build overrides tiles

namespace cutlassfa::sm90ws {

// Tile per head dim: kBlockM query rows (64 per consumer warpgroup), kBlockN keys per K/V step, kStages
// buffers in each of the K and V rings, and whether the consumer warpgroups take turns at the tensor
// cores (ping-pong). FlashAttention-3's choices (hopper/tile_size.h; ping-pong up to d = 128, as its
// UseSchedulerBarrier), within what one register-resident P (the A operand of P V) allows:
//  - d = 64 and 96: three consumer warpgroups (192 rows) so that two softmaxes run under one warpgroup's
//    GEMMs (the exponentials cost as much as at d = 128, the GEMMs less). 160 registers a consumer
//    thread: S + P + O are 64 + 32 + 32 at d = 64 x 128 keys, 48 + 24 + 48 at d = 96 x 96 keys
//    (112 keys spilled 16 bytes; FA3 takes 144 keys at d = 96 with P through shared memory instead).
//  - d = 128: 128 x 128 (FA3: 176 keys without a causal mask).
//  - d = 192 / 256: two consumer warpgroups, 112 / 80 keys (FA3's), the most that two stages of K and V beside
//    the Q tile fit in 227 KB (216 KB / 224 KB). S + P + O = 56 + 28 + 96 and 40 + 20 + 128 of 240.
//    The GEMMs are long beside the softmax: no turns.
// Measurement builds may override a row by defining CUTLASSFA_SM90WS_TILE_D<d> (or _F32_D<d>, _FP8_D<d>) as
// kBlockM, kBlockN, kStages, ping-pong (kBlockM 128 or 192, kBlockN a multiple of 16) in the generated
// sm90ws/tile_overrides.h: cpp/sm90ws/selftest.sh TILES="96=128,128,2,1", or the package build's
// -DCUTLASSFA_SM90WS_TILES="D96=128,128,2,1" (cpp/CMakeLists.txt).
template <int kBlockM_, int kBlockN_, int kStages_, bool kPingPong_>
struct TileShape {
  static constexpr int kBlockM = kBlockM_, kBlockN = kBlockN_, kStages = kStages_;
  static constexpr bool kPingPong = kPingPong_;
};
#ifndef CUTLASSFA_SM90WS_TILE_D64
#define CUTLASSFA_SM90WS_TILE_D64 192, 128, 2, true
#endif
#ifndef CUTLASSFA_SM90WS_TILE_D96
#define CUTLASSFA_SM90WS_TILE_D96 192, 96, 2, true
#endif
#ifndef CUTLASSFA_SM90WS_TILE_D128
#define CUTLASSFA_SM90WS_TILE_D128 128, 128, 2, true
#endif
#ifndef CUTLASSFA_SM90WS_TILE_D192
#define CUTLASSFA_SM90WS_TILE_D192 128, 112, 2, false
#endif
#ifndef CUTLASSFA_SM90WS_TILE_D256
#define CUTLASSFA_SM90WS_TILE_D256 128, 80, 2, false
#endif
// fp32 inputs (split into fp16 [hi | lo], cutlassfa/split_fp32.h): S = Q K^T runs three d-deep products,
// so a step at d = 64 costs the tensor cores what a d = 128 step does; S, P and O take 64 + 32 + 32
// registers, as at fp16. d = 64, H200, the HW4 shapes (bench/NOTES-tensorcore.md): 192 x 128 (48 bytes
// spilled) 6 % faster than 128 x 128 at (500, 2048, 64), within 3 % at (2, 32768, 64), where 128 x 176
// was 4 % faster but 2-6 % slower at N = 2048.
#ifndef CUTLASSFA_SM90WS_TILE_F32_D64
#define CUTLASSFA_SM90WS_TILE_F32_D64 192, 128, 2, true
#endif
#ifndef CUTLASSFA_SM90WS_TILE_F32_D128
#define CUTLASSFA_SM90WS_TILE_F32_D128 128, 64, 2, true
#endif
// fp8 attention (e4m3 q, k, v; sm90ws/fp8_key_order.h): kBlockN a multiple of the 32-key groups of the
// P V key order. The K/V bytes halve, so the tiles fit with room to spare: S + P + O = 64 + 16 + 32 (d 64),
// 96 + 24 + 64 (d 128, 192 keys) and 64 + 16 + 128 (d 256: Q 32 + K/V 128 + O 64 KB, O apart) registers.
// d = 128 takes 192 keys a step: H100 self-test, 1.04-1.09x the 128-key tile (795 -> 853 TFLOP/s at
// (8, 16, 4096), 900 -> 971 at (2, 16, 16384)), 224 keys no better (ptxas: 24 / 56 bytes of spill, the
// producer's). FlashAttention-3's fp8 tiles (hopper/tile_size.h) are 192 x 160, 128 x 224 and 128 x 128.
#ifndef CUTLASSFA_SM90WS_TILE_FP8_D64
#define CUTLASSFA_SM90WS_TILE_FP8_D64 192, 128, 2, false
#endif
#ifndef CUTLASSFA_SM90WS_TILE_FP8_D128
#define CUTLASSFA_SM90WS_TILE_FP8_D128 128, 192, 2, true
#endif
#ifndef CUTLASSFA_SM90WS_TILE_FP8_D256
#define CUTLASSFA_SM90WS_TILE_FP8_D256 128, 128, 2, true
#endif
template <int kHeadDim> struct TileConfig;
template <> struct TileConfig<64> : TileShape<CUTLASSFA_SM90WS_TILE_D64> {};
template <> struct TileConfig<96> : TileShape<CUTLASSFA_SM90WS_TILE_D96> {};
template <> struct TileConfig<128> : TileShape<CUTLASSFA_SM90WS_TILE_D128> {};
template <> struct TileConfig<192> : TileShape<CUTLASSFA_SM90WS_TILE_D192> {};
template <> struct TileConfig<256> : TileShape<CUTLASSFA_SM90WS_TILE_D256> {};
template <int kHeadDim> struct TileConfigFp32;
template <> struct TileConfigFp32<64> : TileShape<CUTLASSFA_SM90WS_TILE_F32_D64> {};
template <> struct TileConfigFp32<128> : TileShape<CUTLASSFA_SM90WS_TILE_F32_D128> {};
template <int kHeadDim> struct TileConfigFp8;
template <> struct TileConfigFp8<64> : TileShape<CUTLASSFA_SM90WS_TILE_FP8_D64> {};
template <> struct TileConfigFp8<128> : TileShape<CUTLASSFA_SM90WS_TILE_FP8_D128> {};
template <> struct TileConfigFp8<256> : TileShape<CUTLASSFA_SM90WS_TILE_FP8_D256> {};

}  // namespace cutlassfa::sm90ws
