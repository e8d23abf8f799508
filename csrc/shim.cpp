// See shim.h for the contract. Kept small on purpose: one function per missing libtorch feature.
#include "shim.h"
#include "error.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/autocast_mode.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/Event.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Logging.h>
#include <torch/headeronly/version.h>

#include <algorithm>
#include <string>

#ifdef RT_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

// The calling thread's last error message (error.h).
thread_local std::string rt_error;

namespace {
template <typename F>
int guarded(F&& f) {
  return rt_guard<int>(std::forward<F>(f), -1);
}

at::DeviceType device_type(int d) { return static_cast<at::DeviceType>(d); }
}  // namespace

extern "C" {

const char* rt_last_error(void) { return rt_error.c_str(); }

void rt_set_log_level(int level) {
  FLAGS_caffe2_log_level = level;
  c10::UpdateLoggingLevelsFromFlags();
}

int rt_autocast_set_enabled(int dev, int enabled) {
  return guarded([&] {
    at::autocast::set_autocast_enabled(device_type(dev), enabled != 0);
    return 0;
  });
}

int rt_autocast_is_enabled(int dev) {
  return guarded([&] { return at::autocast::is_autocast_enabled(device_type(dev)) ? 1 : 0; });
}

int rt_autocast_set_dtype(int dev, int dtype) {
  return guarded([&] {
    at::autocast::set_autocast_dtype(device_type(dev), static_cast<at::ScalarType>(dtype));
    return 0;
  });
}

int rt_autocast_get_dtype(int dev) {
  return guarded([&] { return static_cast<int>(at::autocast::get_autocast_dtype(device_type(dev))); });
}

void rt_autocast_clear_cache(void) { at::autocast::clear_cache(); }

rt_tensor* rt_to_channels_last(rt_tensor* t) {
  return rt_guard<rt_tensor*>([&] { return new at::Tensor(t->contiguous(at::MemoryFormat::ChannelsLast)); }, nullptr);
}

int rt_is_channels_last(rt_tensor* t) {
  return guarded([&] { return t->is_contiguous(at::MemoryFormat::ChannelsLast) ? 1 : 0; });
}

int rt_set_data_channels_last(rt_tensor* t) {
  return guarded([&] {
    if (t->dim() != 4) return 0;
    t->set_data(t->contiguous(at::MemoryFormat::ChannelsLast));
    return 0;
  });
}

#define RT_STR2(x) #x
#define RT_STR(x) RT_STR2(x)
int rt_amp_unscale(rt_tensor** grads, int n, rt_tensor* found_inf, rt_tensor* inv_scale) {
  return guarded([&] {
    std::vector<at::Tensor> gs;
    gs.reserve(n);
    for (int i = 0; i < n; ++i) gs.push_back(*grads[i]);
    at::_amp_foreach_non_finite_check_and_unscale_(gs, *found_inf, *inv_scale);
    return 0;
  });
}

int rt_set_grad(rt_tensor* param, rt_tensor* grad) {
  return guarded([&] {
    TORCH_CHECK(param->sizes() == grad->sizes(), "gradient shape differs from the parameter's");
    param->mutable_grad() = *grad;
    return 0;
  });
}

int rt_clear_grads(rt_tensor** params, int n) {
  return guarded([&] {
    for (int i = 0; i < n; ++i) params[i]->mutable_grad().reset();
    return 0;
  });
}

int64_t rt_storage_use_count(rt_tensor* t) {
  return t->has_storage() ? static_cast<int64_t>(t->storage().use_count()) : 0;
}

int rt_torch_randperm(int64_t n, uint64_t seed, int64_t* out) {
  return guarded([&] {
    // A fresh generator, as torch.Generator().manual_seed(seed): the global one is untouched.
    auto gen = at::detail::createCPUGenerator(seed);
    auto perm = at::randperm(n, gen, at::TensorOptions().dtype(at::kLong));
    std::copy_n(perm.data_ptr<int64_t>(), n, out);
    return 0;
  });
}

rt_tensor* rt_empty_pinned(const int64_t* sizes, int ndim, int dtype) {
  return rt_guard<rt_tensor*>([&] {
    auto opts = at::TensorOptions().dtype(static_cast<c10::ScalarType>(dtype)).pinned_memory(true);
    return new at::Tensor(at::empty(c10::IntArrayRef(sizes, ndim), opts));
  }, nullptr);
}

int64_t rt_cuda_peak_memory(int device, int reset) {
#ifdef RT_WITH_CUDA
  return rt_guard<int64_t>([&]() -> int64_t {
    namespace alloc = c10::cuda::CUDACachingAllocator;
    if (reset) {
      alloc::resetPeakStats(static_cast<c10::DeviceIndex>(device));
      return 0;
    }
    auto stats = alloc::getDeviceStats(static_cast<c10::DeviceIndex>(device));
    return stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].peak;
  }, -1);
#else
  rt_error = "built without CUDA headers";
  return -1;
#endif
}

