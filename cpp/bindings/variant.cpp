#include "bindings/variant.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace cutlassfa::bindings {
namespace {

constexpr int64_t kInt32Max = (int64_t{1} << 31) - 1;

std::string num(int64_t x) { return std::to_string(x); }

std::string dtype_text(const ArrayRef& a) {
  if (a.dtype >= 0 || a.framework == Framework::kNumpy) return a.dtype_name;
  switch (a.dl_code) {
    case dlpack::kInt: return "int" + num(a.dl_bits);
    case dlpack::kUInt: return "uint" + num(a.dl_bits);
    case dlpack::kFloat: return "float" + num(a.dl_bits);
  }
  return a.dtype_name;
}

// Element i (row-major over the recorded shape) of a host integer array, as int64.
int64_t host_int(const ArrayRef& a, int64_t i) {
  int64_t offset = 0;
  for (int d = a.ndim - 1; d >= 0; --d) {
    offset += (i % a.shape[d]) * a.strides[d];
    i /= a.shape[d];
  }
  const char* at = static_cast<const char*>(a.data) + offset * (a.dl_bits / 8);
  bool const is_signed = a.dl_code == dlpack::kInt;
  switch (a.dl_bits) {
    case 8: return is_signed ? int64_t(*reinterpret_cast<const int8_t*>(at)) : int64_t(*reinterpret_cast<const uint8_t*>(at));
    case 16: return is_signed ? int64_t(*reinterpret_cast<const int16_t*>(at)) : int64_t(*reinterpret_cast<const uint16_t*>(at));
    case 32: return is_signed ? int64_t(*reinterpret_cast<const int32_t*>(at)) : int64_t(*reinterpret_cast<const uint32_t*>(at));
    default: {
      uint64_t const bits = *reinterpret_cast<const uint64_t*>(at);
      return is_signed ? static_cast<int64_t>(bits) : (bits > uint64_t(kInt32Max) ? kInt32Max + 1 : int64_t(bits));
    }
  }
}

// An index argument of `ndim` dims, on q's device as int32, or host integer values (copied). expected:
// the shape it must have, -1 for a free extent.
IndexArray read_index(nb::handle value, const char* name, int device, int ndim, const int64_t* expected) {
  IndexArray index;
  if (value.is_none()) return index;
  index.given = true;
  nb::object held;  // a numpy view of a Python sequence
  if (nb::isinstance<nb::list>(value) || nb::isinstance<nb::tuple>(value)) {
    try {
      held = nb::module_::import_("numpy").attr("asarray")(value);
    } catch (const nb::python_error&) {
      value_error(std::string(name) + " must be a rectangular array of ints");
    }
    if (nb::cast<std::string>(held.attr("dtype").attr("kind")) == "f" && nb::cast<int64_t>(held.attr("size")) == 0) {
      held = held.attr("astype")("int32");  // [] is float64 to numpy
    }
    value = held;
  }
  ArrayRef const a = describe(value, name);
  bool const integer = a.dl_code == dlpack::kInt || a.dl_code == dlpack::kUInt;
  if (a.ndim != ndim) {
    value_error(std::string(name) + " must be " + num(ndim) + "-D, got shape " + shape_text(a));
  }
  int64_t want[2] = {expected[0], ndim == 2 ? expected[1] : 1};
  for (int d = 0; d < ndim; ++d) {
    if (want[d] < 0) want[d] = a.shape[d];
  }
  bool same = true;
  for (int d = 0; d < ndim; ++d) same = same && a.shape[d] == want[d];
  if (!same) value_error(std::string(name) + " must have shape " + tuple_text(want, ndim) + ", got " + shape_text(a));
  index.rows = a.shape[0];
  index.cols = ndim == 2 ? a.shape[1] : 1;
  if (a.on_host()) {
    if (!integer || a.dl_bits > 64 || a.dl_bits < 8) {
      type_error(std::string(name) + " must hold integers, got dtype " + dtype_text(a));
    }
    int64_t const count = index.rows * index.cols;
    index.values.resize(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) {
      int64_t const x = host_int(a, i);
      if (x < -kInt32Max - 1 || x > kInt32Max) value_error(std::string(name) + " holds values outside the int32 range");
      index.values[static_cast<size_t>(i)] = static_cast<int32_t>(x);
    }
    index.row_stride = index.cols;
    return index;
  }
  if (a.dl_code != dlpack::kInt || a.dl_bits != 32) {
    type_error(std::string(name) + " must be an int32 array, got dtype " + dtype_text(a));
  }
  if (a.device != device) {
    value_error(std::string(name) + " must be on q's device (" + (device < 0 ? std::string("host") : "cuda:" + num(device)) +
                "), got " + where(a));
  }
  if (a.shape[ndim - 1] > 1 && a.strides[ndim - 1] != 1) {
    value_error(std::string(name) + " must be contiguous in its last dim, got strides " + strides_text(a));
  }
  index.device_data = static_cast<const int*>(a.data);
  index.row_stride = ndim == 2 ? a.strides[0] : 1;
  return index;
}

void check_window_and_softcap(Variant& w, bool causal, const VariantArgs& args) {
  int const left = args.window_left, right = args.window_right;
  if (left < -1 || right < -1) {
    value_error("window sides must be -1 (unbounded) or in [0, 2^31), got (" + num(left) + ", " + num(right) + ")");
  }
  if (causal && right > 0) {
    value_error("window=(" + num(left) + ", " + num(right) + ") with causal=True: causal needs right 0 (or -1)");
  }
  w.window_left = left;
  w.window_right = causal ? 0 : right;
  if (!std::isfinite(args.softcap) || args.softcap < 0) {
    value_error("softcap must be a finite float >= 0 (0 disables it), got " + std::to_string(args.softcap));
  }
  w.softcap = static_cast<float>(args.softcap);
  if (args.num_splits < 0 || args.num_splits > kInt32Max) {
    value_error("num_splits must be an int >= 1 (or None: the backend chooses), got " + num(args.num_splits));
  }
  w.num_splits = static_cast<int>(args.num_splits);
}

// The KV-cache arguments, against q (B, Hq, Nq, d) and the caches.
void validate_kvcache(VariantProblem& vp, nb::handle out, const VariantArgs& args) {
  Problem& p = vp.problem;
  Variant& w = vp.variant;
  w.kv_cache = true;
  w.paged = !args.block_table.is_none();
  int64_t const* qs = p.q.shape;
  int64_t const* ks = p.k.shape;
  int64_t const b = qs[0], hq = qs[1], d = qs[3];
  for (int i = 0; i < 4; ++i) {
    if (p.v.shape[i] != ks[i]) value_error("v must have k's shape " + shape_text(p.k) + ", got " + shape_text(p.v));
  }
  if (ks[3] != d) value_error("k's head dim " + num(ks[3]) + " differs from q's " + num(d));
  check_heads_and_head_dim(hq, ks[1], d, "k and v");
  if (!w.paged && ks[0] != b) {
    value_error("k must have q's batch size " + num(b) + " (or pass block_table for a paged cache), got " + num(ks[0]));
  }
  if (w.paged && ks[2] < 1) value_error("k's page size (dim 2) must be >= 1, got " + num(ks[2]));
  if (qs[2] > kInt32Max || b * hq > kInt32Max || ks[0] > kInt32Max) {
    value_error("sizes too large: Nq, B*H and the pages must be < 2^31");
  }
  int64_t capacity = ks[2];
  if (w.paged) {
    int64_t const table_shape[2] = {b, -1};
    w.block_table = read_index(args.block_table, "block_table", p.device, 2, table_shape);
    capacity = w.block_table.cols * ks[2];
    if (capacity > kInt32Max) value_error("block_table: max_pages * page_size must be < 2^31");
    w.page_size = static_cast<int>(ks[2]);
    w.num_pages = static_cast<int>(ks[0]);
    if (args.cache_seqlens.is_none()) value_error("cache_seqlens is required with block_table (a paged cache)");
  }
  // k_new, v_new (B, Hkv, Nnew, d) of the cache's dtype, on its device.
  if (args.k_new.is_none() != args.v_new.is_none()) {
    value_error(std::string(args.v_new.is_none() ? "v_new" : "k_new") + " is missing: k_new and v_new go together");
  }
  if (!args.k_new.is_none()) {
    if (args.cache_seqlens.is_none()) value_error("cache_seqlens is required with k_new (it says where the new keys go)");
    w.k_new = describe(args.k_new, "k_new");
    w.v_new = describe(args.v_new, "v_new");
    for (const ArrayRef* a : {&*w.k_new, &*w.v_new}) {
      const char* name = a == &*w.k_new ? "k_new" : "v_new";
      if (a->ndim != 4) value_error(std::string(name) + " must be 4-D (B, Hkv, Nnew, d), got shape " + shape_text(*a));
      if (a->dtype != p.k.dtype) type_error(std::string(name) + " must have the cache's dtype " + p.k.dtype_name + ", got " + dtype_text(*a));
      if (a->device != p.device) value_error(std::string(name) + " must be on the device of q, got " + where(*a));
      check_row_contiguous(*a, name);
    }
    int64_t const want[4] = {b, ks[1], w.k_new->shape[2], d};
    for (int i = 0; i < 4; ++i) {
      if (w.k_new->shape[i] != want[i]) {
        value_error("k_new must have shape (B, Hkv, Nnew, d) = " + tuple_text(want, 4) + ", got " + shape_text(*w.k_new));
      }
      if (w.v_new->shape[i] != want[i]) value_error("v_new must have k_new's shape " + tuple_text(want, 4) + ", got " + shape_text(*w.v_new));
    }
    if (want[2] > kInt32Max) value_error("k_new: Nnew must be < 2^31");
    w.n_new = static_cast<int>(want[2]);
    if (p.k.readonly || p.v.readonly) value_error("k and v are read-only, but k_new / v_new are appended into them");
  }
  int64_t const per_entry[1] = {b};
  w.cache_seqlens = read_index(args.cache_seqlens, "cache_seqlens", p.device, 1, per_entry);
  w.cache_leftpad = read_index(args.cache_leftpad, "cache_leftpad", p.device, 1, per_entry);
  // Host values are checked in full: lengths within the capacity, leftpad within the length, the pages used.
  if (w.cache_seqlens.on_host()) {
    for (int64_t i = 0; i < b; ++i) {
      int64_t const n = w.cache_seqlens.values[i];
      if (n < 0) value_error("cache_seqlens must be >= 0, got " + num(n));
      if (n + w.n_new > capacity) {
        value_error("cache_seqlens[" + num(i) + "] = " + num(n) + (w.n_new ? " + " + num(w.n_new) + " new keys" : "") +
                    " exceeds the cache length " + num(capacity));
      }
    }
  }
  if (w.cache_leftpad.on_host()) {
    for (int64_t i = 0; i < b; ++i) {
      int64_t const pad = w.cache_leftpad.values[i];
      int64_t const limit = !w.cache_seqlens.given ? capacity : w.cache_seqlens.on_host() ? w.cache_seqlens.values[i] : kInt32Max;
      if (pad < 0 || pad > limit) {
        value_error("cache_leftpad[" + num(i) + "] = " + num(pad) + " is outside [0, cache_seqlens[" + num(i) + "] = " +
                    num(limit) + "]");
      }
    }
  }
  if (w.block_table.on_host() && w.cache_seqlens.on_host()) {
    for (int64_t i = 0; i < b; ++i) {
      int64_t const used = (w.cache_seqlens.values[i] + w.n_new + w.page_size - 1) / w.page_size;
      for (int64_t j = 0; j < used; ++j) {
        int64_t const page = w.block_table.values[i * w.block_table.cols + j];
        if (page < 0 || page >= w.num_pages) {
          value_error("block_table[" + num(i) + "] holds page indices outside [0, " + num(w.num_pages) + ") (k has " +
                      num(w.num_pages) + " pages)");
        }
      }
    }
  }
  p.batch = static_cast<int>(b);
  p.heads_q = static_cast<int>(hq);
  p.heads_kv = static_cast<int>(ks[1]);
  p.seqlen_q = static_cast<int>(qs[2]);
  p.seqlen_k = static_cast<int>(capacity);
  p.head_dim = static_cast<int>(d);
  p.kv_extent = static_cast<int>(ks[0]);
  p.kv_rows = static_cast<int>(ks[2]);
  if (!out.is_none()) validate_out(p, out, qs, 4);
}

// A varlen batch: q (total_q, Hq, d), k and v (total_k, Hkv, d), cu_seqlens (B+1,).
void validate_varlen(VariantProblem& vp, nb::handle out, const VariantArgs& args) {
  Problem& p = vp.problem;
  Variant& w = vp.variant;
  int64_t const* qs = p.q.shape;
  int64_t const* ks = p.k.shape;
  for (int i = 0; i < 3; ++i) {
    if (p.v.shape[i] != ks[i]) value_error("v must have k's shape " + shape_text(p.k) + ", got " + shape_text(p.v));
  }
  if (ks[2] != qs[2]) value_error("k's head dim " + num(ks[2]) + " differs from q's " + num(qs[2]));
  check_heads_and_head_dim(qs[1], ks[1], qs[2], "k and v");
  if (qs[0] > kInt32Max || ks[0] > kInt32Max) value_error("sizes too large: total_q and total_k must be < 2^31");
  int64_t const free_length[1] = {-1};
  w.cu_seqlens_q = read_index(args.cu_seqlens_q, "cu_seqlens_q", p.device, 1, free_length);
  w.cu_seqlens_k = read_index(args.cu_seqlens_k, "cu_seqlens_k", p.device, 1, free_length);
  if (w.cu_seqlens_q.rows < 1) value_error("cu_seqlens_q must be 1-D (B+1,) with B >= 0, got shape (0,)");
  if (w.cu_seqlens_k.rows < 1) value_error("cu_seqlens_k must be 1-D (B+1,) with B >= 0, got shape (0,)");
  if (w.cu_seqlens_q.rows != w.cu_seqlens_k.rows) {
    value_error("cu_seqlens_q and cu_seqlens_k must have the same length B+1, got " + num(w.cu_seqlens_q.rows) + " and " +
                num(w.cu_seqlens_k.rows));
  }
  int64_t longest[2] = {qs[0], ks[0]};  // device values: the totals bound every entry
  const IndexArray* cus[2] = {&w.cu_seqlens_q, &w.cu_seqlens_k};
  const char* names[2] = {"cu_seqlens_q", "cu_seqlens_k"};
  int64_t const totals[2] = {qs[0], ks[0]};
  for (int s = 0; s < 2; ++s) {
    const IndexArray& cu = *cus[s];
    if (!cu.on_host()) continue;
    std::string const name = names[s];
    if (cu.values[0] != 0) value_error(name + " must start at 0, got " + num(cu.values[0]));
    longest[s] = 0;
    for (int64_t i = 1; i < cu.rows; ++i) {
      if (cu.values[i] < cu.values[i - 1]) value_error(name + " must be non-decreasing");
      longest[s] = std::max<int64_t>(longest[s], cu.values[i] - cu.values[i - 1]);
    }
    if (cu.values[cu.rows - 1] != totals[s]) {
      value_error(name + " ends at " + num(cu.values[cu.rows - 1]) + " but the total length (dim 0) is " + num(totals[s]));
    }
  }
  int64_t const given[2] = {args.max_seqlen_q, args.max_seqlen_k};
  const char* max_names[2] = {"max_seqlen_q", "max_seqlen_k"};
  for (int s = 0; s < 2; ++s) {
    if (given[s] < 0) continue;  // not given: the longest entry (host values) or the total
    bool const known = cus[s]->on_host();
    if (given[s] > kInt32Max || (known && given[s] < longest[s])) {
      value_error(std::string(max_names[s]) + " = " + num(given[s]) + " must be >= the longest sequence (" +
                  num(known ? longest[s] : 0) + ") and < 2^31");
    }
    longest[s] = std::min(given[s], totals[s]);  // no entry is longer than the total
  }
  w.total_q = static_cast<int>(qs[0]);
  w.total_k = static_cast<int>(ks[0]);
  p.varlen = true;
  p.batch = static_cast<int>(w.cu_seqlens_q.rows - 1);
  p.heads_q = static_cast<int>(qs[1]);
  p.heads_kv = static_cast<int>(ks[1]);
  p.seqlen_q = static_cast<int>(longest[0]);
  p.seqlen_k = static_cast<int>(longest[1]);
  p.head_dim = static_cast<int>(qs[2]);
  p.kv_extent = p.batch;
  p.kv_rows = p.seqlen_k;
  if (!out.is_none()) validate_out(p, out, qs, 3);
}

}  // namespace

