// The decode kernel (mma.sync, common/mma_sync_gemm.h): the few query rows of one K/V head (Nq x
// heads_ratio, one or two 16-row MMA slabs a CTA) against a long K/V cache, a CTA per (batch, K/V head,
// key split, chunk of kRows rows). The chunks of a K/V head's rows (more than kRows: speculative and
// multi-token steps with grouped heads, up to kSm90DecodeMaxRows) are neighbours in the grid, so they run
// side by side and all but the first read each key from L2: DRAM sees the cache once, and no CTA holds
// more than two slabs of O (a 64-row O would take 256 registers a thread at d = 128).
//
// Decode reads every key once and computes little with it, so the kernel is built around the
// memory stream, not the MMA (a 64- or 128-row tile would spend 4-8x the tensor work of the bytes on
// rows that do not exist; the tile kernels were tensor-bound on decode for that reason,
// bench/NOTES-variants.md):
//  - the warps split the keys, not the rows: in every step of kBlockN keys, warp w takes keys
//    [w kWarpKeys, (w + 1) kWarpKeys) with its own online softmax, and the warps' results are merged
//    by their lse at the end, as the key splits are (split_combine.cu);
//  - each warp streams its own K/V rows through its own kStages-deep cp.async ring, synchronized by
//    __syncwarp only: no warp ever waits for another inside the loop;
//  - two CTAs per multiprocessor, so one CTA's first loads overlap another's last steps;
//  - a paged cache's block-table entries reach shared memory by cp.async two steps ahead of the copies
//    that need them, so no K/V address waits on a global read.
// An fp8 (e4m3) cache (params.h kv_fp8) streams half the bytes: its steps land in a ring of fp8 slots and
// are widened to fp16 in shared memory (one pair of slots a warp) before the MMAs, which then run in fp16
// whatever q's dtype (e4m3 is exact in fp16; a bf16 Q tile is scaled by a power of two into fp16's range).
#pragma once

#include <cuda_fp8.h>

#include <cute/tensor.hpp>

#include <cutlass/numeric_types.h>

#include "common/dependent_launch.h"
#include "common/lse_merge.h"
#include "common/mma_sync_gemm.h"
#include "common/online_softmax.h"
#include "common/softcap.h"
#include "common/tensor_utils.h"
#include "cutlassfa/launch.h"  // kSm90DecodeFourWarpHeadDim
#include "cutlassfa/params.h"
#include "cutlassfa/rules.h"

namespace cutlassfa::sm90decode {

using namespace cute;

// kGeneral: the instantiation for the rarer modes (left padding, a left window bound, softcap), so that the
// plain one carries none of their registers or instructions.
template <int kHeadDim_, class Element_, int kRows_, bool kFp8Cache_ = false, bool kGeneral_ = false>
struct DecodeTraits {
  using Element = Element_;  // of q and o
  static constexpr bool kFp8Cache = kFp8Cache_;
  static constexpr bool kGeneral = kGeneral_;
  using CacheElement = std::conditional_t<kFp8Cache, cutlass::float_e4m3_t, Element>;  // of k and v
  using MmaElement = std::conditional_t<kFp8Cache, cutlass::half_t, Element>;          // of the MMA operands
  static constexpr int kChunkElems = 16 / int(sizeof(CacheElement));  // elements of a 16-byte copy
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kRows = kRows_;  // query rows: 16 or 32 (m16n8k16 slabs)
  static_assert(kRows == 16 || kRows == 32);
  // d = 256 (Gemma-2's heads) takes one slab only (launch_decode.cu's coverage): its O is 128 registers a thread.
  static constexpr bool kFourWarps = kHeadDim <= kSm90DecodeFourWarpHeadDim;
  static_assert(kFourWarps || (kRows == 16 && !kFp8Cache), "d = 256: one slab, a cache of q's dtype");
  // Q stays in registers across the loop with one slab at d <= 128; with two, or at d = 256, O alone takes
  // 128 registers a thread, and Q is read from shared memory at every step instead.
  static constexpr bool kQInRegisters = kRows == 16 && kFourWarps;
  // Keys per warp step: 2048 elements of K and of V at d <= 128 (16 keys at d = 128, 32 at d = 64), so a
  // narrower head does not pay more steps (softmax, barriers) per byte; at d = 256 the 16 keys an m16n8k16
  // P V takes (8 KB each), in two warps a CTA so that the ring below still fits two CTAs a multiprocessor. An
  // fp8 cache read directly (one slab) takes 4096 elements, 4 KB as the others (32 keys at d = 128): its steps'
  // fixed work (softmax, table and mask, barriers) then comes per 4 KB too; not the general instantiation,
  // which then spilled (44 bytes at d = 128). At most 32 (the missing-key word).
  static constexpr bool kFp8WideSteps = kFp8Cache && kQInRegisters && !kGeneral;
  static constexpr int kWarpKeys = kFourWarps ? cute::min(32, (kFp8WideSteps ? 4096 : 2048) / kHeadDim) : 16;
  static constexpr int kNWarps = kFourWarps ? 4 : 2;
  static constexpr int kNThreads = 32 * kNWarps;
  static constexpr int kBlockN = kWarpKeys * kNWarps;  // keys per CTA step
  // 24 KB of K and V in each warp's ring (48 KB at d = 256); 100 KB a CTA with Q, two CTAs a multiprocessor.
  // An fp8 ring: 16 KB in four stages (with two slabs beside the warp's 8 KB of widened K and V), 24 KB in three
  // of the wide steps at d = 128.
  static constexpr int kStages = kFp8Cache ? (kFp8WideSteps && kHeadDim == 128 ? 3 : 4) : 3;
  static constexpr int kCtasPerSm = 2;
  // fp8 with one slab (Q in registers): K's and V's B fragments converted straight from the fp8 stage, not
  // widened through shared memory first. For S = Q K^T, thread t of a quad reads bytes [t d / 4, (t + 1) d / 4)
  // of its key's row, which cvt into its B fragments of every k step when Q's columns are permuted to match
  // (k_direct_column); for O += P V, thread g = lane / 4 reads bytes [g d / 8, (g + 1) d / 8) of its four keys'
  // rows, the B fragments of every n tile when O's columns are permuted to match (v_direct_column).
  static constexpr bool kFp8Direct = kFp8Cache && kQInRegisters;
  static_assert(kHeadDim % 64 == 0, "128-byte swizzle rows");

  using MmaAtom = std::conditional_t<cute::is_same_v<MmaElement, cutlass::half_t>,
                                     MMA_Atom<SM80_16x8x16_F32F16F16F32_TN>, MMA_Atom<SM80_16x8x16_F32BF16BF16F32_TN>>;
  using TiledMma = TiledMMA<MmaAtom, Layout<Shape<_1, _1, _1>>, Tile<_16, _16, _16>>;  // one warp

