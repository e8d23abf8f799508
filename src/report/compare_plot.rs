//! `ringtrain compare --plot`: the runs' validation curves overlaid in one PNG, top-1 and loss
//! per epoch side by side, one colour per run.
use std::path::Path;

use anyhow::Result;
use plotters::prelude::*;

use crate::report::compare::Run;
use crate::report::metrics_csv::EpochRow;
use crate::report::plots::{self, Series};

/// Distinct colours (matplotlib's tab10), repeated past ten runs.
const COLOURS: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

/// Writes the PNG to `path` (atomically).
pub fn validation_curves(path: &Path, runs: &[Run]) -> Result<()> {
    let epochs = runs.iter().flat_map(|r| r.rows.iter().map(|e| e.epoch)).max().unwrap_or(1);
    // Epochs without a validation figure (NaN) are left out rather than breaking a line.
    let series = |f: fn(&EpochRow) -> f64| -> Vec<Series> {
        runs.iter()
            .enumerate()
            .map(|(i, r)| {
                let points = r.rows.iter().map(|e| (e.epoch as f64, f(e))).filter(|p| p.1.is_finite());
                (r.name.as_str(), points.collect(), COLOURS[i % COLOURS.len()])
            })
            .collect()
    };
    plots::render_png(path, 1200, 480, |root| {
        let areas = root.split_evenly((1, 2));
        plots::panel(
            &areas[0],
            "Validation top-1",
            "%",
            &series(|e| 100.0 * e.val_top1),
            epochs,
            SeriesLabelPosition::LowerRight,
        )?;
        plots::panel(
            &areas[1],
            "Validation loss",
            "cross-entropy",
            &series(|e| e.val_loss),
            epochs,
            SeriesLabelPosition::UpperRight,
        )
    })
}
