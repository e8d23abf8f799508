//! LARS and LAMB on a ResNet-18 against timm's, per tensor (issue #52: "20 steps on a ResNet-18
//! against the reference implementations"). tests/py/large_batch_reference.py trains
//! torchvision's resnet18 for 20 steps on a fixed batch with `timm.optim.create_optimizer_v2`
//! (its groups: norms and biases without weight decay, hence without trust ratio) at MLPerf's
//! polynomial schedule written out as a formula, and saves each step's gradients. Here
//! ringtrain's resnet18 loads the same weights, its optimizer takes its groups as `train` builds
//! them (`decay_and_not_adapted`) and its learning rates from `--sched poly`, and applies the same
//! gradients. Gradients come from PyTorch for both, so the optimizer and the schedule alone are
//! compared (the model's forward and backward have their own tests in torchvision_parity.rs).
mod common;

use std::collections::{HashMap, HashSet};
use std::path::Path;

use ringtrain::config::{OptimizerKind, SchedKind, TrainConfig};
use ringtrain::model::{Model, ModelKind};
use ringtrain::shim::Lr;
use ringtrain::train::step::optim::{decay_and_not_adapted, norm_and_bias_params, Optimizer, Placement};
use ringtrain::train::step::schedule::{LrSchedule, PlateauState};
use tch::{Device, Kind, Tensor};

const STEPS: usize = 20;
const STEPS_PER_EPOCH: usize = 5;
/// One epoch of warm-up, then the decay to END over the other three.
const WARMUP_EPOCHS: usize = 1;
const END: f64 = 1e-4;

/// The bound on |ours - timm's| / |timm's total update| of a tensor (the largest element of
/// each), from float32's rounding: ours are timm's operations in float32, in another order in
/// places (LAMB's bias corrections as tensors, the trust ratio folded into the step size), so
/// each step's update may differ by a few roundings of its operations (16 ε of the update,
/// ε = 2^-23 for a dozen operations), and each step rounds the parameter itself, which may then
/// differ by up to ε of the parameter per step on the two sides together: the bound is
/// 16 ε + 20 ε · max|p| / max|update|. The second term dominates where 20 steps move a tensor by
/// little of its size (max|p| / max|update| is up to 97 for LARS here, 37 for LAMB). Measured
/// on one AVX-512 machine, at its defaults and with ONEDNN_MAX_CPU_ISA=AVX2: LARS equal to both
/// of timm's implementations, bit for bit (the schedule included); LAMB at most 9.7e-6 of a
/// tensor's update against timm's foreach implementation, 3.9e-6 against its for-loop one,
/// 0.11 of the bound at the closest. A wrong LARS or LAMB, timm's with every trust ratio 1,
/// is off by at least 25 (LARS) and 1.8 (LAMB) times an adapted tensor's update, over 3e4
/// times the bound.
fn bound(want: &Tensor, start: &Tensor) -> f64 {
    let eps = f32::EPSILON as f64;
    16.0 * eps + STEPS as f64 * eps * common::max_abs(want) / common::max_abs_diff(want, start)
}

struct Run {
    kind: OptimizerKind,
    lr: f64,
    weight_decay: f64,
    /// LARS's (LAMB takes none).
    momentum: f64,
}

fn config(run: &Run) -> TrainConfig {
    TrainConfig {
        optimizer: run.kind,
        lr: run.lr,
        momentum: run.momentum,
        weight_decay: run.weight_decay,
        lars_eta: 0.001,
        sched: SchedKind::Poly,
        poly_power: 2.0,
        warmup_epochs: WARMUP_EPOCHS as f64,
        epochs: STEPS / STEPS_PER_EPOCH,
        eta_min: END,
        ..Default::default()
    }
}

fn read(path: &Path) -> HashMap<String, Tensor> {
    Tensor::read_safetensors(path).unwrap().into_iter().collect()
}

/// The largest |a - b| over the largest |b - start|: a's error relative to b's update.
fn relative(a: &Tensor, b: &Tensor, start: &Tensor) -> f64 {
    let d = common::max_abs_diff(a, b);
    if d == 0.0 {
        return 0.0;
    }
    d / common::max_abs_diff(b, start)
}

