//! `--resume auto|DIR`: which checkpoint a run continues from, whether it fits this run, and
//! restoring the trainer and the run's state from it, mid-epoch included.
use std::path::{Path, PathBuf};

use anyhow::Result;

use super::checkpoint::{self, CheckpointState};
use crate::train::step::ema::Ema;
use super::run_dir::RunDir;
use crate::config::TrainConfig;
use crate::error::user_error;
use crate::say;
use crate::train::step::state::RunState;
use crate::train::step::trainer::Trainer;
use crate::train::RunSummary;

/// The checkpoint a run continues from (None: a new run).
pub struct Resume {
    from: Option<(PathBuf, CheckpointState)>,
}

impl Resume {
    /// Finds the checkpoint `--resume` names and checks it fits this run (`world` ranks).
    pub fn find(cfg: &TrainConfig, classes: &[String], world: usize) -> Result<Self> {
        let dir = match &cfg.resume {
            Some(r) => checkpoint::resume_dir(r, &cfg.out)?,
            None => None,
        };
        let Some(dir) = dir else {
            if cfg.resume.is_some() {
                say!(
                    "resume: no checkpoint in {}; starting a new run",
                    cfg.out.join("last").display()
                );
            }
            return Ok(Resume { from: None });
        };
        let st = checkpoint::load_state_for(&dir, "--resume")?;
        check_resume(cfg, &st, classes, &dir, world)?;
        Ok(Resume { from: Some((dir, st)) })
    }

    pub fn is_new_run(&self) -> bool {
        self.from.is_none()
    }

    /// `--resume auto` of a run that has nothing left to do (a requeued job that already
    /// ended): its summary.
    pub fn finished(&self, cfg: &TrainConfig) -> Option<RunSummary> {
        let (dir, st) = self.from.as_ref()?;
        if !run_is_complete(cfg, st, dir) {
            return None;
        }
        say!(
            "resume: {} already finished its {} epochs; nothing to do (raise --epochs to train further)",
            cfg.out.display(),
            st.epoch
        );
        Some(RunSummary {
            best_epoch: st.best_epoch.unwrap_or(0),
            report: None,
            interrupted: None,
        })
    }

    /// Puts the checkpoint's weights, optimizer state, moving average and loss scale into `t`,
    /// and returns where the run stands; a new run starts at step 0.
    pub fn restore_into(self, t: &mut Trainer, cfg: &TrainConfig, run_dir: &RunDir) -> Result<RunState> {
        let Some((dir, st)) = self.from else {
            return Ok(RunState::default());
        };
        let flag = format!("--resume {}", dir.display());
        t.model.load_safetensors(&dir.join(checkpoint::MODEL_FILE)).map_err(|e| {
            user_error(format!(
                "{flag}: {e:#} (a damaged checkpoint: resume from another one, e.g. best/ or an epoch-NNNN/ of --keep, with --resume DIR)"
            ))
        })?;
        let opt_file = dir.join(checkpoint::OPTIMIZER_FILE);
        if !opt_file.is_file() {
            return Err(user_error(format!(
                "{flag}: no {} in the checkpoint, so the optimizer cannot continue where it stopped",
                checkpoint::OPTIMIZER_FILE
            )));
        }
        t.opt
            .load_state(checkpoint::read_tensors(&opt_file, &flag)?)
            .map_err(|e| user_error(format!("{flag}: {}: {e:#}", checkpoint::OPTIMIZER_FILE)))?;
        if cfg.ema.is_some() || cfg.model_ema {
            let f = dir.join(checkpoint::EMA_FILE);
            if f.is_file() {
                let ema = t.ema.as_mut().expect("ema is on");
                ema.model
                    .load_safetensors(&f)
                    .map_err(|e| user_error(format!("{flag}: {e:#}")))?;
            } else {
                say!("resume: the checkpoint has no moving average; --ema starts from the current weights");
                t.ema = Ema::of_config(cfg, &t.model, t.num_classes())?;
            }
        }
        if let (Some(s), Some(saved)) = (t.scaler.as_mut(), &st.scaler) {
            s.restore(saved);
        }
        if st.mid_epoch.is_none() && is_own_last(cfg, &dir) {
            run_dir.catch_up(&st)?;
        }
        say!(
            "resume: {} {}, step {} (best {} {:.4} at epoch {})",
            dir.display(),
            match &st.mid_epoch {
                Some(p) => format!("in epoch {} after {} of its steps", st.epoch + 1, p.steps),
                None if st.epoch >= cfg.epochs =>
                    format!("after its last epoch ({}): writing the final report", st.epoch),
                None => format!("at the start of epoch {}", st.epoch + 1),
            },
            st.global_step,
            cfg.monitor.name(),
            st.best_metric.unwrap_or(f64::NAN),
            st.best_epoch.unwrap_or(0)
        );
        Ok(st.run_state())
    }
}

