//! `--data-on-device`: the whole uint8 data set lives on the training device, and each batch is
//! cut, resized, flipped and normalised there in a few batched kernels; no data worker runs
//! after the set is loaded. The choices are the host pipeline's own: each sample's box, shift
//! and flip come from `Transform::source_box` and `Transform::moves` with the randomness of
//! (seed, epoch, index), so a batch differs from the host pipeline's only in its resampling.
//!
//! - RandomResizedCrop + flip: images stored as decoded, each at the top-left of a canvas as
//!   large as the largest. By `--interpolation`:
//!   - bilinear: one `affine_grid` + `grid_sample` per batch maps every output pixel to its
//!     box, sample points clamped inside the box as cutting it out first does. Not
//!     antialiased: a box shrunk more than twofold aliases where PIL would average.
//!   - bicubic: each box cut out and resized by torch's antialiased bicubic interpolation
//!     (`interpolate(..., antialias=True)`, PIL's filter), across then down, each pass rounded
//!     and clamped to 0..255 as PIL's: within 1 level of the host's crops, at the cost of two
//!     resizes per image instead of one per batch. (`grid_sample`'s bicubic is not PIL's: a =
//!     -0.75, no antialiasing, and its taps reach past the box into the canvas.)
//!   - nearest: one gather of the source pixels the host takes (`Transform::nearest_indices`):
//!     the host's exact pixels.
//! - CIFAR's padded RandomCrop + flip: images stored resized to the output size (as the host
//!   does before its crop); the crop and flip are one gather from the zero-padded batch, exactly
//!   the host's pixels.
//! - Evaluation (Resize + CenterCrop): each image transformed once on the host, exactly as the
//!   host pipeline does, and stored at the output size.
use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Result;
use image::RgbImage;
use rayon::prelude::*;
use tch::{Device, Kind, Tensor};

use super::normalize::Normalizer;
use super::sample::{decode_sample, load_sample, Batch};
use crate::bail_user;
use crate::data::augment::transform::{Interpolation, Moves, Transform};
use crate::data::pixels::CropBox;
use crate::data::source::Samples;
use crate::seeds;

/// What loading a set needs besides its samples and transform.
#[derive(Debug, Clone, Copy)]
pub struct DeviceSetOptions {
    pub seed: u64,
    pub device: Device,
    pub skip_unreadable: bool,
    /// Decode JPEGs whole for the evaluation transform (`--torchvision-compat`), as the host does.
    pub whole_jpeg: bool,
}

pub struct DeviceSet {
    /// [N, H, W, 3] uint8 on the device: whole images at the top-left of a canvas as large as
    /// the largest (RandomResizedCrop), or every image at the output size.
    images: Tensor,
    /// Image i's (width, height) in its canvas.
    sizes: Vec<(u32, u32)>,
    /// [N] int64 on the device.
    labels: Tensor,
    transform: Transform,
    seed: u64,
    normalize: Normalizer,
    /// Samples that could not be read, by index: left out of every batch.
    unreadable: BTreeMap<usize, (PathBuf, String)>,
}

