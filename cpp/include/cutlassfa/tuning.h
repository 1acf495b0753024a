// A measured dispatch table (`cutlassfa tune`, python/cutlassfa/tuning.py): for classes of calls on one kind
// of GPU, the tensor-core kernel and key splits that ran fastest there. The planner (dispatch.cpp) takes an
// entry that matches the call and whose kernel covers it; the hand-written heuristics otherwise, and always
// when no table is installed (one pointer load). cpp/src/tuning.cpp.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "cutlassfa/dispatch.h"
#include "cutlassfa/params.h"

namespace cutlassfa {

// The class of a call a table entry applies to: what the kernel choice depends on, the sizes as
// floor(log2): dtype, head dim, flags (kTune*), log2(batch x K/V heads), heads ratio, log2(seqlen_q),
// log2(seqlen_k) (a cache's capacity). Every call of a class gets the choice measured on one of them.
using TuneClass = std::array<int, 7>;
enum TuneFlag : int {
  kTuneCausal = 1 << 0,      // window (-1, 0)
  kTuneWindow = 1 << 1,      // any other window
  kTuneCache = 1 << 2,       // per-entry key lengths (seqlens_k)
  kTunePaged = 1 << 3,
  kTuneVarlen = 1 << 4,
  kTuneSoftcap = 1 << 5,
  kTuneScoreBias = 1 << 6,   // ALiBi
  kTuneSinks = 1 << 7,
  kTuneFp8Cache = 1 << 8,
  kTuneLeftpad = 1 << 9,
};
TuneClass tune_class(const FwdParams& params);

struct TunedChoice {
  TuneClass cls;
  Kernel kernel;
  int num_splits;
};

// Replaces the table (empty: none) for devices of `capability` (major * 10 + minor) and `multiprocessors`.
// Safe against concurrent planning: a plan reads either table whole.
void set_tuning_table(int capability, int multiprocessors, std::vector<TunedChoice> entries);

// The entry for `params` on `device`, or nullptr (no table, another GPU, no entry for its class).
const TunedChoice* tuned_choice(const PlanDevice& device, const FwdParams& params);

// A tile kernel by its kernel_name ("sm90decode", "sm90ws", "sm90", "sm80"); false for any other name.
bool tunable_kernel(const std::string& name, Kernel* kernel);

}  // namespace cutlassfa
