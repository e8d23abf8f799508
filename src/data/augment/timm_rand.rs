//! timm's RandAugment, named by its string (`--auto-augment rand-m9-mstd0.5-inc1`): timm's
//! operations, its magnitude scale (0..10, with Gaussian noise `mstd`), each drawn operation
//! applied with probability `p`, and PIL's arithmetic (`pil.rs`): what `timm.data.
//! rand_augment_transform` does to a PIL image in timm's training transform, the fill being the
//! run's mean colour and the filter the run's `--interpolation`.
use std::fmt;
use std::str::FromStr;

use rand::Rng;
use rand_distr::{Distribution, Normal};

use super::ops::{self, Image};
use super::pil::{self, Filter};
use crate::error::UserError;

/// The settings a RandAugment string gives (timm's defaults where it is silent).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TimmRandSpec {
    /// `m`: the magnitude, 0..`mmax` (10).
    pub magnitude: u32,
    /// `n`: operations drawn per image, with replacement (2).
    pub num_ops: u32,
    /// `p`: each drawn operation's probability (0.5).
    pub prob: f64,
    /// `mstd`: the standard deviation of the magnitude's noise (0: none; above 100: uniform in
    /// 0..m).
    pub mstd: f64,
    /// `mmax`: the magnitude's upper bound (None: 10).
    pub mmax: Option<u32>,
    /// `inc`: the operations whose severity increases with the magnitude (`inc1`).
    pub increasing: bool,
}

impl FromStr for TimmRandSpec {
    type Err = UserError;

    /// timm's `rand_augment_transform` string: `rand` then `-`-separated sections `m9`, `n2`,
    /// `p0.5`, `mstd0.5`, `mmax10`, `inc1` in any order.
    fn from_str(s: &str) -> Result<Self, UserError> {
        let bad = |why: String| UserError(format!("invalid --auto-augment '{s}': {why}"));
        let mut sections = s.split('-');
        if sections.next() != Some("rand") {
            return Err(bad("timm's RandAugment strings begin with 'rand'".into()));
        }
        let mut spec = TimmRandSpec {
            magnitude: 10,
            num_ops: 2,
            prob: 0.5,
            mstd: 0.0,
            mmax: None,
            increasing: false,
        };
        for c in sections {
            let digit = c.find(|ch: char| ch.is_ascii_digit());
            let (key, val) = c.split_at(digit.unwrap_or(c.len()));
            let int = || val.parse::<u32>().map_err(|_| bad(format!("section '{c}' needs a whole number")));
            let float = || match val.parse::<f64>() {
                Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
                _ => Err(bad(format!("section '{c}' needs a number >= 0"))),
            };
            match key {
                "m" => spec.magnitude = int()?,
                "n" => spec.num_ops = int()?,
                "p" => spec.prob = float()?,
                "mstd" => spec.mstd = float()?,
                "mmax" => spec.mmax = Some(int()?),
                "inc" => spec.increasing = int()? != 0,
                k if k.starts_with('t') => {
                    return Err(bad(format!("timm's operation sets ('{c}') are not taken; its default set is")))
                }
                _ => return Err(bad(format!("unknown section '{c}' (m, n, p, mstd, mmax, inc)"))),
            }
        }
        if spec.num_ops == 0 || spec.prob > 1.0 || spec.mmax == Some(0) {
            return Err(bad("n must be at least 1, p at most 1, mmax above 0".into()));
        }
        Ok(spec)
    }
}

impl fmt::Display for TimmRandSpec {
    /// The string it was parsed from, in a fixed order, timm's defaults left out.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rand-m{}", self.magnitude)?;
        if self.num_ops != 2 {
            write!(f, "-n{}", self.num_ops)?;
        }
        if self.mstd != 0.0 {
            write!(f, "-mstd{}", self.mstd)?;
        }
        if let Some(m) = self.mmax {
            write!(f, "-mmax{m}")?;
        }
        if self.increasing {
            write!(f, "-inc1")?;
        }
        if self.prob != 0.5 {
            write!(f, "-p{}", self.prob)?;
        }
        Ok(())
    }
}

