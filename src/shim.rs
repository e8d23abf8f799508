//! Safe Rust API over the C++ shim in `csrc/` (libtorch features tch 0.24 lacks).
use std::ffi::CStr;
use std::os::raw::{c_char, c_int};

use anyhow::{bail, Result};
use tch::{Device, Kind, Tensor};

mod ffi {
    use super::*;
    #[repr(C)]
    pub struct RtCudaTimer {
        _private: [u8; 0],
    }
    #[repr(C)]
    pub struct RtCudaGraph {
        _private: [u8; 0],
    }
    #[repr(C)]
    pub struct RtRecord {
        _private: [u8; 0],
    }
    extern "C" {
        pub fn rt_last_error() -> *const c_char;
        pub fn rt_set_log_level(level: c_int);
        pub fn rt_autocast_set_enabled(device_type: c_int, enabled: c_int) -> c_int;
        pub fn rt_autocast_is_enabled(device_type: c_int) -> c_int;
        pub fn rt_autocast_set_dtype(device_type: c_int, dtype: c_int) -> c_int;
        pub fn rt_autocast_get_dtype(device_type: c_int) -> c_int;
        pub fn rt_autocast_clear_cache();
        pub fn rt_to_channels_last(t: *mut torch_sys::C_tensor) -> *mut torch_sys::C_tensor;
        pub fn rt_is_channels_last(t: *mut torch_sys::C_tensor) -> c_int;
        pub fn rt_set_data_channels_last(t: *mut torch_sys::C_tensor) -> c_int;
        pub fn rt_amp_unscale(
            grads: *const *mut torch_sys::C_tensor,
            n: c_int,
            found_inf: *mut torch_sys::C_tensor,
            inv_scale: *mut torch_sys::C_tensor,
        ) -> c_int;
        pub fn rt_set_grad(param: *mut torch_sys::C_tensor, grad: *mut torch_sys::C_tensor) -> c_int;
        pub fn rt_clear_grads(params: *const *mut torch_sys::C_tensor, n: c_int) -> c_int;
        pub fn rt_storage_use_count(t: *mut torch_sys::C_tensor) -> i64;
        pub fn rt_torch_randperm(n: i64, seed: u64, out: *mut i64) -> c_int;
        pub fn rt_empty_pinned(sizes: *const i64, ndim: c_int, dtype: c_int) -> *mut torch_sys::C_tensor;
        pub fn rt_fused_sgd(
            params: *const *mut torch_sys::C_tensor,
            grads: *const *mut torch_sys::C_tensor,
            bufs: *const *mut torch_sys::C_tensor,
            n: c_int,
            weight_decay: f64,
            momentum: f64,
            lr: f64,
            lr_tensor: *mut torch_sys::C_tensor,
            dampening: f64,
            nesterov: c_int,
            first_step: c_int,
            grad_scale: *mut torch_sys::C_tensor,
            found_inf: *mut torch_sys::C_tensor,
        ) -> c_int;
        pub fn rt_fused_adam(
            params: *const *mut torch_sys::C_tensor,
            grads: *const *mut torch_sys::C_tensor,
            exp_avgs: *const *mut torch_sys::C_tensor,
            exp_avg_sqs: *const *mut torch_sys::C_tensor,
            steps: *const *mut torch_sys::C_tensor,
            n: c_int,
            lr: f64,
            lr_tensor: *mut torch_sys::C_tensor,
            beta1: f64,
            beta2: f64,
            weight_decay: f64,
            eps: f64,
            decoupled: c_int,
            grad_scale: *mut torch_sys::C_tensor,
            found_inf: *mut torch_sys::C_tensor,
        ) -> c_int;
        pub fn rt_lars(
            params: *const *mut torch_sys::C_tensor,
            grads: *const *mut torch_sys::C_tensor,
            bufs: *const *mut torch_sys::C_tensor,
            n: c_int,
            lr: f64,
            lr_tensor: *mut torch_sys::C_tensor,
            momentum: f64,
            weight_decay: f64,
            nesterov: c_int,
            trust_coeff: f64,
            eps: f64,
            adapt: c_int,
            found_inf: *mut torch_sys::C_tensor,
        ) -> c_int;
        pub fn rt_rmsprop(
            params: *const *mut torch_sys::C_tensor,
            grads: *const *mut torch_sys::C_tensor,
            square_avgs: *const *mut torch_sys::C_tensor,
            bufs: *const *mut torch_sys::C_tensor,
            steps: *const *mut torch_sys::C_tensor,
            n: c_int,
            lr: f64,
            lr_tensor: *mut torch_sys::C_tensor,
            alpha: f64,
            eps: f64,
            weight_decay: f64,
            momentum: f64,
            found_inf: *mut torch_sys::C_tensor,
        ) -> c_int;
        pub fn rt_lamb_clip(
            grads: *const *mut torch_sys::C_tensor,
            n: c_int,
            max_grad_norm: f64,
        ) -> *mut torch_sys::C_tensor;
        pub fn rt_lamb(
            params: *const *mut torch_sys::C_tensor,
            grads: *const *mut torch_sys::C_tensor,
            exp_avgs: *const *mut torch_sys::C_tensor,
            exp_avg_sqs: *const *mut torch_sys::C_tensor,
            n: c_int,
            step: *mut torch_sys::C_tensor,
            clip: *mut torch_sys::C_tensor,
            lr: f64,
            lr_tensor: *mut torch_sys::C_tensor,
            beta1: f64,
            beta2: f64,
            eps: f64,
            weight_decay: f64,
            adapt: c_int,
            found_inf: *mut torch_sys::C_tensor,
        ) -> c_int;
        pub fn rt_profiler_start(cuda: c_int) -> c_int;
        pub fn rt_profiler_stop(trace_path: *const c_char) -> c_int;
        pub fn rt_record_begin(name: *const c_char) -> *mut RtRecord;
        pub fn rt_record_end(r: *mut RtRecord);
        pub fn rt_cuda_use_side_stream(device: c_int) -> c_int;
        pub fn rt_cuda_graph_begin(device: c_int) -> *mut RtCudaGraph;
        pub fn rt_cuda_graph_end(g: *mut RtCudaGraph) -> c_int;
        pub fn rt_cuda_graph_replay(g: *mut RtCudaGraph) -> c_int;
        pub fn rt_cuda_graph_free(g: *mut RtCudaGraph);
        pub fn rt_cuda_peak_memory(device: c_int, reset: c_int) -> i64;
        pub fn rt_cuda_sync_debug(mode: c_int) -> c_int;
        pub fn rt_cuda_set_device(device: c_int) -> c_int;
        pub fn rt_cuda_timer_start(device: c_int) -> *mut RtCudaTimer;
        pub fn rt_cuda_timer_stop(t: *mut RtCudaTimer) -> c_int;
        pub fn rt_cuda_timer_elapsed_ms(t: *mut RtCudaTimer, wait: c_int) -> f64;
        pub fn rt_cuda_timer_free(t: *mut RtCudaTimer);
        pub fn rt_torch_version() -> *const c_char;
        pub fn rt_cuda_runtime_version() -> i64;
        pub fn rt_cudnn_version() -> i64;
        pub fn rt_set_cudnn_deterministic(on: c_int);
        pub fn rt_jit_trace_save(
            names: *const *const c_char,
            tensors: *const *mut torch_sys::C_tensor,
            is_buffer: *const c_int,
            n: c_int,
            input: *mut torch_sys::C_tensor,
            forward: extern "C" fn(*mut std::ffi::c_void, *mut torch_sys::C_tensor) -> *mut torch_sys::C_tensor,
            ctx: *mut std::ffi::c_void,
            path: *const c_char,
            extra_names: *const *const c_char,
            extra_contents: *const *const c_char,
            extra_lengths: *const usize,
            n_extra: c_int,
            description: *mut *mut c_char,
        ) -> c_int;
        pub fn rt_free_description(description: *mut c_char);
    }
}

