// The planner (which kernel, which instantiation, how many key splits, GQA packing) and the execution of
// a plan. The tensor-core family of a device was chosen once (backends.cpp); what each kernel covers and
// the tile it runs with come from the families themselves (cutlassfa/launch.h).
#include "cutlassfa/dispatch.h"

#include <algorithm>
#include <cmath>

#include "cutlassfa/config.h"
#include "cutlassfa/launch.h"
#include "cutlassfa/tuning.h"
#include "cutlassfa/workspace.h"

namespace cutlassfa {

// ---- Families absent from this build: they cover nothing ----------------------------------------------
#if !CUTLASSFA_HAS_SM80
// Built without any sm_80+ architecture: the tensor-core backends are unavailable (backends.cpp).
KernelTile sm80_tile(const FwdParams&) { return {}; }
cudaError_t launch_sm80(const FwdParams&, cudaStream_t) { return cudaErrorNoKernelImageForDevice; }
#endif
#if !CUTLASSFA_HAS_SM90DECODE
bool sm90_decode_covers(const FwdParams&, int) { return false; }
KernelTile sm90_decode_tile(const FwdParams&) { return {}; }
cudaError_t launch_sm90_decode(const FwdParams&, cudaStream_t) { return cudaErrorNotSupported; }
#endif
#if !CUTLASSFA_HAS_SM90
bool sm90_covers(const FwdParams&) { return false; }
KernelTile sm90_tile(const FwdParams&) { return {}; }
cudaError_t launch_sm90(const FwdParams&, cudaStream_t) { return cudaErrorNotSupported; }
#endif
#if !CUTLASSFA_HAS_SM90WS
bool sm90ws_covers(const FwdParams&) { return false; }
KernelTile sm90ws_tile(const FwdParams&) { return {}; }
cudaError_t launch_sm90ws(const FwdParams&, cudaStream_t) { return cudaErrorNotSupported; }
#endif

const char* kernel_name(Kernel kernel) {
  switch (kernel) {
    case Kernel::kNaive: return "naive";
    case Kernel::kSmallTile: return "small_tile";
    case Kernel::kLargeTile: return "large_tile";
    case Kernel::kSm80: return "sm80";
    case Kernel::kSm90: return "sm90";
    case Kernel::kSm90ws: return "sm90ws";
    case Kernel::kSm90Decode: return "sm90decode";
  }
  return "unknown";
}

bool packs_gqa(const FwdParams& params) {
  // Not with ALiBi: a packed tile's rows are heads, and the bias needs each row's query position.
  return params.seqlen_q == 1 && params.heads_ratio > 1 && params.cu_seqlens_q == nullptr &&
         params.window_left < 0 && params.alibi_slopes == nullptr;
}

// Query head h = h_kv * ratio + r becomes row r of head h_kv: the row stride is the head stride, the
// head stride ratio head strides (q, o, lse and sinks alike; lse rows are contiguous with one query).
FwdParams packed_gqa(const FwdParams& params) {
  FwdParams p = params;
  int const ratio = params.heads_ratio;
  p.seqlen_q = ratio;
  p.heads_q = params.heads_kv;
  p.heads_ratio = 1;
  p.q_row_stride = params.q_head_stride, p.q_head_stride = params.q_head_stride * ratio;
  p.o_row_stride = params.o_head_stride, p.o_head_stride = params.o_head_stride * ratio;
  p.lse_head_stride = params.lse_head_stride * ratio;
  p.sinks_row_stride = params.sinks_head_stride, p.sinks_head_stride = params.sinks_head_stride * ratio;
  p.window_right = -1;
  return p;
}

namespace {

// ---- Which kernel ---------------------------------------------------------------------------------------

// Whether `kernel` takes `params` (packed and split as it would run) for `backend` on `device`: the decode
// kernel where it covers the call, mma.sync for every call of a tensor-core backend, the wgmma families
// (the narrower head dims, d <= 32, excepted: wgmma_head_dim) on the tensor-core backend of a wgmma device
// where they cover it.
bool kernel_takes(Kernel kernel, Backend backend, const PlanDevice& device, const FwdParams& params) {
  bool const wgmma = backend == Backend::kTensorCore && device.family == Family::kWgmma &&
                     wgmma_head_dim(params.head_dim);
  switch (kernel) {
    case Kernel::kSm90Decode: return sm90_decode_covers(params, device.capability);
    case Kernel::kSm80: return CUTLASSFA_HAS_SM80 != 0;
    case Kernel::kSm90: return wgmma && sm90_covers(params);
    case Kernel::kSm90ws: return wgmma && CUTLASSFA_HAS_SM90WS && sm90ws_covers(params);
    default: return false;
  }
}

// The tensor-core kernel for `params` (num_splits included: the warp-specialized kernel runs one pass):
// the first in this order that takes the call, mma.sync last (it takes every call). `packed`: params are a
// GQA-packed call (packed_gqa), which is for the tile kernels: the decode kernel declined the call unpacked.
Kernel tensorcore_kernel(Backend backend, const PlanDevice& device, const FwdParams& params, bool packed) {
  // A few query rows per K/V head against a cache: the decode kernel (both backends: it is an mma.sync
  // kernel, and decode is bound by memory, not by the MMA).
  if (!packed && kernel_takes(Kernel::kSm90Decode, backend, device, params)) return Kernel::kSm90Decode;
  // A problem of a tile or two runs sooner on mma.sync: the warp-specialized kernel's set-up (barriers,
  // descriptor prefetch, role split) costs about 1 us of GPU time that so little work cannot hide
  // (H200, fp16, CUDA graph: (1, 1, 16, 64) 4.3 vs 4.9 us, (1, 8, 128, 64) 5.1 vs 6.3 us;
  // (1, 32, 128, 128) 7.7 vs 7.5 us, bench/NOTES-callpath.md).
  bool const tiny = params.dtype != DType::kFloat32 && params.seqlen_q <= 128 && params.seqlen_k <= 128 &&
                    static_cast<long long>(params.batch) * params.heads_q <= 8;
  if (CUTLASSFA_HAS_SM90WS && tiny) return Kernel::kSm80;
  // fp32 calls the wgmma pre-pass cannot lay out (paged, varlen, zero-padded head dims) run on mma.sync.
  for (Kernel kernel : {Kernel::kSm90ws, Kernel::kSm90}) {
    if (kernel_takes(kernel, backend, device, params)) return kernel;
  }
  return Kernel::kSm80;
}

KernelTile kernel_tile(Kernel kernel, const FwdParams& params) {
  switch (kernel) {
    case Kernel::kSm80: return sm80_tile(params);
    case Kernel::kSm90: return sm90_tile(params);
    case Kernel::kSm90ws: return sm90ws_tile(params);
    case Kernel::kSm90Decode: return sm90_decode_tile(params);
    default: return {};  // the CUDA-core kernels do not split keys
  }
}

// ---- How many splits --------------------------------------------------------------------------------------

// The decode kernel (one CTA per batch entry, K/V head and split) streams memory. Its splits fill the
// multiprocessors once, one CTA each (a second, partial wave would run on a few multiprocessors alone):
// two a multiprocessor (kSm90DecodeCtasPerSm resident) were 3-15 % slower for the same bytes, except
// with 32 query rows (two MMA slabs: twice the math a byte) on long splits, where the second CTA
// hides the first one's math (B 8, 32:4 heads, 4 causal queries, 128k keys: 507 against 572 us).
// A split holds at least kMinKeysPerSplit keys (a step or two of every warp): a small cache split
// finer finishes sooner (B 1, 32:4 heads, 2k keys, d 128: 16 splits 10.4 us, 4 splits 13.8 us).
// H200, bf16, CUDA graphs, inputs rotated past L2; bench/NOTES-variants.md "Decode split counts".
// An fp8 cache (half the bytes a key, and its widening on top of the math) takes two CTAs a multiprocessor
// always: with one, its four warps kept DRAM 34 % busy (H200, ncu, B 8, 32:8 heads, 128k keys). So does
// d = 256, whose CTAs have two warps (decode_kernel.h): one CTA a multiprocessor ran at half the speed of two
// (B 8, 16:8 heads, 8k keys: 2 splits 0.246 ms, 4 splits 0.132; H200).
// A K/V head of more rows than a CTA takes (tile.block_m) has a CTA per chunk of them.
int decode_num_splits(int sms, const FwdParams& params, KernelTile tile) {
  constexpr int kMinKeysPerSplit = 128, kMinKeysTwoCtasPerSm = 4096;
  long long const rows = static_cast<long long>(params.seqlen_q) * params.heads_ratio;
  long long const chunks = (rows + std::max(1, tile.block_m) - 1) / std::max(1, tile.block_m);
  long long const ctas = static_cast<long long>(params.batch) * params.heads_kv * chunks;
  long long const slots = static_cast<long long>(sms) * kSm90DecodeCtasPerSm;
  if (sms <= 0 || ctas >= slots) return 1;
  bool const two_slabs = rows > 16;
  bool const two_per_sm = params.kv_fp8 || params.head_dim > kSm90DecodeFourWarpHeadDim ||
                          (two_slabs && params.seqlen_k / (slots / ctas) >= kMinKeysTwoCtasPerSm);
  long long const splits = (two_per_sm ? slots : sms) / ctas;
  long long const most = std::max(1, params.seqlen_k / kMinKeysPerSplit);
  return static_cast<int>(std::max(1ll, std::min(splits, most)));
}

// The tile kernels: from the CTAs of one pass (batch * heads * query tiles of the kernel's kBlockM),
// its key tiles (kBlockN keys) and the multiprocessors: 1 when the unsplit grid already fills the
// device, else the fewest splits that give at least 1.5 waves of CTAs with a full last wave (or the
// fullest), each split at least 8 key tiles long.
int tile_num_splits(int sms, const FwdParams& params, KernelTile tile) {
  constexpr int kMaxSplits = 128;
  // Decode is memory-bound: at least 1.5 waves of CTAs keep the memory system busy while one CTA's
  // pipeline fills or drains, a split of fewer than 8 key tiles costs more in partials than it saves,
  // and the last wave should be full (H200, bf16, Hq 32 / Hkv 8, d 128, B 1 x 128k keys: 256 CTAs
  // 140 us, 128 CTAs 153 us; B 8 x 16k: 512 CTAs 137 us, 320 CTAs (2.4 waves) 172 us; measured with
  // the wgmma kernel's 64 x 128 tile).
  constexpr float kMinWaves = 1.5f, kFullWave = 0.95f;
  constexpr int kMinTilesPerSplit = 8;
  if (sms <= 0 || tile.block_m <= 0 || tile.block_n <= 0) return 1;
  long long const ctas =
      static_cast<long long>(params.batch) * params.heads_q * ((params.seqlen_q + tile.block_m - 1) / tile.block_m);
  int const key_tiles = (params.seqlen_k + tile.block_n - 1) / tile.block_n;
  if (ctas >= 0.8 * sms) return 1;  // the unsplit grid fills the device
  int const most = std::min(kMaxSplits, std::max(1, key_tiles / kMinTilesPerSplit));
  auto waves = [&](int s) { return static_cast<float>(ctas * s) / sms; };
  auto fullness = [&](int s) { return waves(s) / std::ceil(waves(s)); };  // of the last wave
  int first = 1;
  while (first < most && waves(first) < kMinWaves) ++first;
  int best = first;
  for (int s = first; s <= most; ++s) {
    if (fullness(s) >= kFullWave) return s;
    if (fullness(s) > fullness(best)) best = s;
  }
  return best;
}

// ---- A measured choice (cutlassfa/tuning.h) -------------------------------------------------------------

// The table's choice for `params`, when it has one that takes the call; splits bounded as the heuristic's
// (one_pass: a varlen batch, which is not split: the table's kernel alone).
bool tuned_plan(Backend backend, const PlanDevice& device, const FwdParams& params, bool one_pass, Plan* plan) {
  const TunedChoice* choice = tuned_choice(device, params);
  if (choice == nullptr || (one_pass && choice->num_splits != 1)) return false;
  bool const pack = choice->kernel != Kernel::kSm90Decode && packs_gqa(params);
  FwdParams p = pack ? packed_gqa(params) : params;
  p.num_splits = choice->num_splits;
  if (!kernel_takes(choice->kernel, backend, device, p)) return false;
  KernelTile const tile = kernel_tile(choice->kernel, p);
  int const key_tiles = tile.block_n > 0 ? (p.seqlen_k + tile.block_n - 1) / tile.block_n : 1;
  plan->kernel = choice->kernel, plan->tile = tile, plan->pack_gqa = pack, plan->tuned = true;
  plan->num_splits = std::max(1, std::min({choice->num_splits, key_tiles, kMaxCombinedSplits}));
  return true;
}

}  // namespace

PlanDevice plan_device(int device) {
  return {device_capability(device), device_multiprocessors(device), tensorcore_family(device)};
}

Plan make_plan(Backend backend, const PlanDevice& device, const FwdParams& params, int requested_splits) {
  Plan plan;
  plan.backend = backend;
  switch (backend) {
    case Backend::kNaive: plan.kernel = Kernel::kNaive; return plan;
    case Backend::kSmallTile: plan.kernel = Kernel::kSmallTile; return plan;
    case Backend::kLargeTile: plan.kernel = Kernel::kLargeTile; return plan;
    case Backend::kTensorCore:
    case Backend::kTensorCoreSm80: break;
  }
  // fp8 attention: the warp-specialized kernel's fp8 instantiation, one pass (the validator has refused
  // what it does not cover: bindings/request.cpp, fp8_attention_refusal; were one to come, its launcher
  // refuses it, an internal error).
  if (params.dtype == DType::kFloat8E4M3) {
    plan.kernel = Kernel::kSm90ws;
    plan.tile = sm90ws_tile(params);
    return plan;
  }
  // A measured choice, unless the caller asked for a split count (a varlen batch, which runs one pass
  // whatever was asked, may still take the table's kernel).
  bool const varlen = params.cu_seqlens_q != nullptr;
  if ((requested_splits <= 0 || varlen) && tuned_plan(backend, device, params, varlen, &plan)) return plan;
  // Packing is for the tile kernels; the decode kernel takes a K/V head's rows (Nq x heads_ratio) as they are,
  // or declines the call (more rows than it takes; d = 256 with one query and no left window bound), packed
  // or not.
  plan.pack_gqa = packs_gqa(params) && !sm90_decode_covers(params, device.capability);
  FwdParams p = plan.pack_gqa ? packed_gqa(params) : params;
  bool const decode_step = params.seqlen_q <= 64 && params.dtype != DType::kFloat32;
  int splits = requested_splits > 0 ? requested_splits : 1;
  if (requested_splits == kChooseSplits || (requested_splits == kDefaultSplits && decode_step)) splits = 0;
  if (splits != 1) {
    // The kernel and tile that run the call split: the warp-specialized kernel runs one pass, so a split
    // is sized for (and runs on) the kernel the planner takes when it does not cover the call.
    p.num_splits = 2;
    Kernel const split_kernel = tensorcore_kernel(backend, device, p, plan.pack_gqa);
    KernelTile const tile = kernel_tile(split_kernel, p);
    if (splits == 0) {
      int const sms = device.multiprocessors;
      splits = split_kernel == Kernel::kSm90Decode ? decode_num_splits(sms, p, tile) : tile_num_splits(sms, p, tile);
    }
    // More than one split per key tile would only add empty partials; past kMaxCombinedSplits, the
    // combine's lse_s would not fit its shared memory (and the schedule changes nothing but rounding).
    int const key_tiles = tile.block_n > 0 ? (p.seqlen_k + tile.block_n - 1) / tile.block_n : 1;
    splits = std::max(1, std::min({splits, key_tiles, kMaxCombinedSplits}));
    if (splits > 1) {
      plan.kernel = split_kernel, plan.tile = tile, plan.num_splits = splits;
      return plan;
    }
  }
  p.num_splits = 1;
  plan.kernel = tensorcore_kernel(backend, device, p, plan.pack_gqa);
  plan.tile = kernel_tile(plan.kernel, p);
  return plan;
}

namespace {

// The plan's kernel on params already packed and split as the plan says.
cudaError_t launch_kernel(Kernel kernel, const FwdParams& params, cudaStream_t stream) {
  cudaError_t err = cudaErrorInvalidValue;
  switch (kernel) {
    case Kernel::kNaive: return launch_naive(params, stream);
    case Kernel::kSmallTile: return launch_small_tile(params, stream);
    case Kernel::kLargeTile: return launch_large_tile(params, stream);
    case Kernel::kSm80: err = launch_sm80(params, stream); break;
    case Kernel::kSm90: err = launch_sm90(params, stream); break;
    case Kernel::kSm90ws: err = launch_sm90ws(params, stream); break;
    case Kernel::kSm90Decode: err = launch_sm90_decode(params, stream); break;
  }
  // The plan chose this kernel because its family covers the call: a refusal means the covers()
  // and the launcher disagree, an internal error, not a reason to try another kernel.
  return err == cudaErrorNotSupported ? cudaErrorInvalidValue : err;
}

// Split keys: fp32 partials (num_splits, B, Hq, Nq, d) and their lse (num_splits, B, Hq, Nq) from the
// workspace pool, the kernel, then the combine into o and lse; the partials are released in stream order.
cudaError_t run_split(Kernel kernel, const FwdParams& params, cudaStream_t stream) {
  size_t const rows = static_cast<size_t>(params.num_splits) * params.batch * params.heads_q * params.seqlen_q;
  size_t const o_bytes = rows * params.head_dim * sizeof(float);
  void* buffer = nullptr;
  cudaError_t err = workspace_alloc(&buffer, o_bytes + rows * sizeof(float), stream);
  if (err != cudaSuccess) return err;
  FwdParams split = params;
  split.o_accum = static_cast<float*>(buffer);
  split.lse_accum = reinterpret_cast<float*>(static_cast<char*>(buffer) + o_bytes);  // o_bytes is a multiple of 16
  err = launch_kernel(kernel, split, stream);
  if (err == cudaSuccess) err = launch_split_combine(split, stream);
  cudaError_t const free_err = workspace_free(buffer, stream);
  return err != cudaSuccess ? err : free_err;
}

}  // namespace

cudaError_t run_plan(const Plan& plan, const FwdParams& params, cudaStream_t stream) {
  FwdParams p = plan.pack_gqa ? packed_gqa(params) : params;
  p.num_splits = plan.num_splits;
  return plan.num_splits > 1 ? run_split(plan.kernel, p, stream) : launch_kernel(plan.kernel, p, stream);
}

}  // namespace cutlassfa
