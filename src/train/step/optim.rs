//! SGD, Adam and AdamW with PyTorch's update rules, on torch.optim's fused kernels (reached
//! through the shim), RMSprop on torch.optim's foreach kernels, and LARS and LAMB with timm's,
//! on ATen's foreach kernels; their state is
//! held here in the open so checkpoints can save and restore it by parameter name. Parameters
//! fall into groups that differ in learning-rate multiplier (`--head-lr-mult`), weight decay
//! (`--no-bn-weight-decay`) and, for LARS and LAMB, whether the trust ratio applies.
use std::collections::{BTreeMap, HashMap, HashSet};

use anyhow::{bail, Result};
use tch::{Kind, Tensor};

use crate::config::{OptimizerKind, TrainConfig};
use crate::model::LayerMap;
use crate::shim::{self, AdamParams, LambParams, LarsParams, Lr, RmspropParams, SgdParams};

/// timm.optim.Lars's eps, in the trust ratio's denominator.
const LARS_EPS: f64 = 1e-8;
/// timm.optim.Lamb's defaults: betas, eps, and the global gradient norm it clips to itself.
const LAMB_BETAS: (f64, f64) = (0.9, 0.999);
const LAMB_EPS: f64 = 1e-6;
pub const LAMB_MAX_GRAD_NORM: f64 = 1.0;

/// Parameters that share a learning-rate multiplier and a weight decay.
pub struct Group {
    pub lr_mult: f64,
    pub weight_decay: f64,
    /// LARS and LAMB: the trust ratio applies (not to the names without weight decay).
    pub adapt: bool,
    pub names: Vec<String>,
    pub params: Vec<Tensor>,
    state: GroupState,
}

/// One entry per parameter of the group, in the group's order.
enum GroupState {
    /// Momentum buffers (empty when momentum is 0). They start at zero rather than torch's
    /// "copy the first gradient": with dampening 0 that is the same update, bit for bit, and a
    /// first step skipped for an fp16 overflow cannot leave them uninitialised.
    Sgd { bufs: Vec<Tensor> },
    Adam {
        exp_avg: Vec<Tensor>,
        exp_avg_sq: Vec<Tensor>,
        /// float32 scalars on the parameter's device, as torch's fused Adam keeps them.
        step: Vec<Tensor>,
    },
    /// Momentum buffers (empty when momentum is 0), starting at zero as SGD's.
    Lars { bufs: Vec<Tensor> },
    Lamb {
        exp_avg: Vec<Tensor>,
        exp_avg_sq: Vec<Tensor>,
        /// The group's step count (timm keeps one per group), a float32 scalar on the device.
        step: Tensor,
    },
    Rmsprop {
        square_avg: Vec<Tensor>,
        /// Momentum buffers (empty when momentum is 0), starting at zero as torch's.
        bufs: Vec<Tensor>,
        /// float32 scalars on the parameter's device, as torch keeps them.
        step: Vec<Tensor>,
    },
}

impl GroupState {
    /// Parameter `i`'s state as (key, tensor): torch.optim's and timm's keys. LAMB's step is
    /// the group's count, under each of its parameters (as torch keeps Adam's).
    fn entries(&self, i: usize) -> Vec<(&'static str, &Tensor)> {
        match self {
            GroupState::Sgd { bufs } | GroupState::Lars { bufs } => bufs.get(i).map(|b| ("momentum_buffer", b)).into_iter().collect(),
            GroupState::Adam {
                exp_avg,
                exp_avg_sq,
                step,
            } => vec![("exp_avg", &exp_avg[i]), ("exp_avg_sq", &exp_avg_sq[i]), ("step", &step[i])],
            GroupState::Lamb {
                exp_avg,
                exp_avg_sq,
                step,
            } => vec![("exp_avg", &exp_avg[i]), ("exp_avg_sq", &exp_avg_sq[i]), ("step", step)],
            GroupState::Rmsprop { square_avg, bufs, step } => {
                let mut e = vec![("square_avg", &square_avg[i]), ("step", &step[i])];
                e.extend(bufs.get(i).map(|b| ("momentum_buffer", b)));
                e
            }
        }
    }
}

