// Standalone check of the CUDA-core family (not part of the library build):
//   nvcc -O3 -std=c++17 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -Icpp/include -Icpp \
//        -I$BUILD/generated -isystem $BUILD/_deps/cutlass/include \
//        cpp/simt/selftest.cu cpp/simt/launch_naive.cu cpp/simt/launch_small_tile.cu \
//        cpp/simt/launch_large_tile.cu cpp/src/workspace.cpp -o /tmp/simt_selftest && /tmp/simt_selftest
// with $BUILD a configured CMake build directory (cutlassfa/config.h and CUTLASS's headers).
// Random inputs (ragged N, Nq != Nk, causal, GQA, strided / unaligned layouts, every dtype and head
// dim) against a CPU fp64 reference, outputs poisoned with NaN first; then every FwdParams mode
// (windows, softcap, varlen, KV cache lengths, leftpad, paged caches) against an fp64 reference that
// applies params.h's visibility rule key by key, with hidden cache rows filled with NaN; then
// CUDA-event timings. `quick` skips the timings; `mask` runs only the host check of the mask helpers
// (no GPU needed).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/reference_row.h"
#include "common/selftest_harness.h"
#include "cutlassfa/launch.h"
#include "simt/launch_flash_simt.h"

using namespace cutlassfa;

// Backend 3: the large_tile variant that sm_86 / sm_89 fall back to, run directly.
template <typename T, int D>
struct CompactLaunch {
  static cudaError_t run(const FwdParams& p, cudaStream_t s) {
    return simt::launch_flash_simt_kernel<simt::LargeTileCompact<D>, T>(p, s);
  }
};
static const char* kBackendNames[] = {"naive", "small_tile", "large_tile", "large_cmpct"};
static cudaError_t run_backend(int backend, const FwdParams& p, cudaStream_t s) {
  switch (backend) {
    case 0: return launch_naive(p, s);
    case 1: return launch_small_tile(p, s);
    case 2: return launch_large_tile(p, s);
    default: return simt::dispatch_flash_simt<CompactLaunch, CUTLASSFA_LARGE_TILE_HEAD_DIMS>(p, s);
  }
}

// A (batch, heads, seqlen, d) tensor with layout 0 = contiguous BHSD, 1 = BSHD, 2 = BHSD with the
// row stride padded by `pad` elements (pad 1 breaks 16-byte alignment: the scalar load path).
struct Tensor {
  int b, h, n, d;
  long long sb, sh, sr;
  size_t elems;
  DType t;
  std::vector<float> val;  // rounded values, (b, h, n, d) dense
  void* dev = nullptr;
  Tensor(int b_, int h_, int n_, int d_, int layout, int pad, DType t_) : b(b_), h(h_), n(n_), d(d_), t(t_) {
    if (layout == 1) {
      sr = (long long)h * d;
      sh = d;
      sb = (long long)n * h * d;
    } else {
      sr = d + (layout == 2 ? pad : 0);
      sh = (long long)n * sr;
      sb = (long long)h * sh;
    }
    elems = (size_t)sb * b;
    val.assign((size_t)b * h * n * d, 0.f);
    CHECK_CUDA(cudaMalloc(&dev, elems * dtype_bytes(t) + 64));
  }
  ~Tensor() { cudaFree(dev); }
  long long off(int ib, int ih, int in, int id) const { return ib * sb + ih * sh + in * sr + id; }
  float& at(int ib, int ih, int in, int id) { return val[(((size_t)ib * h + ih) * n + in) * d + id]; }
  // Rows (ib, in) with keep[ib * n + in] == 0 are NaN (cache rows no key should read).
  void fill_random(std::mt19937& rng, float amp, const std::vector<char>* keep = nullptr) {
    std::uniform_real_distribution<float> u(-amp, amp);
    std::vector<unsigned char> host(elems * dtype_bytes(t), 0);
    for (int ib = 0; ib < b; ++ib)
      for (int ih = 0; ih < h; ++ih)
        for (int in = 0; in < n; ++in)
          for (int id = 0; id < d; ++id) {
            const float x = u(rng);  // drawn for hidden rows too: the other rows keep their values
            const bool hidden = keep != nullptr && !(*keep)[(size_t)ib * n + in];
            store_element(t, host.data(), off(ib, ih, in, id), hidden ? NAN : x);
            at(ib, ih, in, id) = (float)load_element(t, host.data(), off(ib, ih, in, id));
          }
    CHECK_CUDA(cudaMemcpy(dev, host.data(), host.size(), cudaMemcpyHostToDevice));
  }
};

struct Case {
  int B, Hq, Hkv, Nq, Nk, D;
  bool causal;
  int layout, pad;
};

static FwdParams make_params(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& o, float* lse, bool causal) {
  FwdParams p{};
  p.q = q.dev, p.k = k.dev, p.v = v.dev, p.o = o.dev, p.lse = lse;
  p.q_batch_stride = q.sb, p.q_head_stride = q.sh, p.q_row_stride = q.sr;
  p.k_batch_stride = k.sb, p.k_head_stride = k.sh, p.k_row_stride = k.sr;
  p.v_batch_stride = v.sb, p.v_head_stride = v.sh, p.v_row_stride = v.sr;
  p.o_batch_stride = o.sb, p.o_head_stride = o.sh, p.o_row_stride = o.sr;
  p.batch = q.b, p.heads_q = q.h, p.heads_kv = k.h, p.heads_ratio = q.h / k.h;
  p.seqlen_q = q.n, p.seqlen_k = k.n, p.head_dim = q.d;
  p.softmax_scale = 1.f / std::sqrt((float)q.d);
  p.softmax_scale_log2 = p.softmax_scale * 1.4426950408889634f;
  if (causal) p.window_right = 0;
  p.lse_head_stride = p.seqlen_q;
  p.lse_batch_stride = static_cast<long long>(p.heads_q) * p.seqlen_q;
  p.dtype = q.t;
  return p;
}

