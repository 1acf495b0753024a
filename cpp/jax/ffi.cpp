// The XLA FFI custom call "cutlassfa_forward": every call `cutlassfa.forward` / `varlen_forward` takes,
// on XLA's buffers and stream, with no host synchronisation. Python (integrations/jax.py) has validated
// the call at trace time with the extension's validator and chosen the backend; this reads the call's
// sizes from the buffers' dimensions, checks what could corrupt memory, and enqueues it as the Python
// extension does (cutlassfa/enqueue.h).
//
// Operands: q, k, v, then the arrays the attribute `operands` names, in that order (e.g.
// "cache_seqlens,block_table,sinks"). Results: out, lse, then with k_new / v_new the caches k and v
// after the append (Python aliases them to the operands k and v, so the append is in place when XLA
// can donate them). Layouts (attribute `layout`): kBhnd (..., H, N, d), kBnhd (..., N, H, d), JAX's own;
// KV caches alike ((B, Hkv, N, d) / (B, N, Hkv, d); paged (P, Hkv, page, d) / (P, page, Hkv, d)); varlen
// arrays are (total, H, d) in both. lse is (..., H, N), or (H, total_q) for varlen; a result of no
// elements when it is not asked for (nothing is written). Axes in front of a dense call's three
// (jax.vmap's) fold into the batch.
#include "jax/ffi.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

#include "cutlassfa/enqueue.h"
#include "cutlassfa/problem.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace cutlassfa::jax_ffi {

enum Layout : int32_t { kBhnd = 0, kBnhd = 1 };

// The call's static arguments, attributes of the custom call (integrations/jax.py `_on_device`).
struct Attributes {
  int32_t backend;
  double softmax_scale;  // NaN: the default (resolve_scale), as the Python path passes it
  bool causal;
  int64_t window_left, window_right;  // -1: unbounded
  double softcap;
  int32_t num_splits;  // 0: the planner chooses
  int32_t layout;
  int64_t max_seqlen_q, max_seqlen_k;  // varlen: the longest sequences (grid size)
  std::string_view operands;           // names of the operands after q, k, v, comma-separated
};

}  // namespace cutlassfa::jax_ffi

XLA_FFI_REGISTER_STRUCT_ATTR_DECODING(cutlassfa::jax_ffi::Attributes, ffi::StructMember<int32_t>("backend"),
                                      ffi::StructMember<double>("softmax_scale"), ffi::StructMember<bool>("causal"),
                                      ffi::StructMember<int64_t>("window_left"),
                                      ffi::StructMember<int64_t>("window_right"), ffi::StructMember<double>("softcap"),
                                      ffi::StructMember<int32_t>("num_splits"), ffi::StructMember<int32_t>("layout"),
                                      ffi::StructMember<int64_t>("max_seqlen_q"),
                                      ffi::StructMember<int64_t>("max_seqlen_k"),
                                      ffi::StructMember<std::string_view>("operands"));

namespace cutlassfa::jax_ffi {
namespace {

using Dims = ffi::AnyBuffer::Dimensions;
constexpr int64_t kInt32Max = std::numeric_limits<int>::max();

// The operands after q, k, v, by name.
struct Operands {
  std::optional<ffi::AnyBuffer> cache_seqlens, cache_leftpad, block_table, k_new, v_new, cu_seqlens_q, cu_seqlens_k,
      sinks, alibi_slopes, k_descale, v_descale;

