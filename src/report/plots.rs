//! PNG pictures of a run: training curves (loss, accuracy, learning rate per epoch) and the
//! confusion matrix as a heat-map with class names (with many classes, a compact one beside the
//! most confused pairs). Text is drawn with the DejaVu Sans font compiled into the binary, or,
//! for class names in scripts it lacks (CJK), a system font that has them (`fonts`).
use std::path::Path;

use anyhow::{anyhow, Result};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::FontTransform;

use crate::atomic;
use crate::report::fonts;
use crate::report::metrics_csv::EpochRow;

/// The embedded font's family: for text without class names.
pub(crate) const FONT: &str = fonts::EMBEDDED;

pub(crate) fn err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("drawing: {e:?}")
}

/// Renders into an RGB buffer, then writes the PNG atomically.
pub(crate) fn render_png(
    path: &Path,
    w: u32,
    h: u32,
    draw: impl FnOnce(DrawingArea<BitMapBackend, plotters::coord::Shift>) -> Result<()>,
) -> Result<()> {
    atomic::write_file(path, &render_png_bytes(w, h, draw)?)
}

/// Renders into an RGB buffer: the PNG file's bytes.
pub(crate) fn render_png_bytes(
    w: u32,
    h: u32,
    draw: impl FnOnce(DrawingArea<BitMapBackend, plotters::coord::Shift>) -> Result<()>,
) -> Result<Vec<u8>> {
    fonts::embedded();
    let mut buf = vec![255u8; (w * h * 3) as usize];
    {
        let root = BitMapBackend::with_buffer(&mut buf, (w, h)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        draw(root.clone())?;
        root.present().map_err(err)?;
    }
    let img = image::RgbImage::from_raw(w, h, buf).ok_or_else(|| anyhow!("image buffer size"))?;
    let mut png = Vec::new();
    img.write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png)?;
    Ok(png)
}

pub(crate) type Series<'a> = (&'a str, Vec<(f64, f64)>, RGBColor);

pub(crate) fn panel(
    area: &DrawingArea<BitMapBackend, plotters::coord::Shift>,
    title: &str,
    y_label: &str,
    series: &[Series],
    epochs: usize,
    legend: SeriesLabelPosition,
) -> Result<()> {
    let ys = series
        .iter()
        .flat_map(|s| s.1.iter().map(|p| p.1))
        .filter(|y| y.is_finite());
    let (lo, hi) = ys.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), y| (a.min(y), b.max(y)));
    let (lo, hi) = if lo.is_finite() {
        (lo.min(0.0), if hi > lo { hi * 1.05 } else { lo + 1.0 })
    } else {
        (0.0, 1.0)
    };
    // Series names may be run directories in any script (`compare`).
    let font = fonts::family_for(series.iter().map(|s| s.0).chain([title, y_label]));
    let mut chart = ChartBuilder::on(area)
        .caption(title, (font, 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(1f64..(epochs.max(2) as f64), lo..hi)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("epoch")
        .y_desc(y_label)
        .label_style((font, 14))
        .axis_desc_style((font, 15))
        .x_labels(epochs.clamp(2, 10))
        .x_label_formatter(&|x| format!("{x:.0}"))
        .draw()
        .map_err(err)?;
    for (name, points, colour) in series {
        let c = *colour;
        chart
            .draw_series(LineSeries::new(points.iter().copied(), c.stroke_width(2)))
            .map_err(err)?
            .label(*name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(2)));
        chart
            .draw_series(points.iter().map(|&p| Circle::new(p, 3, c.filled())))
            .map_err(err)?;
    }
    chart
        .configure_series_labels()
        .label_font((font, 14))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(legend)
        .draw()
        .map_err(err)?;
    Ok(())
}

/// `curves.png`: loss, accuracy and learning rate per epoch, three panels side by side.
pub fn training_curves(path: &Path, rows: &[EpochRow]) -> Result<()> {
    atomic::write_file(path, &training_curves_png(rows)?)
}

