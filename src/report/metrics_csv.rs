//! The per-epoch metrics table (metrics.csv in the run directory), rewritten atomically.
use std::path::Path;

use anyhow::Result;
use serde::{Deserialize, Serialize};

use crate::atomic;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EpochRow {
    pub epoch: usize,
    #[serde(deserialize_with = "crate::serde_nan::f64_or_nan")]
    pub train_loss: f64,
    #[serde(deserialize_with = "crate::serde_nan::f64_or_nan")]
    pub train_top1: f64,
    #[serde(deserialize_with = "crate::serde_nan::f64_or_nan")]
    pub val_loss: f64,
    #[serde(deserialize_with = "crate::serde_nan::f64_or_nan")]
    pub val_top1: f64,
    #[serde(deserialize_with = "crate::serde_nan::f64_or_nan")]
    pub val_top5: f64,
    #[serde(deserialize_with = "crate::serde_nan::f64_or_nan")]
    pub lr: f64,
    #[serde(deserialize_with = "crate::serde_nan::f64_or_nan")]
    pub seconds: f64,
    #[serde(deserialize_with = "crate::serde_nan::f64_or_nan")]
    pub images_per_s: f64,
    /// Optimizer steps skipped by the fp16 GradScaler (inf/NaN gradients).
    pub skipped_steps: usize,
    #[serde(deserialize_with = "crate::serde_nan::f64_or_nan")]
    pub val_macro_f1: f64,
    /// Validation top-1 of the weights' moving average (`--ema`).
    pub ema_val_top1: Option<f64>,
}

pub const HEADER: &str = "epoch,train_loss,train_top1,val_loss,val_top1,val_top5,lr,seconds,images_per_s,skipped_steps,val_macro_f1,ema_val_top1";

/// Reads a metrics.csv back (`ringtrain compare`); a malformed file is a user error naming it
/// and its line.
pub fn read(path: &Path) -> Result<Vec<EpochRow>> {
    let text = match std::fs::read(path) {
        Ok(t) => t,
        Err(e) => crate::bail_user!("cannot read {}: {e}", path.display()),
    };
    let mut reader = csv::Reader::from_reader(&text[..]);
    if !reader.headers().is_ok_and(|h| h.get(0) == Some("epoch")) {
        crate::bail_user!("{} is malformed: its header is not {HEADER}", path.display());
    }
    let mut rows = Vec::new();
    for row in reader.deserialize::<EpochRow>() {
        match row {
            Ok(r) => rows.push(r),
            Err(e) => crate::bail_user!("{} is malformed: {}", path.display(), crate::error::first_line(&e.to_string())),
        }
    }
    Ok(rows)
}

pub fn write(path: &Path, rows: &[EpochRow]) -> Result<()> {
    atomic::write_file(path, render(rows).as_bytes())
}

/// The CSV text of `rows`, header first.
pub fn render(rows: &[EpochRow]) -> String {
    let mut s = String::from(HEADER);
    s.push('\n');
    for r in rows {
        s += &format!(
            "{},{:.6},{:.6},{:.6},{:.6},{:.6},{:.8},{:.3},{:.1},{},{:.6},{}\n",
            r.epoch,
            r.train_loss,
            r.train_top1,
            r.val_loss,
            r.val_top1,
            r.val_top5,
            r.lr,
            r.seconds,
            r.images_per_s,
            r.skipped_steps,
            r.val_macro_f1,
            r.ema_val_top1.map(|v| format!("{v:.6}")).unwrap_or_default()
        );
    }
    s
}
