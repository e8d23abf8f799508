// Fused normalisation for training (`--fused-norm`): BatchNorm (+ residual add) + ReLU in
// channels_last (kernels/bn_act.py), LayerNorm over the last dimension in the activations' dtype
// (kernels/layer_norm.py), and the end of a ConvNeXt block, layer scale × stochastic depth +
// residual add (kernels/scale_add.py). Triton kernels compiled to cubins (and one PTX) when
// ringtrain was built, registered here from Rust (src/model/fused.rs) and launched through the
// CUDA driver.
//
// - The driver is opened with dlopen, so binaries start on machines without one, and the shim
//   still links without libcudart (see cuda_graph.cpp).
// - One autograd Function per kernel file holds forward and backward. Its orchestration (buffers,
//   reduction plan, launch order and arguments) is its kernel file's `forward` and `backward`,
//   line for line: the test suite runs that Python under Triton's interpreter against PyTorch, and
//   checks that this file launches the same sequence (the *_record functions, which record
//   launches instead of running them, on CPU tensors).
// - A call the kernels do not cover (CPU tensors, another layout or dtype, no image for the GPU)
//   returns "not applicable" with the reason, and the caller runs the unfused ops.
#include "shim.h"
#include "error.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/custom_function.h>

#include <dlfcn.h>

#include <cstdio>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#ifdef RT_WITH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

namespace {
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// ---- the kernel images (static data of the binary), registered once from Rust.
const rt_kernel_image* g_images = nullptr;
int g_n_images = 0;

// A kernel's tile (rows, channels), by its name without the variant's suffixes: every variant of
// a kernel has the same (kernels/bn_act.py's tile). g_max_rows: the tallest.
struct Tile {
  int64_t m = 0, c = 0;
};
std::unordered_map<std::string, Tile> g_tiles;
int64_t g_max_rows = 0;

Tile tile(const std::string& kernel) {
  auto it = g_tiles.find(kernel);
  if (it == g_tiles.end() || it->second.c == 0) throw std::runtime_error("no tile for fused kernel " + kernel);
  return it->second;
}

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// kernels/bn_act.py's reduction_plan: PROGRAMS_PER_SM (4) programs per multiprocessor, each a whole
// number of the first stage's row tiles.
std::pair<int64_t, int64_t> reduction_plan(int64_t M, int64_t C, int64_t sm_count, const std::string& kernel) {
  const Tile t = tile(kernel);
  const int64_t parts = std::max<int64_t>(1, std::min(cdiv(M, t.m), cdiv(4 * sm_count, cdiv(C, t.c))));
  const int64_t rows = cdiv(cdiv(M, parts), t.m) * t.m;
  return {cdiv(M, rows), rows};
}

// kernels/layer_norm.py's constants (its TILE, PROGRAMS_PER_SM, WIDTHS' range).
struct LayerNormPlan {
  int64_t tile = 0, programs_per_sm = 0, min_width = 0, max_width = 0;
} g_ln;

// kernels/layer_norm.py's width: the tile's power of two at or above C; 0 above the widest.
int64_t ln_width(int64_t C) {
  int64_t w = g_ln.min_width;
  while (w > 0 && w < C) w *= 2;
  return w <= g_ln.max_width ? w : 0;
}

// kernels/layer_norm.py's reduction_plan.
std::pair<int64_t, int64_t> ln_reduction_plan(int64_t M, int64_t C, int64_t sm_count) {
  const int64_t block_m = g_ln.tile / ln_width(C);
  const int64_t parts = std::max<int64_t>(1, std::min(cdiv(M, block_m), g_ln.programs_per_sm * sm_count));
  const int64_t rows = cdiv(cdiv(M, parts), block_m) * block_m;
  return {cdiv(M, rows), rows};
}

const char* dtype_key(at::ScalarType t) {
  switch (t) {
    case at::kHalf: return "f16";
    case at::kBFloat16: return "bf16";
    case at::kFloat: return "f32";
    default: return nullptr;
  }
}

// One kernel argument: a tensor (passed as its data pointer), an int32 or a float32; named as
// the kernel's parameter in kernels/bn_act.py (without "_ptr"), for the recorded launches.
struct Arg {
  std::string name;
  at::Tensor t;
  int64_t i = 0;
  double f = 0;
  char kind = 'p';  // 'p' pointer, 'i' int32, 'f' float32
};
Arg P(const char* name, const at::Tensor& t) { return Arg{name, t, 0, 0, 'p'}; }
Arg I(const char* name, int64_t v) { return Arg{name, at::Tensor(), v, 0, 'i'}; }
Arg F(const char* name, double v) { return Arg{name, at::Tensor(), 0, v, 'f'}; }

// The ".a16" variants: every pointer 16-byte aligned and C % 16 == 0.
bool aligned(int64_t C, const std::vector<Arg>& args) {
  bool ok = C % 16 == 0;
  for (const auto& a : args)
    if (a.kind == 'p') ok = ok && reinterpret_cast<uintptr_t>(a.t.data_ptr()) % 16 == 0;
  return ok;
}

// A BatchNorm kernel of the table by its base name: `typed` ones exist per activation dtype, with
// ".res" for the residual variant, and ".a16".
std::string variant(const std::string& kernel, bool typed, at::ScalarType dtype, bool res, int64_t C,
                    const std::vector<Arg>& args) {
  if (!typed) return kernel;
  return kernel + "." + dtype_key(dtype) + (res ? ".res" : "") + (aligned(C, args) ? ".a16" : "");
}

// A LayerNorm kernel of the table: per activation dtype and tile width, and ".a16".
std::string ln_variant(const std::string& kernel, at::ScalarType dtype, int64_t C, const std::vector<Arg>& args) {
  return kernel + "." + dtype_key(dtype) + ".w" + std::to_string(ln_width(C)) + (aligned(C, args) ? ".a16" : "");
}

struct Launcher {
  virtual ~Launcher() = default;
  virtual void launch(const std::string& variant, int64_t gx, int64_t gy, const std::vector<Arg>& args) = 0;
  virtual int64_t sm_count() const = 0;
};

// Writes one line per launch instead of running it: "variant grid=(gx,gy) x mean M:i32=70
// eps:f32=1e-05 ...": pointers by name, scalars with their type and value.
struct RecordingLauncher : Launcher {
  std::ostringstream out;
  int64_t sms;
  explicit RecordingLauncher(int64_t sms) : sms(sms) {}
  int64_t sm_count() const override { return sms; }
  void launch(const std::string& variant, int64_t gx, int64_t gy, const std::vector<Arg>& args) override {
    out << variant << " grid=(" << gx << "," << gy << ")";
    for (const auto& a : args) {
      out << " " << a.name;
      if (a.kind == 'i') out << ":i32=" << a.i;
      if (a.kind == 'f') {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.9g", a.f);
        out << ":f32=" << buf;
      }
    }
    out << "\n";
  }
};

#ifdef RT_WITH_CUDA
// ---- the CUDA driver, through dlopen.
using CUresult = int;
using CUdevice = int;
using CUcontext = void*;
using CUmodule = void*;
using CUfunction = void*;
using CUstream = void*;
constexpr int CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16;
constexpr int CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75;
constexpr int CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76;
constexpr int CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97;
constexpr int CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8;

struct Driver {
  CUresult (*GetErrorString)(CUresult, const char**);
  CUresult (*DeviceGet)(CUdevice*, int);
  CUresult (*DeviceGetAttribute)(int*, int, CUdevice);
  CUresult (*CtxGetCurrent)(CUcontext*);
  CUresult (*CtxSetCurrent)(CUcontext);
  CUresult (*DevicePrimaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*ModuleLoadData)(CUmodule*, const void*);
  CUresult (*ModuleGetFunction)(CUfunction*, CUmodule, const char*);
  CUresult (*FuncSetAttribute)(CUfunction, int, int);
  CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                           CUstream, void**, void**);