/// The message of the shim's last failure on this thread.
pub fn last_error_message() -> String {
    last_error()
}

fn last_error() -> String {
    // SAFETY: the shim returns a pointer to a thread-local NUL-terminated string.
    unsafe { CStr::from_ptr(ffi::rt_last_error()) }
        .to_string_lossy()
        .into_owned()
}

fn check(rc: c_int) -> Result<c_int> {
    if rc < 0 {
        bail!("libtorch: {}", last_error())
    }
    Ok(rc)
}

// c10::DeviceType and c10::ScalarType values, stable across libtorch releases.
fn device_type(device: Device) -> c_int {
    match device {
        Device::Cpu => 0,
        Device::Cuda(_) => 1,
        Device::Mps => 13,
        Device::Vulkan => 10,
    }
}

pub(crate) fn scalar_type(kind: Kind) -> Result<c_int> {
    Ok(match kind {
        Kind::Half => 5,
        Kind::Float => 6,
        Kind::BFloat16 => 15,
        other => bail!("autocast does not support {other:?}"),
    })
}

/// Autocast state for one device type, through libtorch's non-deprecated per-device API.
/// Enabling returns a guard that restores the previous state and clears the cast cache on drop,
/// as `torch.autocast` does when its context exits.
pub struct AutocastGuard {
    device: c_int,
    was_enabled: bool,
}

pub fn autocast(device: Device, kind: Kind) -> Result<AutocastGuard> {
    let dev = device_type(device);
    let was_enabled = check(unsafe { ffi::rt_autocast_is_enabled(dev) })? == 1;
    check(unsafe { ffi::rt_autocast_set_dtype(dev, scalar_type(kind)?) })?;
    check(unsafe { ffi::rt_autocast_set_enabled(dev, 1) })?;
    Ok(AutocastGuard {
        device: dev,
        was_enabled,
    })
}

