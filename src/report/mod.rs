//! What a run shows: per-epoch metrics, the classification report, the confusion matrix, the
//! worst images, the report page, TensorBoard events, plots and progress.
pub mod classification;
pub mod compare;
pub mod compare_plot;
pub mod fonts;
pub mod lr_find_plot;
pub mod metrics_csv;
pub mod page;
pub mod plots;
pub mod progress;
pub mod stdout;
pub mod tensorboard;
pub mod thumbnails;
pub mod worst;

use std::path::Path;

use anyhow::Result;
use serde_json::json;

use crate::atomic;
use crate::data::source::Samples;
use crate::train::step::eval::EvalResult;
use classification::ClassificationReport;
pub use page::PageContext;

/// 83.4 s → "1m23s"; under a minute with a tenth ("4.2s"), past an hour "1h02m03s".
pub fn duration(seconds: f64) -> String {
    if seconds < 59.95 {
        return format!("{seconds:.1}s");
    }
    let s = seconds.round() as u64;
    match s / 3600 {
        0 => format!("{}m{:02}s", s / 60, s % 60),
        h => format!("{h}h{:02}m{:02}s", s / 60 % 60, s % 60),
    }
}

/// Writes an evaluation's outputs into `dir`: report.txt (sklearn's layout), metrics.json (loss,
/// top-1, top-5, counts and the report as sklearn's output_dict), confusion.csv, confusion.png,
/// predictions.csv (every image's true and predicted class, confidence and loss), and the page
/// (`page`: where, and what else it shows).
/// `extra`: more top-level keys of metrics.json (a training run's restarts).
pub fn write_evaluation(
    dir: &Path,
    classes: &[String],
    ev: &EvalResult,
    title: &str,
    extra: serde_json::Map<String, serde_json::Value>,
    page: &PageContext,
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
    let confusion_png = plots::confusion_heatmap_png(classes, &report.confusion, title)?;
    atomic::write_file(&dir.join("confusion.png"), &confusion_png)?;
    if !ev.losses.is_empty() {
        atomic::write_file(&dir.join("predictions.csv"), &predictions_csv(classes, ev, page.samples)?)?;
    }
    page::write(page, title, classes, ev, &report, &confusion_png)?;
    Ok(report)
}

/// One row per evaluated image, in sample order, with `predict`'s column names: path, label
/// (the true class), predicted, probability (of the predicted class), loss. Numbers in their
/// shortest text that reads back as the same f32.
fn predictions_csv(classes: &[String], ev: &EvalResult, samples: Option<&Samples>) -> Result<Vec<u8>> {
    let mut rows: Vec<usize> = (0..ev.targets.len()).collect();
    rows.sort_by_key(|&j| ev.indices.get(j));
    let mut w = csv::Writer::from_writer(Vec::new());
    w.write_record(["path", "label", "predicted", "probability", "loss"])?;
    for j in rows {
        let path = match (samples, ev.indices.get(j)) {
            (Some(samples), Some(&i)) => samples.path(i).display().to_string(),
            _ => String::new(),
        };
        w.write_record([
            path,
            classes[ev.targets[j] as usize].clone(),
            classes[ev.preds[j] as usize].clone(),
            ev.confidence.get(j).copied().unwrap_or(f32::NAN).to_string(),
            ev.losses[j].to_string(),
        ])?;
    }
    Ok(w.into_inner()?)
}

#[cfg(test)]
mod tests {
    #[test]
    fn durations_read_as_a_person_writes_them() {
        use super::duration;
        assert_eq!(duration(4.24), "4.2s");
        assert_eq!(duration(83.4), "1m23s");
        assert_eq!(duration(59.96), "1m00s");
        assert_eq!(duration(3723.0), "1h02m03s");
    }
}
