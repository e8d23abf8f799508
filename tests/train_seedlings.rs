//! Two epochs of CPU training on a subset of the real plant-seedlings data: the loss falls,
//! accuracy beats chance by a wide margin, the run directory is complete, and PyTorch loads the
//! best checkpoint strictly into torchvision's resnet18 and measures about the same accuracy.
mod common;

const CLASSES: &[&str] = &["Charlock", "Common_Chickweed", "Loose_Silky-bent", "Sugar_beet"];

#[test]
fn two_epochs_on_plant_seedlings_learn_and_pytorch_agrees() {
    let d = tempfile::tempdir().unwrap();
    let (train, val, out) = (d.path().join("train"), d.path().join("val"), d.path().join("run"));
    common::link_first(&common::shared_data("plant-seedlings/train"), &train, CLASSES, 150);
    common::link_first(&common::shared_data("plant-seedlings/test"), &val, CLASSES, 30);
    let o = common::ringtrain(&common::argv(
        "train --data {} --val {} --out {} --model resnet18 --img-size 64 --epochs 2 --batch-size 32 --optimizer \
         adamw --lr 0.002 --weight-decay 0.01 --crop-scale 0.35,1 --device cpu",
        &[&train, &val, &out],
    ));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    for f in [
        "config.toml",
        "metrics.csv",
        "report.txt",
        "best/model.safetensors",
        "best/state.json",
        "last/model.safetensors",
        "last/state.json",
    ] {
        assert!(out.join(f).is_file(), "missing {f}");
    }
    let rows = common::metrics_rows(&out);
    assert_eq!(rows.len(), 2);
    let (loss1, loss2) = (rows[0][1], rows[1][1]);
    assert!(loss2 < loss1, "training loss did not fall: {loss1} -> {loss2}");
    let best = rows.iter().map(|r| r[4]).fold(0.0, f64::max);
    assert!(best >= 0.6, "best val top-1 {best} is not far above chance (0.25)");

    let state: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("best/state.json")).unwrap()).unwrap();
    assert_eq!(state["classes"], serde_json::json!(CLASSES));
    assert_eq!(state["model"], "resnet18");
    let ours = state["val_top1"].as_f64().unwrap();
    assert!((ours - best).abs() < 1e-6, "state.json says {ours}, metrics.csv {best}");

    let torch_top1: f64 = common::run_python(&[
        "evaluate",
        "resnet18",
        "4",
        out.join("best/model.safetensors").to_str().unwrap(),
        val.to_str().unwrap(),
        "64",
        "73",
    ])
    .trim()
    .parse()
    .unwrap();
    // Same weights, same transforms up to the resampling implementation: within 5 points.
    assert!(
        (torch_top1 - ours).abs() <= 0.05,
        "PyTorch measures {torch_top1}, ringtrain {ours}"
    );
}
