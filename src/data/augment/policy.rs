//! Augmentation policies (`--auto-augment`) as `torchvision.transforms.v2` defines them:
//! TrivialAugmentWide, RandAugment, AutoAugment (ImageNet, CIFAR-10 and SVHN policies) and
//! AugMix, with their magnitude bins and their choices, drawn from the sample's own RNG after the
//! crop and flip (where torchvision's reference recipe puts them). The operations are `ops.rs`.
use rand::Rng;
use rand_distr::{Distribution, Gamma};

use super::ops::{self, Image, Op, Sampling};
use super::timm_rand::{TimmRand, TimmRandSpec};

crate::flag_enum! {
    /// `--auto-augment`: torchvision's reference names (`train.py --auto-augment`).
    pub enum AutoAugment("invalid --auto-augment") {
        TaWide = "ta_wide",
        Ra = "ra",
        Imagenet = "imagenet",
        Cifar10 = "cifar10",
        Svhn = "svhn",
        Augmix = "augmix",
    }
}

/// `--auto-augment`: one of torchvision's policies by name, or timm's RandAugment by its string.
#[derive(Debug, Clone, Copy, PartialEq, serde_with::SerializeDisplay, serde_with::DeserializeFromStr)]
pub enum PolicyName {
    Torchvision(AutoAugment),
    TimmRand(TimmRandSpec),
}

impl std::str::FromStr for PolicyName {
    type Err = crate::error::UserError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s == "rand" || s.starts_with("rand-") {
            true => s.parse().map(PolicyName::TimmRand),
            false => s.parse().map(PolicyName::Torchvision).map_err(|e: crate::error::UserError| {
                crate::error::UserError(format!("{}, or timm's RandAugment string (rand-m9-mstd0.5-inc1)", e.0))
            }),
        }
    }
}

impl std::fmt::Display for PolicyName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PolicyName::Torchvision(k) => k.fmt(f),
            PolicyName::TimmRand(s) => s.fmt(f),
        }
    }
}

/// A policy as the pipeline runs it: torchvision's, or timm's RandAugment.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum AutoPolicy {
    Torchvision(Policy),
    TimmRand(TimmRand),
}

impl AutoPolicy {
    /// Draws and applies the policy to a size×size image.
    pub fn apply(&self, px: &mut [u8], size: usize, rng: &mut impl Rng) {
        match self {
            AutoPolicy::Torchvision(p) => p.apply(px, size, rng),
            AutoPolicy::TimmRand(t) => t.apply(px, size, rng),
        }
    }
}

/// A policy with its settings (`--ra-magnitude`, `--ra-num-ops`, `--augmix-severity`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Policy {
    pub kind: AutoAugment,
    /// RandAugment's bin of 31 (torchvision's `magnitude`, 9).
    pub ra_magnitude: usize,
    /// RandAugment's operations per image (2).
    pub ra_num_ops: usize,
    /// AugMix's bins 0..severity of 10 (3).
    pub augmix_severity: usize,
    pub sampling: Sampling,
}

/// RandAugment's and TrivialAugmentWide's bins; AutoAugment's and AugMix's are 10.
pub const RA_BINS: usize = 31;
/// AugMix's chains (`mixture_width`), each 1 to 3 operations deep (`chain_depth=-1`).
const AUGMIX_WIDTH: usize = 3;

/// Where an operation's magnitude bins lie.
#[derive(Debug, Clone, Copy)]
enum Range {
    /// None: the operation takes no magnitude.
    Fixed,
    /// linspace(0, top, bins).
    Up(f64),
    /// linspace(0, k * width) and linspace(0, k * height): RandAugment's translations.
    WidthTimes(f64),
    HeightTimes(f64),
    /// linspace(0, width / d) and linspace(0, height / d): AugMix's translations.
    WidthOver(f64),
    HeightOver(f64),
    /// Bits: round(top - i / ((bins - 1) / span)).
    Bits { top: f32, span: f32 },
    /// Threshold fraction: linspace(1, 0, bins).
    Down,
}

/// (operation, bins, signed: the magnitude negated with probability 1/2).
type Space = &'static [(Op, Range, bool)];

