//! Learning rate per optimizer step: linear warm-up, then cosine annealing (PyTorch's
//! CosineAnnealingLR closed form, per step), polynomial decay (MLPerf's), step or multistep
//! decay, constant, or ReduceLROnPlateau (per epoch, on the monitored metric); optionally a
//! constant LR from a given epoch on; with `--sched-interval epoch` held at each epoch's value
//! at its first step. Everything but the plateau's state is a pure function of the step, so a resumed
//! run needs only the step count and `PlateauState`.
use serde::{Deserialize, Serialize};

use crate::config::{SchedInterval, SchedKind, TrainConfig, WarmupMethod};

#[derive(Debug, Clone)]
pub struct LrSchedule {
    kind: SchedKind,
    base: f64,
    eta_min: f64,
    steps_per_epoch: usize,
    /// Once an epoch: every step takes the value of its epoch's first step.
    per_epoch: bool,
    warmup_steps: usize,
    /// torchvision's warm-up (method, factor); None: ringtrain's ramp.
    warmup_shape: Option<(WarmupMethod, f64)>,
    /// End of the cosine period (of the polynomial decay), in steps from the start of training.
    cosine_steps: usize,
    poly_power: f64,
    step_size: usize,
    gamma: f64,
    milestones: Vec<usize>,
    constant_from_step: Option<usize>,
    constant_lr: f64,
    /// lr-find's exponential ramp, which replaces everything above.
    ramp: Option<ExpRamp>,
}

/// The learning-rate range test's ramp: step i of n takes start·(end/start)^(i/(n-1)), so the
/// LR grows by the same factor every step, from `start` at the first to `end` at the last.
#[derive(Debug, Clone, Copy)]
pub struct ExpRamp {
    pub start: f64,
    pub end: f64,
    pub steps: usize,
}

impl ExpRamp {
    pub fn lr_at(&self, step: usize) -> f64 {
        let t = step as f64 / (self.steps.max(2) - 1) as f64;
        self.start * (self.end / self.start).powf(t)
    }
}

impl LrSchedule {
    pub fn new(cfg: &TrainConfig, steps_per_epoch: usize) -> Self {
        let spe = steps_per_epoch.max(1);
        LrSchedule {
            kind: cfg.sched,
            base: cfg.lr,
            eta_min: cfg.eta_min,
            steps_per_epoch: spe,
            per_epoch: cfg.sched_interval == SchedInterval::Epoch,
            warmup_steps: (cfg.warmup_epochs * spe as f64).round() as usize,
            warmup_shape: cfg.lr_warmup_method.map(|m| (m, cfg.lr_warmup_decay.unwrap_or(0.01))),
            cosine_steps: (cfg.t_max() * spe as f64).round() as usize,
            poly_power: cfg.poly_power,
            step_size: cfg.step_size,
            gamma: cfg.gamma,
            milestones: cfg.milestones.clone(),
            constant_from_step: cfg.constant_lr_from_epoch.map(|e| (e - 1) * spe),
            constant_lr: cfg.constant_lr.unwrap_or(cfg.eta_min),
            ramp: None,
        }
    }

    /// The schedule of lr-find: `ramp` alone.
    pub fn ramp(cfg: &TrainConfig, ramp: ExpRamp) -> Self {
        LrSchedule {
            ramp: Some(ramp),
            ..LrSchedule::new(cfg, 1)
        }
    }

