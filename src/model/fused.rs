//! `--fused-norm`: BatchNorm (+ the residual add) + ReLU of a training step in fewer passes over
//! the activations than eager PyTorch's (kernels/bn_act.py counts them): the Triton kernels of
//! kernels/bn_act.py, compiled when ringtrain was built (build_support/compile_kernels.py) and
//! embedded here, launched by csrc/fused_norm.cpp. On by default only where GPU runs showed them
//! faster than the unfused ops and equal to them (`on_by_default`); every call they do not cover
//! runs the unfused ops instead (docs/GUIDE.md, "Fused BatchNorm").
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
    /// The cubin or PTX, gzip-compressed.
    pub image_gz: &'static [u8],
}

mod table {
    use super::KernelImage;
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
    image: *const u8,
}

extern "C" {
    fn rt_fused_set_images(images: *const RtKernelImage, n: c_int, block_m: i64, block_c: i64) -> c_int;
    fn rt_fused_prepare(device: c_int) -> c_int;
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
                image: image.as_ptr(),
            });
            names.extend([v, s]);
            unpacked.push(image); // moving the Vec keeps its heap buffer where `image` points
        }
        // SAFETY: `images` and `names` are kept alive in the OnceLock for the process's life.
        unsafe { rt_fused_set_images(images.as_ptr(), images.len() as c_int, table::BLOCK_M, table::BLOCK_C) };
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
/// BatchNorm).
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

/// The GPUs (compute capability, major·10 + minor) on which a training run with the fused
/// kernels was shown both faster than the unfused ops and equal to them within the bounds
/// (docs/BENCHMARKS.md: H100s). Where a run leaves `--fused-norm` out, it is on there only.
pub const DEFAULT_ON: &[i32] = &[90];

/// Whether a run that leaves `--fused-norm` out takes the fused kernels: where they were measured
/// (a ResNet in fp16 or bf16, channels_last, on a GPU of `DEFAULT_ON`), and not with
/// `--cuda-graphs`, whose capture of them no GPU run has checked yet. `capability` loads the
/// kernels and gives the GPU's (None when they cannot run there); it is asked last, so a run the
/// other conditions rule out loads nothing.
pub fn on_by_default(
    resnet: bool,
    amp: Option<tch::Kind>,
    channels_last: bool,
    cuda_graphs: bool,
    capability: impl FnOnce() -> Option<i32>,
) -> bool {
    let half = matches!(amp, Some(tch::Kind::Half | tch::Kind::BFloat16));
    resnet && half && channels_last && !cuda_graphs && capability().is_some_and(|cc| DEFAULT_ON.contains(&cc))
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
    if !out.is_null() {
        return Some(unsafe { Tensor::from_ptr(out) });
    }
    if why.is_null() {
        eprintln!("error: fused BatchNorm: {}", crate::shim::last_error_message());
        std::process::exit(1);
    }
    // SAFETY: the shim's reasons are static C strings.
    let why = unsafe { CStr::from_ptr(why) }.to_string_lossy().into_owned();
    static TOLD: Mutex<Option<HashSet<String>>> = Mutex::new(None);
    if TOLD
        .lock()
        .unwrap()
        .get_or_insert_with(HashSet::new)
        .insert(why.clone())
    {
        crate::say!("--fused-norm: {why}: the unfused BatchNorm runs there");
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
    if text.is_null() {
        bail!("fused BatchNorm: {}", crate::shim::last_error_message());
    }
    let text = unsafe { CStr::from_ptr(text) }.to_string_lossy().into_owned();
    let grads = grads.map(|g| (!g.is_null()).then(|| unsafe { Tensor::from_ptr(g) }));
    Ok((text, grads))
}

#[cfg(test)]
mod tests {
    use super::on_by_default;
    use tch::Kind;

    /// Left out, `--fused-norm` is on only for what GPU runs measured: a ResNet, fp16 or bf16,
    /// channels_last, compute capability 9.0, no CUDA graphs; any one of them missing turns it off.
    #[test]
    fn on_by_default_only_where_measured() {
        for amp in [Kind::Half, Kind::BFloat16] {
            assert!(on_by_default(true, Some(amp), true, false, || Some(90)));
        }
        assert!(!on_by_default(false, Some(Kind::Half), true, false, || Some(90)), "not a ResNet");
        assert!(!on_by_default(true, None, true, false, || Some(90)), "fp32");
        assert!(!on_by_default(true, Some(Kind::Half), false, false, || Some(90)), "NCHW");
        assert!(!on_by_default(true, Some(Kind::Half), true, true, || Some(90)), "CUDA graphs");
        for cc in [80, 86, 89, 100, 120] {
            assert!(!on_by_default(true, Some(Kind::Half), true, false, || Some(cc)), "sm_{cc} not measured");
        }
        assert!(!on_by_default(true, Some(Kind::Half), true, false, || None), "kernels cannot run");
        // A run the other conditions rule out never loads the kernels to learn the GPU.
        assert!(!on_by_default(true, None, true, false, || panic!("the kernels were loaded for an fp32 run")));
    }
}
