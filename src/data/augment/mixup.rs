//! Mixup and CutMix on the device, with timm's `Mixup` semantics in batch mode: one lambda per
//! batch, each image mixed with its partner in the reversed batch (`x.flip(0)`, so odd batch
//! sizes work too), and soft targets for `soft_target_cross_entropy`.
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

/// timm's `Mixup` arguments (batch mode, no `cutmix_minmax`); defaults are timm's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct MixupConfig {
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
    /// CutMix box centre (cy, cx), uniform in [0,h)×[0,w); None for Mixup, or when beta == 1
    /// (timm then returns before drawing a box).
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
        if cutmix && lam != 1.0 {
            d.centre = Some((rng.gen_range(0..h), rng.gen_range(0..w)));
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
                    region(&out).copy_(&region(x).flip([0]));
                }
                out
            }
            // As timm: x*lam + flip(x)*(1-lam), same operations in the same order.
            None => x * p.lam + x.flip([0]) * (1.0 - p.lam),
        };
        (mixed, target)
    }

    /// timm's `mixup_target`: smoothed one-hot y1, then y1*lam + flip(y1)*(1-lam).
    fn targets(&self, y: &Tensor, lam: f64, device: tch::Device) -> Tensor {
        let k = self.cfg.num_classes;
        let off = self.cfg.label_smoothing / k as f64;
        let on = 1.0 - self.cfg.label_smoothing + off;
        let y = y.to_device(device).to_kind(Kind::Int64).view([-1, 1]);
        let mut y1 = Tensor::full([y.size()[0], k], off, (Kind::Float, device));
        let _ = y1.scatter_value_(1, &y, on);
        if lam == 1.0 {
            y1
        } else {
            &y1 * lam + y1.flip([0]) * (1.0 - lam)
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
        Mixup::new(MixupConfig {
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
        let m = mixup(1.0, 1.0, 0.8, 0.3);
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
        let (mx, cm) = (mixup(0.4, 0.0, 1.0, 0.5), mixup(0.0, 1.0, 1.0, 0.5));
        for _ in 0..500 {
            let d = mx.draw(8, 8, &mut rng);
            assert!(d.u_switch.is_none() && d.centre.is_none() && d.beta.is_some());
            let d = cm.draw(8, 8, &mut rng);
            assert!(d.u_switch.is_none() && d.centre.is_some() == (d.beta != Some(1.0)));
        }
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
