//! The optimizers against torch.optim (RMSprop with torchvision's alpha and eps; LARS and LAMB
//! against timm.optim) on a scripted problem
//! (three parameter groups: decayed body, BatchNorm without weight decay nor trust ratio, head at
//! 10× LR; a changing LR), driven by fp16's
//! GradScaler with its real tensors on both sides (ours and torch.amp.GradScaler; one step has
//! an inf gradient, is skipped and backs the scale off): equal to torch's fused kernels and,
//! within float rounding, to its reference for-loop implementation; the step counters and the
//! scale end equal too. A save/load of the state in the middle changes nothing, bit for bit.
//! ReduceLROnPlateau against torch's on a metric sequence.
mod common;

use std::collections::{HashMap, HashSet};

use ringtrain::config::{OptimizerKind, TrainConfig};
use ringtrain::dist::process_group::ProcessGroup;
use ringtrain::shim::Lr;
use ringtrain::train::step::amp::{GradScaler, INIT_SCALE};
use ringtrain::train::step::optim::{Optimizer, Placement};
use ringtrain::train::step::schedule::{Plateau, PlateauState};
use tch::{Device, Kind, Tensor};

const LRS: [f64; 6] = [0.1, 0.08, 0.05, 0.05, 0.02, 0.01];
const SKIPPED_STEP: usize = 3;

fn initial() -> Vec<(String, Tensor)> {
    tch::manual_seed(7);
    [
        ("body.weight", vec![5, 3]),
        ("bn.weight", vec![5]),
        ("bn.bias", vec![5]),
        ("fc.weight", vec![2, 5]),
        ("fc.bias", vec![2]),
    ]
    .into_iter()
    .map(|(n, s)| (n.to_string(), Tensor::randn(s, (Kind::Float, Device::Cpu))))
    .collect()
}

fn config(kind: &str) -> TrainConfig {
    let (optimizer, momentum, nesterov, wd) = match kind {
        "sgd" => (OptimizerKind::Sgd, 0.9, false, 1e-4),
        "sgd_nesterov" => (OptimizerKind::Sgd, 0.9, true, 1e-3),
        "sgd_plain" => (OptimizerKind::Sgd, 0.0, false, 1e-2),
        "adam" => (OptimizerKind::Adam, 0.0, false, 1e-2),
        "lars" => (OptimizerKind::Lars, 0.9, false, 5e-5),
        "lars_nesterov" => (OptimizerKind::Lars, 0.9, true, 1e-3),
        "lamb" => (OptimizerKind::Lamb, 0.0, false, 0.02),
        "rmsprop" => (OptimizerKind::Rmsprop, 0.9, false, 1e-4),
        "rmsprop_plain" => (OptimizerKind::Rmsprop, 0.0, false, 1e-3),
        _ => (OptimizerKind::Adamw, 0.0, false, 0.05),
    };
    // torchvision's train.py passes RMSprop these (torch's defaults are 0.99 and 1e-8).
    TrainConfig {
        optimizer,
        momentum,
        nesterov,
        weight_decay: wd,
        rmsprop_alpha: 0.9,
        rmsprop_eps: 0.0316,
        ..Default::default()
    }
}

fn new_optimizer(kind: &str, params: &[(String, Tensor)]) -> Optimizer {
    let no_decay: HashMap<String, f64> = ["bn.weight", "bn.bias"].iter().map(|s| (s.to_string(), 0.0)).collect();
    // LARS and LAMB leave the same tensors out of the trust ratio too (train's rule).
    let cfg = config(kind);
    let not_adapted: HashSet<String> = match cfg.optimizer.layer_wise() {
        true => no_decay.keys().cloned().collect(),
        false => HashSet::new(),
    };
    Optimizer::new(
        &cfg,
        params,
        &Placement {
            head_prefix: "fc",
            head_lr_mult: 10.0,
            decay: &no_decay,
            not_adapted: &not_adapted,
            layer_decay: None,
        },
    )
}

/// Steps `range` of the scripted problem, under fp16's GradScaler as the training loop drives
/// it: gradients arrive multiplied by the scale; the scaler unscales them and gives the
/// optimizer its own 0-dim `found_inf`, which skips the step on the device. `lr`: the learning
/// rate as a number, or (`Some`) in that 0-dim tensor, refilled each step as a CUDA graph's is.
fn run_steps(
    opt: &mut Optimizer,
    scaler: &mut GradScaler,
    params: &[(String, Tensor)],
    range: std::ops::Range<usize>,
    lr: Option<&Tensor>,
) {
    for k in range {
        let scale = scaler.state().scale;
        for (name, p) in params {
            let g = tch::no_grad(|| ((p * (k as f64 + 1.0)).sin() + 0.1 * k as f64) * scale);
            if k == SKIPPED_STEP && name == "body.weight" {
                let _ = g.get(0).get(0).fill_(f64::INFINITY);
            }
            ringtrain::shim::set_grad(p, &g).unwrap();
        }
        let grads: Vec<Tensor> = params.iter().map(|(_, p)| p.grad()).collect();
        let found_inf = scaler.unscale(&grads, &ProcessGroup::single(Device::Cpu)).unwrap();
        assert_eq!(found_inf.double_value(&[]), (k == SKIPPED_STEP) as i32 as f64);
        let lr = match lr {
            Some(t) => {
                let _ = t.shallow_clone().fill_(LRS[k]);
                Lr::Device(t)
            }
            None => Lr::Host(LRS[k]),
        };
        opt.step(lr, Some(&found_inf)).unwrap();
        scaler.update();
    }
}

