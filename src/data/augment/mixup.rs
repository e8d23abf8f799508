//! Mixup and CutMix on the device in batch mode: one lambda per batch, each image mixed with a
//! partner from the same batch, and soft targets for `soft_target_cross_entropy`. Two styles,
//! as two reference recipes do it (`MixStyle`): timm's `Mixup` (the partner in the reversed
//! batch, `x.flip(0)`) and torchvision's train.py (the previous image, `x.roll(1, 0)`); they
//! also draw the CutMix box differently. Odd batch sizes work in both.
//!
//! Use, per training step (after `Normalizer::apply`, before the forward pass):
//!
//! ```ignore
//! let mixup = Mixup::new(cfg)?;                          // once; cfg.num_classes = the data's
//! // each step: a host RNG from (seed, rank, position), so a resumed run repeats the draws
//! let mut rng = ringtrain::seeds::mixup(seed, rank, position);
//! let p = mixup.sample(h, w, &mut rng);                  // host only: no device work
//! let (x, target) = mixup.apply(&x, &labels, &p);        // x: normalised f32 [B,C,H,W] on the device
//! let loss = soft_target_cross_entropy(&logits, &target); // replaces cross-entropy with smoothing
//! ```
//!
//! `apply` launches a fixed handful of kernels whatever the batch size and never reads the device
//! back. Label smoothing lives in the soft targets, so the loss must not smooth again.
//! Validation keeps the plain cross-entropy on hard labels.
use anyhow::{ensure, Result};
use rand::Rng;
use rand_distr::{Beta, Distribution};
use serde::{Deserialize, Serialize};
use tch::{Kind, Tensor};

/// Whose Mixup/CutMix. With repeated augmentation the copies of an image sit side by side in a
/// batch, so the choice decides whether an image is ever mixed with its own copy (torchvision's
/// train.py does that for half of each batch; timm's reversed partner never does).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum MixStyle {
    /// timm's `Mixup` in batch mode: partner `flip(0)`; CutMix centre drawn (row, column), box
    /// int(size·√(1−λ)) wide; labels smoothed before mixing.
    #[default]
    Timm,
    /// torchvision's train.py (its `RandomMixUp`/`RandomCutMix`, and v2's `MixUp`/`CutMix`):
    /// partner `roll(1, 0)`; CutMix centre drawn (column, row), box 2·int(size·√(1−λ)/2) wide,
    /// λ always from the clipped box; one-hot labels mixed, then smoothed as
    /// `cross_entropy(label_smoothing=…)` smooths them.
    Torchvision,
}

/// timm's `Mixup` arguments (batch mode, no `cutmix_minmax`; defaults are timm's) and the style.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct MixupConfig {
    pub style: MixStyle,
    /// Mixup is active when > 0; lambda ~ Beta(alpha, alpha).
    pub mixup_alpha: f64,
    /// CutMix is active when > 0; lambda ~ Beta(alpha, alpha).
    pub cutmix_alpha: f64,
    /// Probability that a batch is mixed at all.
    pub prob: f64,
    /// With both active: probability of CutMix rather than Mixup.
    pub switch_prob: f64,
    pub label_smoothing: f64,
    pub num_classes: i64,
    /// Recompute lambda from the CutMix box after clipping at the image border.
    pub correct_lam: bool,
}

impl Default for MixupConfig {
    fn default() -> Self {
        MixupConfig {
            style: MixStyle::Timm,
            mixup_alpha: 1.0,
            cutmix_alpha: 0.0,
            prob: 1.0,
            switch_prob: 0.5,
            label_smoothing: 0.1,
            num_classes: 1000,
            correct_lam: true,
        }
    }
}

/// What one batch gets: the weight of the image itself, and the CutMix box (rows yl..yh,
/// columns xl..xh, pasted from the partner) or None for Mixup. `lam == 1` means no mixing.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MixParams {
    pub lam: f64,
    pub cutmix: Option<(i64, i64, i64, i64)>,
}

impl MixParams {
    pub const NONE: MixParams = MixParams { lam: 1.0, cutmix: None };
}