/// Whether the run of checkpoint `dir` has nothing left to do: all epochs trained and, when it is
/// this --out's own `last/`, the final report written. (Killed after the last epoch's checkpoint
/// but before the report, a resumed run only writes the report.)
fn run_is_complete(cfg: &TrainConfig, st: &CheckpointState, dir: &Path) -> bool {
    let trained = st.epoch >= cfg.epochs && st.mid_epoch.is_none();
    trained && !(is_own_last(cfg, dir) && !cfg.out.join("report.txt").is_file())
}

/// Whether `dir` is the `last/` checkpoint of this run's own --out.
fn is_own_last(cfg: &TrainConfig, dir: &Path) -> bool {
    let canon = |p: &Path| std::fs::canonicalize(p).ok();
    canon(dir).is_some() && canon(dir) == canon(&cfg.out.join("last"))
}

/// A resumed run must train the same model on the same data with the same batch and
/// optimizer; other settings (epochs, schedule, logging) may change, and are listed.
fn check_resume(cfg: &TrainConfig, st: &CheckpointState, classes: &[String], dir: &Path, world: usize) -> Result<()> {
    let c = &st.config;
    let fixed = [
        ("--model", cfg.model.to_string(), c.model.to_string()),
        ("--img-size", cfg.img_size.to_string(), c.img_size.to_string()),
        ("--batch-size", cfg.batch_size.to_string(), c.batch_size.to_string()),
        ("--accum-steps", cfg.accum_steps.to_string(), c.accum_steps.to_string()),
        (
            "--optimizer",
            format!("{:?}", cfg.optimizer),
            format!("{:?}", c.optimizer),
        ),
        ("--seed", cfg.seed.to_string(), c.seed.to_string()),
        (
            "--ema",
            format!("{:?}", cfg.ema.is_some() || cfg.model_ema),
            format!("{:?}", c.ema.is_some() || c.model_ema),
        ),
    ];
    for (flag, ours, theirs) in fixed {
        if ours != theirs {
            return Err(user_error(format!(
                "--resume {}: the run was trained with {flag} {theirs}, this command gives {ours}; resume with the same value",
                dir.display()
            )));
        }
    }
    if st.classes != classes {
        return Err(user_error(format!(
            "--resume {}: the checkpoint's {} classes differ from the {} classes under --data",
            dir.display(),
            st.classes.len(),
            classes.len()
        )));
    }
    if run_is_complete(cfg, st, dir) && cfg.resume.as_deref() != Some("auto") {
        return Err(user_error(format!(
            "--resume {}: the run already finished its {} epochs; raise --epochs to train further",
            dir.display(),
            st.epoch
        )));
    }
    let (ours, theirs) = (toml::Table::try_from(cfg)?, toml::Table::try_from(c)?);
    let changed: Vec<String> = ours
        .iter()
        .filter(|(k, v)| !["out", "overwrite"].contains(&k.as_str()) && theirs.get(*k) != Some(v))
        .map(|(k, v)| match theirs.get(k) {
            Some(old) => format!("{k} {old} → {v}"),
            None => format!("{k} = {v}"),
        })
        .collect();
    if !changed.is_empty() {
        say!("resume: changed settings: {}", changed.join(", "));
    }
    if st.world_size != world {
        say!(
            "resume: the run had {} ranks, now {world}: the global batch ({}) and the learning rate are kept; per-rank batches change from {} to {}{}",
            st.world_size,
            cfg.batch_size,
            cfg.batch_size / st.world_size.max(1),
            cfg.batch_size / world,
            if st.mid_epoch.is_some() {
                "; the interrupted epoch goes on with the batches it had left (an epoch's order does not depend on the number of ranks)"
            } else {
                ""
            }
        );
    }
    Ok(())
}