    /// The learning rate for global step `step` (0-based); `plateau` scales it for
    /// ReduceLROnPlateau (1 otherwise).
    pub fn lr_at(&self, step: usize, plateau: &PlateauState) -> f64 {
        if let Some(r) = &self.ramp {
            return r.lr_at(step);
        }
        let step = match self.per_epoch {
            true => step - step % self.steps_per_epoch,
            false => step,
        };
        if self.constant_from_step.is_some_and(|s| step >= s) {
            return self.constant_lr;
        }
        if step < self.warmup_steps {
            // Per step, torchvision's per-epoch LinearLR and ConstantLR meet at each epoch's
            // first step; the linear one rises between them.
            let done = step as f64 / self.warmup_steps as f64;
            return match self.warmup_shape {
                None => self.base * (step + 1) as f64 / self.warmup_steps as f64,
                Some((WarmupMethod::Linear, d)) => self.base * (d + (1.0 - d) * done),
                Some((WarmupMethod::Constant, d)) => self.base * d,
            };
        }
        match self.kind {
            SchedKind::Constant => self.base,
            SchedKind::Plateau => plateau.lr.unwrap_or(self.base),
            SchedKind::Multistep => {
                let epoch = step / self.steps_per_epoch;
                let passed = self.milestones.iter().filter(|&&m| epoch >= m).count();
                self.base * self.gamma.powi(passed as i32)
            }
            SchedKind::Step => {
                // torchvision's SequentialLR starts StepLR at the warm-up's end.
                let from = if self.warmup_shape.is_some() { self.warmup_steps } else { 0 };
                let epoch = (step - from) / self.steps_per_epoch;
                self.base * self.gamma.powi((epoch / self.step_size) as i32)
            }
            SchedKind::Cosine => {
                let span = self.cosine_steps.saturating_sub(self.warmup_steps).max(1) as f64;
                let t = ((step - self.warmup_steps) as f64 / span).min(1.0);
                self.eta_min + (self.base - self.eta_min) * 0.5 * (1.0 + (std::f64::consts::PI * t).cos())
            }
            SchedKind::Poly => {
                let span = self.cosine_steps.saturating_sub(self.warmup_steps).max(1) as f64;
                let t = ((step - self.warmup_steps) as f64 / span).min(1.0);
                self.eta_min + (self.base - self.eta_min) * (1.0 - t).powf(self.poly_power)
            }
        }
    }
}

/// torch.optim.lr_scheduler.ReduceLROnPlateau's state (threshold_mode "rel").
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PlateauState {
    /// The reduced LR; None until the first reduction (the schedule's base LR).
    pub lr: Option<f64>,
    /// Best metric so far; None before the first epoch.
    pub best: Option<f64>,
    pub num_bad_epochs: usize,
    pub cooldown_counter: usize,
}

/// ReduceLROnPlateau's settings.
#[derive(Debug, Clone, Copy)]
pub struct Plateau {
    pub minimise: bool,
    pub factor: f64,
    pub patience: usize,
    pub threshold: f64,
    pub cooldown: usize,
    pub min_lr: f64,
    pub base: f64,
}

impl Plateau {
    pub fn new(cfg: &TrainConfig) -> Self {
        Plateau {
            minimise: cfg.monitor.minimise(),
            factor: cfg.plateau_factor,
            patience: cfg.plateau_patience,
            threshold: cfg.plateau_threshold,
            cooldown: cfg.plateau_cooldown,
            min_lr: cfg.min_lr,
            base: cfg.lr,
        }
    }

    /// `scheduler.step(metric)` at the end of an epoch. Returns true when the LR was reduced.
    pub fn step(&self, s: &mut PlateauState, metric: f64) -> bool {
        let better = match s.best {
            None => true,
            Some(b) if self.minimise => metric < b * (1.0 - self.threshold),
            Some(b) => metric > b * (1.0 + self.threshold),
        };
        if better {
            s.best = Some(metric);
            s.num_bad_epochs = 0;
        } else {
            s.num_bad_epochs += 1;
        }
        if s.cooldown_counter > 0 {
            s.cooldown_counter -= 1;
            s.num_bad_epochs = 0;
        }
        if s.num_bad_epochs > self.patience {
            let old = s.lr.unwrap_or(self.base);
            let new = (old * self.factor).max(self.min_lr);
            s.cooldown_counter = self.cooldown;
            s.num_bad_epochs = 0;
            if old - new > 1e-8 {
                s.lr = Some(new);
                return true;
            }
        }
        false
    }
}

/// Whether `metric` beats the best so far (strictly; the first value always does).
pub fn improves(best: Option<f64>, metric: f64, minimise: bool) -> bool {
    best.is_none_or(|b| if minimise { metric < b } else { metric > b })
}

