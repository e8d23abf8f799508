//! `--fused-norm`: a training step's normalisation in fewer passes over the activations than
//! eager PyTorch's: BatchNorm (+ the residual add) + ReLU in ResNets (kernels/bn_act.py counts
//! the passes), and in ConvNeXt's blocks the LayerNorm in the activations' own dtype, without
//! autocast's casts to fp32 and back (kernels/layer_norm.py), and the layer scale, stochastic
//! depth and residual add as one kernel each way (kernels/scale_add.py). Triton kernels compiled
//! when ringtrain was built (build_support/compile_kernels.py) and embedded here, launched by
//! csrc/fused_norm.cpp.
//! On by default only where GPU runs showed them faster than the unfused ops and equal to them
//! (`on_by_default`); every call they do not cover runs the unfused ops instead (docs/GUIDE.md,
//! "Fused normalisation").
use std::collections::HashSet;
use std::ffi::{CStr, CString};
use std::os::raw::{c_char, c_int};
use std::sync::{Mutex, OnceLock};

use anyhow::{bail, Result};
use tch::{Device, Tensor};

use crate::shim::{opt_ptr, ptr};

/// One compiled kernel, as the build wrote it.
pub struct KernelImage {
    /// e.g. `bn_act_forward.f16.res.a16`.
    pub variant: &'static str,
    /// major·10 + minor of the GPU it was compiled for (80, 90, 100).
    pub arch: i32,
    /// PTX text (the driver compiles it for newer GPUs) rather than a cubin.
    pub ptx: bool,
    pub symbol: &'static str,
    pub num_warps: i32,
    pub shared_bytes: i32,
    pub params: i32,
    /// The tile (rows, channels) the kernel was compiled for, 0 where it has none: the launcher
    /// sizes its grid from it.
    pub block_m: i32,
    pub block_c: i32,
    /// The cubin or PTX, gzip-compressed.
    pub image_gz: &'static [u8],
}

/// kernels/layer_norm.py's constants, as the build read them: the tile's elements, programs per
/// multiprocessor in backward, and the range of tile widths (powers of two).
pub struct LayerNormPlan {
    pub tile: i64,
    pub programs_per_sm: i64,
    pub min_width: i64,
    pub max_width: i64,
}

mod table {
    use super::{KernelImage, LayerNormPlan};
    include!(concat!(env!("OUT_DIR"), "/kernels/fused_kernels.rs"));
}

#[repr(C)]
struct RtKernelImage {
    variant: *const c_char,
    arch: c_int,
    ptx: c_int,
    symbol: *const c_char,
    num_warps: c_int,
    shared_bytes: c_int,
    params: c_int,
    block_m: c_int,
    block_c: c_int,
    image: *const u8,
}

