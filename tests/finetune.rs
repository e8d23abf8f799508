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

/// Links the first `n` images of four plant-seedling classes into `dst` (never copied).
fn seedlings(dst: &Path, n: usize) {
    let classes = ["Charlock", "Common_Chickweed", "Loose_Silky-bent", "Sugar_beet"];
    common::link_first(&common::shared_data("plant-seedlings/train"), dst, &classes, n);
}

/// One family's fine-tuning as a user runs it: torchvision's 7-class weights (as torchvision
/// initialises them, saved from Python) with `--pretrained`, a new 4-class head, the stem
/// frozen, the head at 10× the rate, three epochs of batches of 8 from 48 plant-seedling images
/// at `img` px with the family's own flags. The training loss falls, every frozen tensor (BatchNorm statistics
/// included) is unchanged, the rest moved.
fn fine_tunes(model: &str, img: u32, freeze: &str, flags: &str) {
    let d = tempfile::tempdir().unwrap();
    common::run_python(&["init_state", d.path().to_str().unwrap(), model]);
    let pretrained = d.path().join(format!("{model}.init.safetensors"));
    let data = d.path().join("data");
    seedlings(&data, 12);
    let out = d.path().join("run");
    let o = common::ringtrain(&common::argv(
        &format!(
            "train --data {{}} --val {{}} --out {{}} --pretrained {{}} --model {model} --freeze {freeze} --img-size {img} \
             --epochs 3 --batch-size 8 --head-lr-mult 10 --warmup-epochs 0 --device cpu {flags}"
        ),
        &[&data, &data, &out, &pretrained],
    ));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{model}: {stdout}\n{}", String::from_utf8_lossy(&o.stderr));
    assert!(stdout.contains("re-initialised head [") && stdout.contains("missing []"), "{model}: {stdout}");

    let rows = common::metrics_rows(&out);
    let (first, last) = (rows[0][1], rows[rows.len() - 1][1]);
    eprintln!("{model}: training loss {first:.3} -> {last:.3}");
    assert!(last < first, "{model}: training loss did not fall: {first} -> {last}");

    let (before, after) = (load(&pretrained), load(&out.join("last/model.safetensors")));
    let prefixes: Vec<String> = freeze.split(',').map(|p| format!("{p}.")).collect();
    let frozen = |n: &str| prefixes.iter().any(|p| n.starts_with(p) || n == &p[..p.len() - 1]);
    let (mut kept, mut moved) = (0, 0);
    for (name, t) in &after {
        if name.ends_with("num_batches_tracked") || !before.contains_key(name) || t.size() != before[name].size() {
            continue;
        }
        if frozen(name) {
            assert!(t.equal(&before[name]), "{model}: {name} is frozen but changed");
            kept += 1;
        } else if !t.equal(&before[name]) {
            moved += 1;
        }
    }
    assert!(kept > 0 && moved > 0, "{model}: {kept} frozen tensors kept, {moved} others moved");
}

#[test]
fn resnext_fine_tunes() {
    fine_tunes("resnext50_32x4d", 32, "conv1,bn1,layer1", "--optimizer adamw --lr 0.001");
}

#[test]
fn convnext_fine_tunes_with_layer_decay_and_drop_path() {
    fine_tunes(
        "convnext_tiny",
        32,
        "features.0,features.1",
        "--optimizer adamw --lr 0.0003 --weight-decay 0.05 --layer-decay 0.8 --drop-path 0.1 --no-norm-bias-decay",
    );
}

#[test]
fn efficientnet_fine_tunes() {
        // torchvision starts the head at U(±1/√classes): with 4 classes its logits start large
    // (loss about 10), which SGD works down steadily; AdamW wanders.
    fine_tunes("efficientnet_b0", 64, "features.0,features.1", "--lr 0.01");
}

#[test]
fn mobilenet_v3_fine_tunes() {
    fine_tunes("mobilenet_v3_small", 64, "features.0", "--optimizer adamw --lr 0.001");
}

#[test]
fn vit_fine_tunes_with_layer_decay() {
    fine_tunes(
        "vit_b_16",
        32,
        "conv_proj,class_token,encoder.pos_embedding",
        "--optimizer adamw --lr 0.0005 --weight-decay 0.05 --layer-decay 0.75 --no-norm-bias-decay",
    );
}

#[test]
fn regnet_fine_tunes() {
    fine_tunes("regnet_y_400mf", 32, "stem,trunk_output.block1", "--optimizer adamw --lr 0.001");
}
