// CUDA-core FlashAttention-2 forward: one kernel template, two configurations (small_tile, large_tile).
//
// The block owns a kBlockM x D tile of Q and walks the K/V tiles of its (batch, kv head) in steps of
// kBlockN keys. Each step is two chained register-blocked SGEMMs with the online softmax in between:
//
//   S   = Q K^T             sQt (D, kBlockM) x sKt (D, kBlockN)  -> tSrS (kTM, kTNS) per thread
//   m_i, l_i, P = exp2(S - m_i)  (rows reduced over the 8 lanes that share them)
//   O  += P V               sPt (kBlockN, kBlockM) x sV (kBlockN, D) -> tOrO (kTM, kTNO) per thread
//
// Thread layout (both GEMMs): a warp is 4 thread-rows x 8 thread-cols; lane = tr * 8 + tc. Thread
// (tr, tc) of warp w owns the rows   w * 4 * kTM + g * 16 + tr * 4 + {0..3}   (g < kTM / 4) and the
// columns (keys of S, head-dim columns of O)   g * 32 + tc * 4 + {0..3}   (g < kTN / 4). Every
// operand fragment is therefore a float4 at a fixed k: per k a warp reads 4 x 16 B (A operand,
// broadcast to the 8 lanes of a thread-row) and 8 x 16 B contiguous (B operand), all 32 banks once,
// no conflicts. Both operands are stored k-major in shared memory (Q and K transposed on the way in,
// P transposed on its way out of registers, V row-major as it is in memory).
//
// A thread keeps the same rows in S and O, so the row statistics and the rescale of O stay in its
// registers; only the row max needs an 8-lane shuffle per step (the row sum is reduced once, at the end).
//
// NVRTC-compilable for sm_61: includes only params.h and the fp16/bf16 headers.
#pragma once

#include "simt_common.cuh"

namespace cutlassfa {
namespace simt {

// ------------------------------------------------------------------------------------------------
// Configuration: one traits struct per (config, head dim).
// ------------------------------------------------------------------------------------------------
template <int kHeadDim_, int kBlockM_, int kBlockN_, int kWarps_, bool kShareKV_, int kMinBlocks_>
struct SimtTraits {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;  // query rows per block
  static constexpr int kBlockN = kBlockN_;  // keys per step
  static constexpr int kWarps = kWarps_;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kMinBlocks = kMinBlocks_;  // __launch_bounds__ occupancy hint
  // V reuses K's shared buffer (written after S = QK^T is done) and K is not prefetched into
  // registers: small_tile at D=128 (64 threads, 64 chunk registers per tile) fits 48 KB and 255 so.
  static constexpr bool kShareKV = kShareKV_;

  static constexpr int kTM = kBlockM / (kWarps * 4);  // rows per thread (S and O)
  static constexpr int kTNS = kBlockN / 8;            // keys per thread (S)
  static constexpr int kTNO = kHeadDim / 8;           // head-dim columns per thread (O)

  // Leading dimensions (floats). sQt / sKt are written one row per lane (consecutive addresses) and
  // need no padding. sPt is written as float4 of 4 rows by lanes 4 keys apart: a row pitch of
  // kBlockM + 4 (== 4 mod 32) spreads a warp's 32 float4 stores evenly over the 8 bank quads
  // (4 wavefronts, the minimum for 512 B) instead of 2x that without padding.
  static constexpr int kLdQ = kBlockM;
  static constexpr int kLdK = kBlockN;
  static constexpr int kLdV = kHeadDim + 4;  // row-major V: conflict-free float4 stores (TileCopy)
  static constexpr int kLdP = kBlockM + 4;

