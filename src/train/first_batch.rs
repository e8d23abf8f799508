//! The first training batch as the step receives it (`ringtrain show-batch`, and a new run's
//! `first-batch.png`, shown in `report.html`): rank 0's first batch of epoch 0 through the
//! loader (crop, flip, policy, erasing), normalised on the device, mixed as the step mixes it
//! (Mixup/CutMix with the step's own draws), then back to pixels, each with its label or, when
//! mixed, its two classes and their weights.
use anyhow::Result;
use image::RgbImage;
use tch::Kind;

use super::dataset::TrainData;
use crate::config::TrainConfig;
use crate::data::augment::mixup::Mixup;
use crate::report::thumbnails::captioned_grid;
use crate::seeds;

/// Images of the batch drawn, at most.
const SHOWN: usize = 64;

/// The batch's images and, for each, its classes with their weights in the targets (the
/// strongest first; the smoothing's share of the other classes left out).
pub struct ShownBatch {
    pub images: Vec<RgbImage>,
    pub labels: Vec<Vec<(usize, f64)>>,
}

/// Rank `rank`'s first batch of epoch 0, as `Trainer::micro_step` receives it.
pub fn first_batch(cfg: &TrainConfig, data: &TrainData, rank: usize) -> Result<ShownBatch> {
    let batch = data
        .train_from(0, 0)
        .next()
        .ok_or_else(|| anyhow::anyhow!("the training set gives no batch"))??;
    let mix_cfg = cfg.mixup(data.num_classes());
    // Every class's share of a mixed target row at least: the smoothing's.
    let floor = mix_cfg.as_ref().map_or(0.0, |m| m.label_smoothing / m.num_classes as f64);
    let mixup = mix_cfg.map(Mixup::new).transpose()?;
    let (x, targets) = match &mixup {
        Some(m) => {
            let (h, w) = (batch.x.size()[2], batch.x.size()[3]);
            // The draws of the step at position 0 (`Trainer::micro_step`).
            let p = m.sample(h, w, &mut seeds::mixup(cfg.seed, rank as u64, 0));
            let (x, t) = m.apply(&batch.x, &batch.y, &p);
            (x, Some(t))
        }
        None => (batch.x.shallow_clone(), None),
    };
    let n = (x.size()[0] as usize).min(SHOWN);
    let pixels = data.normalize.to_pixels(&x.narrow(0, 0, n as i64));
    let (h, w) = (pixels.size()[1] as u32, pixels.size()[2] as u32);
    let mut images = Vec::with_capacity(n);
    for i in 0..n {
        let len = (h * w * 3) as usize;
        let mut px = vec![0u8; len];
        pixels.get(i as i64).copy_data_u8(&mut px, len);
        images.push(RgbImage::from_raw(w, h, px).expect("an image of its own size"));
    }
    let labels = match targets {
        None => {
            let y = batch.y.narrow(0, 0, n as i64).to_device(tch::Device::Cpu).to_kind(Kind::Int64);
            Vec::<i64>::try_from(y)?.iter().map(|&c| vec![(c as usize, 1.0)]).collect()
        }
        Some(t) => {
            let t = t.to_device(tch::Device::Cpu).to_kind(Kind::Double);
            (0..n)
                .map(|i| {
                    let row = Vec::<f64>::try_from(t.get(i as i64)).unwrap_or_default();
                    let mut classes: Vec<(usize, f64)> = row.iter().copied().enumerate().filter(|&(_, v)| v > floor + 1e-6).collect();
                    classes.sort_by(|a, b| b.1.total_cmp(&a.1));
                    classes.truncate(2);
                    classes
                })
                .collect()
        }
    };
    Ok(ShownBatch { images, labels })
}

/// The batch as a captioned grid: class names, with each one's weight when it is mixed.
pub fn grid(b: &ShownBatch, classes: &[String]) -> Result<RgbImage> {
    let captions: Vec<Vec<String>> = b
        .labels
        .iter()
        .map(|l| match l.as_slice() {
            [(c, _)] => vec![classes[*c].clone()],
            _ => l.iter().map(|(c, v)| format!("{} {v:.2}", classes[*c])).collect(),
        })
        .collect();
    let columns = (b.images.len() as f64).sqrt().ceil() as usize;
    captioned_grid(&b.images, &captions, columns.max(4))
}

/// Rank `rank`'s first batch as a PNG for the run directory; None when the batch cannot be
/// read (the run's first step says why, once).
pub fn png(cfg: &TrainConfig, data: &TrainData, rank: usize) -> Result<Option<Vec<u8>>> {
    match first_batch(cfg, data, rank) {
        Ok(b) => grid_png(&b, &data.classes).map(Some),
        Err(_) => Ok(None),
    }
}

/// `grid` as PNG bytes.
pub fn grid_png(b: &ShownBatch, classes: &[String]) -> Result<Vec<u8>> {
    let img = grid(b, classes)?;
    let mut bytes = Vec::new();
    img.write_to(&mut std::io::Cursor::new(&mut bytes), image::ImageFormat::Png)?;
    Ok(bytes)
}
