// Compile-time configuration of the warp-specialized Hopper (sm_90a) forward kernel: the tile of a head
// dim (tile_config.h), the CTA's roles and their registers, the shared layouts seen by TMA and by
// wgmma, the TMA copy types, the named barriers, and the shared storage.
//
// One CTA = 1 producer warpgroup (one thread issues every TMA load) + 2 or 3 consumer warpgroups, each
// owning 64 of the tile's kBlockM = 128 or 192 query rows and running both GEMMs and the softmax for them.
#pragma once

#include <cute/tensor.hpp>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/arch/mma_sm90.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>

#include <cutlass/arch/barrier.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "cutlassfa/params.h"
#include "sm90ws/fp8_key_order.h"
#include "sm90ws/launch_fwd.h"  // ScoreTerm
#include "sm90ws/scheduler.h"
#include "sm90ws/tile_config.h"  // the tile shapes (read by the planner too)
#include "sm90ws/tma_extents.h"

namespace cutlassfa::sm90ws {

using namespace cute;

// Named barrier ids (cutlass::arch::NamedBarrier adds the ids CUTLASS reserves; 0 is __syncthreads;
// 8 are left to users). Consumer warpgroup w uses kMmaTurn0 + w and kEpilogue0 + w.
enum class NamedBarriers : uint32_t {
  kMmaTurn0 = 0,   // consumer warpgroup 0 may issue its GEMMs (ping-pong), 256 threads; 1, 2: the others
  kEpilogue0 = 3,  // consumer warpgroup 0's O tile is complete in shared memory, 128 threads; 4, 5: the others
  kCount = 6,
};
static_assert(static_cast<uint32_t>(NamedBarriers::kCount) + cutlass::arch::NamedBarrier::ReservedNamedBarrierCount <=
                  cutlass::arch::NamedBarrier::HardwareMaxNumNamedBarriers,
              "the named barriers fit beside CUTLASS's reserved ones");

// The bytes of the V tiles as (d, kBlockN, stage), the B operand of P V: (kBlockN, d, stage) tiles re-viewed,
// or V^T tiles (kTransposed) as they are. A class, so that only the case in use is formed.
template <bool kTransposed, class SmemLayoutV, int kHeadDim, int kBlockN, int kStages>
struct VtLayout {
  using type = SmemLayoutV;
};
template <class SmemLayoutV, int kHeadDim, int kBlockN, int kStages>
struct VtLayout<false, SmemLayoutV, kHeadDim, kBlockN, kStages> {
  using type = decltype(composition(SmemLayoutV{}, make_layout(Shape<Int<kHeadDim>, Int<kBlockN>, Int<kStages>>{},
                                                               Stride<Int<kBlockN>, _1, Int<kBlockN * kHeadDim>>{})));
};

// Input_: the caller's dtype, cutlass::half_t, cutlass::bfloat16_t, or float: fp32 K and V arrive split
// into fp16 by the pre-pass (cutlassfa/split_fp32.h): K as rows of 2 d columns [hi | lo] (kHeadDimQK),
// V as fp16 hi; fp32 Q is loaded as it is and split into the same [hi | lo] rows in shared memory at
// the start of each tile (sm90ws/split_q.h); S = Q K^T is the three products of the halves
// (warpgroup_gemm_split), and O is written in fp32.
// cutlass::float_e4m3_t (fp8 attention): both GEMMs are e4m3 wgmma; V arrives as V^T rows of keys in the
// key order of sm90ws/fp8_key_order.h (the pre-pass, sm90ws/fp8_v_transpose.h), the descales fold into the
// softmax scale and the epilogue (sm90ws/fp8_descale.h), and O is written in Output_ (bf16 or fp16).
// kVarlen_: q / k / v / o are packed (total, heads, d) arrays of a varlen batch (cu_seqlens): a separate
// instantiation, so that the dense kernel carries none of the per-entry offsets (sm90ws/tma_extents.h).
// kScoreTerm_: softcap or ALiBi, applied to every score by the steps of its instantiation (sm90ws/score_terms.h).
template <int kHeadDim_, class Input_, bool kVarlen_ = false, class Output_ = Input_,
          ScoreTerm kScoreTerm_ = ScoreTerm::kNone>
struct Traits {
  static constexpr bool kSplitQK = std::is_same_v<Input_, float>;
  static constexpr bool kFp8 = std::is_same_v<Input_, cutlass::float_e4m3_t>;
  using Element = cute::conditional_t<kSplitQK, cutlass::half_t, Input_>;  // what the MMAs read
  using ElementO = Output_;
  static_assert(kFp8 ? std::is_same_v<Output_, cutlass::bfloat16_t> || std::is_same_v<Output_, cutlass::half_t>
                     : std::is_same_v<Output_, Input_>,
                "O in the inputs' dtype, or bf16 / fp16 for fp8 inputs");
  static constexpr int kHeadDim = kHeadDim_;                              // columns of V and O
  static constexpr int kHeadDimQK = kSplitQK ? 2 * kHeadDim : kHeadDim;  // columns of Q and K
  static constexpr bool kVarlen = kVarlen_;
  static_assert(!(kFp8 && kVarlen), "fp8: dense tensors only");
  static constexpr ScoreTerm kScoreTerm = kScoreTerm_;
  static_assert(kScoreTerm == ScoreTerm::kNone || !kFp8, "softcap and ALiBi: not on fp8 attention");
  using Tile = cute::conditional_t<kSplitQK, TileConfigFp32<kHeadDim>,
                                   cute::conditional_t<kFp8, TileConfigFp8<kHeadDim>, TileConfig<kHeadDim>>>;
  static constexpr int kBlockM = Tile::kBlockM;
  static constexpr int kBlockN = Tile::kBlockN;
  static constexpr int kStages = Tile::kStages;
  static constexpr int kNConsumerWarpGroups = kBlockM / 64;
  static constexpr int kNConsumerThreads = 128 * kNConsumerWarpGroups;
  static constexpr int kNThreads = 128 + kNConsumerThreads;  // producer warpgroup first
  // setmaxnreg: the producer warpgroup only issues TMA; the consumers take the rest of the register
  // file, FlashAttention-3's split: 128 x 24 + 256 x 240 = 64512, or 128 x 32 + 384 x 160 = 65536.
  static constexpr int kProducerRegisters = kNConsumerWarpGroups == 2 ? 24 : 32;
  static constexpr int kConsumerRegisters = kNConsumerWarpGroups == 2 ? 240 : 160;
  static_assert(kBlockM == 128 || kBlockM == 192, "two or three consumer warpgroups of 64 rows");
  static_assert(kBlockN % 16 == 0 && kBlockN <= 256, "P V takes K slices of 16 keys; one wgmma spans the keys");
  static_assert(kHeadDim % 32 == 0, "a 64- or 128-byte swizzle atom spans the columns");
  static_assert(!kFp8 || kBlockN % kFp8KeyGroup == 0, "fp8: whole groups of the P V key order");
  // Ping-pong: the consumer warpgroups take turns issuing their GEMMs, in a ring (sm90ws/consumer.h,
  // MmaTurns). false lets each issue whenever its operands are ready.
  static constexpr bool kPingPong = Tile::kPingPong;