fn leaf_params(init: &[(String, Tensor)]) -> Vec<(String, Tensor)> {
    init.iter()
        .map(|(n, t)| (n.clone(), t.copy().set_requires_grad(true)))
        .collect()
}

/// The bound on our optimizers against torch's for-loop implementations, relative (see below).
const FORLOOP: f64 = 5e-6;
/// The bound on LARS and LAMB against timm's two implementations, relative (see below).
const TIMM: f64 = 5e-6;

#[test]
fn optimizers_match_torch_optim_and_survive_a_state_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let init = initial();
    let input = dir.path().join("init.safetensors");
    Tensor::write_safetensors(&init.iter().map(|(n, t)| (n.as_str(), t)).collect::<Vec<_>>(), &input).unwrap();
    let kinds = [
        "sgd", "sgd_nesterov", "sgd_plain", "adam", "adamw", "lars", "lars_nesterov", "lamb", "rmsprop",
        "rmsprop_plain",
    ];
    for kind in kinds {
        // Straight through.
        let params = leaf_params(&init);
        let mut opt = new_optimizer(kind, &params);
        let mut scaler = GradScaler::dynamic(Device::Cpu, INIT_SCALE);
        run_steps(&mut opt, &mut scaler, &params, 0..LRS.len(), None);
        // Interrupted after 3 steps: state saved, a new optimizer and scaler load it and go on.
        let params2 = leaf_params(&init);
        let mut first = new_optimizer(kind, &params2);
        let mut first_scaler = GradScaler::dynamic(Device::Cpu, INIT_SCALE);
        run_steps(&mut first, &mut first_scaler, &params2, 0..3, None);
        let saved: HashMap<String, Tensor> = first.state_tensors().into_iter().map(|(k, t)| (k, t.copy())).collect();
        let mut second = new_optimizer(kind, &params2);
        second.load_state(saved).unwrap();
        let mut second_scaler = GradScaler::dynamic(Device::Cpu, INIT_SCALE);
        second_scaler.restore(&first_scaler.state());
        run_steps(&mut second, &mut second_scaler, &params2, 3..LRS.len(), None);
        assert_eq!(second_scaler.state(), scaler.state());
        for ((n, a), (_, b)) in params.iter().zip(&params2) {
            assert!(a.equal(b), "{kind}: {n} differs after a state round trip");
        }
        // The learning rate read from a float32 tensor on the device (what a CUDA graph
        // replays): the same steps up to the rounding of the lr to float32 (the host's lr is an
        // f64; the head's 10 × lr is rounded once in f64 and once in float32; Adam's kernel
        // takes the two in different precisions): measured ≤ 1.7e-7 of the update, 5.2e-7 with ATen
        // unvectorised, 1.3e-6 for RMSprop's head (its step divides by a small root); a stale lr
        // (the same every step) would be off by 20 % or more.
        let params3 = leaf_params(&init);
        let mut on_device = new_optimizer(kind, &params3);
        let mut device_scaler = GradScaler::dynamic(Device::Cpu, INIT_SCALE);
        let lr = Tensor::zeros([], (Kind::Float, Device::Cpu));
        run_steps(&mut on_device, &mut device_scaler, &params3, 0..LRS.len(), Some(&lr));
        for (((n, a), (_, b)), (_, start)) in params.iter().zip(&params3).zip(&init) {
            let (d, size) = (common::max_abs_diff(a, b), common::max_abs_diff(a, start));
            let r = d / size;
            eprintln!("{kind}: {n} with the lr on the device: {r:.1e} of the update");
            assert!(r <= 5e-6, "{kind}: {n} differs with the lr on the device by {r:.1e} of the update");
        }

        let st = scaler.state();
        let ours: HashMap<String, Tensor> = params
            .iter()
            .map(|(n, t)| (n.clone(), t.detach()))
            .chain(opt.state_tensors())
            .chain([
                ("scaler.scale".to_string(), Tensor::from(st.scale as f32)),
                (
                    "scaler.growth_tracker".to_string(),
                    Tensor::from(st.growth_tracker as f32),
                ),
            ])
            .collect();
        // torch's fused kernels are the ones ours call, on the same floats: equal, bit for bit.
        // Its for-loop implementation does the same arithmetic in other operations and another
        // order: equal up to rounding, relative to the size of what is compared (a parameter's
        // change from its initial value, a state tensor's or the scaler's value). Measured on one
        // AVX-512 machine at its defaults and with ATen limited to no vectorisation, AVX2 and
        // AVX-512: ≤ 7.8e-7 (Adam, ATen without vectorisation; 5.6e-7 elsewhere), fused exact.
        // timm's LARS and LAMB have no fused kernels: ours take its foreach implementation's
        // operations (LAMB's bias corrections as device tensors, in the form timm's foreach code
        // takes for those), its for-loop one does the same arithmetic per tensor. Measured:
        // LARS equal to both, bit for bit, the skipped step included; LAMB ≤ 1.5e-6 of the
        // update against the foreach one (which folds the bias corrections into the step size),
        // ≤ 4.8e-7 against the for-loop one. torch has no fused RMSprop: ours takes its foreach
        // step's operations; measured equal to both of torch's, bit for bit.
        let (reference, implementations) = match kind {
            k if k.starts_with("la") => ("timm", [("foreach", TIMM), ("forloop", TIMM)]),
            // torch has no fused RMSprop: ours takes its foreach step's operations.
            k if k.starts_with("rmsprop") => ("torch", [("foreach", 0.0), ("forloop", FORLOOP)]),
            _ => ("torch", [("fused", 0.0), ("forloop", FORLOOP)]),
        };
        for (implementation, bound) in implementations {
            let out = dir.path().join(format!("{kind}-{implementation}.safetensors"));
            common::run_python(&[
                "optimizer",
                input.to_str().unwrap(),
                out.to_str().unwrap(),
                kind,
                implementation,
            ]);
            let theirs: HashMap<String, Tensor> = Tensor::read_safetensors(&out).unwrap().into_iter().collect();
            let mut worst = (0.0f64, String::new());
            for (name, want) in &theirs {
                let got = ours
                    .get(name)
                    .unwrap_or_else(|| panic!("{kind}: no {name} in our parameters or state"));
                let start = init
                    .iter()
                    .find(|(n, _)| n == name)
                    .map_or_else(|| want.zeros_like(), |(_, t)| t.shallow_clone());
                let (d, size) = (
                    common::max_abs_diff(&got.to_kind(Kind::Float), want),
                    common::max_abs_diff(want, &start),
                );
                let r = if d == 0.0 { 0.0 } else { d / size };
                assert!(
                    r <= bound,
                    "{kind} vs {reference} {implementation}: {name} differs by {r:.1e} of its size {size:.1e} (bound {bound:e})"
                );
                if r >= worst.0 {
                    worst = (r, name.clone());
                }
            }
            eprintln!(
                "{kind} vs {reference} {implementation}: at most {:.1e} ({})",
                worst.0, worst.1
            );
            // Our state holds nothing torch lacks, except SGD's buffers, which torch creates lazily.
            for name in ours.keys() {
                assert!(theirs.contains_key(name), "{kind}: {reference} has no {name}");
            }
        }
    }
}