/// Early stopping: `patience` epochs have passed since the best one.
pub fn should_stop_early(epochs_done: usize, best_epoch: usize, patience: Option<usize>) -> bool {
    patience.is_some_and(|p| epochs_done - best_epoch >= p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn early_stopping_on_a_scripted_metric_sequence() {
        // val_top1 per epoch; the best is epoch 5 (0.7): with patience 2, stop after epoch 7.
        let seq = [0.5, 0.6, 0.6, 0.65, 0.7, 0.65, 0.64, 0.9];
        let (mut best, mut best_epoch, mut stopped) = (None, 0, None);
        for (i, &m) in seq.iter().enumerate() {
            if improves(best, m, false) {
                (best, best_epoch) = (Some(m), i + 1);
            }
            if should_stop_early(i + 1, best_epoch, Some(2)) {
                stopped = Some(i + 1);
                break;
            }
        }
        assert_eq!((stopped, best_epoch), (Some(7), 5));
        // Minimising a loss: an equal value is no improvement.
        assert!(!improves(Some(0.3), 0.3, true) && improves(Some(0.3), 0.29, true));
        assert!(!should_stop_early(9, 5, None));
    }

    impl LrSchedule {
        fn lr_at0(&self, step: usize) -> f64 {
            self.lr_at(step, &PlateauState::default())
        }
    }

    #[test]
    fn multistep_and_constant_from_epoch() {
        let c = TrainConfig {
            milestones: vec![2, 4],
            constant_lr_from_epoch: Some(6),
            constant_lr: Some(1e-6),
            ..cfg(SchedKind::Multistep, 0.0)
        };
        let s = LrSchedule::new(&c, 10);
        let lrs: Vec<f64> = (0..7).map(|e| s.lr_at0(e * 10)).collect();
        let want = [0.1, 0.1, 0.05, 0.05, 0.025, 1e-6, 1e-6]; // epoch 6 is index 5
        for (got, want) in lrs.iter().zip(want) {
            assert!((got - want).abs() < 1e-15, "{lrs:?}");
        }
    }

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
        assert_eq!(s.lr_at0(0), 0.1);
        assert!((s.lr_at0(50) - (0.001 + 0.099 * 0.5)).abs() < 1e-12);
        assert!((s.lr_at0(100) - 0.001).abs() < 1e-12);
        assert!(s.lr_at0(99) > 0.001 && s.lr_at0(99) < 0.0011);
    }

    #[test]
    fn warmup_ramps_linearly_then_cosine_starts_at_base() {
        let s = LrSchedule::new(&cfg(SchedKind::Cosine, 2.0), 10);
        assert!((s.lr_at0(0) - 0.005).abs() < 1e-12);
        assert!((s.lr_at0(19) - 0.1).abs() < 1e-12);
        assert_eq!(s.lr_at0(20), 0.1);
        assert!(s.lr_at0(21) < 0.1);
    }

    /// MLPerf's ResNet-50 LARS schedule, written as its reference writes it: linear warm-up, then
    /// (base - end)·(1 - (step - warmup) / (total - warmup))^power + end, per step.
    #[test]
    fn poly_decays_as_mlperfs_formula() {
        let (base, end, spe) = (2.5, 1e-4, 7);
        for (power, warmup, epochs) in [(2.0, 2.0, 10), (1.0, 0.0, 5), (3.5, 1.0, 4)] {
            let c = TrainConfig {
                lr: base,
                eta_min: end,
                poly_power: power,
                ..cfg(SchedKind::Poly, warmup)
            };
            let c = TrainConfig { epochs, ..c };
            let s = LrSchedule::new(&c, spe);
            let (w, total) = ((warmup * spe as f64) as usize, epochs * spe);
            for step in 0..total {
                let want = match step < w {
                    true => base * (step + 1) as f64 / w as f64,
                    false => {
                        let left = 1.0 - (step - w) as f64 / (total - w) as f64;
                        (base - end) * left.powf(power) + end
                    }
                };
                let got = s.lr_at0(step);
                assert!((got - want).abs() <= 1e-14 * base, "power {power} step {step}: {got} vs {want}");
            }
            assert_eq!(s.lr_at0(w), base, "the decay starts at the peak");
            assert!((s.lr_at0(total + 3) - end).abs() < 1e-15, "after t_max: eta_min");
        }
    }

    #[test]
    fn step_decay_halves_every_step_size_epochs() {
        let s = LrSchedule::new(&cfg(SchedKind::Step, 0.0), 10);
        assert_eq!(s.lr_at0(29), 0.1);
        assert_eq!(s.lr_at0(30), 0.05);
        assert_eq!(s.lr_at0(60), 0.025);
    }
}
