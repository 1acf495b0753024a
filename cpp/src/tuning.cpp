#include "cutlassfa/tuning.h"

#include <atomic>
#include <memory>
#include <mutex>

namespace cutlassfa {

namespace {

int floor_log2(long long x) {
  int n = 0;
  while (x > 1) x >>= 1, ++n;
  return n;
}

struct Table {
  int capability = 0;
  int multiprocessors = 0;
  std::vector<TunedChoice> entries;
};

// The installed table, never freed while the process runs: a plan may be reading an older one when it is
// replaced, and `cutlassfa tune` installs one per measured candidate (a few hundred small tables).
std::atomic<const Table*> installed{nullptr};
std::mutex replaced_lock;
std::vector<std::unique_ptr<Table>> replaced;

}  // namespace

TuneClass tune_class(const FwdParams& p) {
  bool const causal = p.window_left < 0 && p.window_right == 0;
  bool const window = !causal && (p.window_left >= 0 || p.window_right >= 0);
  int const flags = (causal ? kTuneCausal : 0) | (window ? kTuneWindow : 0) |
                    (p.seqlens_k != nullptr ? kTuneCache : 0) | (p.block_table != nullptr ? kTunePaged : 0) |
                    (p.cu_seqlens_q != nullptr ? kTuneVarlen : 0) | (p.softcap_pre > 0.f ? kTuneSoftcap : 0) |
                    (p.alibi_slopes != nullptr ? kTuneScoreBias : 0) | (p.sinks != nullptr ? kTuneSinks : 0) |
                    (p.kv_fp8 ? kTuneFp8Cache : 0) | (p.leftpad_k != nullptr ? kTuneLeftpad : 0);
  return {static_cast<int>(p.dtype), p.head_dim, flags, floor_log2(static_cast<long long>(p.batch) * p.heads_kv),
          p.heads_ratio, floor_log2(p.seqlen_q), floor_log2(p.seqlen_k)};
}

void set_tuning_table(int capability, int multiprocessors, std::vector<TunedChoice> entries) {
  std::unique_ptr<Table> table;
  if (!entries.empty()) {
    table = std::make_unique<Table>();
    table->capability = capability, table->multiprocessors = multiprocessors, table->entries = std::move(entries);
  }
  std::lock_guard<std::mutex> lock(replaced_lock);
  installed.store(table.get(), std::memory_order_release);
  if (table) replaced.push_back(std::move(table));
}

const TunedChoice* tuned_choice(const PlanDevice& device, const FwdParams& params) {
  const Table* table = installed.load(std::memory_order_acquire);
  if (table == nullptr || table->capability != device.capability ||
      table->multiprocessors != device.multiprocessors) {
    return nullptr;
  }
  TuneClass const cls = tune_class(params);
  for (const TunedChoice& entry : table->entries) {
    if (entry.cls == cls) return &entry;
  }
  return nullptr;
}

bool tunable_kernel(const std::string& name, Kernel* kernel) {
  for (Kernel k : {Kernel::kSm90Decode, Kernel::kSm90ws, Kernel::kSm90, Kernel::kSm80}) {
    if (name == kernel_name(k)) {
      *kernel = k;
      return true;
    }
  }
  return false;
}

}  // namespace cutlassfa