  std::optional<ffi::AnyBuffer>* slot(std::string_view name) {
    std::pair<std::string_view, std::optional<ffi::AnyBuffer>*> const slots[] = {
        {"cache_seqlens", &cache_seqlens}, {"cache_leftpad", &cache_leftpad}, {"block_table", &block_table},
        {"k_new", &k_new},                 {"v_new", &v_new},                 {"cu_seqlens_q", &cu_seqlens_q},
        {"cu_seqlens_k", &cu_seqlens_k},   {"sinks", &sinks},                 {"alibi_slopes", &alibi_slopes},
        {"k_descale", &k_descale},         {"v_descale", &v_descale}};
    for (auto const& [known, where] : slots) {
      if (known == name) return where;
    }
    return nullptr;
  }
  bool kv_cache() const { return cache_seqlens || cache_leftpad || block_table || k_new; }
};

Operands read_operands(std::string_view names, ffi::RemainingArgs const& args) {
  Operands operands;
  size_t index = 0;
  while (!names.empty()) {
    size_t const comma = names.find(',');
    std::string_view const name = names.substr(0, comma);
    names = comma == std::string_view::npos ? std::string_view() : names.substr(comma + 1);
    std::optional<ffi::AnyBuffer>* const slot = operands.slot(name);
    if (slot == nullptr) value_error("unknown operand '" + std::string(name) + "'");
    if (index >= args.size()) value_error("fewer operands than the attribute `operands` names");
    ffi::ErrorOr<ffi::AnyBuffer> buffer = args.get<ffi::AnyBuffer>(index++);
    if (buffer.has_error()) value_error("operand '" + std::string(name) + "' is not an array");
    *slot = *buffer;
  }
  if (index != args.size()) value_error("more operands than the attribute `operands` names");
  return operands;
}

void expect(bool holds, std::string const& what) {
  if (!holds) value_error(what);
}

// A compact buffer's last four axes as (batch, heads, rows, head_dim) in `layout`, axes in front folded
// into the batch; strides in elements of (batch, head, row).
struct Extents {
  int64_t batch = 1, heads = 0, rows = 0, head_dim = 0;
  TensorStrides strides;
};

Extents extents(Dims dims, int32_t layout, const char* name) {
  size_t const rank = dims.size();
  expect(rank >= 4, std::string(name) + " must have at least 4 axes");
  Extents e;
  for (size_t i = 0; i + 3 < rank; ++i) e.batch *= dims[i];
  e.heads = layout == kBnhd ? dims[rank - 2] : dims[rank - 3];
  e.rows = layout == kBnhd ? dims[rank - 3] : dims[rank - 2];
  e.head_dim = dims[rank - 1];
  e.strides = layout == kBnhd ? TensorStrides{e.rows * e.heads * e.head_dim, e.head_dim, e.heads * e.head_dim}
                              : TensorStrides{e.heads * e.rows * e.head_dim, e.rows * e.head_dim, e.head_dim};
  return e;
}

bool same_dims(Dims a, Dims b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) return false;
  }
  return true;
}

DType to_dtype(ffi::DataType type, const char* name) {
  switch (type) {
    case ffi::DataType::F32: return DType::kFloat32;
    case ffi::DataType::F16: return DType::kFloat16;
    case ffi::DataType::BF16: return DType::kBFloat16;
    case ffi::DataType::F8E4M3FN: return DType::kFloat8E4M3;
    default: value_error(std::string(name) + ": dtype not among float32, float16, bfloat16, float8_e4m3fn");
  }
}

// An index operand: int32 of `count` elements (-1: any), its device pointer.
const int* index_data(std::optional<ffi::AnyBuffer> const& a, const char* name, int64_t count) {
  if (!a) return nullptr;
  expect(a->element_type() == ffi::DataType::S32, std::string(name) + " must be int32");
  int64_t const elements = static_cast<int64_t>(a->element_count());
  expect(count < 0 || elements == count,
         std::string(name) + " has " + std::to_string(elements) + " elements, expected " + std::to_string(count));
  return static_cast<const int*>(a->untyped_data());
}

// A per-head float32 operand: (heads,) or, where `batch` > 0, (batch, heads); descales also a scalar.
// Its (batch, head) strides in elements.
const float* float_data(std::optional<ffi::AnyBuffer> const& a, const char* name, int64_t heads, int64_t batch,
                        bool scalar_ok, TensorStrides* strides) {
  if (!a) return nullptr;
  expect(a->element_type() == ffi::DataType::F32, std::string(name) + " must be float32");
  Dims const dims = a->dimensions();
  bool const scalar = dims.size() == 0 && scalar_ok;
  bool const per_head = dims.size() == 1 && dims[0] == heads;
  bool const per_entry = dims.size() == 2 && batch > 0 && dims[0] == batch && dims[1] == heads;
  expect(scalar || per_head || per_entry, std::string(name) + " has the wrong shape");
  *strides = {per_entry ? heads : 0, scalar ? 0 : 1, 0};
  return static_cast<const float*>(a->untyped_data());
}

// The outputs as the fill (enqueue_call) writes them: O (B, H, N, d) and lse (B, H, N, 1).
Strided4 view4(int64_t b, int64_t h, int64_t n, int64_t d, TensorStrides s) {
  return Strided4{{b, h, n, d}, {s.batch, s.head, s.row, 1}};
}

