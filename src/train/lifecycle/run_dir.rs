//! The run directory (`--out`) and everything written to it, by rank 0 alone: config.toml,
//! the checkpoints (last/, best/, epoch-NNNN/ with `--keep`), curves.png, per-epoch reports,
//! metrics.csv, and the final report of the best epoch. Each write is atomic; metrics.csv is
//! written last in an epoch, so a current metrics.csv tells a resumed run that the epoch's
//! outputs are all there.
use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};

use super::checkpoint::{self, CheckpointState};
use crate::atomic;
use crate::config::TrainConfig;
use crate::data::source::Samples;
use crate::error::user_error;
use crate::report::classification::ClassificationReport;
use crate::report::metrics_csv;
use crate::report::page::command_line;
use crate::report::plots;
use crate::report::PageContext;
use crate::say;
use crate::train::context::RankContext;
use crate::train::step::meter::EpochMeter;
use crate::train::step::state::{RunState, Validation};
use crate::train::step::trainer::Trainer;

/// A new run's first training batch, drawn (`train::first_batch`), shown in report.html.
pub const FIRST_BATCH: &str = "first-batch.png";

pub struct RunDir {
    pub path: PathBuf,
    /// The run's settings and classes, recorded in every checkpoint.
    cfg: TrainConfig,
    classes: Vec<String>,
    /// Rank 0 writes; the others only read.
    writes: bool,
    /// Ranks of the job, recorded in every checkpoint.
    world: usize,
    /// Restarts of the job's workers by a launcher (`--max-restarts`), in metrics.json.
    restarts: usize,
    /// When `last` was saved (or the run started), for `--save-every-minutes`.
    saved_at: Cell<Instant>,
}

impl RunDir {
    /// The first batch's picture, written by the rank that writes. None: its batch could not
    /// be read, which the training's own first step reports.
    pub fn write_first_batch(&self, png: impl FnOnce() -> Result<Option<Vec<u8>>>) -> Result<()> {
        if !self.writes {
            return Ok(());
        }
        match png() {
            Ok(Some(png)) => atomic::write_file(&self.path.join(FIRST_BATCH), &png),
            Ok(None) => Ok(()),
            // A picture never stops a run.
            Err(e) => Ok(crate::report::progress::warn(&format!("the first batch could not be drawn ({e:#}); training goes on"))),
        }
    }

    /// Makes `cfg.out` ready: an earlier run's outputs removed for a new run (preflight refused
    /// them unless `--overwrite`, or `--resume auto` found no checkpoint), temporary files of a
    /// killed write removed, config.toml written.
    pub fn prepare(cfg: &TrainConfig, classes: &[String], ctx: &RankContext, new_run: bool) -> Result<Self> {
        let (is_main, world) = (ctx.is_main(), ctx.world());
        let dir = RunDir {
            path: cfg.out.clone(),
            cfg: cfg.clone(),
            classes: classes.to_vec(),
            writes: is_main,
            world,
            restarts: ctx.restarts(),
            saved_at: Cell::new(Instant::now()),
        };
        if !is_main {
            return Ok(dir);
        }
        if new_run && dir.path.is_dir() {
            // So that no later `--resume auto` or reader mixes the earlier run's outputs with this one's.
            remove_earlier_run(&dir.path)?;
        }
        if dir.path.is_dir() {
            atomic::remove_stale_temps(&dir.path)?; // left by a process killed in the middle of a write
        }
        if let Err(e) = std::fs::create_dir_all(&dir.path) {
            return Err(user_error(format!("cannot create --out {}: {e}", dir.path.display())));
        }
        atomic::write_file(&dir.path.join("config.toml"), cfg.to_toml()?.as_bytes())?;
        Ok(dir)
    }

    /// Whether `--save-every-minutes` have passed since the last save (this rank's clock; the
    /// ranks agree on it before saving).
    pub fn minutes_due(&self) -> bool {
        self.cfg
            .save_every_minutes
            .is_some_and(|m| self.saved_at.get().elapsed().as_secs_f64() >= m * 60.0)
    }

