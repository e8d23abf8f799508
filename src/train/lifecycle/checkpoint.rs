//! A checkpoint is a directory, written atomically (see `atomic::write_dir`):
//!   model.safetensors      torchvision-named state_dict (PyTorch can load_state_dict it)
//!   optimizer.safetensors  the optimizer's state by parameter name (momentum, Adam moments)
//!   model_ema.safetensors  the weights' moving average, with `--ema`
//!   state.json             where the run stands (epoch, step within it, schedule, scaler, best
//!                          metric, history) and everything needed to use the model
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use tch::Tensor;

use crate::atomic;
use crate::bail_user;
use crate::config::TrainConfig;
use crate::data::augment::transform::{Interpolation, Transform};
use crate::model::weights::write_tensors;
use crate::model::{Model, ModelKind, ModelOptions};
use crate::report::metrics_csv::EpochRow;
use crate::train::step::amp::GradScaler;
use crate::train::step::meter::EpochPosition;
use crate::train::step::schedule::PlateauState;
use crate::train::step::state::RunState;

pub const MODEL_FILE: &str = "model.safetensors";
pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";
pub const EMA_FILE: &str = "model_ema.safetensors";
pub const STATE_FILE: &str = "state.json";

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CheckpointState {
    pub ringtrain_version: String,
    pub model: ModelKind,
    pub classes: Vec<String>,
    pub img_size: u32,
    pub eval_resize: u32,
    /// The evaluation's centre crop (checkpoints from before `--val-crop-size`: img_size).
    #[serde(default)]
    pub val_crop_size: Option<u32>,
    /// The resize filter (checkpoints from before `--interpolation` resized bilinear).
    #[serde(default)]
    pub interpolation: Interpolation,
    pub mean: Vec<f64>,
    pub std: Vec<f64>,
    /// Epochs completed (1-based count).
    pub epoch: usize,
    /// Optimizer steps taken since the start of the run.
    pub global_step: usize,
    /// Set when saved inside an unfinished epoch (index `epoch`, 0-based).
    #[serde(default)]
    pub mid_epoch: Option<EpochPosition>,
    pub val_top1: Option<f64>,
    pub best_val_top1: Option<f64>,
    pub best_epoch: Option<usize>,
    /// The best value of the monitored metric (`config.monitor`).
    #[serde(default)]
    pub best_metric: Option<f64>,
    /// The best epoch's validation predictions, for the final classification report.
    #[serde(default)]
    pub best_eval: Option<crate::train::step::eval::EvalResult>,
    /// The fp16 GradScaler's state, when one is used.
    #[serde(default)]
    pub scaler: Option<crate::train::step::amp::ScalerState>,
    #[serde(default)]
    pub plateau: PlateauState,
    /// Every finished epoch's metrics (metrics.csv is rewritten from it).
    #[serde(default)]
    pub history: Vec<EpochRow>,
    /// Ranks of the run that saved it.
    #[serde(default = "one")]
    pub world_size: usize,
    pub config: TrainConfig,
}

fn one() -> usize {
    1
}

impl CheckpointState {
    /// The checkpoint state after `epochs_done` epochs, plus `mid_epoch` when inside the next.
    pub fn of_run(
        state: &RunState,
        cfg: &TrainConfig,
        classes: &[String],
        epochs_done: usize,
        mid_epoch: Option<EpochPosition>,
        scaler: Option<&GradScaler>,
        world: usize,
    ) -> Self {
        CheckpointState {
            ringtrain_version: env!("CARGO_PKG_VERSION").into(),
            model: cfg.model,
            classes: classes.to_vec(),
            img_size: cfg.img_size,
            eval_resize: cfg.eval_resize(),
            val_crop_size: cfg.val_crop_size,
            interpolation: cfg.interpolation(),
            mean: cfg.mean.clone(),
            std: cfg.std.clone(),
            epoch: epochs_done,
            global_step: state.global_step,
            mid_epoch,
            val_top1: state.history.last().map(|r| r.val_top1),
            best_val_top1: state.best_eval.as_ref().map(|e| e.top1),
            best_epoch: state.best.map(|b| b.0),
            best_metric: state.best.map(|b| b.1),
            best_eval: state.best_eval.clone(),
            scaler: scaler.map(|s| s.state()),
            plateau: state.plateau.clone(),
            history: state.history.clone(),
            world_size: world,
            config: cfg.clone(),
        }
    }

    /// Where the run stood: the state to go on from.
    pub fn run_state(&self) -> RunState {
        RunState {
            global_step: self.global_step,
            plateau: self.plateau.clone(),
            history: self.history.clone(),
            best: self.best_epoch.zip(self.best_metric),
            best_eval: self.best_eval.clone(),
            lr: 0.0,
            first_epoch: self.epoch,
            mid_epoch: self.mid_epoch.clone(),
        }
    }

    pub fn mean3(&self) -> [f64; 3] {
        [self.mean[0], self.mean[1], self.mean[2]]
    }

    pub fn std3(&self) -> [f64; 3] {
        [self.std[0], self.std[1], self.std[2]]
    }

    /// The run's evaluation transform, with `interpolation` for its filter when given
    /// (`--interpolation` of eval and predict), else the run's.
    pub fn eval_transform(&self, interpolation: Option<Interpolation>) -> Transform {
        let crop = self.val_crop_size.unwrap_or(self.img_size);
        Transform::eval(crop, self.eval_resize, interpolation.unwrap_or(self.interpolation))
    }
}

/// What a checkpoint holds beside the model and the state.
#[derive(Default)]
pub struct Extras<'a> {
    pub optimizer: Option<Vec<(String, Tensor)>>,
    pub ema: Option<&'a Model>,
}