const TA_WIDE: Space = &[
    (Op::Identity, Range::Fixed, false),
    (Op::ShearX, Range::Up(0.99), true),
    (Op::ShearY, Range::Up(0.99), true),
    (Op::TranslateX, Range::Up(32.0), true),
    (Op::TranslateY, Range::Up(32.0), true),
    (Op::Rotate, Range::Up(135.0), true),
    (Op::Brightness, Range::Up(0.99), true),
    (Op::Color, Range::Up(0.99), true),
    (Op::Contrast, Range::Up(0.99), true),
    (Op::Sharpness, Range::Up(0.99), true),
    (Op::Posterize, Range::Bits { top: 8.0, span: 6.0 }, false),
    (Op::Solarize, Range::Down, false),
    (Op::AutoContrast, Range::Fixed, false),
    (Op::Equalize, Range::Fixed, false),
];

const RAND_AUGMENT: Space = &[
    (Op::Identity, Range::Fixed, false),
    (Op::ShearX, Range::Up(0.3), true),
    (Op::ShearY, Range::Up(0.3), true),
    (Op::TranslateX, Range::WidthTimes(150.0 / 331.0), true),
    (Op::TranslateY, Range::HeightTimes(150.0 / 331.0), true),
    (Op::Rotate, Range::Up(30.0), true),
    (Op::Brightness, Range::Up(0.9), true),
    (Op::Color, Range::Up(0.9), true),
    (Op::Contrast, Range::Up(0.9), true),
    (Op::Sharpness, Range::Up(0.9), true),
    (Op::Posterize, Range::Bits { top: 8.0, span: 4.0 }, false),
    (Op::Solarize, Range::Down, false),
    (Op::AutoContrast, Range::Fixed, false),
    (Op::Equalize, Range::Fixed, false),
];

/// AugMix's with `all_ops=True` (torchvision's default).
const AUGMIX: Space = &[
    (Op::ShearX, Range::Up(0.3), true),
    (Op::ShearY, Range::Up(0.3), true),
    (Op::TranslateX, Range::WidthOver(3.0), true),
    (Op::TranslateY, Range::HeightOver(3.0), true),
    (Op::Rotate, Range::Up(30.0), true),
    (Op::Posterize, Range::Bits { top: 4.0, span: 4.0 }, false),
    (Op::Solarize, Range::Down, false),
    (Op::AutoContrast, Range::Fixed, false),
    (Op::Equalize, Range::Fixed, false),
    (Op::Brightness, Range::Up(0.9), true),
    (Op::Color, Range::Up(0.9), true),
    (Op::Contrast, Range::Up(0.9), true),
    (Op::Sharpness, Range::Up(0.9), true),
];

/// An AutoAugment sub-policy: two (operation, probability, bin).
type SubPolicy = [(Op, f64, Option<usize>); 2];

macro_rules! sub_policies {
    ($( (($a:ident, $pa:expr, $ma:expr), ($b:ident, $pb:expr, $mb:expr)) ),* $(,)?) => {
        &[$([(Op::$a, $pa, $ma), (Op::$b, $pb, $mb)]),*]
    };
}

/// The published AutoAugment policies, as torchvision lists them.
const IMAGENET: &[SubPolicy] = sub_policies![
    ((Posterize, 0.4, Some(8)), (Rotate, 0.6, Some(9))),
    ((Solarize, 0.6, Some(5)), (AutoContrast, 0.6, None)),
    ((Equalize, 0.8, None), (Equalize, 0.6, None)),
    ((Posterize, 0.6, Some(7)), (Posterize, 0.6, Some(6))),
    ((Equalize, 0.4, None), (Solarize, 0.2, Some(4))),
    ((Equalize, 0.4, None), (Rotate, 0.8, Some(8))),
    ((Solarize, 0.6, Some(3)), (Equalize, 0.6, None)),
    ((Posterize, 0.8, Some(5)), (Equalize, 1.0, None)),
    ((Rotate, 0.2, Some(3)), (Solarize, 0.6, Some(8))),
    ((Equalize, 0.6, None), (Posterize, 0.4, Some(6))),
    ((Rotate, 0.8, Some(8)), (Color, 0.4, Some(0))),
    ((Rotate, 0.4, Some(9)), (Equalize, 0.6, None)),
    ((Equalize, 0.0, None), (Equalize, 0.8, None)),
    ((Invert, 0.6, None), (Equalize, 1.0, None)),
    ((Color, 0.6, Some(4)), (Contrast, 1.0, Some(8))),
    ((Rotate, 0.8, Some(8)), (Color, 1.0, Some(2))),
    ((Color, 0.8, Some(8)), (Solarize, 0.8, Some(7))),
    ((Sharpness, 0.4, Some(7)), (Invert, 0.6, None)),
    ((ShearX, 0.6, Some(5)), (Equalize, 1.0, None)),
    ((Color, 0.4, Some(0)), (Equalize, 0.6, None)),
    ((Equalize, 0.4, None), (Solarize, 0.2, Some(4))),
    ((Solarize, 0.6, Some(5)), (AutoContrast, 0.6, None)),
    ((Invert, 0.6, None), (Equalize, 1.0, None)),
    ((Color, 0.6, Some(4)), (Contrast, 1.0, Some(8))),
    ((Equalize, 0.8, None), (Equalize, 0.6, None)),
];

