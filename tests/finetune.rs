//! Fine-tuning what PyTorch trained: a torchvision resnet18 state_dict (saved from Python with
//! safetensors) loaded by name, a new head for this data's classes, frozen early layers (BN
//! statistics included), and a 10x learning rate on the head.
mod common;

use std::collections::HashMap;
use std::path::Path;

use tch::Tensor;

fn shapes(root: &Path) {
    common::Shapes { size: 36, seed: 6, first: 0 }.write(root, &["circle", "cross", "ring"], 10);
}

fn load(p: &Path) -> HashMap<String, Tensor> {
    Tensor::read_safetensors(p).unwrap().into_iter().collect()
}

#[test]
fn torchvision_weights_fine_tuned_with_new_head_frozen_layers_and_head_lr() {
    let d = tempfile::tempdir().unwrap();
    common::run_python(&["models", d.path().to_str().unwrap(), "resnet18"]); // 7-class torchvision resnet18
    let pretrained = d.path().join("resnet18.safetensors");
    let data = d.path().join("data");
    shapes(&data);
    let out = d.path().join("run");
    let o = common::ringtrain(&common::argv(
        "train --data {} --out {} --model resnet18 --img-size 64 --epochs 1 --batch-size 8 --device cpu \
         --pretrained {} --freeze conv1,bn1,layer1 --head-lr-mult 10 --lr 0.01 --log-every 1",
        &[&data, &out, &pretrained],
    ));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        stdout.contains(r#"re-initialised head ["fc.bias", "fc.weight"]"#),
        "{stdout}"
    );

    let (before, after) = (load(&pretrained), load(&out.join("last/model.safetensors")));
    for (name, t) in &after {
        let frozen = ["conv1.", "bn1.", "layer1."].iter().any(|p| name.starts_with(p));
        if frozen && !name.ends_with("num_batches_tracked") {
            assert!(t.equal(&before[name]), "{name} is frozen but changed");
        }
    }
    assert!(
        !after["layer2.0.conv1.weight"].equal(&before["layer2.0.conv1.weight"]),
        "layer2 should train"
    );
    assert!(
        !after["layer2.0.bn1.running_mean"].equal(&before["layer2.0.bn1.running_mean"]),
        "unfrozen BN keeps its statistics moving"
    );
    assert_eq!(after["fc.weight"].size(), vec![3, 512]);

    let tb: serde_json::Value =
        serde_json::from_str(&common::run_python(&["tensorboard_scalars", out.to_str().unwrap()])).unwrap();
    let (lr, head) = (
        tb["scalars"]["train/lr"].as_array().unwrap(),
        tb["scalars"]["train/lr_head"].as_array().unwrap(),
    );
    assert_eq!(lr.len(), head.len());
    for (a, b) in lr.iter().zip(head) {
        let (a, b) = (a[1].as_f64().unwrap(), b[1].as_f64().unwrap());
        assert!(
            (b - 10.0 * a).abs() <= 1e-6 * b.abs().max(1e-12),
            "head lr {b} is not 10 x {a}"
        );
    }

    // The wrong architecture is refused with a clear message.
    let o = common::ringtrain(&common::argv(
        "train --data {} --out {} --model resnet50 --batch-size 8 --device cpu --pretrained {}",
        &[&data, &d.path().join("r50"), &pretrained],
    ));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--pretrained") && stderr.contains("different architecture"),
        "{stderr}"
    );
}

/// The other direction: PyTorch loads ringtrain's weights into torchvision's resnet18 by name and
/// gets the logits `ringtrain predict --logits` printed for the same images (images at the eval
/// size, so both sides' Resize and CenterCrop are identities and only the network is compared).
#[test]
fn pytorch_loads_ringtrains_weights_and_gets_predicts_logits() {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("data");
    common::Shapes { size: 64, seed: 6, first: 0 }.write(&data, &["circle", "cross", "ring"], 6);
    let out = d.path().join("run");
    let o = common::ringtrain(&common::argv(
        "train --data {} --val {} --out {} --model resnet18 --img-size 64 --eval-resize 64 --epochs 1 --batch-size \
         6 --device cpu",
        &[&data, &data, &out],
    ));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let csv = d.path().join("pred.csv");
    let o = common::ringtrain(&common::argv(
        "predict --checkpoint {} --logits --device cpu --out {} {}",
        &[&out.join("last"), &csv, &data],
    ));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r: serde_json::Value = serde_json::from_str(&common::run_python(&[
        "predict_logits",
        out.join("last").to_str().unwrap(),
        csv.to_str().unwrap(),
    ]))
    .unwrap();
    assert_eq!(r["images"], 18, "{r}");
    // A model whose logits are all ~0 would pass trivially: they are not.
    let scale = r["logit_scale"].as_f64().unwrap();
    assert!(scale > 0.1, "{r}");
    // Relative to the largest of torchvision's logits: the two sides prepare the pixels with other
    // operations (a unit in the last place apart) and their convolutions can take different
    // kernels (and summation orders) on different CPUs. Measured on one AVX-512 machine at its
    // defaults, with oneDNN limited to SSE4.1, AVX2 and AVX-512 and with ATen limited to no
    // vectorisation, AVX2 and AVX-512: ≤ 2.9e-7.
    const SAME: f64 = 3e-6;
    let rel = r["max_abs_diff"].as_f64().unwrap() / scale;
    eprintln!("logits of predict vs torchvision: {rel:.1e} of the largest logit");
    assert!(
        rel <= SAME,
        "logits differ by {rel:.1e} of the largest logit (bound {SAME}): {r}"
    );
}