/// The raw random draws behind one `MixParams`, in the order timm makes them (its
/// `np.random.rand`, `np.random.beta`, `np.random.randint` calls); kept apart so a test can feed
/// the same draws to timm.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MixDraws {
    /// Compared with `prob`: the batch is mixed when below.
    pub u_mix: f64,
    /// Compared with `switch_prob` (CutMix when below); drawn only when mixing with both active.
    pub u_switch: Option<f64>,
    /// The Beta draw; None when the batch is not mixed.
    pub beta: Option<f64>,
    /// CutMix box centre (cy, cx), uniform in [0,h)×[0,w) (timm draws cy first, torchvision
    /// cx); None for Mixup, or in timm's style when beta == 1 (timm then returns before
    /// drawing a box).
    pub centre: Option<(i64, i64)>,
}

#[derive(Debug, Clone)]
pub struct Mixup {
    cfg: MixupConfig,
    mixup_beta: Option<Beta<f64>>,
    cutmix_beta: Option<Beta<f64>>,
}

impl Mixup {
    pub fn new(cfg: MixupConfig) -> Result<Self> {
        let beta = |a: f64, what: &str| -> Result<Option<Beta<f64>>> {
            ensure!(
                a.is_finite() && a >= 0.0,
                "{what} must be a finite number >= 0, not {a}"
            );
            Ok(if a > 0.0 { Some(Beta::new(a, a)?) } else { None })
        };
        let mixup_beta = beta(cfg.mixup_alpha, "mixup alpha")?;
        let cutmix_beta = beta(cfg.cutmix_alpha, "cutmix alpha")?;
        ensure!(
            mixup_beta.is_some() || cutmix_beta.is_some(),
            "mixup needs mixup alpha > 0 or cutmix alpha > 0"
        );
        ensure!((0.0..=1.0).contains(&cfg.prob), "mixup prob must lie in [0, 1]");
        ensure!(
            (0.0..=1.0).contains(&cfg.switch_prob),
            "mixup switch prob must lie in [0, 1]"
        );
        ensure!(
            (0.0..1.0).contains(&cfg.label_smoothing),
            "label smoothing must lie in [0, 1)"
        );
        ensure!(cfg.num_classes > 0, "mixup needs the number of classes");
        Ok(Mixup {
            cfg,
            mixup_beta,
            cutmix_beta,
        })
    }

    pub fn config(&self) -> &MixupConfig {
        &self.cfg
    }

    /// Parameters for one batch of h×w images (timm's `_params_per_batch` and
    /// `cutmix_bbox_and_lam`).
    pub fn sample(&self, h: i64, w: i64, rng: &mut impl Rng) -> MixParams {
        self.params(&self.draw(h, w, rng), h, w)
    }

    /// The random part of `sample`.
    pub fn draw(&self, h: i64, w: i64, rng: &mut impl Rng) -> MixDraws {
        let mut d = MixDraws {
            u_mix: rng.gen::<f64>(),
            u_switch: None,
            beta: None,
            centre: None,
        };
        if d.u_mix >= self.cfg.prob {
            return d;
        }
        let (beta, cutmix) = match (&self.mixup_beta, &self.cutmix_beta) {
            (Some(m), Some(c)) => {
                let u = rng.gen::<f64>();
                d.u_switch = Some(u);
                if u < self.cfg.switch_prob {
                    (c, true)
                } else {
                    (m, false)
                }
            }
            (Some(m), None) => (m, false),
            (None, Some(c)) => (c, true),
            (None, None) => unreachable!("checked in Mixup::new"),
        };
        let lam = beta.sample(rng);
        d.beta = Some(lam);
        match self.cfg.style {
            MixStyle::Timm if cutmix && lam != 1.0 => {
                d.centre = Some((rng.gen_range(0..h), rng.gen_range(0..w)));
            }
            MixStyle::Torchvision if cutmix => {
                let cx = rng.gen_range(0..w);
                d.centre = Some((rng.gen_range(0..h), cx));
            }
            _ => {}
        }
        d
    }