/// timm's RandAugment operations (`_RAND_TRANSFORMS`; with `inc1` the increasing variants of
/// posterize, solarize and the four enhancements).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TimmOp {
    AutoContrast,
    Equalize,
    Invert,
    Rotate,
    Posterize,
    Solarize,
    SolarizeAdd,
    Color,
    Contrast,
    Brightness,
    Sharpness,
    ShearX,
    ShearY,
    TranslateXRel,
    TranslateYRel,
}

impl TimmOp {
    pub const ALL: [TimmOp; 15] = [
        TimmOp::AutoContrast,
        TimmOp::Equalize,
        TimmOp::Invert,
        TimmOp::Rotate,
        TimmOp::Posterize,
        TimmOp::Solarize,
        TimmOp::SolarizeAdd,
        TimmOp::Color,
        TimmOp::Contrast,
        TimmOp::Brightness,
        TimmOp::Sharpness,
        TimmOp::ShearX,
        TimmOp::ShearY,
        TimmOp::TranslateXRel,
        TimmOp::TranslateYRel,
    ];

    /// The four ImageEnhance operations.
    fn enhances(self) -> bool {
        matches!(self, TimmOp::Color | TimmOp::Contrast | TimmOp::Brightness | TimmOp::Sharpness)
    }

    /// timm's name of the operation (`inc1` names the increasing ones `…Increasing`).
    pub fn name(self, increasing: bool) -> String {
        let base = format!("{self:?}");
        match increasing && (self.enhances() || matches!(self, TimmOp::Posterize | TimmOp::Solarize)) {
            true => format!("{base}Increasing"),
            false => base,
        }
    }
}

/// One drawn operation with its argument as timm's level function gives it (None: it takes
/// none).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TimmStep {
    pub op: TimmOp,
    pub arg: Option<f64>,
}

/// timm's RandAugment as the pipeline runs it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TimmRand {
    pub spec: TimmRandSpec,
    pub filter: Filter,
    /// timm's `img_mean`: the fill of the geometric operations.
    pub fill: [u8; 3],
}

/// timm's `_LEVEL_DENOM` and `translate_pct`.
const LEVEL_DENOM: f64 = 10.0;
const TRANSLATE_PCT: f64 = 0.45;

impl TimmRand {
    /// timm's `AugmentOp.__call__` before the operation: the magnitude with its noise, and the
    /// level function's argument from it, signed with probability 1/2 where timm's
    /// `_randomly_negate` applies.
    fn arg(&self, op: TimmOp, rng: &mut impl Rng) -> Option<f64> {
        let m = self.spec.magnitude as f64;
        let m = match self.spec.mstd {
            0.0 => m,
            sd if sd > 100.0 => rng.gen_range(0.0..=m),
            sd => Normal::new(m, sd).expect("a finite standard deviation").sample(rng),
        };
        let geometric = matches!(op, TimmOp::Rotate | TimmOp::ShearX | TimmOp::ShearY);
        let signed = geometric
            || matches!(op, TimmOp::TranslateXRel | TimmOp::TranslateYRel)
            || (self.spec.increasing && op.enhances());
        let negative = signed && rng.gen_bool(0.5);
        self.level_arg(op, m, negative)
    }

    /// timm's level function of `op` at `magnitude` (clipped to 0..mmax first), negated where
    /// `negative` and the operation takes a sign.
    pub fn level_arg(&self, op: TimmOp, magnitude: f64, negative: bool) -> Option<f64> {
        let s = &self.spec;
        let level = magnitude.clamp(0.0, s.mmax.map_or(LEVEL_DENOM, |v| v as f64)) / LEVEL_DENOM;
        let signed = |v: f64| if negative { -v } else { v };
        let inc = s.increasing;
        Some(match op {
            TimmOp::AutoContrast | TimmOp::Equalize | TimmOp::Invert => return None,
            TimmOp::Rotate => signed(level * 30.0),
            TimmOp::ShearX | TimmOp::ShearY => signed(level * 0.3),
            TimmOp::TranslateXRel | TimmOp::TranslateYRel => signed(level * TRANSLATE_PCT),
            TimmOp::Posterize => {
                let bits = (level * 4.0) as i64 as f64;
                if inc {
                    4.0 - bits
                } else {
                    bits
                }
            }
            TimmOp::Solarize => {
                let t = ((level * 256.0) as i64).min(256) as f64;
                if inc {
                    256.0 - t
                } else {
                    t
                }
            }
            TimmOp::SolarizeAdd => ((level * 110.0) as i64).min(128) as f64,
            TimmOp::Color | TimmOp::Contrast | TimmOp::Brightness | TimmOp::Sharpness => match inc {
                true => (1.0 + signed(level * 0.9)).max(0.1),
                false => level * 1.8 + 0.1,
            },
        })
    }