extern "C" {
    fn rt_fused_set_images(images: *const RtKernelImage, n: c_int) -> c_int;
    fn rt_fused_set_layer_norm_plan(tile: i64, programs_per_sm: i64, min_width: i64, max_width: i64) -> c_int;
    fn rt_fused_prepare(device: c_int) -> c_int;
    fn rt_fused_layer_norm(
        x: *mut torch_sys::C_tensor,
        weight: *mut torch_sys::C_tensor,
        bias: *mut torch_sys::C_tensor,
        eps: f64,
        why_not: *mut *const c_char,
    ) -> *mut torch_sys::C_tensor;
    fn rt_fused_scale_add(
        z: *mut torch_sys::C_tensor,
        stream: *mut torch_sys::C_tensor,
        gamma: *mut torch_sys::C_tensor,
        keep: *mut torch_sys::C_tensor,
        why_not: *mut *const c_char,
    ) -> *mut torch_sys::C_tensor;
    fn rt_fused_scale_add_record(
        z: *mut torch_sys::C_tensor,
        stream: *mut torch_sys::C_tensor,
        gamma: *mut torch_sys::C_tensor,
        keep: *mut torch_sys::C_tensor,
        sm_count: i64,
        dout: *mut torch_sys::C_tensor,
        grads: *mut *mut torch_sys::C_tensor,
    ) -> *const c_char;
    fn rt_fused_layer_norm_record(
        x: *mut torch_sys::C_tensor,
        weight: *mut torch_sys::C_tensor,
        bias: *mut torch_sys::C_tensor,
        eps: f64,
        sm_count: i64,
        dy: *mut torch_sys::C_tensor,
        grads: *mut *mut torch_sys::C_tensor,
    ) -> *const c_char;
    fn rt_fused_bn_relu(
        x: *mut torch_sys::C_tensor,
        weight: *mut torch_sys::C_tensor,
        bias: *mut torch_sys::C_tensor,
        residual: *mut torch_sys::C_tensor,
        running_mean: *mut torch_sys::C_tensor,
        running_var: *mut torch_sys::C_tensor,
        momentum: f64,
        eps: f64,
        why_not: *mut *const c_char,
    ) -> *mut torch_sys::C_tensor;
    fn rt_fused_bn_relu_record(
        x: *mut torch_sys::C_tensor,
        weight: *mut torch_sys::C_tensor,
        bias: *mut torch_sys::C_tensor,
        residual: *mut torch_sys::C_tensor,
        running_mean: *mut torch_sys::C_tensor,
        running_var: *mut torch_sys::C_tensor,
        momentum: f64,
        eps: f64,
        sm_count: i64,
        dy: *mut torch_sys::C_tensor,
        grads: *mut *mut torch_sys::C_tensor,
    ) -> *const c_char;
}

/// The C view of the table, made once (the images unpacked); it lives as long as the process.
struct Registered {
    _names: Vec<CString>,
    _unpacked: Vec<Vec<u8>>,
    _images: Vec<RtKernelImage>,
}
// SAFETY: the pointers point into `_names` and `_unpacked`, never written after registration.
unsafe impl Send for Registered {}
unsafe impl Sync for Registered {}

fn register() {
    static DONE: OnceLock<Registered> = OnceLock::new();
    DONE.get_or_init(|| {
        let mut names = Vec::new();
        let mut unpacked = Vec::new();
        let mut images = Vec::new();
        for k in table::KERNELS {
            let (v, s) = (CString::new(k.variant).unwrap(), CString::new(k.symbol).unwrap());
            let mut image = Vec::new();
            std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(k.image_gz), &mut image)
                .expect("the build's kernel images are gzip streams");
            images.push(RtKernelImage {
                variant: v.as_ptr(),
                arch: k.arch,
                ptx: k.ptx as c_int,
                symbol: s.as_ptr(),
                num_warps: k.num_warps,
                shared_bytes: k.shared_bytes,
                params: k.params,
                block_m: k.block_m,
                block_c: k.block_c,
                image: image.as_ptr(),
            });
            names.extend([v, s]);
            unpacked.push(image); // moving the Vec keeps its heap buffer where `image` points
        }
        // SAFETY: `images` and `names` are kept alive in the OnceLock for the process's life.
        let ln = &table::LN_PLAN;
        unsafe {
            rt_fused_set_images(images.as_ptr(), images.len() as c_int);
            rt_fused_set_layer_norm_plan(ln.tile, ln.programs_per_sm, ln.min_width, ln.max_width);
        }
        Registered {
            _names: names,
            _unpacked: unpacked,
            _images: images,
        }
    });
}

/// What this build carries, for `--version` and `doctor`: e.g. "44 kernels for sm_80, sm_90,
/// sm_100, and PTX for newer GPUs (Triton 3.6.0)", or why there are none.
pub fn describe() -> String {
    if table::KERNELS.is_empty() {
        return "none (Triton was not importable when ringtrain was built)".into();
    }
    let variants: HashSet<&str> = table::KERNELS.iter().map(|k| k.variant).collect();
    let mut archs: Vec<i32> = table::KERNELS.iter().filter(|k| !k.ptx).map(|k| k.arch).collect();
    archs.sort();
    archs.dedup();
    let archs: Vec<String> = archs.iter().map(|a| format!("sm_{a}")).collect();
    format!(
        "{} kernels for {}, and PTX for newer GPUs (Triton {})",
        variants.len(),
        archs.join(", "),
        table::TRITON_VERSION
    )
}