impl DeviceSet {
    /// Decodes every sample (in parallel on `pool`) and puts the set on `device`. Unreadable
    /// samples are an error unless `skip_unreadable`.
    pub fn load(
        samples: &Samples,
        transform: &Transform,
        o: DeviceSetOptions,
        normalize: Normalizer,
        pool: &rayon::ThreadPool,
    ) -> Result<DeviceSet> {
        let DeviceSetOptions {
            seed,
            device,
            skip_unreadable,
            whole_jpeg,
        } = o;
        if let Transform::Train { erase: Some(_), .. } = transform {
            bail_user!("--data-on-device does not do --random-erasing; drop one of the two");
        }
        let n = samples.len();
        let size = transform.size();
        let canvas = matches!(transform, Transform::Train { pad: None, .. });
        let bar = crate::report::progress::count_bar(n as u64, "loading to the device");
        // Each sample as the device keeps it: whole (canvas) or at the output size.
        let prepared: Vec<Result<RgbImage>> = pool.install(|| {
            (0..n)
                .into_par_iter()
                .map(|i| {
                    let r = prepare(samples, i, transform, canvas, whole_jpeg);
                    bar.inc(1);
                    r
                })
                .collect()
        });
        bar.finish_and_clear();
        let mut unreadable = BTreeMap::new();
        for (i, p) in prepared.iter().enumerate() {
            if let Err(e) = p {
                if !skip_unreadable {
                    return Err(anyhow::anyhow!("{e:#}"));
                }
                unreadable.insert(i, (samples.path(i).to_path_buf(), e.root_cause().to_string()));
            }
        }
        if unreadable.len() == n {
            bail_user!(
                "none of the {n} images could be read (first: {})",
                samples.path(0).display()
            );
        }
        let ok = || prepared.iter().filter_map(|p| p.as_ref().ok());
        let (cw, ch) = ok().fold((1, 1), |(w, h), p| (w.max(p.width()), h.max(p.height())));
        // Straight into the tensor (no second copy), each image at the top-left of its canvas.
        let row = (cw * ch * 3) as usize;
        let images = Tensor::zeros([n as i64, ch as i64, cw as i64, 3], (Kind::Uint8, Device::Cpu));
        // SAFETY: a fresh contiguous CPU tensor of n × row bytes, referenced nowhere else while
        // the slice lives; the threads write disjoint rows.
        let host = unsafe { std::slice::from_raw_parts_mut(images.data_ptr() as *mut u8, n * row) };
        host.par_chunks_mut(row).zip(&prepared).for_each(|(dst, p)| {
            if let Ok(img) = p {
                let line = (img.width() * 3) as usize;
                for (y, src) in img.as_raw().chunks_exact(line).enumerate() {
                    let at = y * (cw * 3) as usize;
                    dst[at..at + line].copy_from_slice(src);
                }
            }
        });
        let bytes = (n * row) as f64;
        let images = images.f_to_device(device).map_err(|e| {
            crate::error::user_error(format!(
                "--data-on-device: the {n} images ({:.2} GB as uint8) do not fit on {device:?} ({}); pack them with a smaller --max-side, or drop --data-on-device",
                bytes / 1e9,
                crate::error::first_line(&e.to_string())
            ))
        })?;
        let labels: Vec<i64> = (0..n).map(|i| samples.label(i) as i64).collect();
        let sizes = prepared
            .iter()
            .map(|p| p.as_ref().map_or((1, 1), |p| p.dimensions()))
            .collect();
        debug_assert!(canvas || (cw, ch) == (size, size));
        Ok(DeviceSet {
            images,
            sizes,
            labels: Tensor::from_slice(&labels).to_device(device),
            transform: transform.clone(),
            seed,
            normalize,
            unreadable,
        })
    }

    /// Bytes the images take on the device.
    pub fn bytes(&self) -> u64 {
        self.images.numel() as u64
    }

    /// The batch of samples `indices` in `epoch`: images [B,3,S,S] f32, normalised (or uint8
    /// NHWC for the padded crop, nearest-neighbour crops and evaluation, which the consumer
    /// normalises as any uint8 batch), labels on the device.
    pub fn batch(&self, indices: &[usize], epoch: u64) -> Batch {
        let kept: Vec<usize> = indices
            .iter()
            .copied()
            .filter(|i| !self.unreadable.contains_key(i))
            .collect();
        let unreadable = indices.iter().filter_map(|i| self.unreadable.get(i).cloned()).collect();
        let device = self.images.device();
        if kept.is_empty() {
            let size = self.transform.size() as i64;
            return Batch {
                images: Tensor::empty([0, size, size, 3], (Kind::Uint8, device)),
                labels: Tensor::empty([0], (Kind::Int64, device)),
                indices: kept,
                unreadable,
            };
        }
        let rows = Tensor::from_slice(&kept.iter().map(|&i| i as i64).collect::<Vec<_>>()).to_device(device);
        let images = self.images.index_select(0, &rows);
        let size = self.transform.size() as i64;
        let draws = || kept.iter().map(|&i| self.draw(i, epoch));
        let images = match self.transform {
            Transform::Eval { .. } => images,
            Transform::Train { pad: Some(pad), .. } => {
                let moves: Vec<_> = draws().map(|d| d.1).collect();
                shift_and_flip(&images, &moves, pad as i64, size)
            }
            Transform::Train { pad: None, interpolation, .. } => {
                let draws: Vec<_> = draws().collect();
                match interpolation {
                    Interpolation::Bilinear => self.normalize.apply_pixels(&resized_crops(&images, &draws, size)),
                    Interpolation::Bicubic => self.normalize.apply_pixels(&antialiased_crops(&images, &draws, size)),
                    Interpolation::Nearest => {
                        let sizes: Vec<_> = kept.iter().map(|&i| self.sizes[i]).collect();
                        nearest_crops(&images, &self.transform, &draws, &sizes)
                    }
                }
            }
        };
        Batch {
            images,
            labels: self.labels.index_select(0, &rows),
            indices: kept,
            unreadable,
        }
    }

