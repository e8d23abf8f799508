//! Exponential moving average of the weights (`--ema DECAY`), as torchvision's reference
//! `ExponentialMovingAverage` (torch AveragedModel with use_buffers=True): after every optimizer
//! step, ema = decay · ema + (1 − decay) · current for every floating-point parameter and
//! buffer (BatchNorm running statistics included); integer buffers are copied.
use anyhow::Result;
use tch::Tensor;

use crate::model::Model;

pub struct Ema {
    /// A model of the same architecture holding the averages: evaluate and save it as any model.
    pub model: Model,
    decay: f64,
    /// (current, average) pairs in name order.
    pairs: Vec<(Tensor, Tensor)>,
}

impl Ema {
    /// Starts the average at the model's current weights.
    pub fn new(model: &Model, num_classes: i64, decay: f64) -> Result<Self> {
        let mut ema = Model::build(model.kind, num_classes, model.vs.device(), model.opts);
        ema.names = model.names;
        let (src, dst) = (model.vs.variables(), ema.vs.variables());
        let mut names: Vec<&String> = src.keys().collect();
        names.sort();
        let pairs: Vec<(Tensor, Tensor)> = names
            .into_iter()
            .map(|n| (src[n].shallow_clone(), dst[n].shallow_clone()))
            .collect();
        tch::no_grad(|| {
            for (s, d) in &pairs {
                // Same memory format as the source (channels_last on CUDA), so updates are
                // element-wise over identical layouts.
                let mut d = d.shallow_clone();
                d.set_data(&s.detach().copy());
                let _ = d.set_requires_grad(false);
            }
        });
        ema.bn_batches = model.bn_batches;
        Ok(Ema {
            model: ema,
            decay,
            pairs,
        })
    }

    pub fn update(&mut self, bn_batches: i64) {
        tch::no_grad(|| {
            for (s, d) in &self.pairs {
                let mut d = d.shallow_clone();
                if d.is_floating_point() {
                    let _ = d.lerp_(s, 1.0 - self.decay);
                } else {
                    d.copy_(s);
                }
            }
        });
        self.model.bn_batches = bn_batches;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind};

    #[test]
    fn average_follows_the_decay_rule() {
        tch::manual_seed(0);
        let m = Model::new(crate::model::ModelKind::LeNet5, 3, Device::Cpu);
        let mut ema = Ema::new(&m, 3, 0.9).unwrap();
        let name = "fc3.weight";
        let before = m.vs.variables()[name].copy();
        tch::no_grad(|| {
            let _ = m.vs.variables()[name].shallow_clone().g_add_scalar_(1.0);
        });
        ema.update(1);
        let got = ema.model.vs.variables()[name].copy();
        let want = &before * 0.9 + (&before + 1.0) * 0.1;
        let diff = (got - want).abs().max().double_value(&[]);
        assert!(diff < 1e-6, "{diff}");
        assert_eq!(ema.model.bn_batches, 1);
        // The average has its own storage: changing the model leaves it alone.
        tch::no_grad(|| {
            let _ = m.vs.variables()[name].shallow_clone().g_add_scalar_(5.0);
        });
        let again = ema.model.vs.variables()[name].sum(Kind::Float).double_value(&[]);
        let before_sum = (&before * 0.9 + (&before + 1.0) * 0.1)
            .sum(Kind::Float)
            .double_value(&[]);
        assert!((again - before_sum).abs() < 1e-4);
    }
}
