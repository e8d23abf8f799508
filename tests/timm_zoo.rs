//! timm's families from the hub, as their users fine-tune them: one published variant of each
//! (ViT with a class token, ViT with averaged tokens and layer scale, DeiT, ConvNeXt,
//! EfficientNet and its TensorFlow port, MobileNetV3 large and small, RegNetX and RegNetY,
//! ResNet-D), made by timm itself with random weights and saved by timm's `save_for_hf` into a
//! stand-in hub cache. ringtrain's logits from those weights are timm's; a ViT at another
//! input size resamples its position embeddings as timm does; a run fine-tuned from them
//! writes a state_dict timm loads with `strict=True` and that gives ringtrain's logits there.
mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use ringtrain::model::weights::{hf_hub::Repo, WeightsSource};
use ringtrain::model::{Model, ModelKind, ModelOptions, Names};
use tch::{Device, Tensor};

/// (timm's name, the input size of the stand-in weights). 65 px: TensorFlow's "same" padding
/// pads an odd size unevenly.
const CASES: &[(&str, u32)] = &[
    ("vit_small_patch16_224", 32),
    ("vit_medium_patch16_gap_256", 32),
    ("deit_tiny_patch16_224", 48),
    ("convnext_tiny", 64),
    ("efficientnet_b0", 64),
    ("tf_efficientnet_b0", 65),
    ("mobilenetv3_large_100", 64),
    ("mobilenetv3_small_100", 64),
    ("regnetx_002", 64),
    ("regnety_040", 64),
    ("resnet50d", 64),
];

/// The bound of the torchvision parity tests, relative to the largest logit.
const SAME: f64 = 1e-5;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// timm/NAME.test for every case in the hub cache of an HF_HOME, made once for the tests here.
fn stand_in_hub() -> &'static Path {
    static HUB: OnceLock<tempfile::TempDir> = OnceLock::new();
    HUB.get_or_init(|| {
        let d = tempfile::tempdir().unwrap();
        let cases: Vec<String> = CASES.iter().map(|(n, size)| format!("{n}:{size}")).collect();
        let mut args = vec!["hub", s(d.path())];
        args.extend(cases.iter().map(String::as_str));
        common::run_python_script("timm_zoo.py", &args);
        d
    })
    .path()
}

fn io(hf_home: &Path, name: &str) -> HashMap<String, Tensor> {
    Tensor::read_safetensors(hf_home.join(format!("io-{name}.safetensors"))).unwrap().into_iter().collect()
}

/// timm's eval logits of each (name, state_dict file) (loaded strictly) on the case's input.
fn timm_logits(files: &[(&str, PathBuf)], hf_home: &Path, out: &Path) -> Vec<Tensor> {
    let cases: Vec<String> = files
        .iter()
        .map(|(name, file)| {
            let io = hf_home.join(format!("io-{name}.safetensors"));
            format!("{name}:{}:{}:{}", s(file), s(&io), s(&out.join(format!("{name}.safetensors"))))
        })
        .collect();
    let mut args = vec!["check"];
    args.extend(cases.iter().map(String::as_str));
    common::run_python_script("timm_zoo.py", &args);
    let logits = |name: &str| Tensor::read_safetensors(out.join(format!("{name}.safetensors"))).unwrap().into_iter().find(|(k, _)| k == "logits").unwrap().1;
    files.iter().map(|(name, _)| logits(name)).collect()
}

fn assert_same(what: &str, got: &Tensor, want: &Tensor) {
    let rel = common::rel_max_diff(got, want);
    eprintln!("{what}: logits differ from timm's by {rel:.1e} of the largest ({:.2e})", common::max_abs(want));
    assert!(common::max_abs(want) > 0.0, "{what}: all logits 0");
    assert!(rel <= SAME, "{what}: logits differ from timm's by {rel:.1e} of the largest (bound {SAME})");
}