    /// The deterministic part of `sample`: lambda and CutMix box from the draws.
    pub fn params(&self, d: &MixDraws, h: i64, w: i64) -> MixParams {
        let lam = match d.beta {
            Some(lam) if lam != 1.0 => lam,
            _ => return MixParams::NONE,
        };
        let Some((cy, cx)) = d.centre else {
            return MixParams { lam, cutmix: None };
        };
        if self.cfg.style == MixStyle::Torchvision {
            // RandomCutMix: half-sides int(0.5·√(1−λ)·size) either side of the centre, clipped;
            // λ from the box, always.
            let r = 0.5 * (1.0 - lam).sqrt();
            let (half_h, half_w) = ((r * h as f64) as i64, (r * w as f64) as i64);
            let (yl, yh) = ((cy - half_h).max(0), (cy + half_h).min(h));
            let (xl, xh) = ((cx - half_w).max(0), (cx + half_w).min(w));
            return MixParams {
                lam: 1.0 - ((yh - yl) * (xh - xl)) as f64 / (h * w) as f64,
                cutmix: Some((yl, yh, xl, xh)),
            };
        }
        // timm's rand_bbox: a box of int(size*sqrt(1-lam)) around the centre, clipped.
        let ratio = (1.0 - lam).sqrt();
        let (cut_h, cut_w) = ((h as f64 * ratio) as i64, (w as f64 * ratio) as i64);
        let yl = (cy - cut_h / 2).clamp(0, h);
        let yh = (cy + (cut_h + 1) / 2).clamp(0, h);
        let xl = (cx - cut_w / 2).clamp(0, w);
        let xh = (cx + (cut_w + 1) / 2).clamp(0, w);
        let lam = if self.cfg.correct_lam {
            1.0 - ((yh - yl) * (xh - xl)) as f64 / (h * w) as f64
        } else {
            lam
        };
        MixParams {
            lam,
            cutmix: Some((yl, yh, xl, xh)),
        }
    }

    /// Mixed images and soft targets f32 [B, num_classes] (on `x`'s device). `x` is the
    /// normalised float batch [B,C,H,W] in any memory format; `y` the int64 labels [B]. With
    /// lam == 1 the images come back unchanged (the same storage) and the targets are the
    /// smoothed one-hot labels.
    pub fn apply(&self, x: &Tensor, y: &Tensor, p: &MixParams) -> (Tensor, Tensor) {
        let target = self.targets(y, p.lam, x.device());
        if p.lam == 1.0 {
            return (x.shallow_clone(), target);
        }
        let mixed = match p.cutmix {
            Some((yl, yh, xl, xh)) => {
                let out = x.copy();
                if yh > yl && xh > xl {
                    let region = |t: &Tensor| t.narrow(2, yl, yh - yl).narrow(3, xl, xh - xl);
                    region(&out).copy_(&self.partner(&region(x)));
                }
                out
            }
            // As timm and torchvision: x*lam + partner*(1-lam), the same two products and one
            // sum (whose order does not change the bits).
            None => x * p.lam + self.partner(x) * (1.0 - p.lam),
        };
        (mixed, target)
    }

    /// Each row's partner: the reversed batch (timm) or the batch rolled by one (torchvision).
    fn partner(&self, t: &Tensor) -> Tensor {
        match self.cfg.style {
            MixStyle::Timm => t.flip([0]),
            MixStyle::Torchvision => t.roll([1], [0]),
        }
    }

    /// The soft targets. timm's `mixup_target`: smoothed one-hot y1, then
    /// y1*lam + partner(y1)*(1-lam). torchvision: one-hot y1 mixed the same way, then
    /// `t*(1-ε) + ε/k`, as `cross_entropy` smooths probability targets.
    fn targets(&self, y: &Tensor, lam: f64, device: tch::Device) -> Tensor {
        let k = self.cfg.num_classes;
        let eps = self.cfg.label_smoothing;
        let (off, on) = match self.cfg.style {
            MixStyle::Timm => (eps / k as f64, 1.0 - eps + eps / k as f64),
            MixStyle::Torchvision => (0.0, 1.0),
        };
        let y = y.to_device(device).to_kind(Kind::Int64).view([-1, 1]);
        let mut y1 = Tensor::full([y.size()[0], k], off, (Kind::Float, device));
        let _ = y1.scatter_value_(1, &y, on);
        let mixed = match lam == 1.0 {
            true => y1,
            false => &y1 * lam + self.partner(&y1) * (1.0 - lam),
        };
        match self.cfg.style {
            MixStyle::Torchvision if eps > 0.0 => mixed * (1.0 - eps) + eps / k as f64,
            _ => mixed,
        }
    }
}