    /// Sample `i`'s box and moves in `epoch`, drawn as the host pipeline draws them.
    fn draw(&self, i: usize, epoch: u64) -> (CropBox, Moves) {
        let rng = &mut seeds::sample(self.seed, epoch, i as u64);
        let (w, h) = self.sizes[i];
        let bx = self.transform.source_box(w, h, rng);
        (bx, self.transform.moves(rng))
    }
}

/// Sample `i` as the device keeps it: decoded whole, or transformed to the output size (the
/// padded crop's resize alone; evaluation's whole transform).
fn prepare(samples: &Samples, i: usize, t: &Transform, canvas: bool, whole_jpeg: bool) -> Result<RgbImage> {
    let size = t.size();
    if canvas {
        return Ok(decode_sample(samples, i, None)?.0);
    }
    let mut out = RgbImage::new(size, size);
    match t {
        // The resize that precedes the padded crop: the whole image to size×size, decoded as
        // the host decodes it (a JPEG at 1/8 size when that still holds the output's pixels).
        Transform::Train { .. } => {
            let (img, whole) = decode_sample(samples, i, t.jpeg_shrink_to().filter(|_| !whole_jpeg))?;
            t.resize_into((&img).into(), whole, &mut out)?;
        }
        Transform::Eval { .. } => load_sample(samples, (i, i), t, (0, 0), whole_jpeg, None, &mut out)?,
    }
    Ok(out)
}

/// CIFAR's RandomCrop(size, padding=pad) + flip of uint8 [B,S,S,3] images as one gather from the
/// zero-padded batch: output (y, x) of image b takes padded (y + dy + pad, x' + dx + pad), x'
/// mirrored when flipped (the host shifts, then flips).
fn shift_and_flip(images: &Tensor, moves: &[Moves], pad: i64, size: i64) -> Tensor {
    let b = moves.len() as i64;
    let p = size + 2 * pad;
    let padded = images
        .constant_pad_nd([0, 0, pad, pad, pad, pad])
        .reshape([b * p * p, 3]);
    let mut flat = Vec::with_capacity((b * size * size) as usize);
    for (k, m) in moves.iter().enumerate() {
        let (dx, dy) = m.shift.unwrap_or((0, 0));
        for y in 0..size {
            for x in 0..size {
                let sx = if m.flip { size - 1 - x } else { x };
                flat.push(k as i64 * p * p + (y + dy + pad) * p + (sx + dx + pad));
            }
        }
    }
    let at = Tensor::from_slice(&flat).to_device(images.device());
    padded.index_select(0, &at).view([b, size, size, 3])
}