impl Drop for AutocastGuard {
    fn drop(&mut self) {
        unsafe {
            ffi::rt_autocast_set_enabled(self.device, self.was_enabled as c_int);
            if !self.was_enabled {
                ffi::rt_autocast_clear_cache();
            }
        }
    }
}

pub fn autocast_enabled(device: Device) -> bool {
    unsafe { ffi::rt_autocast_is_enabled(device_type(device)) == 1 }
}

pub fn autocast_dtype(device: Device) -> Result<Kind> {
    Ok(
        match check(unsafe { ffi::rt_autocast_get_dtype(device_type(device)) })? {
            5 => Kind::Half,
            6 => Kind::Float,
            15 => Kind::BFloat16,
            other => bail!("unexpected autocast dtype {other}"),
        },
    )
}

/// A copy of a 4-d tensor with channels_last (NHWC) strides; same shape and values.
pub fn to_channels_last(t: &Tensor) -> Result<Tensor> {
    let ptr = unsafe { ffi::rt_to_channels_last(t.as_ptr() as *mut torch_sys::C_tensor) };
    if ptr.is_null() {
        bail!("libtorch: {}", last_error());
    }
    // SAFETY: the shim returns a freshly allocated at::Tensor*, which tch takes ownership of.
    Ok(unsafe { Tensor::from_ptr(ptr) })
}

pub fn is_channels_last(t: &Tensor) -> bool {
    unsafe { ffi::rt_is_channels_last(t.as_ptr() as *mut torch_sys::C_tensor) == 1 }
}

/// Converts every 4-d variable of a var store (conv weights) to channels_last in place.
pub fn var_store_to_channels_last(vs: &tch::nn::VarStore) -> Result<()> {
    for (_, t) in vs.variables() {
        check(unsafe { ffi::rt_set_data_channels_last(t.as_ptr() as *mut torch_sys::C_tensor) })?;
    }
    Ok(())
}

/// Sets libtorch's C++ log threshold (0 INFO .. 3 FATAL). ringtrain reports failures itself, so
/// by default it silences libtorch's own log lines unless TORCH_CPP_LOG_LEVEL asks for them.
pub fn set_torch_log_level(level: i32) {
    unsafe { ffi::rt_set_log_level(level) }
}

/// Multiplies every gradient by `inv_scale` in place and sets `found_inf` (a 1-element float
/// tensor) to 1 if any of them holds inf or NaN.
pub fn amp_unscale(grads: &[Tensor], found_inf: &Tensor, inv_scale: &Tensor) -> Result<()> {
    let ptrs: Vec<*mut torch_sys::C_tensor> = grads.iter().map(|g| g.as_ptr() as *mut _).collect();
    check(unsafe {
        ffi::rt_amp_unscale(
            ptrs.as_ptr(),
            ptrs.len() as c_int,
            found_inf.as_ptr() as *mut _,
            inv_scale.as_ptr() as *mut _,
        )
    })?;
    Ok(())
}

/// Sets `param.grad = grad` (same shape); autograd accumulates into it in place from then on.
pub fn set_grad(param: &Tensor, grad: &Tensor) -> Result<()> {
    check(unsafe { ffi::rt_set_grad(param.as_ptr() as *mut _, grad.as_ptr() as *mut _) })?;
    Ok(())
}

/// `zero_grad(set_to_none=True)`: the parameters' gradients become undefined (no memset; the
/// next backward allocates them).
pub fn clear_grads(params: &[Tensor]) -> Result<()> {
    let p = ptrs(params);
    check(unsafe { ffi::rt_clear_grads(p.as_ptr(), p.len() as c_int) })?;
    Ok(())
}

/// How many tensors (views included) share `t`'s storage: 1 when `t` is its only holder.
pub fn storage_use_count(t: &Tensor) -> i64 {
    // SAFETY: reads a reference count of a live tensor.
    unsafe { ffi::rt_storage_use_count(t.as_ptr() as *mut torch_sys::C_tensor) }
}

/// `torch.randperm(n, generator=torch.Generator().manual_seed(seed))`: libtorch's own draw, so
/// a run can read its samples in the order a PyTorch sampler seeded the same way gives.
pub fn torch_randperm(n: usize, seed: u64) -> Result<Vec<usize>> {
    let mut out = vec![0i64; n];
    // SAFETY: the shim writes exactly n values into `out`.
    check(unsafe { ffi::rt_torch_randperm(n as i64, seed, out.as_mut_ptr()) })?;
    Ok(out.into_iter().map(|i| i as usize).collect())
}

/// An uninitialised CPU tensor in pinned (page-locked) memory, for asynchronous copies to a
/// GPU; an error without a CUDA device.
pub fn empty_pinned(sizes: &[i64], kind: tch::Kind) -> Result<Tensor> {
    // c10::ScalarType values.
    let dtype = match kind {
        tch::Kind::Uint8 => 0,
        tch::Kind::Int64 => 4,
        tch::Kind::Float => 6,
        k => bail!("empty_pinned: unsupported kind {k:?}"),
    };
    let ptr = unsafe { ffi::rt_empty_pinned(sizes.as_ptr(), sizes.len() as c_int, dtype) };
    if ptr.is_null() {
        bail!("libtorch: {}", last_error());
    }
    // SAFETY: the shim returns a freshly allocated at::Tensor*, which tch takes ownership of.
    Ok(unsafe { Tensor::from_ptr(ptr) })
}