  static constexpr int kSmemQ = kHeadDim * kLdQ;  // floats
  static constexpr int kSmemK = kHeadDim * kLdK;
  static constexpr int kSmemV = kBlockN * kLdV;
  static constexpr int kSmemKV = kShareKV ? (kSmemK > kSmemV ? kSmemK : kSmemV) : kSmemK + kSmemV;
  static constexpr int kSmemP = kBlockN * kLdP;
  static constexpr int kSmemBytes = (kSmemQ + kSmemKV + kSmemP) * 4;

  static_assert(kBlockM % (kWarps * 16) == 0, "kTM must be a multiple of 4");
  static_assert(kBlockN % 32 == 0, "kTNS must be a multiple of 4");
  static_assert(kHeadDim % 32 == 0, "kTNO must be a multiple of 4");
};

// Head dims between the compiled ones run on the next wider configuration: columns past
// params.head_dim load as zero (Q K^T is unchanged, P V gives zero there) and are not stored.

// small_tile: <= 48 KB of shared memory (every architecture, sm_61 included).
//   D=32 : 64 x 64, 4 warps, 42.0 KB     D=64 : 64 x 32, 4 warps, 41.0 KB
//   D=128: 32 x 32, 2 warps, K/V share a buffer, 37.0 KB
//   D=192: 16 x 32, 1 warp, K/V share a buffer, 39.0 KB. D=256 cannot fit: its smallest tile
//          (16 x 32: Q 16 KB, K/V 32.5 KB, P 2.5 KB) is 51 KB, so small_tile stops at 192.
template <int D>
struct SmallTile;
template <>
struct SmallTile<32> : SimtTraits<32, 64, 64, 4, false, 2> {};
template <>
struct SmallTile<64> : SimtTraits<64, 64, 32, 4, false, 2> {};
template <>
struct SmallTile<128> : SimtTraits<128, 32, 32, 2, true, 2> {};
template <>
struct SmallTile<192> : SimtTraits<192, 16, 32, 1, true, 2> {};

// large_tile: opt-in shared memory (sm_80+), 8 x 8 microtiles at D >= 64.
//   D=32 : 128 x 64, 4 warps, 66.0 KB (256 x 64 / 8 warps: 32.8 against 30.6 TFLOP/s, not worth 113 KB)
//   D=64 : 256 x 64, 8 warps, 162 KB: 38.8 TFLOP/s fp32 at N=32768 on an H200, against 36.1 for
//          128 x 64 / 4 warps (98 KB), 33.0 for 128 x 32 / 4 warps, 29.8 for 128 x 64 / 8 warps
//          (4 x 8 microtiles) and 26.6 for 64 x 64 / 4 warps.
//   D=128: 64 x 32, 4 warps, 73.0 KB (8 x 16 O microtiles would not fit in registers)
//   D=256: 32 x 32, 2 warps, K/V share a buffer, 69.0 KB (4 x 32 O microtiles; a 64-row tile
//          would be 105 KB, past the 99 KB of sm_86 / sm_89)
template <int D>
struct LargeTile;
template <>
struct LargeTile<32> : SimtTraits<32, 128, 64, 4, false, 2> {};
template <>
struct LargeTile<64> : SimtTraits<64, 256, 64, 8, false, 1> {};
template <>
struct LargeTile<128> : SimtTraits<128, 64, 32, 4, false, 2> {};
template <>
struct LargeTile<256> : SimtTraits<256, 32, 32, 2, true, 1> {};

// large_tile where the opt-in limit per block is below LargeTile's (99 KB on sm_86 / sm_89):
// the 128 x 64 / 4 warp D=64 tile (98 KB); the other head dims already fit.
template <int D>
struct LargeTileCompact : LargeTile<D> {};
template <>
struct LargeTileCompact<64> : SimtTraits<64, 128, 64, 4, false, 2> {};

// ------------------------------------------------------------------------------------------------
// Global -> register -> shared tile copies, 16-byte chunks, rows that do not exist read as zero.
// Split in two so that the next K/V tile is fetched into registers during P V (when the S
// registers are dead) and written to shared memory after the following barrier.
//
// Each thread copies chunks of ONE row (row = tid % kRows, chunks tid / kRows + i * kThreads / kRows):
// the caller passes that row's pointer, whether it exists (a query row of the entry, a key in
// [leftpad, L)) and its real width `cols` (params.head_dim: columns past it, the zero padding up to
// kCols, read as zero), so a single row pointer and one bounds check per thread; the chunk offsets are
// immediates. The row pointer is where pages are resolved (one block-table read per row and tile). (A
// row-per-iteration mapping kept 16 loop-invariant 64-bit addresses live across the main loop and
// pushed the fp32 D=64 large tile from 203 registers into spills.) Consecutive lanes take
// consecutive rows, so the transposed scalar stores hit consecutive banks, and the row-major float4
// stores are conflict-free with a row pitch of D + 4 floats.
// ------------------------------------------------------------------------------------------------
template <typename T, int kRows, int kCols, int kThreads, bool kTransposed>
struct TileCopy {
  using Tr = ElementTraits<T>;
  using Storage = typename Tr::Storage;
  static constexpr int kVec = Tr::kVec;
  static constexpr int kChunksPerRow = kCols / kVec;
  static_assert(kCols % kVec == 0, "row must be whole 16-byte chunks");
  static_assert(kThreads % kRows == 0, "each thread copies part of one row");
  static constexpr int kThreadsPerRow = kThreads / kRows;
  static_assert(kChunksPerRow % kThreadsPerRow == 0, "chunks must spread evenly over the threads");
  static constexpr int kPerThread = kChunksPerRow / kThreadsPerRow;
  // Chunks in flight per thread in copy(): bounds the registers of a direct copy to 4 x 4.
  static constexpr int kBatch = kPerThread < 4 ? kPerThread : 4;
  static_assert(kPerThread % kBatch == 0, "");