// fp64 reference of query row i of (ib, ih) under make_params's mask (every key, or causal): the
// normalized output row and its lse.
static void reference_output_row(const Tensor& q, const Tensor& k, const Tensor& v, const FwdParams& p, int ib,
                                 int ih, int i, std::vector<double>& o_ref, double& lse_ref) {
  const int hk = ih / p.heads_ratio;
  const int last = p.window_right == 0 ? i + p.seqlen_k - p.seqlen_q : p.seqlen_k - 1;
  const int n_vis = std::max(0, std::min(p.seqlen_k, last + 1));
  const float* qr = &const_cast<Tensor&>(q).at(ib, ih, i, 0);
  auto dot = [&](int j) {
    const float* kr = &const_cast<Tensor&>(k).at(ib, hk, j, 0);
    double acc = 0;
    for (int d = 0; d < p.head_dim; ++d) acc += (double)qr[d] * kr[d];
    return acc;
  };
  auto value = [&](int j, int d) { return (double)const_cast<Tensor&>(v).at(ib, hk, j, d); };
  std::vector<double> s(n_vis);
  o_ref.resize(p.head_dim);
  const ReferenceRow row = reference_row(n_vis, p.head_dim, p.softmax_scale, dot, value, s, o_ref);
  for (double& x : o_ref) x = row.sees_keys() ? x / row.l : 0.0;
  lse_ref = row.lse();
}

static int g_failures = 0;

// Tolerances against the fp64 reference: O absolute (plus a little relative), lse absolute.
static bool o_close(DType t, double got, double want) {
  const double atol = t == DType::kFloat32 ? 2e-5 : (t == DType::kFloat16 ? 2e-3 : 1.6e-2);
  return std::fabs(got - want) <= atol + 1e-2 * std::fabs(want) * (t == DType::kFloat32 ? 0.01 : 1);
}
static bool lse_close(float got, double want) {
  if (std::isinf(want)) return std::isinf(got) && got < 0;
  return std::fabs(got - want) <= 1e-4 + 1e-5 * std::fabs(want);
}

// Compares the rows listed (all rows when `rows` is empty) against the reference.
static void check(const char* what, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                  const float* d_lse, const FwdParams& p, int max_rows_checked) {
  std::vector<unsigned char> host(o.elems * dtype_bytes(o.t));
  CHECK_CUDA(cudaMemcpy(host.data(), o.dev, host.size(), cudaMemcpyDeviceToHost));
  const size_t n_lse = (size_t)p.batch * p.heads_q * p.seqlen_q;
  std::vector<float> lse(n_lse);
  CHECK_CUDA(cudaMemcpy(lse.data(), d_lse, n_lse * 4, cudaMemcpyDeviceToHost));
  double max_err = 0, max_lse_err = 0;
  bool bad = false;
  const long long total_rows = (long long)p.batch * p.heads_q * p.seqlen_q;
  const long long step = max_rows_checked > 0 && total_rows > max_rows_checked ? total_rows / max_rows_checked : 1;
  std::vector<double> o_ref;
  double lse_ref;
  for (long long r = 0; r < total_rows; r += step) {
    const long long rr = (step > 1) ? (r + (r * 7919) % step) % total_rows : r;
    const int i = (int)(rr % p.seqlen_q), ih = (int)((rr / p.seqlen_q) % p.heads_q),
              ib = (int)(rr / ((long long)p.seqlen_q * p.heads_q));
    reference_output_row(q, k, v, p, ib, ih, i, o_ref, lse_ref);
    for (int d = 0; d < p.head_dim; ++d) {
      const float got = (float)load_element(o.t, host.data(), o.off(ib, ih, i, d));
      const double err = std::fabs(got - o_ref[d]);
      if (!o_close(o.t, got, o_ref[d])) {
        if (!bad) std::printf("    first bad O at b=%d h=%d i=%d d=%d: got %g want %g\n", ib, ih, i, d, got, o_ref[d]);
        bad = true;
      }
      if (!(err <= max_err)) max_err = std::isnan(err) ? INFINITY : err;
    }
    const float got_lse = lse[((size_t)ib * p.heads_q + ih) * p.seqlen_q + i];
    if (!lse_close(got_lse, lse_ref)) {
      if (!bad) std::printf("    bad lse at b=%d h=%d i=%d: got %g want %g\n", ib, ih, i, got_lse, lse_ref);
      bad = true;
    }
    if (!std::isinf(lse_ref)) {
      const double e = std::fabs(got_lse - lse_ref);
      if (!(e <= max_lse_err)) max_lse_err = std::isnan(e) ? INFINITY : e;
    }
  }
  std::printf("  %-64s max|dO| %.2e  max|dlse| %.2e  %s\n", what, max_err, max_lse_err, bad ? "FAIL" : "ok");
  if (bad) ++g_failures;
}

