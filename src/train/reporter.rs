//! Everything a training run prints or logs, on rank 0: the banner, the step lines (or the
//! progress bar), the epoch line, TensorBoard scalars, and the last words of the run.
use std::time::Instant;

use anyhow::Result;

use super::context::RankContext;
use super::dataset::TrainData;
use super::step::meter::{EpochMeter, EpochTotals};
use super::lifecycle::run_dir::RunDir;
use super::step::state::{RunState, Validation};
use super::step::trainer::Trainer;
use super::RunSummary;
use crate::config::TrainConfig;
use crate::data::source::Samples;
use crate::report::progress::EpochProgress;
use crate::report::tensorboard::EventWriter;
use crate::report::{plots, thumbnails, worst};
use crate::say;

pub struct Reporter {
    /// TensorBoard events, on rank 0.
    tb: Option<EventWriter>,
    /// For the pictures of the validations (TensorBoard's, report.html's).
    classes: Vec<String>,
    val: Samples,
    progress: Option<EpochProgress>,
    epochs: usize,
    log_every: usize,
    head_lr_mult: f64,
    monitor: &'static str,
    world: usize,
    started: Instant,
}

impl Reporter {
    /// Prints the banner; on rank 0 opens the TensorBoard log with the config as its first text.
    pub fn new(cfg: &TrainConfig, ctx: &RankContext, run_dir: &RunDir, t: &Trainer, data: &TrainData) -> Result<Self> {
        let tb = match ctx.is_main() {
            true => {
                let mut w = EventWriter::create(&run_dir.path)?;
                w.text("config", &format!("```toml\n{}\n```", cfg.to_toml()?), 0)?;
                Some(w)
            }
            false => None,
        };
        if let Some(d) = &ctx.dist {
            let pg = t.pg();
            say!(
                "distributed: {} ranks ({}), {:?}, master {}:{}, global batch {} = {} × {}, {} gradient buckets of ≤ {} MB all-reduced {} backward{}{}",
                pg.world_size,
                d.env.source,
                pg.backend,
                d.env.master_addr,
                d.env.master_port,
                cfg.batch_size,
                pg.world_size,
                ctx.rank_batch,
                t.ddp.buckets().len(),
                d.bucket_mb,
                if d.overlap { "during" } else { "after" },
                d.grad_compress.kind().map(|k| format!(", all-reduce in {k:?}")).unwrap_or_default(),
                if cfg.sync_bn { ", SyncBatchNorm" } else { "" }
            );
        }
        let accum = cfg.accum_steps;
        say!(
            "ringtrain: {} ({:.1}M parameters) on {:?}{}, {} classes, {} train / {} val images, {} steps per epoch{}, {} data workers",
            cfg.model,
            t.model.num_parameters() as f64 / 1e6,
            t.device(),
            match (t.amp, &t.scaler) {
                (Some(k), Some(s)) => format!(", autocast {k:?} with {} loss scaling", if s.state().dynamic { "dynamic" } else { "static" }),
                (Some(k), None) => format!(", autocast {k:?}"),
                _ => String::new(),
            },
            data.classes.len(),
            data.train.num_samples(),
            data.val.num_samples(),
            data.steps_per_epoch(),
            if accum > 1 { format!(" ({accum} micro-batches each)") } else { String::new() },
            data.workers
        );
        say!("data: {}", data.note);
        Ok(Reporter {
            tb,
            classes: data.classes.clone(),
            val: data.val.samples().clone(),
            progress: None,
            epochs: cfg.epochs,
            log_every: cfg.log_every,
            head_lr_mult: cfg.head_lr_mult,
            monitor: cfg.monitor.name(),
            world: ctx.world(),
            started: Instant::now(),
        })
    }

    pub fn start_epoch(&mut self, epoch: usize, steps_per_epoch: usize) {
        self.progress = Some(EpochProgress::new(
            epoch + 1,
            self.epochs,
            steps_per_epoch,
            self.log_every,
        ));
    }

    /// After an optimizer step: the loss is read back from the device only on the steps that
    /// show it (every `--log-every`), then logged and printed.
    pub fn step(&mut self, t: &Trainer, state: &RunState, meter: &EpochMeter) -> Result<()> {
        let progress = self.progress.as_ref().expect("an epoch started");
        let loss = progress.wants_loss(meter.steps).then(|| t.read_loss()).flatten();
        if let (Some(l), Some(tb)) = (loss, self.tb.as_mut()) {
            // The 0-based index of the step just taken, as `epoch * len(loader) + i` in PyTorch scripts.
            let step = state.global_step as i64 - 1;
            tb.scalar("train/loss", l, step)?;
            tb.scalar("train/lr", state.lr, step)?;
            if self.head_lr_mult != 1.0 {
                tb.scalar("train/lr_head", state.lr * self.head_lr_mult, step)?;
            }
        }
        progress.update(meter.steps, meter.seen() * self.world, loss, state.lr);
        Ok(())
    }

    /// Clears the epoch's progress bar.
    pub fn end_steps(&mut self) {
        if let Some(p) = self.progress.take() {
            p.finish();
        }
    }

