// Host-side check of fp8 P V's key order (sm90ws/fp8_key_order.h) against CuTe's own layouts, for the fp8
// tiles of every head dim: for each consumer thread and each byte of its e4m3 P fragment, the S
// accumulator value that convert_p_fp8 packs there (the C fragment of the kernel's S = Q K^T TiledMma,
// through acc_as_fp8_a_operand) must be the score of the row and of the key that the P V TiledMma's A
// fragment puts at that byte, once its k index is mapped by fp8_pv_key (the V^T pre-pass's column order).
// Runs on the CPU, no GPU needed:
//   bash cpp/sm90ws/selftest.sh layout   (prints PASS, exit status 0; FAIL and the first mismatches otherwise)
#include <cstdio>

#include <cute/tensor.hpp>

#include "sm90ws/fp8_p_operand.h"
#include "sm90ws/kernel_traits.h"

using namespace cute;

namespace {

template <int kHeadDim, class Output>
int check_tile() {
  using T = cutlassfa::sm90ws::Traits<kHeadDim, cutlass::float_e4m3_t, false, Output>;
  constexpr int kBlockM = T::kBlockM, kBlockN = T::kBlockN;
  typename T::TiledMmaQK tiled_mma_qk;
  typename T::TiledMmaPV tiled_mma_pv;
  Tensor cS = make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{});  // (kBlockM, kBlockN) -> (row, key)
  auto const acc_layout = partition_fragment_C(tiled_mma_qk, Shape<Int<kBlockM>, Int<kBlockN>>{}).layout();
  auto const to_acc = cutlassfa::sm90ws::acc_as_fp8_a_operand(acc_layout);  // P byte -> S value index
  auto const p_layout = make_layout(shape(to_acc));                          // tOrP: compact
  int mismatches = 0, checked = 0;
  for (int t = 0; t < T::kNConsumerThreads; ++t) {
    Tensor tScS = tiled_mma_qk.get_thread_slice(t).partition_C(cS);  // (MMA, MMA_M, MMA_N) -> (row, key)
    Tensor tOcP = tiled_mma_pv.get_thread_slice(t).partition_A(cS);  // (MMA, MMA_M, MMA_K) -> (row, k)
    static_assert(decltype(size(tOcP))::value == decltype(size(p_layout))::value);
    static_assert(decltype(size<0>(tOcP))::value == decltype(size<0>(p_layout))::value &&
                  decltype(size<1>(tOcP))::value == decltype(size<1>(p_layout))::value &&
                  decltype(size<2>(tOcP))::value == decltype(size<2>(p_layout))::value,
                  "P's fragment has the A operand's modes: (values, MMA_M, k steps)");
    for (int v = 0; v < size<0>(tOcP); ++v) {
      for (int m = 0; m < size<1>(tOcP); ++m) {
        for (int kb = 0; kb < size<2>(tOcP); ++kb) {
          int const byte = p_layout(v, m, kb);  // where convert_p_fp8 writes, and what the wgmma reads
          auto const s = tScS(to_acc(byte));    // the score packed into that byte
          auto const a = tOcP(v, m, kb);        // the (row, k) the wgmma multiplies it at
          int const k = get<1>(a);
          int const key = (k / cutlassfa::sm90ws::kFp8KeyGroup) * cutlassfa::sm90ws::kFp8KeyGroup +
                          cutlassfa::sm90ws::fp8_pv_key(k % cutlassfa::sm90ws::kFp8KeyGroup);
          ++checked;
          if (get<0>(a) != get<0>(s) || key != get<1>(s)) {
            if (++mismatches <= 5) {
              std::printf("  d=%d thread %d byte %d: P holds (row %d, key %d), the A operand takes (row %d, k %d -> key %d)\n",
                          kHeadDim, t, byte, int(get<0>(s)), int(get<1>(s)), int(get<0>(a)), k, key);
            }
          }
        }
      }
    }
  }
  std::printf("%s d=%3d tile %d x %d: %d (thread, byte) pairs, %d mismatches\n", mismatches ? "FAIL" : "ok  ", kHeadDim,
              kBlockM, kBlockN, checked, mismatches);
  return mismatches;
}

}  // namespace

int main() {
  int const mismatches = check_tile<64, cutlass::bfloat16_t>() + check_tile<128, cutlass::bfloat16_t>() +
                         check_tile<256, cutlass::half_t>();
  std::printf("%s\n", mismatches == 0 ? "PASS" : "FAIL");
  return mismatches == 0 ? 0 : 1;
}