const CIFAR10: &[SubPolicy] = sub_policies![
    ((Invert, 0.1, None), (Contrast, 0.2, Some(6))),
    ((Rotate, 0.7, Some(2)), (TranslateX, 0.3, Some(9))),
    ((Sharpness, 0.8, Some(1)), (Sharpness, 0.9, Some(3))),
    ((ShearY, 0.5, Some(8)), (TranslateY, 0.7, Some(9))),
    ((AutoContrast, 0.5, None), (Equalize, 0.9, None)),
    ((ShearY, 0.2, Some(7)), (Posterize, 0.3, Some(7))),
    ((Color, 0.4, Some(3)), (Brightness, 0.6, Some(7))),
    ((Sharpness, 0.3, Some(9)), (Brightness, 0.7, Some(9))),
    ((Equalize, 0.6, None), (Equalize, 0.5, None)),
    ((Contrast, 0.6, Some(7)), (Sharpness, 0.6, Some(5))),
    ((Color, 0.7, Some(7)), (TranslateX, 0.5, Some(8))),
    ((Equalize, 0.3, None), (AutoContrast, 0.4, None)),
    ((TranslateY, 0.4, Some(3)), (Sharpness, 0.2, Some(6))),
    ((Brightness, 0.9, Some(6)), (Color, 0.2, Some(8))),
    ((Solarize, 0.5, Some(2)), (Invert, 0.0, None)),
    ((Equalize, 0.2, None), (AutoContrast, 0.6, None)),
    ((Equalize, 0.2, None), (Equalize, 0.6, None)),
    ((Color, 0.9, Some(9)), (Equalize, 0.6, None)),
    ((AutoContrast, 0.8, None), (Solarize, 0.2, Some(8))),
    ((Brightness, 0.1, Some(3)), (Color, 0.7, Some(0))),
    ((Solarize, 0.4, Some(5)), (AutoContrast, 0.9, None)),
    ((TranslateY, 0.9, Some(9)), (TranslateY, 0.7, Some(9))),
    ((AutoContrast, 0.9, None), (Solarize, 0.8, Some(3))),
    ((Equalize, 0.8, None), (Invert, 0.1, None)),
    ((TranslateY, 0.7, Some(9)), (AutoContrast, 0.9, None)),
];

const SVHN: &[SubPolicy] = sub_policies![
    ((ShearX, 0.9, Some(4)), (Invert, 0.2, None)),
    ((ShearY, 0.9, Some(8)), (Invert, 0.7, None)),
    ((Equalize, 0.6, None), (Solarize, 0.6, Some(6))),
    ((Invert, 0.9, None), (Equalize, 0.6, None)),
    ((Equalize, 0.6, None), (Rotate, 0.9, Some(3))),
    ((ShearX, 0.9, Some(4)), (AutoContrast, 0.8, None)),
    ((ShearY, 0.9, Some(8)), (Invert, 0.4, None)),
    ((ShearY, 0.9, Some(5)), (Solarize, 0.2, Some(6))),
    ((Invert, 0.9, None), (AutoContrast, 0.8, None)),
    ((Equalize, 0.6, None), (Rotate, 0.9, Some(3))),
    ((ShearX, 0.9, Some(4)), (Solarize, 0.3, Some(3))),
    ((ShearY, 0.8, Some(8)), (Invert, 0.7, None)),
    ((Equalize, 0.9, None), (TranslateY, 0.6, Some(6))),
    ((Invert, 0.9, None), (Equalize, 0.6, None)),
    ((Contrast, 0.3, Some(3)), (Rotate, 0.8, Some(4))),
    ((Invert, 0.8, None), (TranslateY, 0.0, Some(2))),
    ((ShearY, 0.7, Some(6)), (Solarize, 0.4, Some(8))),
    ((Invert, 0.6, None), (Rotate, 0.8, Some(4))),
    ((ShearY, 0.3, Some(7)), (TranslateX, 0.9, Some(3))),
    ((ShearX, 0.1, Some(6)), (Invert, 0.6, None)),
    ((Solarize, 0.7, Some(2)), (TranslateY, 0.6, Some(7))),
    ((ShearY, 0.8, Some(4)), (Invert, 0.8, None)),
    ((ShearX, 0.7, Some(9)), (TranslateY, 0.8, Some(3))),
    ((ShearY, 0.8, Some(5)), (AutoContrast, 0.7, None)),
    ((ShearX, 0.7, Some(2)), (Invert, 0.1, None)),
];