  // ---- MMA: S = Q K^T (both from shared memory), O += P V (P from registers) ------------------------
  // Warpgroup w of the consumers owns rows [64w, 64w + 64): the atom layout stacks them along M.
  using AtomLayout = Layout<Shape<Int<kNConsumerWarpGroups>, _1, _1>>;
  using TiledMmaQK = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<Int<kBlockM>, Int<kBlockN>, Int<kHeadDimQK>>>(),
      AtomLayout{}));
  // One wgmma spans the tile's keys: CuTe's selector takes an instruction N that divides kBlockN, and
  // knows 80 or 112 only with CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED (cpp/CMakeLists.txt); without it an
  // 80-key tile ran as five 64x16x16 wgmmas a k step, at two thirds of the speed.
  static_assert(size<1>(typename TiledMmaQK::AtomShape_MNK{}) == kBlockN, "S = Q K^T is one wgmma wide");
  // V is stored as rows of head_dim (the N index of P V is contiguous): an MN-major B operand. e4m3 wgmma
  // takes K-major operands only: fp8 V arrives transposed, rows of keys (the K index).
  static constexpr GMMA::Major kMajorV = kFp8 ? GMMA::Major::K : GMMA::Major::MN;
  using TiledMmaPV = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<Int<kBlockM>, Int<kHeadDim>, Int<kBlockN>>,
                           GMMA::Major::K, kMajorV>(),
      AtomLayout{}));

  // ---- Shared layouts: one layout per tile, written by TMA and read by wgmma ------------------------
  // 8 rows of 128 bytes with the 16-byte chunk XORed by the row (128-byte swizzle), K-major; rows of 64
  // (mod 128) bytes (d = 96 halves, d = 64 e4m3) take the 64-byte swizzle, rows of 32 (mod 64) bytes the
  // 32-byte one (80- and 112-key V^T rows, were they fp8).
  template <class T, int kCols>
  using SmemLayoutAtomOf = cute::conditional_t<
      kCols * sizeof_bits_v<T> % 1024 == 0, GMMA::Layout_K_SW128_Atom<T>,
      cute::conditional_t<kCols * sizeof_bits_v<T> % 512 == 0, GMMA::Layout_K_SW64_Atom<T>, GMMA::Layout_K_SW32_Atom<T>>>;
  template <int kCols>
  using SmemLayoutAtom = SmemLayoutAtomOf<Element, kCols>;
  using SmemLayoutQ = decltype(tile_to_shape(SmemLayoutAtom<kHeadDimQK>{}, Shape<Int<kBlockM>, Int<kHeadDimQK>>{}));
  // Q as TMA loads it: the Q tile itself, or for fp32 the caller's values (kBlockM, d) in a staging
  // buffer of their own (128-byte swizzled rows of floats), split into the Q tile by the consumers.
  using ElementQLoad = cute::conditional_t<kSplitQK, float, Element>;
  static constexpr int kHeadDimQLoad = kSplitQK ? kHeadDim : kHeadDimQK;
  using SmemLayoutQLoad = cute::conditional_t<
      kSplitQK, decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<float>{}, Shape<Int<kBlockM>, Int<kHeadDim>>{})),
      SmemLayoutQ>;
  using SmemLayoutK =
      decltype(tile_to_shape(SmemLayoutAtom<kHeadDimQK>{}, Shape<Int<kBlockN>, Int<kHeadDimQK>, Int<kStages>>{}));
  // (kBlockN, d, stage) as TMA writes it; fp8: V^T tiles (d, kBlockN, stage), rows of keys.
  using SmemLayoutV = cute::conditional_t<
      kFp8, decltype(tile_to_shape(SmemLayoutAtom<kBlockN>{}, Shape<Int<kHeadDim>, Int<kBlockN>, Int<kStages>>{})),
      decltype(tile_to_shape(SmemLayoutAtom<kHeadDim>{}, Shape<Int<kBlockN>, Int<kHeadDim>, Int<kStages>>{}))>;
  // The same bytes as (d, kBlockN, stage): the B operand of P V.
  using SmemLayoutVt = typename VtLayout<kFp8, SmemLayoutV, kHeadDim, kBlockN, kStages>::type;
  // The O tile is staged in shared memory of its own where it fits beside Q and the rings (d <= 128), so
  // that the next tile's Q can load during the epilogue; else over the Q tile (each consumer warpgroup
  // overwrites its own 64 rows once its last S = Q K^T has completed), and the next Q waits for it.
  // fp32 O (kSplitQK) has a layout of its own (rows of d floats); beside the fp32 Q staging buffer it
  // never fits apart, and goes over Q' (2d halves a row: the same bytes, static_assert below).
  using SmemLayoutAtomO = SmemLayoutAtomOf<ElementO, kHeadDim>;
  using SmemLayoutO = decltype(tile_to_shape(SmemLayoutAtomO{}, Shape<Int<kBlockM>, Int<kHeadDim>>{}));  // Q's, for halves
  static constexpr int kSmemBytesQ = cosize_v<SmemLayoutQ> * sizeof(Element);
  static constexpr int kSmemBytesKV = (cosize_v<SmemLayoutK> + cosize_v<SmemLayoutV>) * sizeof(Element);
  static constexpr int kSmemBytesO = cosize_v<SmemLayoutO> * sizeof(ElementO);
  static constexpr int kSmemBytesQStaging = kSplitQK ? cosize_v<SmemLayoutQLoad> * sizeof(float) : 0;
  static constexpr bool kSeparateO = kSmemBytesQ + kSmemBytesQStaging + kSmemBytesO + kSmemBytesKV + 1024 <= 227 * 1024;
  // fp32 O over Q': a warpgroup's 64 rows of d floats and of 2d halves are the same 128-byte swizzled
  // rows, the same bytes.
  static_assert(kSeparateO || !kSplitQK || (kSmemBytesO == kSmemBytesQ && kHeadDim % 32 == 0),
                "fp32 O staged over the Q tile covers each warpgroup's own rows");
  static_assert(kSeparateO || !kFp8, "fp8: O (2 bytes an element) has no room over Q (1 byte)");
  // Q buffers: with two, the producer loads the next tile's Q while the consumers still run this one
  // (it lands before they need it), so a short sequence's tiles do not wait for Q at every start.
  // Needs O apart from Q and room for a third Q tile (d <= 128); else one, reloaded after the tile.