static void run_case(int backend, DType t, const Case& c, std::mt19937& rng) {
  Tensor q(c.B, c.Hq, c.Nq, c.D, c.layout, c.pad, t), k(c.B, c.Hkv, c.Nk, c.D, c.layout, c.pad, t),
      v(c.B, c.Hkv, c.Nk, c.D, c.layout, c.pad, t), o(c.B, c.Hq, c.Nq, c.D, c.layout, c.pad, t);
  q.fill_random(rng, 1.5f);
  k.fill_random(rng, 1.5f);
  v.fill_random(rng, 1.f);
  CHECK_CUDA(cudaMemset(o.dev, 0xff, o.elems * dtype_bytes(t)));  // NaN poison
  float* lse;
  const size_t n_lse = (size_t)c.B * c.Hq * c.Nq;
  CHECK_CUDA(cudaMalloc(&lse, n_lse * 4));
  CHECK_CUDA(cudaMemset(lse, 0xff, n_lse * 4));
  FwdParams p = make_params(q, k, v, o, lse, c.causal);
  CHECK_CUDA(run_backend(backend, p, 0));
  CHECK_CUDA(cudaDeviceSynchronize());
  char what[256];
  std::snprintf(what, sizeof what, "%-10s %s B=%d Hq=%d Hkv=%d Nq=%d Nk=%d D=%d%s L%d/%d", kBackendNames[backend],
                dtype_name(t), c.B, c.Hq, c.Hkv, c.Nq, c.Nk, c.D, c.causal ? " causal" : "", c.layout, c.pad);
  check(what, q, k, v, o, lse, p, 3000);
  CHECK_CUDA(cudaFree(lse));
}

// ---------------------------------------------------------------------------------------------
// Every FwdParams mode: windows, softcap, per-entry lengths (varlen, KV cache, leftpad), pages
// ---------------------------------------------------------------------------------------------
enum class Keys { kDense, kVarlen, kCache, kPaged };

struct ModeCase {
  std::string name;
  Keys keys = Keys::kDense;
  int B = 1, Hq = 1, Hkv = 1;
  int Nq = 1, Nk = 1;           // dense sizes; Nk is the capacity of a cache (not varlen)
  int left = -1, right = -1;    // window, -1: unbounded
  float cap = 0.f;              // softcap, 0: off
  std::vector<int> nq, nk;      // varlen: lengths per entry
  std::vector<int> seqlens;     // cache / paged: seqlens_k (empty: every entry holds Nk keys)
  int added = 0;                // seqlens_k_added
  std::vector<int> leftpad;     // cache / paged: leftpad_k (empty: none)
  int page_size = 0;            // paged
  int bad_page_slot = -1;       // paged: this block-table slot holds an out-of-range page
};

static ModeCase dense_case(const char* name, int B, int Hq, int Hkv, int Nq, int Nk, int left, int right,
                           float cap = 0.f) {
  ModeCase c;
  c.name = name, c.B = B, c.Hq = Hq, c.Hkv = Hkv, c.Nq = Nq, c.Nk = Nk, c.left = left, c.right = right, c.cap = cap;
  return c;
}
static ModeCase varlen_case(const char* name, int Hq, int Hkv, std::vector<int> nq, std::vector<int> nk, int left,
                            int right, float cap = 0.f) {
  ModeCase c = dense_case(name, (int)nq.size(), Hq, Hkv, 0, 0, left, right, cap);
  c.keys = Keys::kVarlen, c.nq = std::move(nq), c.nk = std::move(nk);
  return c;
}
static ModeCase cache_case(const char* name, int Hq, int Hkv, int Nq, int capacity, std::vector<int> seqlens, int added,
                           std::vector<int> leftpad, int left, int right, float cap = 0.f, int page_size = 0,
                           int bad_page_slot = -1) {
  ModeCase c = dense_case(name, (int)seqlens.size(), Hq, Hkv, Nq, capacity, left, right, cap);
  c.keys = page_size > 0 ? Keys::kPaged : Keys::kCache;
  c.seqlens = std::move(seqlens), c.added = added, c.leftpad = std::move(leftpad);
  c.page_size = page_size, c.bad_page_slot = bad_page_slot;
  return c;
}

// One entry as the reference sees it: nq queries, keys [leftpad, nk) of nk, first rows q0 / k0 in
// the (varlen) tensors. Lengths are clamped as params.h says.
struct HostEntry {
  int nq, nk, leftpad, q0, k0;
};

// params.h's rule, pair by pair: query i sees key j iff i + offset - left <= j <= i + offset + right
// (-1: unbounded side) and leftpad <= j < L, with offset = L - Nq.
static bool visible(const HostEntry& e, int left, int right, int i, int j) {
  const long long a = (long long)i + e.nk - e.nq;
  if (j < e.leftpad || j >= e.nk) return false;
  if (left >= 0 && j < a - left) return false;
  if (right >= 0 && j > a + right) return false;
  return true;
}

