//! BatchNorm2d with torchvision's names (`weight`, `bias`, `running_mean`, `running_var`) that
//! becomes SyncBatchNorm while a process group is registered with `sync_batch_norm` (`--sync-bn`):
//! in training mode its statistics are those of the global batch (csrc/sync_bn.cpp); in eval mode
//! it is plain BatchNorm and communicates nothing. With `--fused-norm`, `forward_relu` runs
//! BatchNorm, the residual add and ReLU as fused kernels where they apply (model/fused.rs).
use std::sync::atomic::{AtomicPtr, Ordering};

use tch::nn::{self, ModuleT};
use tch::Tensor;

use crate::dist::process_group::ProcessGroup;
use crate::shim::ptr;

static SYNC_GROUP: AtomicPtr<std::ffi::c_void> = AtomicPtr::new(std::ptr::null_mut());

extern "C" {
    fn rt_sync_batch_norm(
        pg: *mut std::ffi::c_void,
        x: *mut torch_sys::C_tensor,
        weight: *mut torch_sys::C_tensor,
        bias: *mut torch_sys::C_tensor,
        running_mean: *mut torch_sys::C_tensor,
        running_var: *mut torch_sys::C_tensor,
        momentum: f64,
        eps: f64,
    ) -> *mut torch_sys::C_tensor;
}

/// While the guard lives, every BatchNorm2d in training mode synchronises over `pg`.
pub struct SyncBatchNormGuard<'a> {
    _pg: &'a ProcessGroup,
}

pub fn sync_batch_norm(pg: &ProcessGroup) -> SyncBatchNormGuard<'_> {
    SYNC_GROUP.store(pg.raw(), Ordering::SeqCst);
    SyncBatchNormGuard { _pg: pg }
}

impl Drop for SyncBatchNormGuard<'_> {
    fn drop(&mut self) {
        SYNC_GROUP.store(std::ptr::null_mut(), Ordering::SeqCst);
    }
}

#[derive(Debug)]
pub struct BatchNorm2d {
    bn: nn::BatchNorm,
    eps: f64,
    momentum: f64,
    /// `forward_relu` tries the fused kernels first (`--fused-norm`).
    fused: bool,
}

/// `nn.BatchNorm2d(c)`: weight 1 and bias 0, as PyTorch starts it. tch's default draws the
/// weight uniformly from [0, 1]; ringtrain once kept that, and it trained from-scratch ResNets
/// up to 6 points of top-1 better than PyTorch on the same recipe (docs/BENCHMARKS.md).
pub fn batch_norm2d(p: nn::Path, c: i64) -> BatchNorm2d {
    batch_norm2d_with(p, c, 1e-5, 0.1)
}

/// `nn.BatchNorm2d(c, eps, momentum)`, for the families that change them (EfficientNetV2:
/// eps 1e-3; MobileNetV3: eps 1e-3, momentum 0.01).
pub fn batch_norm2d_with(p: nn::Path, c: i64, eps: f64, momentum: f64) -> BatchNorm2d {
    let cfg = nn::BatchNormConfig {
        ws_init: nn::Init::Const(1.0),
        eps,
        momentum,
        ..Default::default()
    };
    BatchNorm2d {
        bn: nn::batch_norm2d(p, c, cfg),
        eps,
        momentum,
        fused: false,
    }
}

impl BatchNorm2d {
    /// This layer's `forward_relu` tries the fused kernels (`--fused-norm`).
    pub fn fused(mut self, on: bool) -> Self {
        self.fused = on;
        self
    }

    /// A frozen BatchNorm (`--freeze`) stays in eval mode: its running statistics are kept.
    fn training(&self, train: bool) -> bool {
        train && self.bn.ws.as_ref().is_none_or(|w| w.requires_grad())
    }

    /// relu(self(x) [+ residual]): the end of a ResNet block's branch. Through the fused kernels
    /// when this layer has them on, trains, is not synchronised, and they cover `x`; otherwise
    /// the unfused ops, exactly as the model wrote them before.
    pub fn forward_relu(&self, x: &Tensor, residual: Option<&Tensor>, train: bool) -> Tensor {
        if self.fused && self.training(train) && SYNC_GROUP.load(Ordering::SeqCst).is_null() {
            if let (Some(w), Some(b)) = (&self.bn.ws, &self.bn.bs) {
                let stats = [w, b, &self.bn.running_mean, &self.bn.running_var];
                if let Some(y) = super::fused::bn_relu(x, stats, residual, self.momentum, self.eps) {
                    return y;
                }
            }
        }
        let y = self.forward_t(x, train);
        match residual {
            Some(r) => (y + r).relu(),
            None => y.relu(),
        }
    }
}

impl ModuleT for BatchNorm2d {
    fn forward_t(&self, x: &Tensor, train: bool) -> Tensor {
        let train = self.training(train);
        let pg = SYNC_GROUP.load(Ordering::SeqCst);
        if !train || pg.is_null() {
            return self.bn.forward_t(x, train);
        }
        let (Some(w), Some(b)) = (&self.bn.ws, &self.bn.bs) else {
            return self.bn.forward_t(x, train);
        };
        let out = unsafe {
            rt_sync_batch_norm(
                pg,
                ptr(x),
                ptr(w),
                ptr(b),
                ptr(&self.bn.running_mean),
                ptr(&self.bn.running_var),
                self.momentum,
                self.eps,
            )
        };
        // A failed collective inside a forward pass has no Result to travel through (ModuleT):
        // it ends the process with the reason; the launcher then stops the other ranks.
        if out.is_null() {
            eprintln!("error: SyncBatchNorm: {}", crate::shim::last_error_message());
            std::process::exit(1);
        }
        unsafe { Tensor::from_ptr(out) }
    }
}