/// A tensor's handle, for a shim function that takes one.
pub(crate) fn ptr(t: &Tensor) -> *mut torch_sys::C_tensor {
    t.as_ptr() as *mut _
}

/// The tensors' handles, for a shim function that takes a list.
pub(crate) fn ptrs(ts: &[Tensor]) -> Vec<*mut torch_sys::C_tensor> {
    ts.iter().map(ptr).collect()
}

/// An optional tensor's handle: null for none.
pub(crate) fn opt_ptr(t: Option<&Tensor>) -> *mut torch_sys::C_tensor {
    t.map_or(std::ptr::null_mut(), ptr)
}

/// A learning rate for the fused steps: a number, or a 0-dim float tensor on the parameters'
/// device that the kernel reads when it runs (a CUDA graph's replay then sees its current value).
#[derive(Debug, Clone, Copy)]
pub enum Lr<'a> {
    Host(f64),
    Device(&'a Tensor),
}

impl Lr<'_> {
    fn split(self) -> (f64, *mut torch_sys::C_tensor) {
        match self {
            Lr::Host(v) => (v, std::ptr::null_mut()),
            Lr::Device(t) => (0.0, t.as_ptr() as *mut _),
        }
    }
}

/// SGD's hyper-parameters for `fused_sgd`.
#[derive(Debug, Clone, Copy)]
pub struct SgdParams {
    pub momentum: f64,
    pub dampening: f64,
    pub weight_decay: f64,
    pub nesterov: bool,
}

/// torch.optim.SGD(fused=True)'s step over one parameter list. `bufs` is empty when momentum is
/// 0; `first_step` copies the gradients into the buffers instead of accumulating. With
/// `found_inf` holding 1, nothing changes.
pub fn fused_sgd(
    params: &[Tensor],
    grads: &[Tensor],
    bufs: &[Tensor],
    lr: Lr,
    h: SgdParams,
    first_step: bool,
    found_inf: Option<&Tensor>,
) -> Result<()> {
    assert_eq!(params.len(), grads.len());
    assert!(bufs.is_empty() || bufs.len() == params.len());
    let (p, g, b) = (ptrs(params), ptrs(grads), ptrs(bufs));
    let (lr, lr_tensor) = lr.split();
    check(unsafe {
        ffi::rt_fused_sgd(
            p.as_ptr(),
            g.as_ptr(),
            if b.is_empty() { std::ptr::null() } else { b.as_ptr() },
            p.len() as c_int,
            h.weight_decay,
            h.momentum,
            lr,
            lr_tensor,
            h.dampening,
            h.nesterov as c_int,
            first_step as c_int,
            std::ptr::null_mut(),
            opt_ptr(found_inf),
        )
    })?;
    Ok(())
}

/// Adam's hyper-parameters for `fused_adam`; `decoupled` is AdamW.
#[derive(Debug, Clone, Copy)]
pub struct AdamParams {
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    pub decoupled: bool,
}

/// torch.optim.Adam/AdamW(fused=True)'s step over one parameter list (steps: float32 scalars,
/// incremented here, and restored when `found_inf` holds 1 and the step is skipped).
pub fn fused_adam(
    params: &[Tensor],
    grads: &[Tensor],
    exp_avgs: &[Tensor],
    exp_avg_sqs: &[Tensor],
    steps: &[Tensor],
    lr: Lr,
    h: AdamParams,
    found_inf: Option<&Tensor>,
) -> Result<()> {
    let n = params.len();
    assert!(grads.len() == n && exp_avgs.len() == n && exp_avg_sqs.len() == n && steps.len() == n);
    let (p, g, m, v, s) = (
        ptrs(params),
        ptrs(grads),
        ptrs(exp_avgs),
        ptrs(exp_avg_sqs),
        ptrs(steps),
    );
    let (lr, lr_tensor) = lr.split();
    check(unsafe {
        ffi::rt_fused_adam(
            p.as_ptr(),
            g.as_ptr(),
            m.as_ptr(),
            v.as_ptr(),
            s.as_ptr(),
            n as c_int,
            lr,
            lr_tensor,
            h.beta1,
            h.beta2,
            h.weight_decay,
            h.eps,
            h.decoupled as c_int,
            std::ptr::null_mut(),
            opt_ptr(found_inf),
        )
    })?;
    Ok(())
}

/// LARS's hyper-parameters for `lars` (timm.optim.Lars with dampening 0, trust_clip off).
#[derive(Debug, Clone, Copy)]
pub struct LarsParams {
    pub momentum: f64,
    pub weight_decay: f64,
    pub nesterov: bool,
    pub trust_coeff: f64,
    pub eps: f64,
    /// The trust ratio applies (false for norms and biases).
    pub adapt: bool,
}