pub struct Optimizer {
    kind: OptimizerKind,
    momentum: f64,
    nesterov: bool,
    lars_eta: f64,
    rmsprop: (f64, f64),
    pub groups: Vec<Group>,
}

/// How a parameter is placed: (learning-rate multiplier, weight decay, trust ratio).
pub struct Placement<'a> {
    pub head_prefix: &'a str,
    pub head_lr_mult: f64,
    /// Each parameter's weight decay where it is not --weight-decay (`--no-bn-weight-decay`,
    /// `--no-norm-bias-decay`, `--norm-weight-decay`, `--bias-weight-decay`).
    pub decay: &'a HashMap<String, f64>,
    /// With LARS and LAMB: the parameters left out of the trust ratio and the decay, norms
    /// and biases (MLPerf's skip list, timm's groups).
    pub not_adapted: &'a HashSet<String>,
    /// `--layer-decay`: the decay and the model's layers.
    pub layer_decay: Option<(f64, &'a LayerMap)>,
}

impl Placement<'_> {
    /// A parameter's learning-rate multiplier: the head's, times decay^(L - 1 - layer).
    pub fn lr_mult(&self, name: &str) -> f64 {
        let head = match name.starts_with(&format!("{}.", self.head_prefix)) {
            true => self.head_lr_mult,
            false => 1.0,
        };
        match self.layer_decay {
            Some((decay, layers)) => {
                let below = layers.num_layers() - 1 - layers.layer_of(name);
                head * decay.powi(below as i32)
            }
            None => head,
        }
    }
}

impl Optimizer {
    /// An optimizer over `params` (name, tensor), in name order, grouped by `placement`.
    pub fn new(cfg: &TrainConfig, params: &[(String, Tensor)], placement: &Placement) -> Self {
        let mut by_key: BTreeMap<(u64, u64, bool), Vec<&(String, Tensor)>> = BTreeMap::new();
        let mut sorted: Vec<&(String, Tensor)> = params.iter().collect();
        sorted.sort_by(|a, b| a.0.cmp(&b.0));
        for p in sorted {
            let mult = placement.lr_mult(&p.0);
            let excluded = placement.not_adapted.contains(&p.0);
            let wd = match excluded {
                true => 0.0,
                false => placement.decay.get(&p.0).copied().unwrap_or(cfg.weight_decay),
            };
            // MLPerf's rule: excluded by name, so `--weight-decay 0` still adapts the rest.
            let adapt = cfg.optimizer.layer_wise() && !excluded;
            by_key.entry((mult.to_bits(), wd.to_bits(), adapt)).or_default().push(p);
        }
        let groups = by_key
            .into_iter()
            .map(|((mult, wd, adapt), ps)| {
                let params: Vec<Tensor> = ps.iter().map(|p| p.1.shallow_clone()).collect();
                let zeros = || -> Vec<Tensor> { params.iter().map(|p| p.zeros_like()).collect() };
                let steps = || -> Vec<Tensor> {
                    params.iter().map(|p| Tensor::zeros([], (Kind::Float, p.device()))).collect()
                };
                let state = match cfg.optimizer {
                    OptimizerKind::Sgd if cfg.momentum == 0.0 => GroupState::Sgd { bufs: Vec::new() },
                    OptimizerKind::Sgd => GroupState::Sgd { bufs: zeros() },
                    OptimizerKind::Adam | OptimizerKind::Adamw => GroupState::Adam {
                        exp_avg: zeros(),
                        exp_avg_sq: zeros(),
                        step: steps(),
                    },
                    OptimizerKind::Lars if cfg.momentum == 0.0 => GroupState::Lars { bufs: Vec::new() },
                    OptimizerKind::Lars => GroupState::Lars { bufs: zeros() },
                    OptimizerKind::Lamb => GroupState::Lamb {
                        exp_avg: zeros(),
                        exp_avg_sq: zeros(),
                        step: Tensor::zeros([], (Kind::Float, params.first().map_or(tch::Device::Cpu, |p| p.device()))),
                    },
                    OptimizerKind::Rmsprop => GroupState::Rmsprop {
                        square_avg: zeros(),
                        bufs: match cfg.momentum == 0.0 {
                            true => Vec::new(),
                            false => zeros(),
                        },
                        step: steps(),
                    },
                };
                Group {
                    lr_mult: f64::from_bits(mult),
                    weight_decay: f64::from_bits(wd),
                    adapt,
                    names: ps.iter().map(|p| p.0.clone()).collect(),
                    params,
                    state,
                }
            })
            .collect();
        Optimizer {
            kind: cfg.optimizer,
            momentum: cfg.momentum,
            nesterov: cfg.nesterov,
            lars_eta: cfg.lars_eta,
            rmsprop: (cfg.rmsprop_alpha, cfg.rmsprop_eps),
            groups,
        }
    }

