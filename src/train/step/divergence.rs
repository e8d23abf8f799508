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
    /// fp32 and bf16: the global step (1-based) of the first non-finite loss on this rank, +inf
    /// while there is none: in f64 so that one MIN all-reduce gives the earliest over ranks
    /// (exact below 2^53).
    first_bad_step: Tensor,
    /// fp16: steps skipped in a row so far, and the step that began them. The skip decision is
    /// already the same on every rank (the scaler all-reduces its inf check), so these are too.
    skipped_in_a_row: Tensor,
    skips_began_at: Tensor,
    fp16: bool,
}

const HINT: &str = "lower --lr, or add --warmup-epochs or --clip-grad-norm, then --resume";

impl DivergenceGuard {
    pub fn new(device: Device, fp16: bool) -> Self {
        let zero = || Tensor::zeros([1], (Kind::Int64, device));
        DivergenceGuard {
            first_bad_step: Tensor::full([1], f64::INFINITY, (Kind::Double, device)),
            skipped_in_a_row: zero(),
            skips_began_at: zero(),
            fp16,
        }
    }

    /// Records optimizer step `step` (1-based): under fp16 whether the scaler skipped it
    /// (`skipped`, what fp16's check reads), otherwise whether its loss was finite.
    pub fn record(&mut self, step: usize, loss: &Tensor, skipped: Option<&Tensor>) {
        tch::no_grad(|| match skipped {
            Some(s) => {
                let s = s.reshape([1]).gt(0).to_kind(Kind::Int64);
                let starts = self.skipped_in_a_row.eq(0).to_kind(Kind::Int64) * &s;
                self.skips_began_at = &self.skips_began_at * (1 - &starts) + &starts * step as i64;
                self.skipped_in_a_row = (&self.skipped_in_a_row + 1) * &s;
            }
            None => {
                let finite = loss.isfinite().reshape([1]);
                let here = self
                    .first_bad_step
                    .full_like(f64::INFINITY)
                    .where_self(&finite, &self.first_bad_step.full_like(step as f64));
                self.first_bad_step = self.first_bad_step.minimum(&here);
            }
        });
    }

    /// Reads the record and errors if the run has diverged; on every rank at the same steps, as
    /// it may all-reduce. `last_good` names the checkpoint left to resume from.
    pub fn check(&self, pg: &ProcessGroup, last_good: &str) -> Result<()> {
        if self.fp16 {
            let skipped = self.skipped_in_a_row.int64_value(&[0]);
            if skipped >= FP16_MAX_SKIPPED_IN_A_ROW {
                return Err(user_error(format!(
                    "fp16: {skipped} steps in a row had NaN or infinite gradients (since step {}): training \
                     stopped, nothing saved after it; last good checkpoint: {last_good} ({HINT}, or --amp bf16)",
                    self.skips_began_at.int64_value(&[0])
                )));
            }
            return Ok(());
        }
        let first = self.first_bad_step.copy();
        pg.all_reduce(&first, ReduceOp::Min)?;
        let first = first.double_value(&[0]);
        if first.is_finite() {
            return Err(user_error(format!(
                "the loss became NaN or infinite at step {first}: training stopped, nothing saved after it; \
                 last good checkpoint: {last_good} ({HINT})"
            )));
        }
        Ok(())
    }
}