/// timm.optim.Lars's multi-tensor step over one parameter list. `bufs` is empty when momentum
/// is 0, else starts at zero. With `found_inf` holding 1, nothing changes.
pub fn lars(
    params: &[Tensor],
    grads: &[Tensor],
    bufs: &[Tensor],
    lr: Lr,
    h: LarsParams,
    found_inf: Option<&Tensor>,
) -> Result<()> {
    assert_eq!(params.len(), grads.len());
    assert!(bufs.is_empty() || bufs.len() == params.len());
    let (p, g, b) = (ptrs(params), ptrs(grads), ptrs(bufs));
    let (lr, lr_tensor) = lr.split();
    check(unsafe {
        ffi::rt_lars(
            p.as_ptr(),
            g.as_ptr(),
            if b.is_empty() { std::ptr::null() } else { b.as_ptr() },
            p.len() as c_int,
            lr,
            lr_tensor,
            h.momentum,
            h.weight_decay,
            h.nesterov as c_int,
            h.trust_coeff,
            h.eps,
            h.adapt as c_int,
            opt_ptr(found_inf),
        )
    })?;
    Ok(())
}

/// RMSprop's hyper-parameters for `rmsprop` (torch.optim.RMSprop, not centered).
#[derive(Debug, Clone, Copy)]
pub struct RmspropParams {
    pub alpha: f64,
    pub eps: f64,
    pub weight_decay: f64,
    pub momentum: f64,
}

/// torch.optim.RMSprop's multi-tensor step over one parameter list: `steps` are float32 0-dim
/// counters (incremented), `bufs` is empty when momentum is 0, else starts at zero. With
/// `found_inf` holding 1, nothing changes, the counters included.
#[allow(clippy::too_many_arguments)]
pub fn rmsprop(
    params: &[Tensor],
    grads: &[Tensor],
    square_avgs: &[Tensor],
    bufs: &[Tensor],
    steps: &[Tensor],
    lr: Lr,
    h: RmspropParams,
    found_inf: Option<&Tensor>,
) -> Result<()> {
    let n = params.len();
    assert!(grads.len() == n && square_avgs.len() == n && steps.len() == n);
    assert!(bufs.is_empty() || bufs.len() == n);
    let (p, g, v, b, s) = (ptrs(params), ptrs(grads), ptrs(square_avgs), ptrs(bufs), ptrs(steps));
    let (lr, lr_tensor) = lr.split();
    check(unsafe {
        ffi::rt_rmsprop(
            p.as_ptr(),
            g.as_ptr(),
            v.as_ptr(),
            if b.is_empty() { std::ptr::null() } else { b.as_ptr() },
            s.as_ptr(),
            n as c_int,
            lr,
            lr_tensor,
            h.alpha,
            h.eps,
            h.weight_decay,
            h.momentum,
            opt_ptr(found_inf),
        )
    })?;
    Ok(())
}

/// timm.optim.Lamb's gradient clipping: the divisor max(1, global norm / `max_grad_norm`) of all
/// of `grads` (a 0-dim device tensor, nothing read back).
pub fn lamb_clip(grads: &[Tensor], max_grad_norm: f64) -> Result<Tensor> {
    let g = ptrs(grads);
    let ptr = unsafe { ffi::rt_lamb_clip(g.as_ptr(), g.len() as c_int, max_grad_norm) };
    if ptr.is_null() {
        bail!("libtorch: {}", last_error());
    }
    // SAFETY: the shim returns a freshly allocated at::Tensor*, which tch takes ownership of.
    Ok(unsafe { Tensor::from_ptr(ptr) })
}

/// LAMB's hyper-parameters for `lamb` (timm.optim.Lamb with bias correction and gradient
/// averaging, trust_clip off).
#[derive(Debug, Clone, Copy)]
pub struct LambParams {
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    /// The trust ratio applies (false for norms and biases).
    pub adapt: bool,
}

/// timm.optim.Lamb's multi-tensor step over one parameter group: `step` is the group's float32
/// 0-dim counter (incremented, also for an empty group, as timm's); the gradients are divided
/// by `clip` (`lamb_clip`'s). With `found_inf` holding 1, nothing changes, the counter included.
#[allow(clippy::too_many_arguments)]
pub fn lamb(
    params: &[Tensor],
    grads: &[Tensor],
    exp_avgs: &[Tensor],
    exp_avg_sqs: &[Tensor],
    step: &Tensor,
    clip: Option<&Tensor>,
    lr: Lr,
    h: LambParams,
    found_inf: Option<&Tensor>,
) -> Result<()> {
    let n = params.len();
    assert!(grads.len() == n && exp_avgs.len() == n && exp_avg_sqs.len() == n);
    let (p, g, m, v) = (ptrs(params), ptrs(grads), ptrs(exp_avgs), ptrs(exp_avg_sqs));
    let (lr, lr_tensor) = lr.split();
    check(unsafe {
        ffi::rt_lamb(
            p.as_ptr(),
            g.as_ptr(),
            m.as_ptr(),
            v.as_ptr(),
            n as c_int,
            ptr(step),
            opt_ptr(clip),
            lr,
            lr_tensor,
            h.beta1,
            h.beta2,
            h.eps,
            h.weight_decay,
            h.adapt as c_int,
            opt_ptr(found_inf),
        )
    })?;
    Ok(())
}

