//! ringtrain's models and folder scanning against torchvision itself: same state_dict names,
//! same logits from the same weights, same class index and sample order.
mod common;

use std::collections::HashMap;

use ringtrain::data::folder::ImageFolder;
use ringtrain::model::Model;
use tch::{Device, Tensor};

const MODELS: &[&str] = &[
    "resnet18",
    "resnet34",
    "resnet50",
    "resnet101",
    "alexnet",
    "resnet18-cifar",
];

#[test]
fn logits_equal_torchvision_with_its_weights_loaded_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let mut args = vec!["models", dir.path().to_str().unwrap()];
    args.extend(MODELS);
    common::run_python(&args);
    for name in MODELS {
        let mut model = Model::new(name, 7, Device::Cpu).unwrap();
        // load_safetensors refuses missing or unexpected names: this checks the naming too.
        model
            .load_safetensors(&dir.path().join(format!("{name}.safetensors")))
            .unwrap();
        let io: HashMap<String, Tensor> = Tensor::read_safetensors(dir.path().join(format!("{name}.io.safetensors")))
            .unwrap()
            .into_iter()
            .collect();
        let got = tch::no_grad(|| model.forward(&io["x"], false));
        let want = &io["eval_logits"];
        let diff = (&got - want).abs().max().double_value(&[]);
        assert!(diff < 1e-3, "{name}: eval logits differ from torchvision by {diff}");
        if let Some(want) = io.get("train_logits") {
            let got = tch::no_grad(|| model.forward(&io["x"], true));
            let diff = (&got - want).abs().max().double_value(&[]);
            assert!(
                diff < 1e-3,
                "{name}: train-mode logits differ from torchvision by {diff}"
            );
        }
    }
}

#[test]
fn class_index_and_samples_match_torchvision_imagefolder() {
    let root = common::shared_data("plant-seedlings/train");
    let reference: serde_json::Value =
        serde_json::from_str(&common::run_python(&["imagefolder", root.to_str().unwrap()])).unwrap();
    let ours = ImageFolder::scan(&root, "--data").unwrap();
    let classes: Vec<String> = serde_json::from_value(reference["classes"].clone()).unwrap();
    assert_eq!(ours.classes, classes);
    let samples: Vec<(String, usize)> = serde_json::from_value(reference["samples"].clone()).unwrap();
    assert_eq!(ours.samples.len(), samples.len());
    for ((p, c), (rp, rc)) in ours.samples.iter().zip(&samples) {
        assert_eq!((p.to_str().unwrap(), *c), (rp.as_str(), *rc));
    }
}

#[test]
fn pixel_stats_equal_numpy_over_the_same_files() {
    let root = common::shared_data("plant-seedlings/test");
    // A few real images of every class, linked (never copied) into a temporary tree.
    let d = tempfile::tempdir().unwrap();
    for class in std::fs::read_dir(&root).unwrap() {
        let class = class.unwrap().path();
        let dst = d.path().join(class.file_name().unwrap());
        std::fs::create_dir_all(&dst).unwrap();
        let mut files: Vec<_> = std::fs::read_dir(&class).unwrap().map(|e| e.unwrap().path()).collect();
        files.sort();
        for f in files.into_iter().take(5) {
            std::os::unix::fs::symlink(&f, dst.join(f.file_name().unwrap())).unwrap();
        }
    }
    let reference: serde_json::Value =
        serde_json::from_str(&common::run_python(&["pixel_stats", d.path().to_str().unwrap()])).unwrap();
    let ours = ringtrain::data::stats::pixel_stats(&ImageFolder::scan(d.path(), "--data").unwrap()).unwrap();
    assert_eq!(ours.pixels, reference["pixels"].as_u64().unwrap());
    for c in 0..3 {
        assert!(
            (ours.mean[c] - reference["mean"][c].as_f64().unwrap()).abs() < 1e-9,
            "mean[{c}]"
        );
        assert!(
            (ours.std[c] - reference["std"][c].as_f64().unwrap()).abs() < 1e-9,
            "std[{c}]"
        );
    }
}
