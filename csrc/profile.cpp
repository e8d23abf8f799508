// `ringtrain bench --profile`: libtorch's Kineto profiler, as torch.profiler drives it (the same
// C++ calls under it), and the step annotations torch.profiler writes ("ProfilerStep#N", a user
// scope), so ringtrain's trace and PyTorch's read the same way (src/bench/trace_table.rs).
#include "shim.h"
#include "error.h"

#include <ATen/record_function.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <cstdlib>
#include <memory>
#include <set>
#include <string>

namespace {
namespace prof = torch::profiler::impl;

std::set<prof::ActivityType> activities(int cuda) {
  std::set<prof::ActivityType> a{prof::ActivityType::CPU};
  if (cuda) a.insert(prof::ActivityType::CUDA);
  return a;
}

prof::ProfilerConfig config() { return prof::ProfilerConfig(prof::ProfilerState::KINETO); }
}  // namespace

struct rt_record {
  at::RecordFunction rf{at::RecordScope::USER_SCOPE};
};

extern "C" {

int rt_profiler_start(int cuda) {
  return rt_guard<int>([&] {
    // Profiling the CPU alone, Kineto still asks for GPUs and logs an error when there are none;
    // its errors stay quiet then (a KINETO_LOG_LEVEL already set wins).
    if (!cuda) setenv("KINETO_LOG_LEVEL", "5", /*overwrite=*/0);
    torch::autograd::profiler::prepareProfiler(config(), activities(cuda));
    torch::autograd::profiler::enableProfiler(config(), activities(cuda));
    return 0;
  }, -1);
}

int rt_profiler_stop(const char* trace_path) {
  return rt_guard<int>([&] {
    auto result = torch::autograd::profiler::disableProfiler();
    result->save(trace_path);
    return 0;
  }, -1);
}

rt_record* rt_record_begin(const char* name) {
  return rt_guard<rt_record*>([&] {
    auto r = std::make_unique<rt_record>();
    if (r->rf.isActive()) r->rf.before(name);
    return r.release();
  }, nullptr);
}

void rt_record_end(rt_record* r) { delete r; }  // RecordFunction ends its scope when destroyed

}  // extern "C"