/// timm's `SoftTargetCrossEntropy`: mean over the batch of sum(-target * log_softmax(logits)).
/// Computed in float32 whatever the logits' dtype, so it is safe under bf16/fp16 autocast.
pub fn soft_target_cross_entropy(logits: &Tensor, target: &Tensor) -> Tensor {
    let logp = logits.to_kind(Kind::Float).log_softmax(-1, Kind::Float);
    (-target.to_kind(Kind::Float) * logp)
        .sum_dim_intlist(-1, false, Kind::Float)
        .mean(Kind::Float)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;
    use tch::Device;

    fn mixup(mixup_alpha: f64, cutmix_alpha: f64, prob: f64, switch_prob: f64) -> Mixup {
        styled(MixStyle::Timm, mixup_alpha, cutmix_alpha, prob, switch_prob)
    }

    fn styled(style: MixStyle, mixup_alpha: f64, cutmix_alpha: f64, prob: f64, switch_prob: f64) -> Mixup {
        Mixup::new(MixupConfig {
            style,
            mixup_alpha,
            cutmix_alpha,
            prob,
            switch_prob,
            label_smoothing: 0.0,
            num_classes: 5,
            correct_lam: true,
        })
        .unwrap()
    }

    #[test]
    fn sample_frequencies_follow_the_probabilities() {
        for style in [MixStyle::Timm, MixStyle::Torchvision] {
            frequencies_follow_the_probabilities(styled(style, 1.0, 1.0, 0.8, 0.3));
        }
    }

    fn frequencies_follow_the_probabilities(m: Mixup) {
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let n = 20_000;
        let (mut unmixed, mut cut, mut mix_lams) = (0, 0, Vec::new());
        for _ in 0..n {
            let p = m.sample(32, 48, &mut rng);
            assert!((0.0..=1.0).contains(&p.lam));
            match p.cutmix {
                _ if p.lam == 1.0 => unmixed += 1,
                Some((yl, yh, xl, xh)) => {
                    assert!(0 <= yl && yl <= yh && yh <= 32 && 0 <= xl && xl <= xh && xh <= 48);
                    let area = ((yh - yl) * (xh - xl)) as f64 / (32.0 * 48.0);
                    assert!((p.lam - (1.0 - area)).abs() < 1e-12, "correct_lam");
                    cut += 1;
                }
                None => mix_lams.push(p.lam),
            }
        }
        let frac = |k: usize| k as f64 / n as f64;
        // Binomial standard errors are below 0.004 here: allow about 4 of them.
        assert!((frac(unmixed) - 0.2).abs() < 0.015, "unmixed {}", frac(unmixed));
        let mixed = (n - unmixed) as f64;
        assert!(
            (cut as f64 / mixed - 0.3).abs() < 0.02,
            "cutmix share {}",
            cut as f64 / mixed
        );
        // Beta(1,1) is uniform: mean 1/2, standard error 0.29/sqrt(11200) < 0.003.
        let mean = mix_lams.iter().sum::<f64>() / mix_lams.len() as f64;
        assert!((mean - 0.5).abs() < 0.012, "mean mixup lambda {mean}");
    }

    #[test]
    fn only_one_kind_when_one_alpha_is_zero() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        for style in [MixStyle::Timm, MixStyle::Torchvision] {
            let mx = styled(style, 0.4, 0.0, 1.0, 0.5);
            let cm = styled(style, 0.0, 1.0, 1.0, 0.5);
            for _ in 0..500 {
                let d = mx.draw(8, 8, &mut rng);
                assert!(d.u_switch.is_none() && d.centre.is_none() && d.beta.is_some());
                let d = cm.draw(8, 8, &mut rng);
                // timm draws no box for beta == 1; torchvision always draws one.
                let boxed = style == MixStyle::Torchvision || d.beta != Some(1.0);
                assert!(d.u_switch.is_none() && d.centre.is_some() == boxed);
            }
        }
    }

    #[test]
    fn torchvision_pairs_each_image_with_the_one_before() {
        let m = styled(MixStyle::Torchvision, 1.0, 0.0, 1.0, 0.5);
        let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0]).view([4, 1, 1, 1]);
        let p = MixParams { lam: 0.75, cutmix: None };
        let (xm, t) = m.apply(&x, &Tensor::from_slice(&[0i64, 1, 2, 3]), &p);
        let want = Tensor::from_slice(&[1.75f32, 1.75, 2.75, 3.75]).view([4, 1, 1, 1]);
        assert!(xm.equal(&want), "{xm}");
        // Row 0 is 0.75 of class 0 and 0.25 of class 3 (the last image, rolled round).
        let row0 = Vec::<f32>::try_from(t.get(0)).unwrap();
        assert_eq!(row0[..4], [0.75, 0.0, 0.0, 0.25]);
    }

    #[test]
    fn bad_configs_are_refused() {
        let ok = MixupConfig::default();
        assert!(Mixup::new(ok.clone()).is_ok());
        for bad in [
            MixupConfig {
                mixup_alpha: 0.0,
                ..ok.clone()
            },
            MixupConfig {
                prob: 1.5,
                ..ok.clone()
            },
            MixupConfig {
                label_smoothing: 1.0,
                ..ok.clone()
            },
            MixupConfig {
                num_classes: 0,
                ..ok.clone()
            },
        ] {
            assert!(Mixup::new(bad).is_err());
        }
    }

    #[test]
    fn unmixed_batches_keep_images_and_smooth_targets() {
        let m = Mixup::new(MixupConfig {
            num_classes: 4,
            label_smoothing: 0.2,
            ..Default::default()
        })
        .unwrap();
        let x = Tensor::randn([3, 3, 4, 4], (Kind::Float, Device::Cpu));
        let (xm, t) = m.apply(&x, &Tensor::from_slice(&[2i64, 0, 3]), &MixParams::NONE);
        assert!(xm.equal(&x));
        let want = Tensor::from_slice2(&[
            [0.05f32, 0.05, 0.85, 0.05],
            [0.85, 0.05, 0.05, 0.05],
            [0.05, 0.05, 0.05, 0.85],
        ]);
        assert!(t.allclose(&want, 1e-6, 1e-7, false));
    }

    #[test]
    fn channels_last_input_gives_the_same_result() {
        let m = mixup(0.0, 1.0, 1.0, 0.5);
        let x = Tensor::randn([5, 3, 6, 7], (Kind::Float, Device::Cpu));
        let cl = x.permute([0, 2, 3, 1]).contiguous().permute([0, 3, 1, 2]);
        let y = Tensor::from_slice(&[0i64, 1, 2, 3, 4]);
        for p in [
            MixParams {
                lam: 0.7,
                cutmix: Some((1, 5, 0, 3)),
            },
            MixParams { lam: 0.3, cutmix: None },
        ] {
            let (a, ta) = m.apply(&x, &y, &p);
            let (b, tb) = m.apply(&cl, &y, &p);
            assert!(a.equal(&b) && ta.equal(&tb));
        }
    }

    #[test]
    fn soft_target_loss_is_float32_under_bf16_autocast() {
        let logits = Tensor::randn([4, 6], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        let target = Tensor::randn([4, 6], (Kind::Float, Device::Cpu)).softmax(-1, Kind::Float);
        let exact = soft_target_cross_entropy(&logits.to_kind(Kind::BFloat16).to_kind(Kind::Float), &target);
        let loss = {
            let _guard = crate::shim::autocast(Device::Cpu, Kind::BFloat16).unwrap();
            let w = Tensor::eye(6, (Kind::Float, Device::Cpu));
            let l = logits.matmul(&w); // bf16 under autocast
            assert_eq!(l.kind(), Kind::BFloat16);
            soft_target_cross_entropy(&l, &target)
        };
        assert_eq!(loss.kind(), Kind::Float);
        assert!((loss.double_value(&[]) - exact.double_value(&[])).abs() < 1e-6);
        loss.backward();
        assert!(logits.grad().isfinite().all().int64_value(&[]) == 1);
    }
}
