//! A checkpoint is a directory, written atomically (see `atomic::write_dir`):
//!   model.safetensors  torchvision-named state_dict (PyTorch can load_state_dict it)
//!   state.json         where the run stands and everything needed to use the model
use std::path::Path;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::atomic;
use crate::bail_user;
use crate::config::TrainConfig;
use crate::model::Model;

pub const MODEL_FILE: &str = "model.safetensors";
pub const STATE_FILE: &str = "state.json";

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CheckpointState {
    pub ringtrain_version: String,
    pub model: String,
    pub classes: Vec<String>,
    pub img_size: u32,
    pub eval_resize: u32,
    pub mean: Vec<f64>,
    pub std: Vec<f64>,
    /// Epochs completed (1-based count).
    pub epoch: usize,
    pub global_step: usize,
    pub val_top1: Option<f64>,
    pub best_val_top1: Option<f64>,
    pub best_epoch: Option<usize>,
    /// The fp16 GradScaler's state, when one is used.
    #[serde(default)]
    pub scaler: Option<crate::train::amp::ScalerState>,
    pub config: TrainConfig,
}

impl CheckpointState {
    pub fn mean3(&self) -> [f64; 3] {
        [self.mean[0], self.mean[1], self.mean[2]]
    }

    pub fn std3(&self) -> [f64; 3] {
        [self.std[0], self.std[1], self.std[2]]
    }
}

pub fn save(dir: &Path, model: &Model, state: &CheckpointState) -> Result<()> {
    atomic::write_dir(dir, |tmp| {
        model.save_safetensors(&tmp.join(MODEL_FILE))?;
        std::fs::write(tmp.join(STATE_FILE), serde_json::to_vec_pretty(state)?)?;
        Ok(())
    })
    .with_context(|| format!("saving checkpoint {}", dir.display()))
}

pub fn load_state(dir: &Path) -> Result<CheckpointState> {
    let p = dir.join(STATE_FILE);
    if !dir.is_dir() {
        bail_user!("--checkpoint is not a checkpoint directory: {}", dir.display());
    }
    let bytes = match std::fs::read(&p) {
        Ok(b) => b,
        Err(e) => bail_user!("--checkpoint {}: cannot read {STATE_FILE}: {e}", dir.display()),
    };
    let state: CheckpointState = match serde_json::from_slice(&bytes) {
        Ok(s) => s,
        Err(e) => bail_user!("--checkpoint {}: invalid {STATE_FILE}: {e}", dir.display()),
    };
    if state.mean.len() != 3 || state.std.len() != 3 || state.classes.is_empty() {
        bail_user!(
            "--checkpoint {}: {STATE_FILE} needs three mean and std values and at least one class",
            dir.display()
        );
    }
    Ok(state)
}

/// The model of a checkpoint directory, ready for inference, with its state.
pub fn load(dir: &Path, device: tch::Device) -> Result<(Model, CheckpointState)> {
    let state = load_state(dir)?;
    let mut model = Model::new(&state.model, state.classes.len() as i64, device)?;
    model
        .load_safetensors(&dir.join(MODEL_FILE))
        .map_err(|e| crate::error::user_error(format!("--checkpoint {}: {e:#}", dir.display())))?;
    Ok((model, state))
}
