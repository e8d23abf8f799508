//! The learning-rate range test (Leslie Smith; fastai's and PyTorch Lightning's `lr_find`): the
//! training run's data, model and optimizer, set up as `train` sets them up, take `steps`
//! optimizer steps while the LR rises exponentially from `start` to `end`; the loss of each step
//! is smoothed, the test stops when it diverges, and the LR where the smoothed loss falls
//! fastest is the suggestion. Nothing is saved: the model and optimizer are dropped at the end.
use anyhow::Result;

use super::context::RankContext;
use super::dataset::TrainData;
use super::step::meter::EpochMeter;
use super::step::schedule::{ExpRamp, LrSchedule};
use super::step::state::RunState;
use super::step::trainer::Trainer;
use crate::config::TrainConfig;
use crate::say;

/// fastai's smoothing of the loss: an exponential moving average with this weight on the past.
pub const BETA: f64 = 0.98;
/// The test stops once the smoothed loss exceeds this many times its minimum so far (fastai's).
pub const DIVERGED: f64 = 4.0;
/// Points left out of the suggestion at the end (fastai's 5: the divergence itself).
pub const SKIP_END: usize = 5;

/// One optimizer step of the test.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Point {
    /// 0-based: the LR is `ExpRamp::lr_at(step)`.
    pub step: usize,
    pub lr: f64,
    /// The step's loss (the mean over its micro-batches with `--accum-steps`).
    pub loss: f64,
    pub smoothed: f64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Stop {
    /// Every step ran: the LR reached `--end-lr`.
    End,
    /// The smoothed loss exceeded `DIVERGED` times its minimum.
    Diverged,
    /// The loss became infinite or NaN.
    NonFinite,
}

pub struct Outcome {
    pub points: Vec<Point>,
    pub stop: Stop,
    /// Index into `points` of the suggested LR (`steepest`), if the smoothed loss fell at all.
    pub suggestion: Option<usize>,
    pub classes: usize,
    pub train_images: usize,
}

/// The exponential moving average of the losses with fastai's bias correction:
/// avg ← β·avg + (1-β)·loss, smoothed = avg / (1 - β^n) after n losses.
pub struct Smoother {
    avg: f64,
    n: i32,
}

impl Smoother {
    pub fn new() -> Self {
        Smoother { avg: 0.0, n: 0 }
    }

    pub fn add(&mut self, loss: f64) -> f64 {
        self.n += 1;
        self.avg = BETA * self.avg + (1.0 - BETA) * loss;
        self.avg / (1.0 - BETA.powi(self.n))
    }
}

impl Default for Smoother {
    fn default() -> Self {
        Self::new()
    }
}

/// Runs the range test of `ramp` with the data, model and optimizer of `cfg`, on one process.
pub fn run(cfg: &TrainConfig, ramp: ExpRamp) -> Result<Outcome> {
    cfg.preflight()?;
    let ctx = RankContext::new(cfg, None)?;
    let data = TrainData::load(cfg, &ctx, None)?;
    let mut t = Trainer::new(
        cfg,
        data.num_classes(),
        data.steps_per_epoch(),
        ctx.pg.clone(),
        ctx.ddp_options(),
        cfg.pretrained.as_ref(),
    )?;
    t.set_schedule(LrSchedule::ramp(cfg, ramp));
    say!(
        "lr-find: {} on {} ({} images, {} classes), batch {}, {}; LR {:e} to {:e} over {} steps on {:?}",
        cfg.model,
        data.note,
        data.train.samples().len(),
        data.num_classes(),
        cfg.batch_size,
        format!("{:?}", cfg.optimizer).to_lowercase(),
        ramp.start,
        ramp.end,
        ramp.steps,
        t.device()
    );
    let (points, stop) = steps(&mut t, &data, ramp.steps)?;
    Ok(Outcome {
        suggestion: steepest(&points, ramp.steps),
        points,
        stop,
        classes: data.classes.len(),
        train_images: data.train.samples().len(),
    })
}

/// The test's optimizer steps, epoch after epoch (each reshuffled) until `steps` or a stop.
fn steps(t: &mut Trainer, data: &TrainData, steps: usize) -> Result<(Vec<Point>, Stop)> {
    let mut state = RunState::default();
    let mut smoother = Smoother::new();
    let (mut points, mut best) = (Vec::with_capacity(steps), f64::INFINITY);
    let log_every = (steps / 10).max(1);
    for epoch in 0.. {
        let mut meter = EpochMeter::start(Default::default(), t.pg());
        let (mut sum, mut micro) = (0.0, 0);
        for batch in data.train_from(epoch, 0) {
            let batch = batch?;
            let stepped = t.step(&batch.x, &batch.y, batch.pos, &mut state, &mut meter)?;
            sum += t.read_loss().expect("a micro-batch ran");
            micro += 1;
            if !stepped {
                continue; // an --accum-steps group goes on
            }
            let loss = sum / micro as f64;
            (sum, micro) = (0.0, 0);
            let smoothed = smoother.add(loss);
            let step = points.len();
            points.push(Point {
                step,
                lr: state.lr,
                loss,
                smoothed,
            });
            if (step + 1) % log_every == 0 {
                say!("step {:>4}/{steps}  lr {:.3e}  loss {loss:.4}  smoothed {smoothed:.4}", step + 1, state.lr);
            }
            best = best.min(smoothed);
            if !smoothed.is_finite() {
                return Ok((points, Stop::NonFinite));
            }
            if smoothed > DIVERGED * best {
                return Ok((points, Stop::Diverged));
            }
            if points.len() == steps {
                return Ok((points, Stop::End));
            }
        }
    }
    unreachable!("the epochs never end")
}

