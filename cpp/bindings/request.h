// A call as Python passes it (Request), its validation into a Call (the arrays described, a Problem,
// the index arrays read), and the choice of backend: one pass over the DLPack descriptions for every
// call (plain, windows, softcap, sinks, ALiBi, KV caches, paged caches, appended keys, split keys, varlen), raising
// the ValueError / TypeError that names the argument.
//
// Index values given on the host are read and checked in full (and copied to the device at launch);
// index arrays on the device are read in place and their values are not checked here (that would need
// a synchronization): the kernels clamp them (cutlassfa/params.h says how).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "bindings/arrays.h"
#include "cutlassfa/backends.h"
#include "cutlassfa/problem.h"

namespace cutlassfa::bindings {

// What the Python layer passes as `backend`: a Backend, or one of these (Python reads them from _C).
constexpr int kBackendAuto = -1;
constexpr int kBackendCpu = 5;

// forward()'s arguments as Python passes them: None (an invalid handle) for an array not given.
struct Request {
  nb::handle q, k, v, out;
  bool causal = false;
  double scale = 0.0;  // NaN: 1/sqrt(d)
  nb::handle window;   // None, or a pair (left, right) of ints (a masks.Window too)
  nb::handle softcap;  // a float >= 0; None or 0: no cap
  nb::handle cache_seqlens, cache_leftpad, block_table, k_new, v_new;
  nb::handle num_splits;                    // None (the backend chooses) or an int >= 1
  nb::handle cu_seqlens_q, cu_seqlens_k;    // varlen_forward: both given
  nb::handle max_seqlen_q, max_seqlen_k;    // None or ints
  nb::handle sinks;                         // None, or (Hq,) floats
  nb::handle alibi_slopes;                  // None, or (Hq,) or (B, Hq) floats
  nb::handle k_descale, v_descale;          // None, or a float, (Hkv,) or (B, Hkv) floats (fp8 k and v)
  nb::handle q_descale;                     // the same for an fp8 q (fp8 attention)
  nb::handle out_dtype;                     // None, or a dtype name ("bfloat16", ...; _api.py names it)
};

// An int32 index argument: an array on q's device read in place, or host values (numpy, a sequence of
// ints, a PyTorch CPU tensor) copied to the device at launch.
struct IndexArray {
  bool given = false;
  const int* device_data = nullptr;  // the array on q's device (nullptr for host values)
  std::vector<int32_t> values;       // host values, row-major
  int64_t rows = 0, cols = 1;        // (rows,) or (rows, cols)
  long long row_stride = 0;          // elements between rows where the kernels read them
  bool read_back = false;            // `values` holds a device array's values (check_device_values)
  bool on_host() const { return given && device_data == nullptr; }
  // Whether `values` holds the values: host values, or a device array's read back for checking.
  bool known() const { return on_host() || read_back; }
};

// A per-head float argument (params.h): attention sinks (Hq,), ALiBi slopes (Hq,) or (B, Hq), fp8 caches'
// descales (one value, (Hkv,) or (B, Hkv)). On q's device (float32 read in place, fp16 / bf16 converted at
// launch), or host values (copied).
struct FloatArray {
  bool given = false;
  const void* device_data = nullptr;  // on q's device, rows contiguous; nullptr for host values
  DType device_dtype = DType::kFloat32;
  std::vector<float> values;   // host values, (rows, heads) row-major
  int rows = 0, heads = 0;     // (rows, heads): rows 1 for a (heads,) array
  long long row_stride = 0;    // elements between rows where the kernels read them (0: one row for all)
  long long head_stride = 1;   // 0: one value for every head
  bool on_host() const { return given && device_data == nullptr; }
};

// The debug switch: when on, device index arrays (cache_seqlens, cache_leftpad, block_table,
// cu_seqlens_*) are read back to the host (one device synchronization) and checked as host values
// are, raising the same ValueError. Off by default: a call then never waits for the device.
// CUTLASSFA_CHECK_DEVICE_VALUES=1 turns it on at import (python/cutlassfa/_api.py).
void set_check_device_values(bool on);
bool check_device_values();

// A validated call.
struct Call {
  Problem problem;
  ArrayRef q, k, v;
  std::optional<ArrayRef> out;
  std::optional<ArrayRef> k_new, v_new;
  IndexArray cu_seqlens_q, cu_seqlens_k, cache_seqlens, cache_leftpad, block_table;
  FloatArray sinks, alibi_slopes, k_descale, v_descale, q_descale;
  // The output's dtype: q's, or for fp8 attention (float8_e4m3fn q, k and v) out_dtype, bfloat16 by default.
  DType out_dtype = DType::kFloat32;
  std::string out_dtype_name;
  int device = -1;  // -1: host arrays

  // (B, H, N) strides in elements of one of q, k, v, out (rank 3: head stride 0; varlen: batch stride 0).
  TensorStrides strides(const ArrayRef& a) const;
};

// Python exceptions for what is not an ArgumentError (bindings/module.cpp translates those).
std::string tuple_text(const int64_t* values, int n);
std::string shape_text(const ArrayRef& a);

// Validates every argument of the call.
Call validate(const Request& request);

// Resolves `backend` (kBackendAuto, kBackendCpu or a Backend) for the call; raises when the asked
// backend cannot run it.
int resolve_backend(const Call& call, int backend);
// The same for a device of compute capability `capability` that need not be present (cutlassfa.plan): the
// backend's availability is this build's kernels for that capability; kBackendCpu is refused.
int resolve_backend_for(const Call& call, int backend, int capability);

// Why `backend` does not run fp8 attention (float8_e4m3fn q, k and v) of `dtype` q at `head_dim` on a device of
// compute capability `capability` (major * 10 + minor); empty when it does or q is not fp8. The tensorcore
// backend runs it on sm_90 at the head dims of CUTLASSFA_SM90WS_FP8_HEAD_DIMS (cutlassfa/config.h); the cpu
// backend runs every fp8 call.
std::string fp8_attention_refusal(Backend backend, DType dtype, int head_dim, int capability);
// Why the GPU does not run this fp8 attention call's options (varlen, KV cache, softcap, ALiBi, split keys;
// sinks it runs); empty when it does or the call is not fp8 attention.
std::string fp8_attention_options_refusal(const Call& call);
// The same from the options' flags alone (`supports` asks it before any array exists).
std::string fp8_attention_options_refusal(bool varlen, bool kv_cache, bool softcap, bool alibi, bool split);

// Head dims some backend of this build has kernels for, as "(32, 64, 128)".
std::string head_dims_text();

}  // namespace cutlassfa::bindings