// torch.cuda.set_sync_debug_mode: 0 off, 1 a warning (on stderr) for every call that makes the
// host wait for the GPU (an item(), a blocking copy to the host, a stream synchronisation).
int rt_cuda_sync_debug(int mode) {
#ifdef RT_WITH_CUDA
  return guarded([&] {
    c10::cuda::warning_state().set_sync_debug_mode(static_cast<c10::cuda::SyncDebugMode>(mode));
    return 0;
  });
#else
  rt_error = "built without CUDA headers";
  return -1;
#endif
}

// Device-generic c10 APIs (the CUDA implementation registers itself when libtorch_cuda loads),
// so these need no CUDA headers at build time.
int rt_cuda_set_device(int device) {
  return guarded([&] {
    c10::impl::getDeviceGuardImpl(at::kCUDA)->setDevice(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(device)));
    return 0;
  });
}

struct rt_cuda_timer {
  at::Device device;
  c10::Event start{at::kCUDA, c10::EventFlag::BACKEND_DEFAULT};  // BACKEND_DEFAULT: timing on
  c10::Event stop{at::kCUDA, c10::EventFlag::BACKEND_DEFAULT};
};

namespace {
c10::Stream current_stream(at::Device d) { return c10::impl::getDeviceGuardImpl(at::kCUDA)->getStream(d); }
}  // namespace

rt_cuda_timer* rt_cuda_timer_start(int device) {
  return rt_guard<rt_cuda_timer*>([&] {
    auto* t = new rt_cuda_timer{at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(device))};
    t->start.record(current_stream(t->device));
    return t;
  }, nullptr);
}

int rt_cuda_timer_stop(rt_cuda_timer* t) {
  return guarded([&] {
    t->stop.record(current_stream(t->device));
    return 0;
  });
}

double rt_cuda_timer_elapsed_ms(rt_cuda_timer* t, int wait) {
  return rt_guard<double>([&]() -> double {
    if (wait) t->stop.synchronize();
    else if (!t->stop.query()) return -1.0;
    return t->start.elapsedTime(t->stop);
  }, -2.0);
}

void rt_cuda_timer_free(rt_cuda_timer* t) { delete t; }

const char* rt_torch_version(void) {
  return RT_STR(TORCH_VERSION_MAJOR) "." RT_STR(TORCH_VERSION_MINOR) "." RT_STR(TORCH_VERSION_PATCH);
}

int64_t rt_cuda_runtime_version(void) {
  try {
    const auto& hooks = at::detail::getCUDAHooks();
    return hooks.hasCUDA() ? hooks.versionCUDART() : 0;
  } catch (...) {
    return 0;
  }
}

void rt_set_cudnn_deterministic(int on) {
  at::globalContext().setDeterministicCuDNN(on != 0);
  at::globalContext().setBenchmarkCuDNN(on == 0);
}

int64_t rt_cudnn_version(void) {
  try {
    const auto& hooks = at::detail::getCUDAHooks();
    return hooks.hasCuDNN() ? hooks.versionCuDNN() : 0;
  } catch (...) {
    return 0;
  }
}

}  // extern "C"