/// Peak bytes allocated on a CUDA device since the last `reset_cuda_peak_memory`.
pub fn cuda_peak_memory(device: usize) -> Option<u64> {
    let v = unsafe { ffi::rt_cuda_peak_memory(device as c_int, 0) };
    (v >= 0).then_some(v as u64)
}

pub fn reset_cuda_peak_memory(device: usize) {
    unsafe { ffi::rt_cuda_peak_memory(device as c_int, 1) };
}

/// While alive, libtorch warns on stderr of every call that makes the host wait for the GPU
/// (torch.cuda.set_sync_debug_mode("warn")); off again when dropped.
pub struct SyncWarnings(());

impl SyncWarnings {
    pub fn start() -> Result<SyncWarnings> {
        check(unsafe { ffi::rt_cuda_sync_debug(1) })?;
        Ok(SyncWarnings(()))
    }
}

impl Drop for SyncWarnings {
    fn drop(&mut self) {
        unsafe { ffi::rt_cuda_sync_debug(0) };
    }
}

/// Makes CUDA device `index` the current one (torch.cuda.set_device): the device of the caching
/// allocator's defaults, of NCCL's communicator and of the stream the timers below use.
pub fn set_cuda_device(index: usize) -> Result<()> {
    check(unsafe { ffi::rt_cuda_set_device(index as c_int) })?;
    Ok(())
}

/// libtorch's Kineto profiler (what torch.profiler runs): CPU operators, and with `cuda` the
/// CUDA kernels, copies and API calls, from here until `profiler_stop`.
pub fn profiler_start(cuda: bool) -> Result<()> {
    check(unsafe { ffi::rt_profiler_start(cuda as c_int) })?;
    Ok(())
}

/// Ends the profiler and writes what it saw to `path` as a Chrome trace (JSON).
pub fn profiler_stop(path: &std::path::Path) -> Result<()> {
    let path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())?;
    check(unsafe { ffi::rt_profiler_stop(path.as_ptr()) })?;
    Ok(())
}

/// A named scope in the profiler's trace while it lives (torch.profiler's record_function):
/// `ProfilerStep#N` marks a step.
pub struct RecordScope(*mut ffi::RtRecord);

impl RecordScope {
    pub fn begin(name: &str) -> Result<RecordScope> {
        let name = std::ffi::CString::new(name)?;
        let r = unsafe { ffi::rt_record_begin(name.as_ptr()) };
        if r.is_null() {
            bail!("libtorch: {}", last_error());
        }
        Ok(RecordScope(r))
    }
}

impl Drop for RecordScope {
    fn drop(&mut self) {
        unsafe { ffi::rt_record_end(self.0) }
    }
}

/// Time the current CUDA stream of a device spends between `start` and `stop`, as a pair of
/// torch.cuda.Event(enable_timing=True): for work the host only queues (an NCCL all-reduce's
/// wait makes the stream wait, not the host).
pub struct CudaTimer(*mut ffi::RtCudaTimer);

impl CudaTimer {
    pub fn start(device: usize) -> Result<CudaTimer> {
        let t = unsafe { ffi::rt_cuda_timer_start(device as c_int) };
        if t.is_null() {
            bail!("libtorch: {}", last_error());
        }
        Ok(CudaTimer(t))
    }

    pub fn stop(&self) -> Result<()> {
        check(unsafe { ffi::rt_cuda_timer_stop(self.0) })?;
        Ok(())
    }

    /// The time between the two events; None while the stream has not reached `stop` (unless
    /// `wait`, which blocks until it has).
    pub fn elapsed(&self, wait: bool) -> Result<Option<std::time::Duration>> {
        let ms = unsafe { ffi::rt_cuda_timer_elapsed_ms(self.0, wait as c_int) };
        if ms == -1.0 {
            return Ok(None);
        }
        if ms < 0.0 {
            bail!("libtorch: {}", last_error());
        }
        Ok(Some(std::time::Duration::from_secs_f64(ms / 1000.0)))
    }
}

impl Drop for CudaTimer {
    fn drop(&mut self) {
        unsafe { ffi::rt_cuda_timer_free(self.0) }
    }
}

/// Makes this thread's current stream on CUDA device `device` a non-default one, after the
/// work queued so far: a CUDA graph's warm-up steps must run on the stream it is captured on
/// (`CudaGraph`), and the default stream cannot be captured.
pub fn cuda_use_side_stream(device: usize) -> Result<()> {
    check(unsafe { ffi::rt_cuda_use_side_stream(device as c_int) }).map_err(|e| anyhow::anyhow!("CUDA graphs: {e}"))?;
    Ok(())
}