  uint4 regs[kPerThread];  // prefetch buffer (load() / store())

  // The tile row this thread copies.
  __device__ __forceinline__ static int row(int tid) { return tid % kRows; }

  // A chunk never straddles `cols`: head dims are multiples of 8 and a chunk is 4 or 8 elements.
  __device__ __forceinline__ static uint4 load_one(const Storage* src_row, bool valid, int cols, bool vec, int tid,
                                                   int it) {
    const int col = ((tid / kRows) + it * kThreadsPerRow) * kVec;
    return valid && col < cols ? load_chunk<T>(src_row + col, vec) : make_uint4(0u, 0u, 0u, 0u);
  }

  // smem is (kCols, ld) when transposed, (kRows, ld) otherwise; values are multiplied by `scale`.
  __device__ __forceinline__ static void store_one(const uint4& r, float* smem, int ld, float scale, int tid,
                                                   int it) {
    const int row = tid % kRows;
    const int col = ((tid / kRows) + it * kThreadsPerRow) * kVec;
    float f[kVec];
    Tr::unpack(r, f);
    if (kTransposed) {
#pragma unroll
      for (int e = 0; e < kVec; ++e) smem[(col + e) * ld + row] = f[e] * scale;
    } else {
#pragma unroll
      for (int e = 0; e < kVec; e += 4)
        *reinterpret_cast<float4*>(smem + row * ld + col + e) =
            make_float4(f[e] * scale, f[e + 1] * scale, f[e + 2] * scale, f[e + 3] * scale);
    }
  }

  // Prefetch: the whole tile into registers now, into shared memory later.
  __device__ __forceinline__ void load(const Storage* src_row, bool valid, int cols, bool vec, int tid) {
#pragma unroll
    for (int it = 0; it < kPerThread; ++it) regs[it] = load_one(src_row, valid, cols, vec, tid, it);
  }
  __device__ __forceinline__ void store(float* smem, int ld, float scale, int tid) const {
#pragma unroll
    for (int it = 0; it < kPerThread; ++it) store_one(regs[it], smem, ld, scale, tid, it);
  }