/// `training_curves`' PNG bytes.
pub fn training_curves_png(rows: &[EpochRow]) -> Result<Vec<u8>> {
    let pts = |f: fn(&EpochRow) -> f64| rows.iter().map(|r| (r.epoch as f64, f(r))).collect::<Vec<_>>();
    let n = rows.last().map(|r| r.epoch).unwrap_or(1);
    render_png_bytes(1500, 450, |root| {
        let areas = root.split_evenly((1, 3));
        let loss = [
            ("train", pts(|r| r.train_loss), BLUE),
            ("val", pts(|r| r.val_loss), RED),
        ];
        panel(
            &areas[0],
            "Loss",
            "cross-entropy",
            &loss,
            n,
            SeriesLabelPosition::UpperRight,
        )?;
        panel(
            &areas[1],
            "Accuracy",
            "%",
            &[
                ("train top-1", pts(|r| 100.0 * r.train_top1), BLUE),
                ("val top-1", pts(|r| 100.0 * r.val_top1), RED),
                ("val top-5", pts(|r| 100.0 * r.val_top5), RGBColor(0, 150, 0)),
            ],
            n,
            SeriesLabelPosition::LowerRight,
        )?;
        panel(
            &areas[2],
            "Learning rate (end of epoch)",
            "lr",
            &[("lr", pts(|r| r.lr), BLACK)],
            n,
            SeriesLabelPosition::UpperRight,
        )
    })
}

/// Classes up to which every cell of the heat-map shows its count and every class its name.
pub const NAMED_CLASSES: usize = 40;

/// `confusion.png`: rows are true classes, columns predictions; colour is the share of the row
/// (recall on the diagonal), each cell shows its count. Past `NAMED_CLASSES` classes, the
/// compact form (`compact_heatmap`).
pub fn confusion_heatmap(path: &Path, classes: &[String], confusion: &[Vec<usize>], title: &str) -> Result<()> {
    atomic::write_file(path, &confusion_heatmap_png(classes, confusion, title)?)
}

/// `confusion_heatmap`'s PNG bytes.
pub fn confusion_heatmap_png(classes: &[String], confusion: &[Vec<usize>], title: &str) -> Result<Vec<u8>> {
    let font = fonts::family_for(classes.iter().map(String::as_str).chain([title]));
    if classes.len() > NAMED_CLASSES {
        return compact_heatmap(font, classes, confusion, title);
    }
    let k = classes.len().max(1);
    let cell = (640 / k).clamp(28, 80) as i32;
    let label_w = (classes.iter().map(|c| label_width(c)).max().unwrap_or(28) + 16).max(80);
    let (left, top) = (label_w + 30, 60);
    let (w, h) = (
        (left + cell * k as i32 + 40) as u32,
        (top + cell * k as i32 + label_w + 40) as u32,
    );
    render_png_bytes(w, h, |root| {
        let text = |size: i32| TextStyle::from((font, size).into_font()).color(&BLACK);
        root.draw(&Text::new(title.to_string(), (left, 20), text(20)))
            .map_err(err)?;
        let centred = |size| text(size).pos(Pos::new(HPos::Center, VPos::Center));
        for (t, row) in confusion.iter().enumerate() {
            let total: usize = row.iter().sum::<usize>().max(1);
            for (p, &count) in row.iter().enumerate() {
                let share = count as f64 / total as f64;
                let (x, y) = (left + p as i32 * cell, top + t as i32 * cell);
                let c = blue(share);
                root.draw(&Rectangle::new([(x, y), (x + cell, y + cell)], c.filled()))
                    .map_err(err)?;
                root.draw(&Rectangle::new([(x, y), (x + cell, y + cell)], RGBColor(200, 200, 200)))
                    .map_err(err)?;
                if count > 0 {
                    let colour = if share > 0.55 { WHITE } else { BLACK };
                    let style = centred((cell / 3).clamp(10, 16)).color(&colour);
                    root.draw(&Text::new(count.to_string(), (x + cell / 2, y + cell / 2), style))
                        .map_err(err)?;
                }
            }
        }
        let label = text(14);
        for (i, name) in classes.iter().enumerate() {
            let y = top + i as i32 * cell + cell / 2;
            root.draw(&Text::new(
                name.clone(),
                (left - 8, y),
                label.pos(Pos::new(HPos::Right, VPos::Center)),
            ))
            .map_err(err)?;
            let x = left + i as i32 * cell + cell / 2;
            let rotated = label
                .transform(FontTransform::Rotate90)
                .pos(Pos::new(HPos::Left, VPos::Center));
            root.draw(&Text::new(name.clone(), (x, top + k as i32 * cell + 8), rotated))
                .map_err(err)?;
        }
        let y_axis = text(15)
            .transform(FontTransform::Rotate270)
            .pos(Pos::new(HPos::Center, VPos::Center));
        root.draw(&Text::new("true class", (12, top + cell * k as i32 / 2), y_axis))
            .map_err(err)?;
        root.draw(&Text::new(
            "predicted class",
            (left + cell * k as i32 / 2, h as i32 - 14),
            centred(15),
        ))
        .map_err(err)?;
        Ok(())
    })
}