/// A CUDA graph (at::cuda::CUDAGraph): the work queued on a device's current stream between
/// `begin` and `end`, captured, not run; `replay` runs it again on the current stream, on the
/// same memory. Needs a CUDA build and device, and `cuda_use_side_stream` before the warm-up.
pub struct CudaGraph(*mut ffi::RtCudaGraph);

impl CudaGraph {
    /// Starts capturing the work this thread queues on CUDA device `device`.
    pub fn begin(device: usize) -> Result<CudaGraph> {
        let g = unsafe { ffi::rt_cuda_graph_begin(device as c_int) };
        if g.is_null() {
            bail!("CUDA graph capture: {}", last_error());
        }
        Ok(CudaGraph(g))
    }

    pub fn end(&self) -> Result<()> {
        check(unsafe { ffi::rt_cuda_graph_end(self.0) }).map_err(|e| anyhow::anyhow!("CUDA graph capture: {e}"))?;
        Ok(())
    }

    pub fn replay(&self) -> Result<()> {
        check(unsafe { ffi::rt_cuda_graph_replay(self.0) })?;
        Ok(())
    }
}

impl Drop for CudaGraph {
    fn drop(&mut self) {
        unsafe { ffi::rt_cuda_graph_free(self.0) }
    }
}

/// Whether this binary was linked against libtorch's CUDA libraries (CUDA loads when a GPU
/// is present); decided by build.rs. (Whether it has NCCL: `process_group::nccl_available`.)
pub fn built_with_cuda() -> bool {
    env!("RINGTRAIN_BUILT_CUDA") == "1"
}

/// A weight of a traced module: its state_dict name, the tensor the forward pass reads, and
/// whether it is a buffer (else a parameter).
pub struct TracedWeight<'a> {
    pub name: &'a str,
    pub tensor: &'a Tensor,
    pub buffer: bool,
}

struct TraceCall<'a> {
    forward: &'a mut dyn FnMut(&Tensor) -> Tensor,
    out: Option<Tensor>,
}

extern "C" fn traced_forward(ctx: *mut std::ffi::c_void, input: *mut torch_sys::C_tensor) -> *mut torch_sys::C_tensor {
    // SAFETY: ctx is the TraceCall that jit_trace_save passed, alive for the call; input is a
    // tensor the shim owns (cloned here as a new handle of the same tensor).
    let call = unsafe { &mut *(ctx as *mut TraceCall) };
    let x = unsafe { Tensor::clone_from_ptr(input) };
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (call.forward)(&x))) {
        Ok(y) => ptr(call.out.insert(y)),
        Err(_) => std::ptr::null_mut(),
    }
}

/// Traces `forward` on `input` into a TorchScript module holding `weights` as its parameters and
/// buffers (the tensors `forward` reads, under their state_dict names), and saves it to `path`
/// with `extra` (name, bytes) as its extra files (`torch.jit.load(path, _extra_files=...)`).
pub fn jit_trace_save(
    weights: &[TracedWeight],
    input: &Tensor,
    forward: &mut dyn FnMut(&Tensor) -> Tensor,
    path: &std::path::Path,
    extra: &[(String, Vec<u8>)],
) -> Result<()> {
    jit_trace(weights, input, forward, Some((path, extra)), false).map(|_| ())
}

/// Traces `forward` on `input` as `jit_trace_save` does, and gives the traced graph as text:
/// lines `input ID DTYPE SIZES..`, `weight ID NAME`, `const ID KIND VALUES..`,
/// `node KIND in ID.. out ID..`, `value ID DTYPE SIZES..` (each node output's, as traced) and
/// `output ID`, in the graph's order.
pub fn jit_trace_graph(
    weights: &[TracedWeight],
    input: &Tensor,
    forward: &mut dyn FnMut(&Tensor) -> Tensor,
) -> Result<String> {
    jit_trace(weights, input, forward, None, true).map(|d| d.unwrap_or_default())
}

