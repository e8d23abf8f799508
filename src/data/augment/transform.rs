//! Geometric transforms with torchvision's semantics (on PIL images), each done as ONE
//! antialiased bilinear resize of a source box straight to the output size:
//! - train: RandomResizedCrop(size, scale, ratio) + RandomHorizontalFlip(0.5)
//! - train, CIFAR style (`pad`): Resize(size) + RandomCrop(size, padding=pad) + flip
//! - eval:  Resize(resize_size) (shorter side) + CenterCrop(size)
//! - train, optionally: RandomErasing (`erasing.rs`) on the output
//!
//! Output is size×size RGB8 (HWC); float conversion and Normalize happen on the device.
use anyhow::{Context, Result};
use fast_image_resize as fr;
use image::RgbImage;
use rand::Rng;

use super::erasing::RandomErasing;
use crate::data::pixels::{CropBox, RgbView};

#[derive(Debug, Clone)]
pub enum Transform {
    Train {
        size: u32,
        scale: (f64, f64),
        ratio: (f64, f64),
        hflip: bool,
        erase: Option<RandomErasing>,
        /// RandomCrop(size, padding=pad, fill 0) of the whole image resized to size×size,
        /// instead of RandomResizedCrop (scale and ratio then unused).
        pad: Option<u32>,
    },
    Eval {
        size: u32,
        resize: u32,
    },
}

/// `Transform::moves`: what a training image does after its box is resized.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Moves {
    pub shift: Option<(i64, i64)>,
    pub flip: bool,
}

/// torchvision's `RandomResizedCrop.get_params`: ten tries at a random area and aspect ratio,
/// then a centre crop with the ratio clamped into range. Sizes are rounded as Python's `round`
/// does (half to even).
pub fn random_resized_crop_box(w: u32, h: u32, scale: (f64, f64), ratio: (f64, f64), rng: &mut impl Rng) -> CropBox {
    let (wf, hf) = (w as f64, h as f64);
    let area = wf * hf;
    let (lr0, lr1) = (ratio.0.ln(), ratio.1.ln());
    for _ in 0..10 {
        let target = area * rng.gen_range(scale.0..=scale.1);
        let aspect = rng.gen_range(lr0..=lr1).exp();
        let cw = (target * aspect).sqrt().round_ties_even();
        let ch = (target / aspect).sqrt().round_ties_even();
        if cw > 0.0 && cw <= wf && ch > 0.0 && ch <= hf {
            let top = rng.gen_range(0..=(h - ch as u32)) as f64;
            let left = rng.gen_range(0..=(w - cw as u32)) as f64;
            return CropBox {
                left,
                top,
                width: cw,
                height: ch,
            };
        }
    }
    let in_ratio = wf / hf;
    let (cw, ch) = if in_ratio < ratio.0 {
        (wf, (wf / ratio.0).round_ties_even())
    } else if in_ratio > ratio.1 {
        ((hf * ratio.1).round_ties_even(), hf)
    } else {
        (wf, hf)
    };
    CropBox {
        left: ((wf - cw) / 2.0).trunc(),
        top: ((hf - ch) / 2.0).trunc(),
        width: cw,
        height: ch,
    }
}

/// Resize(resize) then CenterCrop(size), expressed as a box in source pixels.
pub fn resize_center_crop_box(w: u32, h: u32, resize: u32, size: u32) -> CropBox {
    // torchvision: the shorter side becomes `resize`, the longer int(resize * long / short).
    let (nw, nh) = if w <= h {
        (resize as f64, (resize as f64 * h as f64 / w as f64).trunc())
    } else {
        ((resize as f64 * w as f64 / h as f64).trunc(), resize as f64)
    };
    let s = size as f64;
    // CenterCrop: int(round((H - crop) / 2)), Python's round (73 px to 64: offset 4, not 5); a
    // crop larger than the image pads in torchvision, here it clamps to the image (only
    // reachable with resize < size).
    let top = ((nh - s) / 2.0).round_ties_even().max(0.0);
    let left = ((nw - s) / 2.0).round_ties_even().max(0.0);
    let (sx, sy) = (w as f64 / nw, h as f64 / nh);
    CropBox {
        left: left * sx,
        top: top * sy,
        width: s.min(nw) * sx,
        height: s.min(nh) * sy,
    }
}