/// About how wide `name` is at 14 px: CJK and other wide characters take twice a Latin one.
fn label_width(name: &str) -> i32 {
    name.chars().map(|c| if (c as u32) >= 0x1100 { 14 } else { 7 }).sum()
}

/// White → dark blue as `share` goes from 0 to 1.
fn blue(share: f64) -> RGBColor {
    RGBColor(
        (255.0 * (1.0 - 0.85 * share)) as u8,
        (255.0 * (1.0 - 0.7 * share)) as u8,
        (255.0 * (1.0 - 0.35 * share)) as u8,
    )
}

/// Pairs listed beside a compact heat-map.
const LISTED_PAIRS: usize = 30;

/// The confusion matrix of many classes (ImageNet's 1,000): no name or count fits a cell, so
/// each cell is 1 to a few pixels (the matrix at most 1,200 px a side), its colour the square
/// root of its share of the row (a scattered 1 % error stays visible; recall on the diagonal),
/// the axes ticked by class index; beside it, by name, the most confused pairs with their
/// counts. The picture shows where errors cluster (similar classes sit together in most class
/// lists), the list which ones matter; confusion.csv holds every cell.
fn compact_heatmap(font: &str, classes: &[String], confusion: &[Vec<usize>], title: &str) -> Result<Vec<u8>> {
    let k = classes.len();
    let cell = (1200 / k).max(1) as i32;
    let side = cell * k as i32;
    let (left, top, list_w) = (70, 60, 560);
    let pairs = crate::report::classification::most_confused(confusion, LISTED_PAIRS);
    let (w, h) = ((left + side + 40 + list_w) as u32, (top + side.max(20 * LISTED_PAIRS as i32 + 40) + 50) as u32);
    render_png_bytes(w, h, |root| {
        let text = |size: i32| TextStyle::from((font, size).into_font()).color(&BLACK);
        root.draw(&Text::new(format!("{title} ({k} classes)"), (left, 20), text(20)))
            .map_err(err)?;
        for (t, row) in confusion.iter().enumerate() {
            let total = row.iter().sum::<usize>().max(1) as f64;
            for (p, &count) in row.iter().enumerate().filter(|c| *c.1 > 0) {
                let (x, y) = (left + p as i32 * cell, top + t as i32 * cell);
                let c = blue((count as f64 / total).sqrt());
                for (dx, dy) in (0..cell).flat_map(|dx| (0..cell).map(move |dy| (dx, dy))) {
                    root.draw_pixel((x + dx, y + dy), &c).map_err(err)?;
                }
            }
        }
        root.draw(&Rectangle::new([(left - 1, top - 1), (left + side, top + side)], BLACK))
            .map_err(err)?;
        // Ticks at a round step giving about ten of them.
        let step = [1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000, 2000, 5000]
            .into_iter()
            .find(|s| k / s <= 10)
            .unwrap_or(k.div_ceil(10));
        let small = text(12);
        for i in (0..k).step_by(step) {
            let at = i as i32 * cell + cell / 2;
            root.draw(&Text::new(i.to_string(), (left - 6, top + at), small.pos(Pos::new(HPos::Right, VPos::Center))))
                .map_err(err)?;
            root.draw(&Text::new(i.to_string(), (left + at, top + side + 6), small.pos(Pos::new(HPos::Center, VPos::Top))))
                .map_err(err)?;
        }
        let y_axis = text(15).transform(FontTransform::Rotate270).pos(Pos::new(HPos::Center, VPos::Center));
        root.draw(&Text::new("true class (index)", (14, top + side / 2), y_axis))
            .map_err(err)?;
        root.draw(&Text::new(
            "predicted class (index)",
            (left + side / 2, top + side + 30),
            text(15).pos(Pos::new(HPos::Center, VPos::Top)),
        ))
        .map_err(err)?;
        let x = left + side + 40;
        root.draw(&Text::new("most confused: true → predicted (count)", (x, top), text(15)))
            .map_err(err)?;
        let short = |s: &str| match s.chars().count() > 24 {
            true => s.chars().take(23).collect::<String>() + "…",
            false => s.to_string(),
        };
        for (j, (t, p, c)) in pairs.iter().enumerate() {
            let line = format!("{} → {} ({c})", short(&classes[*t]), short(&classes[*p]));
            root.draw(&Text::new(line, (x, top + 28 + 20 * j as i32), text(13)))
                .map_err(err)?;
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pictures_are_valid_pngs_with_ink() {
        let d = tempfile::tempdir().unwrap();
        let rows: Vec<EpochRow> = (1..=4)
            .map(|e| EpochRow {
                epoch: e,
                train_loss: 2.0 / e as f64,
                train_top1: 0.2 * e as f64,
                val_loss: 2.2 / e as f64,
                val_top1: 0.18 * e as f64,
                val_top5: 0.9,
                lr: 0.1 / e as f64,
                seconds: 1.0,
                images_per_s: 10.0,
                skipped_steps: 0,
                val_macro_f1: 0.1 * e as f64,
                ema_val_top1: None,
            })
            .collect();
        training_curves(&d.path().join("curves.png"), &rows).unwrap();
        let classes: Vec<String> = ["alpha", "beta", "Small-flowered_Cranesbill"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        confusion_heatmap(
            &d.path().join("confusion.png"),
            &classes,
            &[vec![5, 1, 0], vec![0, 7, 2], vec![1, 0, 9]],
            "test",
        )
        .unwrap();
        // 1,000 classes: the compact map, one pixel a cell; the diagonal dark, an empty cell white,
        // a scattered 1 % error visible.
        let k = 1000;
        let names: Vec<String> = (0..k).map(|i| format!("class {i}")).collect();
        let mut m = vec![vec![0usize; k]; k];
        for (i, row) in m.iter_mut().enumerate() {
            row[i] = 99;
            row[(i + 1) % k] = 1;
        }
        confusion_heatmap(&d.path().join("many.png"), &names, &m, "many").unwrap();
        let img = image::open(d.path().join("many.png")).unwrap().into_rgb8();
        assert_eq!(img.dimensions(), (70 + 1000 + 40 + 560, 60 + 1000 + 50));
        let at = |x: u32, y: u32| img.get_pixel(70 + x, 60 + y).0;
        assert!(at(500, 500)[0] < 60, "the diagonal: {:?}", at(500, 500));
        assert_eq!(at(500, 300), [255, 255, 255]);
        assert!(at(501, 500)[0] < 240, "a 1 % error shows: {:?}", at(501, 500));
        for f in ["curves.png", "confusion.png", "many.png"] {
            let img = image::open(d.path().join(f)).unwrap().into_rgb8();
            let dark = img.pixels().filter(|p| p.0.iter().all(|&c| c < 80)).count();
            assert!(dark > 500, "{f} has almost no text or lines ({dark} dark pixels)");
        }
    }
}
