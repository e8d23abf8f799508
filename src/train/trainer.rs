//! What an optimizer step needs, in one place, driven alike by `train` and `bench`: the model,
//! optimizer, fp16 GradScaler, moving average, DDP, divergence guard, LR schedule and
//! Mixup/CutMix. A step is `micro_step` for each micro-batch (Mixup, forward under autocast,
//! backward) and then `optimizer_step` (all-reduce, unscale, clip, step, EMA): the order of a
//! PyTorch DDP + AMP loop.
use std::path::Path;
use std::rc::Rc;

use anyhow::Result;
use tch::{Device, Kind, Reduction, Tensor};

use super::amp::GradScaler;
use super::divergence::DivergenceGuard;
use super::ema::Ema;
use super::meter::EpochMeter;
use super::optim::{self, Optimizer, Placement};
use super::schedule::LrSchedule;
use super::state::RunState;
use crate::config::TrainConfig;
use crate::data::mixup::{soft_target_cross_entropy, Mixup};
use crate::dist::ddp::{Ddp, WirePrecision};
use crate::dist::process_group::ProcessGroup;
use crate::model::Model;
use crate::{say, seeds, shim};

/// Where a micro-batch stands in its epoch and in its accumulation group.
#[derive(Debug, Clone, Copy)]
pub struct MicroPos {
    pub epoch: usize,
    /// Index of the micro-batch in the epoch.
    pub micro: usize,
    pub micro_per_epoch: usize,
    /// Micro-batches per optimizer step (`--accum-steps`).
    pub accum: usize,
}

impl MicroPos {
    /// Optimizer steps of the epoch done before this micro-batch's step.
    pub fn step_in_epoch(&self) -> usize {
        self.micro / self.accum
    }

    fn first_in_group(&self) -> bool {
        self.micro % self.accum == 0
    }

    /// Micro-batches in this step's group (fewer for the epoch's last, short group).
    fn group_len(&self) -> usize {
        self.accum.min(self.micro_per_epoch - self.step_in_epoch() * self.accum)
    }

    /// Whether this micro-batch completes its group: the optimizer steps after it.
    pub fn ends_step(&self) -> bool {
        self.micro % self.accum + 1 == self.group_len()
    }
}

/// DDP settings beside the config (how the job is wired, not what it computes).
#[derive(Debug, Clone, Copy)]
pub struct DdpOptions {
    pub bucket_mb: f64,
    pub wire: WirePrecision,
}

impl Default for DdpOptions {
    fn default() -> Self {
        DdpOptions {
            bucket_mb: crate::dist::ddp::DEFAULT_BUCKET_MB,
            wire: WirePrecision::default(),
        }
    }
}

pub struct Trainer {
    pub model: Model,
    pub ema: Option<Ema>,
    pub opt: Optimizer,
    pub scaler: Option<GradScaler>,
    pub ddp: Ddp,
    /// The autocast dtype (None: fp32).
    pub amp: Option<Kind>,
    /// The tensors without gradient (BatchNorm statistics), broadcast from rank 0 per step
    /// when BatchNorm is not synchronised, as DDP's `broadcast_buffers`.
    untrained: Vec<Tensor>,
    guard: DivergenceGuard,
    sched: LrSchedule,
    mixup: Option<Mixup>,
    sync_bn: bool,
    label_smoothing: f64,
    clip_grad_norm: Option<f64>,
    seed: u64,
    num_classes: i64,
    /// The last micro-batch's loss, on the device: the divergence record and the log read it.
    loss: Option<Tensor>,
}

