//! Optimizers (tch's SGD, Adam, AdamW, with PyTorch's update rules) and global-norm clipping.
use anyhow::Result;
use tch::nn::{self, OptimizerConfig};
use tch::Tensor;

use crate::config::{OptimizerKind, TrainConfig};

pub fn build(cfg: &TrainConfig, vs: &nn::VarStore) -> Result<nn::Optimizer> {
    let wd = cfg.weight_decay;
    Ok(match cfg.optimizer {
        OptimizerKind::Sgd => nn::Sgd {
            momentum: cfg.momentum,
            dampening: 0.0,
            wd,
            nesterov: cfg.nesterov,
        }
        .build(vs, cfg.lr)?,
        OptimizerKind::Adam => nn::Adam {
            wd,
            ..Default::default()
        }
        .build(vs, cfg.lr)?,
        OptimizerKind::Adamw => nn::AdamW {
            wd,
            ..Default::default()
        }
        .build(vs, cfg.lr)?,
    })
}

/// `torch.nn.utils.clip_grad_norm_`: scales all gradients by min(1, max_norm / (norm + 1e-6))
/// without reading the norm back to the host. Returns the total norm (a 0-d device tensor).
pub fn clip_grad_norm(params: &[Tensor], max_norm: f64) -> Tensor {
    let grads: Vec<Tensor> = params.iter().map(|p| p.grad()).filter(|g| g.defined()).collect();
    if grads.is_empty() {
        return Tensor::from(0.0f32);
    }
    let norms: Vec<Tensor> = grads.iter().map(|g| g.norm().unsqueeze(0)).collect();
    let total = Tensor::cat(&norms, 0).norm();
    let coef = (Tensor::from(max_norm).to_device(total.device()) / (&total + 1e-6)).clamp_max(1.0);
    tch::no_grad(|| {
        for g in &grads {
            let _ = g.shallow_clone().g_mul_(&coef.to_kind(g.kind()));
        }
    });
    total
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind};

    #[test]
    fn clipping_scales_to_max_norm_and_leaves_small_gradients() {
        let a = Tensor::zeros([2], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        let b = Tensor::zeros([1], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        // grads (3, 0) and (4): total norm 5.
        ((&a * Tensor::from_slice(&[3.0f32, 0.0])).sum(Kind::Float) + (&b * 4.0).sum(Kind::Float)).backward();
        let n = clip_grad_norm(&[a.shallow_clone(), b.shallow_clone()], 1.0);
        assert!((n.double_value(&[]) - 5.0).abs() < 1e-5);
        assert!((a.grad().double_value(&[0]) - 0.6).abs() < 1e-5);
        assert!((b.grad().double_value(&[0]) - 0.8).abs() < 1e-5);
        let _ = clip_grad_norm(&[a.shallow_clone(), b.shallow_clone()], 10.0);
        assert!((a.grad().double_value(&[0]) - 0.6).abs() < 1e-5);
    }
}