pub fn save(dir: &Path, model: &Model, state: &CheckpointState, extras: &Extras) -> Result<()> {
    atomic::write_dir(dir, |tmp| {
        model.save_safetensors(&tmp.join(MODEL_FILE))?;
        if let Some(named) = &extras.optimizer {
            write_tensors(named.iter().map(|(k, t)| (k.as_str(), t)), &tmp.join(OPTIMIZER_FILE))?;
        }
        if let Some(ema) = extras.ema {
            ema.save_safetensors(&tmp.join(EMA_FILE))?;
        }
        std::fs::write(tmp.join(STATE_FILE), serde_json::to_vec_pretty(state)?)?;
        Ok(())
    })
    .with_context(|| {
        format!(
            "saving checkpoint {} failed, the previous one is intact (free space, then continue with --resume auto)",
            dir.display()
        )
    })
}

/// Copies a checkpoint directory (atomically), for `--keep`.
pub fn copy(src: &Path, dst: &Path) -> Result<()> {
    atomic::write_dir(dst, |tmp| {
        for e in std::fs::read_dir(src)? {
            let e = e?;
            std::fs::copy(e.path(), tmp.join(e.file_name()))?;
        }
        Ok(())
    })
    .with_context(|| format!("copying checkpoint {} to {}", src.display(), dst.display()))
}

/// Reads and checks a checkpoint's state.json; `flag` names the option that pointed at it.
pub fn load_state_for(dir: &Path, flag: &str) -> Result<CheckpointState> {
    let p = dir.join(STATE_FILE);
    if !dir.is_dir() {
        bail_user!("{flag} is not a checkpoint directory: {}", dir.display());
    }
    let bytes = match std::fs::read(&p) {
        Ok(b) => b,
        Err(e) => bail_user!("{flag} {}: cannot read {STATE_FILE}: {e}", dir.display()),
    };
    parse_state(&bytes, dir, flag)
}

/// A state.json's bytes, checked (`dir` and `flag` name it in errors): the fuzzing entry point.
pub fn parse_state(bytes: &[u8], dir: &Path, flag: &str) -> Result<CheckpointState> {
    let state: CheckpointState = match serde_json::from_slice(bytes) {
        Ok(s) => s,
        Err(e) => bail_user!("{flag} {}: invalid {STATE_FILE}: {e}", dir.display()),
    };
    if state.mean.len() != 3 || state.std.len() != 3 || state.classes.is_empty() {
        bail_user!(
            "{flag} {}: {STATE_FILE} needs three mean and std values and at least one class",
            dir.display()
        );
    }
    Ok(state)
}

pub fn load_state(dir: &Path) -> Result<CheckpointState> {
    load_state_for(dir, "--checkpoint")
}

/// A safetensors file of a checkpoint as named tensors; `flag` names the option for errors.
pub fn read_tensors(path: &Path, flag: &str) -> Result<HashMap<String, Tensor>> {
    match Tensor::read_safetensors(path) {
        Ok(v) => Ok(v.into_iter().collect()),
        Err(e) => bail_user!("{flag}: cannot read {} ({e})", path.display()),
    }
}

/// The model of a checkpoint directory, ready for inference, with its state.
pub fn load(dir: &Path, device: tch::Device) -> Result<(Model, CheckpointState)> {
    let state = load_state(dir)?;
    let opts = ModelOptions {
        img_size: state.img_size,
        ..ModelOptions::defaults(state.model)
    };
    let mut model = Model::build(state.model, state.classes.len() as i64, device, opts);
    model
        .load_safetensors(&dir.join(MODEL_FILE))
        .map_err(|e| crate::error::user_error(format!("--checkpoint {}: {e:#}", dir.display())))?;
    Ok((model, state))
}

/// Where `--resume` points: `auto` is `<out>/last` when it exists (None: start a new run).
pub fn resume_dir(resume: &str, out: &Path) -> Result<Option<PathBuf>> {
    if resume == "auto" {
        let last = out.join("last");
        atomic::recover_dir(&last)?;
        return Ok(last.join(STATE_FILE).is_file().then_some(last));
    }
    let dir = PathBuf::from(resume);
    if !dir.join(STATE_FILE).is_file() {
        bail_user!(
            "--resume {}: not a checkpoint directory (no {STATE_FILE})",
            dir.display()
        );
    }
    Ok(Some(dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_diverged_runs_nan_figures_survive_state_json() {
        let pos = EpochPosition {
            steps: 3,
            loss_sum: f64::NAN,
            correct: 2.0,
            ..Default::default()
        };
        let json = serde_json::to_string(&pos).unwrap();
        assert!(json.contains("\"loss_sum\":null"), "{json}");
        let back: EpochPosition = serde_json::from_str(&json).unwrap();
        assert!(back.loss_sum.is_nan());
        assert_eq!((back.steps, back.correct), (3, 2.0));
        // An image's NaN loss likewise; an evaluation saved before per-image losses were kept loads.
        let ev = crate::train::step::eval::EvalResult { losses: vec![0.5, f32::NAN], confidence: vec![0.9, f32::NAN], ..Default::default() };
        let back: crate::train::step::eval::EvalResult = serde_json::from_str(&serde_json::to_string(&ev).unwrap()).unwrap();
        assert_eq!(back.losses[0], 0.5);
        assert!(back.losses[1].is_nan() && back.confidence[1].is_nan());
        let old: crate::train::step::eval::EvalResult =
            serde_json::from_str(r#"{"loss":1.0,"top1":0.5,"top5":1.0,"targets":[0],"preds":[1],"skipped":[]}"#).unwrap();
        assert!(old.losses.is_empty() && old.indices.is_empty());
    }
}