// ---------------------------------------------------------------------------------------------
// Host check of the mask helpers the kernels use (simt_common.cuh): tile trips and row ranges
// against the pair-by-pair rule, over random shapes, windows and leftpads.
// ---------------------------------------------------------------------------------------------
static void check_masks_on_host(std::mt19937& rng) {
  int bad = 0, configs = 0;
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const int kSides[] = {-1, -1, 0, 1, 3, 17, 64, 2000000000};
  for (int it = 0; it < 3000 && bad < 5; ++it) {
    simt::EntryMask e{};
    e.nq = pick(1, 200), e.nk = pick(0, 200);
    e.leftpad = pick(0, 3) == 0 ? pick(0, e.nk) : 0;
    e.window_left = pick(0, 1) ? kSides[pick(0, 7)] : pick(-1, 80);
    e.window_right = pick(0, 1) ? kSides[pick(0, 7)] : pick(-1, 80);
    const HostEntry h{e.nq, e.nk, e.leftpad, 0, 0};
    const int block_m = 1 << pick(2, 8), block_n = 1 << pick(2, 7);
    ++configs;
    for (int row = 0; row < e.nq; ++row) {  // row_range: exactly the visible keys, contiguous
      int lo, hi;
      e.row_range(row, lo, hi);
      for (int j = 0; j < e.nk + 3; ++j)
        if (visible(h, e.window_left, e.window_right, row, j) != (j >= lo && j < hi)) {
          if (bad++ < 5) std::printf("    row_range nq=%d nk=%d pad=%d w=(%d,%d) row %d key %d: [%d, %d)\n", e.nq, e.nk,
                                     e.leftpad, e.window_left, e.window_right, row, j, lo, hi);
          break;
        }
    }
    for (int m0 = 0; m0 < e.nq; m0 += block_m) {  // trips: exact visited and unmasked tile ranges
      const int m1 = std::min(e.nq, m0 + block_m);
      const simt::TileTrips t = e.tile_trips(m0, m1, block_n);
      const int n_tiles = (e.nk + block_n - 1) / block_n;
      for (int n = 0; n < n_tiles + 2; ++n) {
        bool any = false, all = true;
        for (int i = m0; i < m1; ++i)
          for (int j = n * block_n; j < (n + 1) * block_n; ++j) {
            const bool vis = visible(h, e.window_left, e.window_right, i, j);
            any |= vis;
            all &= vis;
          }
        const bool visited = n >= t.first && n < t.last;
        if (visited != any || (visited && t.is_masked(n) == all)) {
          if (bad++ < 5) std::printf("    tile_trips nq=%d nk=%d pad=%d w=(%d,%d) rows [%d,%d) bn=%d tile %d: "
                                     "{%d %d %d %d} any %d all %d\n", e.nq, e.nk, e.leftpad, e.window_left,
                                     e.window_right, m0, m1, block_n, n, t.first, t.unmasked_begin, t.unmasked_end,
                                     t.last, any, all);
        }
      }
    }
  }
  std::printf("  host mask check: %d configurations  %s\n", configs, bad ? "FAIL" : "ok");
  if (bad) ++g_failures;
}