ffi::Error enqueue(cudaStream_t stream, int32_t device, Attributes const& a, ffi::AnyBuffer q, ffi::AnyBuffer k,
                   ffi::AnyBuffer v, ffi::RemainingArgs const& rest, ffi::AnyBuffer o, ffi::Buffer<ffi::F32> lse,
                   ffi::RemainingRets const& rest_out) {
  Operands const x = read_operands(a.operands, rest);
  expect(a.layout == kBhnd || a.layout == kBnhd, "unknown layout " + std::to_string(a.layout));
  bool const known_backend =
      a.backend >= static_cast<int32_t>(Backend::kNaive) && a.backend <= static_cast<int32_t>(Backend::kTensorCoreSm80);
  expect(known_backend, "unknown backend " + std::to_string(a.backend));
  Problem p;
  p.dtype = to_dtype(q.element_type(), "q");
  DType const kv_dtype = to_dtype(k.element_type(), "k");
  expect(k.element_type() == v.element_type(), "k and v must share a dtype");
  expect(o.element_type() == q.element_type(), "out must have q's dtype");
  // The trace-time validator sends fp8 attention to a host callback (no GPU kernel takes it yet).
  expect(p.dtype != DType::kFloat8E4M3, "fp8 attention (float8_e4m3fn q) has no GPU kernel in this version");
  p.kv_fp8 = kv_dtype == DType::kFloat8E4M3;
  expect(kv_dtype == p.dtype || (p.kv_fp8 && p.dtype != DType::kFloat32 && x.kv_cache()),
         "q, k and v must share a dtype (or k and v be an fp8 KV cache)");
  expect(same_dims(o.dimensions(), q.dimensions()), "out must have q's shape");
  expect(same_dims(k.dimensions(), v.dimensions()), "k and v must have the same shape");

  CallTensors t;
  Strided4 o_view{}, lse_view{};
  bool const want_lse = lse.element_count() > 0;
  bool const varlen = x.cu_seqlens_q || x.cu_seqlens_k;
  if (varlen) {  // q (total_q, Hq, d), k and v (total_k, Hkv, d), cu_seqlens (B + 1,)
    Dims const qd = q.dimensions(), kd = k.dimensions();
    expect(qd.size() == 3 && kd.size() == 3 && x.cu_seqlens_q && x.cu_seqlens_k && !x.kv_cache(),
           "varlen: q, k, v (total, H, d) with cu_seqlens_q and cu_seqlens_k, and no cache");
    int64_t const entries = static_cast<int64_t>(x.cu_seqlens_q->element_count());
    expect(entries >= 1, "cu_seqlens_q must have B + 1 >= 1 elements");
    t.cu_seqlens_q = index_data(x.cu_seqlens_q, "cu_seqlens_q", entries);
    t.cu_seqlens_k = index_data(x.cu_seqlens_k, "cu_seqlens_k", entries);
    p.varlen = true, p.rank = 3, p.num_splits = 1;
    p.batch = static_cast<int>(entries - 1);
    p.total_q = static_cast<int>(qd[0]), p.total_k = static_cast<int>(kd[0]);
    p.heads_q = static_cast<int>(qd[1]), p.heads_kv = static_cast<int>(kd[1]), p.head_dim = static_cast<int>(qd[2]);
    expect(kd[2] == qd[2] && a.max_seqlen_q >= 0 && a.max_seqlen_k >= 0 && a.max_seqlen_q <= qd[0] &&
               a.max_seqlen_k <= kd[0] && qd[0] <= kInt32Max && kd[0] <= kInt32Max,
           "varlen: head dims or max_seqlen out of range");
    p.seqlen_q = static_cast<int>(a.max_seqlen_q), p.seqlen_k = static_cast<int>(a.max_seqlen_k);
    p.kv_extent = p.batch, p.kv_rows = p.seqlen_k;
    t.q_strides = {0, qd[2], qd[1] * qd[2]}, t.k_strides = t.v_strides = {0, kd[2], kd[1] * kd[2]};
    t.o_strides = t.q_strides;
    t.lse_batch_stride = 0, t.lse_head_stride = p.total_q;
    o_view = view4(1, p.heads_q, p.total_q, p.head_dim, t.o_strides);
    lse_view = view4(1, p.heads_q, p.total_q, 1, {0, p.total_q, 1});
    Dims const ld = lse.dimensions();
    expect(!want_lse || (ld.size() == 2 && ld[0] == qd[1] && ld[1] == qd[0]), "lse must be (Hq, total_q)");
  } else {
    Extents const eq = extents(q.dimensions(), a.layout, "q");
    Extents const ek = extents(k.dimensions(), a.layout, "k");
    p.batch = static_cast<int>(eq.batch), p.heads_q = static_cast<int>(eq.heads);
    p.seqlen_q = static_cast<int>(eq.rows);
    p.heads_kv = static_cast<int>(ek.heads), p.head_dim = static_cast<int>(eq.head_dim);
    expect(ek.head_dim == eq.head_dim, "q, k and v must have the same head dim");
    expect(eq.batch * eq.heads <= kInt32Max && eq.rows <= kInt32Max && ek.batch <= kInt32Max && ek.rows <= kInt32Max,
           "sizes too large: N must be < 2^31 and B*H < 2^31");
    p.seqlen_k = static_cast<int>(ek.rows);
    if (x.kv_cache()) {
      expect(q.dimensions().size() == 4 && k.dimensions().size() == 4, "a KV-cache call has 4-D q, k and v");
      p.kv_cache = true, p.paged = x.block_table.has_value();
      p.kv_extent = static_cast<int>(ek.batch), p.kv_rows = static_cast<int>(ek.rows);
      expect(p.paged || ek.batch == eq.batch, "k must have q's batch size");
      t.seqlens_k = index_data(x.cache_seqlens, "cache_seqlens", eq.batch);
      t.leftpad_k = index_data(x.cache_leftpad, "cache_leftpad", eq.batch);
      if (p.paged) {
        Dims const table = x.block_table->dimensions();
        expect(table.size() == 2 && table[0] == eq.batch && ek.rows >= 1 && table[1] * ek.rows <= kInt32Max,
               "block_table must be (B, max_pages)");
        t.block_table = index_data(x.block_table, "block_table", -1);
        t.block_table_stride = table[1];
        p.page_size = static_cast<int>(ek.rows), p.num_pages = static_cast<int>(ek.batch);
        p.seqlen_k = static_cast<int>(table[1] * ek.rows);
        expect(t.seqlens_k != nullptr, "cache_seqlens is required with block_table");
      }
    } else {
      expect(ek.batch == eq.batch, "q, k and v must have the same batch size");
    }
    t.q_strides = eq.strides, t.k_strides = t.v_strides = ek.strides, t.o_strides = eq.strides;
    t.lse_batch_stride = eq.heads * eq.rows, t.lse_head_stride = eq.rows;
    o_view = view4(eq.batch, eq.heads, eq.rows, eq.head_dim, eq.strides);
    lse_view = view4(eq.batch, eq.heads, eq.rows, 1, {eq.heads * eq.rows, eq.rows, 1});
    Dims const qd = q.dimensions(), ld = lse.dimensions();
    bool lse_ok = ld.size() + 1 == qd.size() && ld[ld.size() - 2] == eq.heads && ld[ld.size() - 1] == eq.rows;
    for (size_t i = 0; lse_ok && i + 3 < qd.size(); ++i) lse_ok = ld[i] == qd[i];
    expect(lse_ok || !want_lse, "lse must be q's leading axes then (H, N)");
  }
  expect(p.heads_kv > 0 && p.heads_q % p.heads_kv == 0, "the heads of q must be a multiple of those of k and v");

  AppendKV append{};
  if (x.k_new || x.v_new) {
    expect(x.k_new && x.v_new && t.seqlens_k != nullptr && rest_out.size() == 2,
           "k_new and v_new go together, with cache_seqlens and the caches as results");
    expect(same_dims(x.k_new->dimensions(), x.v_new->dimensions()) && x.k_new->element_type() == k.element_type() &&
               x.v_new->element_type() == k.element_type(),
           "k_new and v_new must have one shape and the cache's dtype");
    Extents const en = extents(x.k_new->dimensions(), a.layout, "k_new");
    expect(x.k_new->dimensions().size() == 4 && en.batch == p.batch && en.heads == p.heads_kv &&
               en.head_dim == p.head_dim && en.rows <= kInt32Max,
           "k_new must be (B, Hkv, Nnew, d) in the call's layout");
    p.n_new = static_cast<int>(en.rows);
    append = {x.k_new->untyped_data(), x.v_new->untyped_data(), {}, {}, p.n_new};
    long long const s[3] = {en.strides.batch, en.strides.head, en.strides.row};
    for (int i = 0; i < 3; ++i) append.k_new_strides[i] = append.v_new_strides[i] = s[i];
  } else {
    expect(rest_out.size() == 0, "results beyond out and lse come with k_new / v_new only");
  }

  TensorStrides head_strides;
  t.sinks = float_data(x.sinks, "sinks", p.heads_q, 0, false, &head_strides);
  t.alibi_slopes = float_data(x.alibi_slopes, "alibi_slopes", p.heads_q, p.batch, false, &head_strides);
  t.alibi_batch_stride = head_strides.batch;
  t.k_descale = float_data(x.k_descale, "k_descale", p.heads_kv, p.batch, true, &t.k_descale_strides);
  t.v_descale = float_data(x.v_descale, "v_descale", p.heads_kv, p.batch, true, &t.v_descale_strides);
  expect(p.kv_fp8 || (!x.k_descale && !x.v_descale), "descales scale an fp8 KV cache");

  p.window = fold_causal(a.causal, a.window_left, a.window_right);
  p.softcap = static_cast<float>(a.softcap);
  p.scale = resolve_scale(a.softmax_scale, p.head_dim);
  if (!varlen) p.num_splits = a.num_splits;
  p.variant = asks_options(p, a.causal, a.num_splits > 0);

  // With k_new the caches are results (aliased to k, v when XLA can donate them): appended into there
  // and read there by the kernels.
  void* k_cache = k.untyped_data();
  void* v_cache = v.untyped_data();
  if (x.k_new) {
    ffi::ErrorOr<ffi::Result<ffi::AnyBuffer>> k_out = rest_out.get<ffi::AnyBuffer>(0);
    ffi::ErrorOr<ffi::Result<ffi::AnyBuffer>> v_out = rest_out.get<ffi::AnyBuffer>(1);
    expect(k_out.has_value() && v_out.has_value() && same_dims((*k_out)->dimensions(), k.dimensions()) &&
               same_dims((*v_out)->dimensions(), v.dimensions()),
           "the cache results must have k's shape");
    k_cache = (*k_out)->untyped_data(), v_cache = (*v_out)->untyped_data();
  }
  t.q = q.untyped_data(), t.k = k_cache, t.v = v_cache, t.o = o.untyped_data();
  t.lse = want_lse ? lse.typed_data() : nullptr;
  FwdParams const params = make_params(p, t);

  // The launchers query the current device (shared-memory limits): make it XLA's for the launch.
  int previous = 0;
  cudaError_t status = cudaGetDevice(&previous);
  if (status == cudaSuccess && previous != device) status = cudaSetDevice(device);
  EnqueueFailure failure;
  if (x.k_new) {  // caches XLA did not donate: the result starts as a copy of the operand
    failure.step = "cutlassfa copy of a cache into its result";
    for (auto [from, to] : {std::pair{k.untyped_data(), k_cache}, std::pair{v.untyped_data(), v_cache}}) {
      if (status == cudaSuccess && from != to) {
        status = cudaMemcpyAsync(to, from, k.size_bytes(), cudaMemcpyDeviceToDevice, stream);
      }
    }
  }
  if (status == cudaSuccess) {
    status = enqueue_call(static_cast<Backend>(a.backend), device, p, params, x.k_new ? &append : nullptr, o_view,
                          want_lse ? &lse_view : nullptr, stream, &failure);
  }
  if (previous != device) cudaSetDevice(previous);
  if (status != cudaSuccess) {
    cudaGetLastError();  // clear a non-sticky error for the next launch
    return ffi::Error::Internal(std::string("cutlassfa_forward: ") + failure.step + ": " + cudaGetErrorString(status));
  }
  return ffi::Error::Success();
}

}  // namespace

