// Validation of forward()'s variant arguments (window, softcap, KV caches, paged caches, appended keys,
// split keys) and of varlen_forward(): the shapes, dtypes and devices of every array, raising the
// ValueError / TypeError that names the argument. Index values given on the host are read and checked
// in full (and copied to q's device at launch); index arrays on the device are read in place, and their
// values are not checked here (that would need a synchronization): the kernels clamp them
// (cutlassfa/params.h says how).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "bindings/problem.h"

namespace cutlassfa::bindings {

// The variant arguments as Python passes them: None for an argument not given.
struct VariantArgs {
  int window_left = -1, window_right = -1;  // as given; causal is folded in by the validator
  double softcap = 0.0;
  nb::handle cache_seqlens, cache_leftpad, block_table, k_new, v_new;
  int64_t num_splits = 0;  // 0: the backend chooses
  nb::handle cu_seqlens_q, cu_seqlens_k;  // varlen_forward: both given
  int64_t max_seqlen_q = -1, max_seqlen_k = -1;  // -1: not given
};

// An int32 index argument: an array on q's device read in place, or host values (numpy, a sequence of
// ints, a PyTorch CPU tensor) copied to the device at launch.
struct IndexArray {
  bool given = false;
  const int* device_data = nullptr;  // the array on q's device (nullptr for host values)
  std::vector<int32_t> values;       // host values, row-major
  int64_t rows = 0, cols = 1;        // (rows,) or (rows, cols)
  long long row_stride = 0;          // elements between rows where the kernels read them
  bool on_host() const { return given && device_data == nullptr; }
};

struct Variant {
  int window_left = -1, window_right = -1;  // causal folded in: (-1, 0) for plain causal
  float softcap = 0.f;
  IndexArray cache_seqlens, cache_leftpad, block_table, cu_seqlens_q, cu_seqlens_k;
  std::optional<ArrayRef> k_new, v_new;
  int n_new = 0;          // keys appended per entry (k_new's length)
  int num_splits = 0;     // asked for; 0: the backend chooses
  bool kv_cache = false;  // q against caches (cache_seqlens, cache_leftpad, block_table or k_new given)
  bool paged = false;
  int page_size = 0, num_pages = 0;
  int total_q = 0, total_k = 0;  // varlen: rows of q and of k
};

struct VariantProblem {
  Problem problem;  // seqlen_k is the capacity of a KV cache, seqlen_q / seqlen_k the longest varlen entries
  Variant variant;
};

// Validates a variant call: a dense forward (q, k, v as `validate` takes them), a KV-cache forward
// (any KV-cache argument given) or, with cu_seqlens_q / cu_seqlens_k, a varlen forward.
VariantProblem validate_variant(nb::handle q, nb::handle k, nb::handle v, nb::handle out, bool causal, double scale,
                                const VariantArgs& args);

}  // namespace cutlassfa::bindings