  void check(CUresult r, const std::string& what) const {
    if (r == 0) return;
    const char* s = nullptr;
    GetErrorString(r, &s);
    throw std::runtime_error(what + ": CUDA driver error " + std::to_string(r) + " (" + (s ? s : "?") + ")");
  }

  // PyTorch's primary context current on this thread (autograd's backward runs on its own).
  void make_context_current(CUdevice dev) const {
    CUcontext ctx = nullptr;
    check(CtxGetCurrent(&ctx), "cuCtxGetCurrent");
    if (ctx) return;
    check(DevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
    check(CtxSetCurrent(ctx), "cuCtxSetCurrent");
  }
};

const Driver& driver() {
  static Driver d = [] {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!lib) throw std::runtime_error("cannot open the CUDA driver (libcuda.so.1)");
    auto sym = [&](const char* name) {
      void* p = dlsym(lib, name);
      if (!p) throw std::runtime_error(std::string("the CUDA driver lacks ") + name);
      return p;
    };
    Driver d{};
    d.GetErrorString = reinterpret_cast<decltype(d.GetErrorString)>(sym("cuGetErrorString"));
    d.DeviceGet = reinterpret_cast<decltype(d.DeviceGet)>(sym("cuDeviceGet"));
    d.DeviceGetAttribute = reinterpret_cast<decltype(d.DeviceGetAttribute)>(sym("cuDeviceGetAttribute"));
    d.CtxGetCurrent = reinterpret_cast<decltype(d.CtxGetCurrent)>(sym("cuCtxGetCurrent"));
    d.CtxSetCurrent = reinterpret_cast<decltype(d.CtxSetCurrent)>(sym("cuCtxSetCurrent"));
    d.DevicePrimaryCtxRetain = reinterpret_cast<decltype(d.DevicePrimaryCtxRetain)>(sym("cuDevicePrimaryCtxRetain"));
    d.ModuleLoadData = reinterpret_cast<decltype(d.ModuleLoadData)>(sym("cuModuleLoadData"));
    d.ModuleGetFunction = reinterpret_cast<decltype(d.ModuleGetFunction)>(sym("cuModuleGetFunction"));
    d.FuncSetAttribute = reinterpret_cast<decltype(d.FuncSetAttribute)>(sym("cuFuncSetAttribute"));
    d.LaunchKernel = reinterpret_cast<decltype(d.LaunchKernel)>(sym("cuLaunchKernel"));
    return d;
  }();
  return d;
}