    pub fn params(&self) -> impl Iterator<Item = &Tensor> {
        self.groups.iter().flat_map(|g| g.params.iter())
    }

    /// `zero_grad(set_to_none=True)`.
    pub fn zero_grad(&self) -> Result<()> {
        for g in &self.groups {
            shim::clear_grads(&g.params)?;
        }
        Ok(())
    }

    /// One step at learning rate `lr` (times each group's multiplier; a device `lr` is read by
    /// the kernels). Parameters without a gradient are left alone, as in torch. With
    /// `found_inf` holding 1 (an fp16 overflow) the step changes nothing, decided on the device.
    pub fn step(&mut self, lr: Lr, found_inf: Option<&Tensor>) -> Result<()> {
        let (momentum, nesterov, kind, lars_eta, rmsprop) =
            (self.momentum, self.nesterov, self.kind, self.lars_eta, self.rmsprop);
        // LAMB clips the global gradient norm of all groups itself, before any group steps.
        let lamb_clip = match kind {
            OptimizerKind::Lamb => {
                let grads: Vec<Tensor> = self.params().map(|p| p.grad()).filter(|g| g.defined()).collect();
                match grads.is_empty() {
                    true => None,
                    false => Some(shim::lamb_clip(&grads, LAMB_MAX_GRAD_NORM)?),
                }
            }
            _ => None,
        };
        for g in &mut self.groups {
            let scaled;
            let lr = match lr {
                Lr::Host(v) => Lr::Host(v * g.lr_mult),
                Lr::Device(t) if g.lr_mult == 1.0 => Lr::Device(t),
                Lr::Device(t) => {
                    scaled = t * g.lr_mult;
                    Lr::Device(&scaled)
                }
            };
            let with_grad: Vec<usize> = (0..g.params.len()).filter(|&i| g.params[i].grad().defined()).collect();
            let params: Vec<Tensor> = with_grad.iter().map(|&i| g.params[i].shallow_clone()).collect();
            let grads: Vec<Tensor> = with_grad.iter().map(|&i| g.params[i].grad()).collect();
            // timm counts a LAMB group's step even when none of its parameters has a gradient.
            if params.is_empty() && !matches!(g.state, GroupState::Lamb { .. }) {
                continue;
            }
            // A state list is empty where there is no such state (momentum 0): torch passes an
            // empty list then.
            let pick = |v: &[Tensor]| match v.is_empty() {
                true => Vec::new(),
                false => with_grad.iter().map(|&i| v[i].shallow_clone()).collect::<Vec<_>>(),
            };
            match &mut g.state {
                GroupState::Sgd { bufs } => {
                    let h = SgdParams {
                        momentum,
                        dampening: 0.0,
                        weight_decay: g.weight_decay,
                        nesterov,
                    };
                    shim::fused_sgd(&params, &grads, &pick(bufs), lr, h, false, found_inf)?;
                }
                GroupState::Adam {
                    exp_avg,
                    exp_avg_sq,
                    step,
                } => {
                    let h = AdamParams {
                        beta1: 0.9,
                        beta2: 0.999,
                        eps: 1e-8,
                        weight_decay: g.weight_decay,
                        decoupled: kind == OptimizerKind::Adamw,
                    };
                    shim::fused_adam(
                        &params,
                        &grads,
                        &pick(exp_avg),
                        &pick(exp_avg_sq),
                        &pick(step),
                        lr,
                        h,
                        found_inf,
                    )?;
                }
                GroupState::Lars { bufs } => {
                    let h = LarsParams {
                        momentum,
                        weight_decay: g.weight_decay,
                        nesterov,
                        trust_coeff: lars_eta,
                        eps: LARS_EPS,
                        adapt: g.adapt,
                    };
                    shim::lars(&params, &grads, &pick(bufs), lr, h, found_inf)?;
                }
                GroupState::Lamb {
                    exp_avg,
                    exp_avg_sq,
                    step,
                } => {
                    let h = LambParams {
                        beta1: LAMB_BETAS.0,
                        beta2: LAMB_BETAS.1,
                        eps: LAMB_EPS,
                        weight_decay: g.weight_decay,
                        adapt: g.adapt,
                    };
                    let (m, v) = (pick(exp_avg), pick(exp_avg_sq));
                    shim::lamb(&params, &grads, &m, &v, step, lamb_clip.as_ref(), lr, h, found_inf)?;
                }
                GroupState::Rmsprop { square_avg, bufs, step } => {
                    let h = RmspropParams {
                        alpha: rmsprop.0,
                        eps: rmsprop.1,
                        weight_decay: g.weight_decay,
                        momentum,
                    };
                    let (v, b, s) = (pick(square_avg), pick(bufs), pick(step));
                    shim::rmsprop(&params, &grads, &v, &b, &s, lr, h, found_inf)?;
                }
            }
        }
        Ok(())
    }

