//! A checkpoint is a directory, written atomically (see `atomic::write_dir`):
//!   model.safetensors  torchvision-named state_dict (PyTorch can load_state_dict it)
//!   state.json         where the run stands and everything needed to use the model
use std::path::Path;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::atomic;
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
    pub config: TrainConfig,
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
    let bytes = std::fs::read(&p).with_context(|| format!("reading {}", p.display()))?;
    serde_json::from_slice(&bytes).with_context(|| format!("parsing {}", p.display()))
}
