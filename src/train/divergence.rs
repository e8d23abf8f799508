//! A diverged run stops instead of training on NaN weights, without a host synchronisation per
//! step: each step records on the device whether its loss was finite and how many steps in a
//! row the fp16 scaler has skipped; the host reads that record where it reads the loss anyway
//! (log lines, checkpoints, epoch ends), always before a checkpoint is written, so a checkpoint
//! never holds weights of a diverged run.
//!
//! - fp32 and bf16: the first non-finite loss stops the run.
//! - fp16: an overflow skips the step and the scaler backs off (PyTorch's GradScaler); the run
//!   stops only after `FP16_MAX_SKIPPED_IN_A_ROW` skipped steps in a row, by when the scale has
//!   shrunk by 2^100 and the loss itself is broken.
use anyhow::Result;
use tch::{Device, Kind, Tensor};

use crate::dist::process_group::{ProcessGroup, ReduceOp};
use crate::error::user_error;

pub const FP16_MAX_SKIPPED_IN_A_ROW: i64 = 100;

pub struct DivergenceGuard {
    /// The global step (1-based) of the first non-finite loss, or 0.
    first_bad_step: Tensor,
    /// fp16 steps skipped in a row so far, and the step that began the run of skips.
    skipped_in_a_row: Tensor,
    skips_began_at: Tensor,
    fp16: bool,
}

impl DivergenceGuard {
    pub fn new(device: Device, fp16: bool) -> Self {
        let zero = || Tensor::zeros([1], (Kind::Int64, device));
        DivergenceGuard {
            first_bad_step: zero(),
            skipped_in_a_row: zero(),
            skips_began_at: zero(),
            fp16,
        }
    }

    /// Records optimizer step `step` (1-based): its loss and, under fp16, whether it was skipped.
    pub fn record(&mut self, step: usize, loss: &Tensor, skipped: Option<&Tensor>) {
        tch::no_grad(|| {
            let step = step as i64;
            let bad = loss.isfinite().logical_not().reshape([1]).to_kind(Kind::Int64);
            let unset = self.first_bad_step.eq(0).to_kind(Kind::Int64);
            self.first_bad_step += bad * unset * step;
            if let Some(s) = skipped {
                let s = s.reshape([1]).gt(0).to_kind(Kind::Int64);
                let starts = self.skipped_in_a_row.eq(0).to_kind(Kind::Int64) * &s;
                self.skips_began_at = &self.skips_began_at * (1 - &starts) + &starts * step;
                self.skipped_in_a_row = (&self.skipped_in_a_row + 1) * &s;
            }
        });
    }

    /// Reads the record (agreed over ranks: the earliest bad step, the longest run of skips) and
    /// errors if the run has diverged. `last_good` names the checkpoint left to resume from.
    pub fn check(&self, pg: Option<&ProcessGroup>, last_good: &str) -> Result<()> {
        let mut v = Tensor::cat(&[&self.first_bad_step, &self.skipped_in_a_row, &self.skips_began_at], 0);
        if let Some(pg) = pg {
            // 0 means "none": map it above every step so that MIN finds the earliest bad one.
            let first = v.get(0);
            let first = first.where_self(&first.gt(0), &Tensor::from(i64::MAX).to_device(first.device()));
            let agreed = Tensor::cat(&[first.reshape([1]), -v.get(1).reshape([1])], 0).to_kind(Kind::Double);
            pg.all_reduce(&agreed, ReduceOp::Min)?;
            let a = Vec::<f64>::try_from(&agreed.to_device(Device::Cpu))?;
            let first = if a[0] >= i64::MAX as f64 { 0 } else { a[0] as i64 };
            v = Tensor::from_slice(&[first, -a[1] as i64, v.int64_value(&[2])]);
        }
        let v = Vec::<i64>::try_from(&v.to_device(Device::Cpu))?;
        let hint = "lower --lr, or add --warmup-epochs or --clip-grad-norm, then --resume";
        if !self.fp16 && v[0] > 0 {
            return Err(user_error(format!(
                "the loss became NaN or infinite at step {}: training stopped, nothing saved after it; \
                 last good checkpoint: {last_good} ({hint})",
                v[0]
            )));
        }
        if self.fp16 && v[1] >= FP16_MAX_SKIPPED_IN_A_ROW {
            return Err(user_error(format!(
                "fp16: {} steps in a row had NaN or infinite gradients (since step {}): training stopped, \
                 nothing saved after it; last good checkpoint: {last_good} ({hint}, or --amp bf16)",
                v[1], v[2]
            )));
        }
        Ok(())
    }
}
