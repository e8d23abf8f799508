//! Learning rate per optimizer step: linear warm-up, then cosine annealing (PyTorch's
//! CosineAnnealingLR closed form, per step), step decay or constant.
use crate::config::{SchedKind, TrainConfig};

#[derive(Debug, Clone)]
pub struct LrSchedule {
    kind: SchedKind,
    base: f64,
    eta_min: f64,
    steps_per_epoch: usize,
    warmup_steps: usize,
    /// End of the cosine period, in steps from the start of training.
    cosine_steps: usize,
    step_size: usize,
    gamma: f64,
}

impl LrSchedule {
    pub fn new(cfg: &TrainConfig, steps_per_epoch: usize) -> Self {
        let spe = steps_per_epoch.max(1);
        LrSchedule {
            kind: cfg.sched,
            base: cfg.lr,
            eta_min: cfg.eta_min,
            steps_per_epoch: spe,
            warmup_steps: (cfg.warmup_epochs * spe as f64).round() as usize,
            cosine_steps: (cfg.t_max() * spe as f64).round() as usize,
            step_size: cfg.step_size,
            gamma: cfg.gamma,
        }
    }

    /// The learning rate for global step `step` (0-based).
    pub fn lr_at(&self, step: usize) -> f64 {
        if step < self.warmup_steps {
            return self.base * (step + 1) as f64 / self.warmup_steps as f64;
        }
        match self.kind {
            SchedKind::Constant => self.base,
            SchedKind::Step => {
                let epoch = step / self.steps_per_epoch;
                self.base * self.gamma.powi((epoch / self.step_size) as i32)
            }
            SchedKind::Cosine => {
                let span = self.cosine_steps.saturating_sub(self.warmup_steps).max(1) as f64;
                let t = ((step - self.warmup_steps) as f64 / span).min(1.0);
                self.eta_min + (self.base - self.eta_min) * 0.5 * (1.0 + (std::f64::consts::PI * t).cos())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(kind: SchedKind, warmup: f64) -> TrainConfig {
        TrainConfig {
            sched: kind,
            lr: 0.1,
            epochs: 10,
            warmup_epochs: warmup,
            eta_min: 0.001,
            step_size: 3,
            gamma: 0.5,
            ..Default::default()
        }
    }

    #[test]
    fn cosine_without_warmup_matches_pytorch_closed_form() {
        let s = LrSchedule::new(&cfg(SchedKind::Cosine, 0.0), 10);
        assert_eq!(s.lr_at(0), 0.1);
        assert!((s.lr_at(50) - (0.001 + 0.099 * 0.5)).abs() < 1e-12);
        assert!((s.lr_at(100) - 0.001).abs() < 1e-12);
        assert!(s.lr_at(99) > 0.001 && s.lr_at(99) < 0.0011);
    }

    #[test]
    fn warmup_ramps_linearly_then_cosine_starts_at_base() {
        let s = LrSchedule::new(&cfg(SchedKind::Cosine, 2.0), 10);
        assert!((s.lr_at(0) - 0.005).abs() < 1e-12);
        assert!((s.lr_at(19) - 0.1).abs() < 1e-12);
        assert_eq!(s.lr_at(20), 0.1);
        assert!(s.lr_at(21) < 0.1);
    }

    #[test]
    fn step_decay_halves_every_step_size_epochs() {
        let s = LrSchedule::new(&cfg(SchedKind::Step, 0.0), 10);
        assert_eq!(s.lr_at(29), 0.1);
        assert_eq!(s.lr_at(30), 0.05);
        assert_eq!(s.lr_at(60), 0.025);
    }
}