  // Direct copy, kBatch chunks in flight.
  __device__ __forceinline__ static void copy(const Storage* src_row, bool valid, int cols, bool vec, float* smem,
                                              int ld, float scale, int tid) {
#pragma unroll
    for (int it0 = 0; it0 < kPerThread; it0 += kBatch) {
      uint4 r[kBatch];
#pragma unroll
      for (int i = 0; i < kBatch; ++i) r[i] = load_one(src_row, valid, cols, vec, tid, it0 + i);
#pragma unroll
      for (int i = 0; i < kBatch; ++i) store_one(r[i], smem, ld, scale, tid, it0 + i);
    }
  }
};

// ------------------------------------------------------------------------------------------------
// Register-blocked microkernel: acc (kTM, kTN) += A^T B over kK, A and B k-major in shared memory.
// sA points at this thread's first row (row pitch kLdA; its rows at g * 16 + {0..3}); sB at its first
// column (pitch kLdB; columns at g * 32 + {0..3}). Per k: kTM/4 + kTN/4 LDS.128, kTM * kTN FFMA.
// ------------------------------------------------------------------------------------------------
template <int kTM, int kTN, int kK, int kLdA, int kLdB>
__device__ __forceinline__ void gemm_tn(float (&acc)[kTM][kTN], const float* __restrict__ sA,
                                        const float* __restrict__ sB) {
  // Unrolled by 4, not fully: a fully unrolled D=64 step is ~70 KB of SASS per GEMM, past the
  // instruction cache; 4 k-steps give the scheduler room to hoist the next fragments' loads.
#pragma unroll 4
  for (int k = 0; k < kK; ++k) {
    float a[kTM], b[kTN];
#pragma unroll
    for (int g = 0; g < kTM / 4; ++g) {
      const float4 t = *reinterpret_cast<const float4*>(sA + k * kLdA + g * 16);
      a[4 * g + 0] = t.x;
      a[4 * g + 1] = t.y;
      a[4 * g + 2] = t.z;
      a[4 * g + 3] = t.w;
    }
#pragma unroll
    for (int g = 0; g < kTN / 4; ++g) {
      const float4 t = *reinterpret_cast<const float4*>(sB + k * kLdB + g * 32);
      b[4 * g + 0] = t.x;
      b[4 * g + 1] = t.y;
      b[4 * g + 2] = t.z;
      b[4 * g + 3] = t.w;
    }
#pragma unroll
    for (int i = 0; i < kTM; ++i) {
#pragma unroll
      for (int j = 0; j < kTN; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
  }
}

// Row / column offsets of this thread's register tiles (see the layout at the top of the file).
__device__ __forceinline__ int row_of(int i) { return (i / 4) * 16 + (i % 4); }  // + warp/tr base
__device__ __forceinline__ int col_of(int j) { return (j / 4) * 32 + (j % 4); }  // + tc * 4

// ------------------------------------------------------------------------------------------------
// The kernel. Grid: one block per (m block, batch * head), m block fastest, all in blockIdx.x; with
// varlen the m blocks span the longest entry and those past an entry's queries return at once.
// Every mode is a run-time value: the window, leftpad and per-entry lengths only bound the key loop
// (simt_common.cuh's tile_trips) and mask the boundary steps; softcap and ALiBi are uniform branches
// after S = Q K^T; pages change where a thread's K/V row is read from.
// ------------------------------------------------------------------------------------------------
template <typename Kt, typename T>
__global__ void __launch_bounds__(Kt::kThreads, Kt::kMinBlocks) flash_fwd_simt_kernel(const FwdParams params) {
  using Storage = typename ElementTraits<T>::Storage;
  constexpr int D = Kt::kHeadDim;
  constexpr int kBlockM = Kt::kBlockM;
  constexpr int kBlockN = Kt::kBlockN;
  constexpr int kTM = Kt::kTM;
  constexpr int kTNS = Kt::kTNS;
  constexpr int kTNO = Kt::kTNO;
  const float kNegInf = __int_as_float(0xff800000);  // -inf
  constexpr float kLn2 = 0.693147180559945309f;

  extern __shared__ float4 smem_raw[];
  float* sQt = reinterpret_cast<float*>(smem_raw);    // (D, kBlockM)      Q^T, pre-scaled
  float* sKt = sQt + Kt::kSmemQ;                      // (D, kBlockN)      K^T
  float* sV = Kt::kShareKV ? sKt : sKt + Kt::kSmemK;  // (kBlockN, D)      V
  float* sPt = sKt + Kt::kSmemKV;                     // (kBlockN, kLdP)   P^T

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int tr = lane / 8;  // thread-row in the warp
  const int tc = lane % 8;  // thread-col in the warp: the 8 lanes of a row are consecutive

  const int num_m_blocks = (params.seqlen_q + kBlockM - 1) / kBlockM;
  // Highest m block first: under the causal mask it has the most key steps, so the longest blocks
  // start in the first wave and the short ones fill the tail.
  const int m_block = num_m_blocks - 1 - static_cast<int>(blockIdx.x % num_m_blocks);
  const int bh = blockIdx.x / num_m_blocks;
  const int b = bh / params.heads_q;
  const int h = bh % params.heads_q;
  const int h_kv = h / params.heads_ratio;
  const int m0 = m_block * kBlockM;

  const EntryMask entry = entry_mask(params, b);
  const int rows_valid = min(kBlockM, entry.nq - m0);
  if (rows_valid <= 0) return;  // past this entry's queries; uniform, before any barrier
  // Key steps [first, last): the tiles some row of the block sees; [unmasked_begin, unmasked_end)
  // need no element mask (masks.py tile_trips).
  const TileTrips trips = entry.tile_trips(m0, m0 + rows_valid, kBlockN);

  using QCopy = TileCopy<T, kBlockM, D, Kt::kThreads, true>;   // Q tile -> sQt (transposed, scaled)
  using KCopy = TileCopy<T, kBlockN, D, Kt::kThreads, true>;   // K tile -> sKt (transposed)
  using VCopy = TileCopy<T, kBlockN, D, Kt::kThreads, false>;  // V tile -> sV

  const long long q_row = entry.q_row0 + m0;  // the block's first row in q and o
  const Storage* gQ = static_cast<const Storage*>(params.q) + b * params.q_batch_stride +
                      h * params.q_head_stride + q_row * params.q_row_stride;  // (kBlockM, D)
  Storage* gO = static_cast<Storage*>(params.o) + b * params.o_batch_stride + h * params.o_head_stride +
                q_row * params.o_row_stride;  // (kBlockM, D)
  // K and V rows: KCopy and VCopy give this thread the same tile row, key n0 + kv_row of step n0.
  // Dense: the pointers hold that row at n0 = 0 and a step adds n0 rows. Paged: the head's base,
  // the row is looked up in the block table per step.
  const bool paged = params.block_table != nullptr;
  const int kv_row = KCopy::row(tid);
  const long long k_dense = paged ? 0 : b * params.k_batch_stride + (entry.k_row0 + kv_row) * params.k_row_stride;
  const long long v_dense = paged ? 0 : b * params.v_batch_stride + (entry.k_row0 + kv_row) * params.v_row_stride;
  const Storage* gK = static_cast<const Storage*>(params.k) + h_kv * params.k_head_stride + k_dense;
  const Storage* gV = static_cast<const Storage*>(params.v) + h_kv * params.v_head_stride + v_dense;
  // Keys outside [leftpad, L), and keys on a missing page (rules.h), load as zero: hidden cache rows may
  // hold anything, and P = 0 times a NaN there would still be NaN.
  auto kv_exists = [&](int n0) {
    const int key = n0 + kv_row;
    return key >= entry.leftpad && key < entry.nk && (!paged || key_page_exists(params, b, key));
  };
  auto k_src = [&](int n0, bool exists) -> const Storage* {
    if (!paged) return gK + n0 * params.k_row_stride;
    return exists ? gK + key_offset(params, entry, b, n0 + kv_row, params.k_batch_stride, params.k_row_stride) : gK;
  };
  auto v_src = [&](int n0, bool exists) -> const Storage* {
    if (!paged) return gV + n0 * params.v_row_stride;
    return exists ? gV + key_offset(params, entry, b, n0 + kv_row, params.v_batch_stride, params.v_row_stride) : gV;
  };
  const bool vec_q = chunk_aligned<T>(params.q, params.q_batch_stride, params.q_head_stride, params.q_row_stride);
  const bool vec_k = chunk_aligned<T>(params.k, params.k_batch_stride, params.k_head_stride, params.k_row_stride);
  const bool vec_v = chunk_aligned<T>(params.v, params.v_batch_stride, params.v_head_stride, params.v_row_stride);
  const bool vec_o = chunk_aligned<T>(params.o, params.o_batch_stride, params.o_head_stride, params.o_row_stride);
  const int cols = params.head_dim;  // <= D: the columns past it are zero padding

  // This thread's rows, relative to m0, and the base pointers of its fragments.
  const int row0 = warp * 4 * kTM + tr * 4;
  const float* tSsQ = sQt + row0;    // A operand of S = Q K^T
  const float* tSsK = sKt + tc * 4;  // B operand
  const float* tOsP = sPt + row0;    // A operand of O = P V
  const float* tOsV = sV + tc * 4;   // B operand

  KCopy tKgK;  // the next K tile, fetched during P V (not with kShareKV)

  float tOrO[kTM][kTNO];  // O accumulator
  float m_i[kTM];         // running row max of the log2-scaled scores
  float l_i[kTM];         // running row sum of exp2(s - m_i), this thread's columns only
#pragma unroll
  for (int i = 0; i < kTM; ++i) {
    m_i[i] = kNegInf;
    l_i[i] = 0.f;
#pragma unroll
    for (int j = 0; j < kTNO; ++j) tOrO[i][j] = 0.f;
  }

  // Softcap: Q is scaled by softcap_pre so that the GEMM gives s * softcap_pre, and the scores are
  // tanh(.) * softmax_scale_log2 (softmax_scale is then the cap, folded in by the host).
  const bool softcap = params.softcap_pre > 0.f;
  // ALiBi (rules.h): the scores are in log2 units, so a key of distance t from the row's diagonal costs
  // slope * log2(e) * t; 0 without ALiBi (a uniform branch).
  const float alibi_log2 =
      params.alibi_slopes != nullptr ? params.alibi_slopes[b * params.alibi_batch_stride + h] * 1.44269504088896341f
                                     : 0.f;

  // ============================== PROLOGUE ==============================
  if (trips.first < trips.last) {
    // Q is pre-multiplied by softmax_scale * log2(e) (params.softmax_scale_log2): the scores come out
    // of the GEMM in log2 units and the softmax is exp2f(s - m), one FFMA fewer per score.
    const int n0 = trips.first * kBlockN;
    if (!Kt::kShareKV) {
      const bool exists = kv_exists(n0);
      tKgK.load(k_src(n0, exists), exists, cols, vec_k, tid);
    }
    const int q_copy_row = QCopy::row(tid);
    QCopy::copy(gQ + q_copy_row * params.q_row_stride, q_copy_row < rows_valid, cols, vec_q, sQt, Kt::kLdQ,
                softcap ? params.softcap_pre : params.softmax_scale_log2, tid);
  }

  // ============================== MAIN LOOP ==============================
  for (int n_block = trips.first; n_block < trips.last; ++n_block) {
    const int n0 = n_block * kBlockN;
    const bool kv_here = kv_exists(n0);
    __syncthreads();  // the previous step's P V is done with sV and sPt
    if (Kt::kShareKV) {
      KCopy::copy(k_src(n0, kv_here), kv_here, cols, vec_k, sKt, Kt::kLdK, 1.f, tid);
    } else {
      // K was fetched during the previous P V. V is fetched here, not there: the fp32 D=64 large tile
      // has no registers for both (O 64 + K 32 + V 32 + fragments spilled), and its latency is hidden
      // by the other resident block.
      VCopy tVgV;
      tVgV.load(v_src(n0, kv_here), kv_here, cols, vec_v, tid);
      tKgK.store(sKt, Kt::kLdK, 1.f, tid);
      tVgV.store(sV, Kt::kLdV, 1.f, tid);
    }
    __syncthreads();

    // S = (scale * log2 e * Q) K^T
    float tSrS[kTM][kTNS];
#pragma unroll
    for (int i = 0; i < kTM; ++i) {
#pragma unroll
      for (int j = 0; j < kTNS; ++j) tSrS[i][j] = 0.f;
    }
    gemm_tn<kTM, kTNS, D, Kt::kLdQ, Kt::kLdK>(tSrS, tSsQ, tSsK);

    if (softcap) {
#pragma unroll
      for (int i = 0; i < kTM; ++i) {
#pragma unroll
        for (int j = 0; j < kTNS; ++j) tSrS[i][j] = rules::softcap_tanh(tSrS[i][j]) * params.softmax_scale_log2;
      }
    }
    if (alibi_log2 != 0.f) {  // element (i, j): row m0 + row0 + row_of(i), key n0 + tc * 4 + col_of(j)
#pragma unroll
      for (int i = 0; i < kTM; ++i) {
#pragma unroll
        for (int j = 0; j < kTNS; ++j) {
          tSrS[i][j] -= alibi_log2 * rules::alibi_distance(m0 + row0 + row_of(i), entry.nq, entry.nk,
                                                             n0 + tc * 4 + col_of(j));
        }
      }
    }

    // Keys on a missing page count as masked (rules.h): one table read a lane and a vote a step when
    // every page exists.
    if (paged && any_page_missing(params, b, max(n0, entry.leftpad), min(n0 + kBlockN, entry.nk))) {
#pragma unroll
      for (int j = 0; j < kTNS; ++j) {
        const int key = n0 + tc * 4 + col_of(j);
        if (key >= entry.leftpad && key < entry.nk && !key_page_exists(params, b, key)) {
#pragma unroll
          for (int i = 0; i < kTM; ++i) tSrS[i][j] = kNegInf;
        }
      }
    }

    // Boundary steps: keys outside [leftpad, L) and outside the window of each row. Element (i, j) is
    // key n0 + tc*4 + col_of(j) of row m0 + row0 + row_of(i): offsets from this thread's first element.
    if (trips.is_masked(n_block)) {
#pragma unroll
      for (int i = 0; i < kTM; ++i) {
        int lo, hi;
        entry.row_range(m0 + row0 + row_of(i), lo, hi);
        // Relative to this thread's first key, behind opaque() (common/opaque.h says why).
        const int begin_rel = opaque(lo - (n0 + tc * 4)), end_rel = opaque(hi - (n0 + tc * 4));
#pragma unroll
        for (int j = 0; j < kTNS; ++j) {
          if (col_of(j) < begin_rel || col_of(j) >= end_rel) tSrS[i][j] = kNegInf;
        }
      }
    }

    // Online softmax: m_new = max(m_i, rowmax(S)); P = exp2(S - m_new); rescale l_i and O by
    // alpha = exp2(m_i - m_new). A row that has seen only masked keys keeps m = -inf and subtracts
    // 0 instead (exp2(-inf - 0) = 0), so P = 0, l = 0 and nothing becomes NaN.
#pragma unroll
    for (int i = 0; i < kTM; ++i) {
      float row_max = tSrS[i][0];
#pragma unroll
      for (int j = 1; j < kTNS; ++j) row_max = fmaxf(row_max, tSrS[i][j]);
      const float m_new = fmaxf(m_i[i], group_max<8>(row_max));
      const float m_sub = m_new == kNegInf ? 0.f : m_new;
      const float alpha = exp2f(m_i[i] - m_sub);
      float row_sum = 0.f;
#pragma unroll
      for (int j = 0; j < kTNS; ++j) {
        tSrS[i][j] = exp2f(tSrS[i][j] - m_sub);
        row_sum += tSrS[i][j];
      }
      l_i[i] = l_i[i] * alpha + row_sum;
      m_i[i] = m_new;
#pragma unroll
      for (int j = 0; j < kTNO; ++j) tOrO[i][j] *= alpha;
    }

    // P -> sPt, a float4 of 4 consecutive rows per key.
#pragma unroll
    for (int g = 0; g < kTM / 4; ++g) {
#pragma unroll
      for (int j = 0; j < kTNS; ++j) {
        *reinterpret_cast<float4*>(sPt + (tc * 4 + col_of(j)) * Kt::kLdP + row0 + g * 16) =
            make_float4(tSrS[4 * g][j], tSrS[4 * g + 1][j], tSrS[4 * g + 2][j], tSrS[4 * g + 3][j]);
      }
    }
    if (Kt::kShareKV) {
      __syncthreads();  // everyone is done reading sKt, which sV overwrites
      VCopy::copy(v_src(n0, kv_here), kv_here, cols, vec_v, sV, Kt::kLdV, 1.f, tid);
    }
    __syncthreads();

    // Fetch the next K tile into registers while P V runs.
    if (!Kt::kShareKV && n_block + 1 < trips.last) {
      const int n1 = n0 + kBlockN;
      const bool exists = kv_exists(n1);
      tKgK.load(k_src(n1, exists), exists, cols, vec_k, tid);
    }

    // O += P V
    gemm_tn<kTM, kTNO, kBlockN, Kt::kLdP, Kt::kLdV>(tOrO, tOsP, tOsV);
  }

  // ============================== EPILOGUE ==============================
  // O = acc / l; lse = ln(sum exp(scale * qk)) = m * ln 2 + ln l (m is in log2 units). A row that saw
  // no key has O = 0 (nothing accumulated) and l = 0: lse = -inf. Then the sink's term (rules.h).
#pragma unroll
  for (int i = 0; i < kTM; ++i) {
    const float l = group_sum<8>(l_i[i]);
    const int r = row0 + row_of(i);
    if (r < rows_valid) {
      float inv_l = l > 0.f ? 1.f / l : 0.f;
      float lse = l > 0.f ? m_i[i] * kLn2 + logf(l) : kNegInf;
      if (params.sinks != nullptr) {
        const float sinked = rules::lse_with_sink(
            lse, params.sinks[h * params.sinks_head_stride + (m0 + r) * params.sinks_row_stride]);
        inv_l *= rules::sink_out_scale(lse, sinked);
        lse = sinked;
      }
#pragma unroll
      for (int g = 0; g < kTNO / 4; ++g) {
        if (g * 32 + tc * 4 >= cols) continue;  // zero padding: not part of O
        const float f[4] = {tOrO[i][4 * g] * inv_l, tOrO[i][4 * g + 1] * inv_l, tOrO[i][4 * g + 2] * inv_l,
                            tOrO[i][4 * g + 3] * inv_l};
        store4<T>(gO + r * params.o_row_stride + g * 32 + tc * 4, f, vec_o);
      }
      if (params.lse != nullptr && tc == 0) {
        params.lse[lse_offset(params, entry, b, h, m0 + r)] = lse;
      }
    }
  }
}

}  // namespace simt
}  // namespace cutlassfa