static void run_mode_case(int backend, DType t, int D, const ModeCase& c, std::mt19937& rng) {
  const int B = c.B;
  // Entries and the tensors' row counts.
  std::vector<HostEntry> entries(B);
  std::vector<int> cu_q(B + 1, 0), cu_k(B + 1, 0);
  int seqlen_q = c.Nq, seqlen_k = c.Nk;
  if (c.keys == Keys::kVarlen) {
    seqlen_q = seqlen_k = 1;
    for (int b = 0; b < B; ++b) {
      cu_q[b + 1] = cu_q[b] + c.nq[b], cu_k[b + 1] = cu_k[b] + c.nk[b];
      seqlen_q = std::max(seqlen_q, c.nq[b]), seqlen_k = std::max(seqlen_k, c.nk[b]);
    }
  }
  // Paged: the capacity is max_pages pages; a shuffled table over more pages than the entries use,
  // an out-of-range slot is no page (rules.h): its keys are masked.
  const int max_pages = c.page_size > 0 ? (c.Nk + c.page_size - 1) / c.page_size : 0;
  const int num_pages = B * max_pages + 3;
  const int capacity = c.page_size > 0 ? max_pages * c.page_size : c.Nk;
  for (int b = 0; b < B; ++b) {
    HostEntry& e = entries[b];
    e.nq = c.keys == Keys::kVarlen ? c.nq[b] : c.Nq;
    e.nk = c.keys == Keys::kVarlen ? c.nk[b] : capacity;
    if (!c.seqlens.empty()) e.nk = (int)std::min(std::max((long long)c.seqlens[b] + c.added, 0ll), (long long)capacity);
    e.leftpad = c.leftpad.empty() ? 0 : std::min(std::max(c.leftpad[b], 0), e.nk);
    e.q0 = cu_q[b], e.k0 = cu_k[b];
  }

  std::vector<int> table;
  if (c.keys == Keys::kPaged) {
    std::vector<int> perm(num_pages);
    for (int i = 0; i < num_pages; ++i) perm[i] = i;
    std::shuffle(perm.begin(), perm.end(), rng);
    table.assign(perm.begin(), perm.begin() + B * max_pages);
    if (c.bad_page_slot >= 0) table[c.bad_page_slot] = num_pages + 5;
  }
  // Where entry b's query row i and key j live in their tensors: (tensor batch index, row).
  auto q_at = [&](int b, int i) { return c.keys == Keys::kVarlen ? std::make_pair(0, cu_q[b] + i) : std::make_pair(b, i); };
  auto k_at = [&](int b, int j) {
    if (c.keys == Keys::kVarlen) return std::make_pair(0, cu_k[b] + j);
    if (c.keys == Keys::kPaged) {  // page -1: the key's page does not exist
      const int page = table[(size_t)b * max_pages + j / c.page_size];
      return std::make_pair(page >= 0 && page < num_pages ? page : -1, j % c.page_size);
    }
    return std::make_pair(b, j);
  };

  // Tensors: varlen rows are (total, heads, d); a cache is (B, Hkv, capacity, d) or pages
  // (num_pages, Hkv, page_size, d); q is BSHD for caches, to vary the strides.
  const bool varlen = c.keys == Keys::kVarlen, paged = c.keys == Keys::kPaged;
  const int q_layout = varlen || c.keys == Keys::kCache ? 1 : 0;
  const int qb = varlen ? 1 : B, qn = varlen ? std::max(cu_q[B], 1) : c.Nq;
  const int kb = varlen ? 1 : (paged ? num_pages : B);
  const int kn = varlen ? std::max(cu_k[B], 1) : (paged ? c.page_size : c.Nk);
  Tensor q(qb, c.Hq, qn, D, q_layout, 0, t), o(qb, c.Hq, qn, D, q_layout, 0, t);
  Tensor k(kb, c.Hkv, kn, D, varlen ? 1 : 0, 0, t), v(kb, c.Hkv, kn, D, varlen ? 1 : 0, 0, t);
  // Cache rows that no entry sees are NaN: a kernel that lets one reach O fails.
  std::vector<char> keep((size_t)kb * kn, 1);
  if (c.keys == Keys::kCache || paged) {
    std::fill(keep.begin(), keep.end(), 0);
    for (int b = 0; b < B; ++b)
      for (int j = entries[b].leftpad; j < entries[b].nk; ++j) {
        const auto at = k_at(b, j);
        if (at.first >= 0) keep[(size_t)at.first * kn + at.second] = 1;
      }
  }
  q.fill_random(rng, 1.5f);
  k.fill_random(rng, 1.5f, &keep);
  v.fill_random(rng, 1.f, &keep);
  CHECK_CUDA(cudaMemset(o.dev, 0xff, o.elems * dtype_bytes(t)));  // NaN poison

  // Device arrays of the per-entry lengths.
  std::vector<void*> device_arrays;
  auto upload = [&](const std::vector<int>& host) -> const int* {
    void* d = nullptr;
    CHECK_CUDA(cudaMalloc(&d, std::max<size_t>(host.size(), 1) * 4));
    if (!host.empty()) CHECK_CUDA(cudaMemcpy(d, host.data(), host.size() * 4, cudaMemcpyHostToDevice));
    device_arrays.push_back(d);
    return static_cast<const int*>(d);
  };
  const size_t n_lse = varlen ? (size_t)c.Hq * qn : (size_t)B * c.Hq * c.Nq;
  float* lse;
  CHECK_CUDA(cudaMalloc(&lse, n_lse * 4));
  CHECK_CUDA(cudaMemset(lse, 0xff, n_lse * 4));

  FwdParams p = make_params(q, k, v, o, lse, false);
  p.batch = B, p.seqlen_q = seqlen_q, p.seqlen_k = varlen ? seqlen_k : capacity;
  p.window_left = c.left, p.window_right = c.right;
  const double scale = 1.0 / std::sqrt((double)D);
  if (c.cap > 0.f) {  // the host's folding: softmax_scale becomes the cap
    p.softcap_pre = (float)(scale / c.cap);
    p.softmax_scale = c.cap;
    p.softmax_scale_log2 = (float)(c.cap * 1.4426950408889634);
  }
  if (varlen) {
    p.q_batch_stride = p.k_batch_stride = p.v_batch_stride = p.o_batch_stride = 0;
    p.cu_seqlens_q = upload(cu_q), p.cu_seqlens_k = upload(cu_k);
    p.total_q = cu_q[B], p.total_k = cu_k[B];  // the packed arrays' rows (rules.h clamps entries to them)
    p.lse_batch_stride = 0, p.lse_head_stride = qn;
  } else {
    p.lse_head_stride = c.Nq, p.lse_batch_stride = (long long)c.Hq * c.Nq;
  }
  if (!c.seqlens.empty()) p.seqlens_k = upload(c.seqlens), p.seqlens_k_added = c.added;
  if (!c.leftpad.empty()) p.leftpad_k = upload(c.leftpad);
  if (paged) {
    p.block_table = upload(table), p.block_table_stride = max_pages;
    p.page_size = c.page_size, p.num_pages = num_pages;
  }
  CHECK_CUDA(run_backend(backend, p, 0));
  CHECK_CUDA(cudaDeviceSynchronize());

  // Check every row of every entry.
  std::vector<unsigned char> o_host(o.elems * dtype_bytes(t));
  CHECK_CUDA(cudaMemcpy(o_host.data(), o.dev, o_host.size(), cudaMemcpyDeviceToHost));
  std::vector<float> lse_host(n_lse);
  CHECK_CUDA(cudaMemcpy(lse_host.data(), lse, n_lse * 4, cudaMemcpyDeviceToHost));
  double max_err = 0;
  bool bad = false;
  std::vector<double> s, o_ref(D);
  for (int b = 0; b < B; ++b) {
    const HostEntry& e = entries[b];
    for (int h = 0; h < c.Hq; ++h) {
      const int hk = h / (c.Hq / c.Hkv);
      for (int i = 0; i < e.nq; ++i) {
        const auto qa = q_at(b, i);
        // fp64 reference over the visible keys, by where they live in k and v. dot gives the whole score
        // (softcap included), so the reference's scale is 1.
        std::vector<std::pair<int, int>> keys;
        for (int j = 0; j < e.nk; ++j)
          if (visible(e, c.left, c.right, i, j) && k_at(b, j).first >= 0) keys.push_back(k_at(b, j));
        auto dot = [&](int n) {
          double acc = 0;
          for (int d = 0; d < D; ++d)
            acc += (double)q.at(qa.first, h, qa.second, d) * k.at(keys[n].first, hk, keys[n].second, d);
          return c.cap > 0.f ? c.cap * std::tanh(acc * scale / c.cap) : acc * scale;
        };
        auto value = [&](int n, int d) { return (double)v.at(keys[n].first, hk, keys[n].second, d); };
        s.resize(keys.size());
        const ReferenceRow row = reference_row((int)keys.size(), D, 1.0, dot, value, s, o_ref);
        const double lse_ref = row.lse();
        for (int d = 0; d < D; ++d) {
          const double want = row.sees_keys() ? o_ref[d] / row.l : 0.0;
          const float got = (float)load_element(t, o_host.data(), o.off(qa.first, h, qa.second, d));
          if (!o_close(t, got, want)) {
            if (!bad) std::printf("    first bad O at b=%d h=%d i=%d d=%d: got %g want %g\n", b, h, i, d, got, want);
            bad = true;
          }
          const double err = std::fabs(got - want);
          if (!(err <= max_err)) max_err = std::isnan(err) ? INFINITY : err;
        }
        const float got_lse = lse_host[b * p.lse_batch_stride + h * p.lse_head_stride + e.q0 + i];
        if (!lse_close(got_lse, lse_ref)) {
          if (!bad) std::printf("    bad lse at b=%d h=%d i=%d: got %g want %g\n", b, h, i, got_lse, lse_ref);
          bad = true;
        }
      }
    }
  }
  std::printf("  %-10s %s D=%-3d %-52s max|dO| %.2e  %s\n", kBackendNames[backend], dtype_name(t), D, c.name.c_str(),
              max_err, bad ? "FAIL" : "ok");
  if (bad) ++g_failures;
  for (void* d : device_arrays) CHECK_CUDA(cudaFree(d));
  CHECK_CUDA(cudaFree(lse));
}