#ifdef CUTLASSFA_SM90WS_Q_STAGES  // measurement builds: cpp/sm90ws/selftest.sh NVCC_FLAGS=-D...=1
  static constexpr int kQStages = kSeparateO ? CUTLASSFA_SM90WS_Q_STAGES : 1;
#else
  static constexpr int kQStages =
      kSeparateO && 2 * kSmemBytesQ + kSmemBytesO + kSmemBytesKV + 1024 <= 227 * 1024 ? 2 : 1;
#endif
  static_assert(kQStages == 1 || kQStages == 2, "one or two Q buffers");
  static_assert(kQStages == 1 || !kSplitQK, "one fp32 staging buffer: one Q buffer");
  // When the consumers give a Q buffer back (barrier_q_empty): fp32, as soon as each warpgroup has split
  // its rows out of the staging buffer; with O apart, after the last S = Q K^T; with O over Q, after the
  // epilogue.
  static constexpr bool kReleaseQAfterSplit = kSplitQK;
  static constexpr bool kReleaseQAfterLastS = kSeparateO && !kSplitQK;
  static constexpr bool kReleaseQAfterEpilogue = !kSeparateO && !kSplitQK;
  // Two columns a store (the accumulator's pairs).
  using SmemCopyAtomO = Copy_Atom<UniversalCopy<cute::uint_bit_t<2 * sizeof_bits_v<ElementO>>>, ElementO>;
  // Shared -> global for one warpgroup's 64 rows: 16 bytes a thread; the threads of a row cover the
  // largest power-of-two number of 16-byte chunks that divides the row (d / 8 = 8, 12, 16, 24, 32
  // chunks of halves: 8, 4, 16, 8, 32 threads), so a pass of the warpgroup is whole rows and tiles (64, d).
  static constexpr int kChunkO = 16 / sizeof(ElementO);  // columns a 16-byte chunk
  static constexpr int kThreadsPerRowO = (kHeadDim / kChunkO) & -(kHeadDim / kChunkO);
  static_assert(128 % kThreadsPerRowO == 0 && 64 % (128 / kThreadsPerRowO) == 0, "passes tile the warpgroup's rows");
  using GmemTiledCopyO = decltype(make_tiled_copy(
      Copy_Atom<UniversalCopy<cute::uint128_t>, ElementO>{},
      Layout<Shape<Int<128 / kThreadsPerRowO>, Int<kThreadsPerRowO>>, Stride<Int<kThreadsPerRowO>, _1>>{},
      Layout<Shape<_1, Int<kChunkO>>>{}));

  // ---- TMA: q, k, v seen as (row, dim, head, batch) tensors, one descriptor each ---------------------
  using ShapeRDHB = cute::Shape<int32_t, int32_t, int32_t, int32_t>;
  using StrideRDHB = cute::Stride<int64_t, _1, int64_t, int64_t>;
  template <class T>
  using GmemTensorOf = decltype(make_tensor(make_gmem_ptr(static_cast<T const*>(nullptr)), ShapeRDHB{}, StrideRDHB{}));
  using GmemTensor = GmemTensorOf<Element>;
  using TmaQ = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensorOf<ElementQLoad>{}, SmemLayoutQLoad{},
                                      Shape<Int<kBlockM>, Int<kHeadDimQLoad>>{}, _1{}));
  using TmaK = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, take<0, 2>(SmemLayoutK{}),
                                      Shape<Int<kBlockN>, Int<kHeadDimQK>>{}, _1{}));
  // fp8: the V^T workspace seen as (dim, key, head, batch).
  using TileShapeV = cute::conditional_t<kFp8, Shape<Int<kHeadDim>, Int<kBlockN>>, Shape<Int<kBlockN>, Int<kHeadDim>>>;
  using TmaV = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, take<0, 2>(SmemLayoutV{}), TileShapeV{}, _1{}));
  static constexpr uint32_t kTmaBytesQ = kBlockM * kHeadDimQLoad * sizeof(ElementQLoad);
  static constexpr uint32_t kTmaBytesK = kBlockN * kHeadDimQK * sizeof(Element);  // out-of-range rows count too
  static constexpr uint32_t kTmaBytesV = kBlockN * kHeadDim * sizeof(Element);

  // ---- Pipelines: K and V each a ring of kStages buffers (full: TMA landed; empty: every consumer
  // warpgroup is done reading) ------------------------------------------------------------------------
  using Pipeline = cutlass::PipelineTmaAsync<kStages>;
  using PipelineState = typename Pipeline::PipelineState;

  struct SharedStorage {
    // 1024-byte alignment: the 128-byte swizzle repeats every 8 rows of 128 bytes, by address.
    alignas(1024) cute::array_aligned<Element, kQStages * cosize_v<SmemLayoutQ>, 1024> q;  // kQStages tiles
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutK>, 1024> k;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutV>, 1024> v;
    alignas(1024) cute::array_aligned<ElementO, kSeparateO ? cosize_v<SmemLayoutO> : 0, 1024> o;
    alignas(1024) cute::array_aligned<float, kSplitQK ? cosize_v<SmemLayoutQLoad> : 0, 1024> q_staging;  // fp32 Q
    // The persistent loop's hand-over (sm90ws/kernel.h), per Q buffer, one phase each time the buffer
    // is used: barrier_q completes when the producer has written tile_index (and, for a tile with keys,
    // Q has landed); barrier_q_empty when every consumer thread is done with Q (and with tile_index).
    alignas(16) cutlass::arch::ClusterTransactionBarrier barrier_q[kQStages];
    alignas(16) cutlass::arch::ClusterBarrier barrier_q_empty[kQStages];
    int tile_index[kQStages];
    alignas(16) typename Pipeline::SharedStorage pipeline_k;
    alignas(16) typename Pipeline::SharedStorage pipeline_v;

    __forceinline__ __device__ Element* q_tile(int buffer) { return q.data() + buffer * cosize_v<SmemLayoutQ>; }
    // Where TMA writes a tile's Q.
    __forceinline__ __device__ ElementQLoad* q_load(int buffer) {
      if constexpr (kSplitQK) {
        return q_staging.data();
      } else {
        return q_tile(buffer);
      }
    }
  };
  static constexpr int kSmemSize = sizeof(SharedStorage);
  static_assert(kSmemSize <= 227 * 1024, "one CTA per SM fits its shared memory");
};

// What the kernel receives: the run-time problem, the three TMA descriptors (in parameter space,
// __grid_constant__, where TMA reads them) and the tile order.
template <class Traits>
struct KernelParams {
  FwdParams fwd;
  typename Traits::TmaQ tma_q;
  typename Traits::TmaK tma_k;
  typename Traits::TmaV tma_v;
  TileScheduler scheduler;
};

}  // namespace cutlassfa::sm90ws
