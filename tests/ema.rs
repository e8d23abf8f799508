//! The weights' moving average (`--ema`) against torch's AveragedModel with
//! get_ema_multi_avg_fn and use_buffers=True (torchvision's reference ExponentialMovingAverage).
//! Its own test binary: nothing else runs in the process meanwhile.
mod common;

use std::collections::HashMap;

use tch::{Device, Tensor};

// Our average and torch's are the same element-wise arithmetic (lerp) on the same states, so they
// agree to a few units in the last place: which elements take the vectorised path (with fused
// multiply-adds) and which the scalar one can depend on the CPU and the number of threads. Each
// tensor's largest difference, relative to its largest value: measured 0 on one AVX-512 machine
// at its defaults and with ATen limited to no vectorisation, AVX2 and AVX-512 (and with oneDNN
// limited, which it does not use); bound at about 8 units in the last place. The lag of the
// average behind the weights, which a wrong decay or step count changes, is ≥ 0.21 on that scale.
const SAME: f64 = 1e-6;
const LAG: f64 = 2e-2;

#[test]
fn ema_matches_torch_averaged_model() {
    use ringtrain::model::Model;
    use ringtrain::train::step::ema::Ema;
    let dir = tempfile::tempdir().unwrap();
    tch::manual_seed(3);
    let mut m = Model::new("resnet18".parse().unwrap(), 7, Device::Cpu);
    let mut ema = Ema::new(&m, 7, 0.8).unwrap();
    let mut states: Vec<(String, Tensor)> = Vec::new();
    let snapshot = |m: &Model, k: usize, out: &mut Vec<(String, Tensor)>| {
        // state_dict aliases the live CPU tensors: copy, as they change in place below.
        out.extend(m.state_dict().into_iter().map(|(n, t)| (format!("{k}.{n}"), t.copy())));
    };
    snapshot(&m, 0, &mut states);
    let k = 2;
    for step in 1..=k {
        // A "training step": every float parameter and buffer moves (variances stay positive).
        tch::no_grad(|| {
            for (name, v) in m.vs.variables() {
                let mut v = v.shallow_clone();
                let delta = v.randn_like() * 0.1;
                let _ = if name.ends_with("running_var") {
                    v.g_add_(&delta.abs())
                } else {
                    v.g_add_(&delta)
                };
            }
        });
        m.bn_batches += 1;
        ema.update(m.bn_batches);
        snapshot(&m, step, &mut states);
    }
    let input = dir.path().join("states.safetensors");
    Tensor::write_safetensors(&states.iter().map(|(n, t)| (n.as_str(), t)).collect::<Vec<_>>(), &input).unwrap();
    let out = dir.path().join("torch_ema.safetensors");
    common::run_python(&[
        "ema",
        input.to_str().unwrap(),
        &k.to_string(),
        "0.8",
        out.to_str().unwrap(),
    ]);
    let theirs: HashMap<String, Tensor> = Tensor::read_safetensors(&out).unwrap().into_iter().collect();
    let ours = ema.model.state_dict();
    // The weights moved, so the average lags behind them (the test is not vacuous).
    let now = m.state_dict();
    for name in ["fc.weight", "bn1.running_var"] {
        let lag = common::rel_max_diff(&now[name], &ours[name]);
        eprintln!("{name}: the average lags {lag:.1e} behind the weights");
        assert!(
            lag >= LAG,
            "{name}: the average lags only {lag:.1e} behind the weights (must exceed {LAG})"
        );
    }
    let (mut compared, mut worst) = (0, (0.0f64, String::new()));
    for (name, want) in &theirs {
        // torch averages num_batches_tracked as an integer (truncating); we carry the count.
        if name.ends_with("num_batches_tracked") {
            continue;
        }
        let r = common::rel_max_diff(&ours[name], want);
        assert!(
            r <= SAME,
            "EMA {name} differs from torch's AveragedModel by {r:.1e} of its largest value (bound {SAME}; max abs {:.1e})",
            common::max_abs_diff(&ours[name], want)
        );
        if r >= worst.0 {
            worst = (r, name.clone());
        }
        compared += 1;
    }
    eprintln!(
        "EMA vs torch's AveragedModel: at most {:.1e} of the tensor's largest value ({})",
        worst.0, worst.1
    );
    assert_eq!(
        compared,
        ours.len() - 20,
        "every float tensor compared (resnet18 has 20 BatchNorms)"
    );
}
