//! What a run shows: per-epoch metrics, the classification report.
pub mod classification;
pub mod metrics_csv;
