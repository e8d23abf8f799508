// ringtrain's C++ shim: the few libtorch features tch 0.24 does not expose.
// Every function catches C++ exceptions; on failure it returns non-zero (or null) and
// rt_last_error() holds the message for the calling thread.
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
namespace at { class Tensor; }
typedef at::Tensor rt_tensor;
extern "C" {
#else
typedef void rt_tensor;
#endif

const char* rt_last_error(void);
// libtorch's own log threshold (0 INFO, 1 WARNING, 2 ERROR, 3 FATAL), as TORCH_CPP_LOG_LEVEL.
void rt_set_log_level(int level);

// Autocast through the non-deprecated per-device API. device_type uses c10::DeviceType values
// (0 = CPU, 1 = CUDA); dtype uses c10::ScalarType values (5 = Half, 15 = BFloat16).
int rt_autocast_set_enabled(int device_type, int enabled);
int rt_autocast_is_enabled(int device_type);
int rt_autocast_set_dtype(int device_type, int dtype);
int rt_autocast_get_dtype(int device_type);
void rt_autocast_clear_cache(void);

// channels_last (NHWC strides) for 4-d tensors.
rt_tensor* rt_to_channels_last(rt_tensor* t);
int rt_is_channels_last(rt_tensor* t);
// Re-lays a parameter's storage in place (t.set_data), keeping the same tensor object so
// optimizers and var stores that hold it see the new layout.
int rt_set_data_channels_last(rt_tensor* t);

// GradScaler's unscale: grads *= inv_scale in place (one foreach kernel), found_inf = 1 if any
// gradient holds inf or NaN (at::_amp_foreach_non_finite_check_and_unscale_).
int rt_amp_unscale(rt_tensor** grads, int n, rt_tensor* found_inf, rt_tensor* inv_scale);

// Makes `grad` (e.g. a view into a flat bucket) the parameter's .grad: autograd then
// accumulates into it in place, so gradients land in the bucket with no copy.
int rt_set_grad(rt_tensor* param, rt_tensor* grad);
// zero_grad(set_to_none=True): the gradients become undefined.
int rt_clear_grads(rt_tensor** params, int n);

// How many tensors (views included) share t's storage; 0 for a tensor without one. A buffer
// whose count is 1 is held by that one handle alone and may be written again.
int64_t rt_storage_use_count(rt_tensor* t);

// torch.randperm(n, generator=torch.Generator().manual_seed(seed)) into out[0..n): the order
// PyTorch's DistributedSampler and torchvision's RASampler draw for seed + epoch.
int rt_torch_randperm(int64_t n, uint64_t seed, int64_t* out);

// An uninitialised CPU tensor in page-locked memory from PyTorch's pinned-memory caching
// allocator (blocks are reused, and not while an asynchronous copy from them is pending), so a
// host-to-GPU copy from it can be asynchronous. dtype uses c10::ScalarType values. Needs a
// CUDA device: null (and the error) without one.
rt_tensor* rt_empty_pinned(const int64_t* sizes, int ndim, int dtype);

// Peak bytes allocated by the CUDA caching allocator on `device` since the last reset
// (reset != 0 resets and returns 0); -1 without CUDA.
int64_t rt_cuda_peak_memory(int device, int reset);
// libtorch's sync debug mode (torch.cuda.set_sync_debug_mode): 0 off, 1 warn; -1 without CUDA.
int rt_cuda_sync_debug(int mode);

// Makes `device` the current CUDA device (torch.cuda.set_device).
int rt_cuda_set_device(int device);

// Time spent by the current CUDA stream of `device` between start and stop (two timing events,
// as torch.cuda.Event(enable_timing=True)): measures work the host does not wait for.
// elapsed: milliseconds; -1 while the stop event is not reached (wait = 0); -2 on failure.
typedef struct rt_cuda_timer rt_cuda_timer;
rt_cuda_timer* rt_cuda_timer_start(int device);
int rt_cuda_timer_stop(rt_cuda_timer* t);
double rt_cuda_timer_elapsed_ms(rt_cuda_timer* t, int wait);
void rt_cuda_timer_free(rt_cuda_timer* t);

// Versions for bug reports: libtorch "2.11.0"; CUDA runtime and cuDNN as integers (0 = absent).
const char* rt_torch_version(void);
int64_t rt_cuda_runtime_version(void);
// torch.backends.cudnn.deterministic = on; torch.backends.cudnn.benchmark = !on.
void rt_set_cudnn_deterministic(int on);
int64_t rt_cudnn_version(void);

// ---- Fused optimizer steps (optim.cpp), as torch.optim's fused=True. Tensors of one call share
// a device and dtype. grad_scale (optional): gradients are divided by it inside the kernel.
// found_inf (optional, 0-dim as torch.amp.GradScaler's; a 1-element one is read as that
// scalar): when it holds 1 the whole step is skipped on the device, with no host
// synchronisation. lr_tensor (optional, 0-dim on the parameters' device) replaces lr: the step
// then reads its learning rate on the device, as a CUDA graph's replay needs. Parameters,
// gradients and state must share one layout (strides): checked.
// bufs is null when momentum is 0; first_step copies the
// gradient into the buffers (torch's first-step rule). Adam's step counters are float32
// scalars; decoupled != 0 selects AdamW.
int rt_fused_sgd(rt_tensor** params, rt_tensor** grads, rt_tensor** bufs, int n, double weight_decay,
                 double momentum, double lr, rt_tensor* lr_tensor, double dampening, int nesterov, int first_step,
                 rt_tensor* grad_scale, rt_tensor* found_inf);
int rt_fused_adam(rt_tensor** params, rt_tensor** grads, rt_tensor** exp_avgs, rt_tensor** exp_avg_sqs,
                  rt_tensor** steps, int n, double lr, rt_tensor* lr_tensor, double beta1, double beta2,
                  double weight_decay, double eps, int decoupled, rt_tensor* grad_scale, rt_tensor* found_inf);
// LARS and LAMB as timm's (optim.cpp), on ATen's _foreach_ kernels. lr, lr_tensor and found_inf as
// above (a skipped step leaves parameters and state as they were). adapt != 0: the layer-wise
// trust ratio applies (0 for the norms and biases left out of it). LARS: bufs null when
// momentum is 0. LAMB: step is the group's float32 0-dim counter, incremented here; clip
// (optional) divides the gradients, rt_lamb_clip's max(1, global norm / max_grad_norm) over all
// groups' gradients, a new tensor (null on failure).
int rt_lars(rt_tensor** params, rt_tensor** grads, rt_tensor** bufs, int n, double lr, rt_tensor* lr_tensor,
            double momentum, double weight_decay, int nesterov, double trust_coeff, double eps, int adapt,
            rt_tensor* found_inf);
// torch.optim.RMSprop (not centered) on the same kernels as its foreach step: square_avgs and
// the float32 0-dim step counters always, bufs null when momentum is 0.
int rt_rmsprop(rt_tensor** params, rt_tensor** grads, rt_tensor** square_avgs, rt_tensor** bufs, rt_tensor** steps,
               int n, double lr, rt_tensor* lr_tensor, double alpha, double eps, double weight_decay, double momentum,
               rt_tensor* found_inf);
rt_tensor* rt_lamb_clip(rt_tensor** grads, int n, double max_grad_norm);
int rt_lamb(rt_tensor** params, rt_tensor** grads, rt_tensor** exp_avgs, rt_tensor** exp_avg_sqs, int n,
            rt_tensor* step, rt_tensor* clip, double lr, rt_tensor* lr_tensor, double beta1, double beta2, double eps,
            double weight_decay, int adapt, rt_tensor* found_inf);

// ---- CUDA graphs (cuda_graph.cpp): at::cuda::CUDAGraph. use_side_stream makes this thread's
// current stream on `device` a non-default one that waits for the work queued so far (0 when it
// is one already): the warm-up steps and the capture must run on it. begin starts capturing the
// work queued on the current stream (which must not be the default one) after a device
// synchronisation, autocast's cast cache off meanwhile; end finishes the capture; replay
// launches the captured work on the current stream. Null / -1 and an error in a build without
// CUDA.
int rt_cuda_use_side_stream(int device);
typedef struct rt_cuda_graph rt_cuda_graph;
rt_cuda_graph* rt_cuda_graph_begin(int device);
int rt_cuda_graph_end(rt_cuda_graph* g);
int rt_cuda_graph_replay(rt_cuda_graph* g);
void rt_cuda_graph_free(rt_cuda_graph* g);

// ---- c10d (dist.cpp): TCPStore rendezvous + a Gloo or NCCL process group.
typedef struct rt_pg rt_pg;
typedef struct rt_work rt_work;
int rt_nccl_available(void);
// backend: "gloo" or "nccl". Rank 0 hosts the store on master_addr:port. Null on failure.
// local_addr: the address Gloo binds unless GLOO_SOCKET_IFNAME is set (the one on the route to
// the master). cuda_device: the rank's CUDA device for NCCL (already current; bound to the
// group), -1 for Gloo.
rt_pg* rt_pg_new(const char* backend, const char* master_addr, const char* local_addr, int port, int rank,
                 int world, int64_t timeout_ms, int cuda_device);
void rt_pg_free(rt_pg* pg);
// A second client of the group's store (for the watchdog thread), its calls bounded by timeout_ms.
typedef struct rt_store rt_store;
rt_store* rt_store_clone(rt_pg* pg, int64_t timeout_ms);
// Adds delta to the counter key and returns the new value (delta 0 reads it); -1 on failure.
int64_t rt_store_add(rt_store* s, const char* key, int64_t delta);
void rt_store_free(rt_store* s);
// Collectives start asynchronously and return a work handle (null on failure);
// rt_work_wait waits for it, frees it, and returns 0 or -1. op: 0 = sum, 1 = max, 2 = min.
rt_work* rt_pg_allreduce(rt_pg* pg, rt_tensor* t, int op);
rt_work* rt_pg_broadcast(rt_pg* pg, rt_tensor* t, int root);
rt_work* rt_pg_allgather(rt_pg* pg, rt_tensor* out, rt_tensor* in);  // out: [world, *in.shape]
rt_work* rt_pg_barrier(rt_pg* pg);
int rt_work_wait(rt_work* w);

// ---- DDP's gradient all-reduce launched from autograd hooks during backward (reducer.cpp).
// Parameter i's .grad is a view into flats[bucket_of[i]]; buckets are launched in index order.
// wire_dtype: c10::ScalarType to all-reduce in (-1: the flats' own, fp32). hooks = 0: nothing
// is launched before finish (all-reduce after backward). prepare before each backward (sync = 0:
// it does not end an optimizer step, launch nothing); finish after the last one: launches what
// is left, waits, and averages the buckets in place.
typedef struct rt_reducer rt_reducer;
enum { RT_EV_GRAD_READY = 0, RT_EV_LAUNCH = 1, RT_EV_BACKWARD_DONE = 2, RT_EV_ALL_DONE = 3 };
typedef struct {
  int kind;   // RT_EV_*
  int index;  // the parameter (GRAD_READY) or bucket (LAUNCH); -1 otherwise
  int64_t t_ns;
} rt_reducer_event;
rt_reducer* rt_reducer_new(rt_pg* pg, rt_tensor** params, const int* bucket_of, int n, rt_tensor** flats,
                           int nbuckets, int wire_dtype, int hooks);
int rt_reducer_prepare(rt_reducer* r, int sync);
int rt_reducer_finish(rt_reducer* r);
// Copies up to cap events of the last backward into out; returns how many there are.
int64_t rt_reducer_events(rt_reducer* r, rt_reducer_event* out, int64_t cap);
void rt_reducer_free(rt_reducer* r);

// ---- SyncBatchNorm (sync_bn.cpp): training-mode BatchNorm over the global batch of `pg`.
// Returns the output (with its autograd graph), or null on failure.
rt_tensor* rt_sync_batch_norm(rt_pg* pg, rt_tensor* x, rt_tensor* weight, rt_tensor* bias,
                              rt_tensor* running_mean, rt_tensor* running_var, double momentum,
                              double eps);

// ---- Profiling (profile.cpp): libtorch's Kineto profiler over CPU ops (and CUDA kernels with
// cuda != 0) from start to stop, saved as a Chrome trace; a named user scope (what
// torch.profiler's "ProfilerStep#N" is) from begin to end.
int rt_profiler_start(int cuda);
int rt_profiler_stop(const char* trace_path);
typedef struct rt_record rt_record;
rt_record* rt_record_begin(const char* name);
void rt_record_end(rt_record* r);

// ---- Fused BatchNorm (+ residual) + ReLU for channels_last training, LayerNorm, and ConvNeXt's
// block end (fused_norm.cpp): the Triton kernels compiled when ringtrain was built, launched
// through the CUDA driver.
// The images are static data of the binary, registered once. arch: 80, 90, 100 (major·10 +
// minor); ptx != 0 for PTX text (NUL-terminated), else a cubin.
typedef struct {
  const char* variant;  // e.g. "bn_act_forward.f16.res.a16"
  int arch;
  int ptx;
  const char* symbol;
  int num_warps;
  int shared_bytes;
  int params;  // what the kernel takes, Triton's two scratch pointers included
  int block_m;  // the tile it was compiled for (kernels/bn_act.py's tile), 0 where it has none
  int block_c;
  const unsigned char* image;
} rt_kernel_image;
int rt_fused_set_images(const rt_kernel_image* images, int n);
// Loads the kernels for `device` (once) and returns its compute capability (major·10 + minor);
// -1 and the error when they cannot run there.
int rt_fused_prepare(int device);
// relu(batch_norm(x) [+ residual]) in training mode, running statistics updated, with its
// autograd graph; residual may be null. Null with *why_not set when the kernels do not cover the
// call (the caller then runs the unfused ops); null with why_not null on failure.
rt_tensor* rt_fused_bn_relu(rt_tensor* x, rt_tensor* weight, rt_tensor* bias, rt_tensor* residual,
                            rt_tensor* running_mean, rt_tensor* running_var, double momentum, double eps,
                            const char** why_not);
// For the tests: forward and backward (with upstream gradient dy) through the same autograd
// Function, on any device, recording each kernel launch as a line of text instead of running
// it. grads: dx, dw, db, dresidual (null without a residual). Null on failure.
const char* rt_fused_bn_relu_record(rt_tensor* x, rt_tensor* weight, rt_tensor* bias, rt_tensor* residual,
                                    rt_tensor* running_mean, rt_tensor* running_var, double momentum,
                                    double eps, int64_t sm_count, rt_tensor* dy, rt_tensor** grads);

// LayerNorm over the last dimension in the input's own dtype (fp32 arithmetic), for ConvNeXt's
// block norm (kernels/layer_norm.py). The plan's constants come from that file, through the
// build's table: the tile's elements, programs per multiprocessor in backward, and the tile
// widths' range.
int rt_fused_set_layer_norm_plan(int64_t tile, int64_t programs_per_sm, int64_t min_width, int64_t max_width);
// layer_norm(x, [C], weight, bias, eps) with its autograd graph, x contiguous with C last; null
// with *why_not set when the kernels do not cover the call, null with why_not null on failure.
rt_tensor* rt_fused_layer_norm(rt_tensor* x, rt_tensor* weight, rt_tensor* bias, double eps, const char** why_not);
// For the tests, as rt_fused_bn_relu_record: grads are dx, dw, db.
const char* rt_fused_layer_norm_record(rt_tensor* x, rt_tensor* weight, rt_tensor* bias, double eps,
                                       int64_t sm_count, rt_tensor* dy, rt_tensor** grads);

// The end of a ConvNeXt block (kernels/scale_add.py): stream + keep[n]·gamma[c]·z, z the last
// Linear's [N, H, W, C] output, stream the block's channels_last input (z's dtype or fp32),
// gamma C values (fp32), keep N fp32 factors of stochastic depth; fp32 out, channels_last. Null
// with *why_not set when the kernels do not cover the call, null with why_not null on failure.
rt_tensor* rt_fused_scale_add(rt_tensor* z, rt_tensor* stream, rt_tensor* gamma, rt_tensor* keep,
                              const char** why_not);
// For the tests, as rt_fused_bn_relu_record: dout the upstream gradient; grads are dz, dstream,
// dgamma.
const char* rt_fused_scale_add_record(rt_tensor* z, rt_tensor* stream, rt_tensor* gamma, rt_tensor* keep,
                                      int64_t sm_count, rt_tensor* dout, rt_tensor** grads);

// Traces forward(ctx, input) (which returns a tensor that stays alive until the call returns) into
// a TorchScript module whose parameters and buffers (is_buffer[i]) are tensors[i] under names[i]
// (state_dict names: "a.b.weight" nests submodules), and saves it to path with n_extra extra
// files (extra_names[i] holding extra_lengths[i] bytes of extra_contents[i]). With description
// non-null, also sets *description to the traced graph as text (csrc/export.cpp says its lines;
// freed by rt_free_description); with path null, saves nothing.
typedef rt_tensor* (*rt_forward_fn)(void* ctx, rt_tensor* input);
int rt_jit_trace_save(const char** names, rt_tensor** tensors, const int* is_buffer, int n, rt_tensor* input,
                      rt_forward_fn forward, void* ctx, const char* path, const char** extra_names,
                      const char** extra_contents, const size_t* extra_lengths, int n_extra, char** description);
void rt_free_description(char* description);

#ifdef __cplusplus
}
#endif