#[test]
fn lars_and_lamb_match_timm_on_resnet18_for_20_steps() {
    let runs = [
        // MLPerf's ResNet-50 LARS: weight decay 5e-5, momentum 0.9, eta 0.001.
        ("lars", Run { kind: OptimizerKind::Lars, lr: 0.5, weight_decay: 5e-5, momentum: 0.9 }),
        // No momentum: no buffers at all (timm keeps none either).
        ("lars without momentum", Run { kind: OptimizerKind::Lars, lr: 0.5, weight_decay: 5e-5, momentum: 0.0 }),
        // timm's Lamb defaults (weight decay 0.01).
        ("lamb", Run { kind: OptimizerKind::Lamb, lr: 0.01, weight_decay: 0.01, momentum: 0.0 }),
    ];
    for (name, run) in runs {
        let kind = match run.kind {
            OptimizerKind::Lars => "lars",
            _ => "lamb",
        };
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let cfg = config(&run);
        common::run_python_script(
            "large_batch_reference.py",
            &[
                "resnet18",
                d.to_str().unwrap(),
                kind,
                &run.lr.to_string(),
                &run.weight_decay.to_string(),
                &STEPS.to_string(),
                &(WARMUP_EPOCHS * STEPS_PER_EPOCH).to_string(),
                "2",
                &END.to_string(),
                &run.momentum.to_string(),
            ],
        );
        let mut model = Model::new(ModelKind::ResNet18, 10, Device::Cpu);
        model.load_safetensors(&d.join("init.safetensors")).unwrap();
        let params = model.trainable();
        let init: HashMap<String, Tensor> = params.iter().map(|(n, t)| (n.clone(), t.copy())).collect();
        // train's groups: LARS and LAMB leave norms and biases out, as timm's groups do.
        let (decay, not_adapted) = decay_and_not_adapted(&cfg, &model);
        let no_decay = norm_and_bias_params(&params);
        assert_eq!(not_adapted, no_decay, "{name}: the tensors without trust ratio");
        let timm_no_decay: HashSet<String> =
            serde_json::from_str(&std::fs::read_to_string(d.join("no_decay.json")).unwrap()).unwrap();
        assert_eq!(no_decay, timm_no_decay, "{name}: the tensors without weight decay and trust ratio");
        let mut opt = Optimizer::new(
            &cfg,
            &params,
            &Placement {
                head_prefix: model.head_prefix(),
                head_lr_mult: 1.0,
                decay: &decay,
                not_adapted: &not_adapted,
                layer_decay: None,
            },
        );
        let sched = LrSchedule::new(&cfg, STEPS_PER_EPOCH);
        for k in 0..STEPS {
            let grads = read(&d.join(format!("grads-{k}.safetensors")));
            for (n, p) in &params {
                ringtrain::shim::set_grad(p, &grads[n]).unwrap();
            }
            opt.step(Lr::Host(sched.lr_at(k, &PlateauState::default())), None).unwrap();
        }
        let ours: HashMap<String, Tensor> = params
            .iter()
            .map(|(n, t)| (n.clone(), t.detach()))
            .chain(opt.state_tensors())
            .collect();

        for implementation in ["foreach", "forloop"] {
            let theirs = read(&d.join(format!("{implementation}.safetensors")));
            assert_eq!(theirs.len(), ours.len(), "{name}: the same parameters and state");
            let (mut worst, mut closest, mut spread) = ((0.0f64, String::new()), 0.0f64, 0.0f64);
            for (key, want) in &theirs {
                let got = ours.get(key).unwrap_or_else(|| panic!("{name}: no {key} here"));
                // State starts at zero; a parameter at its initial value.
                let start = init.get(key).map_or_else(|| want.zeros_like(), |t| t.shallow_clone());
                let (r, b) = (relative(&got.to_kind(Kind::Float), want, &start), bound(want, &start));
                assert!(r <= b, "{name} vs timm {implementation}: {key} differs by {r:.1e} of its update (bound {b:.1e})");
                if r >= worst.0 {
                    worst = (r, key.clone());
                }
                closest = closest.max(r / b);
                if init.contains_key(key) {
                    spread = spread.max(common::max_abs(want) / common::max_abs_diff(want, &start));
                }
            }
            eprintln!(
                "{name} vs timm {implementation}: at most {:.1e} of a tensor's update ({}); at most {closest:.2} of the bound (max|p| / max|update| up to {spread:.0})",
                worst.0, worst.1
            );
        }

        // The same check tells a wrong optimizer: timm's with every trust ratio 1 is off by far
        // more than the bound on every adapted tensor (and equal on the excluded ones).
        let wrong = read(&d.join("wrong.safetensors"));
        let reference = read(&d.join("foreach.safetensors"));
        let (mut least, mut least_of_bound) = (f64::INFINITY, f64::INFINITY);
        for (n, start) in &init {
            let (r, b) = (relative(&wrong[n], &reference[n], start), bound(&reference[n], start));
            match no_decay.contains(n) {
                true => assert!(r <= b, "{name}: {n} has no trust ratio, yet the wrong variant differs"),
                false => (least, least_of_bound) = (least.min(r), least_of_bound.min(r / b)),
            }
        }
        eprintln!(
            "{name} with trust ratio 1: every adapted tensor off by at least {least:.1e} of its update, {least_of_bound:.0} times the bound"
        );
        assert!(least_of_bound > 100.0, "{name}: the check does not tell a missing trust ratio");
    }
}
