// The float64 reference of one query row, for the standalone self-tests (cpp/sm80/selftest.cu,
// cpp/sm90ws/selftest.cu, cpp/simt/selftest.cu; common/selftest_harness.h measures rows against it): the
// softmax of scale * q . k_j over the keys j < visible, kept as its max m and sum l, and
// o = sum_j exp(s_j - m) v_j (unnormalized: the output row is o / l). dot(j) returns q . k_j and
// value(j, x) element x of v_j; s has room for `visible` scores, o for d values. Host code.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

namespace cutlassfa {

struct ReferenceRow {
  double m, l;
  bool sees_keys() const { return l > 0; }  // l >= 1 once a key is visible
  double lse() const { return sees_keys() ? m + std::log(l) : -INFINITY; }  // -inf when no key is visible
};

template <class Dot, class Value>
ReferenceRow reference_row(int visible, int d, double scale, Dot const& dot, Value const& value, std::vector<double>& s,
                           std::vector<double>& o) {
  double m = -INFINITY;
  for (int j = 0; j < visible; ++j) {
    s[j] = dot(j) * scale;
    m = std::max(m, s[j]);
  }
  double l = 0;
  std::fill(o.begin(), o.end(), 0.0);
  for (int j = 0; j < visible; ++j) {
    double const pj = std::exp(s[j] - m);
    l += pj;
    for (int x = 0; x < d; ++x) { o[x] += pj * value(j, x); }
  }
  return {m, l};
}

}  // namespace cutlassfa