VariantProblem validate_variant(nb::handle q, nb::handle k, nb::handle v, nb::handle out, bool causal, double scale,
                                const VariantArgs& args) {
  bool const varlen = !args.cu_seqlens_q.is_none() || !args.cu_seqlens_k.is_none();
  bool const kv_cache = !(args.cache_seqlens.is_none() && args.cache_leftpad.is_none() && args.block_table.is_none() &&
                          args.k_new.is_none() && args.v_new.is_none());
  VariantProblem vp;
  if (varlen) {
    if (args.cu_seqlens_q.is_none() || args.cu_seqlens_k.is_none()) {
      value_error(std::string(args.cu_seqlens_q.is_none() ? "cu_seqlens_q" : "cu_seqlens_k") + " is missing");
    }
    if (kv_cache) value_error("varlen_forward takes no KV-cache arguments");
    describe_qkv(vp.problem, q, k, v, 3, "3-D (total, H, d)");
    validate_varlen(vp, out, args);
  } else if (kv_cache) {
    describe_qkv(vp.problem, q, k, v, 4,
                 "4-D: q (B, Hq, Nq, d), caches (B, Hkv, Ncache, d) or, paged, (num_pages, Hkv, page_size, d)");
    validate_kvcache(vp, out, args);
  } else {
    vp.problem = validate(q, k, v, out, causal, scale);
  }
  check_window_and_softcap(vp.variant, causal, args);
  if (varlen) vp.variant.num_splits = 1;  // one pass per entry: varlen batches are not split
  vp.problem.causal = causal;
  vp.problem.scale = resolve_scale(scale, vp.problem.head_dim);
  return vp;
}

}  // namespace cutlassfa::bindings