// Which image runs on compute capability `cc` (major·10 + minor): a cubin of the same major
// version and no higher minor (sm_90 and sm_100 are Triton's "a" targets: that exact GPU only),
// else the PTX (sm_80), which the driver compiles for any GPU of capability 8.0 or more.
const rt_kernel_image* image_for(const std::string& variant, int cc) {
  const rt_kernel_image* ptx = nullptr;
  for (int i = 0; i < g_n_images; ++i) {
    const auto& im = g_images[i];
    if (variant != im.variant) continue;
    if (im.ptx) {
      if (cc >= im.arch) ptx = &im;
    } else if (im.arch / 10 == cc / 10 && cc >= im.arch && (im.arch < 90 || cc == im.arch)) {
      return &im;
    }
  }
  return ptx;
}

struct LoadedKernel {
  CUfunction fn = nullptr;
  const rt_kernel_image* image = nullptr;
};

// One GPU with every kernel variant loaded into PyTorch's context there, launching them on the
// current stream of that GPU, as PyTorch's own kernels run (so CUDA graph capture and stream
// semantics carry over). Triton's kernels take two more pointers after their own arguments
// (global and profile scratch), unused here: the build checks their sizes are 0.
struct CudaDevice : Launcher {
  int device = -1, sms = 0, capability = 0;  // capability: major·10 + minor
  CUdevice dev = 0;
  std::map<std::string, LoadedKernel> fns;

  int64_t sm_count() const override { return sms; }

  void launch(const std::string& variant, int64_t gx, int64_t gy, const std::vector<Arg>& args) override {
    auto it = fns.find(variant);
    if (it == fns.end()) throw std::runtime_error("no fused kernel " + variant);
    const rt_kernel_image* im = it->second.image;
    if (static_cast<size_t>(im->params) != args.size() + 2)
      throw std::runtime_error(variant + ": the kernel takes " + std::to_string(im->params) + " parameters");
    std::vector<uint64_t> ptrs(args.size() + 2, 0);
    std::vector<int32_t> ints(args.size(), 0);
    std::vector<float> floats(args.size(), 0);
    std::vector<void*> params(args.size() + 2);
    for (size_t i = 0; i < args.size(); ++i) {
      const Arg& a = args[i];
      if (a.kind == 'p') {
        ptrs[i] = reinterpret_cast<uint64_t>(a.t.data_ptr());
        params[i] = &ptrs[i];
      } else if (a.kind == 'i') {
        ints[i] = static_cast<int32_t>(a.i);
        params[i] = &ints[i];
      } else {
        floats[i] = static_cast<float>(a.f);
        params[i] = &floats[i];
      }
    }
    params[args.size()] = &ptrs[args.size()];          // global scratch: none
    params[args.size() + 1] = &ptrs[args.size() + 1];  // profile scratch: none
    CUstream stream = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream();
    const Driver& d = driver();
    d.make_context_current(dev);
    d.check(d.LaunchKernel(it->second.fn, static_cast<unsigned>(gx), static_cast<unsigned>(gy), 1,
                           static_cast<unsigned>(32 * im->num_warps), 1, 1, static_cast<unsigned>(im->shared_bytes),
                           stream, params.data(), nullptr),
            "launching " + variant);
  }
};

std::mutex g_mutex;
std::map<int, CudaDevice> g_devices;  // node addresses are stable: graph nodes keep pointers

// Loads every variant for `device` (once): a GPU the images do not cover is an error here, at
// the start of a run, not at its first BatchNorm.
CudaDevice& cuda_device(int device) {
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = g_devices.find(device);
  if (it != g_devices.end()) return it->second;
  const Driver& d = driver();
  CudaDevice k;
  k.device = device;
  d.check(d.DeviceGet(&k.dev, device), "cuDeviceGet");
  d.make_context_current(k.dev);
  int major = 0, minor = 0, shared_optin = 0;
  d.check(d.DeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, k.dev), "compute capability");
  d.check(d.DeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, k.dev), "compute capability");
  d.check(d.DeviceGetAttribute(&k.sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, k.dev), "multiprocessor count");
  d.check(d.DeviceGetAttribute(&shared_optin, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, k.dev),
          "shared memory");
  const int cc = major * 10 + minor;
  k.capability = cc;
  for (int i = 0; i < g_n_images; ++i) {
    const std::string name = g_images[i].variant;
    if (k.fns.count(name)) continue;
    const rt_kernel_image* im = image_for(name, cc);
    if (!im) {
      throw std::runtime_error("no fused kernel image for compute capability " + std::to_string(major) + "." +
                               std::to_string(minor) + " (they need 8.0 or newer)");
    }
    CUmodule mod = nullptr;
    d.check(d.ModuleLoadData(&mod, im->image), "loading kernel " + name);
    LoadedKernel lk;
    lk.image = im;
    d.check(d.ModuleGetFunction(&lk.fn, mod, im->symbol), "finding kernel " + name);
    if (im->shared_bytes > 48 * 1024) {
      if (im->shared_bytes > shared_optin) throw std::runtime_error(name + " needs more shared memory than this GPU has");
      d.check(d.FuncSetAttribute(lk.fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, im->shared_bytes),
              "shared memory of " + name);
    }
    k.fns[name] = lk;
  }
  return g_devices.emplace(device, std::move(k)).first->second;
}
#endif

