//! Every recipe in recipes/ parses into a valid configuration and trains one step on the CPU at
//! a tiny size, with only the overrides a CPU needs (device, precision, image size, batch, one
//! epoch without warm-up).
mod common;

use std::path::{Path, PathBuf};

fn recipes() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("recipes");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    v.sort();
    v
}

#[test]
fn every_recipe_parses_and_validates() {
    let names: Vec<String> = recipes()
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    for want in [
        "cifar10-alexnet-amp.toml",
        "cifar10-resnet18-fast.toml",
        "demo.toml",
        "seedlings-resnet18-finetune.toml",
        "seedlings-resnet50-ddp.toml",
    ] {
        assert!(names.iter().any(|n| n == want), "recipes/{want} missing");
    }
    let data = tempfile::tempdir().unwrap();
    for p in recipes() {
        let mut flags = toml::Table::new();
        flags.insert("data".into(), toml::Value::String(data.path().to_string_lossy().into()));
        // The recipe's own `out` (runs/...) may hold a run of whoever ran it in this checkout.
        let out = data.path().join(p.file_stem().unwrap());
        flags.insert("out".into(), toml::Value::String(out.to_string_lossy().into()));
        let mut cfg = ringtrain::config::resolve(Some(ringtrain::config::read_toml(&p).unwrap()), flags)
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        cfg.amp = ringtrain::train::step::amp::AmpMode::Off; // fp16 needs a CUDA device, which a CI machine lacks
        cfg.preflight().unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        let text = std::fs::read_to_string(&p).unwrap();
        assert!(text.starts_with('#'), "{}: starts with its comment block", p.display());
        for how in ["CPU", "ringtrain "] {
            assert!(text.contains(how), "{}: says how to run it ({how})", p.display());
        }
    }
}

/// One training step of `recipe` on 2 classes x 4 images, plus `extra` flags; returns the run dir
/// and what the run printed.
fn one_step(dir: &Path, recipe: &str, extra: &[&str]) -> (PathBuf, String) {
    let (train, val) = (dir.join("train"), dir.join("val"));
    if !train.exists() {
        common::make_folder(&train, &["circle", "ring"], 4);
        common::make_folder(&val, &["circle", "ring"], 2);
    }
    let out = dir.join(recipe.trim_end_matches(".toml"));
    let recipe_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("recipes").join(recipe);
    // A warm-up must be shorter than the one epoch.
    let mut args = common::train_val_args(
        &train,
        &val,
        &out,
        "--device cpu --amp off --epochs 1 --warmup-epochs 0 --batch-size 8 --workers 2",
    );
    args.splice(1..1, ["--config".to_string(), recipe_path.to_string_lossy().into_owned()]);
    args.extend(extra.iter().map(|s| s.to_string()));
    let o = common::ringtrain(&args);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{recipe}: {stderr}");
    let csv = std::fs::read_to_string(out.join("metrics.csv")).unwrap();
    assert_eq!(csv.lines().count(), 2, "{recipe}: one epoch: {csv}");
    let config = std::fs::read_to_string(out.join("config.toml")).unwrap();
    assert!(config.contains("batch_size = 8"), "{recipe}: {config}");
    (out, String::from_utf8_lossy(&o.stdout).into_owned())
}

#[test]
fn every_recipe_trains_one_step_on_the_cpu() {
    let d = tempfile::tempdir().unwrap();
    one_step(d.path(), "demo.toml", &[]);
    one_step(d.path(), "cifar10-resnet18-fast.toml", &[]);
    one_step(d.path(), "cifar10-alexnet-amp.toml", &["--img-size", "64", "--eval-resize", "64"]);
    let (out, stdout) = one_step(
        d.path(),
        "seedlings-resnet50-ddp.toml",
        &["--img-size", "32", "--eval-resize", "36", "--nproc-per-node", "2"],
    );
    // The recipe's per-epoch report, and its DDP + SyncBN set-up (2 Gloo ranks on the CPU).
    assert!(out.join("reports/epoch-0001.txt").is_file());
    assert!(
        stdout.contains("2 ranks") && stdout.contains("SyncBatchNorm"),
        "{stdout}"
    );
    assert!(stdout.contains("classification report, epoch 1"), "{stdout}");
    common::run_python(&["models", d.path().to_str().unwrap(), "resnet18"]);
    let pretrained = d.path().join("resnet18.safetensors");
    one_step(
        d.path(),
        "seedlings-resnet18-finetune.toml",
        &["--img-size", "32", "--eval-resize", "36", "--pretrained", pretrained.to_str().unwrap()],
    );
}