/// Antialiased bilinear resize of `bx` in `img` to size×size, written into `out` (HWC RGB8).
/// Near the box's edges the filter reads the pixels around it, as a resize of the whole image
/// followed by a crop does (torchvision's Resize + CenterCrop).
pub fn resize_box_into(img: RgbView<'_>, bx: CropBox, size: u32, out: &mut [u8]) -> Result<()> {
    let src = fr::images::ImageRef::new(img.width, img.height, img.px, fr::PixelType::U8x3).context("source image")?;
    let mut dst = fr::images::Image::from_slice_u8(size, size, out, fr::PixelType::U8x3).context("destination")?;
    let opts = fr::ResizeOptions::new()
        .resize_alg(fr::ResizeAlg::Convolution(fr::FilterType::Bilinear))
        .crop(bx.left, bx.top, bx.width, bx.height);
    fr::Resizer::new().resize(&src, &mut dst, &opts).context("resize")?;
    Ok(())
}

/// RandomResizedCrop's resize: torchvision cuts the box out first (PIL's `crop`, then `resize`),
/// so near the box's edges the filter reads only pixels inside it. Reading the pixels around it
/// instead changed up to 36 levels at the edges of CIFAR-sized crops. A box that does not lie on
/// whole pixels (from a JPEG decoded at 1/8 size) cannot be cut and is resized in place.
pub fn resize_cut_box_into(img: RgbView<'_>, bx: CropBox, size: u32, out: &mut [u8]) -> Result<()> {
    let whole = [bx.left, bx.top, bx.width, bx.height].iter().all(|v| v.fract() == 0.0);
    if !whole {
        return resize_box_into(img, bx, size, out);
    }
    let (w, h) = (bx.width as usize, bx.height as usize);
    let (left, top, stride) = (bx.left as usize, bx.top as usize, img.width as usize * 3);
    let mut cut = Vec::with_capacity(w * h * 3);
    for row in img.px.chunks_exact(stride).skip(top).take(h) {
        cut.extend_from_slice(&row[left * 3..(left + w) * 3]);
    }
    let all = CropBox::whole(w as u32, h as u32);
    let cut = RgbView {
        width: w as u32,
        height: h as u32,
        px: &cut,
    };
    resize_box_into(cut, all, size, out)
}

fn flip_horizontal(buf: &mut [u8], size: usize) {
    for row in buf.chunks_exact_mut(size * 3) {
        for x in 0..size / 2 {
            for c in 0..3 {
                row.swap(x * 3 + c, (size - 1 - x) * 3 + c);
            }
        }
    }
}

/// RandomCrop with zero padding, in place: output pixel (x, y) takes input (x + dx, y + dy), or 0
/// where that falls outside the image.
fn shift_with_zero_fill(buf: &mut [u8], size: usize, dx: i64, dy: i64) {
    let src = buf.to_vec();
    let n = size as i64;
    for y in 0..n {
        for x in 0..n {
            let (sx, sy) = (x + dx, y + dy);
            let o = ((y * n + x) * 3) as usize;
            if (0..n).contains(&sx) && (0..n).contains(&sy) {
                let i = ((sy * n + sx) * 3) as usize;
                buf[o..o + 3].copy_from_slice(&src[i..i + 3]);
            } else {
                buf[o..o + 3].fill(0);
            }
        }
    }
}

impl Transform {
    pub fn size(&self) -> u32 {
        match self {
            Transform::Train { size, .. } | Transform::Eval { size, .. } => *size,
        }
    }

    /// Applies the transform into `out` (size*size*3 bytes), drawing randomness from `rng`.
    pub fn apply(&self, img: &RgbImage, rng: &mut impl Rng, out: &mut [u8]) -> Result<()> {
        let bx = self.source_box(img.width(), img.height(), rng);
        self.finish(img.into(), bx, rng, out)
    }

    /// Step one: the box of a w×h source image that becomes the output (the first draws from
    /// `rng`). Known before decoding, so a decoder can shrink the image while decoding.
    pub fn source_box(&self, w: u32, h: u32, rng: &mut impl Rng) -> CropBox {
        match *self {
            Transform::Train { pad: Some(_), .. } => CropBox::whole(w, h),
            Transform::Train { scale, ratio, .. } => random_resized_crop_box(w, h, scale, ratio, rng),
            Transform::Eval { size, resize } => resize_center_crop_box(w, h, resize, size),
        }
    }

    /// Step two: resize `bx` of `img` into `out`, then flip and erase (the remaining draws).
    pub fn finish(&self, img: RgbView<'_>, bx: CropBox, rng: &mut impl Rng, out: &mut [u8]) -> Result<()> {
        match self {
            Transform::Train { pad: None, .. } => resize_cut_box_into(img, bx, self.size(), out)?,
            _ => resize_box_into(img, bx, self.size(), out)?,
        }
        if let Transform::Train { size, ref erase, .. } = *self {
            let moves = self.moves(rng);
            if let Some((dx, dy)) = moves.shift {
                shift_with_zero_fill(out, size as usize, dx, dy);
            }
            if moves.flip {
                flip_horizontal(out, size as usize);
            }
            if let Some(e) = erase {
                e.apply(out, size as usize, rng);
            }
        }
        Ok(())
    }