    /// The state as named tensors, `<parameter>.<momentum_buffer|exp_avg|exp_avg_sq|square_avg|step>`
    /// (torch.optim's and timm's state keys), for `optimizer.safetensors`.
    pub fn state_tensors(&self) -> Vec<(String, Tensor)> {
        let mut out = Vec::new();
        for g in &self.groups {
            for (i, name) in g.names.iter().enumerate() {
                for (key, t) in g.state.entries(i) {
                    out.push((format!("{name}.{key}"), t.shallow_clone()));
                }
            }
        }
        out
    }

    /// Restores `state_tensors` output (values copied into this optimizer's tensors, keeping
    /// their device and memory format). Every entry must fit; unknown ones are an error.
    pub fn load_state(&mut self, saved: HashMap<String, Tensor>) -> Result<()> {
        let mut used = 0;
        tch::no_grad(|| -> Result<()> {
            for g in &self.groups {
                for (i, name) in g.names.iter().enumerate() {
                    let get = |key: &str| saved.get(&format!("{name}.{key}"));
                    let copy = |dst: &Tensor, src: &Tensor, key: &str| -> Result<()> {
                        if dst.size() != src.size() {
                            bail!("{name}.{key} has shape {:?}, expected {:?}", src.size(), dst.size());
                        }
                        dst.shallow_clone().copy_(src);
                        Ok(())
                    };
                    for (key, dst) in g.state.entries(i) {
                        match get(key) {
                            Some(src) => copy(dst, src, key)?,
                            None => bail!("missing {name}.{key}"),
                        }
                        used += 1;
                    }
                }
            }
            Ok(())
        })?;
        if used != saved.len() {
            bail!(
                "{} saved entries match no parameter of this optimizer (another optimizer or model?)",
                saved.len() - used
            );
        }
        Ok(())
    }
}

/// BatchNorm weights and biases: the parameters `X.weight`/`X.bias` of a module `X` that has a
/// `running_mean` buffer.
pub fn batch_norm_params(names: &[String]) -> HashSet<String> {
    let all: HashSet<&str> = names.iter().map(|s| s.as_str()).collect();
    names
        .iter()
        .filter(|n| {
            let prefix = n.rsplit_once('.').map(|(p, _)| p).unwrap_or("");
            (n.ends_with(".weight") || n.ends_with(".bias")) && all.contains(format!("{prefix}.running_mean").as_str())
        })
        .cloned()
        .collect()
}

/// timm's parameters without weight decay: every tensor of at most one dimension (norm weights,
/// biases), and the per-channel scales and token embeddings timm lists in `no_weight_decay`
/// (ConvNeXt's `layer_scale`, ViT's `class_token` and `pos_embedding`).
pub fn norm_and_bias_params(params: &[(String, Tensor)]) -> HashSet<String> {
    params
        .iter()
        .filter(|(n, t)| {
            t.dim() <= 1 || ["layer_scale", "class_token", "pos_embedding"].iter().any(|s| n.ends_with(s))
        })
        .map(|(n, _)| n.clone())
        .collect()
}