/// Whether the fused kernels can run on `device`: loads them there once, and returns the GPU's
/// compute capability (major·10 + minor). The error says why not (the run then uses the unfused
/// ops).
pub fn prepare(device: Device) -> Result<i32, String> {
    register();
    if table::KERNELS.is_empty() {
        return Err("this build has no fused kernels (Triton was not importable when ringtrain was built)".into());
    }
    let Device::Cuda(i) = device else {
        return Err("the fused kernels run on CUDA GPUs, and this run is on the CPU".into());
    };
    // SAFETY: plain C call; errors come back as -1 and the shim's message.
    match unsafe { rt_fused_prepare(i as c_int) } {
        cc if cc < 0 => Err(crate::shim::last_error_message()),
        cc => Ok(cc),
    }
}

/// The GPUs (compute capability, major·10 + minor) on which training runs with the fused
/// kernels were shown both faster than the unfused ops and equal to them within the bounds
/// (docs/BENCHMARKS.md: ResNets on H100s and an H200, ConvNeXt-T on an H200). Where a run leaves
/// `--fused-norm` out, it is on there only.
pub const DEFAULT_ON: &[i32] = &[90];

/// The model families whose normalisation the fused kernels cover.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// BatchNorm + ReLU (+ the residual add): ResNet, ResNeXt, Wide ResNet, the CIFAR and tiny variants.
    ResNet,
    /// The block's LayerNorm, layer scale, stochastic depth and residual add.
    ConvNext,
}

impl Family {
    /// The normalisation the kernels take the place of, as the run's messages name it.
    pub fn norm(self) -> &'static str {
        match self {
            Family::ResNet => "BatchNorm",
            Family::ConvNext => "LayerNorm",
        }
    }
}

/// Whether a run that leaves `--fused-norm` out takes the fused kernels: where they were measured
/// (a model of a family they cover in fp16 or bf16, channels_last, on a GPU of `DEFAULT_ON`).
/// With `--cuda-graphs` for ResNets only: a GPU run checked the capture of their kernels (a
/// captured run bit for bit the eager one, and faster), not yet of ConvNeXt's. `capability` loads
/// the kernels and gives the GPU's (None when they cannot run there); it is asked last, so a run
/// the other conditions rule out loads nothing.
pub fn on_by_default(
    family: Option<Family>,
    amp: Option<tch::Kind>,
    channels_last: bool,
    cuda_graphs: bool,
    capability: impl FnOnce() -> Option<i32>,
) -> bool {
    let half = matches!(amp, Some(tch::Kind::Half | tch::Kind::BFloat16));
    let measured = family.is_some_and(|f| !cuda_graphs || f == Family::ResNet);
    measured && half && channels_last && capability().is_some_and(|cc| DEFAULT_ON.contains(&cc))
}

/// relu(batch_norm(x) [+ residual]) in training mode through the fused kernels, running
/// statistics updated; `None` when they do not cover this call (its reason told once per
/// process), and the caller runs the unfused ops. A failure inside them ends the process, as a
/// failed SyncBatchNorm does: a forward pass has no Result to carry it, and a GPU error leaves
/// nothing to fall back on.
pub fn bn_relu(
    x: &Tensor,
    [weight, bias, running_mean, running_var]: [&Tensor; 4],
    residual: Option<&Tensor>,
    momentum: f64,
    eps: f64,
) -> Option<Tensor> {
    register();
    let mut why: *const c_char = std::ptr::null();
    // SAFETY: every pointer is a live tensor (or null for no residual); the result is a new
    // tensor we own.
    let out = unsafe {
        rt_fused_bn_relu(
            ptr(x),
            ptr(weight),
            ptr(bias),
            opt_ptr(residual),
            ptr(running_mean),
            ptr(running_var),
            momentum,
            eps,
            &mut why,
        )
    };
    // SAFETY: `out` is null or a new tensor; `why` null or one of the shim's static C strings.
    unsafe { taken_or_told(out, why, "BatchNorm") }
}