// The handler's body; invalid arguments come back as InvalidArgument errors (XLA raises them).
ffi::Error forward(cudaStream_t stream, int32_t device, Attributes attributes, ffi::AnyBuffer q, ffi::AnyBuffer k,
                   ffi::AnyBuffer v, ffi::RemainingArgs rest, ffi::Result<ffi::AnyBuffer> o,
                   ffi::Result<ffi::Buffer<ffi::F32>> lse, ffi::RemainingRets rest_out) {
  try {
    return enqueue(stream, device, attributes, q, k, v, rest, *o, *lse, rest_out);
  } catch (ArgumentError const& error) {
    return ffi::Error::InvalidArgument(std::string("cutlassfa_forward: ") + error.what());
  }
}

}  // namespace cutlassfa::jax_ffi

XLA_FFI_DEFINE_HANDLER_SYMBOL(cutlassfa_jax_forward, cutlassfa::jax_ffi::forward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Attrs<cutlassfa::jax_ffi::Attributes>()
                                  .Arg<ffi::AnyBuffer>()  // q
                                  .Arg<ffi::AnyBuffer>()  // k
                                  .Arg<ffi::AnyBuffer>()  // v
                                  .RemainingArgs()        // the attribute `operands`, in order
                                  .Ret<ffi::AnyBuffer>()  // out
                                  .Ret<ffi::Buffer<ffi::F32>>()  // lse
                                  .RemainingRets());      // with k_new: the caches k, v

namespace cutlassfa {

void register_jax_ffi(nanobind::module_& m) {
  m.def(
      "jax_ffi_forward", [] { return nanobind::capsule(reinterpret_cast<void*>(&cutlassfa_jax_forward)); },
      "The XLA FFI handler of the custom call cutlassfa_forward, as a capsule for jax.ffi.register_ffi_target");
}

}  // namespace cutlassfa