    /// The epoch's line and TensorBoard scalars. `comm_share`: the all-reduce's share of rank
    /// 0's training time, when distributed.
    pub fn epoch(
        &mut self,
        state: &RunState,
        train: &EpochTotals,
        val: &Validation,
        comm_share: Option<f64>,
    ) -> Result<()> {
        let row = state.history.last().expect("the epoch is recorded");
        let (best_epoch, best_metric) = state.best.expect("set at the first epoch");
        let ev = &val.model;
        let unreadable = train.unreadable + ev.unreadable.len();
        if let Some(tb) = self.tb.as_mut() {
            let e = row.epoch as i64;
            for (tag, v) in [
                ("epoch/train_loss", row.train_loss),
                ("epoch/train_top1", row.train_top1),
                ("epoch/val_loss", ev.loss),
                ("epoch/val_top1", ev.top1),
                ("epoch/val_top5", ev.top5),
                ("epoch/val_macro_f1", row.val_macro_f1),
                ("epoch/lr", row.lr),
                ("epoch/images_per_s", row.images_per_s),
                ("epoch/seconds", row.seconds),
                ("epoch/allreduce_share", comm_share.unwrap_or(0.0)),
                ("epoch/amp_skipped_steps", row.skipped_steps as f64),
                ("epoch/unreadable_images", unreadable as f64),
            ] {
                tb.scalar(tag, v, e)?;
            }
            if let Some(e2) = &val.ema {
                tb.scalar("epoch/ema_val_top1", e2.top1, e)?;
            }
            validation_images(tb, &self.classes, &self.val, val, e)?;
            tb.flush()?;
        }
        say!(
            "epoch {}/{} {} | train loss {:.4} top1 {:.2}% | val loss {:.4} top1 {:.2}% top5 {:.2}%{} | lr {:.5} | {:.0} img/s{} | best {} {:.4} (epoch {})",
            row.epoch,
            self.epochs,
            crate::report::duration(row.seconds),
            row.train_loss,
            100.0 * row.train_top1,
            ev.loss,
            100.0 * ev.top1,
            100.0 * ev.top5,
            val.ema.as_ref().map(|e| format!(" (ema {:.2}%)", 100.0 * e.top1)).unwrap_or_default(),
            row.lr,
            row.images_per_s,
            comm_share.map(|c| format!(" (exposed all-reduce {:.1}% of rank 0's time)", 100.0 * c)).unwrap_or_default()
                + &if unreadable > 0 { format!(" | {unreadable} unreadable images skipped") } else { String::new() },
            self.monitor,
            best_metric,
            best_epoch
        );
        Ok(())
    }

    /// A stop request ended the run; its checkpoint is saved.
    /// `requeued`: the job was handed back to Slurm (`--requeue`), an end with exit code 0.
    pub fn interrupted(&mut self, state: &RunState, run_dir: &RunDir, sig: i32, requeued: bool) -> RunSummary {
        self.end_steps();
        say!(
            "stopped by signal {sig}: checkpoint saved in {}; continue with --resume auto",
            run_dir.path.join("last").display()
        );
        RunSummary {
            best_epoch: state.best.map(|b| b.0).unwrap_or(0),
            report: None,
            interrupted: Some(sig).filter(|_| !requeued),
        }
    }

    /// The run's end: the best epoch's report written, and the last line.
    pub fn finish(&mut self, state: &RunState, run_dir: &RunDir) -> Result<RunSummary> {
        let report = run_dir.write_final_report(state, &self.val)?;
        let (best_epoch, _) = state.best.expect("at least one epoch ran");
        let best_top1 = state.best_eval.as_ref().map_or(0.0, |e| e.top1);
        say!(
            "done in {}: best {} at epoch {best_epoch} (val top1 {:.2}%); run directory {}",
            crate::report::duration(self.started.elapsed().as_secs_f64()),
            self.monitor,
            100.0 * best_top1,
            run_dir.path.display()
        );
        Ok(RunSummary {
            best_epoch,
            report: Some(report),
            interrupted: None,
        })
    }
}

/// Validation images in TensorBoard's grid of the highest losses.
const WORST_IN_TENSORBOARD: usize = 16;

/// The epoch's confusion matrix and a grid of its highest-loss validation images, as
/// TensorBoard image summaries.
fn validation_images(tb: &mut EventWriter, classes: &[String], samples: &Samples, val: &Validation, epoch: i64) -> Result<()> {
    let title = format!("validation, epoch {epoch}");
    let png = plots::confusion_heatmap_png(classes, &val.report.confusion, &title)?;
    let (w, h) = image::ImageReader::new(std::io::Cursor::new(&png)).with_guessed_format()?.into_dimensions()?;
    tb.image("val/confusion_matrix", &png, w, h, epoch)?;
    let worst: Vec<_> = worst::by_loss(&val.model).into_iter().take(WORST_IN_TENSORBOARD).collect();
    if !worst.is_empty() {
        let grid = thumbnails::worst_grid(samples, &worst, classes, 4)?;
        tb.image("val/highest_loss_images", &thumbnails::jpeg(&grid)?, grid.width(), grid.height(), epoch)?;
    }
    Ok(())
}
