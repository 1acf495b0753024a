#include "cutlassfa/problem.h"

#include <cmath>

namespace cutlassfa {

[[noreturn]] void value_error(const std::string& message) { throw ArgumentError(ArgumentError::Kind::kValue, message); }
[[noreturn]] void type_error(const std::string& message) { throw ArgumentError(ArgumentError::Kind::kType, message); }

Window fold_causal(bool causal, long long left, long long right) {
  constexpr long long kInt32Max = (1ll << 31) - 1;
  if (left < -1 || right < -1 || left > kInt32Max || right > kInt32Max) {
    value_error("window sides must be -1 (unbounded) or in [0, 2^31), got (" + std::to_string(left) + ", " +
                std::to_string(right) + ")");
  }
  if (causal && right > 0) {
    value_error("window=(" + std::to_string(left) + ", " + std::to_string(right) +
                ") with causal=True: causal needs right 0 (or -1)");
  }
  return {static_cast<int>(left), causal ? 0 : static_cast<int>(right)};
}

float resolve_scale(double scale, int head_dim) {
  if (std::isnan(scale)) return static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
  if (!std::isfinite(scale)) {
    value_error(std::string("softmax_scale must be finite, got ") + (scale > 0 ? "inf" : "-inf"));
  }
  return static_cast<float>(scale);
}

bool asks_options(const Problem& p, bool causal, bool num_splits_given) {
  Window const plain = fold_causal(causal, -1, -1);
  return p.varlen || p.kv_cache || p.window.left != plain.left || p.window.right != plain.right || p.softcap > 0.f ||
         num_splits_given;
}

FwdParams make_params(const Problem& p, const CallTensors& t) {
  constexpr double kLog2e = 1.4426950408889634;
  FwdParams params{};
  params.q = t.q, params.k = t.k, params.v = t.v, params.o = t.o, params.lse = t.lse;
  params.q_batch_stride = t.q_strides.batch, params.q_head_stride = t.q_strides.head, params.q_row_stride = t.q_strides.row;
  params.k_batch_stride = t.k_strides.batch, params.k_head_stride = t.k_strides.head, params.k_row_stride = t.k_strides.row;
  params.v_batch_stride = t.v_strides.batch, params.v_head_stride = t.v_strides.head, params.v_row_stride = t.v_strides.row;
  params.o_batch_stride = t.o_strides.batch, params.o_head_stride = t.o_strides.head, params.o_row_stride = t.o_strides.row;
  params.batch = p.batch, params.heads_q = p.heads_q, params.heads_kv = p.heads_kv;
  params.heads_ratio = p.heads_kv > 0 ? p.heads_q / p.heads_kv : 1;
  params.seqlen_q = p.seqlen_q, params.seqlen_k = p.seqlen_k, params.head_dim = p.head_dim;
  // Softcap: c * tanh(scale * s / c); the cap becomes the softmax scale (params.h). The scale is rounded
  // to float from the double product, the same in every entry.
  float const softmax_scale = p.softcap > 0.f ? p.softcap : p.scale;
  if (p.softcap > 0.f) params.softcap_pre = p.scale / p.softcap;
  params.softmax_scale = softmax_scale;
  params.softmax_scale_log2 = static_cast<float>(static_cast<double>(softmax_scale) * kLog2e);
  params.window_left = p.window.left;
  params.window_right = p.window.right;
  params.lse_batch_stride = t.lse_batch_stride;
  params.lse_head_stride = t.lse_head_stride;
  params.cu_seqlens_q = t.cu_seqlens_q;
  params.cu_seqlens_k = t.cu_seqlens_k;
  params.total_q = p.total_q;
  params.total_k = p.total_k;
  params.seqlens_k = t.seqlens_k;
  params.leftpad_k = t.leftpad_k;
  params.seqlens_k_added = p.n_new;
  params.sinks = t.sinks;
  params.alibi_slopes = t.alibi_slopes;
  params.alibi_batch_stride = t.alibi_batch_stride;
  if (p.paged) {
    params.block_table = t.block_table;
    params.block_table_stride = t.block_table_stride;
    params.page_size = p.page_size;
    if ((p.page_size & (p.page_size - 1)) == 0) {
      params.page_size_log2 = 0;
      while ((1 << params.page_size_log2) < p.page_size) ++params.page_size_log2;
    }
    params.num_pages = p.num_pages;
  }
  params.dtype = p.dtype;
  params.out_dtype = p.dtype == DType::kFloat8E4M3 ? p.out_dtype : p.dtype;
  params.kv_fp8 = p.kv_fp8;
  params.k_descale = t.k_descale, params.v_descale = t.v_descale;
  params.k_descale_batch_stride = t.k_descale_strides.batch, params.k_descale_head_stride = t.k_descale_strides.head;
  params.v_descale_batch_stride = t.v_descale_strides.batch, params.v_descale_head_stride = t.v_descale_strides.head;
  params.q_descale = t.q_descale;
  params.q_descale_batch_stride = t.q_descale_strides.batch, params.q_descale_head_stride = t.q_descale_strides.head;
  return params;
}

}  // namespace cutlassfa
