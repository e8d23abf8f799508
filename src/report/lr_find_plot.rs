//! `lr_find.png`: the learning-rate range test's loss against the LR on a log axis, raw (light)
//! and smoothed, with a marker at the suggested LR.
use std::path::Path;

use anyhow::Result;
use plotters::prelude::*;

use super::plots::{err, render_png, FONT};
use crate::train::lr_find::Point;

const RAW: RGBColor = RGBColor(160, 185, 230);
const SMOOTHED: RGBColor = RGBColor(20, 60, 170);
const MARK: RGBColor = RGBColor(210, 30, 30);

/// Draws `points` (their finite values) and `suggestion`, an index into them, into `path`.
pub fn lr_find_plot(path: &Path, points: &[Point], suggestion: Option<usize>) -> Result<()> {
    let finite: Vec<&Point> = points.iter().filter(|p| p.loss.is_finite() && p.smoothed.is_finite()).collect();
    let (x_lo, x_hi) = match (points.first(), points.last()) {
        (Some(a), Some(b)) if b.lr > a.lr => (a.lr, b.lr),
        (Some(a), _) => (a.lr, a.lr * 10.0),
        _ => (1e-7, 10.0),
    };
    // The y range follows the smoothed curve short of its last points (the divergence, whose
    // rise would flatten the part that matters); what lies above is cut at the top.
    let lo = finite.iter().map(|p| p.loss.min(p.smoothed)).fold(f64::INFINITY, f64::min);
    let shown = &finite[..finite.len().saturating_sub(crate::train::lr_find::SKIP_END).max(finite.len().min(2))];
    let hi = shown.iter().map(|p| p.smoothed).fold(f64::NEG_INFINITY, f64::max);
    let (lo, hi) = match lo.is_finite() && hi > lo {
        true => (lo - 0.05 * (hi - lo), hi + 0.05 * (hi - lo)),
        false => (0.0, 1.0),
    };
    let clip = |y: f64| y.clamp(lo, hi);
    render_png(path, 900, 560, |root| {
        let mut chart = ChartBuilder::on(&root)
            .caption("Learning-rate range test", (FONT, 22))
            .margin(14)
            .x_label_area_size(44)
            .y_label_area_size(64)
            .build_cartesian_2d((x_lo..x_hi).log_scale(), lo..hi)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("learning rate (log scale)")
            .y_desc("training loss")
            .label_style((FONT, 14))
            .axis_desc_style((FONT, 15))
            .x_label_formatter(&|x| format!("{x:.0e}"))
            .draw()
            .map_err(err)?;
        let line = |f: fn(&Point) -> f64| finite.iter().map(move |p| (p.lr, clip(f(p)))).collect::<Vec<_>>();
        chart
            .draw_series(LineSeries::new(line(|p| p.loss), RAW.stroke_width(1)))
            .map_err(err)?
            .label("loss")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], RAW.stroke_width(2)));
        chart
            .draw_series(LineSeries::new(line(|p| p.smoothed), SMOOTHED.stroke_width(3)))
            .map_err(err)?
            .label("smoothed loss")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], SMOOTHED.stroke_width(3)));
        if let Some(p) = suggestion.and_then(|i| points.get(i)) {
            chart
                .draw_series(std::iter::once(Circle::new((p.lr, clip(p.smoothed)), 7, MARK.filled())))
                .map_err(err)?
                .label(format!("suggested {:.1e}", p.lr))
                .legend(|(x, y)| Circle::new((x + 9, y), 5, MARK.filled()));
        }
        chart
            .configure_series_labels()
            .label_font((FONT, 14))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .position(SeriesLabelPosition::LowerLeft)
            .draw()
            .map_err(err)?;
        Ok(())
    })
}
