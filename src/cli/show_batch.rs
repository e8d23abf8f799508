//! `ringtrain show-batch`: train's configuration, one process, the first training batch as the
//! step receives it (`train::first_batch`) drawn into a PNG.
use std::path::PathBuf;

use anyhow::Result;

use super::args::ShowBatchArgs;
use crate::dist::plan;
use crate::train::context::RankContext;
use crate::train::dataset::TrainData;
use crate::train::first_batch::{first_batch, grid_png};
use crate::{bail_user, say};

/// Where the picture goes without --out.
pub const DEFAULT_OUT: &str = "batch.png";

pub fn run(args: &ShowBatchArgs) -> Result<()> {
    if args.train.resume.is_some() {
        bail_user!("show-batch draws a new run's first batch: --resume does not apply");
    }
    let out = args.train.out.clone().unwrap_or_else(|| PathBuf::from(DEFAULT_OUT));
    if out.is_dir() {
        bail_user!("--out {} is a directory; show-batch writes a PNG file", out.display());
    }
    let mut cfg = super::train_config(&args.train)?;
    cfg.out = std::env::temp_dir(); // no run directory: preflight looks there
    if !plan::is_one_process(&(&args.train.dist).into(), cfg.device, cfg.sync_bn)? {
        bail_user!("show-batch runs in one process; drop the launch flags");
    }
    cfg.preflight()?;
    let ctx = RankContext::new(&cfg, None)?;
    let data = TrainData::load(&cfg, &ctx, None)?;
    let batch = first_batch(&cfg, &data, 0)?;
    crate::atomic::write_file(&out, &grid_png(&batch, &data.classes)?)?;
    let mixed = batch.labels.iter().filter(|l| l.len() > 1).count();
    say!(
        "{} of the first batch's {} images ({} px, {mixed} mixed) in {}",
        batch.images.len(),
        cfg.batch_size,
        cfg.img_size,
        out.display()
    );
    Ok(())
}