/// layer_norm(x, [C], weight, bias, eps) over x's last dimension through the fused kernels, in
/// x's own dtype (fp32 inside): what eager PyTorch computes under autocast before the next
/// Linear casts its fp32 output back to fp16/bf16, so it may stand only where a Linear (or
/// another op autocast casts) takes the output. `None` when the kernels do not cover this call
/// (said once per reason), and the caller runs the unfused LayerNorm; a failure inside them ends
/// the process, as in `bn_relu`.
pub fn layer_norm(x: &Tensor, weight: &Tensor, bias: &Tensor, eps: f64) -> Option<Tensor> {
    register();
    let mut why: *const c_char = std::ptr::null();
    // SAFETY: live tensors in; the result is a new tensor we own, or null with a reason.
    unsafe {
        let out = rt_fused_layer_norm(ptr(x), ptr(weight), ptr(bias), eps, &mut why);
        taken_or_told(out, why, "LayerNorm")
    }
}

/// The end of a ConvNeXt block through the fused kernels: `stream + keep[n]·gamma[c]·z` with z
/// the block's last Linear output ([N, H, W, C]), stream its channels_last input, gamma the layer
/// scale (C values) and keep stochastic depth's factor per sample (fp32); fp32 out, channels_last,
/// as eager's type promotion gives it. `None` when the kernels do not cover this call (said once
/// per reason), and the caller runs the unfused ops.
pub fn scale_add(z: &Tensor, stream: &Tensor, gamma: &Tensor, keep: &Tensor) -> Option<Tensor> {
    register();
    let mut why: *const c_char = std::ptr::null();
    // SAFETY: live tensors in; the result is a new tensor we own, or null with a reason.
    unsafe {
        let out = rt_fused_scale_add(ptr(z), ptr(stream), ptr(gamma), ptr(keep), &mut why);
        taken_or_told(out, why, "layer scale + residual add")
    }
}

/// The fused result, or None with the reason said once per process and norm; a failure (no
/// result and no reason) ends the process.
///
/// # Safety
/// `out` is null or a tensor the caller owns; `why` null or a static C string.
unsafe fn taken_or_told(out: *mut torch_sys::C_tensor, why: *const c_char, norm: &str) -> Option<Tensor> {
    if !out.is_null() {
        return Some(Tensor::from_ptr(out));
    }
    if why.is_null() {
        eprintln!("error: fused {norm}: {}", crate::shim::last_error_message());
        std::process::exit(1);
    }
    let why = CStr::from_ptr(why).to_string_lossy().into_owned();
    static TOLD: Mutex<Option<HashSet<String>>> = Mutex::new(None);
    let said = format!("--fused-norm: {why}: the unfused {norm} runs there");
    if TOLD
        .lock()
        .unwrap()
        .get_or_insert_with(HashSet::new)
        .insert(said.clone())
    {
        crate::say!("{said}");
    }
    None
}

/// The launches the fused forward and backward make for these tensors (any device; nothing
/// runs), one line each, and the gradients' tensors (dx, dw, db, dresidual): what the test
/// suite compares with kernels/bn_act.py's own orchestration.
pub fn record_launches(
    x: &Tensor,
    params: [&Tensor; 4],
    residual: Option<&Tensor>,
    dy: &Tensor,
    sm_count: i64,
) -> Result<(String, [Option<Tensor>; 4])> {
    register();
    let [w, b, rm, rv] = params;
    let mut grads = [std::ptr::null_mut(); 4];
    // SAFETY: live tensors in, new tensors out (owned here).
    let text = unsafe {
        rt_fused_bn_relu_record(
            ptr(x),
            ptr(w),
            ptr(b),
            opt_ptr(residual),
            ptr(rm),
            ptr(rv),
            0.1,
            1e-5,
            sm_count,
            ptr(dy),
            grads.as_mut_ptr(),
        )
    };
    let text = unsafe { recorded(text, "BatchNorm")? };
    let grads = grads.map(|g| (!g.is_null()).then(|| unsafe { Tensor::from_ptr(g) }));
    Ok((text, grads))
}