static std::vector<ModeCase> mode_cases() {
  std::vector<ModeCase> cs;
  // Windows (dense, bottom-right aligned; GQA 2 throughout).
  cs.push_back(dense_case("window (0, 0)", 2, 4, 2, 77, 131, 0, 0));
  cs.push_back(dense_case("window (0, 0), Nq > Nk: empty rows", 1, 2, 1, 150, 70, 0, 0));
  cs.push_back(dense_case("window (1, 1)", 1, 4, 2, 130, 130, 1, 1));
  cs.push_back(dense_case("window (9, 4), Nq < Nk", 2, 2, 1, 90, 260, 9, 4));
  cs.push_back(dense_case("window (300, 300) > N", 1, 2, 2, 100, 150, 300, 300));
  cs.push_back(dense_case("window (2e9, 2e9): no overflow", 1, 2, 2, 70, 90, 2000000000, 2000000000));
  cs.push_back(dense_case("left only (17, -1)", 1, 4, 2, 140, 100, 17, -1));
  cs.push_back(dense_case("right only (-1, 5), Nq > Nk", 1, 4, 2, 200, 120, -1, 5));
  cs.push_back(dense_case("causal + left (20, 0)", 2, 2, 1, 160, 200, 20, 0));
  cs.push_back(dense_case("causal (-1, 0), Nq > Nk", 1, 2, 2, 180, 60, -1, 0));
  // Softcap.
  cs.push_back(dense_case("softcap 0.6", 2, 4, 2, 70, 110, -1, -1, 0.6f));
  cs.push_back(dense_case("softcap 1.5, causal", 1, 2, 1, 100, 100, -1, 0, 1.5f));
  cs.push_back(dense_case("softcap 0.8, window (12, 3)", 1, 4, 2, 120, 150, 12, 3, 0.8f));
  // Varlen: empty entries (no queries, no keys, both), Nq != Nk per entry.
  cs.push_back(varlen_case("varlen", 2, 1, {37, 0, 100, 1, 65}, {50, 20, 100, 0, 130}, -1, -1));
  cs.push_back(varlen_case("varlen causal", 4, 2, {37, 0, 100, 1, 65, 0}, {50, 20, 100, 0, 130, 0}, -1, 0));
  cs.push_back(varlen_case("varlen window (8, 2) + softcap 0.7", 2, 2, {90, 33, 5}, {60, 33, 200}, 8, 2, 0.7f));
  // KV cache: ragged lengths, 0, past the capacity (clamped), appended keys, leftpad (incl. bad).
  cs.push_back(cache_case("cache ragged (0, capacity, > capacity, < 0)", 4, 2, 3, 150, {40, 0, 150, 999, 7, -5}, 0, {}, -1,
                          -1));
  cs.push_back(cache_case("cache + added 3 (one past 2^31), causal", 2, 1, 3, 150, {40, 0, 147, 1, 2147483646}, 3, {},
                          -1, 0));
  cs.push_back(cache_case("cache leftpad (0, 5, > L, < 0), causal", 2, 2, 20, 140, {60, 100, 10, 90}, 0, {0, 5, 50, -3},
                          -1, 0));
  cs.push_back(cache_case("cache leftpad + window (16, 0)", 4, 2, 33, 200, {120, 200, 40}, 0, {30, 70, 0}, 16, 0));
  // Paged: page sizes 1, 7, 16, shuffled tables, an out-of-range page index.
  cs.push_back(cache_case("paged 1, causal", 2, 1, 4, 60, {60, 13, 0}, 0, {}, -1, 0, 0.f, 1));
  cs.push_back(cache_case("paged 7, leftpad, bad page", 4, 2, 9, 100, {100, 50, 23}, 0, {3, 0, 30}, -1, 0, 0.f, 7, 2));
  cs.push_back(cache_case("paged 16, window (20, 0), softcap 0.9", 2, 2, 40, 160, {150, 64, 160}, 5, {}, 20, 0, 0.9f, 16));
  cs.push_back(cache_case("paged 16, decode", 8, 1, 1, 256, {255, 1, 100, 17}, 1, {0, 0, 4, 0}, -1, 0, 0.f, 16));
  return cs;
}

