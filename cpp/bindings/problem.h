// Validation of forward()'s arrays and options, and the choice of backend: one C++ pass over the
// DLPack descriptions (cheap enough for a per-call budget of a few microseconds), raising the
// ValueError / TypeError / RuntimeError that names the argument.
#pragma once

#include <optional>

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

  // (B, H, N, d) strides in elements of one of q, k, v, out (rank 3: head stride 0).
  void strides4(const ArrayRef& a, long long* batch_stride, long long* head_stride, long long* row_stride) const;
  bool empty() const { return batch == 0 || heads_q == 0 || seqlen_q == 0; }
};

// Validates q, k, v (and out when not None); scale: NaN means "1/sqrt(head_dim)".
Problem validate(nb::handle q, nb::handle k, nb::handle v, nb::handle out, bool causal, double scale);

// Resolves `backend` (kBackendAuto, kBackendCpu or a Backend) for the problem; raises when the asked
// backend cannot run it.
int resolve_backend(const Problem& problem, int backend);

// Head dims some backend of this build has kernels for, as "(32, 64, 128)".
std::string head_dims_text();

}  // namespace cutlassfa::bindings
