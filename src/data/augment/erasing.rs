//! RandomErasing (torchvision's `RandomErasing`, timm's `RandomErasing(mode='const'|'pixel')`),
//! done on the host in the uint8 HWC output of the training transform. It draws from the
//! sample's own RNG after the crop and flip, so it stays deterministic and independent of the
//! thread count. In the pipeline it sits where torchvision puts it: after Normalize, which here
//! happens later on the device, so the fill colours are the uint8 pixels that normalise to what
//! torchvision and timm write.
use rand::Rng;
use rand_distr::StandardNormal;
use serde::{Deserialize, Serialize};

/// Erased area as a fraction of the image (torchvision's default `scale`).
pub const ERASE_SCALE: (f64, f64) = (0.02, 1.0 / 3.0);
/// Height/width ratio range of the box, sampled log-uniformly (torchvision's default `ratio`).
pub const ERASE_RATIO: (f64, f64) = (0.3, 3.3);
/// Tries at a box that fits before giving up (no erasing then).
const ATTEMPTS: usize = 10;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum EraseMode {
    /// The per-channel mean colour, round(mean*255): torchvision's `RandomErasing(value=0)`
    /// after Normalize, up to uint8 rounding.
    Const,
    /// Per-pixel, per-channel normal noise in normalised space (timm's mode='pixel'), stored as
    /// clamp(round(255*(mean + std*N(0,1)))), so clipped to what uint8 can hold.
    Pixel,
}

#[derive(Debug, Clone, PartialEq)]
pub struct RandomErasing {
    /// Probability that an image gets a box.
    pub p: f64,
    pub mode: EraseMode,
    /// The Normalize constants the batch will get (0..1 scale).
    pub mean: [f64; 3],
    pub std: [f64; 3],
}

/// A box in pixels: rows top..top+h, columns left..left+w.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EraseBox {
    pub top: usize,
    pub left: usize,
    pub h: usize,
    pub w: usize,
}

/// torchvision's `RandomErasing.get_params`: up to ten tries at a random area and log-uniform
/// aspect ratio; a box must be strictly smaller than the image in both directions.
pub fn erase_box(img_h: usize, img_w: usize, rng: &mut impl Rng) -> Option<EraseBox> {
    let area = (img_h * img_w) as f64;
    let (lr0, lr1) = (ERASE_RATIO.0.ln(), ERASE_RATIO.1.ln());
    for _ in 0..ATTEMPTS {
        let target = area * rng.gen_range(ERASE_SCALE.0..ERASE_SCALE.1);
        let aspect = rng.gen_range(lr0..lr1).exp();
        // Python's round() rounds halves to even.
        let h = (target * aspect).sqrt().round_ties_even() as usize;
        let w = (target / aspect).sqrt().round_ties_even() as usize;
        if h < img_h && w < img_w {
            let top = rng.gen_range(0..=img_h - h);
            let left = rng.gen_range(0..=img_w - w);
            return Some(EraseBox { top, left, h, w });
        }
    }
    None
}

