// A validated call, whatever entry it came through (the Python extension, the JAX FFI handler): its
// sizes and options after validation, and the one function that turns it into FwdParams. Free of
// nanobind and of CUDA types, so that every entry and every build (the CPU-only one too) shares it.
#pragma once

#include <stdexcept>
#include <string>

#include "cutlassfa/params.h"

namespace cutlassfa {

// An invalid argument. Kind says which Python exception it becomes (bindings/module.cpp translates it;
// the JAX handler returns it as an InvalidArgument error). It carries no Python state, so it may be
// raised without the GIL.
class ArgumentError : public std::invalid_argument {
 public:
  enum class Kind { kValue, kType, kNotImplemented };
  ArgumentError(Kind kind, const std::string& message) : std::invalid_argument(message), kind_(kind) {}
  Kind kind() const { return kind_; }

 private:
  Kind kind_;
};

[[noreturn]] void value_error(const std::string& message);
[[noreturn]] void type_error(const std::string& message);

// Which keys a query sees, as validated window sides (-1: unbounded). `causal` is folded in here and
// nowhere else: causal means right = 0, and combines with a left bound; a right side > 0 with causal is
// refused. (python/cutlassfa/masks.py is the definition of what a window means.)
struct Window {
  int left = -1;
  int right = -1;
};
Window fold_causal(bool causal, long long left, long long right);

// softmax_scale as given (NaN: not given) resolved against the head dim: 1/sqrt(d) by default, finite.
float resolve_scale(double scale, int head_dim);

struct Problem {
  int rank = 4;         // 3: (B, N, d) arrays seen as (B, 1, N, d); varlen arrays are (total, H, d)
  bool varlen = false;  // q, k, v, out are (total, H, d): entries located by cu_seqlens
  bool kv_cache = false;
  bool paged = false;
  int batch = 0, heads_q = 0, heads_kv = 0, seqlen_q = 0, seqlen_k = 0, head_dim = 0;
  DType dtype = DType::kFloat32;  // of q, and of out but for fp8 attention
  DType out_dtype = DType::kBFloat16;  // of out for fp8 attention (dtype kFloat8E4M3): bfloat16 or float16
  bool kv_fp8 = false;            // k and v (and k_new, v_new) are float8 e4m3 caches (params.h)
  int kv_extent = -1;  // dim 0 of k and v as the kernels index it (pages of a paged cache); -1: batch
  int kv_rows = -1;    // rows of one k / v entry (keys per page of a paged cache); -1: seqlen_k
  int page_size = 0, num_pages = 0;
  int total_q = 0, total_k = 0;  // varlen: rows of q and of k
  int n_new = 0;                 // keys appended per entry (k_new's length)

  float scale = 0.f;  // resolved softmax_scale
  Window window;      // causal folded in (fold_causal): the one statement of which keys a row sees
  float softcap = 0.f;
  // num_splits as asked: 0 when the backend chooses (the planner's rule: cutlassfa/dispatch.h).
  int num_splits = 0;
  // Some option beyond a plain dense call was given (window, softcap, a cache, varlen, num_splits):
  // num_splits=None then asks the planner for kChooseSplits, else for kDefaultSplits (dispatch.h).
  // Sinks change no schedule: a call with them is planned as the same call without.
  bool variant = false;

  bool empty() const { return batch == 0 || heads_q == 0 || seqlen_q == 0; }
  int kv_extent_or_batch() const { return kv_extent >= 0 ? kv_extent : batch; }
  int kv_rows_or_seqlen() const { return kv_rows >= 0 ? kv_rows : seqlen_k; }
};

// Where a call's tensors live: data pointers, and (batch, head, row) strides in elements (the head_dim
// stride is 1). Index arrays are device pointers, nullptr when not given.
struct TensorStrides {
  long long batch = 0, head = 0, row = 0;
};
struct CallTensors {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* o = nullptr;
  float* lse = nullptr;  // nullptr when not asked for
  TensorStrides q_strides, k_strides, v_strides, o_strides;
  long long lse_batch_stride = 0, lse_head_stride = 0;
  const int* cu_seqlens_q = nullptr;
  const int* cu_seqlens_k = nullptr;
  const int* seqlens_k = nullptr;
  const int* leftpad_k = nullptr;
  const int* block_table = nullptr;
  long long block_table_stride = 0;
  const float* sinks = nullptr;         // (heads_q,) float32
  const float* alibi_slopes = nullptr;  // (heads_q,) or rows of alibi_batch_stride per entry, float32
  long long alibi_batch_stride = 0;
  // FP8 caches' and fp8 attention's descales (params.h): float32, strides (batch, head) in elements.
  const float* k_descale = nullptr;
  const float* v_descale = nullptr;
  const float* q_descale = nullptr;
  TensorStrides k_descale_strides, v_descale_strides, q_descale_strides;
};

// Problem::variant's rule: whether a call asks for more than a plain dense one (a window or softcap
// beyond `causal`, a cache, varlen, a num_splits).
bool asks_options(const Problem& problem, bool causal, bool num_splits_given);

// The one FwdParams builder: sizes, scale (softmax_scale_log2 is computed here and nowhere else),
// window, softcap, sinks, ALiBi, lengths, pages. num_splits is left at 1: the planner sets it.
FwdParams make_params(const Problem& problem, const CallTensors& tensors);

}  // namespace cutlassfa