impl Trainer {
    /// The model of `cfg` for `num_classes`, initialised from `cfg.seed` (or from `pretrained`),
    /// on the device of `pg`, with its optimizer and the rest; every replica starts from rank
    /// 0's weights.
    pub fn new(
        cfg: &TrainConfig,
        num_classes: i64,
        steps_per_epoch: usize,
        pg: Rc<ProcessGroup>,
        ddp: DdpOptions,
        pretrained: Option<&Path>,
    ) -> Result<Self> {
        let device = pg.device;
        tch::manual_seed(seeds::init(cfg.seed));
        let mut model = Model::new(cfg.model, num_classes, device);
        if cfg.zero_init_residual {
            model.zero_init_residual();
        }
        if let Some(path) = pretrained {
            let r = model.load_pretrained(path)?;
            say!(
                "pretrained: {} tensors from {}; re-initialised head {:?}; missing {:?}; unexpected {:?}",
                r.loaded,
                path.display(),
                r.reinitialized_head,
                r.missing,
                r.unexpected
            );
        }
        if !cfg.freeze.is_empty() {
            let n = model.freeze(&cfg.freeze)?;
            say!("frozen: {n} tensors under {}", cfg.freeze.join(", "));
        }
        if crate::device::channels_last(cfg.channels_last, device) {
            shim::var_store_to_channels_last(&model.vs)?;
        }
        let no_decay = match cfg.no_bn_weight_decay {
            true => optim::batch_norm_params(&model.vs.variables().into_keys().collect::<Vec<_>>()),
            false => Default::default(),
        };
        let placement = Placement {
            head_prefix: model.head_prefix(),
            head_lr_mult: cfg.head_lr_mult,
            no_decay: &no_decay,
        };
        let opt = Optimizer::new(cfg, &model.trainable(), &placement);
        let params: Vec<Tensor> = opt.params().map(|p| p.shallow_clone()).collect(); // DDP's bucket order
        let amp = cfg.amp.autocast_kind(device)?;
        let scaler = (amp == Some(Kind::Half)).then(|| match cfg.loss_scale {
            Some(fixed) => GradScaler::fixed(device, fixed),
            None => GradScaler::dynamic(device, cfg.init_loss_scale),
        });
        let ema = cfg.ema.map(|d| Ema::new(&model, num_classes, d)).transpose()?;
        let ddp = Ddp::new(pg, &params, ddp.bucket_mb, ddp.wire)?;
        ddp.broadcast_state(&model.vs)?;
        Ok(Trainer {
            untrained: model.untrained(),
            guard: DivergenceGuard::new(device, scaler.is_some()),
            sched: LrSchedule::new(cfg, steps_per_epoch),
            mixup: cfg.mixup(num_classes).map(Mixup::new).transpose()?,
            sync_bn: cfg.sync_bn,
            label_smoothing: cfg.label_smoothing,
            clip_grad_norm: cfg.clip_grad_norm,
            seed: cfg.seed,
            num_classes,
            loss: None,
            model,
            ema,
            opt,
            scaler,
            ddp,
            amp,
        })
    }

    pub fn pg(&self) -> &ProcessGroup {
        self.ddp.pg()
    }

    pub fn num_classes(&self) -> i64 {
        self.num_classes
    }

    pub fn device(&self) -> Device {
        self.pg().device
    }

    /// The learning rate of the next optimizer step.
    pub fn lr(&self, state: &RunState) -> f64 {
        self.sched.lr_at(state.global_step, &state.plateau)
    }