impl RandomErasing {
    /// With probability `p`, erases one box of `buf` (a size×size RGB8 HWC image).
    pub fn apply(&self, buf: &mut [u8], size: usize, rng: &mut impl Rng) {
        debug_assert_eq!(buf.len(), size * size * 3);
        if rng.gen::<f64>() >= self.p {
            return;
        }
        let Some(b) = erase_box(size, size, rng) else {
            return;
        };
        let to_u8 = |v: f64| (v * 255.0).round().clamp(0.0, 255.0) as u8;
        let colour = [to_u8(self.mean[0]), to_u8(self.mean[1]), to_u8(self.mean[2])];
        for row in b.top..b.top + b.h {
            let start = (row * size + b.left) * 3;
            for px in buf[start..start + b.w * 3].chunks_exact_mut(3) {
                match self.mode {
                    EraseMode::Const => px.copy_from_slice(&colour),
                    EraseMode::Pixel => {
                        for (c, v) in px.iter_mut().enumerate() {
                            let n: f64 = rng.sample(StandardNormal);
                            *v = to_u8(self.mean[c] + self.std[c] * n);
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::{IMAGENET_MEAN, IMAGENET_STD};
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    fn erasing(p: f64, mode: EraseMode) -> RandomErasing {
        RandomErasing {
            p,
            mode,
            mean: IMAGENET_MEAN,
            std: IMAGENET_STD,
        }
    }

    /// An image none of whose pixels is the mean colour (124, 116, 104).
    fn image(size: usize) -> Vec<u8> {
        (0..size * size * 3).map(|i| (i % 97) as u8 + 150).collect()
    }

    #[test]
    fn p_zero_changes_nothing() {
        let e = erasing(0.0, EraseMode::Const);
        let mut rng = ChaCha8Rng::seed_from_u64(0);
        for _ in 0..100 {
            let mut buf = image(16);
            e.apply(&mut buf, 16, &mut rng);
            assert_eq!(buf, image(16));
        }
    }

    #[test]
    fn const_mode_fills_one_box_of_the_right_size_with_the_mean_colour() {
        let e = erasing(1.0, EraseMode::Const);
        let size = 64;
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        for _ in 0..300 {
            let mut buf = image(size);
            e.apply(&mut buf, size, &mut rng);
            let erased: Vec<(usize, usize)> = (0..size * size)
                .filter(|&i| buf[i * 3..i * 3 + 3] == [124, 116, 104])
                .map(|i| (i / size, i % size))
                .collect();
            let (r0, r1) = (
                erased.iter().map(|p| p.0).min().unwrap(),
                erased.iter().map(|p| p.0).max().unwrap(),
            );
            let (c0, c1) = (
                erased.iter().map(|p| p.1).min().unwrap(),
                erased.iter().map(|p| p.1).max().unwrap(),
            );
            let (h, w) = (r1 - r0 + 1, c1 - c0 + 1);
            assert_eq!(erased.len(), h * w, "the erased pixels form one rectangle");
            assert!(h < size && w < size);
            // Sides are rounded: the unrounded area lies within half a pixel on each side.
            let area = (size * size) as f64;
            let (lo, hi) = ((h as f64 - 0.5) * (w as f64 - 0.5), (h as f64 + 0.5) * (w as f64 + 0.5));
            assert!(lo <= ERASE_SCALE.1 * area && hi >= ERASE_SCALE.0 * area, "{h}x{w}");
            // Everything outside the box is untouched.
            let orig = image(size);
            for i in 0..size * size {
                let (r, c) = (i / size, i % size);
                if !(r0..=r1).contains(&r) || !(c0..=c1).contains(&c) {
                    assert_eq!(buf[i * 3..i * 3 + 3], orig[i * 3..i * 3 + 3]);
                }
            }
        }
    }

    #[test]
    fn boxes_cover_the_scale_range_and_stay_inside() {
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        let (mut min_f, mut max_f) = (1.0f64, 0.0f64);
        for _ in 0..5000 {
            let b = erase_box(224, 224, &mut rng).unwrap();
            assert!(b.top + b.h <= 224 && b.left + b.w <= 224);
            let f = (b.h * b.w) as f64 / (224.0 * 224.0);
            assert!((0.018..=0.345).contains(&f), "area fraction {f}");
            let r = b.h as f64 / b.w as f64;
            assert!((0.28..=3.6).contains(&r), "aspect {r}");
            (min_f, max_f) = (min_f.min(f), max_f.max(f));
        }
        assert!(min_f < 0.025 && max_f > 0.3, "{min_f} {max_f}");
    }

    #[test]
    fn pixel_mode_is_noise_around_the_mean_and_deterministic() {
        let e = erasing(1.0, EraseMode::Pixel);
        let run = |seed| {
            let mut buf = vec![0u8; 96 * 96 * 3];
            e.apply(&mut buf, 96, &mut ChaCha8Rng::seed_from_u64(seed));
            buf
        };
        let (a, b) = (run(4), run(4));
        assert_eq!(a, b);
        assert_ne!(a, run(5));
        let vals: Vec<f64> = a.chunks(3).filter(|p| p != &[0, 0, 0]).map(|p| p[0] as f64).collect();
        assert!(vals.len() > 100);
        // Red: mean 0.485*255 = 123.7, std 0.229*255 = 58.4 (clipping at 0/255 barely moves it).
        let mean = vals.iter().sum::<f64>() / vals.len() as f64;
        let sd = (vals.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / vals.len() as f64).sqrt();
        assert!((mean - 123.7).abs() < 12.0 && (sd - 58.4).abs() < 8.0, "{mean} {sd}");
    }
}
