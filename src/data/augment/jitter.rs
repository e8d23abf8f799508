//! `--color-jitter`: torchvision v2's `ColorJitter` on uint8 pixels (timm's `--color-jitter`
//! gives it one value for brightness, contrast and saturation): a factor per adjustment drawn
//! uniformly from [max(0, 1 - v), 1 + v] (hue: [-h, h]), the four applied in a random order,
//! each `ops.rs`'s torchvision v2 kernel. In the pipeline after the flip, before a policy.
use anyhow::Result;
use rand::seq::SliceRandom;
use rand::Rng;

use super::ops::{self, Image};
use crate::bail_user;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ColorJitter {
    /// Factor ranges of brightness, contrast and saturation, and the hue's shift range (None:
    /// left alone, as torchvision leaves a 0).
    pub ranges: [Option<(f64, f64)>; 4],
}

impl ColorJitter {
    /// From `--color-jitter`: one value (brightness = contrast = saturation, as timm), three
    /// (brightness, contrast, saturation) or four (and hue, at most 0.5). None when all are 0.
    pub fn from_flag(values: &[f64]) -> Result<Option<ColorJitter>> {
        let v: [f64; 4] = match *values {
            [] => return Ok(None),
            [a] => [a, a, a, 0.0],
            [b, c, s] => [b, c, s, 0.0],
            [b, c, s, h] => [b, c, s, h],
            _ => bail_user!("--color-jitter takes 1, 3 or 4 values (brightness, contrast, saturation, hue), got {}", values.len()),
        };
        if v.iter().any(|&x| !(x >= 0.0 && x.is_finite())) || v[3] > 0.5 {
            bail_user!("--color-jitter values must be >= 0 (hue at most 0.5), got {values:?}");
        }
        let factor = |x: f64| (x > 0.0).then_some(((1.0 - x).max(0.0), 1.0 + x));
        let ranges = [factor(v[0]), factor(v[1]), factor(v[2]), (v[3] > 0.0).then_some((-v[3], v[3]))];
        Ok(ranges.iter().any(Option::is_some).then_some(ColorJitter { ranges }))
    }

    /// The draws for one image: the order of the four adjustments and each one's factor.
    pub fn draw(&self, rng: &mut impl Rng) -> ([usize; 4], [Option<f64>; 4]) {
        let mut order = [0, 1, 2, 3];
        order.shuffle(rng);
        let factors = self.ranges.map(|r| r.map(|(lo, hi)| if hi > lo { rng.gen_range(lo..hi) } else { lo }));
        (order, factors)
    }

    /// Draws and applies the jitter to a size×size image.
    pub fn apply(&self, px: &mut [u8], size: usize, rng: &mut impl Rng) {
        let (order, factors) = self.draw(rng);
        let img = &mut Image { w: size, h: size, px };
        for k in order {
            let Some(f) = factors[k] else { continue };
            match k {
                0 => ops::brightness(img, f),
                1 => ops::contrast(img, f),
                2 => ops::saturation(img, f),
                _ => ops::hue(img, f),
            }
        }
    }
}