/// A run's weight decay per parameter (where it differs from --weight-decay) and the tensors
/// LARS and LAMB leave out of the trust ratio (and the decay), for `Placement`: torchvision's
/// `--norm-weight-decay`/`--bias-weight-decay`, the no-decay switches, LARS's and LAMB's norms
/// and biases. `check` refused a switch's zero against a non-zero flag, so one value each.
pub fn decay_and_not_adapted(cfg: &TrainConfig, model: &crate::model::Model) -> (HashMap<String, f64>, HashSet<String>) {
    let trainable = model.trainable();
    let mut decay = torchvision_decay(&trainable, cfg.norm_weight_decay, cfg.bias_weight_decay);
    if cfg.no_bn_weight_decay {
        decay.extend(batch_norm_params(&model.vs.variables().into_keys().collect::<Vec<_>>()).into_iter().map(|n| (n, 0.0)));
    }
    let norms_and_biases = || norm_and_bias_params(&trainable);
    if cfg.no_norm_bias_decay {
        decay.extend(norms_and_biases().into_iter().map(|n| (n, 0.0)));
    }
    let not_adapted = match cfg.optimizer.layer_wise() {
        true => norms_and_biases(),
        false => HashSet::new(),
    };
    (decay, not_adapted)
}

/// torchvision's `set_weight_decay`: the parameters of normalisation layers (their module has a
/// one-dimensional weight: BatchNorm, LayerNorm, GroupNorm) at `norm`,
/// then every parameter named `bias` at `bias`, over the norm's; the rest keep --weight-decay.
pub fn torchvision_decay(params: &[(String, Tensor)], norm: Option<f64>, bias: Option<f64>) -> HashMap<String, f64> {
    let module = |n: &str| n.rsplit_once('.').map_or("", |(m, _)| m).to_string();
    let norms: HashSet<String> = params
        .iter()
        .filter(|(n, t)| n.ends_with(".weight") && t.dim() == 1)
        .map(|(n, _)| module(n))
        .collect();
    let mut decay = HashMap::new();
    for (name, _) in params {
        let is_bias = name == "bias" || name.ends_with(".bias");
        match (bias, norm) {
            (Some(b), _) if is_bias => decay.insert(name.clone(), b),
            (_, Some(w)) if norms.contains(&module(name)) => decay.insert(name.clone(), w),
            _ => None,
        };
    }
    decay
}

