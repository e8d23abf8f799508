// CUDA graphs: the whole training step captured once and replayed (see train/step_graph.rs).
// at::cuda::CUDAGraph does the work; this file only adds what torch.cuda.graph adds around it:
// capture on a side stream that first waits for the current one, autocast's cast cache off
// during capture (a cached cast from before the capture must not be baked into it), and the
// current stream waiting for the side stream afterwards. Built only with CUDA (RT_WITH_CUDA);
// otherwise each call fails with a clear message.
#include "shim.h"
#include "error.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>

#include <memory>
#include <stdexcept>

#ifdef RT_WITH_CUDA
// Only functions exported by libtorch_cuda and libc10_cuda are called (no inline CUDA runtime
// calls such as CUDAEvent's or CUDAStreamGuard's), so the shim links without libcudart.
#include <ATen/cuda/CUDAGraph.h>
#include <c10/core/Event.h>
#include <c10/cuda/CUDAStream.h>

struct rt_cuda_graph {
  at::cuda::CUDAGraph graph;
  c10::cuda::CUDAStream caller;
  c10::cuda::CUDAStream side;
  bool on_side = false;
  bool cache_was_enabled = true;
  bool captured = false;
  rt_cuda_graph(c10::cuda::CUDAStream caller, c10::cuda::CUDAStream side) : caller(caller), side(side) {}

  void enter_side() {
    c10::cuda::setCurrentCUDAStream(side);
    on_side = true;
  }
  void leave_side() {
    if (on_side) c10::cuda::setCurrentCUDAStream(caller);
    on_side = false;
  }
};

namespace {
// `waiter` waits for the work queued so far on `done` (an event through c10's device-generic
// interface, implemented in libc10_cuda).
void wait_for(const c10::cuda::CUDAStream& waiter, const c10::cuda::CUDAStream& done) {
  c10::Event ev(at::kCUDA);
  ev.record(done.unwrap());
  ev.block(waiter.unwrap());
}
}  // namespace

extern "C" {

rt_cuda_graph* rt_cuda_graph_begin(int device) {
  return rt_guard<rt_cuda_graph*>([&]() -> rt_cuda_graph* {
    const auto d = static_cast<c10::DeviceIndex>(device);
    auto g = std::make_unique<rt_cuda_graph>(c10::cuda::getCurrentCUDAStream(d),
                                             c10::cuda::getStreamFromPool(/*isHighPriority=*/false, d));
    wait_for(g->side, g->caller);
    g->enter_side();
    g->cache_was_enabled = at::autocast::is_autocast_cache_enabled();
    at::autocast::set_autocast_cache_enabled(false);
    g->graph.capture_begin();
    return g.release();
  }, nullptr);
}

int rt_cuda_graph_end(rt_cuda_graph* g) {
  return rt_guard<int>([&] {
    // Whatever happens, leave the side stream and restore the cache setting.
    struct Restore {
      rt_cuda_graph* g;
      ~Restore() {
        at::autocast::set_autocast_cache_enabled(g->cache_was_enabled);
        g->leave_side();
      }
    } restore{g};
    g->graph.capture_end();
    g->captured = true;
    wait_for(g->caller, g->side);
    return 0;
  }, -1);
}

int rt_cuda_graph_replay(rt_cuda_graph* g) {
  return rt_guard<int>([&] {
    if (!g->captured) throw std::runtime_error("replay of a CUDA graph whose capture did not finish");
    g->graph.replay();
    return 0;
  }, -1);
}

void rt_cuda_graph_free(rt_cuda_graph* g) {
  if (!g) return;
  try {
    if (g->on_side) {  // a capture left open by an error: end it so the stream is usable again
      at::autocast::set_autocast_cache_enabled(g->cache_was_enabled);
      try {
        g->graph.capture_end();
      } catch (...) {
      }
      g->leave_side();
    }
  } catch (...) {
  }
  delete g;
}

}  // extern "C"

#else  // no CUDA in this build

struct rt_cuda_graph {};

extern "C" {
rt_cuda_graph* rt_cuda_graph_begin(int) {
  rt_error = "this build of ringtrain has no CUDA support (CUDA graphs need it)";
  return nullptr;
}
int rt_cuda_graph_end(rt_cuda_graph*) {
  rt_error = "this build of ringtrain has no CUDA support";
  return -1;
}
int rt_cuda_graph_replay(rt_cuda_graph*) {
  rt_error = "this build of ringtrain has no CUDA support";
  return -1;
}
void rt_cuda_graph_free(rt_cuda_graph* g) { delete g; }
}  // extern "C"

#endif
