//! What a run shows, checked against independent readers: sklearn for the classification
//! report, TensorBoard's own event reader for the event file; and `eval` against `predict`.
mod common;

use std::path::Path;

use ringtrain::report::classification::ClassificationReport;

#[test]
fn classification_report_equals_sklearn_including_a_class_never_predicted() {
    let classes: Vec<String> = ["ant", "bee", "cat", "dog", "eel"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    // Deterministic pseudo-random labels; class 4 ("eel") appears but is never predicted.
    let mut x = 12345u64;
    let mut next = || {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (x >> 33) as i64
    };
    let targets: Vec<i64> = (0..300).map(|_| next() % 5).collect();
    let preds: Vec<i64> = targets
        .iter()
        .map(|&t| if next() % 3 == 0 { next() % 4 } else { t.min(3) })
        .collect();
    let ours = ClassificationReport::new(&classes, &targets, &preds).to_sklearn_json();

    let d = tempfile::tempdir().unwrap();
    let input = d.path().join("in.json");
    std::fs::write(
        &input,
        serde_json::json!({"targets": targets, "preds": preds, "classes": classes}).to_string(),
    )
    .unwrap();
    let theirs: serde_json::Value =
        serde_json::from_str(&common::run_python(&["sklearn_report", input.to_str().unwrap()])).unwrap();

    let keys: Vec<&str> = classes
        .iter()
        .map(String::as_str)
        .chain(["macro avg", "weighted avg"])
        .collect();
    for k in keys {
        for m in ["precision", "recall", "f1-score", "support"] {
            let (a, b) = (ours[k][m].as_f64().unwrap(), theirs[k][m].as_f64().unwrap());
            assert!((a - b).abs() < 5e-5, "{k}/{m}: ringtrain {a}, sklearn {b}");
        }
    }
    assert!((ours["accuracy"].as_f64().unwrap() - theirs["accuracy"].as_f64().unwrap()).abs() < 5e-5);
    assert_eq!(
        ours["eel"]["precision"].as_f64(),
        Some(0.0),
        "the never-predicted class must be there"
    );
}

fn shapes(root: &Path, per_class: usize, first: u64) {
    common::Shapes { size: 36, seed: 9, first }.write(root, &["circle", "cross", "ring"], per_class);
}

/// A run of 1,000 classes (CIFAR JPEGs labelled by a CSV file, two per class): report.txt and
/// confusion.csv are sklearn's for the run's own predictions, the terminal shows the 40 classes
/// of lowest F1, confusion.png is the compact map (at most 1,200 px of cells beside the most
/// confused pairs), and TensorBoard's reader reads the run.
#[test]
fn a_thousand_classes_report_and_plot() {
    let d = tempfile::tempdir().unwrap();
    let images = d.path().join("images");
    std::fs::create_dir(&images).unwrap();
    let cifar = common::shared_data("cifar10/train/airplane");
    let mut names: Vec<_> = std::fs::read_dir(&cifar).unwrap().map(|e| e.unwrap().file_name()).collect();
    names.sort();
    let mut csv = String::from("image,label\n");
    for (i, n) in names.iter().take(2000).enumerate() {
        std::os::unix::fs::symlink(cifar.join(n), images.join(n)).unwrap();
        csv += &format!("{},class {:04}\n", n.to_str().unwrap(), i / 2);
    }
    let labels = d.path().join("labels.csv");
    std::fs::write(&labels, csv).unwrap();
    let out = d.path().join("run");
    let o = common::ringtrain(&common::argv(
        "train --data {} --labels {} --out {} --model resnet10-tiny --img-size 16 --epochs 1 --batch-size 64 --val-split 0.5 --device cpu",
        &[&images, &labels, &out],
    ));
    let said = String::from_utf8_lossy(&o.stdout) + String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{said}");
    assert!(said.contains("1000 classes, 1000 train / 1000 val images"), "{said}");
    assert!(said.contains("the 40 of 1000 classes with the lowest F1 (the whole report: report.txt in the run directory)"), "{said}");
    let (report, confusion) = (
        std::fs::read_to_string(out.join("report.txt")).unwrap(),
        std::fs::read_to_string(out.join("confusion.csv")).unwrap(),
    );
    assert_eq!(report.lines().filter(|l| l.trim_start().starts_with("class ")).count(), 1000);
    assert_eq!(confusion.lines().count(), 1001);
    // The report is sklearn's classification_report of confusion.csv's own counts.
    let check = common::run_python_code(&format!(
        r#"
import csv, numpy as np
from sklearn.metrics import classification_report
rows = list(csv.reader(open({confusion:?})))
names, m = rows[0][1:], np.array([[int(c) for c in r[1:]] for r in rows[1:]])
t, p = [], []
for i in range(len(names)):
    for j in range(len(names)):
        t += [i] * m[i, j]; p += [j] * m[i, j]
want = classification_report(t, p, labels=range(len(names)), target_names=names, digits=4, zero_division=0)
got = open({report:?}).read()
num = lambda t: f"{{float(t):.4f}}" if t.replace(".", "").isdigit() else t
norm = lambda s: [[num(t) for t in l.split()] for l in s.splitlines() if l.strip()]
diff = [(a, b) for a, b in zip(norm(want), norm(got)) if a != b]
print("same" if not diff and len(norm(want)) == len(norm(got)) else diff[:3])
"#,
        confusion = out.join("confusion.csv").to_str().unwrap(),
        report = out.join("report.txt").to_str().unwrap()
    ));
    assert_eq!(check.trim(), "same");
    let png = image::open(out.join("confusion.png")).unwrap();
    assert!(png.width() <= 1900 && png.height() <= 1400, "{}×{}", png.width(), png.height());
    let tb: serde_json::Value =
        serde_json::from_str(&common::run_python(&["tensorboard_scalars", out.to_str().unwrap()])).unwrap();
    assert_eq!(tb["scalars"]["epoch/val_top1"].as_array().unwrap().len(), 1);
}

#[test]
fn tensorboard_reader_finds_the_runs_scalars_with_right_steps_and_values() {
    let d = tempfile::tempdir().unwrap();
    let (train, val, out) = (d.path().join("train"), d.path().join("val"), d.path().join("run"));
    shapes(&train, 10, 0);
    shapes(&val, 4, 1000);
    let args = common::train_val_args(
        &train,
        &val,
        &out,
        "--model resnet10-tiny --img-size 32 --epochs 3 --batch-size 8 --log-every 1 --device cpu",
    );
    let o = common::ringtrain(&args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let tb: serde_json::Value =
        serde_json::from_str(&common::run_python(&["tensorboard_scalars", out.to_str().unwrap()])).unwrap();
    let scalars = &tb["scalars"];
    // 30 images, batch 8: 4 steps per epoch (the last has 6), 3 epochs, logged every step.
    let steps: Vec<i64> = scalars["train/loss"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e[0].as_i64().unwrap())
        .collect();
    assert_eq!(steps, (0..12).collect::<Vec<_>>());
    assert_eq!(scalars["train/lr"].as_array().unwrap().len(), 12);
    let rows = common::metrics_rows(&out);
    for (tag, col) in [
        ("epoch/train_loss", 1),
        ("epoch/val_loss", 3),
        ("epoch/val_top1", 4),
        ("epoch/val_top5", 5),
    ] {
        let events = scalars[tag]
            .as_array()
            .unwrap_or_else(|| panic!("no {tag} in {scalars}"));
        assert_eq!(events.len(), 3, "{tag}");
        for (e, row) in events.iter().zip(&rows) {
            assert_eq!(e[0].as_f64().unwrap(), row[0], "{tag} step is the epoch");
            assert!(
                (e[1].as_f64().unwrap() - row[col]).abs() < 1e-5,
                "{tag}: {e} vs {}",
                row[col]
            );
        }
    }
    let config = tb["tensors"]["config"][0].as_str().unwrap();
    assert!(config.contains("model = \"resnet10-tiny\""), "{config}");
    for f in [
        "curves.png",
        "confusion.png",
        "confusion.csv",
        "metrics.json",
        "report.txt",
    ] {
        assert!(out.join(f).is_file(), "missing {f}");
    }
}

#[test]
fn predict_agrees_with_eval_on_plant_seedlings_and_skips_unreadable_files() {
    let d = tempfile::tempdir().unwrap();
    let src = common::shared_data("plant-seedlings/train");
    let test = common::shared_data("plant-seedlings/test");
    // A quick 12-class model: one epoch on 20 images per class.
    let train = d.path().join("train");
    for class in std::fs::read_dir(&src).unwrap() {
        let class = class.unwrap().path();
        let dst = train.join(class.file_name().unwrap());
        std::fs::create_dir_all(&dst).unwrap();
        let mut files: Vec<_> = std::fs::read_dir(&class).unwrap().map(|e| e.unwrap().path()).collect();
        files.sort();
        for f in files.into_iter().take(20) {
            std::os::unix::fs::symlink(&f, dst.join(f.file_name().unwrap())).unwrap();
        }
    }
    let run = d.path().join("run");
    let o = common::ringtrain(&common::argv(
        "train --data {} --val-split 0.2 --out {} --model resnet18 --img-size 64 --epochs 1 --batch-size 16 \
         --device cpu --quiet",
        &[&train, &run],
    ));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        o.stdout.is_empty(),
        "--quiet printed: {}",
        String::from_utf8_lossy(&o.stdout)
    );
    let ckpt = run.join("best");

    let eval_out = d.path().join("eval");
    let o = common::ringtrain(&common::argv("eval --checkpoint {} --data {} --out {}", &[&ckpt, &test, &eval_out]));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let metrics: serde_json::Value =
        serde_json::from_slice(&std::fs::read(eval_out.join("metrics.json")).unwrap()).unwrap();
    assert_eq!(metrics["images"], 723);
    let eval_top1 = metrics["top1"].as_f64().unwrap();
    let confusion: Vec<Vec<u64>> = serde_json::from_value(metrics["confusion_matrix"].clone()).unwrap();
    assert_eq!(confusion.iter().flatten().sum::<u64>(), 723);
    assert_eq!(confusion[0].iter().sum::<u64>(), 40, "Black-grass has 40 test images");

    // The same evaluation sharded over 2 ranks under torchrun: the same numbers, each image once.
    let sharded = d.path().join("eval_sharded");
    let o = common::torchrun(2)
        .args(common::argv("eval --checkpoint {} --data {} --out {} --device cpu", &[&ckpt, &test, &sharded]))
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "torchrun eval: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let m2: serde_json::Value = serde_json::from_slice(&std::fs::read(sharded.join("metrics.json")).unwrap()).unwrap();
    assert_eq!(m2["images"], 723);
    assert_eq!(m2["confusion_matrix"], metrics["confusion_matrix"]);
    assert!((m2["top1"].as_f64().unwrap() - eval_top1).abs() < 1e-12);
    // The loss, from the same weights over other batches (whose kernels and summation order can
    // differ by CPU), relative to the loss. Measured on one AVX-512 machine at its defaults, with
    // oneDNN limited to SSE4.1, AVX2 and AVX-512 and with ATen limited to no vectorisation, AVX2
    // and AVX-512: ≤ 3.0e-8.
    const SAME: f64 = 1e-6;
    let (loss, loss2) = (metrics["loss"].as_f64().unwrap(), m2["loss"].as_f64().unwrap());
    let r_loss = (loss2 - loss).abs() / loss.abs();
    eprintln!("eval loss sharded over 2 ranks vs one process: {r_loss:.1e} of the loss");
    assert!(
        r_loss <= SAME,
        "eval loss sharded over 2 ranks {loss2}, one process {loss}: {r_loss:.1e} of the loss (bound {SAME})"
    );

    let csv_path = d.path().join("pred.csv");
    let o = common::ringtrain(&common::argv("predict --checkpoint {} --out {} {}", &[&ckpt, &csv_path, &test]));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let stdout = String::from_utf8_lossy(&o.stdout);
    let mut rdr = csv::Reader::from_path(&csv_path).unwrap();
    let headers = rdr.headers().unwrap().clone();
    assert_eq!(&headers[0], "path");
    assert_eq!(&headers[headers.len() - 1], "top5_probability");
    let rows: Vec<csv::StringRecord> = rdr.records().map(|r| r.unwrap()).collect();
    assert_eq!(rows.len(), 723);
    let correct = rows.iter().filter(|r| &r[4] == "true").count();
    let predict_top1 = correct as f64 / 723.0;
    assert!(
        (predict_top1 - eval_top1).abs() < 1e-9,
        "predict {predict_top1} vs eval {eval_top1}"
    );
    assert!(
        stdout.contains(&format!("accuracy {:.2}%", 100.0 * eval_top1)),
        "{stdout}"
    );
    for r in &rows {
        let p: f64 = r[2].parse().unwrap();
        assert!((0.0..=1.0).contains(&p));
        assert_eq!(&r[1], &r[5], "predicted class is the first of the top-k");
    }

    // An unreadable file among the inputs is reported on stderr and skipped.
    let flat = d.path().join("flat");
    std::fs::create_dir(&flat).unwrap();
    std::fs::write(flat.join("broken.png"), b"\x89PNG truncated").unwrap();
    let good = rows[0][0].to_string();
    std::os::unix::fs::symlink(&good, flat.join("good.png")).unwrap();
    let o = common::ringtrain(&common::argv("predict --checkpoint {} --out {} {}", &[&ckpt, &csv_path, &flat]));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        stderr.contains("skipped unreadable image") && stderr.contains("broken.png"),
        "{stderr}"
    );
    let rows: Vec<_> = csv::Reader::from_path(&csv_path)
        .unwrap()
        .records()
        .map(|r| r.unwrap())
        .collect();
    assert_eq!(rows.len(), 1);
    assert!(rows[0][0].ends_with("good.png"));
}