/// `torch.nn.utils.clip_grad_norm_`: scales all gradients by min(1, max_norm / (norm + 1e-6))
/// without reading the norm back to the host. Returns the total norm (a 0-d device tensor).
pub fn clip_grad_norm<'a>(params: impl IntoIterator<Item = &'a Tensor>, max_norm: f64) -> Tensor {
    let grads: Vec<Tensor> = params.into_iter().map(|p| p.grad()).filter(|g| g.defined()).collect();
    if grads.is_empty() {
        return Tensor::from(0.0f32);
    }
    let norms: Vec<Tensor> = grads.iter().map(|g| g.norm().unsqueeze(0)).collect();
    let total = Tensor::cat(&norms, 0).norm();
    // `max_norm / (total + 1e-6)` as PyTorch evaluates it (Tensor.__rtruediv__ is reciprocal,
    // then multiply), all on the device: no host copy, so no synchronisation.
    let coef = ((&total + 1e-6).reciprocal() * max_norm).clamp_max(1.0);
    tch::no_grad(|| {
        for g in &grads {
            let _ = g.shallow_clone().g_mul_(&coef.to_kind(g.kind()));
        }
    });
    total
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind};

    #[test]
    fn clipping_scales_to_max_norm_and_leaves_small_gradients() {
        let a = Tensor::zeros([2], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        let b = Tensor::zeros([1], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        // grads (3, 0) and (4): total norm 5.
        ((&a * Tensor::from_slice(&[3.0f32, 0.0])).sum(Kind::Float) + (&b * 4.0).sum(Kind::Float)).backward();
        let n = clip_grad_norm(&[a.shallow_clone(), b.shallow_clone()], 1.0);
        assert!((n.double_value(&[]) - 5.0).abs() < 1e-5);
        assert!((a.grad().double_value(&[0]) - 0.6).abs() < 1e-5);
        assert!((b.grad().double_value(&[0]) - 0.8).abs() < 1e-5);
        let _ = clip_grad_norm(&[a.shallow_clone(), b.shallow_clone()], 10.0);
        assert!((a.grad().double_value(&[0]) - 0.6).abs() < 1e-5);
    }

    #[test]
    fn batch_norm_params_are_found_by_their_running_mean() {
        let names: Vec<String> = [
            "conv1.weight",
            "bn1.weight",
            "bn1.bias",
            "bn1.running_mean",
            "layer1.0.downsample.1.weight",
            "layer1.0.downsample.1.running_mean",
            "fc.weight",
            "fc.bias",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let mut got: Vec<String> = batch_norm_params(&names).into_iter().collect();
        got.sort();
        assert_eq!(got, ["bn1.bias", "bn1.weight", "layer1.0.downsample.1.weight"]);
    }

    /// BEiT's and timm's layer-wise rates for ViT-B/16 (`param_groups_lrd`): patch embedding,
    /// class token and position embedding at decay^13, block i at decay^(12 - i), the final
    /// norm and the head at the full rate (times --head-lr-mult); ConvNeXt's downsampling
    /// learns with the block after it.
    #[test]
    fn layer_decay_gives_each_layer_its_rate() {
        let vit = crate::model::Model::build(
            crate::model::ModelKind::VitB16,
            4,
            tch::Device::Cpu,
            crate::model::ModelOptions {
                img_size: 32,
                ..crate::model::ModelOptions::defaults(crate::model::ModelKind::VitB16)
            },
        );
        let none = HashMap::new();
        let placement = Placement {
            head_prefix: "heads.head",
            head_lr_mult: 10.0,
            decay: &none,
            not_adapted: &HashSet::new(),
            layer_decay: Some((0.75, &vit.layers)),
        };
        for (name, want) in [
            ("conv_proj.weight", 0.75f64.powi(13)),
            ("class_token", 0.75f64.powi(13)),
            ("encoder.pos_embedding", 0.75f64.powi(13)),
            ("encoder.layers.encoder_layer_0.ln_1.weight", 0.75f64.powi(12)),
            ("encoder.layers.encoder_layer_11.mlp.3.bias", 0.75),
            ("encoder.ln.weight", 1.0),
            ("heads.head.weight", 10.0),
        ] {
            let got = placement.lr_mult(name);
            assert!((got - want).abs() <= 1e-12 * want, "{name}: {got}, want {want}");
        }
        // Every parameter has a layer, and each layer has parameters.
        let mut per_layer = vec![0; vit.layers.num_layers()];
        for (name, _) in vit.trainable() {
            per_layer[vit.layers.layer_of(&name)] += 1;
        }
        assert_eq!(per_layer.len(), 14);
        assert!(per_layer.iter().all(|&n| n > 0), "{per_layer:?}");

        let cnx = crate::model::Model::new(crate::model::ModelKind::ConvNextTiny, 4, tch::Device::Cpu);
        let l = &cnx.layers;
        assert_eq!(l.num_layers(), 18 + 2);
        assert_eq!(l.layer_of("features.0.0.weight"), 0);
        assert_eq!(l.layer_of("features.1.0.block.0.weight"), 1);
        assert_eq!(l.layer_of("features.2.1.weight"), l.layer_of("features.3.0.layer_scale"));
        assert_eq!(l.layer_of("features.3.0.layer_scale"), 4);
        assert_eq!(l.layer_of("classifier.2.weight"), 19);
    }

    /// timm's no-weight-decay set: norms, biases, layer scales, position embedding, class token.
    #[test]
    fn norm_and_bias_params_are_timms_no_decay_set() {
        let cnx = crate::model::Model::new(crate::model::ModelKind::ConvNextTiny, 4, tch::Device::Cpu);
        let set = norm_and_bias_params(&cnx.trainable());
        for n in ["features.0.1.weight", "features.0.0.bias", "features.1.0.layer_scale", "features.1.0.block.2.bias", "classifier.0.weight", "classifier.2.bias"] {
            assert!(set.contains(n), "{n}");
        }
        for n in ["features.0.0.weight", "features.1.0.block.3.weight", "classifier.2.weight"] {
            assert!(!set.contains(n), "{n}");
        }
    }
}