    /// The checkpoint to resume from after a failure, as a message names it.
    pub fn last_good(&self) -> String {
        let last = self.path.join("last");
        match last.is_dir() {
            true => last.display().to_string(),
            false => "none yet".to_string(),
        }
    }

    /// A checkpoint inside epoch `epoch` (0-based), for a stop request or `--save-every-steps`;
    /// on every rank (the position is summed over ranks), and no rank leaves before it is saved.
    pub fn save_position(&self, t: &Trainer, state: &RunState, meter: &EpochMeter, epoch: usize) -> Result<()> {
        self.saved_at.set(Instant::now()); // on every rank: their clocks must agree on the next
        t.check_divergence(&self.last_good())?;
        let pos = meter.position(t.pg(), state.lr)?;
        if self.writes {
            let st = CheckpointState::of_run(
                state,
                &self.cfg,
                &self.classes,
                epoch,
                Some(pos),
                t.scaler.as_ref(),
                self.world,
            );
            self.save(&self.path.join("last"), t, &st)?;
        }
        t.pg().barrier()
    }

    /// An epoch's outputs: last/, best/ when it improved, epoch-NNNN/ with `--keep`, the curves,
    /// the per-epoch report when asked, and metrics.csv last.
    pub fn end_epoch(&self, t: &Trainer, state: &RunState, improved: bool, val: &Validation) -> Result<()> {
        self.saved_at.set(Instant::now());
        if !self.writes {
            return Ok(());
        }
        let (cfg, epoch) = (&self.cfg, state.history.last().expect("the epoch is recorded").epoch);
        let st = CheckpointState::of_run(state, cfg, &self.classes, epoch, None, t.scaler.as_ref(), self.world);
        self.save(&self.path.join("last"), t, &st)?;
        if improved {
            self.save(&self.path.join("best"), t, &st)?;
        }
        if cfg.keep > 0 {
            keep_epoch_checkpoint(&self.path, epoch, cfg.keep)?;
        }
        plots::training_curves(&self.path.join("curves.png"), &state.history)?;
        if cfg.report_every_epoch {
            let text = val.report.to_text();
            let reports = self.path.join("reports");
            std::fs::create_dir_all(&reports)?;
            atomic::write_file(&reports.join(format!("epoch-{epoch:04}.txt")), text.as_bytes())?;
            say!(
                "classification report, epoch {epoch}:\n{}",
                val.report.summary_text(40, &format!("reports/epoch-{epoch:04}.txt"))
            );
        }
        metrics_csv::write(&self.path.join("metrics.csv"), &state.history)
    }

    /// The best epoch's report (report.txt, metrics.json, confusion matrix, predictions.csv,
    /// report.html) in the run directory. `val`: the validation samples the evaluation indexes.
    pub fn write_final_report(&self, state: &RunState, val: &Samples) -> Result<ClassificationReport> {
        let classes = &self.classes;
        let (best_epoch, _) = state.best.expect("at least one epoch ran");
        let best = state.best_eval.as_ref().expect("kept with best");
        match self.writes {
            true => crate::report::write_evaluation(
                &self.path,
                classes,
                best,
                &format!("{} — validation, best epoch {best_epoch}", self.cfg.model),
                [("restarts".to_string(), self.restarts.into())].into_iter().collect(),
                &PageContext {
                    path: &self.path.join("report.html"),
                    command: command_line(),
                    config_toml: self.cfg.to_toml()?,
                    history: &state.history,
                    samples: Some(val),
                    first_batch: std::fs::read(self.path.join(FIRST_BATCH)).ok(),
                },
            ),
            false => Ok(ClassificationReport::new(classes, &best.targets, &best.preds)),
        }
    }