/// The bin of an operation `Policy::pick` draws: always this one (RandAugment's), or one below
/// this uniformly.
#[derive(Debug, Clone, Copy)]
enum Bin {
    Fixed(usize),
    Below(usize),
}

/// One operation as drawn: its bin (None where it takes no magnitude), and whether the
/// magnitude is negated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Step {
    pub op: Op,
    pub bin: Option<usize>,
    pub negative: bool,
}

/// What a policy drew for one image.
#[derive(Debug, Clone, PartialEq)]
pub enum Draw {
    /// Operations applied one after the other.
    Chain(Vec<Step>),
    /// AugMix: the original's weight, then each chain's weight and operations.
    Mix { original: f32, chains: Vec<(f32, Vec<Step>)> },
}

/// The float32 value torch.linspace(start, end, bins) holds at `i` (within its last bit).
fn linspace(start: f64, end: f64, bins: usize, i: usize) -> f64 {
    let (s, e) = (start as f32 as f64, end as f32 as f64);
    (s + (e - s) * i as f64 / (bins - 1) as f64) as f32 as f64
}

impl Range {
    fn magnitude(self, bins: usize, i: usize, (w, h): (usize, usize)) -> Option<f64> {
        let (w, h) = (w as f64, h as f64);
        Some(match self {
            Range::Fixed => return None,
            Range::Up(top) => linspace(0.0, top, bins, i),
            Range::WidthTimes(k) => linspace(0.0, k * w, bins, i),
            Range::HeightTimes(k) => linspace(0.0, k * h, bins, i),
            Range::WidthOver(d) => linspace(0.0, w / d, bins, i),
            Range::HeightOver(d) => linspace(0.0, h / d, bins, i),
            Range::Bits { top, span } => (top - i as f32 / ((bins - 1) as f32 / span)).round_ties_even() as f64,
            Range::Down => linspace(1.0, 0.0, bins, i),
        })
    }
}

impl Policy {
    /// `kind` with torchvision's defaults (RandAugment's bin 9 and 2 operations, AugMix's
    /// severity 3), sampling bilinearly.
    pub fn torchvision(kind: AutoAugment) -> Policy {
        Policy {
            kind,
            ra_magnitude: 9,
            ra_num_ops: 2,
            augmix_severity: 3,
            sampling: Sampling::Bilinear,
        }
    }

    fn space(&self) -> Space {
        match self.kind {
            AutoAugment::TaWide => TA_WIDE,
            AutoAugment::Ra => RAND_AUGMENT,
            // RandAugment's without Identity; its Invert takes no magnitude (`Range::Fixed`).
            AutoAugment::Imagenet | AutoAugment::Cifar10 | AutoAugment::Svhn => &RAND_AUGMENT[1..],
            AutoAugment::Augmix => AUGMIX,
        }
    }

    /// The number of magnitude bins.
    pub fn bins(&self) -> usize {
        match self.kind {
            AutoAugment::TaWide | AutoAugment::Ra => RA_BINS,
            _ => 10,
        }
    }

    /// The signed magnitude of a drawn step for a w×h image (0 for operations without one).
    pub fn magnitude(&self, step: Step, size: (usize, usize)) -> f64 {
        let range = self.space().iter().find(|s| s.0 == step.op).map_or(Range::Fixed, |s| s.1);
        let m = step.bin.and_then(|i| range.magnitude(self.bins(), i, size)).unwrap_or(0.0);
        if step.negative {
            -m
        } else {
            m
        }
    }