#[test]
fn reduce_lr_on_plateau_matches_torch() {
    let metrics = [
        0.5, 0.6, 0.6, 0.59, 0.6, 0.61, 0.605, 0.6, 0.6, 0.6, 0.7, 0.69, 0.69, 0.69, 0.69, 0.69,
    ];
    let csv: Vec<String> = metrics.iter().map(|m| m.to_string()).collect();
    for (mode, patience, cooldown, min_lr) in [("max", 2, 0, 0.0), ("max", 1, 2, 0.005), ("min", 1, 0, 0.0)] {
        let want: Vec<f64> = serde_json::from_str(&common::run_python(&[
            "plateau",
            &csv.join(","),
            mode,
            "0.1",
            &patience.to_string(),
            "0.01",
            &cooldown.to_string(),
            &min_lr.to_string(),
        ]))
        .unwrap();
        let p = Plateau {
            minimise: mode == "min",
            factor: 0.1,
            patience,
            threshold: 0.01,
            cooldown,
            min_lr,
            base: 1.0,
        };
        let mut s = PlateauState::default();
        let got: Vec<f64> = metrics
            .iter()
            .map(|&m| {
                p.step(&mut s, m);
                s.lr.unwrap_or(1.0)
            })
            .collect();
        for (g, w) in got.iter().zip(&want) {
            assert!(
                (g - w).abs() <= 1e-12 * w.abs().max(1.0),
                "{mode} patience {patience}: {got:?} vs torch {want:?}"
            );
        }
        assert!(want.iter().any(|&l| l < 1.0), "the sequence must trigger a reduction");
    }
}
