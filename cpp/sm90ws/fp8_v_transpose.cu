// The V^T pre-pass of fp8 attention (sm90ws/fp8_v_transpose.h).
#include "sm90ws/fp8_v_transpose.h"

#include <climits>
#include <cstdint>

#include "cutlassfa/workspace.h"
#include "sm90ws/fp8_key_order.h"

namespace cutlassfa::sm90ws {
namespace {

// A block moves a tile of 64 keys x 64 dims of one (batch, K/V head): 256 threads, one 16-byte load of
// a key's 16 dims each, then one 16-byte store of a dim's 16 (permuted) keys each. A memory-bound pass.
constexpr int kTileKeys = 64, kTileDims = 64, kThreads = 256;
static_assert(kTileKeys % kFp8KeyGroup == 0, "whole key groups a tile");
static_assert(kTileKeys * kTileDims == kThreads * 16, "one 16-byte load and store a thread");

struct VtShape {
  const uint8_t* v;
  uint8_t* vt;
  long long batch_stride, head_stride, row_stride;  // of v, in bytes
  int heads_kv, seqlen_k, vt_keys, head_dim;
  int key_tiles, dim_tiles;
};

__global__ void __launch_bounds__(kThreads) transpose_v_fp8_kernel(VtShape s) {
  __shared__ uint8_t tile[kTileKeys][kTileDims + 4];  // +4: the column reads of a store spread over banks
  int const key_tile = blockIdx.x % s.key_tiles;
  int const dim_tile = (blockIdx.x / s.key_tiles) % s.dim_tiles;
  int const bh = blockIdx.x / (s.key_tiles * s.dim_tiles);
  int const batch = bh / s.heads_kv, head = bh % s.heads_kv;
  int const key0 = key_tile * kTileKeys, dim0 = dim_tile * kTileDims;
  {  // load: thread t reads key key0 + t / 4, dims dim0 + 16 (t % 4) .. + 15; zeros past the keys
    int const key = static_cast<int>(threadIdx.x) / 4, chunk = static_cast<int>(threadIdx.x) % 4;
    uint4 value = make_uint4(0, 0, 0, 0);
    if (key0 + key < s.seqlen_k) {
      value = *reinterpret_cast<const uint4*>(s.v + batch * s.batch_stride + head * s.head_stride +
                                              (key0 + key) * s.row_stride + dim0 + 16 * chunk);
    }
    uint32_t* row = reinterpret_cast<uint32_t*>(&tile[key][16 * chunk]);
    row[0] = value.x, row[1] = value.y, row[2] = value.z, row[3] = value.w;
  }
  __syncthreads();
  // store: thread t writes dim dim0 + t / 4, columns key0 + 16 (t % 4) .. + 15 of V^T, column k taking
  // key fp8_pv_key(k) of its group
  int const dim = static_cast<int>(threadIdx.x) / 4, chunk = static_cast<int>(threadIdx.x) % 4;
  int const col0 = key0 + 16 * chunk;
  if (col0 >= s.vt_keys) { return; }  // vt_keys is a multiple of 32: chunks are whole or absent
  uint32_t words[4];
  #pragma unroll
  for (int w = 0; w < 4; ++w) {
    uint32_t word = 0;
    #pragma unroll
    for (int b = 0; b < 4; ++b) {
      int const k = 16 * chunk + 4 * w + b;  // column within the tile
      int const key = (k & ~(kFp8KeyGroup - 1)) | fp8_pv_key(k & (kFp8KeyGroup - 1));
      word |= static_cast<uint32_t>(tile[key][dim]) << (8 * b);
    }
    words[w] = word;
  }
  long long const row = (static_cast<long long>(bh) * s.head_dim + dim0 + dim) * s.vt_keys;
  *reinterpret_cast<uint4*>(s.vt + row + col0) = make_uint4(words[0], words[1], words[2], words[3]);
}

}  // namespace

cudaError_t transpose_v_fp8(const FwdParams& params, FwdParams& vt, void** workspace, cudaStream_t stream) {
  int const vt_keys = fp8_vt_keys(params.seqlen_k);
  if (params.head_dim % kTileDims != 0 || params.seqlen_k < 1) { return cudaErrorNotSupported; }
  long long const pairs = static_cast<long long>(params.batch) * params.heads_kv;
  long long const key_tiles = (vt_keys + kTileKeys - 1) / kTileKeys;
  long long const blocks = pairs * (params.head_dim / kTileDims) * key_tiles;
  if (blocks > INT_MAX || pairs * params.head_dim > INT_MAX) { return cudaErrorNotSupported; }
  size_t const bytes = static_cast<size_t>(pairs) * params.head_dim * vt_keys;
  uint8_t* buffer = nullptr;
  cudaError_t err = workspace_alloc(reinterpret_cast<void**>(&buffer), bytes, stream);
  if (err != cudaSuccess) { return err; }
  VtShape const s{static_cast<const uint8_t*>(params.v), buffer, params.v_batch_stride, params.v_head_stride,
                  params.v_row_stride, params.heads_kv, params.seqlen_k, vt_keys, params.head_dim,
                  static_cast<int>(key_tiles), params.head_dim / kTileDims};
  transpose_v_fp8_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(s);
  err = cudaGetLastError();
  if (err != cudaSuccess) {
    workspace_free(buffer, stream);
    return err;
  }
  vt = params;
  vt.v = buffer;
  vt.v_row_stride = vt_keys;  // between rows of d
  vt.v_head_stride = static_cast<long long>(params.head_dim) * vt_keys;
  vt.v_batch_stride = vt.v_head_stride * params.heads_kv;
  *workspace = buffer;
  return cudaSuccess;
}

}  // namespace cutlassfa::sm90ws