fn jit_trace(
    weights: &[TracedWeight],
    input: &Tensor,
    forward: &mut dyn FnMut(&Tensor) -> Tensor,
    save: Option<(&std::path::Path, &[(String, Vec<u8>)])>,
    describe: bool,
) -> Result<Option<String>> {
    use std::ffi::CString;
    let names = weights.iter().map(|w| CString::new(w.name)).collect::<Result<Vec<_>, _>>()?;
    let name_ptrs: Vec<*const c_char> = names.iter().map(|n| n.as_ptr()).collect();
    let tensors: Vec<*mut torch_sys::C_tensor> = weights.iter().map(|w| ptr(w.tensor)).collect();
    let is_buffer: Vec<c_int> = weights.iter().map(|w| w.buffer as c_int).collect();
    let extra = save.map(|(_, e)| e).unwrap_or_default();
    let extra_names = extra.iter().map(|(n, _)| CString::new(n.as_str())).collect::<Result<Vec<_>, _>>()?;
    let extra_name_ptrs: Vec<*const c_char> = extra_names.iter().map(|n| n.as_ptr()).collect();
    let contents: Vec<*const c_char> = extra.iter().map(|(_, c)| c.as_ptr() as *const c_char).collect();
    let lengths: Vec<usize> = extra.iter().map(|(_, c)| c.len()).collect();
    let path = save.map(|(p, _)| CString::new(p.as_os_str().as_encoded_bytes())).transpose()?;
    let mut call = TraceCall { forward, out: None };
    let mut description: *mut c_char = std::ptr::null_mut();
    // SAFETY: every pointer lives until the call returns; the shim reads the contents for their
    // lengths and calls traced_forward with &mut call only during the call.
    let rc = unsafe {
        ffi::rt_jit_trace_save(
            name_ptrs.as_ptr(),
            tensors.as_ptr(),
            is_buffer.as_ptr(),
            weights.len() as c_int,
            ptr(input),
            traced_forward,
            &mut call as *mut TraceCall as *mut std::ffi::c_void,
            path.as_ref().map_or(std::ptr::null(), |p| p.as_ptr()),
            extra_name_ptrs.as_ptr(),
            contents.as_ptr(),
            lengths.as_ptr(),
            extra.len() as c_int,
            if describe { &mut description } else { std::ptr::null_mut() },
        )
    };
    // SAFETY: a NUL-terminated string the shim allocated for us (also when a later step failed),
    // freed once copied.
    let text = (!description.is_null()).then(|| {
        let text = unsafe { CStr::from_ptr(description) }.to_string_lossy().into_owned();
        unsafe { ffi::rt_free_description(description) };
        text
    });
    check(rc)?;
    Ok(text)
}

pub fn torch_version() -> String {
    unsafe { CStr::from_ptr(ffi::rt_torch_version()) }
        .to_string_lossy()
        .into_owned()
}

/// CUDA runtime version as "13.0", or None without CUDA.
pub fn cuda_version() -> Option<String> {
    let v = unsafe { ffi::rt_cuda_runtime_version() };
    (v > 0).then(|| format!("{}.{}", v / 1000, (v % 1000) / 10))
}

/// cuDNN's deterministic algorithms without benchmark-mode autotuning (`on`), or autotuning with
/// the fastest algorithms, deterministic or not: torch.backends.cudnn.deterministic/benchmark.
pub fn set_cudnn_deterministic(on: bool) {
    unsafe { ffi::rt_set_cudnn_deterministic(on as c_int) }
}

/// cuDNN version as "9.19.0", or None without cuDNN.
pub fn cudnn_version() -> Option<String> {
    let v = unsafe { ffi::rt_cudnn_version() };
    // cuDNN >= 9 encodes major*10000 + minor*100 + patch.
    (v > 0).then(|| format!("{}.{}.{}", v / 10000, (v % 10000) / 100, v % 100))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn autocast_guard_sets_and_restores_cpu_state() {
        assert!(!autocast_enabled(Device::Cpu));
        {
            let _g = autocast(Device::Cpu, Kind::BFloat16).unwrap();
            assert!(autocast_enabled(Device::Cpu));
            assert_eq!(autocast_dtype(Device::Cpu).unwrap(), Kind::BFloat16);
            // A matmul under CPU autocast runs in bf16: the observable effect, not just the flag.
            let a = Tensor::ones([4, 4], (Kind::Float, Device::Cpu));
            assert_eq!(a.matmul(&a).kind(), Kind::BFloat16);
        }
        assert!(!autocast_enabled(Device::Cpu));
        let a = Tensor::ones([4, 4], (Kind::Float, Device::Cpu));
        assert_eq!(a.matmul(&a).kind(), Kind::Float);
    }

    #[test]
    fn channels_last_changes_strides_not_values() {
        let t = Tensor::arange(2 * 3 * 4 * 5, (Kind::Float, Device::Cpu)).view([2, 3, 4, 5]);
        assert!(!is_channels_last(&t));
        let c = to_channels_last(&t).unwrap();
        assert!(is_channels_last(&c));
        assert_eq!(c.stride(), vec![60, 1, 15, 3]);
        assert!(c.equal(&t));
    }

    #[test]
    fn var_store_conversion_keeps_parameters_trainable() {
        let vs = tch::nn::VarStore::new(Device::Cpu);
        let conv = tch::nn::conv2d(vs.root() / "c", 3, 8, 3, Default::default());
        let before = conv.ws.copy();
        var_store_to_channels_last(&vs).unwrap();
        assert!(is_channels_last(&conv.ws));
        assert!(conv.ws.requires_grad());
        assert!(conv.ws.equal(&before));
    }

    #[test]
    fn versions_are_reported() {
        assert!(torch_version().starts_with("2.11"), "{}", torch_version());
    }
}
