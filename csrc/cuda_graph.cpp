// CUDA graphs: the whole training step captured once and replayed (see train/step_graph.rs).
// at::cuda::CUDAGraph does the work; this file adds what torch.cuda.graph and PyTorch's notes
// on whole-network capture add around it:
// - The warm-up steps and the capture run on one non-default stream (rt_cuda_use_side_stream,
//   before the first step). Warmed up on the default stream, backward's AccumulateGrad nodes keep
//   that stream and make it wait on the capturing one, which invalidates the capture; and
//   cuBLAS sets up its workspace per stream, which cannot happen inside a capture.
// - No uncaptured work in flight when the capture begins (a device synchronisation).
// - Autocast's cast cache off during capture (a cached cast from before it must not be baked
//   into it).
// Built only with CUDA (RT_WITH_CUDA); otherwise each call fails with a clear message.
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
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>

struct rt_cuda_graph {
  at::cuda::CUDAGraph graph;
  bool cache_was_enabled = true;
  bool capturing = false;
  bool captured = false;

  // Capture over: the cache setting as it was.
  void stop_capturing() {
    at::autocast::set_autocast_cache_enabled(cache_was_enabled);
    capturing = false;
  }
};

extern "C" {

int rt_cuda_use_side_stream(int device) {
  return rt_guard<int>([&] {
    const auto d = static_cast<c10::DeviceIndex>(device);
    const auto current = c10::cuda::getCurrentCUDAStream(d);
    if (current != c10::cuda::getDefaultCUDAStream(d)) return 0;  // on one already
    const auto side = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, d);
    // The side stream starts after the work queued so far (an event through c10's
    // device-generic interface, implemented in libc10_cuda).
    c10::Event ev(at::kCUDA);
    ev.record(current.unwrap());
    ev.block(side.unwrap());
    c10::cuda::setCurrentCUDAStream(side);
    return 0;
  }, -1);
}

rt_cuda_graph* rt_cuda_graph_begin(int device) {
  return rt_guard<rt_cuda_graph*>([&]() -> rt_cuda_graph* {
    const auto d = static_cast<c10::DeviceIndex>(device);
    if (c10::cuda::getCurrentCUDAStream(d) == c10::cuda::getDefaultCUDAStream(d))
      throw std::runtime_error(
          "a CUDA graph is captured on the stream its warm-up steps ran on, which must not be the default "
          "stream (rt_cuda_use_side_stream before the first step)");
    auto g = std::make_unique<rt_cuda_graph>();
    c10::cuda::device_synchronize();
    g->cache_was_enabled = at::autocast::is_autocast_cache_enabled();
    at::autocast::set_autocast_cache_enabled(false);
    g->capturing = true;
    try {
      // Thread-local: the loader's threads may pin host memory while this thread captures (in
      // the global mode any thread's cudaHostAlloc during a capture invalidates it).
      g->graph.capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
    } catch (...) {
      g->stop_capturing();
      throw;
    }
    return g.release();
  }, nullptr);
}

int rt_cuda_graph_end(rt_cuda_graph* g) {
  return rt_guard<int>([&] {
    // Whatever happens, the capture is over for this object and the cache setting restored.
    struct Restore {
      rt_cuda_graph* g;
      ~Restore() { g->stop_capturing(); }
    } restore{g};
    g->graph.capture_end();
    g->captured = true;
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
  if (g->capturing) {  // a capture left open by an error: end it so the stream is usable again
    try {
      g->graph.capture_end();
    } catch (...) {
    }
    g->stop_capturing();
  }
  delete g;
}

}  // extern "C"

#else  // no CUDA in this build

struct rt_cuda_graph {};

extern "C" {
int rt_cuda_use_side_stream(int) {
  rt_error = "this build of ringtrain has no CUDA support (CUDA graphs need it)";
  return -1;
}
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
