//! An epoch's running sums, kept on the device so that no step waits for the host: loss,
//! correct predictions, fp16-skipped steps; images seen and unreadable images on the host. Read
//! (and summed over ranks) only for a checkpoint's position and for the epoch's totals.
use std::time::Instant;

use anyhow::Result;
use tch::{Kind, Tensor};

use serde::{Deserialize, Serialize};

use crate::dist::process_group::{ProcessGroup, ReduceOp};

/// How far an unfinished epoch went, so a resumed run takes exactly the remaining steps and
/// reports the same epoch figures. Sums are over all ranks.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct EpochPosition {
    /// Optimizer steps done in the epoch.
    pub steps: usize,
    #[serde(deserialize_with = "crate::serde_nan::f64_or_nan")]
    pub loss_sum: f64,
    #[serde(deserialize_with = "crate::serde_nan::f64_or_nan")]
    pub correct: f64,
    #[serde(deserialize_with = "crate::serde_nan::f64_or_nan")]
    pub seen: f64,
    #[serde(deserialize_with = "crate::serde_nan::f64_or_nan")]
    pub skipped_steps: f64,
    pub unreadable: usize,
    /// Training seconds spent in the epoch before the checkpoint.
    #[serde(deserialize_with = "crate::serde_nan::f64_or_nan")]
    pub seconds: f64,
    /// The learning rate of the last step before the checkpoint: the epoch's row reports it
    /// when no step is left (a stop at the epoch's last step). None in older checkpoints.
    #[serde(default)]
    pub lr: Option<f64>,
}

pub struct EpochMeter {
    loss_sum: Tensor,
    correct: Tensor,
    skipped_steps: Tensor,
    seen: usize,
    unreadable: usize,
    /// Optimizer steps done in the epoch (a resumed epoch's included).
    pub steps: usize,
    seconds_before: f64,
    started: Instant,
}

/// An epoch's figures over all ranks (padding repeats count as seen, as in DDP).
pub struct EpochTotals {
    pub loss: f64,
    pub top1: f64,
    pub seen: usize,
    /// fp16 steps skipped for an overflow.
    pub skipped_steps: usize,
    /// Training images that could not be read.
    pub unreadable: usize,
    /// Training seconds, without validation.
    pub seconds: f64,
}

impl EpochMeter {
    /// Sums from `pos` (a checkpoint's, over all ranks, so rank 0 alone carries them on).
    pub fn start(pos: EpochPosition, pg: &ProcessGroup) -> Self {
        let own = |v: f64| if pg.is_main() { v } else { 0.0 };
        let on_device = |v: f64| Tensor::from(own(v)).to_kind(Kind::Float).to_device(pg.device);
        EpochMeter {
            loss_sum: Tensor::from(own(pos.loss_sum)).to_device(pg.device),
            correct: Tensor::from(own(pos.correct)).to_device(pg.device),
            skipped_steps: on_device(pos.skipped_steps),
            seen: own(pos.seen) as usize,
            unreadable: if pg.is_main() { pos.unreadable } else { 0 },
            steps: pos.steps,
            seconds_before: pos.seconds,
            started: Instant::now(),
        }
    }

    /// A micro-batch's mean `loss` and its predictions `logits` against labels `y`.
    pub fn add_batch(&mut self, loss: &Tensor, logits: &Tensor, y: &Tensor) {
        let correct = tch::no_grad(|| logits.argmax(-1, false).eq_tensor(y).sum(Kind::Float));
        self.add_counts(loss, &correct, y.size()[0] as usize);
    }

    /// A micro-batch of `n` images by its mean `loss` and its `correct` count (device scalars).
    pub fn add_counts(&mut self, loss: &Tensor, correct: &Tensor, n: usize) {
        self.seen += n;
        tch::no_grad(|| {
            self.loss_sum += loss.detach() * n as f64;
            self.correct += correct;
        });
    }

    /// An optimizer step done; `found_inf` (fp16) says whether the scaler skipped it.
    pub fn end_step(&mut self, found_inf: Option<&Tensor>) {
        self.steps += 1;
        if let Some(f) = found_inf {
            self.skipped_steps += f.sum(Kind::Float);
        }
    }

    pub fn add_unreadable(&mut self, n: usize) {
        self.unreadable += n;
    }

    /// Images this rank has seen in the epoch.
    pub fn seen(&self) -> usize {
        self.seen
    }

    /// Seconds in the epoch so far, across a resume.
    pub fn seconds(&self) -> f64 {
        self.seconds_before + self.started.elapsed().as_secs_f64()
    }

    /// The sums over all ranks, in `EpochPosition`'s order: loss, correct, seen, skipped
    /// steps, unreadable images.
    fn sums(&self, pg: &ProcessGroup) -> Result<Vec<f64>> {
        let own = [
            self.loss_sum.double_value(&[]),
            self.correct.double_value(&[]),
            self.seen as f64,
            self.skipped_steps.double_value(&[]),
            self.unreadable as f64,
        ];
        pg.all_reduce_values(&own, ReduceOp::Sum)
    }

    /// Where the epoch stands after a step at `lr`, for a checkpoint inside it (a collective: on
    /// every rank).
    pub fn position(&self, pg: &ProcessGroup, lr: f64) -> Result<EpochPosition> {
        let v = self.sums(pg)?;
        Ok(EpochPosition {
            steps: self.steps,
            loss_sum: v[0],
            correct: v[1],
            seen: v[2],
            skipped_steps: v[3],
            unreadable: v[4] as usize,
            seconds: self.seconds(),
            lr: Some(lr),
        })
    }

    /// The epoch's figures (a collective: on every rank).
    pub fn totals(&self, pg: &ProcessGroup) -> Result<EpochTotals> {
        let seconds = self.seconds();
        let v = self.sums(pg)?;
        let n = v[2].max(1.0);
        Ok(EpochTotals {
            loss: v[0] / n,
            top1: v[1] / n,
            seen: v[2] as usize,
            skipped_steps: v[3].round() as usize,
            unreadable: v[4] as usize,
            seconds,
        })
    }
}
