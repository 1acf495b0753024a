// Validation of forward()'s arrays and options, and the choice of backend: one C++ pass over the
// DLPack descriptions (cheap enough for a per-call budget of a few microseconds), raising the
// ValueError / TypeError / RuntimeError that names the argument.
#pragma once

#include <optional>
#include <string>

#include "bindings/arrays.h"
#include "cutlassfa/backends.h"
#include "cutlassfa/params.h"

namespace cutlassfa::bindings {

// What the Python layer passes as `backend`: a Backend, or one of these.
constexpr int kBackendAuto = -1;
constexpr int kBackendCpu = 5;

struct Problem {
  ArrayRef q, k, v;
  std::optional<ArrayRef> out;
  int rank = 4;  // 3: (B, N, d) arrays, seen as (B, 1, N, d)
  int batch = 0, heads_q = 0, heads_kv = 0, seqlen_q = 0, seqlen_k = 0, head_dim = 0;
  DType dtype = DType::kFloat32;
  int device = -1;  // -1: host arrays
  bool causal = false;
  float scale = 0.f;
  // Set by the variant validator (bindings/variant.cpp); the plain path keeps the defaults.
  bool varlen = false;  // q, k, v, out are (total, H, d): rows along dim 0, entries located by cu_seqlens
  int kv_extent = -1;   // dim 0 of k and v as the kernels index it (pages of a paged cache); -1: batch
  int kv_rows = -1;     // rows of one k / v entry (keys per page of a paged cache); -1: seqlen_k

  // (B, H, N, d) strides in elements of one of q, k, v, out (rank 3: head stride 0).
  void strides4(const ArrayRef& a, long long* batch_stride, long long* head_stride, long long* row_stride) const;
  bool empty() const { return batch == 0 || heads_q == 0 || seqlen_q == 0; }
};

// Python exceptions naming the argument (the message is copied), and the texts they are built from.
[[noreturn]] void value_error(const std::string& message);
[[noreturn]] void type_error(const std::string& message);
std::string tuple_text(const int64_t* values, int n);
std::string shape_text(const ArrayRef& a);
std::string strides_text(const ArrayRef& a);
std::string where(const ArrayRef& a);  // "host" or "cuda:N"

// The pieces of `validate`, shared with the variant validator. describe_qkv: q, k, v described, of
// `rank` dims (0: 3 or 4; `layout` names the expected shape), one dtype, device and framework, rows
// contiguous; sets rank, dtype and device.
void describe_qkv(Problem& p, nb::handle q, nb::handle k, nb::handle v, int rank, const char* layout);
void check_row_contiguous(const ArrayRef& a, const char* name);
void check_heads_and_head_dim(int64_t heads_q, int64_t heads_kv, int64_t head_dim, const char* kv_name);
float resolve_scale(double scale, int head_dim);  // NaN: 1/sqrt(head_dim)
// out of `expected` shape (n dims), q's dtype, framework and device, rows contiguous, writable.
void validate_out(Problem& p, nb::handle out, const int64_t* expected, int n);

// Validates q, k, v (and out when not None); scale: NaN means "1/sqrt(head_dim)".
Problem validate(nb::handle q, nb::handle k, nb::handle v, nb::handle out, bool causal, double scale);

// Resolves `backend` (kBackendAuto, kBackendCpu or a Backend) for the problem; raises when the asked
// backend cannot run it.
int resolve_backend(const Problem& problem, int backend);

// Head dims some backend of this build has kernels for, as "(32, 64, 128)".
std::string head_dims_text();

}  // namespace cutlassfa::bindings