    /// One operation of the space, uniformly, with the bin `bin` gives (for those that take one).
    fn pick(&self, rng: &mut impl Rng, bin: Bin) -> Step {
        let space = self.space();
        let (op, range, signed) = space[rng.gen_range(0..space.len())];
        let takes = !matches!(range, Range::Fixed);
        let bin = takes.then(|| match bin {
            Bin::Fixed(b) => b,
            Bin::Below(n) => rng.gen_range(0..n),
        });
        Step {
            op,
            bin,
            negative: takes && signed && rng.gen_bool(0.5),
        }
    }

    /// The policy's choices for one image, as torchvision's `forward` makes them.
    pub fn draw(&self, rng: &mut impl Rng) -> Draw {
        let bins = self.bins();
        match self.kind {
            AutoAugment::TaWide => Draw::Chain(vec![self.pick(rng, Bin::Below(bins))]),
            AutoAugment::Ra => Draw::Chain((0..self.ra_num_ops).map(|_| self.pick(rng, Bin::Fixed(self.ra_magnitude))).collect()),
            AutoAugment::Imagenet | AutoAugment::Cifar10 | AutoAugment::Svhn => {
                let table = match self.kind {
                    AutoAugment::Imagenet => IMAGENET,
                    AutoAugment::Cifar10 => CIFAR10,
                    _ => SVHN,
                };
                let sub = table[rng.gen_range(0..table.len())];
                let mut steps = Vec::new();
                for (op, p, bin) in sub {
                    // torchvision applies an operation when rand() <= p.
                    if rng.gen::<f64>() > p {
                        continue;
                    }
                    let signed = self.space().iter().any(|s| s.0 == op && s.2);
                    steps.push(Step {
                        op,
                        bin,
                        negative: bin.is_some() && signed && rng.gen_bool(0.5),
                    });
                }
                Draw::Chain(steps)
            }
            AutoAugment::Augmix => {
                // Beta(1, 1) between the original and the mixture, Dirichlet(1, 1, 1) within it,
                // each as normalised Gamma(1) draws (torch's `_sample_dirichlet`).
                let mut dirichlet = |n: usize| -> Vec<f32> {
                    let g = Gamma::new(1.0, 1.0).expect("a valid Gamma");
                    let v: Vec<f64> = (0..n).map(|_| g.sample(rng)).collect();
                    let sum: f64 = v.iter().sum();
                    v.iter().map(|x| (x / sum) as f32).collect()
                };
                let m = dirichlet(2);
                let w = dirichlet(AUGMIX_WIDTH);
                let severity = self.augmix_severity;
                let chains = w
                    .iter()
                    .map(|&wi| {
                        let depth = rng.gen_range(1..=3);
                        (wi * m[1], (0..depth).map(|_| self.pick(rng, Bin::Below(severity))).collect())
                    })
                    .collect();
                Draw::Mix { original: m[0], chains }
            }
        }
    }

    /// Applies `draw` to `img` (w×h).
    pub fn apply_draw(&self, draw: &Draw, img: &mut Image) {
        let size = (img.w, img.h);
        let chain = |steps: &[Step], img: &mut Image| {
            for &s in steps {
                ops::apply(s.op, self.magnitude(s, size), img, self.sampling);
            }
        };
        match draw {
            Draw::Chain(steps) => chain(steps, img),
            Draw::Mix { original, chains } => {
                // torchvision mixes in float32 and casts back with `.to(torch.uint8)`.
                let mut mix: Vec<f32> = img.px.iter().map(|&v| original * v as f32).collect();
                for (weight, steps) in chains {
                    let mut aug = img.px.to_vec();
                    chain(steps, &mut Image { w: img.w, h: img.h, px: &mut aug });
                    mix.iter_mut().zip(&aug).for_each(|(m, &a)| *m += weight * a as f32);
                }
                img.px.iter_mut().zip(&mix).for_each(|(v, &m)| *v = m as u8);
            }
        }
    }

    /// Draws and applies the policy to a size×size image.
    pub fn apply(&self, px: &mut [u8], size: usize, rng: &mut impl Rng) {
        let draw = self.draw(rng);
        self.apply_draw(&draw, &mut Image { w: size, h: size, px });
    }
}