/// RandomResizedCrop + flip of uint8 [B,H,W,3] canvases: each output pixel's centre mapped into
/// its box (as a resize of the box does), bilinear, clamped to the box's pixels. Returns f32
/// [B,3,S,S] in 0..255.
fn resized_crops(canvas: &Tensor, draws: &[(CropBox, Moves)], size: i64) -> Tensor {
    let (b, ch, cw) = (draws.len() as i64, canvas.size()[1] as f64, canvas.size()[2] as f64);
    let device = canvas.device();
    // align_corners=False: normalised u ↔ pixel x = ((u + 1)·W − 1)/2. Output centre u_o maps to
    // x = left + (u_o + 1)·bw/2 − 1/2, so u = (bw/W)·u_o + (2·left + bw)/W − 1; a flip negates
    // the slope. The clamp keeps x within [left, left + bw − 1], the box's pixel centres.
    let (mut theta, mut lo, mut hi) = (Vec::new(), Vec::new(), Vec::new());
    for (bx, m) in draws {
        let sx = if m.flip { -bx.width / cw } else { bx.width / cw };
        theta.extend([sx, 0.0, (2.0 * bx.left + bx.width) / cw - 1.0]);
        theta.extend([0.0, bx.height / ch, (2.0 * bx.top + bx.height) / ch - 1.0]);
        let u = |x: f64, w: f64| (2.0 * x + 1.0) / w - 1.0;
        lo.extend([u(bx.left, cw), u(bx.top, ch)]);
        hi.extend([u(bx.left + bx.width - 1.0, cw), u(bx.top + bx.height - 1.0, ch)]);
    }
    let on = |v: Vec<f64>, shape: &[i64]| {
        Tensor::from_slice(&v)
            .to_kind(Kind::Float)
            .view(shape)
            .to_device(device)
    };
    let theta = on(theta, &[b, 2, 3]);
    let grid = Tensor::affine_grid_generator(&theta, [b, 3, size, size], false);
    let grid = grid.maximum(&on(lo, &[b, 1, 1, 2])).minimum(&on(hi, &[b, 1, 1, 2]));
    let x = canvas.permute([0, 3, 1, 2]).to_kind(Kind::Float);
    // bilinear (0), border padding (1): the clamp keeps every point inside the image anyway.
    x.grid_sampler(&grid, 0, 1, false)
}

/// RandomResizedCrop + flip of uint8 [B,H,W,3] canvases with torch's antialiased bicubic
/// interpolation (PIL's filter, as torchvision's `resized_crop` on tensors uses it): each box
/// (whole pixels: the images are stored whole) cut out and resized on its own, in PIL's two
/// passes. Returns f32 [B,3,S,S] in 0..255, whole numbers as the host's uint8 pixels.
fn antialiased_crops(canvas: &Tensor, draws: &[(CropBox, Moves)], size: i64) -> Tensor {
    let crops: Vec<Tensor> = draws
        .iter()
        .enumerate()
        .map(|(k, (bx, m))| {
            let crop = canvas
                .get(k as i64)
                .narrow(0, bx.top as i64, bx.height as i64)
                .narrow(1, bx.left as i64, bx.width as i64)
                .permute([2, 0, 1])
                .unsqueeze(0)
                .to_kind(Kind::Float);
            // Across, then down, each pass rounded (half up) and clamped to 0..255 as PIL's: a
            // bicubic overshoot is clamped between the passes, not carried into the second.
            let pass = |x: &Tensor, h: i64| {
                (x.internal_upsample_bicubic2d_aa([h, size], false, None, None) + 0.5)
                    .floor()
                    .clamp(0.0, 255.0)
            };
            let r = pass(&pass(&crop, bx.height as i64), size);
            if m.flip {
                r.flip([3])
            } else {
                r
            }
        })
        .collect();
    Tensor::cat(&crops, 0)
}

/// RandomResizedCrop + flip of uint8 [B,H,W,3] canvases by nearest neighbour: one gather of the
/// pixels the host takes (image b is `sizes[b]` in its canvas). Returns uint8 [B,S,S,3].
fn nearest_crops(canvas: &Tensor, t: &Transform, draws: &[(CropBox, Moves)], sizes: &[(u32, u32)]) -> Tensor {
    let (b, ch, cw) = (draws.len() as i64, canvas.size()[1], canvas.size()[2]);
    let size = t.size() as usize;
    let mut flat = Vec::with_capacity(draws.len() * size * size);
    for (k, ((bx, m), &(w, h))) in draws.iter().zip(sizes).enumerate() {
        let idx = t.nearest_indices(w, h, *bx);
        for &y in &idx.rows {
            for x in 0..size {
                let sx = idx.cols[if m.flip { size - 1 - x } else { x }];
                flat.push(k as i64 * ch * cw + y as i64 * cw + sx as i64);
            }
        }
    }
    let at = Tensor::from_slice(&flat).to_device(canvas.device());
    let s = size as i64;
    canvas.reshape([b * ch * cw, 3]).index_select(0, &at).view([b, s, s, 3])
}
