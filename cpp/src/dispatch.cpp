// The one run-time dispatch from a backend to its kernel family. The tensor-core family was chosen
// once per device (backends.cpp).
#include "cutlassfa/dispatch.h"

#include <algorithm>
#include <cmath>

#include "cutlassfa/config.h"
#include "cutlassfa/launch.h"
#include "cutlassfa/workspace.h"

namespace cutlassfa {
#if !CUTLASSFA_HAS_SM80
// Built without any sm_80+ architecture: the tensor-core families are absent.
cudaError_t launch_sm80(const FwdParams&, cudaStream_t) { return cudaErrorNoKernelImageForDevice; }
#endif
#if !CUTLASSFA_HAS_SM80
bool sm80_decode_covers(const FwdParams&) { return false; }
cudaError_t launch_sm80_decode(const FwdParams&, cudaStream_t) { return cudaErrorNotSupported; }
#endif
#if !CUTLASSFA_HAS_SM90
cudaError_t launch_sm90(const FwdParams&, cudaStream_t) { return cudaErrorNoKernelImageForDevice; }
#endif

namespace {

// The tensor-core kernel of `backend` for these params.
cudaError_t launch_tensorcore(Backend backend, const FwdParams& params, cudaStream_t stream) {
  // A few query rows per K/V head against a cache: the decode kernel (both families: it is an mma.sync
  // kernel, and decode is bound by memory, not by the MMA).
  cudaError_t const decode = launch_sm80_decode(params, stream);
  if (decode != cudaErrorNotSupported) return decode;
  if (backend == Backend::kTensorCoreSm80) return launch_sm80(params, stream);
  int device = 0;
  cudaError_t const err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  // (fp32 calls the wgmma family's pre-pass cannot lay out go on to mma.sync inside launch_sm90.)
  bool const wgmma = tensorcore_family(device) == Family::kWgmma && wgmma_head_dim(params.head_dim);
  if (!wgmma) return launch_sm80(params, stream);
#if CUTLASSFA_HAS_SM90WS
  // A problem of a tile or two runs sooner on mma.sync: the warp-specialized kernel's set-up (barriers,
  // descriptor prefetch, role split) costs about 1 us of GPU time that so little work cannot hide
  // (H200, fp16, CUDA graph: (1, 1, 16, 64) 4.3 vs 4.9 us, (1, 8, 128, 64) 5.1 vs 6.3 us;
  // (1, 32, 128, 128) 7.7 vs 7.5 us, bench/NOTES-callpath.md).
  bool const tiny = params.dtype != DType::kFloat32 && params.seqlen_q <= 128 && params.seqlen_k <= 128 &&
                    static_cast<long long>(params.batch) * params.heads_q <= 8;
  if (tiny) return launch_sm80(params, stream);
  // The warp-specialized kernel where it covers the call (dense fp16 / bf16 of its head dims, varlen at
  // some, any window, no softcap); the wgmma kernel for everything else.
  cudaError_t const ws = launch_sm90ws(params, stream);
  if (ws != cudaErrorNotSupported) return ws;
#endif
  return launch_sm90(params, stream);
}

// Split keys: fp32 partials (num_splits, B, Hq, Nq, d) and their lse (num_splits, B, Hq, Nq) from the
// workspace pool, the kernel, then the combine into o and lse; the partials are released in stream order.
cudaError_t run_split(Backend backend, const FwdParams& params, cudaStream_t stream) {
  size_t const rows = static_cast<size_t>(params.num_splits) * params.batch * params.heads_q * params.seqlen_q;
  size_t const o_bytes = rows * params.head_dim * sizeof(float);
  void* buffer = nullptr;
  cudaError_t err = workspace_alloc(&buffer, o_bytes + rows * sizeof(float), stream);
  if (err != cudaSuccess) return err;
  FwdParams split = params;
  split.o_accum = static_cast<float*>(buffer);
  split.lse_accum = reinterpret_cast<float*>(static_cast<char*>(buffer) + o_bytes);  // o_bytes is a multiple of 16
  err = launch_tensorcore(backend, split, stream);
  if (err == cudaSuccess) err = launch_split_combine(split, stream);
  cudaError_t const free_err = workspace_free(buffer, stream);
  return err != cudaSuccess ? err : free_err;
}

}  // namespace

bool splits_keys(Backend backend) { return backend == Backend::kTensorCore || backend == Backend::kTensorCoreSm80; }

bool packs_gqa(const FwdParams& params) {
  return params.seqlen_q == 1 && params.heads_ratio > 1 && params.cu_seqlens_q == nullptr &&
         params.window_left < 0;
}

// Query head h = h_kv * ratio + r becomes row r of head h_kv: the row stride is the head stride, the
// head stride ratio head strides (q, o and lse alike; lse rows are contiguous with one query).
FwdParams packed_gqa(const FwdParams& params) {
  FwdParams p = params;
  int const ratio = params.heads_ratio;
  p.seqlen_q = ratio;
  p.heads_q = params.heads_kv;
  p.heads_ratio = 1;
  p.q_row_stride = params.q_head_stride, p.q_head_stride = params.q_head_stride * ratio;
  p.o_row_stride = params.o_head_stride, p.o_head_stride = params.o_head_stride * ratio;
  p.lse_head_stride = params.lse_head_stride * ratio;
  p.window_right = -1;
  return p;
}

cudaError_t run_forward(Backend backend, const FwdParams& params, cudaStream_t stream) {
  if (splits_keys(backend) && packs_gqa(params)) { return run_forward(backend, packed_gqa(params), stream); }
  if (params.num_splits > 1 && !splits_keys(backend)) {
    FwdParams one_pass = params;
    one_pass.num_splits = 1;
    return run_forward(backend, one_pass, stream);
  }
  switch (backend) {
    case Backend::kNaive: return launch_naive(params, stream);
    case Backend::kSmallTile: return launch_small_tile(params, stream);
    case Backend::kLargeTile: return launch_large_tile(params, stream);
    case Backend::kTensorCoreSm80:
    case Backend::kTensorCore:
      return params.num_splits > 1 ? run_split(backend, params, stream) : launch_tensorcore(backend, params, stream);
  }
  return cudaErrorInvalidValue;
}

namespace {

// The decode kernel (one CTA per batch entry, K/V head and split) streams memory. Its splits fill the
// multiprocessors once, one CTA each (a second, partial wave would run on a few multiprocessors alone):
// two a multiprocessor (kSm80DecodeCtasPerSm resident) were 3-15 % slower for the same bytes, except
// with 32 query rows (two MMA slabs: twice the math a byte) on long splits, where the second CTA
// hides the first one's math (B 8, 32:4 heads, 4 causal queries, 128k keys: 507 against 572 us).
// A split holds at least kMinKeysPerSplit keys (a step or two of every warp): a small cache split
// finer finishes sooner (B 1, 32:4 heads, 2k keys, d 128: 16 splits 10.4 us, 4 splits 13.8 us).
// H200, bf16, CUDA graphs, inputs rotated past L2; bench/NOTES-variants.md "Decode split counts".
int decode_num_splits(int sms, const FwdParams& params) {
  constexpr int kMinKeysPerSplit = 128, kMinKeysTwoCtasPerSm = 4096;
  long long const ctas = static_cast<long long>(params.batch) * params.heads_kv;
  long long const slots = static_cast<long long>(sms) * kSm80DecodeCtasPerSm;
  if (sms <= 0 || ctas >= slots) return 1;
  bool const two_slabs = static_cast<long long>(params.seqlen_q) * params.heads_ratio > 16;
  bool const two_per_sm = two_slabs && params.seqlen_k / (slots / ctas) >= kMinKeysTwoCtasPerSm;
  long long const splits = (two_per_sm ? slots : sms) / ctas;
  long long const most = std::max(1, params.seqlen_k / kMinKeysPerSplit);
  return static_cast<int>(std::max(1ll, std::min(splits, most)));
}

}  // namespace

int choose_num_splits(int device, const FwdParams& unpacked) {
  constexpr int kBlockM = 64, kBlockN = 128, kMaxSplits = 128;
  // Decode is memory-bound: at least 1.5 waves of CTAs keep the memory system busy while one CTA's
  // pipeline fills or drains, a split of fewer than 8 key tiles costs more in partials than it saves,
  // and the last wave should be full (H200, bf16, Hq 32 / Hkv 8, d 128, B 1 x 128k keys: 256 CTAs
  // 140 us, 128 CTAs 153 us; B 8 x 16k: 512 CTAs 137 us, 320 CTAs (2.4 waves) 172 us).
  constexpr float kMinWaves = 1.5f, kFullWave = 0.95f;
  constexpr int kMinTilesPerSplit = 8;
  FwdParams const params = packs_gqa(unpacked) ? packed_gqa(unpacked) : unpacked;
  int const sms = device_multiprocessors(device);
  if (sm80_decode_covers(params)) return decode_num_splits(sms, params);
  long long const ctas = static_cast<long long>(params.batch) * params.heads_q * ((params.seqlen_q + kBlockM - 1) / kBlockM);
  int const key_tiles = (params.seqlen_k + kBlockN - 1) / kBlockN;
  if (sms <= 0 || ctas >= 0.8 * sms) return 1;  // the unsplit grid fills the device
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

int resolve_num_splits(Backend backend, int device, const FwdParams& params, int requested) {
  if (!splits_keys(backend)) return 1;
  int const splits = requested > 0 ? requested : choose_num_splits(device, params);
  // More than one split per 128 keys would only add empty partials; past kMaxCombinedSplits, the
  // combine's lse_s would not fit its shared memory (and the schedule changes nothing but rounding).
  return std::max(1, std::min({splits, (params.seqlen_k + 127) / 128, kMaxCombinedSplits}));
}

int dense_num_splits(Backend backend, int device, const FwdParams& params) {
  // A call of one query tile is a decode step written as a dense call: one pass would leave most
  // multiprocessors idle (H200, bf16, B 1, 32:8 heads, 128k keys, d 128: 1.37 ms unsplit, 0.16 ms split).
  // fp32 keeps one pass: its split-S path has no partials.
  bool const decode = params.seqlen_q <= 64 && params.dtype != DType::kFloat32;
  return decode ? resolve_num_splits(backend, device, params, 0) : 1;
}

}  // namespace cutlassfa