  // 8 rows x 64 elements (128 B) with Swizzle<3,3,3>, as common/tile_copy.h.
  using SmemLayoutAtom =
      decltype(composition(Swizzle<3, 3, 3>{}, Layout<Shape<_8, _64>, Stride<_64, _1>>{}));
  using SmemLayoutQ = decltype(tile_to_shape(SmemLayoutAtom{}, Shape<Int<kRows>, Int<kHeadDim>>{}));
  using SmemLayoutKV = decltype(tile_to_shape(SmemLayoutAtom{}, Shape<Int<kWarpKeys>, Int<kHeadDim>>{}));
  using SmemLayoutVt = decltype(composition(SmemLayoutKV{},
                                            make_layout(Shape<Int<kHeadDim>, Int<kWarpKeys>>{}, GenRowMajor{})));
  using SmemLayoutVtNoSwizzle = decltype(get_nonswizzle_portion(SmemLayoutVt{}));
  // The swizzle atoms are stacked along the rows first (tile_to_shape's order): row r + 8 of a slot is
  // row r of the next atom, the same swizzle pattern 8 x 64 elements further (the copies rely on it).
  static_assert(SmemLayoutKV{}(8, 0) == 8 * 64 && SmemLayoutKV{}(13, 40) == SmemLayoutKV{}(5, 40) + 8 * 64);
  using SmemCopyAtom = Copy_Atom<SM75_U32x4_LDSM_N, MmaElement>;
  using SmemCopyAtomTransposed = Copy_Atom<SM75_U16x8_LDSM_T, MmaElement>;
  // The ring's slots as the copies fill them: the MMA's swizzled layout, or for fp8 byte rows whose 16-byte
  // chunks are permuted within each 128-byte line (chunk ^= row % 8 at d = 128; ^= 2 (line % 4) at d = 64, two
  // rows a line), so that the direct reads' load phases hit distinct banks: V's lanes read four rows 2t apart
  // at one column (without the permutation, a 4-way conflict), K's two rows at once. Widening reads whole
  // lines, conflict-free under any such permutation.
  using SmemLayoutFp8Stage = decltype(composition(
      std::conditional_t<kHeadDim == 128, Swizzle<3, 4, 3>, Swizzle<2, 5, 2>>{},
      Layout<Shape<Int<kWarpKeys>, Int<kHeadDim>>, Stride<Int<kHeadDim>, _1>>{}));
  static_assert(!kFp8Cache || kHeadDim == 64 || kHeadDim == 128, "fp8 stage swizzle: d = 64 or 128");
  using SmemLayoutStage = std::conditional_t<kFp8Cache, SmemLayoutFp8Stage, SmemLayoutKV>;

  static constexpr int kSlotElems = kWarpKeys * kHeadDim;  // one K or V slot of a warp's ring
  static constexpr int kStageSlotBytes = kSlotElems * int(sizeof(CacheElement));
  static constexpr int kEightRowsElems = SmemLayoutStage{}(8, 0);  // a stage slot's rows r and r + 8 (the copies)
  static constexpr int kSmemQ = kRows * kHeadDim * int(sizeof(MmaElement));
  static constexpr int kSmemRing = kNWarps * kStages * 2 * kStageSlotBytes;
  static constexpr int kSmemWide = kFp8Cache && !kFp8Direct ? kNWarps * 2 * kSlotElems * int(sizeof(MmaElement)) : 0;
  // The merge of the warps' results (O rows, then lse_s) reuses the ring.
  static constexpr int kMergeRowStride = kHeadDim + 4;  // floats; breaks the bank pattern of the row writes
  static constexpr int kSmemMerge = kNWarps * kRows * (kMergeRowStride + 1) * int(sizeof(float));
  // Paged caches: each warp's block-table entries of kStages steps (a step's keys touch at most kWarpKeys
  // pages).
  static constexpr int kSmemTableOffset = kSmemQ + (kSmemRing + kSmemWide > kSmemMerge ? kSmemRing + kSmemWide : kSmemMerge);
  // Then each warp's word a stage: bit r set when key r of the step lies on a page that does not exist.
  static constexpr int kSmemMissingOffset = kSmemTableOffset + kNWarps * kStages * kWarpKeys * int(sizeof(int));
  static constexpr int kSmemSize = kSmemMissingOffset + kNWarps * kStages * int(sizeof(unsigned));
  static_assert(kWarpKeys <= 32, "a step's keys in one 32-bit word");
  static_assert(kSmemSize * kCtasPerSm <= 227 * 1024, "kCtasPerSm CTAs a multiprocessor on sm_90");
};

// The CTA's query rows: row r is row row0 + r of its K/V head's nq x heads_ratio rows, that is query head
// head0 + (row0 + r) / nq at query position (row0 + r) % nq (the order of the split partials' rows too).
struct ChunkRows {
  int row0;   // the chunk's first row
  int count;  // the chunk's rows (at most kRows; the Q tile's rows past it are zero and never written)
  int nq;     // query positions a head
  int head0;  // the K/V head's first query head
  __forceinline__ __device__ int head(int r) const { return head0 + (row0 + r) / nq; }
  __forceinline__ __device__ int query(int r) const { return (row0 + r) % nq; }
};

// 16 bytes global -> shared, or 16 zero bytes when !valid (the source is then not read). No L2
// prefetch hint: .L2::128B changed nothing and .L2::256B cost 8-10 % (H200, bench/NOTES-variants.md).
// `smem`: a shared-window address.
__forceinline__ __device__ void cp_async_16_zfill(uint32_t smem, const void* gmem, bool valid) {
  int const bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem), "r"(bytes));
}
__forceinline__ __device__ void cp_async_16_zfill(void* smem, const void* gmem, bool valid) {
  cp_async_16_zfill(static_cast<uint32_t>(__cvta_generic_to_shared(smem)), gmem, valid);
}
// base + times * stride bytes in one IMAD.WIDE.U32 (times a constant once unrolled); written out in C++
// the compiler took three or four instructions.
__forceinline__ __device__ const char* mad_wide(uint32_t stride, uint32_t times, const char* base) {
  unsigned long long out;
  asm("mad.wide.u32 %0, %1, %2, %3;" : "=l"(out) : "r"(stride), "r"(times), "l"(reinterpret_cast<unsigned long long>(base)));
  return reinterpret_cast<const char*>(out);
}

// 4 bytes global -> shared (a block-table entry), or 4 zero bytes when !valid.
__forceinline__ __device__ void cp_async_4_zfill(void* smem, const void* gmem, bool valid) {
  unsigned const dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  int const bytes = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(gmem), "r"(bytes));
}

// The two e4m3 values in the low 16 bits of `two` as two halves (the low byte in the low half), exactly.
__forceinline__ __device__ uint32_t widen_e4m3x2(uint32_t two) {
  __half2_raw const h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two & 0xffffu), __NV_E4M3);
  return static_cast<uint32_t>(h.x) | static_cast<uint32_t>(h.y) << 16;
}

// 16 e4m3 values (a 16-byte chunk) as 16 halves (two chunks), exactly.
__forceinline__ __device__ void widen_e4m3x16(uint4 raw, uint4& lo, uint4& hi) {
  auto pair = widen_e4m3x2;
  lo = make_uint4(pair(raw.x), pair(raw.x >> 16), pair(raw.y), pair(raw.y >> 16));
  hi = make_uint4(pair(raw.z), pair(raw.z >> 16), pair(raw.w), pair(raw.w >> 16));
}

// The MMA k index (column of the Q tile in shared memory) of Q's column p under DecodeTraits::kFp8Direct:
// in k step s, thread t of a quad holds B's k = 2t, 2t + 1 (register b0) and 2t + 8, 2t + 9 (b1); those are
// K's columns t d / 4 + 4 s + 0, 1 and + 2, 3, so that each thread's K bytes are one contiguous run of d / 4.
template <int kHeadDim>
__forceinline__ __device__ int k_direct_column(int p) {
  int const t = p / (kHeadDim / 4), s = p % (kHeadDim / 4) / 4, w = p % 4;
  return 16 * s + 8 * (w / 2) + 2 * t + w % 2;
}