/// The suggestion: where the smoothed loss falls fastest against log(lr). Only the points from
/// index `planned / 10` up to the last `SKIP_END` count (the start is the smoothing's warm-up,
/// the end the divergence; fastai's bounds). At each of them the slope is taken from its two
/// neighbours, (smoothed[i+1] - smoothed[i-1]) / (ln lr[i+1] - ln lr[i-1]), and from the one
/// neighbour inside at the window's two ends: `numpy.gradient` against ln(lr), as Lightning
/// computes it (a slope between two points alone follows the noise of one batch). The point
/// of the most negative slope is suggested; None when no slope is negative.
pub fn steepest(points: &[Point], planned: usize) -> Option<usize> {
    let (first, end) = (planned / 10, points.len().saturating_sub(SKIP_END));
    if end < first + 2 {
        return None;
    }
    let window = &points[first..end];
    let slope = |a: &Point, b: &Point| (b.smoothed - a.smoothed) / (b.lr.ln() - a.lr.ln());
    let last = window.len() - 1;
    let mut best: Option<(usize, f64)> = None;
    for i in 0..=last {
        let s = slope(&window[i.saturating_sub(1)], &window[(i + 1).min(last)]);
        if s.is_finite() && s < 0.0 && best.is_none_or(|(_, b)| s < b) {
            best = Some((i, s));
        }
    }
    best.map(|(i, _)| first + i)
}

/// lr_find.csv: one row per step.
pub fn csv(points: &[Point]) -> String {
    let mut s = String::from("step,lr,loss,smoothed_loss\n");
    for p in points {
        // Shortest round-trip forms: a reader recomputes the smoothing from these exact values.
        s += &format!("{},{:e},{:e},{:e}\n", p.step, p.lr, p.loss, p.smoothed);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn curve(smoothed: &[f64]) -> Vec<Point> {
        let ramp = ExpRamp {
            start: 1e-4,
            end: 1.0,
            steps: smoothed.len(),
        };
        smoothed
            .iter()
            .enumerate()
            .map(|(i, &s)| Point {
                step: i,
                lr: ramp.lr_at(i),
                loss: s,
                smoothed: s,
            })
            .collect()
    }

    #[test]
    fn the_ramp_runs_from_start_to_end_by_a_constant_factor() {
        let r = ExpRamp {
            start: 1e-7,
            end: 10.0,
            steps: 100,
        };
        assert_eq!(r.lr_at(0), 1e-7);
        assert!((r.lr_at(99) / 10.0 - 1.0).abs() < 1e-12);
        let q = r.lr_at(1) / r.lr_at(0);
        assert!((r.lr_at(51) / r.lr_at(50) / q - 1.0).abs() < 1e-12);
    }

    #[test]
    fn smoothing_is_the_bias_corrected_average() {
        let mut s = Smoother::new();
        assert_eq!(s.add(2.0), 2.0); // the first loss itself, thanks to the correction
        let second = s.add(1.0);
        let want = (BETA * 0.02 * 2.0 + 0.02 * 1.0) / (1.0 - BETA * BETA);
        assert!((second - want).abs() < 1e-12);
    }

    #[test]
    fn the_suggestion_is_the_steepest_fall_inside_the_bounds() {
        // Flat, a gentle fall, a steep fall around 15 (1.7 → 1.2 → 1.0), the minimum, a rise.
        let mut s = vec![2.0; 10];
        s.extend([1.95, 1.9, 1.85, 1.8, 1.7, 1.2, 1.0, 0.9, 0.85, 0.9, 1.5, 3.0, 6.0]);
        let p = curve(&s);
        assert_eq!(steepest(&p, s.len()), Some(15));
        // The last SKIP_END points are left out: a fall there is not suggested.
        let mut late = vec![2.0; 20];
        late.extend([0.1, 0.1, 0.1, 0.1, 0.1]);
        assert_eq!(steepest(&curve(&late), late.len()), None);
        assert_eq!(steepest(&curve(&[1.0, 2.0, 3.0]), 3), None);
    }
}