    /// One micro-batch: normalised images `x` and labels `y` on the device, at `pos`. Its loss and
    /// correct count go to `meter`, on the device.
    pub fn micro_step(&mut self, x: &Tensor, y: &Tensor, pos: MicroPos, meter: &mut EpochMeter) -> Result<()> {
        if pos.first_in_group() {
            match self.ddp.owns_grads() {
                true => self.ddp.zero_grad(),
                false => self.opt.zero_grad()?,
            }
            if self.pg().world_size > 1 && !self.sync_bn {
                self.ddp.broadcast_buffers(&self.untrained)?;
            }
        }
        // Randomness inside the step (dropout) depends on the position alone: a resumed run
        // repeats it.
        tch::manual_seed(seeds::step(self.seed, pos.epoch, pos.micro));
        // Mixup/CutMix on the device; its draws depend on (seed, rank, position) only.
        let (x, soft_targets) = match &self.mixup {
            Some(m) => {
                let (h, w) = (x.size()[2], x.size()[3]);
                let position = (pos.epoch * pos.micro_per_epoch + pos.micro) as u64;
                let p = m.sample(h, w, &mut seeds::mixup(self.seed, self.pg().rank as u64, position));
                let (mixed, t) = m.apply(x, y, &p);
                (mixed, Some(t))
            }
            None => (x.shallow_clone(), None),
        };
        let (logits, loss) = {
            // Forward and loss under autocast; backward and the step outside, as torch.autocast.
            let _autocast = self.amp.map(|k| shim::autocast(self.device(), k)).transpose()?;
            let logits = self.model.forward(&x, true);
            let loss = match &soft_targets {
                // Label smoothing is inside the soft targets.
                Some(t) => soft_target_cross_entropy(&logits, t),
                None => logits.cross_entropy_loss::<Tensor>(y, None, Reduction::Mean, -100, self.label_smoothing),
            };
            (logits, loss.to_kind(Kind::Float))
        };
        // Accumulated micro-batches each count 1/group of the step's gradient.
        let group = pos.group_len();
        let to_backward = if group > 1 {
            &loss / group as f64
        } else {
            loss.shallow_clone()
        };
        match &self.scaler {
            Some(s) => s.scale_loss(&to_backward).f_backward()?,
            None => to_backward.f_backward()?,
        }
        self.model.bn_batches += 1;
        meter.add_batch(&loss, &logits, y);
        self.loss = Some(loss);
        Ok(())
    }

    /// The optimizer step after a group's last micro-batch: gradients averaged over ranks,
    /// unscaled (fp16), clipped, applied; the moving average follows. An fp16 overflow skips
    /// the step on the device, with no host synchronisation.
    pub fn optimizer_step(&mut self, state: &mut RunState, meter: &mut EpochMeter) -> Result<()> {
        let lr = self.lr(state);
        self.ddp.all_reduce_grads()?;
        let found_inf = match self.scaler.as_mut() {
            Some(s) => {
                let grads: Vec<Tensor> = self.opt.params().map(|p| p.grad()).filter(|g| g.defined()).collect();
                Some(s.unscale(&grads, self.ddp.pg())?)
            }
            None => None,
        };
        if let Some(max_norm) = self.clip_grad_norm {
            let _ = optim::clip_grad_norm(self.opt.params(), max_norm);
        }
        self.opt.step(lr, found_inf.as_ref())?;
        if let Some(s) = self.scaler.as_mut() {
            s.update();
        }
        meter.end_step(found_inf.as_ref());
        if let Some(ema) = self.ema.as_mut() {
            ema.update(self.model.bn_batches);
        }
        state.global_step += 1;
        state.lr = lr;
        let loss = self.loss.as_ref().expect("a micro-step before the optimizer step");
        self.guard.record(state.global_step, loss, found_inf.as_ref());
        Ok(())
    }

    /// The gradient all-reduce's share of `seconds` of training since the last call, when
    /// distributed.
    pub fn comm_share(&self, seconds: f64) -> Result<Option<f64>> {
        match self.pg().is_distributed() {
            true => Ok(Some(self.ddp.take_comm_time()?.as_secs_f64() / seconds)),
            false => Ok(None),
        }
    }

    /// The last micro-batch's loss, read from the device (a synchronisation: call it only to log).
    pub fn read_loss(&self) -> Option<f64> {
        self.loss.as_ref().map(|l| l.double_value(&[]))
    }

    /// Stops a diverged run (on every rank at the same steps: it may all-reduce). `last_good`
    /// names the checkpoint left to resume from.
    pub fn check_divergence(&self, last_good: &str) -> Result<()> {
        self.guard.check(self.ddp.pg(), last_good)
    }
}
