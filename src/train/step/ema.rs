//! Exponential moving average of the weights (`--ema DECAY`), as torchvision's reference
//! `ExponentialMovingAverage` (torch AveragedModel with use_buffers=True): after every optimizer
//! step, ema = decay · ema + (1 − decay) · current for every floating-point parameter and
//! buffer (BatchNorm running statistics included); integer buffers are copied.
//!
//! torchvision's `--model-ema` keeps the arithmetic and changes the timing (`TorchvisionTiming`):
//! the average follows the optimizer steps 0, N, 2N, … of each epoch, and an update copies the
//! weights instead while AveragedModel's count is 0: at the first update, and through the
//! warm-up's epochs, whose every update resets the count (`n_averaged.fill_(0)`), so the first
//! update after them copies too.
use anyhow::Result;
use tch::Tensor;

use crate::model::Model;

/// When torchvision's reference script updates its average, and when an update is a copy.
#[derive(Debug, Clone, Copy)]
pub struct TorchvisionTiming {
    /// Optimizer steps between updates, counted from each epoch's first (`--model-ema-steps`).
    pub steps: usize,
    /// Epochs (0-based, below this) whose updates reset the count (`--lr-warmup-epochs`).
    pub warmup_epochs: f64,
}

impl TorchvisionTiming {
    /// What the update after step `step_in_epoch` (0-based) of `epoch` does: None (no update),
    /// Some(true) (a copy) or Some(false) (the decay rule). A function of the position alone, so a
    /// resumed run needs no count: the count is 0 only before the first update after the
    /// warm-up, which is the first of the epoch after it (step 0 always updates).
    pub fn update_at(&self, epoch: usize, step_in_epoch: usize) -> Option<bool> {
        if !step_in_epoch.is_multiple_of(self.steps) {
            return None;
        }
        let first_after_warmup = self.warmup_epochs.ceil() as usize;
        Some((epoch as f64) < self.warmup_epochs || (epoch == first_after_warmup && step_in_epoch == 0))
    }
}

pub struct Ema {
    /// A model of the same architecture holding the averages: evaluate and save it as any model.
    pub model: Model,
    decay: f64,
    /// torchvision's `--model-ema` timing; None: every step, the decay rule (`--ema`).
    timing: Option<TorchvisionTiming>,
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
            timing: None,
            pairs,
        })
    }

    /// The average `cfg` asks for, if any: `--ema`'s, or `--model-ema`'s with torchvision's
    /// adjusted decay and timing.
    pub fn of_config(cfg: &crate::config::TrainConfig, model: &Model, num_classes: i64) -> Result<Option<Self>> {
        if let Some((decay, steps)) = cfg.model_ema_schedule() {
            let mut ema = Ema::new(model, num_classes, decay)?;
            ema.timing = Some(TorchvisionTiming {
                steps,
                warmup_epochs: cfg.warmup_epochs,
            });
            return Ok(Some(ema));
        }
        cfg.ema.map(|d| Ema::new(model, num_classes, d)).transpose()
    }

    /// After the optimizer step `step_in_epoch` (0-based) of `epoch`: the update its timing asks
    /// for (every step without one).
    pub fn update_after(&mut self, bn_batches: i64, epoch: usize, step_in_epoch: usize) {
        match self.timing.map(|t| t.update_at(epoch, step_in_epoch)) {
            None => self.update(bn_batches),
            Some(None) => {}
            Some(Some(copy)) => self.apply(bn_batches, copy),
        }
    }

    pub fn update(&mut self, bn_batches: i64) {
        self.apply(bn_batches, false);
    }

    /// ema = decay · ema + (1 − decay) · current, or ema = current when `copy`.
    fn apply(&mut self, bn_batches: i64, copy: bool) {
        tch::no_grad(|| {
            for (s, d) in &self.pairs {
                let mut d = d.shallow_clone();
                if d.is_floating_point() && !copy {
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
