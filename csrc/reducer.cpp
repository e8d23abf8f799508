// DDP's gradient all-reduce overlapped with backward, as c10d::Reducer does it but over the
// buckets that dist/ddp.rs lays out (each parameter's .grad a view into its bucket's flat
// buffer):
//  - a post-accumulate-grad hook on every parameter (the C++ form of
//    register_post_accumulate_grad_hook: it runs once .grad holds this backward's gradient)
//    counts the bucket's parameters down; when a bucket is complete its all-reduce is launched,
//    while autograd goes on producing the earlier layers' gradients;
//  - launches go strictly in bucket order (a bucket that completes early waits for the ones
//    before it), so every rank issues the same sequence of collectives;
//  - finish() (after backward) launches what is left (parameters that got no gradient this
//    step, or every bucket when the hooks are off), then waits for each bucket in order and
//    averages it;
//  - a backward that does not end an optimizer step (gradient accumulation) launches nothing:
//    DDP's no_sync.
// On CUDA the hook runs on autograd's device thread with the gradient's producer stream
// current; c10d's NCCL (and Gloo's CUDA path) make their own stream wait for that stream before
// the collective, and work->wait() in finish() makes the compute stream wait for the
// collective: the host never blocks.
// An event log of the last backward (gradient ready, bucket launched, backward over, all done;
// steady-clock ns) shows the overlap itself.
#include "shim.h"
#include "pg.h"
#include "error.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

namespace {
int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

struct rt_reducer {
  rt_pg* pg;
  std::vector<at::Tensor> params;
  std::vector<int> bucket_of;            // per parameter
  std::vector<at::Tensor> flats;         // per bucket
  std::vector<int> size;                 // parameters per bucket
  std::optional<at::ScalarType> wire;    // --grad-compress
  double inv_world;
  bool hooks;

  std::mutex mu;
  bool armed = false;                    // this backward ends a step: launch from the hooks
  std::vector<int> pending;              // per bucket, parameters not ready yet
  std::vector<char> seen;                // per parameter, ready in this backward
  size_t next = 0;                       // the next bucket to launch
  std::vector<at::Tensor> sent;          // per bucket, what travels (the flat, or its half copy)
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  std::vector<rt_reducer_event> events;

  void log(int kind, int index) { events.push_back({kind, index, now_ns()}); }

  // Under mu.
  void launch(size_t b) {
    at::NoGradGuard no_grad;
    log(RT_EV_LAUNCH, static_cast<int>(b));
    // Compressed: pre-divide in fp32 (Horovod's fp16 compression), send the narrow copy.
    sent[b] = wire ? (flats[b] * inv_world).to(*wire) : flats[b];
    std::vector<at::Tensor> ts{sent[b]};
    works[b] = pg->backend->allreduce(ts);
  }

  void launch_ready() {
    while (next < flats.size() && pending[next] == 0) launch(next++);
  }

  void ready(int p) {
    std::lock_guard<std::mutex> lock(mu);
    if (seen[p]) return;
    seen[p] = 1;
    log(RT_EV_GRAD_READY, p);
    if (!armed) return;
    --pending[bucket_of[p]];
    launch_ready();
  }
};

namespace {
struct ReadyHook : torch::autograd::PostAccumulateGradHook {
  rt_reducer* r;
  int param;
  ReadyHook(rt_reducer* r, int param) : r(r), param(param) {}
  void operator()(const torch::autograd::Variable&) override { r->ready(param); }
};
}  // namespace

extern "C" {

rt_reducer* rt_reducer_new(rt_pg* pg, rt_tensor** params, const int* bucket_of, int n, rt_tensor** flats,
                           int nbuckets, int wire_dtype, int hooks) {
  return rt_guard<rt_reducer*>([&]() -> rt_reducer* {
    auto r = std::make_unique<rt_reducer>();
    r->pg = pg;
    r->size.assign(nbuckets, 0);
    for (int i = 0; i < n; ++i) {
      TORCH_CHECK(bucket_of[i] >= 0 && bucket_of[i] < nbuckets, "parameter ", i, " in no bucket");
      r->params.push_back(*params[i]);
      r->bucket_of.push_back(bucket_of[i]);
      ++r->size[bucket_of[i]];
    }
    for (int b = 0; b < nbuckets; ++b) r->flats.push_back(*flats[b]);
    if (wire_dtype >= 0) r->wire = static_cast<at::ScalarType>(wire_dtype);
    r->inv_world = 1.0 / pg->backend->getSize();
    r->hooks = hooks != 0;
    r->sent.resize(nbuckets);
    r->works.resize(nbuckets);
    r->pending = r->size;
    r->seen.assign(n, 0);
    if (r->hooks) {
      for (int i = 0; i < n; ++i) {
        torch::autograd::impl::set_post_acc_grad_hooks(r->params[i], std::make_unique<ReadyHook>(r.get(), i));
      }
    }
    return r.release();
  }, nullptr);
}

int rt_reducer_prepare(rt_reducer* r, int sync) {
  return rt_guard<int>([&] {
    std::lock_guard<std::mutex> lock(r->mu);
    // Left in flight by a step that failed between backward and finish: drain it.
    for (auto& w : r->works) {
      if (w) w->wait();
      w.reset();
    }
    r->armed = sync != 0 && r->hooks;
    r->pending = r->size;
    std::fill(r->seen.begin(), r->seen.end(), 0);
    r->next = 0;
    r->events.clear();
    return 0;
  }, -1);
}

int rt_reducer_finish(rt_reducer* r) {
  return rt_guard<int>([&] {
    std::lock_guard<std::mutex> lock(r->mu);
    r->armed = false;
    r->log(RT_EV_BACKWARD_DONE, -1);
    while (r->next < r->flats.size()) r->launch(r->next++);
    at::NoGradGuard no_grad;
    for (size_t b = 0; b < r->flats.size(); ++b) {
      auto work = std::move(r->works[b]);
      work->wait();
      if (r->wire) {
        r->flats[b].copy_(r->sent[b]);
      } else {
        r->flats[b].mul_(r->inv_world);
      }
      r->sent[b] = at::Tensor();
    }
    r->log(RT_EV_ALL_DONE, -1);
    return 0;
  }, -1);
}

int64_t rt_reducer_events(rt_reducer* r, rt_reducer_event* out, int64_t cap) {
  std::lock_guard<std::mutex> lock(r->mu);
  const int64_t n = static_cast<int64_t>(r->events.size());
  for (int64_t i = 0; i < n && i < cap; ++i) out[i] = r->events[i];
  return n;
}

void rt_reducer_free(rt_reducer* r) {
  if (!r) return;
  try {
    for (auto& w : r->works) {
      if (w) w->wait();
    }
    if (r->hooks) {
      for (auto& p : r->params) torch::autograd::impl::set_post_acc_grad_hooks(p, nullptr);
    }
  } catch (...) {
  }
  delete r;
}

}  // extern "C"