    /// A kill between an epoch's checkpoint and the files written after it (the `--keep` copy,
    /// curves, metrics.csv, written in that order) left those a step behind the checkpoint:
    /// bring them level on resume. (A missed per-epoch report is not rewritten: its predictions
    /// are gone.)
    pub fn catch_up(&self, st: &CheckpointState) -> Result<()> {
        let cfg = &self.cfg;
        if !self.writes {
            return Ok(());
        }
        let csv = self.path.join("metrics.csv");
        let current = std::fs::read_to_string(&csv).is_ok_and(|t| t == metrics_csv::render(&st.history));
        if !current {
            metrics_csv::write(&csv, &st.history)?;
            if !st.history.is_empty() {
                plots::training_curves(&self.path.join("curves.png"), &st.history)?;
            }
        }
        // Only when the run that saved it kept epochs too: turning --keep on at resume starts
        // keeping from the next epoch.
        let was_kept = cfg.keep > 0 && st.config.keep > 0;
        if was_kept && st.epoch > 0 && !self.path.join(format!("epoch-{:04}", st.epoch)).is_dir() {
            keep_epoch_checkpoint(&self.path, st.epoch, cfg.keep)?;
        }
        Ok(())
    }

    fn save(&self, dir: &Path, t: &Trainer, st: &CheckpointState) -> Result<()> {
        checkpoint::save(
            dir,
            &t.model,
            st,
            &checkpoint::Extras {
                optimizer: Some(t.opt.state_tensors()),
                ema: t.ema.as_ref().map(|e| &e.model),
            },
        )
    }
}

/// The outputs of an earlier run in `run_dir` that a new run replaces.
fn remove_earlier_run(run_dir: &Path) -> Result<()> {
    for e in std::fs::read_dir(run_dir)?.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let path = e.path();
        let is_checkpoint = ["last", "best", "reports"].contains(&name.as_str()) || is_epoch_dir(&name);
        let is_output = name.starts_with("events.out.tfevents.")
            || [
                "report.txt",
                "metrics.json",
                "confusion.csv",
                "confusion.png",
                "predictions.csv",
                "report.html",
                "metrics.csv",
                "curves.png",
                FIRST_BATCH,
                super::data_record::FILE,
            ]
            .contains(&name.as_str());
        if is_checkpoint && path.is_dir() {
            std::fs::remove_dir_all(&path).with_context(|| format!("removing the earlier run's {}", path.display()))?;
        } else if is_output && path.is_file() {
            std::fs::remove_file(&path).with_context(|| format!("removing the earlier run's {}", path.display()))?;
        }
    }
    Ok(())
}

fn is_epoch_dir(name: &str) -> bool {
    name.len() == 10 && name.starts_with("epoch-") && name[6..].bytes().all(|b| b.is_ascii_digit())
}

/// `--keep N`: the epoch's checkpoint as epoch-NNNN/, and only the newest N of those.
fn keep_epoch_checkpoint(run_dir: &Path, epoch: usize, keep: usize) -> Result<()> {
    checkpoint::copy(&run_dir.join("last"), &run_dir.join(format!("epoch-{epoch:04}")))?;
    let mut kept: Vec<PathBuf> = std::fs::read_dir(run_dir)?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir() && p.file_name().and_then(|n| n.to_str()).is_some_and(is_epoch_dir))
        .collect();
    kept.sort();
    for old in kept.iter().take(kept.len().saturating_sub(keep)) {
        std::fs::remove_dir_all(old).with_context(|| format!("removing {}", old.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A new run in an earlier run's folder leaves none of its outputs behind (a report would
    /// show them as the new run's), and nothing of the user's.
    #[test]
    fn a_new_run_removes_the_earlier_runs_outputs_only() {
        let d = tempfile::tempdir().unwrap();
        let earlier = [FIRST_BATCH, "metrics.csv", "report.html", "events.out.tfevents.1.host"];
        for f in earlier.iter().chain(&["notes.txt"]) {
            std::fs::write(d.path().join(f), b"x").unwrap();
        }
        std::fs::create_dir(d.path().join("epoch-0003")).unwrap();
        remove_earlier_run(d.path()).unwrap();
        for f in earlier.iter().chain(&["epoch-0003"]) {
            assert!(!d.path().join(f).exists(), "{f} left behind");
        }
        assert!(d.path().join("notes.txt").exists());
    }
}