/// The launches the fused LayerNorm's forward and backward make for these tensors (nothing
/// runs), and the gradients' tensors (dx, dw, db): what the test suite compares with
/// kernels/layer_norm.py's orchestration.
pub fn record_layer_norm_launches(
    x: &Tensor,
    weight: &Tensor,
    bias: &Tensor,
    dy: &Tensor,
    sm_count: i64,
) -> Result<(String, [Tensor; 3])> {
    register();
    let mut grads = [std::ptr::null_mut(); 3];
    // SAFETY: live tensors in, new tensors out (owned here).
    let text = unsafe {
        rt_fused_layer_norm_record(
            ptr(x),
            ptr(weight),
            ptr(bias),
            1e-6,
            sm_count,
            ptr(dy),
            grads.as_mut_ptr(),
        )
    };
    let text = unsafe { recorded(text, "LayerNorm")? };
    Ok((text, grads.map(|g| unsafe { Tensor::from_ptr(g) })))
}

/// The launches of the fused scale-add's forward and backward for these tensors (nothing runs),
/// and the gradients (dz, dstream, dgamma): what the test suite compares with
/// kernels/scale_add.py's orchestration.
pub fn record_scale_add_launches(
    z: &Tensor,
    stream: &Tensor,
    gamma: &Tensor,
    keep: &Tensor,
    dout: &Tensor,
    sm_count: i64,
) -> Result<(String, [Tensor; 3])> {
    register();
    let mut grads = [std::ptr::null_mut(); 3];
    // SAFETY: live tensors in, new tensors out (owned here).
    let text = unsafe {
        rt_fused_scale_add_record(
            ptr(z),
            ptr(stream),
            ptr(gamma),
            ptr(keep),
            sm_count,
            ptr(dout),
            grads.as_mut_ptr(),
        )
    };
    let text = unsafe { recorded(text, "scale-add")? };
    Ok((text, grads.map(|g| unsafe { Tensor::from_ptr(g) })))
}

/// A `*_record` call's text, or its error.
///
/// # Safety
/// `text` is null or a C string the shim keeps until the next recording on this thread.
unsafe fn recorded(text: *const c_char, what: &str) -> Result<String> {
    if text.is_null() {
        bail!("fused {what}: {}", crate::shim::last_error_message());
    }
    Ok(CStr::from_ptr(text).to_string_lossy().into_owned())
}

#[cfg(test)]
mod tests {
    use super::{on_by_default, Family};
    use tch::Kind;

    /// Left out, `--fused-norm` is on only for what GPU runs measured: a ResNet or ConvNeXt, fp16 or
    /// bf16, channels_last, compute capability 9.0, with CUDA graphs a ResNet only; any one of them
    /// missing turns it off.
    #[test]
    fn on_by_default_only_where_measured() {
        let (resnet, convnext) = (Some(Family::ResNet), Some(Family::ConvNext));
        for amp in [Kind::Half, Kind::BFloat16] {
            for family in [resnet, convnext] {
                assert!(on_by_default(family, Some(amp), true, false, || Some(90)));
            }
        }
        assert!(!on_by_default(None, Some(Kind::Half), true, false, || Some(90)), "not a family the kernels cover");
        assert!(!on_by_default(resnet, None, true, false, || Some(90)), "fp32");
        assert!(!on_by_default(resnet, Some(Kind::Half), false, false, || Some(90)), "NCHW");
        assert!(on_by_default(resnet, Some(Kind::Half), true, true, || Some(90)), "a ResNet's capture was checked");
        assert!(!on_by_default(convnext, Some(Kind::Half), true, true, || Some(90)), "ConvNeXt's capture was not");
        for cc in [80, 86, 89, 100, 120] {
            assert!(!on_by_default(resnet, Some(Kind::Half), true, false, || Some(cc)), "sm_{cc} not measured");
        }
        assert!(!on_by_default(resnet, Some(Kind::Half), true, false, || None), "kernels cannot run");
        // A run the other conditions rule out never loads the kernels to learn the GPU.
        assert!(!on_by_default(resnet, None, true, false, || panic!("the kernels were loaded for an fp32 run")));
    }
}