// ---- the orchestration: kernels/bn_act.py's forward and backward.
at::Tensor rows_of(const at::Tensor& t) {  // [N, C, H, W] channels_last → [M, C], a view
  return t.permute({0, 2, 3, 1}).reshape({-1, t.size(1)});
}

struct BnRelu : public torch::autograd::Function<BnRelu> {
  static at::Tensor forward(AutogradContext* ctx, at::Tensor x, at::Tensor weight, at::Tensor bias,
                            at::Tensor residual, at::Tensor running_mean, at::Tensor running_var, double momentum,
                            double eps, int64_t launcher_ptr) {
    RECORD_FUNCTION("ringtrain::bn_relu", std::vector<c10::IValue>());  // its name in profiles
    auto& L = *reinterpret_cast<Launcher*>(launcher_ptr);
    const bool has_res = residual.numel() > 0;  // an empty tensor stands for none
    auto x2 = rows_of(x);
    auto res2 = has_res ? rows_of(residual) : x2;
    const int64_t M = x2.size(0), C = x2.size(1);
    const auto [parts, rows] = reduction_plan(M, C, L.sm_count(), "bn_stats_partial");
    const auto f32 = x.options().dtype(at::kFloat);
    auto part_mean = at::empty({parts, C}, f32), part_m2 = at::empty({parts, C}, f32);
    auto mean = at::empty({C}, f32), invstd = at::empty({C}, f32);
    const auto dt = x.scalar_type();
    std::vector<Arg> a = {P("x", x2), P("part_mean", part_mean), P("part_m2", part_m2), I("M", M), I("C", C),
                          I("rows_per_prog", rows)};
    L.launch(variant("bn_stats_partial", true, dt, false, C, a), parts, cdiv(C, tile("bn_stats_partial").c), a);
    a = {P("part_mean", part_mean), P("part_m2", part_m2), I("num_parts", parts), I("rows_per_prog", rows),
         I("M", M), I("C", C), P("mean", mean), P("invstd", invstd), P("running_mean", running_mean),
         P("running_var", running_var), F("momentum", momentum), F("eps", eps)};
    L.launch(variant("bn_stats_finalize", false, dt, false, C, a), cdiv(C, tile("bn_stats_finalize").c), 1, a);
    auto y = at::empty_like(x);  // channels_last, as x
    auto y2 = rows_of(y);
    a = {P("x", x2), P("res", res2), P("mean", mean), P("invstd", invstd), P("weight", weight),
         P("bias", bias), P("y", y2), I("M", M), I("C", C)};
    const Tile t = tile("bn_act_forward");
    L.launch(variant("bn_act_forward", true, dt, has_res, C, a), cdiv(M, t.m), cdiv(C, t.c), a);
    ctx->save_for_backward({x, y, mean, invstd, weight});
    ctx->saved_data["has_res"] = has_res;
    ctx->saved_data["launcher"] = launcher_ptr;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    RECORD_FUNCTION("ringtrain::bn_relu_backward", std::vector<c10::IValue>());
    auto& L = *reinterpret_cast<Launcher*>(ctx->saved_data["launcher"].toInt());
    const bool has_res = ctx->saved_data["has_res"].toBool();
    auto saved = ctx->get_saved_variables();
    auto x = saved[0], y = saved[1], mean = saved[2], invstd = saved[3], weight = saved[4];
    auto dy = grad_outputs[0].contiguous(at::MemoryFormat::ChannelsLast).to(x.scalar_type());
    auto x2 = rows_of(x), y2 = rows_of(y), dy2 = rows_of(dy);
    const int64_t M = x2.size(0), C = x2.size(1);
    const auto [parts, rows] = reduction_plan(M, C, L.sm_count(), "bn_act_backward_partial");
    const auto f32 = x.options().dtype(at::kFloat);
    auto part_g = at::empty({parts, C}, f32), part_gx = at::empty({parts, C}, f32);
    auto dw = at::empty({C}, f32), db = at::empty({C}, f32);
    auto dx = at::empty_like(x);
    auto dres = has_res ? at::empty_like(x) : at::Tensor();
    auto dx2 = rows_of(dx);
    auto dres2 = has_res ? rows_of(dres) : dx2;  // the kernels take dx's pointer when there is none
    const auto dt = x.scalar_type();
    std::vector<Arg> a = {P("dy", dy2), P("y", y2), P("x", x2), P("mean", mean), P("dres", dres2),
                          P("part_g", part_g), P("part_gx", part_gx), I("M", M), I("C", C),
                          I("rows_per_prog", rows)};
    L.launch(variant("bn_act_backward_partial", true, dt, has_res, C, a), parts,
             cdiv(C, tile("bn_act_backward_partial").c), a);
    a = {P("part_g", part_g), P("part_gx", part_gx), I("num_parts", parts), I("C", C), P("invstd", invstd),
         P("dw", dw), P("db", db)};
    L.launch(variant("bn_act_backward_finalize", false, dt, false, C, a), cdiv(C, tile("bn_act_backward_finalize").c),
             1, a);
    a = {P("dy", dy2), P("y", y2), P("x", x2), P("mean", mean), P("invstd", invstd), P("weight", weight),
         P("dw", dw), P("db", db), P("dx", dx2), P("dres", dres2), I("M", M), I("C", C)};
    const Tile t = tile("bn_act_backward");
    L.launch(variant("bn_act_backward", true, dt, has_res, C, a), cdiv(M, t.m), cdiv(C, t.c), a);
    return {dx, dw.to(weight.scalar_type()), db.to(weight.scalar_type()), dres, at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// kernels/launch.py's sum_parts: out[c] = Σ_p part[p, c].
void sum_parts(Launcher& L, const at::Tensor& part, const at::Tensor& out) {
  const int64_t C = part.size(1);
  std::vector<Arg> a = {P("part", part), I("num_parts", part.size(0)), I("C", C), P("out", out)};
  L.launch("sum_parts", cdiv(C, tile("sum_parts").c), 1, a);
}

// kernels/layer_norm.py's forward and backward: x is [.., C], contiguous; [M, C] to the kernels.
struct LayerNormFn : public torch::autograd::Function<LayerNormFn> {
  static at::Tensor forward(AutogradContext* ctx, at::Tensor x, at::Tensor weight, at::Tensor bias, double eps,
                            int64_t launcher_ptr) {
    RECORD_FUNCTION("ringtrain::layer_norm", std::vector<c10::IValue>());
    auto& L = *reinterpret_cast<Launcher*>(launcher_ptr);
    const int64_t C = x.size(-1), M = x.numel() / C, W = ln_width(C);
    auto x2 = x.view({M, C});
    const auto f32 = x.options().dtype(at::kFloat);
    auto y = at::empty_like(x, at::MemoryFormat::Contiguous);
    auto mean = at::empty({M}, f32), rstd = at::empty({M}, f32);
    std::vector<Arg> a = {P("x", x2), P("weight", weight), P("bias", bias), P("y", y.view({M, C})),
                          P("mean", mean), P("rstd", rstd), I("M", M), I("C", C), F("eps", eps)};
    L.launch(ln_variant("ln_forward", x.scalar_type(), C, a), cdiv(M, g_ln.tile / W), 1, a);
    ctx->save_for_backward({x, weight, mean, rstd});
    ctx->saved_data["launcher"] = launcher_ptr;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    RECORD_FUNCTION("ringtrain::layer_norm_backward", std::vector<c10::IValue>());
    auto& L = *reinterpret_cast<Launcher*>(ctx->saved_data["launcher"].toInt());
    auto saved = ctx->get_saved_variables();
    auto x = saved[0], weight = saved[1], mean = saved[2], rstd = saved[3];
    const int64_t C = x.size(-1), M = x.numel() / C;
    auto dy = grad_outputs[0].to(x.scalar_type()).contiguous();
    const auto [parts, rows] = ln_reduction_plan(M, C, L.sm_count());
    const auto f32 = x.options().dtype(at::kFloat);
    auto part_dw = at::empty({parts, C}, f32), part_db = at::empty({parts, C}, f32);
    auto dw = at::empty({C}, f32), db = at::empty({C}, f32);
    auto dx = at::empty_like(x, at::MemoryFormat::Contiguous);
    std::vector<Arg> a = {P("dy", dy.view({M, C})), P("x", x.view({M, C})), P("weight", weight), P("mean", mean),
                          P("rstd", rstd), P("dx", dx.view({M, C})), P("part_dw", part_dw), P("part_db", part_db),
                          I("M", M), I("C", C), I("rows_per_prog", rows)};
    L.launch(ln_variant("ln_backward_partial", x.scalar_type(), C, a), parts, 1, a);
    sum_parts(L, part_dw, dw);
    sum_parts(L, part_db, db);
    return {dx, dw, db, at::Tensor(), at::Tensor()};
  }
};

// kernels/scale_add.py's forward and backward: z [N, H, W, C] contiguous, stream [N, C, H, W]
// channels_last, both [M, C] rows to the kernels; the tiles and reduction plan are BatchNorm's.
struct ScaleAddFn : public torch::autograd::Function<ScaleAddFn> {
  static at::Tensor forward(AutogradContext* ctx, at::Tensor z, at::Tensor stream, at::Tensor gamma, at::Tensor keep,
                            int64_t launcher_ptr) {
    RECORD_FUNCTION("ringtrain::scale_add", std::vector<c10::IValue>());
    auto& L = *reinterpret_cast<Launcher*>(launcher_ptr);
    const int64_t C = z.size(3), M = z.numel() / C, per_sample = z.size(1) * z.size(2);
    auto out = at::empty_like(stream, stream.options().dtype(at::kFloat), at::MemoryFormat::ChannelsLast);
    std::vector<Arg> a = {P("z", z.view({M, C})), P("stream", rows_of(stream)), P("gamma", gamma), P("keep", keep),
                          P("out", rows_of(out)), I("M", M), I("C", C), I("rows_per_sample", per_sample)};
    const Tile t = tile("scale_add_forward");
    L.launch(std::string("scale_add_forward.") + dtype_key(z.scalar_type()) + "." + dtype_key(stream.scalar_type()) +
                 (aligned(C, a) ? ".a16" : ""),
             cdiv(M, t.m), cdiv(C, t.c), a);
    ctx->save_for_backward({z, gamma, keep});
    ctx->saved_data["launcher"] = launcher_ptr;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    RECORD_FUNCTION("ringtrain::scale_add_backward", std::vector<c10::IValue>());
    auto& L = *reinterpret_cast<Launcher*>(ctx->saved_data["launcher"].toInt());
    auto saved = ctx->get_saved_variables();
    auto z = saved[0], gamma = saved[1], keep = saved[2];
    const int64_t C = z.size(3), M = z.numel() / C, per_sample = z.size(1) * z.size(2);
    auto dout = grad_outputs[0].to(at::kFloat).contiguous(at::MemoryFormat::ChannelsLast);
    const auto [parts, rows] = reduction_plan(M, C, L.sm_count(), "scale_add_backward_partial");
    const auto f32 = z.options().dtype(at::kFloat);
    auto part = at::empty({parts, C}, f32), dgamma = at::empty({C}, f32);
    auto dz = at::empty_like(z, at::MemoryFormat::Contiguous);
    std::vector<Arg> a = {P("dout", rows_of(dout)), P("z", z.view({M, C})), P("gamma", gamma), P("keep", keep),
                          P("dz", dz.view({M, C})), P("part_dgamma", part), I("M", M), I("C", C),
                          I("rows_per_sample", per_sample), I("rows_per_prog", rows)};
    L.launch(std::string("scale_add_backward_partial.") + dtype_key(z.scalar_type()) + (aligned(C, a) ? ".a16" : ""),
             parts, cdiv(C, tile("scale_add_backward_partial").c), a);
    sum_parts(L, part, dgamma);
    // The stream's gradient is the upstream one (autograd casts it to the stream's dtype).
    return {dz, grad_outputs[0], dgamma.view(gamma.sizes()), at::Tensor(), at::Tensor()};
  }
};

// Why the scale-add kernels do not cover this call (nullptr when they do).
const char* scale_add_not_covered(const at::Tensor& z, const at::Tensor& stream, const at::Tensor& gamma,
                                  const at::Tensor& keep, bool on_cpu_ok) {
  if (g_n_images == 0) return "this build has no fused kernels";
  if (!z.is_cuda() && !on_cpu_ok) return "the input is not on a CUDA device";
  if (z.dim() != 4 || !z.is_contiguous()) return "the block's output is not contiguous NHWC";
  if (!dtype_key(z.scalar_type())) return "the block's output is not fp16, bf16 or fp32";
  if (stream.dim() != 4 || !stream.is_contiguous(at::MemoryFormat::ChannelsLast) || stream.size(0) != z.size(0) ||
      stream.size(1) != z.size(3) || stream.size(2) != z.size(1) || stream.size(3) != z.size(2) ||
      stream.device() != z.device())
    return "the block's input is not channels_last in the output's shape";
  if (stream.scalar_type() != z.scalar_type() && stream.scalar_type() != at::kFloat)
    return "the block's input is neither fp32 nor in its output's dtype";
  if (z.numel() == 0) return "an empty input";
  if (z.numel() / z.size(3) >= (int64_t(1) << 31) - g_max_rows) return "more than 2^31 rows";
  if (!gamma.defined() || gamma.scalar_type() != at::kFloat || gamma.numel() != z.size(3) || !gamma.is_contiguous() ||
      gamma.device() != z.device())
    return "the layer scale is not an fp32 vector on the input's device";
  if (keep.scalar_type() != at::kFloat || keep.numel() != z.size(0) || !keep.is_contiguous() ||
      keep.device() != z.device())
    return "stochastic depth's factors are not one fp32 value per sample";
  return nullptr;
}

// Why the LayerNorm kernels do not cover this call (nullptr when they do).
const char* ln_not_covered(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, bool on_cpu_ok) {
  if (g_n_images == 0) return "this build has no fused kernels";
  if (!x.is_cuda() && !on_cpu_ok) return "the input is not on a CUDA device";
  if (x.dim() < 2 || !x.is_contiguous()) return "the input is not contiguous with its channels last";
  if (!dtype_key(x.scalar_type())) return "the input is not fp16, bf16 or fp32";
  const int64_t C = x.size(-1), M = x.numel() / std::max<int64_t>(C, 1);
  if (C < 1 || M < 1) return "an empty input";
  if (ln_width(C) == 0) return "more channels than the widest LayerNorm kernel";
  if (M >= (int64_t(1) << 31) - g_ln.tile) return "more than 2^31 rows";
  for (const at::Tensor* p : {&w, &b}) {
    if (!p->defined() || p->scalar_type() != at::kFloat || p->numel() != C || !p->is_contiguous() ||
        p->device() != x.device())
      return "LayerNorm's weight and bias are not fp32 vectors on the input's device";
  }
  return nullptr;
}

// The residual argument when there is none: an empty tensor (autograd's custom Functions take
// no undefined tensors).
at::Tensor no_residual(const at::Tensor& x) { return at::empty({0}, x.options()); }

// An rt_fused_* call: null with *why_not set when `why(false)` names what the kernels do not
// cover, else `apply` run with the launcher of `x`'s GPU (which lives as long as the process).
template <typename Why, typename Apply>
rt_tensor* fused_call(const char** why_not, const at::Tensor& x, Why why, Apply apply) {
  *why_not = nullptr;
  return rt_guard<at::Tensor*>([&]() -> at::Tensor* {
    *why_not = why(false);
    if (*why_not) return nullptr;
#ifdef RT_WITH_CUDA
    return new at::Tensor(apply(reinterpret_cast<int64_t>(static_cast<Launcher*>(&cuda_device(x.get_device())))));
#else
    *why_not = "built without CUDA";
    return nullptr;
#endif
  }, nullptr);
}

thread_local std::string g_record;  // the last recording's text, kept for the caller to copy

// An rt_fused_*_record call: `run` (forward and backward) with a launcher that records each
// launch as a line, on any device; the text, or null on failure (what is not covered included).
template <typename Why, typename Run>
const char* recorded(int64_t sm_count, Why why, Run run) {
  return rt_guard<const char*>([&]() -> const char* {
    if (const char* w = why(true)) throw std::runtime_error(w);
    RecordingLauncher rec(sm_count);
    run(reinterpret_cast<int64_t>(static_cast<Launcher*>(&rec)));
    g_record = rec.out.str();
    return g_record.c_str();
  }, nullptr);
}

// Why the kernels do not cover this call (nullptr when they do). `on_cpu_ok` for the recording.
const char* not_covered(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, const at::Tensor* res,
                        const at::Tensor& rm, const at::Tensor& rv, bool on_cpu_ok) {
  if (g_n_images == 0) return "this build has no fused kernels";
  if (!x.is_cuda() && !on_cpu_ok) return "the input is not on a CUDA device";
  if (x.dim() != 4 || !x.is_contiguous(at::MemoryFormat::ChannelsLast))
    return "the input is not a channels_last 4-d tensor";
  if (!dtype_key(x.scalar_type())) return "the input is not fp16, bf16 or fp32";
  const int64_t C = x.size(1), M = x.numel() / std::max<int64_t>(C, 1);
  if (M < 2) return "one value per channel";
  if (M >= (int64_t(1) << 31) - g_max_rows) return "more than 2^31 rows";
  for (const at::Tensor* p : {&w, &b, &rm, &rv}) {
    if (!p->defined() || p->scalar_type() != at::kFloat || p->numel() != C || !p->is_contiguous() ||
        p->device() != x.device())
      return "BatchNorm's parameters or statistics are not fp32 vectors on the input's device";
  }
  if (res && (res->sizes() != x.sizes() || res->scalar_type() != x.scalar_type() ||
              !res->is_contiguous(at::MemoryFormat::ChannelsLast) || res->device() != x.device()))
    return "the residual's shape, dtype or layout differs from the input's";
  return nullptr;
}

}  // namespace

extern "C" {

int rt_fused_set_images(const rt_kernel_image* images, int n) {
  g_images = images;
  g_n_images = n;
  for (int i = 0; i < n; ++i) {
    const std::string v = images[i].variant;
    g_tiles[v.substr(0, v.find('.'))] = Tile{images[i].block_m, images[i].block_c};
    g_max_rows = std::max<int64_t>(g_max_rows, images[i].block_m);
  }
  return 0;
}

int rt_fused_set_layer_norm_plan(int64_t tile, int64_t programs_per_sm, int64_t min_width, int64_t max_width) {
  g_ln = LayerNormPlan{tile, programs_per_sm, min_width, max_width};
  return 0;
}

// The GPU's compute capability (major·10 + minor) once the kernels are loaded on it; -1 on error.
int rt_fused_prepare(int device) {
  return rt_guard<int>([&] {
    if (g_n_images == 0) throw std::runtime_error("this build has no fused kernels");
#ifdef RT_WITH_CUDA
    return cuda_device(device).capability;
#else
    throw std::runtime_error("built without CUDA");
#endif
  }, -1);
}

rt_tensor* rt_fused_bn_relu(rt_tensor* x, rt_tensor* weight, rt_tensor* bias, rt_tensor* residual,
                            rt_tensor* running_mean, rt_tensor* running_var, double momentum, double eps,
                            const char** why_not) {
  return fused_call(
      why_not, *x,
      [&](bool cpu_ok) { return not_covered(*x, *weight, *bias, residual, *running_mean, *running_var, cpu_ok); },
      [&](int64_t launcher) {
        return BnRelu::apply(*x, *weight, *bias, residual ? *residual : no_residual(*x), *running_mean, *running_var,
                             momentum, eps, launcher);
      });
}

const char* rt_fused_bn_relu_record(rt_tensor* x, rt_tensor* weight, rt_tensor* bias, rt_tensor* residual,
                                    rt_tensor* running_mean, rt_tensor* running_var, double momentum, double eps,
                                    int64_t sm_count, rt_tensor* dy, rt_tensor** grads) {
  return recorded(
      sm_count,
      [&](bool cpu_ok) { return not_covered(*x, *weight, *bias, residual, *running_mean, *running_var, cpu_ok); },
      [&](int64_t launcher) {
        auto xv = x->detach().requires_grad_(true);
        auto wv = weight->detach().requires_grad_(true), bv = bias->detach().requires_grad_(true);
        auto rv = residual ? residual->detach().requires_grad_(true) : no_residual(*x);
        BnRelu::apply(xv, wv, bv, rv, *running_mean, *running_var, momentum, eps, launcher).backward(*dy);
        grads[0] = new at::Tensor(xv.grad());
        grads[1] = new at::Tensor(wv.grad());
        grads[2] = new at::Tensor(bv.grad());
        grads[3] = residual && rv.grad().defined() ? new at::Tensor(rv.grad()) : nullptr;
      });
}

rt_tensor* rt_fused_layer_norm(rt_tensor* x, rt_tensor* weight, rt_tensor* bias, double eps, const char** why_not) {
  return fused_call(
      why_not, *x, [&](bool cpu_ok) { return ln_not_covered(*x, *weight, *bias, cpu_ok); },
      [&](int64_t launcher) { return LayerNormFn::apply(*x, *weight, *bias, eps, launcher); });
}

const char* rt_fused_layer_norm_record(rt_tensor* x, rt_tensor* weight, rt_tensor* bias, double eps,
                                       int64_t sm_count, rt_tensor* dy, rt_tensor** grads) {
  return recorded(
      sm_count, [&](bool cpu_ok) { return ln_not_covered(*x, *weight, *bias, cpu_ok); },
      [&](int64_t launcher) {
        auto xv = x->detach().requires_grad_(true);
        auto wv = weight->detach().requires_grad_(true), bv = bias->detach().requires_grad_(true);
        LayerNormFn::apply(xv, wv, bv, eps, launcher).backward(*dy);
        grads[0] = new at::Tensor(xv.grad());
        grads[1] = new at::Tensor(wv.grad());
        grads[2] = new at::Tensor(bv.grad());
      });
}

rt_tensor* rt_fused_scale_add(rt_tensor* z, rt_tensor* stream, rt_tensor* gamma, rt_tensor* keep,
                              const char** why_not) {
  return fused_call(
      why_not, *z, [&](bool cpu_ok) { return scale_add_not_covered(*z, *stream, *gamma, *keep, cpu_ok); },
      [&](int64_t launcher) { return ScaleAddFn::apply(*z, *stream, *gamma, *keep, launcher); });
}

const char* rt_fused_scale_add_record(rt_tensor* z, rt_tensor* stream, rt_tensor* gamma, rt_tensor* keep,
                                      int64_t sm_count, rt_tensor* dout, rt_tensor** grads) {
  return recorded(
      sm_count, [&](bool cpu_ok) { return scale_add_not_covered(*z, *stream, *gamma, *keep, cpu_ok); },
      [&](int64_t launcher) {
        auto zv = z->detach().requires_grad_(true), sv = stream->detach().requires_grad_(true);
        auto gv = gamma->detach().requires_grad_(true);
        ScaleAddFn::apply(zv, sv, gv, *keep, launcher).backward(*dout);
        grads[0] = new at::Tensor(zv.grad());
        grads[1] = new at::Tensor(sv.grad());
        grads[2] = new at::Tensor(gv.grad());
      });
}

}  // extern "C"
