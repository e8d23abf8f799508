//! What a run shows: per-epoch metrics, the classification report, the confusion matrix,
//! TensorBoard events, plots and progress.
pub mod classification;
pub mod metrics_csv;
pub mod plots;
pub mod progress;
pub mod stdout;
pub mod tensorboard;

use std::path::Path;

use anyhow::Result;
use serde_json::json;

use crate::atomic;
use crate::train::eval::EvalResult;
use classification::ClassificationReport;

/// Writes an evaluation's outputs into `dir`: report.txt (sklearn's layout), metrics.json (loss,
/// top-1, top-5, counts and the report as sklearn's output_dict), confusion.csv, confusion.png.
/// `extra`: more top-level keys of metrics.json (a training run's restarts).
pub fn write_evaluation(
    dir: &Path,
    classes: &[String],
    ev: &EvalResult,
    title: &str,
    extra: serde_json::Map<String, serde_json::Value>,
) -> Result<ClassificationReport> {
    std::fs::create_dir_all(dir)?;
    let report = ClassificationReport::new(classes, &ev.targets, &ev.preds);
    atomic::write_file(&dir.join("report.txt"), report.to_text().as_bytes())?;
    let mut metrics = json!({
        "loss": ev.loss,
        "top1": ev.top1,
        "top5": ev.top5,
        "images": ev.targets.len(),
        "unreadable": ev.unreadable.iter().map(|(p, e)| json!({"path": p, "error": e})).collect::<Vec<_>>(),
        "classification_report": report.to_sklearn_json(),
        "confusion_matrix": report.confusion,
        "classes": classes,
    });
    metrics.as_object_mut().expect("an object").extend(extra);
    atomic::write_file(
        &dir.join("metrics.json"),
        serde_json::to_string_pretty(&metrics)?.as_bytes(),
    )?;
    atomic::write_file(&dir.join("confusion.csv"), report.confusion_csv().as_bytes())?;
    plots::confusion_heatmap(&dir.join("confusion.png"), classes, &report.confusion, title)?;
    Ok(report)
}
