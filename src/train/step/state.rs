//! What evolves over the run besides the tensors, and goes into every checkpoint's state.json:
//! the step count, the schedule's plateau state, the epochs' metrics and the best epoch.
use crate::config::{Metric, SchedKind, TrainConfig};
use crate::report::classification::ClassificationReport;
use crate::report::metrics_csv::EpochRow;
use crate::say;

use super::eval::EvalResult;
use super::meter::{EpochPosition, EpochTotals};
use super::schedule::{self, Plateau, PlateauState};

#[derive(Default)]
pub struct RunState {
    /// Optimizer steps taken since the start of the run.
    pub global_step: usize,
    pub plateau: PlateauState,
    pub history: Vec<EpochRow>,
    /// (epoch, value of the monitored metric), and that epoch's validation for the final report.
    pub best: Option<(usize, f64)>,
    pub best_eval: Option<EvalResult>,
    /// The learning rate of the last step (at an epoch's start, of its first; see `start_epoch`).
    pub lr: f64,
    /// The first epoch to train (0-based), and how far it went when resumed inside it.
    pub first_epoch: usize,
    /// Set from a checkpoint saved inside an epoch (`CheckpointState::run_state`).
    pub(crate) mid_epoch: Option<EpochPosition>,
}

/// One epoch's validation: of the model and, with `--ema`, of the moving average.
pub struct Validation {
    pub model: EvalResult,
    /// The model's per-class report (its macro F1 may be the monitored metric).
    pub report: ClassificationReport,
    pub ema: Option<EvalResult>,
}

impl RunState {
    /// Where the next epoch starts: at its beginning, or where the checkpoint left it. Sets the
    /// learning rate its row reports until a step replaces it: `next_lr`, the first step's,
    /// except in an epoch resumed after some of its steps, which keeps the last one's (a stop at
    /// the epoch's last step leaves no step to take, and the next step's rate would be reported).
    pub fn start_epoch(&mut self, next_lr: f64) -> EpochPosition {
        let pos = self.mid_epoch.take().unwrap_or_default();
        self.lr = pos.lr.unwrap_or(next_lr);
        pos
    }

    /// Whether a periodic save is due after this step: `--save-every-steps` by the step count,
    /// `--save-every-minutes` by the clock (`minutes_due`, agreed by the ranks). Not at an
    /// epoch's last step: the epoch's end saves anyway.
    pub fn save_due(&self, cfg: &TrainConfig, minutes_due: bool, steps_done: usize, steps_per_epoch: usize) -> bool {
        let by_steps = cfg.save_every_steps.is_some_and(|n| self.global_step % n == 0);
        (by_steps || minutes_due) && steps_done < steps_per_epoch
    }

    /// Records a finished epoch (0-based `epoch`); returns whether it is the best so far.
    pub fn end_epoch(
        &mut self,
        cfg: &TrainConfig,
        epoch: usize,
        train: &EpochTotals,
        val: &Validation,
        seconds: f64,
    ) -> bool {
        let ev = &val.model;
        self.history.push(EpochRow {
            epoch: epoch + 1,
            train_loss: train.loss,
            train_top1: train.top1,
            val_loss: ev.loss,
            val_top1: ev.top1,
            val_top5: ev.top5,
            lr: self.lr,
            seconds,
            images_per_s: train.seen as f64 / train.seconds,
            skipped_steps: train.skipped_steps,
            val_macro_f1: val.report.macro_avg.f1,
            ema_val_top1: val.ema.as_ref().map(|e| e.top1),
        });
        let metric = match cfg.monitor {
            Metric::ValTop1 => ev.top1,
            Metric::ValTop5 => ev.top5,
            Metric::ValLoss => ev.loss,
            Metric::ValMacroF1 => val.report.macro_avg.f1,
        };
        let improved = schedule::improves(self.best.map(|b| b.1), metric, cfg.monitor.minimise());
        if improved {
            self.best = Some((epoch + 1, metric));
            self.best_eval = Some(ev.clone());
        }
        if cfg.sched == SchedKind::Plateau && Plateau::new(cfg).step(&mut self.plateau, metric) {
            say!(
                "ReduceLROnPlateau: {} did not improve for {} epochs; lr now {:.3e}",
                cfg.monitor.name(),
                cfg.plateau_patience + 1,
                self.plateau.lr.unwrap_or(cfg.lr)
            );
        }
        improved
    }

    /// `--early-stop-patience`: whether the monitored metric has stalled long enough.
    pub fn should_stop_early(&self, cfg: &TrainConfig) -> bool {
        let (Some((best_epoch, best_metric)), Some(last)) = (self.best, self.history.last()) else {
            return false;
        };
        let stop = schedule::should_stop_early(last.epoch, best_epoch, cfg.early_stop_patience);
        if stop {
            say!(
                "early stopping: {} has not improved for {} epochs (best {best_metric:.4} at epoch {best_epoch})",
                cfg.monitor.name(),
                last.epoch - best_epoch
            );
        }
        stop
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn periodic_saves_come_inside_an_epoch_only() {
        let cfg = TrainConfig {
            save_every_steps: Some(2),
            ..Default::default()
        };
        let at = |global_step| RunState {
            global_step,
            ..Default::default()
        };
        // (state, --save-every-minutes due, steps done in the epoch of 5) → save?
        for (st, minutes_due, done, want) in [
            (at(4), false, 2, true),  // every 2nd step
            (at(3), false, 1, false), // not a 2nd step
            (at(3), true, 1, true),   // the clock
            (at(4), false, 5, false), // the epoch's last step: its end saves
            (at(5), true, 5, false),
        ] {
            assert_eq!(st.save_due(&cfg, minutes_due, done, 5), want, "{:?}", (st.global_step, minutes_due, done));
        }
    }

    #[test]
    fn a_resumed_epoch_reports_its_last_steps_lr_until_it_takes_another() {
        let mut st = RunState::default();
        st.start_epoch(0.1);
        assert_eq!(st.lr, 0.1, "a new epoch: its first step's");
        let mid = EpochPosition {
            steps: 5,
            lr: Some(0.03),
            ..Default::default()
        };
        st.mid_epoch = Some(mid);
        assert_eq!(st.start_epoch(0.02).steps, 5);
        assert_eq!(st.lr, 0.03, "resumed after 5 steps: the fifth's, not the sixth's");
        st.start_epoch(0.02);
        assert_eq!(st.lr, 0.02, "the position is used once");
    }
}