/// Each family's weights, read from the hub cache as `--pretrained hf-hub:timm/NAME` reads
/// them, give timm's eval logits; written back under timm's names, timm loads them strictly
/// and gives the same logits.
#[test]
fn timm_weights_give_timms_logits_and_go_back_to_timm() {
    let d = tempfile::tempdir().unwrap();
    let hf_home = stand_in_hub();
    std::env::set_var("HF_HOME", hf_home);
    std::env::set_var("HF_HUB_OFFLINE", "1");
    let mut written = Vec::new();
    for (name, size) in CASES {
        let source = WeightsSource::HfHub(Repo::parse(&format!("timm/{name}.test")).unwrap());
        let kind = source.model().unwrap_or_else(|| panic!("{name}: no architecture"));
        assert_eq!(kind.name(), *name);
        let loaded = source.read(None).unwrap();
        assert_eq!(loaded.eval.as_ref().map(|t| t.img_size), Some(*size), "{name}: the config's input size");
        let io = io(hf_home, name);
        let opts = ModelOptions { img_size: *size, ..ModelOptions::defaults(kind) };
        let mut model = Model::build(kind, 1000, Device::Cpu, opts);
        let r = model.load_pretrained(&loaded.weights, name, false).unwrap();
        assert!(r.missing.is_empty() && r.unexpected.is_empty() && r.reinitialized_head.is_empty(), "{name}: {r:?}");
        if kind.is_timm() && !name.starts_with("resnet") {
            assert_eq!(r.names, Some(Names::Timm), "{name}");
        }
        let got = tch::no_grad(|| model.forward(&io["x"], false));
        assert_same(name, &got, &io["logits"]);

        // timm's names written (loaded by timm below), and read back by ringtrain.
        model.names = Names::Timm;
        let file = d.path().join(format!("{name}.safetensors"));
        model.save_safetensors(&file).unwrap();
        written.push((*name, file.clone()));
        let mut again = Model::build(kind, 1000, Device::Cpu, opts);
        again.load_safetensors(&file).unwrap();
        assert_same(&format!("{name} read back"), &tch::no_grad(|| again.forward(&io["x"], false)), &io["logits"]);

        // A ViT at 1.5x the input: position embeddings resampled as timm resamples them.
        if let Some(x_big) = io.get("x_big") {
            let big = ModelOptions { img_size: size * 3 / 2, ..opts };
            let mut model = Model::build(kind, 1000, Device::Cpu, big);
            let r = model.load_pretrained(&loaded.weights, name, false).unwrap();
            assert_eq!(r.interpolated, vec!["encoder.pos_embedding".to_string()], "{name}");
            assert_same(&format!("{name} at {} px", size * 3 / 2), &tch::no_grad(|| model.forward(x_big, false)), &io["logits_big"]);
        }
    }
    let out = d.path().join("timm");
    std::fs::create_dir_all(&out).unwrap();
    for ((name, _), back) in written.iter().zip(timm_logits(&written, hf_home, &out)) {
        assert_same(&format!("{name} written back, in timm"), &back, &io(hf_home, name)["logits"]);
    }
}

/// Fine-tuning from each stand-in hub cache (offline): the architecture and input size come
/// from the weights' config, the head is replaced for the data's 3 classes, and the run's
/// `last/model.safetensors` loads into `timm.create_model(NAME, num_classes=3)` strictly and gives
/// ringtrain's logits there.
#[test]
fn fine_tuning_from_timm_weights_writes_a_model_timm_loads() {
    let d = tempfile::tempdir().unwrap();
    let hf_home = stand_in_hub();
    let data = d.path().join("data");
    common::Shapes { size: 40, seed: 3, first: 0 }.write(&data, &["circle", "cross", "ring"], 3);
    let (mut ours, mut written) = (Vec::new(), Vec::new());
    for (name, size) in CASES {
        let run = d.path().join(format!("run-{name}"));
        let o = Command::new(env!("CARGO_BIN_EXE_ringtrain"))
            .args(common::argv(
                &format!("train --data {{}} --val {{}} --out {{}} --pretrained hf-hub:timm/{name}.test --epochs 1 --batch-size 5 --lr 0.001 --device cpu --workers 2"),
                &[&data, &data, &run],
            ))
            .env("HF_HOME", hf_home)
            .env("HF_HUB_OFFLINE", "1")
            .output()
            .unwrap();
        let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        assert!(o.status.success(), "{name}: {out}\n{err}");
        // timm's ResNets name their tensors as torchvision's do.
        let names = if name.starts_with("resnet") { "torchvision names" } else { "timm names" };
        assert!(out.contains(names), "{name}: the note on the names read: {out}");
        let cfg: toml::Table = std::fs::read_to_string(run.join("config.toml")).unwrap().parse().unwrap();
        assert_eq!((cfg["model"].as_str(), cfg["img_size"].as_integer()), (Some(*name), Some(*size as i64)), "{cfg}");

        let kind: ModelKind = name.parse().unwrap();
        let mut model = Model::build(kind, 3, Device::Cpu, ModelOptions { img_size: *size, ..ModelOptions::defaults(kind) });
        let file = run.join("last/model.safetensors");
        model.load_safetensors(&file).unwrap();
        let x = &io(hf_home, name)["x"];
        ours.push(tch::no_grad(|| model.forward(x, false)));
        written.push((*name, file));
    }
    let out = d.path().join("timm");
    std::fs::create_dir_all(&out).unwrap();
    for (((name, _), ours), theirs) in written.iter().zip(&ours).zip(timm_logits(&written, hf_home, &out)) {
        assert_same(&format!("{name} fine-tuned, in timm"), ours, &theirs);
    }
}

