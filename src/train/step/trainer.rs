//! What an optimizer step needs, in one place, driven alike by `train` and `bench`: the model,
//! optimizer, fp16 GradScaler, moving average, DDP, divergence guard, LR schedule and
//! Mixup/CutMix. A step is `micro_step` for each micro-batch (Mixup, forward under autocast,
//! backward) and then `optimizer_step` (all-reduce, unscale, clip, step, EMA): the order of a
//! PyTorch DDP + AMP loop.
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
use super::step_graph::{StepGraph, StepOutputs};
use crate::config::TrainConfig;
use crate::data::augment::mixup::{soft_target_cross_entropy, Mixup};
use crate::dist::ddp::{Ddp, WirePrecision};
use crate::dist::process_group::{Backend, ProcessGroup};
use crate::model::weights::WeightsSource;
use crate::model::Model;
use crate::shim::Lr;
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
    /// All-reduce each bucket during backward, as soon as its gradients are ready.
    pub overlap: bool,
}

impl Default for DdpOptions {
    fn default() -> Self {
        DdpOptions {
            bucket_mb: crate::dist::ddp::DEFAULT_BUCKET_MB,
            wire: WirePrecision::default(),
            overlap: true,
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
    /// The tensors without gradient (BatchNorm statistics), broadcast from rank 0 per step and
    /// before evaluation when BatchNorm is not synchronised, as DDP's `broadcast_buffers`.
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
    /// `--cuda-graphs`: the captured step.
    graph: Option<StepGraph>,
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
        pretrained: Option<&WeightsSource>,
    ) -> Result<Self> {
        let device = pg.device;
        tch::manual_seed(seeds::init(cfg.seed));
        let mut model = Model::build(cfg.model, num_classes, device, model_options(cfg, device)?);
        // A run from timm's weights (a resumed one too) hands timm back its names.
        if matches!(cfg.pretrained, Some(WeightsSource::HfHub(_))) && crate::model::timm::has_timm_names(model.kind) {
            model.names = crate::model::Names::Timm;
        }
        if cfg.zero_init_residual {
            model.zero_init_residual();
        }
        if let Some(source) = pretrained {
            let file = source.read(cfg.pretrained_key.as_deref())?;
            let r = model.load_pretrained(&file.weights, &source.to_string(), cfg.pretrained_partial)?;
            let mut from = match &file.key {
                Some(k) => format!("from {} [{k}]", file.path.display()),
                None => format!("from {}", file.path.display()),
            };
            if !matches!(source, WeightsSource::File(_)) {
                from = format!("of {source} {from}");
            }
            let named = |v: &[String]| v.iter().map(|n| model.file_name(n)).collect::<Vec<_>>();
            say!(
                "pretrained: {} tensors {from} ({} names); re-initialised head {:?}; missing {:?}; unexpected {:?}",
                r.loaded,
                r.names.unwrap_or(crate::model::Names::Torchvision),
                named(&r.reinitialized_head),
                named(&r.missing),
                r.unexpected
            );
            if let Some(t) = &file.eval {
                let (theirs, ours) = (crate::config::published_interpolation(t), cfg.interpolation());
                if theirs == ours {
                    say!("pretrained: resizing {ours}, as these weights were evaluated");
                } else {
                    say!("pretrained: these weights were evaluated with {theirs} resizing; --interpolation {ours} resizes otherwise, which can cost a little accuracy before fine-tuning");
                }
            }
            if let Some(p) = &r.prefix {
                say!("pretrained: every name began with {p}, taken off");
            }
            if !file.others.is_empty() {
                say!("pretrained: the checkpoint also holds {} (--pretrained-key picks one)", file.others.join(", "));
            }
            if !r.interpolated.is_empty() {
                say!("pretrained: {:?} interpolated to the {} px input", r.interpolated, cfg.img_size);
            }
        }
        if !cfg.freeze.is_empty() {
            let n = model.freeze(&cfg.freeze)?;
            say!("frozen: {n} tensors under {}", cfg.freeze.join(", "));
        }
        if crate::device::channels_last(cfg.channels_last, device) {
            shim::var_store_to_channels_last(&model.vs)?;
        }
        let (decay, not_adapted) = optim::decay_and_not_adapted(cfg, &model);
        let placement = Placement {
            head_prefix: model.head_prefix(),
            head_lr_mult: cfg.head_lr_mult,
            decay: &decay,
            not_adapted: &not_adapted,
            layer_decay: cfg.layer_decay.map(|d| (d, &model.layers)),
        };
        let opt = Optimizer::new(cfg, &model.trainable(), &placement);
        let params: Vec<Tensor> = opt.params().map(|p| p.shallow_clone()).collect(); // DDP's bucket order
        let amp = cfg.amp.autocast_kind(device)?;
        let scaler = (amp == Some(Kind::Half)).then(|| match cfg.loss_scale {
            Some(fixed) => GradScaler::fixed(device, fixed),
            None => GradScaler::dynamic(device, cfg.init_loss_scale),
        });
        let ema = Ema::of_config(cfg, &model, num_classes)?;
        let ddp = Ddp::new(pg, &params, ddp.bucket_mb, ddp.wire, ddp.overlap)?;
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
            graph: match cfg.cuda_graphs {
                true => Some(graph_for(device, &ddp)?),
                false => None,
            },
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

    /// Replaces the LR schedule made from the config (lr-find's ramp).
    pub fn set_schedule(&mut self, sched: LrSchedule) {
        self.sched = sched;
    }

    /// The learning rate of the next optimizer step.
    pub fn lr(&self, state: &RunState) -> f64 {
        self.sched.lr_at(state.global_step, &state.plateau)
    }

    /// One training batch: normalised images `x` and labels `y` on the device, at `pos`; then
    /// the optimizer step if the batch ends its accumulation group (returns whether it did).
    /// With `--cuda-graphs` the batch goes through the captured step when it can.
    pub fn step(
        &mut self,
        x: &Tensor,
        y: &Tensor,
        pos: MicroPos,
        state: &mut RunState,
        meter: &mut EpochMeter,
    ) -> Result<bool> {
        if self.graph.as_mut().is_some_and(|g| g.takes(x, y)) {
            let mut graph = self.graph.take().expect("checked above");
            let result = self.graph_step(&mut graph, x, y, state, meter);
            self.graph = Some(graph);
            crate::dist::watchdog::record_step(state.global_step as u64);
            return result.map(|_| true);
        }
        self.micro_step(x, y, pos, meter)?;
        if !pos.ends_step() {
            return Ok(false); // gradients keep accumulating; no all-reduce until the group's last
        }
        self.optimizer_step(state, meter, (pos.epoch, pos.step_in_epoch()))?;
        crate::dist::watchdog::record_step(state.global_step as u64);
        Ok(true)
    }

    /// One micro-batch: forward, loss and backward. Its loss and correct count go to `meter`,
    /// on the device.
    pub fn micro_step(&mut self, x: &Tensor, y: &Tensor, pos: MicroPos, meter: &mut EpochMeter) -> Result<()> {
        if pos.first_in_group() {
            self.start_group()?;
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
        let (logits, loss) = self.forward_loss(&x, y, soft_targets.as_ref())?;
        self.backward(&loss, pos.group_len(), pos.ends_step())?;
        self.model.bn_batches += 1;
        meter.add_batch(&loss, &logits, y);
        self.loss = Some(loss);
        Ok(())
    }

    /// Gradients zeroed; BatchNorm buffers from rank 0.
    fn start_group(&self) -> Result<()> {
        match self.ddp.owns_grads() {
            true => self.ddp.zero_grad(),
            false => self.opt.zero_grad()?,
        }
        self.buffers_from_rank0()
    }

    /// BatchNorm statistics from rank 0 when they are not synchronised, as DDP's forward takes
    /// them (`broadcast_buffers`): before each training step, and before evaluation, where
    /// PyTorch's first evaluation forward does the same, so every rank evaluates with the
    /// statistics the checkpoint (rank 0's) keeps.
    pub fn buffers_from_rank0(&self) -> Result<()> {
        if self.pg().world_size > 1 && !self.sync_bn {
            self.ddp.broadcast_buffers(&self.untrained)?;
        }
        Ok(())
    }

    /// Logits and the fp32 loss (against `soft_targets` when Mixup/CutMix made them), under
    /// autocast; backward and the step run outside it, as with torch.autocast.
    fn forward_loss(&self, x: &Tensor, y: &Tensor, soft_targets: Option<&Tensor>) -> Result<(Tensor, Tensor)> {
        let _autocast = self.amp.map(|k| shim::autocast(self.device(), k)).transpose()?;
        let logits = self.model.forward(x, true);
        let loss = match soft_targets {
            // Label smoothing is inside the soft targets.
            Some(t) => soft_target_cross_entropy(&logits, t),
            None => logits.cross_entropy_loss::<Tensor>(y, None, Reduction::Mean, -100, self.label_smoothing),
        };
        Ok((logits, loss.to_kind(Kind::Float)))
    }

    /// Backward of one of `group` accumulated micro-batches (each counts 1/group of the step's
    /// gradient), scaled for fp16; `ends_step`: its gradients are all-reduced as they are ready.
    fn backward(&self, loss: &Tensor, group: usize, ends_step: bool) -> Result<()> {
        let to_backward = if group > 1 {
            loss / group as f64
        } else {
            loss.shallow_clone()
        };
        self.ddp.begin_backward(ends_step)?;
        match &self.scaler {
            Some(s) => s.scale_loss(&to_backward).f_backward()?,
            None => to_backward.f_backward()?,
        }
        Ok(())
    }

    /// The optimizer step after a group's last micro-batch: gradients averaged over ranks,
    /// unscaled (fp16), clipped, applied; the moving average follows. An fp16 overflow skips
    /// the step on the device, with no host synchronisation.
    /// `at`: the step's (epoch, step in the epoch), which the moving average's timing reads.
    pub fn optimizer_step(&mut self, state: &mut RunState, meter: &mut EpochMeter, at: (usize, usize)) -> Result<()> {
        let lr = self.lr(state);
        let found_inf = self.apply_grads(Lr::Host(lr), true, Some(at))?;
        let loss = self.loss.as_ref().expect("a micro-step before the optimizer step").shallow_clone();
        self.end_step(state, lr, &loss, found_inf.as_ref(), meter);
        Ok(())
    }

    /// Device work after backward: gradients averaged over ranks (`timed`: the exposed wait
    /// measured), unscaled (fp16), clipped, applied at `lr`; the loss scale and the moving
    /// average follow. Returns fp16's overflow flag.
    /// `at` as `optimizer_step`'s (None in the captured step, which `--model-ema` does not take).
    fn apply_grads(&mut self, lr: Lr, timed: bool, at: Option<(usize, usize)>) -> Result<Option<Tensor>> {
        self.ddp.finish_grad_sync(timed)?;
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
        if let Some(ema) = self.ema.as_mut() {
            match at {
                Some((epoch, step)) => ema.update_after(self.model.bn_batches, epoch, step),
                None => ema.update(self.model.bn_batches),
            }
        }
        Ok(found_inf)
    }

    /// The host's share of an optimizer step done: counters, the epoch's step count, the
    /// divergence record.
    fn end_step(
        &mut self,
        state: &mut RunState,
        lr: f64,
        loss: &Tensor,
        found_inf: Option<&Tensor>,
        meter: &mut EpochMeter,
    ) {
        meter.end_step(found_inf);
        state.global_step += 1;
        state.lr = lr;
        self.guard.record(state.global_step, loss, found_inf);
    }

    /// One step through the CUDA graph: the batch and the learning rate into its static
    /// inputs, replay (captured on first use), then the host's bookkeeping on its outputs.
    fn graph_step(
        &mut self,
        graph: &mut StepGraph,
        x: &Tensor,
        y: &Tensor,
        state: &mut RunState,
        meter: &mut EpochMeter,
    ) -> Result<()> {
        let lr = self.lr(state);
        graph.load(x, y, lr);
        let out = graph.run(|x, y, lr| self.captured_step(x, y, lr))?;
        let (loss, correct) = (out.loss.shallow_clone(), out.correct.shallow_clone());
        let found_inf = out.found_inf.as_ref().map(|f| f.shallow_clone());
        self.model.bn_batches += 1;
        if let Some(ema) = self.ema.as_mut() {
            ema.model.bn_batches = self.model.bn_batches;
        }
        meter.add_counts(&loss, &correct, y.size()[0] as usize);
        self.end_step(state, lr, &loss, found_inf.as_ref(), meter);
        self.loss = Some(loss);
        Ok(())
    }

    /// What the CUDA graph captures: a whole step of one micro-batch, device work only, reading
    /// its learning rate from `lr`. (Its dropout draws advance with each replay instead of
    /// following the position: a resumed run is not bit-identical there.)
    fn captured_step(&mut self, x: &Tensor, y: &Tensor, lr: &Tensor) -> Result<StepOutputs> {
        self.start_group()?;
        let (logits, loss) = self.forward_loss(x, y, None)?;
        self.backward(&loss, 1, true)?;
        let found_inf = self.apply_grads(Lr::Device(lr), false, None)?;
        let correct = tch::no_grad(|| logits.argmax(-1, false).eq_tensor(y).sum(Kind::Float));
        Ok(StepOutputs {
            loss: loss.detach(),
            correct,
            found_inf,
        })
    }

    /// The exposed gradient all-reduce's share (what backward did not hide) of `seconds` of
    /// training since the last call, when distributed.
    pub fn comm_share(&self, seconds: f64) -> Result<Option<f64>> {
        // Inside a CUDA graph the wait is not timed (timing events cannot be captured).
        match self.pg().is_distributed() && self.graph.is_none() {
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

/// The model's options, with the fused normalisation kernels resolved: `--fused-norm` as given,
/// kept only where its kernels can run (said once if not); without the flag, on where GPU runs
/// showed them faster and equal (`fused::on_by_default`: ResNets and ConvNeXts), silently off elsewhere.
fn model_options(cfg: &TrainConfig, device: Device) -> Result<crate::model::ModelOptions> {
    use crate::model::fused::Family;
    use crate::model::kind::Arch;
    let mut opts = cfg.model_options();
    let arch = cfg.model.arch();
    let family = match arch {
        Arch::ResNet(_) => Some(Family::ResNet),
        Arch::ConvNext(_) => Some(Family::ConvNext),
        _ => None,
    };
    let norm = family.map(Family::norm);
    // The kernels are loaded onto the GPU only for a model that uses them.
    let prepared = || match norm {
        Some(_) => crate::model::fused::prepare(device),
        None => Err(format!(
            "{} has no layers the fused kernels cover (the ResNet and ConvNeXt families have)",
            cfg.model
        )),
    };
    opts.fused_norm = match cfg.fused_norm {
        Some(false) => false,
        Some(true) => match prepared() {
            Ok(_) => true,
            Err(why) => {
                match norm {
                    Some(norm) => say!("--fused-norm: {why}; the unfused {norm} runs"),
                    None => say!("--fused-norm: {why}"),
                }
                false
            }
        },
        None if !device.is_cuda() => false,
        None => {
            let amp = cfg.amp.autocast_kind(device)?;
            let channels_last = crate::device::channels_last(cfg.channels_last, device);
            let on = crate::model::fused::on_by_default(family, amp, channels_last, cfg.cuda_graphs, || {
                prepared().ok()
            });
            if let (true, Some(norm)) = (on, norm) {
                say!("fused {norm} kernels: on (the default on this GPU; --fused-norm false runs the unfused ops)");
            }
            on
        }
    };
    Ok(opts)
}

/// The captured step for a run on `device`: refused (one line naming the option) where it
/// cannot be captured.
fn graph_for(device: Device, ddp: &Ddp) -> Result<StepGraph> {
    let graph = StepGraph::new(device)?;
    if ddp.world_size() > 1 && ddp.pg().backend != Backend::Nccl {
        crate::bail_user!(
            "--cuda-graphs with {} ranks needs --dist-backend nccl: {:?}'s collectives cannot be captured",
            ddp.world_size(),
            ddp.pg().backend
        );
    }
    Ok(graph)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::SchedKind;
    use crate::model::ModelKind;

    /// The models and their moving averages of two trainers, side by side.
    fn pairs<'a>(a: &'a Trainer, b: &'a Trainer) -> [(&'a Model, &'a Model); 2] {
        let ema = |t: &'a Trainer| &t.ema.as_ref().unwrap().model;
        [(&a.model, &b.model), (ema(a), ema(b))]
    }

    /// The step a CUDA graph captures, run eagerly on the CPU on its static buffers with the
    /// learning rate read from its tensor, against the eager step: the same weights, moving
    /// average and epoch sums, bit for bit, over steps whose learning rate changes every step
    /// (cosine), with clipping and momentum, and a last batch of another shape that falls back
    /// to the eager path.
    #[test]
    fn the_captured_step_computes_what_the_eager_step_does() {
        let cfg = TrainConfig {
            model: ModelKind::ResNet10Tiny,
            lr: 0.2,
            momentum: 0.9,
            weight_decay: 1e-4,
            sched: SchedKind::Cosine,
            epochs: 1,
            ema: Some(0.9),
            clip_grad_norm: Some(0.5),
            ..Default::default()
        };
        let steps = 6;
        let new = || {
            let pg = Rc::new(ProcessGroup::single(Device::Cpu));
            Trainer::new(&cfg, 3, steps, pg, DdpOptions::default(), None).unwrap()
        };
        let (mut eager, mut graphed) = (new(), new());
        graphed.graph = Some(StepGraph::every_step(Device::Cpu, 1));
        // Other tests share libtorch's generator: start both from the same weights explicitly.
        tch::no_grad(|| {
            for (a, b) in pairs(&eager, &graphed) {
                let src = a.vs.variables();
                for (name, mut t) in b.vs.variables() {
                    t.copy_(&src[&name]);
                }
            }
        });
        let opts = (Kind::Float, Device::Cpu);
        let batches: Vec<(Tensor, Tensor)> = [6, 6, 6, 6, 6, 4]
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                let x = Tensor::arange(n * 3 * 32 * 32, opts).view([n, 3, 32, 32]);
                let x = (x * (0.37 + i as f64 * 0.11)).sin();
                (x, Tensor::arange(n, (Kind::Int64, Device::Cpu)).remainder(3))
            })
            .collect();
        let mut sums = vec![];
        for t in [&mut eager, &mut graphed] {
            let mut state = RunState::default();
            let mut meter = EpochMeter::start(Default::default(), t.pg());
            for (micro, (x, y)) in batches.iter().enumerate() {
                let pos = MicroPos {
                    epoch: 0,
                    micro,
                    micro_per_epoch: steps,
                    accum: 1,
                };
                assert!(t.step(x, y, pos, &mut state, &mut meter).unwrap());
            }
            assert_eq!(state.global_step, steps);
            let p = meter.position(t.pg(), state.lr).unwrap();
            sums.push((p.loss_sum, p.correct, p.seen, t.model.bn_batches, p.lr));
        }
        assert_eq!(sums[0], sums[1], "epoch sums (loss, correct, seen, BN batches, last lr)");
        for (a, b) in pairs(&eager, &graphed) {
            let want = a.vs.variables();
            for (name, got) in b.vs.variables() {
                assert!(got.equal(&want[&name]), "{name} differs");
            }
        }
    }
}