// The column of O (and V) that the MMA's n index holds under DecodeTraits::kFp8Direct: n tile i's column g (the
// B fragment of lane 4 g + t) is V's column g d / 8 + i, so that each lane's V bytes are one run of d / 8.
template <int kHeadDim>
__forceinline__ __device__ int v_direct_column(int n) {
  return n % 8 * (kHeadDim / 8) + n / 8;
}

// Two e4m3 pairs of a word each from words a and b: {a byte 0, b byte 0} / {a 1, b 1} (low, high 16 bits of
// `low`) and {a 2, b 2} / {a 3, b 3} (of `high`): the MMA's B register for keys a, b at one column.
__forceinline__ __device__ void interleave_e4m3(uint32_t a, uint32_t b, uint32_t& low, uint32_t& high) {
  low = __byte_perm(a, b, 0x5140);
  high = __byte_perm(a, b, 0x7362);
}

// A Q tile into fp16 shared memory for the fp8 cache's fp16 MMAs, columns permuted for the direct K reads
// (k_direct_column) when the traits say so. A bf16 tile is scaled by 2^e so that its largest magnitude lies
// in [2^13, 2^14) (fp16 then holds exactly every bf16 value down to 2^-27 of it, and the products with e4m3's
// at most 448 stay far from float's range); an fp16 tile is copied as it is (e = 0). Zero rows past the
// chunk's. `q` is the K/V head's first query head. Returns e; the whole CTA calls it (one max over the tile).
template <class Traits, class TensorQ, class Element>
__device__ int load_q_as_fp16(TensorQ& sQ, const Element* q, const FwdParams& params, ChunkRows const& rows) {
  constexpr bool kScale = !cute::is_same_v<Element, cutlass::half_t>;
  constexpr int kChunksPerRow = Traits::kHeadDim / 8, kChunks = Traits::kRows * kChunksPerRow;
  constexpr int kThreadChunks = (kChunks + Traits::kNThreads - 1) / Traits::kNThreads;
  __shared__ unsigned amax_bits;  // the tile's largest magnitude as float bits (ordered as the floats are)
  uint4 chunks[kThreadChunks];
  float amax = 0.f;
  CUTE_UNROLL
  for (int i = 0; i < kThreadChunks; ++i) {
    int const c = threadIdx.x + i * Traits::kNThreads, r = c / kChunksPerRow, col = c % kChunksPerRow * 8;
    chunks[i] = make_uint4(0, 0, 0, 0);
    if (c < kChunks && r < rows.count) {
      chunks[i] = *reinterpret_cast<const uint4*>(q + (rows.head(r) - rows.head0) * params.q_head_stride +
                                                  rows.query(r) * params.q_row_stride + col);
    }
    const Element* x = reinterpret_cast<const Element*>(&chunks[i]);
    CUTE_UNROLL
    for (int j = 0; j < 8; ++j) { amax = fmaxf(amax, fabsf(static_cast<float>(x[j]))); }
  }
  if (threadIdx.x == 0) { amax_bits = 0u; }
  __syncthreads();
  atomicMax(&amax_bits, __float_as_uint(amax));
  __syncthreads();
  float const tile_max = __uint_as_float(amax_bits);
  int exponent = 0;
  if (kScale && tile_max > 0.f && isfinite(tile_max)) {
    int tile_exponent;
    frexpf(tile_max, &tile_exponent);  // tile_max < 2^tile_exponent
    exponent = 14 - tile_exponent;
  }
  CUTE_UNROLL
  for (int i = 0; i < kThreadChunks; ++i) {
    int const c = threadIdx.x + i * Traits::kNThreads, r = c / kChunksPerRow, col = c % kChunksPerRow * 8;
    if (c >= kChunks) { continue; }
    const Element* x = reinterpret_cast<const Element*>(&chunks[i]);
    CUTE_UNROLL
    for (int j = 0; j < 8; ++j) {
      int const to = Traits::kFp8Direct ? k_direct_column<Traits::kHeadDim>(col + j) : col + j;
      sQ(r, to) = cutlass::half_t(ldexpf(static_cast<float>(x[j]), exponent));
    }
  }
  return exponent;
}