    /// The training draws after the box, in `finish`'s order: the padded crop's shift (output
    /// pixel (x, y) takes input (x + dx, y + dy)), then the flip. The device-side augmentation
    /// (`load/on_device.rs`) draws them here too, so both paths make the same choices.
    pub fn moves(&self, rng: &mut impl Rng) -> Moves {
        let Transform::Train { hflip, pad, .. } = *self else {
            return Moves::default();
        };
        let shift = pad.map(|pad| {
            let (dx, dy) = (rng.gen_range(0..=2 * pad), rng.gen_range(0..=2 * pad));
            (dx as i64 - pad as i64, dy as i64 - pad as i64)
        });
        Moves {
            shift,
            flip: hflip && rng.gen_bool(0.5),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn random_crop_boxes_stay_inside_and_respect_scale() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        for _ in 0..2000 {
            let b = random_resized_crop_box(150, 100, (0.08, 1.0), (0.75, 4.0 / 3.0), &mut rng);
            assert!(b.left >= 0.0 && b.top >= 0.0);
            assert!(b.left + b.width <= 150.0 && b.top + b.height <= 100.0);
            assert!(b.width * b.height >= 0.05 * 15000.0);
        }
    }

    #[test]
    fn center_crop_box_matches_torchvision_arithmetic() {
        // 150x100 -> Resize(146) -> 219x146 -> CenterCrop(128): top 9, left 46 (in resized px).
        let b = resize_center_crop_box(150, 100, 146, 128);
        let s = 100.0 / 146.0;
        assert!((b.top - 9.0 * s).abs() < 1e-9 && (b.height - 128.0 * s).abs() < 1e-9);
        assert!((b.left - 46.0 * 150.0 / 219.0).abs() < 1e-9);
    }

    #[test]
    fn padded_crop_shifts_and_fills_with_zero() {
        // 3x3 image, pixel value = 10*y + x in every channel; shift by (1, -1).
        let mut buf: Vec<u8> = (0..9).flat_map(|i| [(10 * (i / 3) + i % 3) as u8; 3]).collect();
        shift_with_zero_fill(&mut buf, 3, 1, -1);
        let got: Vec<u8> = buf.chunks(3).map(|p| p[0]).collect();
        assert_eq!(got, vec![0, 0, 0, 1, 2, 0, 11, 12, 0]);
    }

    #[test]
    fn flip_mirrors_rows() {
        let mut buf: Vec<u8> = (0..2 * 2 * 3).map(|x| x as u8).collect();
        flip_horizontal(&mut buf, 2);
        assert_eq!(buf, vec![3, 4, 5, 0, 1, 2, 9, 10, 11, 6, 7, 8]);
    }

    #[test]
    fn erasing_is_deterministic_per_rng_and_p_zero_is_no_erasing() {
        use super::super::erasing::{EraseMode, RandomErasing};
        let img = RgbImage::from_fn(40, 30, |x, y| image::Rgb([x as u8 * 5, y as u8 * 7, 200]));
        let train = |erase| Transform::Train {
            size: 24,
            scale: (0.5, 1.0),
            ratio: (0.75, 4.0 / 3.0),
            hflip: true,
            erase,
            pad: None,
        };
        let erase = |p| {
            Some(RandomErasing {
                p,
                mode: EraseMode::Pixel,
                mean: crate::data::IMAGENET_MEAN,
                std: crate::data::IMAGENET_STD,
            })
        };
        let run = |t: &Transform, seed| {
            let mut out = vec![0u8; 24 * 24 * 3];
            t.apply(&img, &mut rand_chacha::ChaCha8Rng::seed_from_u64(seed), &mut out)
                .unwrap();
            out
        };
        let (plain, off, on) = (train(None), train(erase(0.0)), train(erase(1.0)));
        for seed in 0..20 {
            assert_eq!(run(&plain, seed), run(&off, seed));
            assert_eq!(run(&on, seed), run(&on, seed));
            assert_ne!(run(&on, seed), run(&plain, seed));
        }
    }

    #[test]
    fn eval_transform_of_constant_image_is_constant() {
        let img = RgbImage::from_pixel(90, 60, image::Rgb([9, 200, 31]));
        let mut out = vec![0u8; 32 * 32 * 3];
        let t = Transform::Eval { size: 32, resize: 36 };
        t.apply(&img, &mut rand_chacha::ChaCha8Rng::seed_from_u64(0), &mut out)
            .unwrap();
        assert!(out.chunks(3).all(|p| p == [9, 200, 31]));
    }
}
