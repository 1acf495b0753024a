// The XLA FFI custom call "cutlassfa_forward": q, k, v in, (out, lse) out, all XLA buffers on one
// device, launched on XLA's stream with no host synchronisation. Python (integrations/jax.py) has
// validated the call at trace time and chosen the backend; this checks only what could corrupt memory.
#include "jax/ffi.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <limits>
#include <string>

#include "cutlassfa/dispatch.h"
#include "cutlassfa/problem.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace cutlassfa {
namespace {

// A row-major (..., H, N, d) buffer as (B, H, N, d): the axes in front of H (jax.vmap's) fold into B.
struct Shape4 {
  int64_t batch = 1, heads = 0, seqlen = 0, head_dim = 0;
};

bool as_4d(ffi::AnyBuffer::Dimensions dims, Shape4* shape) {
  size_t const rank = dims.size();
  if (rank < 4) return false;
  for (size_t i = 0; i + 3 < rank; ++i) shape->batch *= dims[i];
  shape->heads = dims[rank - 3];
  shape->seqlen = dims[rank - 2];
  shape->head_dim = dims[rank - 1];
  return true;
}

bool to_dtype(ffi::DataType type, DType* dtype) {
  switch (type) {
    case ffi::DataType::F32: *dtype = DType::kFloat32; return true;
    case ffi::DataType::F16: *dtype = DType::kFloat16; return true;
    case ffi::DataType::BF16: *dtype = DType::kBFloat16; return true;
    default: return false;
  }
}

// XLA buffers are compact: strides in elements of a row-major (B, H, N, d) buffer.
TensorStrides compact_strides(Shape4 const& s) {
  return {s.heads * s.seqlen * s.head_dim, s.seqlen * s.head_dim, s.head_dim};
}

ffi::Error invalid(std::string const& what) { return ffi::Error::InvalidArgument("cutlassfa_forward: " + what); }

ffi::Error check_shapes(Shape4 const& q, Shape4 const& k, Shape4 const& v, ffi::AnyBuffer::Dimensions q_dims,
                        ffi::AnyBuffer::Dimensions o_dims, ffi::AnyBuffer::Dimensions lse_dims) {
  if (k.batch != q.batch || v.batch != q.batch) return invalid("q, k and v must have the same batch size");
  if (k.heads != v.heads || k.seqlen != v.seqlen) return invalid("k and v must have the same shape");
  if (k.head_dim != q.head_dim || v.head_dim != q.head_dim) return invalid("q, k and v must have the same head dim");
  if (k.heads == 0 || q.heads % k.heads != 0) return invalid("the heads of q must be a multiple of those of k and v");
  if (k.seqlen == 0) return invalid("Nk == 0 is answered before the custom call");
  bool same_out = o_dims.size() == q_dims.size() && lse_dims.size() + 1 == q_dims.size();
  for (size_t i = 0; same_out && i < q_dims.size(); ++i) {
    same_out = o_dims[i] == q_dims[i] && (i + 1 == q_dims.size() || lse_dims[i] == q_dims[i]);
  }
  if (!same_out) return invalid("out must have q's shape and lse q's shape without its last axis");
  int64_t const int_max = std::numeric_limits<int>::max();
  if (q.batch * q.heads > int_max || q.seqlen > int_max || k.seqlen > int_max) {
    return invalid("sizes too large: N must be < 2^31 and B*H < 2^31");
  }
  return ffi::Error::Success();
}

ffi::Error forward(cudaStream_t stream, int32_t device, int32_t backend, double softmax_scale, bool causal,
                   ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::Result<ffi::AnyBuffer> o,
                   ffi::Result<ffi::Buffer<ffi::F32>> lse) {
  Shape4 sq, sk, sv;
  if (!as_4d(q.dimensions(), &sq) || !as_4d(k.dimensions(), &sk) || !as_4d(v.dimensions(), &sv)) {
    return invalid("q, k and v must have at least 4 axes (B, H, N, d)");
  }
  DType dtype;
  if (!to_dtype(q.element_type(), &dtype) || k.element_type() != q.element_type() ||
      v.element_type() != q.element_type() || o->element_type() != q.element_type()) {
    return invalid("q, k, v and out must share one dtype among float32, float16, bfloat16");
  }
  if (ffi::Error error = check_shapes(sq, sk, sv, q.dimensions(), o->dimensions(), lse->dimensions());
      error.failure()) {
    return error;
  }
  if (backend < static_cast<int32_t>(Backend::kNaive) || backend > static_cast<int32_t>(Backend::kTensorCoreSm80)) {
    return invalid("unknown backend " + std::to_string(backend));
  }
  if (sq.batch * sq.heads * sq.seqlen == 0) return ffi::Error::Success();

  Problem problem;
  problem.batch = static_cast<int>(sq.batch);
  problem.heads_q = static_cast<int>(sq.heads);
  problem.heads_kv = static_cast<int>(sk.heads);
  problem.seqlen_q = static_cast<int>(sq.seqlen);
  problem.seqlen_k = static_cast<int>(sk.seqlen);
  problem.head_dim = static_cast<int>(sq.head_dim);
  problem.dtype = dtype;
  problem.window = fold_causal(causal, -1, -1);
  // Python resolved the scale (a double, so that it is rounded to float here as in the Python path).
  problem.scale = static_cast<float>(softmax_scale);
  CallTensors tensors;
  tensors.q = q.untyped_data(), tensors.k = k.untyped_data(), tensors.v = v.untyped_data();
  tensors.o = o->untyped_data();
  tensors.lse = lse->typed_data();
  tensors.q_strides = compact_strides(sq), tensors.k_strides = compact_strides(sk);
  tensors.v_strides = compact_strides(sv), tensors.o_strides = compact_strides(sq);
  tensors.lse_head_stride = problem.seqlen_q;
  tensors.lse_batch_stride = static_cast<long long>(problem.heads_q) * problem.seqlen_q;
  FwdParams params = make_params(problem, tensors);

  // The launchers query the current device (shared-memory limits): make it XLA's for the launch.
  int previous = 0;
  cudaError_t status = cudaGetDevice(&previous);
  if (status == cudaSuccess && previous != device) status = cudaSetDevice(device);
  if (status == cudaSuccess) {
    status = run_plan(make_plan(static_cast<Backend>(backend), device, params, kDefaultSplits), params, stream);
  }
  if (previous != device) cudaSetDevice(previous);
  if (status != cudaSuccess) {
    cudaGetLastError();  // clear a non-sticky error for the next launch
    return ffi::Error::Internal(std::string("cutlassfa_forward: ") + cudaGetErrorString(status));
  }
  return ffi::Error::Success();
}

}  // namespace
}  // namespace cutlassfa

XLA_FFI_DEFINE_HANDLER_SYMBOL(cutlassfa_jax_forward, cutlassfa::forward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Attr<int32_t>("backend")
                                  .Attr<double>("softmax_scale")
                                  .Attr<bool>("causal")
                                  .Arg<ffi::AnyBuffer>()  // q
                                  .Arg<ffi::AnyBuffer>()  // k
                                  .Arg<ffi::AnyBuffer>()  // v
                                  .Ret<ffi::AnyBuffer>()  // out
                                  .Ret<ffi::Buffer<ffi::F32>>());  // lse

namespace cutlassfa {

void register_jax_ffi(nanobind::module_& m) {
  m.def(
      "jax_ffi_forward", [] { return nanobind::capsule(reinterpret_cast<void*>(&cutlassfa_jax_forward)); },
      "The XLA FFI handler of the custom call cutlassfa_forward, as a capsule for jax.ffi.register_ffi_target");
}

}  // namespace cutlassfa