template <class Traits>
__global__ void __launch_bounds__(Traits::kNThreads, Traits::kCtasPerSm) decode_kernel(const FwdParams params) {
  using Element = typename Traits::Element;
  using CacheElement = typename Traits::CacheElement;
  using MmaElement = typename Traits::MmaElement;
  constexpr int kHeadDim = Traits::kHeadDim, kRows = Traits::kRows, kNWarps = Traits::kNWarps;
  constexpr int kWarpKeys = Traits::kWarpKeys, kBlockN = Traits::kBlockN, kStages = Traits::kStages;
  constexpr int kChunksPerRow = kHeadDim / Traits::kChunkElems;  // 16-byte chunks of a K / V row
  // A bf16 Q against an fp8 cache: converted to fp16 (scaled) by plain loads, not copied; so is any Q whose
  // columns the direct K reads permute.
  constexpr bool kConvertQ = Traits::kFp8Cache && (!cute::is_same_v<Element, MmaElement> || Traits::kFp8Direct);

  extern __shared__ __align__(128) char smem[];
  int const tidx = threadIdx.x, warp = tidx / 32, lane = tidx % 32;
  // The split combine (launched as a dependent) may take the multiprocessors this grid leaves free from
  // now on; it waits for the whole grid before it reads a partial.
  allow_dependent_launch();

  // ---- Work: (row chunk, split, K/V head, batch), the chunk fastest -------------------------------------
  int const nq = params.seqlen_q, head_rows = nq * params.heads_ratio;  // the K/V head's query rows
  int const chunks = (head_rows + kRows - 1) / kRows;
  int const chunk = static_cast<int>(blockIdx.x % chunks);
  int const split = static_cast<int>(blockIdx.x / chunks % params.num_splits);
  int const group = static_cast<int>(blockIdx.x / chunks / params.num_splits);
  int const h_kv = group % params.heads_kv;
  int const b = group / params.heads_kv;
  ChunkRows const chunk_rows{chunk * kRows, min(kRows, head_rows - chunk * kRows), nq, h_kv * params.heads_ratio};
  int const rows = chunk_rows.count;
  int keys = params.seqlen_k;  // L: this entry's keys
  if (params.seqlens_k != nullptr) { keys = rules::cache_entry_keys(params.seqlens_k[b], params.seqlens_k_added, params.seqlen_k); }
  // The keys row r sees, [first_key(r), last_key(r)] (rules.h); the left bounds (left padding, a left window
  // bound) only in the general instantiation. The first and last keys grow with the query: query 0's are
  // at most those of any row of the chunk, query nq - 1's at least.
  int const key_begin = Traits::kGeneral && params.leftpad_k != nullptr ? rules::entry_leftpad(params.leftpad_k[b], keys) : 0;
  auto first_key_of_query = [&](int query) {
    return Traits::kGeneral ? rules::mask_row_lo(query, nq, keys, params.window_left, key_begin) : 0;
  };
  auto last_key = [&](int r) {
    return rules::mask_row_hi(chunk_rows.query(r), nq, keys, params.window_right) - 1;
  };
  int const last_key_min = rules::mask_row_hi(0, nq, keys, params.window_right) - 1;
  int const first_key_max = first_key_of_query(nq - 1);
  // The splits share the steps from the first any row sees.
  int const tiles = (keys + kBlockN - 1) / kBlockN;
  int const tile_first = Traits::kGeneral ? min(tiles, first_key_of_query(0) / kBlockN) : 0;
  int const per_split = (tiles - tile_first + params.num_splits - 1) / params.num_splits;
  int const tile_begin = min(tiles, tile_first + split * per_split), tile_end = min(tiles, tile_begin + per_split);
  int const steps = tile_end - tile_begin;

  // ---- Shared memory -------------------------------------------------------------------------------------
  MmaElement* const q_smem = reinterpret_cast<MmaElement*>(smem);
  char* const ring = smem + Traits::kSmemQ + warp * kStages * 2 * Traits::kStageSlotBytes;  // this warp's stages
  Tensor sQ = make_tensor(make_smem_ptr(q_smem), typename Traits::SmemLayoutQ{});
  auto stage_k = [&](int s) {  // the stage slots, as the copies fill them
    return make_tensor(make_smem_ptr(reinterpret_cast<CacheElement*>(ring + 2 * s * Traits::kStageSlotBytes)),
                       typename Traits::SmemLayoutStage{});
  };
  auto stage_v = [&](int s) {
    return make_tensor(make_smem_ptr(reinterpret_cast<CacheElement*>(ring + (2 * s + 1) * Traits::kStageSlotBytes)),
                       typename Traits::SmemLayoutStage{});
  };
  // The K and V slots the MMAs read: the stage itself, or (fp8) the warp's widened pair.
  MmaElement* const wide = reinterpret_cast<MmaElement*>(smem + Traits::kSmemQ + Traits::kSmemRing) + warp * 2 * Traits::kSlotElems;
  auto mma_k_ptr = [&](int s) {
    return Traits::kFp8Cache ? wide : reinterpret_cast<MmaElement*>(ring + 2 * s * Traits::kStageSlotBytes);
  };
  auto mma_v_ptr = [&](int s) {
    return Traits::kFp8Cache ? wide + Traits::kSlotElems : reinterpret_cast<MmaElement*>(ring + (2 * s + 1) * Traits::kStageSlotBytes);
  };
  auto slot_k = [&](int s) { return make_tensor(make_smem_ptr(mma_k_ptr(s)), typename Traits::SmemLayoutKV{}); };

  // ---- Loads ---------------------------------------------------------------------------------------------
  // A paged cache (rules.h): key p is row p % page_size of page block_table[b][p / page_size]; a page
  // index outside [0, num_pages) is no page (its keys are zero-filled, never read, and masked). Lane
  // l < step_pages copies the entry of the l-th page that the warp's keys of `step` touch (if a key below
  // L lies in it) into table slot step % kStages; the copies of step s read it from there. The entries of
  // step s + kStages - 1 travel in the cp.async group of step s. That slot is refilled before step s
  // computes, so the copies of step s also leave in missing_ring[s % kStages] which of its keys lie on a
  // missing page, for its mask.
  bool const paged = params.block_table != nullptr;
  const int* const table = paged ? params.block_table + b * params.block_table_stride : nullptr;
  int* const table_ring = reinterpret_cast<int*>(smem + Traits::kSmemTableOffset) + warp * kStages * kWarpKeys;
  unsigned* const missing_ring = reinterpret_cast<unsigned*>(smem + Traits::kSmemMissingOffset) + warp * kStages;
  // Page sizes are powers of two here (launch_decode.cu): a key's page is a shift.
  int const page_shift = params.page_size_log2;
  int const step_pages = max(1, kWarpKeys >> max(page_shift, 0));  // entries a step needs
  auto step_key0 = [&](int step) { return (tile_begin + step) * kBlockN + warp * kWarpKeys; };
  auto load_table = [&](int step) {
    int const page = rules::page_slot_of_key_pow2(step_key0(step), page_shift) + lane;
    bool const read = step < steps && page << page_shift < keys;
    if (lane < step_pages) {
      cp_async_4_zfill(&table_ring[step % kStages * kWarpKeys + lane], table + (read ? page : 0), read);
    }
  };

  // Q: every thread, zero rows past `rows` (their scores are never read out).
  const Element* const q = static_cast<const Element*>(params.q) + b * params.q_batch_stride +
                           static_cast<long long>(h_kv) * params.heads_ratio * params.q_head_stride;
  constexpr int kQChunksPerRow = kHeadDim / 8;
  if constexpr (!kConvertQ) {
    CUTE_UNROLL
    for (int c = tidx; c < kRows * kQChunksPerRow; c += Traits::kNThreads) {
      int const r = c / kQChunksPerRow, col = c % kQChunksPerRow * 8;
      bool const valid = r < rows;
      const Element* src = valid ? q + (chunk_rows.head(r) - chunk_rows.head0) * params.q_head_stride +
                                       chunk_rows.query(r) * params.q_row_stride + col
                                 : q;
      cp_async_16_zfill(&sQ(r, col), src, valid);
    }
  }
  if (paged) {  // the first steps' entries, before their copies
    CUTE_UNROLL
    for (int s = 0; s < kStages - 1; ++s) { load_table(s); }
  }
  cute::cp_async_fence();
  if (paged) {
    cute::cp_async_wait<0>();
    __syncwarp();
  }

  // K / V step `step` of this warp: keys tile * kBlockN + warp * kWarpKeys + [0, kWarpKeys); keys past
  // L are zero-filled (a stale V row would turn the zero weight into NaN).
  // The copies are most of the instructions a step issues, and with one CTA a multiprocessor the kernel
  // is bound by its issue rate (ncu: ~3.6 cycles a warp instruction), so they are spelled out for the
  // fewest: lane l copies 16-byte chunk l % kChunksPerRow of rows l / kChunksPerRow + kRowsPerPass i
  // (pass i, kRowsPerPass whole rows a warp instruction); a pass's global address is one multiply-add
  // on the step's first row, its shared address a register of the lane's swizzle pattern (it repeats
  // every 8 rows) plus immediates. (Written through CuTe's tensors the copies took ~10 instructions
  // each, 167 of a step's ~420.)
  constexpr int kRowsPerPass = 32 / kChunksPerRow;
  constexpr int kPasses = kWarpKeys / kRowsPerPass;
  constexpr int kPeriod = 8 / kRowsPerPass;  // passes of one swizzle pattern
  constexpr int kSlotBytes = Traits::kStageSlotBytes;
  constexpr int kEightRowsBytes = Traits::kEightRowsElems * int(sizeof(CacheElement));
  static_assert(32 % kChunksPerRow == 0 && kPasses % kPeriod == 0 && kPasses % 2 == 0);
  int const lane_row = lane / kChunksPerRow, lane_col = lane % kChunksPerRow * Traits::kChunkElems;
  uint32_t const ring_k0 = static_cast<uint32_t>(__cvta_generic_to_shared(ring));  // slot 0's K
  uint32_t swizzled[kPeriod];  // this lane's first kPeriod chunks, bytes from a slot's start
  CUTE_UNROLL
  for (int j = 0; j < kPeriod; ++j) {
    swizzled[j] = static_cast<uint32_t>(__cvta_generic_to_shared(&stage_k(0)(lane_row + kRowsPerPass * j, lane_col))) - ring_k0;
  }
  // Passes [first, first + count) of the step in `slot`, from k_src / v_src (this lane's chunk of pass
  // `first`'s rows) on at the byte strides below; the passes whose row is not below `rows_left` are
  // zero-filled (the source is ignored, not read), and in the general instantiation those below
  // `rows_hidden` (left padding: rows that may hold anything, NaN included, which a zero weight would not
  // cancel). One form for every step: with a separate form for full steps the compiler ran both,
  // predicated.
  long long const k_row_bytes = params.k_row_stride * int(sizeof(CacheElement));
  long long const v_row_bytes = params.v_row_stride * int(sizeof(CacheElement));
  uint32_t const k_pass_bytes = static_cast<uint32_t>(kRowsPerPass * k_row_bytes);  // < 2^32 (launch_decode.cu)
  uint32_t const v_pass_bytes = static_cast<uint32_t>(kRowsPerPass * v_row_bytes);
  auto copy_passes = [&](int slot, const char* k_src, const char* v_src, auto first, auto count,
                         int rows_left, int rows_hidden) __attribute__((always_inline)) {
    constexpr int kFirst = decltype(first)::value, kCount = decltype(count)::value;
    uint32_t const slot_k0 = ring_k0 + 2 * slot * kSlotBytes;
    int const lane_rows_left = rows_left - lane_row;  // pass i has a row iff kRowsPerPass i < this
    int const lane_rows_hidden = rows_hidden - lane_row;  // and (general) iff kRowsPerPass i >= this
    CUTE_UNROLL
    for (int i = kFirst; i < kFirst + kCount; ++i) {
      uint32_t const dst = slot_k0 + swizzled[i % kPeriod] + i / kPeriod * kEightRowsBytes;
      bool const valid = kRowsPerPass * i < lane_rows_left && (!Traits::kGeneral || kRowsPerPass * i >= lane_rows_hidden);
      cp_async_16_zfill(dst, mad_wide(k_pass_bytes, i - kFirst, k_src), valid);
      cp_async_16_zfill(dst + kSlotBytes, mad_wide(v_pass_bytes, i - kFirst, v_src), valid);
    }
  };
  // Every pass of a step whose rows follow one another at row_stride from k_rows / v_rows (its first row).
  auto copy_rows = [&](int slot, const CacheElement* k_rows, const CacheElement* v_rows, int rows_left,
                       int rows_hidden) __attribute__((always_inline)) {
    const char* const k_src = reinterpret_cast<const char*>(k_rows + lane_col) + lane_row * k_row_bytes;
    const char* const v_src = reinterpret_cast<const char*>(v_rows + lane_col) + lane_row * v_row_bytes;
    copy_passes(slot, k_src, v_src, Int<0>{}, Int<kPasses>{}, rows_left, rows_hidden);
  };

  // (A paged cache's batch strides are its page strides.)
  int const kv_batch = paged ? 0 : b;
  const CacheElement* const k_head =
      static_cast<const CacheElement*>(params.k) + kv_batch * params.k_batch_stride + h_kv * params.k_head_stride;
  const CacheElement* const v_head =
      static_cast<const CacheElement*>(params.v) + kv_batch * params.v_batch_stride + h_kv * params.v_head_stride;
  // A missing page's copies are zero-fills (their source is not read); they still get an address in the cache.
  auto page_or_0 = [&](int entry) { return rules::page_index_valid(entry, params.num_pages) ? entry : 0; };
  auto page_rows = [&](int entry, long long row0, long long batch_stride, long long row_stride, const CacheElement* head) {
    return head + page_or_0(entry) * batch_stride + row0 * row_stride;
  };
  auto load_step = [&](int step) __attribute__((always_inline)) {
    int const key0 = step_key0(step);
    int const slot = step % kStages;
    int const rows_left = keys - key0, rows_hidden = key_begin - key0;
    int const* const entries = table_ring + slot * kWarpKeys;
    if (paged) {  // which of the step's keys lie on a missing page, for the mask of step `step`
      int const key = key0 + lane;
      int const entry = rules::page_slot_of_key_pow2(key, page_shift) - rules::page_slot_of_key_pow2(key0, page_shift);
      bool const missing = lane < kWarpKeys && key < keys && !rules::page_index_valid(entries[entry], params.num_pages);
      unsigned const missing_keys = __ballot_sync(0xffffffffu, missing);
      if (lane == 0) { missing_ring[slot] = missing_keys; }
    }
    if (!paged) {
      copy_rows(slot, k_head + key0 * params.k_row_stride, v_head + key0 * params.v_row_stride, rows_left, rows_hidden);
    } else if (step_pages == 1) {
      // The step's keys lie in one page (pages of kWarpKeys keys or more): one entry, and the copies of a
      // contiguous cache.
      long long const row0 = rules::row_in_page_pow2(key0, params.page_size);
      bool const missing = !rules::page_index_valid(entries[0], params.num_pages);
      copy_rows(slot, page_rows(entries[0], row0, params.k_batch_stride, params.k_row_stride, k_head),
                page_rows(entries[0], row0, params.v_batch_stride, params.v_row_stride, v_head), missing ? 0 : rows_left,
                rows_hidden);
    } else if (step_pages == 2) {
      // Two pages a step (16-key pages at d = 64, 8-key at d = 128): each half of the passes from its
      // page's first row.
      const char* const lane_k = reinterpret_cast<const char*>(k_head + lane_col) + lane_row * k_row_bytes;
      const char* const lane_v = reinterpret_cast<const char*>(v_head + lane_col) + lane_row * v_row_bytes;
      auto half = [&](int e, auto first) __attribute__((always_inline)) {
        bool const missing = !rules::page_index_valid(entries[e], params.num_pages);
        long long const page = page_or_0(entries[e]);
        long long const k_page = page * params.k_batch_stride * int(sizeof(CacheElement));
        long long const v_page = page * params.v_batch_stride * int(sizeof(CacheElement));
        copy_passes(slot, lane_k + k_page, lane_v + v_page, first, Int<kPasses / 2>{}, missing ? 0 : rows_left,
                    rows_hidden);
      };
      half(0, Int<0>{});
      half(1, Int<kPasses / 2>{});
    } else {  // smaller pages: a page per row
      int const first_page = rules::page_slot_of_key_pow2(key0, page_shift);
      Tensor sK = stage_k(slot);
      Tensor sV = stage_v(slot);
      CUTE_UNROLL
      for (int c = lane; c < kWarpKeys * kChunksPerRow; c += 32) {
        int const r = c / kChunksPerRow, col = c % kChunksPerRow * Traits::kChunkElems;
        bool valid = r < rows_left && (!Traits::kGeneral || r >= rows_hidden);
        long long page = 0, row = 0;
        if (valid) {
          int const key_slot = rules::page_slot_of_key_pow2(key0 + r, page_shift);
          int const entry = entries[key_slot - first_page];
          valid = rules::page_index_valid(entry, params.num_pages);
          page = valid ? entry : 0;
          row = rules::row_in_page_pow2(key0 + r, params.page_size);
        }
        cp_async_16_zfill(&sK(r, col), k_head + page * params.k_batch_stride + row * params.k_row_stride + col, valid);
        cp_async_16_zfill(&sV(r, col), v_head + page * params.v_batch_stride + row * params.v_row_stride + col, valid);
      }
    }
  };
  CUTE_UNROLL
  for (int s = 0; s < kStages - 1; ++s) {
    if (paged) {
      __syncwarp();  // every lane has read the slot the next entries overwrite
      load_table(s + kStages - 1);
    }
    if (s < steps) { load_step(s); }
    cute::cp_async_fence();
  }

  // ---- MMA set-up ------------------------------------------------------------------------------------------
  typename Traits::TiledMma tiled_mma;
  auto thr_mma = tiled_mma.get_thread_slice(lane);
  Tensor tSrQ = thr_mma.partition_fragment_A(sQ);  // (MMA, kRows / 16, d / 16)
  Tensor tSrK = thr_mma.partition_fragment_B(slot_k(0));  // (MMA, kWarpKeys / 8, d / 16)
  Tensor tOrVt = thr_mma.partition_fragment_B(make_tensor(make_smem_ptr(mma_v_ptr(0)), typename Traits::SmemLayoutVtNoSwizzle{}));
  Tensor acc_o = partition_fragment_C(tiled_mma, Shape<Int<kRows>, Int<kHeadDim>>{});  // (MMA, kRows / 16, d / 8)
  clear(acc_o);
  auto smem_tiled_copy_Q = make_tiled_copy_A(typename Traits::SmemCopyAtom{}, tiled_mma);
  auto smem_thr_copy_Q = smem_tiled_copy_Q.get_thread_slice(lane);
  auto smem_tiled_copy_K = make_tiled_copy_B(typename Traits::SmemCopyAtom{}, tiled_mma);
  auto smem_thr_copy_K = smem_tiled_copy_K.get_thread_slice(lane);
  auto smem_tiled_copy_V = make_tiled_copy_B(typename Traits::SmemCopyAtomTransposed{}, tiled_mma);
  auto smem_thr_copy_V = smem_tiled_copy_V.get_thread_slice(lane);

  // Scores in the MMA's units: q.k, or with an fp8 cache (q 2^q_exponent).k_fp8, which the descale and the
  // exponent take back to q.k (params.h). The plain kernel reads its scales from the params where it uses
  // them (a register held across the loop cost its d = 128, 32-row instantiation 24 bytes of spills).
  float fp8_scale = 0.f;
  if constexpr (Traits::kFp8Cache) {
    int q_exponent = 0;
    if constexpr (kConvertQ) { q_exponent = load_q_as_fp16<Traits>(sQ, q, params, chunk_rows); }
    float const k_descale = params.k_descale == nullptr ? 1.f
                            : params.k_descale[b * params.k_descale_batch_stride + h_kv * params.k_descale_head_stride];
    fp8_scale = ldexpf(params.softmax_scale * k_descale, -q_exponent);
  }
  // Softcap (general instantiation; params.h): a score becomes tanh(q.k softcap_pre), whose units are the
  // cap's whatever the cache (softmax_scale is the cap).
  bool const capped = Traits::kGeneral && params.softcap_pre > 0.f;
  auto score_scale = [&] { return Traits::kFp8Cache && !capped ? fp8_scale : params.softmax_scale; };
  auto score_scale_log2 = [&] {
    return Traits::kFp8Cache && !capped ? fp8_scale * 1.4426950408889634f : params.softmax_scale_log2;
  };
  // The MMA's units to softcap's argument q.k softcap_pre (fp8: fp8_scale / softmax_scale is
  // k_descale 2^-q_exponent).
  auto softcap_pre = [&] {
    return Traits::kFp8Cache ? fp8_scale / params.softmax_scale * params.softcap_pre : params.softcap_pre;
  };

  // Q (the oldest group) has landed once kStages - 1 groups are left; every thread loaded part of it.
  cute::cp_async_wait<kStages - 1>();
  __syncthreads();
  Tensor tSsQ = smem_thr_copy_Q.partition_S(sQ);
  if constexpr (Traits::kQInRegisters) { copy(smem_tiled_copy_Q, tSsQ, smem_thr_copy_Q.retile_D(tSrQ)); }

  // This thread's accumulator rows (lane / 4 and + 8 of each slab) and their visible keys (the first ones
  // in the general instantiation only).
  constexpr int kThreadRows = 2 * kRows / 16;
  Tensor cS = make_identity_tensor(Shape<Int<kRows>, Int<kWarpKeys>>{});
  Tensor tScS = thr_mma.partition_C(cS);
  Tensor tScS_rc = make_tensor(tScS.data(), acc_layout_rowcol(tScS.layout()));  // (rows, cols) -> (row, col)
  int last_key_row[kThreadRows];
  int first_key_row[Traits::kGeneral ? kThreadRows : 1];
  CUTE_UNROLL
  for (int mi = 0; mi < kThreadRows; ++mi) {
    int const r = get<0>(tScS_rc(mi, 0));
    last_key_row[mi] = last_key(r);
    if constexpr (Traits::kGeneral) { first_key_row[mi] = first_key_of_query(chunk_rows.query(r)); }
  }

  // fp8: K or V (`which` 0 / 1) of the stage in `slot`, widened into the warp's MMA slot of it. Lane l widens
  // 16-byte chunks l + 32 i; a lane whose chunk lies in the odd 64-column half of the swizzled slot writes
  // its two halves in the other order, so that a store's 8 lanes hit distinct banks.
  auto widen = [&](int slot, int which) __attribute__((always_inline)) {
    constexpr int kLaneChunks = kWarpKeys * kChunksPerRow / 32;
    static_assert(kLaneChunks * 32 == kWarpKeys * kChunksPerRow);
    Tensor wide_slot = make_tensor(make_smem_ptr(which == 0 ? mma_k_ptr(slot) : mma_v_ptr(slot)), typename Traits::SmemLayoutKV{});
    Tensor stage = which == 0 ? stage_k(slot) : stage_v(slot);
    CUTE_UNROLL
    for (int i = 0; i < kLaneChunks; ++i) {
      int const c = lane + 32 * i, r = c / kChunksPerRow, col = c % kChunksPerRow * 16;
      uint4 lo, hi;
      widen_e4m3x16(*reinterpret_cast<const uint4*>(&stage(r, col)), lo, hi);
      bool const swap = col / 64 % 2;  // (selects, not an indexed pair: that would live in local memory)
      *reinterpret_cast<uint4*>(&wide_slot(r, col + (swap ? 8 : 0))) = swap ? hi : lo;
      *reinterpret_cast<uint4*>(&wide_slot(r, col + (swap ? 0 : 8))) = swap ? lo : hi;
    }
  };
  // fp8: a step's K is widened at the end of the step before (its conversion overlaps that step's PV), its V
  // after its own S MMAs (overlapping their latency and the softmax): step 0's K first.
  if constexpr (Traits::kFp8Cache && !Traits::kFp8Direct) {
    if (steps > 0) {
      cute::cp_async_wait<kStages - 2>();
      __syncwarp();
      widen(0, 0);
    }
  }

  // fp8 direct: this lane's byte offsets in a stage slot (the swizzle repeats every 8 rows): K's 16-byte
  // chunks of row lane / 4, V's run of d / 8 bytes of rows 2t, 2t + 1, 2t + 8, 2t + 9 (t = lane % 4).
  constexpr int kKRuns = Traits::kFp8Direct ? kHeadDim / 64 : 1, kVRunBytes = kHeadDim / 8;
  int k_run[kKRuns], v_run[4];
  if constexpr (Traits::kFp8Direct) {
    typename Traits::SmemLayoutStage const stage_layout;
    CUTE_UNROLL
    for (int c = 0; c < kKRuns; ++c) { k_run[c] = stage_layout(lane / 4, lane % 4 * (kHeadDim / 4) + 16 * c); }
    CUTE_UNROLL
    for (int q = 0; q < 4; ++q) { v_run[q] = stage_layout(2 * (lane % 4) + q % 2 + 8 * (q / 2), lane / 4 * kVRunBytes); }
  }
  struct alignas(kVRunBytes) VRun { uint32_t w[kVRunBytes / 4]; };

  OnlineSoftmax<kThreadRows, /*kLaggingReference=*/true> softmax;  // a warp's lanes run the same steps
  // ---- K/V loop: the warp's own ring, no CTA barrier ----------------------------------------------------
  // The loads of step + kStages - 1 (into the stage step - 1 used, and its block-table entries). An fp8 cache
  // issues them after the step's S MMAs: the kernel is then bound by its instructions' latency, not by
  // memory, and a paged cache's table reads before the copies would stall the step.
  auto load_ahead = [&](int step) __attribute__((always_inline)) {
    if (step + kStages - 1 < steps) {
      if (paged) { load_table(step + 2 * (kStages - 1)); }  // into the slot last read by load_step(step - 1)
      load_step(step + kStages - 1);
    }
    cute::cp_async_fence();
  };
  for (int step = 0; step < steps; ++step) {
    cute::cp_async_wait<kStages - 2>();
    __syncwarp();  // step's K / V, copied by every lane, are visible; every lane is done with step - 1's slot
    if constexpr (!Traits::kFp8Cache) { load_ahead(step); }

    int const slot = step % kStages;
    Tensor acc_s = partition_fragment_C(tiled_mma, Shape<Int<kRows>, Int<kWarpKeys>>{});  // (MMA, kRows / 16, kWarpKeys / 8)
    clear(acc_s);
    Tensor tSsK = smem_thr_copy_K.partition_S(slot_k(slot));
    if constexpr (Traits::kFp8Direct) {  // K's B fragments from the fp8 stage: 16 bytes, 4 k steps of one key
      const char* const stage_k_bytes = ring + 2 * slot * Traits::kStageSlotBytes;
      CUTE_UNROLL
      for (int j = 0; j < kWarpKeys / 8; ++j) {
        CUTE_UNROLL
        for (int c = 0; c < kHeadDim / 64; ++c) {
          uint4 lo, hi;
          widen_e4m3x16(*reinterpret_cast<const uint4*>(stage_k_bytes + 8 * j * kHeadDim + k_run[c]), lo, hi);
          uint32_t const b[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
          CUTE_UNROLL
          for (int s = 0; s < 4; ++s) {
            Tensor frag = recast<uint32_t>(tSrK(_, j, 4 * c + s));  // b0: k = 2t, 2t + 1; b1: 2t + 8, 2t + 9
            frag(0) = b[2 * s];
            frag(1) = b[2 * s + 1];
            cute::gemm(tiled_mma, tSrQ(_, 0, 4 * c + s), tSrK(_, j, 4 * c + s), acc_s(_, 0, j));
          }
        }
      }
    } else if constexpr (Traits::kQInRegisters) {
      gemm_rs(acc_s, tSrQ, tSrK, tSsK, tiled_mma, smem_tiled_copy_K, smem_thr_copy_K);
    } else {
      gemm_ss(acc_s, tSrQ, tSrK, tSsQ, tSsK, tiled_mma, smem_tiled_copy_Q, smem_tiled_copy_K, smem_thr_copy_Q,
              smem_thr_copy_K);
    }

    if constexpr (Traits::kFp8Cache) {
      if constexpr (!Traits::kFp8Direct) {
        widen(slot, 1);
        __syncwarp();  // V widened by every lane; every lane is past this step's K reads
      }
      load_ahead(step);  // (into the slot of step - 1, which every lane left before the loop's top barrier)
    }

    if (capped) { apply_softcap(acc_s, softcap_pre()); }  // before the mask's -inf

    int const key0 = step_key0(step);
    unsigned const missing_keys = paged ? missing_ring[slot] : 0u;  // keys on a missing page count as masked
    // Some key of the step is hidden from some row: past a row's last, before a row's first, or on a missing page.
    if (key0 + kWarpKeys - 1 > last_key_min || (Traits::kGeneral && key0 < first_key_max) || missing_keys != 0) {
      Tensor scores = make_tensor(acc_s.data(), acc_layout_rowcol(acc_s.layout()));
      CUTE_UNROLL
      for (int mi = 0; mi < kThreadRows; ++mi) {
        CUTE_UNROLL
        for (int ni = 0; ni < size<1>(scores); ++ni) {
          int const col = get<1>(tScS_rc(mi, ni));
          bool hidden = key0 + col > last_key_row[mi] || (missing_keys >> col & 1u);
          if constexpr (Traits::kGeneral) { hidden = hidden || key0 + col < first_key_row[mi]; }
          if (hidden) { scores(mi, ni) = -INFINITY; }
        }
      }
    }
    if (params.alibi_slopes != nullptr) {  // ALiBi (params.h), in raw units; slopes and diagonals per step, in
      // this uniform branch, so that the plain kernel holds no registers for them
      Tensor scores = make_tensor(acc_s.data(), acc_layout_rowcol(acc_s.layout()));
      CUTE_UNROLL
      for (int mi = 0; mi < kThreadRows; ++mi) {
        int const r = get<0>(tScS_rc(mi, 0));
        int const h = chunk_rows.head(min(r, rows - 1));  // rows past `rows` are never read out
        float const slope = params.alibi_slopes[b * params.alibi_batch_stride + h] / score_scale();
        float const first = static_cast<float>(rules::mask_diagonal(chunk_rows.query(r), nq, keys) - key0);
        CUTE_UNROLL
        for (int ni = 0; ni < size<1>(scores); ++ni) {
          scores(mi, ni) -= slope * fabsf(first - static_cast<float>(get<1>(tScS_rc(mi, ni))));
        }
      }
    }
    softmax.update(acc_s, acc_o, score_scale_log2());

    Tensor rP = convert_type<MmaElement>(acc_s);
    Tensor tOrP = make_tensor(rP.data(), acc_layout_to_a_operand(rP.layout()));  // (MMA, kRows / 16, kWarpKeys / 16)
    if constexpr (Traits::kFp8Direct) {  // V's B fragments from the fp8 stage: n tile i takes column i of the runs
      const char* const stage_v_bytes = ring + (2 * slot + 1) * Traits::kStageSlotBytes;
      CUTE_UNROLL
      for (int kk = 0; kk < kWarpKeys / 16; ++kk) {
        VRun run[4];  // keys 16 kk + 2t, + 1, + 8, + 9
        CUTE_UNROLL
        for (int q = 0; q < 4; ++q) { run[q] = *reinterpret_cast<const VRun*>(stage_v_bytes + 16 * kk * kHeadDim + v_run[q]); }
        CUTE_UNROLL
        for (int w = 0; w < kVRunBytes / 4; ++w) {
          uint32_t pairs[2][2];  // [b0 / b1][columns 4w, 4w + 1 / 4w + 2, 4w + 3]
          interleave_e4m3(run[0].w[w], run[1].w[w], pairs[0][0], pairs[0][1]);
          interleave_e4m3(run[2].w[w], run[3].w[w], pairs[1][0], pairs[1][1]);
          CUTE_UNROLL
          for (int i = 0; i < 4; ++i) {
            Tensor frag = recast<uint32_t>(tOrVt(_, 4 * w + i, kk));  // b0: keys 2t, 2t + 1; b1: 2t + 8, 2t + 9
            frag(0) = widen_e4m3x2(pairs[0][i / 2] >> 16 * (i % 2));
            frag(1) = widen_e4m3x2(pairs[1][i / 2] >> 16 * (i % 2));
            cute::gemm(tiled_mma, tOrP(_, 0, kk), tOrVt(_, 4 * w + i, kk), acc_o(_, 0, 4 * w + i));
          }
        }
      }
    } else {
      Tensor sVt = make_tensor(make_smem_ptr(mma_v_ptr(slot)), typename Traits::SmemLayoutVt{});
      Tensor tOsVt = smem_thr_copy_V.partition_S(sVt);
      gemm_rs(acc_o, tOrP, tOrVt, tOsVt, tiled_mma, smem_tiled_copy_V, smem_thr_copy_V);
    }
    if constexpr (Traits::kFp8Cache && !Traits::kFp8Direct) {
      if (step + 1 < steps) {  // the next step's K (its group is the oldest left; the loop's top syncs the warp)
        cute::cp_async_wait<kStages - 2>();
        __syncwarp();
        widen((step + 1) % kStages, 0);
      }
    }
  }

  // ---- Merge the warps by their lse, then write o / lse (or this split's partials) -----------------------
  Tensor lse = softmax.finalize(acc_o, score_scale());  // O_w normalized; lse_w natural log
  cute::cp_async_wait<0>();
  __syncthreads();  // every warp is done with its ring
  float* const merge_o = reinterpret_cast<float*>(smem + Traits::kSmemQ);  // [warp][row][kMergeRowStride]
  float* const merge_lse = merge_o + kNWarps * kRows * Traits::kMergeRowStride;  // [warp][row]
  {
    Tensor cO = make_identity_tensor(Shape<Int<kRows>, Int<kHeadDim>>{});
    Tensor tOcO = thr_mma.partition_C(cO);
    Tensor tOcO_rc = make_tensor(tOcO.data(), acc_layout_rowcol(tOcO.layout()));
    Tensor acc_o_rc = make_tensor(acc_o.data(), acc_layout_rowcol(acc_o.layout()));
    CUTE_UNROLL
    for (int mi = 0; mi < kThreadRows; ++mi) {
      int const r = get<0>(tOcO_rc(mi, 0));
      CUTE_UNROLL
      for (int ni = 0; ni < size<1>(acc_o_rc); ++ni) {
        int const n = get<1>(tOcO_rc(mi, ni));
        int const col = Traits::kFp8Direct ? v_direct_column<kHeadDim>(n) : n;
        merge_o[(warp * kRows + r) * Traits::kMergeRowStride + col] = acc_o_rc(mi, ni);
      }
      if (lane % 4 == 0) { merge_lse[warp * kRows + r] = lse(mi); }
    }
  }
  __syncthreads();

  bool const partial = params.num_splits > 1;
  float const v_descale = !Traits::kFp8Cache || params.v_descale == nullptr ? 1.f
                          : params.v_descale[b * params.v_descale_batch_stride + h_kv * params.v_descale_head_stride];
  long long const rows_all = static_cast<long long>(params.batch) * params.heads_q * nq;  // of o_accum
  // A row's lse and its warps' weights, computed by each thread that writes part of the row (no barrier and
  // no one-warp phase between the merge's writes and the output; the weights are those of common/lse_merge.h,
  // rounded as they were when one thread a row wrote them to shared memory).
  auto row_merge = [&](int r, float (&weight)[kNWarps]) {
    float m = -INFINITY;
    CUTE_UNROLL
    for (int w = 0; w < kNWarps; ++w) { weight[w] = merge_lse[w * kRows + r], m = fmaxf(m, weight[w]); }
    float sum = 0.f;
    CUTE_UNROLL
    for (int w = 0; w < kNWarps; ++w) { sum += merge_weight(weight[w], m); }  // exp(lse_w - m)
    float row_lse = merged_lse(m, sum);
    if (params.sinks != nullptr && !partial) {  // final rows take the sink (a split's: the combine)
      row_lse = rules::lse_with_sink(row_lse, params.sinks[chunk_rows.head(r) * params.sinks_head_stride +
                                                           chunk_rows.query(r) * params.sinks_row_stride]);
    }
    CUTE_UNROLL
    for (int w = 0; w < kNWarps; ++w) { weight[w] = merge_weight(weight[w], row_lse); }
    return row_lse;
  };
  // Four columns a thread at a time: 16-byte shared loads, 16-byte partial or 8-byte output stores, and a row's
  // head and query (divisions) once per four columns (one column a thread, this loop was a fifth of a
  // 2k-key call's samples under ncu). o's rows are 16-byte aligned (sm90_decode_covers), o_accum's too.
  constexpr int kCols = 4, kRowChunks = kHeadDim / kCols;
  for (int e = tidx; e < rows * kRowChunks; e += Traits::kNThreads) {
    int const r = e / kRowChunks, col = e % kRowChunks * kCols;
    float weight[kNWarps];
    float const row_lse = row_merge(r, weight);
    float4 out = make_float4(0.f, 0.f, 0.f, 0.f);
    CUTE_UNROLL
    for (int w = 0; w < kNWarps; ++w) {
      if (weight[w] != 0.f) {
        float4 const part = *reinterpret_cast<const float4*>(&merge_o[(w * kRows + r) * Traits::kMergeRowStride + col]);
        out.x += weight[w] * part.x, out.y += weight[w] * part.y;
        out.z += weight[w] * part.z, out.w += weight[w] * part.w;
      }
    }
    if constexpr (Traits::kFp8Cache) { out.x *= v_descale, out.y *= v_descale, out.z *= v_descale, out.w *= v_descale; }
    int const h = chunk_rows.head(r), i = chunk_rows.query(r);
    long long const row = (static_cast<long long>(b) * params.heads_q + h) * nq + i;
    if (partial) {
      long long const at = split * rows_all + row;
      *reinterpret_cast<float4*>(&params.o_accum[at * kHeadDim + col]) = out;
      if (col == 0) { params.lse_accum[at] = row_lse; }
    } else {
      Element* o = static_cast<Element*>(params.o) + b * params.o_batch_stride + h * params.o_head_stride + i * params.o_row_stride;
      struct alignas(8) { Element x[kCols]; } const packed{{static_cast<Element>(out.x), static_cast<Element>(out.y),
                                                          static_cast<Element>(out.z), static_cast<Element>(out.w)}};
      *reinterpret_cast<uint2*>(o + col) = *reinterpret_cast<const uint2*>(&packed);
      if (col == 0 && params.lse != nullptr) {
        params.lse[b * params.lse_batch_stride + h * params.lse_head_stride + i] = row_lse;
      }
    }
  }
}

}  // namespace cutlassfa::sm90decode