/// `ringtrain models` marks the architectures timm's hub weights load into, with timm's
/// parameter count (at 1000 classes) and, for those only timm has, the input size of timm's
/// default weights.
#[test]
fn models_lists_timms_architectures_with_timms_parameter_counts() {
    let (out, rows) = common::models_table();
    // The hf-hub column: yes or -.
    let timm: Vec<&str> = rows.iter().filter(|(_, c)| c[6] == "yes").map(|(n, _)| n.as_str()).collect();
    for (name, _) in CASES {
        assert!(timm.contains(name), "{name} not marked for hf-hub in:\n{out}");
    }
    let mut args = vec!["params"];
    args.extend(timm.iter().copied());
    let counts: serde_json::Value = serde_json::from_str(&common::run_python_script("timm_zoo.py", &args)).unwrap();
    for name in &timm {
        let listed: i64 = rows[*name][1].replace(',', "").parse().unwrap();
        assert_eq!(listed, counts[name]["parameters"].as_i64().unwrap(), "{name}: parameters listed by ringtrain models");
        let kind: ModelKind = name.parse().unwrap();
        if kind.is_timm() {
            let size: i64 = rows[*name][2].parse().unwrap();
            assert_eq!(size, counts[name]["input"].as_i64().unwrap(), "{name}: input size listed by ringtrain models");
        }
    }
}

/// The guide's fine-tuning of timm's ConvNeXt from the hub on plant seedlings, as one command:
/// a stand-in `timm/convnext_tiny.fb_in22k_ft_in1k` with that repository's evaluation transform
/// (224 px, crop_pct 0.875, bicubic, ImageNet's mean and std), `--freeze` by timm's names. The
/// run takes the transform, says what it loaded and froze, leaves the frozen stages as they
/// came and writes timm's names.
#[test]
fn a_users_convnext_from_the_hub_fine_tunes_on_plant_seedlings() {
    let d = tempfile::tempdir().unwrap();
    let hf_home = d.path().join("hf");
    common::run_python_script("timm_zoo.py", &["hub", s(&hf_home), "convnext_tiny.fb_in22k_ft_in1k:224"]);
    let classes = ["Black-grass", "Charlock", "Cleavers", "Maize"];
    let (train, val) = (d.path().join("train"), d.path().join("test"));
    common::link_first(&common::shared_data("plant-seedlings/train"), &train, &classes, 6);
    common::link_first(&common::shared_data("plant-seedlings/test"), &val, &classes, 3);
    let run = d.path().join("run");
    let o = Command::new(env!("CARGO_BIN_EXE_ringtrain"))
        .args(common::argv(
            "train --data {} --val {} --out {} --pretrained hf-hub:timm/convnext_tiny.fb_in22k_ft_in1k \
             --freeze stem,stages.0,stages.1 --optimizer adamw --lr 0.0005 --epochs 1 --batch-size 8 --device cpu",
            &[&train, &val, &run],
        ))
        .env("HF_HOME", &hf_home)
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .unwrap();
    let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    eprintln!("{out}");
    assert!(o.status.success(), "{out}\n{err}");
    assert!(out.contains("(timm names); re-initialised head [\"head.fc.bias\", \"head.fc.weight\"]; missing []; unexpected []"), "{out}");
    assert!(out.contains("resizing bicubic"), "{out}");
    assert!(out.contains("frozen: ") && out.contains("under stem, stages.0, stages.1"), "{out}");
    let cfg: toml::Table = std::fs::read_to_string(run.join("config.toml")).unwrap().parse().unwrap();
    assert_eq!((cfg["model"].as_str(), cfg["img_size"].as_integer(), cfg["eval_resize"].as_integer()), (Some("convnext_tiny"), Some(224), Some(256)), "{cfg}");

    let hub: HashMap<String, Tensor> = Tensor::read_safetensors(
        hf_home.join("hub/models--timm--convnext_tiny.fb_in22k_ft_in1k/snapshots/0123456789abcdef0123456789abcdef01234567/model.safetensors"),
    )
    .unwrap()
    .into_iter()
    .collect();
    let tuned = common::weights(&run);
    assert_eq!(tuned.len(), hub.len(), "timm's names, one for one");
    for (k, t) in &tuned {
        let frozen = k.starts_with("stem.") || k.starts_with("stages.0.") || k.starts_with("stages.1.");
        if frozen {
            assert!(t.equal(&hub[k]), "{k} is frozen but changed");
        }
    }
    assert!(!tuned["stages.3.blocks.2.mlp.fc2.weight"].equal(&hub["stages.3.blocks.2.mlp.fc2.weight"]), "the last stage trained");

    // Resumed for a second epoch (from its checkpoint, not the hub's weights): still timm's names.
    let o = Command::new(env!("CARGO_BIN_EXE_ringtrain"))
        .args(common::argv(
            "train --data {} --val {} --out {} --pretrained hf-hub:timm/convnext_tiny.fb_in22k_ft_in1k \
             --freeze stem,stages.0,stages.1 --optimizer adamw --lr 0.0005 --epochs 2 --batch-size 8 --device cpu --resume auto",
            &[&train, &val, &run],
        ))
        .env("HF_HOME", &hf_home)
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}\n{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    let resumed = common::weights(&run);
    let names = |w: &HashMap<String, Tensor>| w.keys().cloned().collect::<std::collections::BTreeSet<_>>();
    assert_eq!(names(&resumed), names(&tuned), "a resumed run's names");
    assert!(!resumed["head.fc.weight"].equal(&tuned["head.fc.weight"]), "the second epoch trained");
}