    /// timm's `RandAugment.__call__`: `n` operations drawn uniformly with replacement, each
    /// kept with probability `p`.
    pub fn draw(&self, rng: &mut impl Rng) -> Vec<TimmStep> {
        let mut steps = Vec::new();
        for _ in 0..self.spec.num_ops {
            let op = TimmOp::ALL[rng.gen_range(0..TimmOp::ALL.len())];
            if self.spec.prob < 1.0 && rng.gen::<f64>() > self.spec.prob {
                continue;
            }
            steps.push(TimmStep { op, arg: self.arg(op, rng) });
        }
        steps
    }

    /// One operation with its argument, as timm's op functions call PIL.
    pub fn apply_step(&self, step: TimmStep, img: &mut Image) {
        let a = step.arg.unwrap_or(0.0);
        let (filter, fill) = (self.filter, self.fill);
        match step.op {
            TimmOp::AutoContrast => pil::autocontrast(img),
            TimmOp::Equalize => ops::equalize(img),
            TimmOp::Invert => img.px.iter_mut().for_each(|v| *v = !*v),
            TimmOp::Rotate => pil::rotate(img, a, filter, fill),
            TimmOp::Posterize => ops::posterize(img, a as u32),
            // PIL's solarize is torchvision's: at or above the (whole) threshold, inverted.
            TimmOp::Solarize => ops::solarize(img, a),
            TimmOp::SolarizeAdd => pil::solarize_add(img, a as u32, 128),
            TimmOp::Color => pil::color(img, a),
            TimmOp::Contrast => pil::contrast(img, a),
            TimmOp::Brightness => pil::brightness(img, a),
            TimmOp::Sharpness => pil::sharpness(img, a),
            TimmOp::ShearX => pil::affine(img, [1.0, a, 0.0, 0.0, 1.0, 0.0], filter, fill),
            TimmOp::ShearY => pil::affine(img, [1.0, 0.0, 0.0, a, 1.0, 0.0], filter, fill),
            TimmOp::TranslateXRel => pil::affine(img, [1.0, 0.0, a * img.w as f64, 0.0, 1.0, 0.0], filter, fill),
            TimmOp::TranslateYRel => pil::affine(img, [1.0, 0.0, 0.0, 0.0, 1.0, a * img.h as f64], filter, fill),
        }
    }

    /// Draws and applies the policy to a size×size image.
    pub fn apply(&self, px: &mut [u8], size: usize, rng: &mut impl Rng) {
        let mut img = Image { w: size, h: size, px };
        for step in self.draw(rng) {
            self.apply_step(step, &mut img);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_parse_as_timm_reads_them_and_print_back() {
        let s: TimmRandSpec = "rand-m9-mstd0.5-inc1".parse().unwrap();
        assert_eq!((s.magnitude, s.num_ops, s.prob, s.mstd, s.mmax, s.increasing), (9, 2, 0.5, 0.5, None, true));
        assert_eq!(s.to_string(), "rand-m9-mstd0.5-inc1");
        let s: TimmRandSpec = "rand-inc0-p1-n3-mmax20-m15".parse().unwrap();
        assert_eq!((s.magnitude, s.num_ops, s.prob, s.mmax, s.increasing), (15, 3, 1.0, Some(20), false));
        assert_eq!(s.to_string().parse::<TimmRandSpec>().unwrap(), s);
        for (bad, why) in [
            ("rand-m9-tweights", "operation sets"),
            ("rand-x3", "unknown section 'x3'"),
            ("rand-m", "needs a whole number"),
            ("rand-p2", "p at most 1"),
            ("rank-m9", "begin with 'rand'"),
        ] {
            let e = bad.parse::<TimmRandSpec>().unwrap_err().0;
            assert!(e.contains(why), "{bad}: {e}");
        }
    }
}
