// The scalar rules of attention, each written once: the lengths of a batch entry, the key range a
// query row sees, where a key of a paged cache lives (and whether its page exists), softcap's tanh, the
// attention sink's term, ALiBi's distance.
// Every kernel family calls these (common/ for the tensor-core tiles, sm90decode/decode_kernel.h, simt/ and
// src/append_kv.cu); python/cutlassfa/reference.py and masks.py are the other statement of the same
// rules. The kernels keep their fast structure around them (relative mask limits, shifts for pages
// of a power-of-two size, one block-table read per tile): a rule here is a few integer operations,
// always inlined.
//
// No #include: the CUDA-core kernels that use it are compiled by NVRTC too (tests/test_nvrtc_simt.py),
// and host code can include it without the CUDA headers. Plain ints in, plain ints out.
#pragma once

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define CUTLASSFA_RULE __host__ __device__ __forceinline__
#else
#define CUTLASSFA_RULE inline
#endif

namespace cutlassfa {
namespace rules {

CUTLASSFA_RULE int clamp_int(long long x, int lo, int hi) { return x < lo ? lo : x > hi ? hi : static_cast<int>(x); }

// ---- Entry lengths (params.h; host values are checked in cpp/bindings/request.cpp) --------------------
// Device index values are not checked on the host, so each length is clamped to what the tensors hold.

// Keys of a KV-cache entry: the keys already there plus the ones appended this call, within the
// capacity. 64-bit: a bad length plus `added` may pass 2^31.
CUTLASSFA_RULE int cache_entry_keys(int seqlen, int added, int capacity) {
  return clamp_int(static_cast<long long>(seqlen) + added, 0, capacity);
}

// A varlen entry [begin, end) of cu_seqlens, in a packed array of `total` rows: its first row within
// [0, total], and its rows within [0, longest] (longest: max_seqlen, the grid) and within the array.
CUTLASSFA_RULE int varlen_entry_begin(int begin, int total) { return clamp_int(begin, 0, total); }
CUTLASSFA_RULE int varlen_entry_rows(int begin, int end, int longest, int total) {
  int const first = varlen_entry_begin(begin, total);
  return clamp_int(static_cast<long long>(end) - first, 0, longest < total - first ? longest : total - first);
}

// Left padding of an entry of `keys` keys: keys [0, leftpad) are hidden, 0 <= leftpad <= keys.
CUTLASSFA_RULE int entry_leftpad(int leftpad, int keys) { return clamp_int(leftpad, 0, keys); }

// ---- Mask: the keys [lo, hi) query row `row` sees -------------------------------------------------------
// With offset = seqlen_k - seqlen_q (bottom-right alignment), row i sees key j iff
//     i + offset - window_left <= j <= i + offset + window_right   and   key_begin <= j < seqlen_k,
// -1 meaning unbounded on that side (causal is (-1, 0)); key_begin is the left padding. lo and hi are
// non-decreasing in the row. Exact for any window side below 2^31 without 64-bit arithmetic: each
// side is compared with the distance it would cover before it is added.

// The key aligned with query row `row` (bottom-right: the entry's last query with its last key).
CUTLASSFA_RULE int mask_diagonal(int row, int seqlen_q, int seqlen_k) { return row + (seqlen_k - seqlen_q); }

// First key row `row` sees: >= key_begin, and may exceed seqlen_k (the row then sees none).
CUTLASSFA_RULE int mask_row_lo(int row, int seqlen_q, int seqlen_k, int window_left, int key_begin) {
  int const diagonal = mask_diagonal(row, seqlen_q, seqlen_k);
  bool const unbounded = window_left < 0 || diagonal <= key_begin || window_left >= diagonal - key_begin;
  return unbounded ? key_begin : diagonal - window_left;
}

// One past the last key row `row` sees: <= seqlen_k, and may be below lo (the row then sees none).
CUTLASSFA_RULE int mask_row_hi(int row, int seqlen_q, int seqlen_k, int window_right) {
  int const diagonal = mask_diagonal(row, seqlen_q, seqlen_k);
  bool const unbounded = window_right < 0 || window_right >= seqlen_q - row;  // diagonal + right + 1 >= seqlen_k
  return unbounded ? seqlen_k : diagonal + window_right + 1;
}

// ---- ALiBi: the distance of key `key` from row `row`'s diagonal ------------------------------------------
// A score gains -slope * |diagonal(row) - key| (params.h). As a float, exact below 2^24.
CUTLASSFA_RULE float alibi_distance(int row, int seqlen_q, int seqlen_k, int key) {
  int const d = mask_diagonal(row, seqlen_q, seqlen_k) - key;
  return static_cast<float>(d < 0 ? -d : d);
}

// ---- Paged caches: key position p of an entry is row p % page_size of page table[p / page_size] ---------
// A page index outside [0, num_pages) (a device block table is not checked on the host) is no page:
// its keys count as masked and are never read, and keys appended there are dropped.

CUTLASSFA_RULE bool page_index_valid(int page, int num_pages) {
  return static_cast<unsigned>(page) < static_cast<unsigned>(num_pages);
}

// The table slot of key p, and its row in that page. Page sizes that are powers of two take shifts, not
// divisions (the _pow2 forms, for kernels that only run those); page_size_log2 < 0 otherwise.
CUTLASSFA_RULE int page_slot_of_key_pow2(int p, int page_size_log2) { return p >> page_size_log2; }
CUTLASSFA_RULE int row_in_page_pow2(int p, int page_size) { return p & (page_size - 1); }
CUTLASSFA_RULE int page_slot_of_key(int p, int page_size, int page_size_log2) {
  return page_size_log2 >= 0 ? page_slot_of_key_pow2(p, page_size_log2) : p / page_size;
}
CUTLASSFA_RULE int row_in_page(int p, int slot, int page_size, int page_size_log2) {
  return page_size_log2 >= 0 ? row_in_page_pow2(p, page_size) : p - slot * page_size;
}

// ---- Softcap -------------------------------------------------------------------------------------------
// Every score s becomes tanh(s * softcap_pre) (params.h). tanh(x) = 1 - 2 / (e^(2x) + 1): on the GPU one
// MUFU.EX2 and one MUFU.RCP. Its absolute error (~1e-7, the reciprocal's) is what matters: multiplied by
// the cap it is the error of the capped score, which the softmax sees as a relative error of P;
// tanh.approx.f32 (~5e-4 relative) would be 100x coarser. Large |x|: e^(2x) = inf gives 1, 0 gives -1.
CUTLASSFA_RULE float softcap_tanh(float x) {
  float const two_x_log2e = x * 2.88539008177792681f;  // 2 log2(e)
#if defined(__CUDA_ARCH__)
  float e;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(two_x_log2e));
  return 1.f - __fdividef(2.f, e + 1.f);
#else
  return 1.f - 2.f / (__builtin_exp2f(two_x_log2e) + 1.f);
#endif
}

// ---- Attention sinks -------------------------------------------------------------------------------------
// A sink adds e^sink to a row's softmax denominator and nothing to its numerator. A row computed without
// it, (out, lse), becomes (out * sink_out_scale(lse, lse'), lse') with lse' = lse_with_sink(lse, sink) =
// log(e^lse + e^sink): a row that saw no key (lse = -inf) gets out 0 and lse = sink; sink = -inf changes
// nothing. Every merge by lse (split keys, ring steps) adds the sink once, to the merged lse. On the GPU
// the MUFU forms (__expf, __logf: ~2^-21 relative): the absolute error they leave in lse is far below the
// lse bound, and the accurate log1pf / expf cost a short prefill a few percent (epilogue latency).
CUTLASSFA_RULE float lse_with_sink(float lse, float sink) {
#if defined(__CUDA_ARCH__)
  float const hi = fmaxf(lse, sink), lo = fminf(lse, sink);
  return hi == __int_as_float(0xff800000) ? hi : hi + __logf(1.f + __expf(lo - hi));  // -inf: no INFINITY under NVRTC
#else
  float const hi = lse > sink ? lse : sink, lo = lse > sink ? sink : lse;
  return hi == -__builtin_inff() ? hi : hi + __builtin_log1pf(__builtin_expf(lo - hi));
#endif
}

// The factor that renormalizes a row's out once the sink is in its lse: exp(lse - lse'), 0 for an empty row.
CUTLASSFA_RULE float sink_out_scale(float lse, float lse_sinked) {
#if defined(__CUDA_ARCH__)
  return lse == __int_as_float(0xff800000) ? 0.f : __expf(lse - lse_sinked);
#else
  return lse == -__builtin_inff() ? 0.f : __builtin_expf(lse - lse_sinked);
#endif
}

}  // namespace rules
}  // namespace cutlassfa