// Long sequences with narrow windows: many key tiles skipped on both sides of every row tile.
static std::vector<ModeCase> long_mode_cases() {
  std::vector<ModeCase> cs;
  cs.push_back(dense_case("long window (100, 30)", 1, 2, 1, 1000, 1000, 100, 30));
  cs.push_back(dense_case("long causal + left 300, Nq < Nk", 1, 2, 2, 700, 1300, 300, 0));
  cs.push_back(cache_case("long paged 16, leftpad, window (64, 0)", 2, 1, 300, 1200, {1000, 1190}, 0, {200, 0}, 64, 0,
                          0.f, 16));
  return cs;
}

// ---------------------------------------------------------------------------------------------
// Timing: one warm-up launch, then the mean of three (time_launches_ms, common/selftest_harness.h)
// ---------------------------------------------------------------------------------------------
// Extra d=64 configurations, timed for tuning only.
using Tune0 = simt::SimtTraits<64, 256, 32, 8, false, 1>;  // 8x4 S microtile, 8 warps, 114 KB
using Tune1 = simt::SimtTraits<32, 256, 64, 8, false, 1>;  // D=32, 8x8, 8 warps, 113 KB

// window_left >= 0: the causal window (window_left, 0), credited with its visible pairs only; its time
// should grow with the window, not with N^2.
static void bench(DType t, int D, int N, bool causal, bool with_tuning, int window_left = -1) {
  std::mt19937 rng(7);
  const int B = 2, H = 1;
  Tensor q(B, H, N, D, 0, 0, t), k(B, H, N, D, 0, 0, t), v(B, H, N, D, 0, 0, t), o(B, H, N, D, 0, 0, t);
  q.fill_random(rng, 1.5f);
  k.fill_random(rng, 1.5f);
  v.fill_random(rng, 1.f);
  float* lse;
  CHECK_CUDA(cudaMalloc(&lse, (size_t)B * H * N * 4));
  FwdParams p = make_params(q, k, v, o, lse, causal || window_left >= 0);
  double pairs = (double)N * N * (causal ? 0.5 : 1.0);
  if (window_left >= 0) {
    p.window_left = window_left;
    pairs = 0;
    for (int i = 0; i < N; ++i) pairs += std::min(i, window_left) + 1;
  }
  const double flop = 4.0 * B * H * pairs * D;
  for (int backend = 1; backend <= 2; ++backend) {
    CHECK_CUDA(cudaMemset(o.dev, 0xff, o.elems * dtype_bytes(t)));
    const float ms = time_launches_ms([&] { return run_backend(backend, p, 0); }, 1, 3);
    char mode[48] = "";
    if (window_left >= 0) std::snprintf(mode, sizeof mode, " window (%d, 0)", window_left);
    else if (causal) std::snprintf(mode, sizeof mode, " causal");
    std::printf("  BENCH %-10s %s D=%d B=%d H=%d N=%d%s: %8.3f ms  %6.2f TFLOP/s\n", kBackendNames[backend],
                dtype_name(t), D, B, H, N, mode, ms, flop / ms * 1e-9);
    if (window_left >= 0) continue;  // reference_output_row knows causal only; the mode cases check windows
    char what[128];
    std::snprintf(what, sizeof what, "%s big-run spot check (%s)", kBackendNames[backend], dtype_name(t));
    check(what, q, k, v, o, lse, p, 24);
  }
  if (with_tuning && t == DType::kFloat32 && D == 64) {
    auto one = [&](const char* name, auto launch) {
      const float ms = time_launches_ms(launch, 1, 3);
      std::printf("  TUNE  %-40s %8.3f ms  %6.2f TFLOP/s\n", name, ms, flop / ms * 1e-9);
    };
    one("compact 128x64 4w (8x8 S)", [&] { return simt::launch_flash_simt_kernel<simt::LargeTileCompact<64>, float>(p, 0); });
    one("256x32 8w (8x4 S)", [&] { return simt::launch_flash_simt_kernel<Tune0, float>(p, 0); });
  }
  if (with_tuning && t == DType::kFloat32 && D == 32) {
    auto one = [&](const char* name, auto launch) {
      const float ms = time_launches_ms(launch, 1, 3);
      std::printf("  TUNE  %-40s %8.3f ms  %6.2f TFLOP/s\n", name, ms, flop / ms * 1e-9);
    };
    one("D=32 256x64 8w (8x8 S)", [&] { return simt::launch_flash_simt_kernel<Tune1, float>(p, 0); });
  }
  CHECK_CUDA(cudaFree(lse));
}

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "quick") == 0;
  std::mt19937 mask_rng(99);
  check_masks_on_host(mask_rng);
  if (argc > 1 && std::strcmp(argv[1], "mask") == 0) return g_failures ? 1 : 0;  // no GPU needed

  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, sm_%d%d, %d SMs\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount);

  // A head dim past every compiled one (a smaller one runs zero-padded on the next) -> cudaErrorInvalidValue
  // from every launcher, before any memory is touched.
  {
    FwdParams p{};
    p.batch = p.heads_q = p.heads_kv = p.heads_ratio = p.seqlen_q = p.seqlen_k = 1;
    p.head_dim = 4096;
    for (int backend = 0; backend < 4; ++backend) {
      const cudaError_t e = run_backend(backend, p, 0);
      std::printf("  %-10s head_dim=4096 -> %s %s\n", kBackendNames[backend], cudaGetErrorName(e),
                  e == cudaErrorInvalidValue ? "ok" : "FAIL");
      if (e != cudaErrorInvalidValue) ++g_failures;
    }
  }

  const Case cases[] = {
      {2, 4, 2, 77, 131, 0, false, 0, 0},   // ragged, Nq < Nk, GQA 2
      {2, 4, 2, 77, 131, 0, true, 0, 0},    // causal, bottom-right aligned
      {1, 3, 1, 130, 65, 0, true, 1, 0},    // Nq > Nk causal: rows 0..64 see no key; MQA; BSHD
      {1, 2, 2, 200, 200, 0, true, 2, 8},   // square causal, padded rows
      {1, 2, 2, 33, 47, 0, false, 2, 1},    // unaligned rows (scalar path)
      {1, 1, 1, 1, 1, 0, false, 0, 0},      // single element
      {1, 2, 1, 1, 300, 0, true, 0, 0},     // decode-like: one query sees every key
      {3, 1, 1, 300, 1, 0, true, 0, 0},     // one key, causal: only the last row sees it
  };
  std::mt19937 rng(1234);
  const DType dtypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
  const int dims[] = {32, 64, 128};
  for (int backend = 0; backend < 4; ++backend) {
    for (DType t : dtypes) {
      for (int D : dims) {
        for (const Case& c0 : cases) {
          Case c = c0;
          c.D = D;
          if (c.layout == 2 && c.pad == 1 && t != DType::kFloat32) c.pad = 3;
          run_case(backend, t, c, rng);
        }
      }
    }
    // Many heads: batch * heads > 65535 in one grid dimension.
    run_case(backend, DType::kFloat16, Case{2, 35000, 35000, 3, 5, 32, true, 0, 0}, rng);
  }
  // A longer causal sequence through every tile boundary.
  for (int backend = 0; backend < 4; ++backend)
    run_case(backend, DType::kFloat32, Case{1, 2, 1, 1000, 1100, 64, true, 1, 0}, rng);

  // Every FwdParams mode, every backend, dtype and head dim; the long ones at two configurations.
  const std::vector<ModeCase> modes = mode_cases(), long_modes = long_mode_cases();
  for (int backend = 0; backend < 4; ++backend) {
    for (DType t : dtypes)
      for (int D : dims)
        for (const ModeCase& c : modes) run_mode_case(backend, t, D, c, rng);
    for (const ModeCase& c : long_modes) {
      run_mode_case(backend, DType::kFloat32, 64, c, rng);
      run_mode_case(backend, DType::kBFloat16, 128, c, rng);
    }
  }
  std::printf("correctness: %d failure(s)\n", g_failures);

  if (!quick) {
    bench(DType::kFloat32, 64, 32768, false, true);
    bench(DType::kFloat32, 64, 32768, true, false);
    bench(DType::kFloat32, 64, 32768, true, false, 1024);  // ~1/16 of causal's pairs
    bench(DType::kFloat16, 64, 32768, false, false);
    bench(DType::kFloat32, 128, 16384, false, false);
    bench(DType::kFloat32, 32, 16384, false, true);
    {
      // naive at a size whose workspace fits: B=2, N=8192 -> 512 MiB
      std::mt19937 r2(3);
      const int B = 2, N = 8192, D = 64;
      Tensor q(B, 1, N, D, 0, 0, DType::kFloat32), k(B, 1, N, D, 0, 0, DType::kFloat32),
          v(B, 1, N, D, 0, 0, DType::kFloat32), o(B, 1, N, D, 0, 0, DType::kFloat32);
      q.fill_random(r2, 1.f);
      k.fill_random(r2, 1.f);
      v.fill_random(r2, 1.f);
      FwdParams p = make_params(q, k, v, o, nullptr, false);
      const float ms = time_launches_ms([&] { return launch_naive(p, 0); }, 1, 3);
      std::printf("  BENCH naive      fp32 D=64 B=2 H=1 N=8192: %8.3f ms  %6.2f TFLOP/s\n", ms,
                  4.0 * B * (double)N * N * D / ms * 1e-9);
    }
  }
  std::printf("%s: %d failure(s)\n", g_failures ? "FAILED" : "PASSED", g_failures);
  return g_failures ? 1 : 0;
}
