//! Small pictures of evaluated images, for the run report (JPEG data URIs) and TensorBoard (a
//! captioned grid). Read from wherever the samples are stored: files, a pack, shards, parquet.
use anyhow::{anyhow, Result};
use base64::Engine;
use image::RgbImage;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use rayon::prelude::*;

use crate::data::decode::decode_bytes;
use crate::data::source::{Samples, Stored};
use crate::report::fonts;
use crate::report::plots::err;
use crate::report::worst::Entry;

/// Sample `i`, shrunk to fit `side`×`side` (aspect kept): the whole image, as its file shows it.
pub fn thumbnail(samples: &Samples, i: usize, side: u32) -> Result<RgbImage> {
    let img = match samples.read(i)? {
        Stored::Encoded(bytes) => decode_bytes(&bytes, &samples.path(i))?,
        Stored::Raw(v) => RgbImage::from_raw(v.width, v.height, v.px.to_vec()).ok_or_else(|| anyhow!("a packed image's size"))?,
    };
    let scale = (side as f64 / img.width().max(img.height()) as f64).min(1.0);
    let (w, h) = ((img.width() as f64 * scale).round().max(1.0) as u32, (img.height() as f64 * scale).round().max(1.0) as u32);
    Ok(image::imageops::thumbnail(&img, w, h))
}

/// Thumbnails of `samples` (indices), decoded in parallel; None for an image no longer readable.
pub fn thumbnails(samples: &Samples, picks: &[usize], side: u32) -> Vec<Option<RgbImage>> {
    picks.par_iter().map(|&i| thumbnail(samples, i, side).ok()).collect()
}

/// A JPEG `data:` URI of `img`, for a page that needs no other file.
pub fn jpeg_data_uri(img: &RgbImage) -> Result<String> {
    Ok(data_uri("image/jpeg", &jpeg(img)?))
}

/// JPEG bytes of `img` (quality 85): photographs in a tenth of a PNG's bytes.
pub fn jpeg(img: &RgbImage) -> Result<Vec<u8>> {
    let mut bytes = Vec::new();
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut bytes, 85).encode_image(img)?;
    Ok(bytes)
}

pub fn data_uri(mime: &str, bytes: &[u8]) -> String {
    format!("data:{mime};base64,{}", base64::engine::general_purpose::STANDARD.encode(bytes))
}

/// A grid cell: its width, its picture's side, and the height of its two caption lines.
const CELL_W: u32 = 160;
const PICTURE: u32 = 128;
const CAPTION: u32 = 34;

/// The images of `worst` in a grid of `columns`, each captioned with its true class, its
/// predicted class and that prediction's probability: one picture for TensorBoard.
pub fn worst_grid(samples: &Samples, worst: &[Entry], classes: &[String], columns: usize) -> Result<RgbImage> {
    let picks: Vec<usize> = worst.iter().map(|e| e.sample).collect();
    let captions = worst.iter().map(|e| {
        let verdict = if e.target != e.pred { RGBColor(190, 0, 0) } else { RGBColor(0, 110, 0) };
        vec![
            (format!("true {}", short(&classes[e.target])), BLACK),
            (format!("pred {} {:.2}", short(&classes[e.pred]), e.confidence), verdict),
        ]
    });
    grid(thumbnails(samples, &picks, PICTURE).into_iter().zip(captions).collect(), columns)
}

/// A class name cut to what a cell holds.
fn short(name: &str) -> String {
    match name.chars().count() > 14 {
        true => name.chars().take(13).collect::<String>() + "…",
        false => name.to_string(),
    }
}

/// Pictures in a grid of `columns`, each scaled to fit a cell and captioned with up to two
/// lines (a training batch with its labels, `ringtrain show-batch`).
pub fn captioned_grid(pictures: &[RgbImage], captions: &[Vec<String>], columns: usize) -> Result<RgbImage> {
    let cells = pictures.iter().enumerate().map(|(k, p)| {
        // Small crops are enlarged with nearest neighbour: their pixels as the network sees them.
        let scale = PICTURE as f64 / p.width().max(p.height()) as f64;
        let (pw, ph) = ((p.width() as f64 * scale) as u32, (p.height() as f64 * scale) as u32);
        let filter = if scale > 1.0 { image::imageops::FilterType::Nearest } else { image::imageops::FilterType::Triangle };
        let lines = captions.get(k).into_iter().flatten().map(|l| (l.clone(), BLACK)).collect();
        (Some(image::imageops::resize(p, pw.max(1), ph.max(1), filter)), lines)
    });
    grid(cells.collect(), columns)
}

/// A grid cell's picture (at most PICTURE on a side; None leaves it blank) and caption lines,
/// each in its colour.
type Cell = (Option<RgbImage>, Vec<(String, RGBColor)>);

/// Cells in a grid of `columns`: each picture centred above up to two caption lines.
fn grid(cells: Vec<Cell>, columns: usize) -> Result<RgbImage> {
    let columns = columns.clamp(1, cells.len().max(1));
    let rows = cells.len().div_ceil(columns).max(1);
    let (w, h) = (columns as u32 * CELL_W, rows as u32 * (PICTURE + CAPTION));
    let corner = |k: usize| ((k % columns) as u32 * CELL_W, (k / columns) as u32 * (PICTURE + CAPTION));
    let mut grid = RgbImage::from_pixel(w, h, image::Rgb([255, 255, 255]));
    for (k, t) in cells.iter().enumerate().filter_map(|(k, (t, _))| Some((k, t.as_ref()?))) {
        let (x, y) = corner(k);
        let (dx, dy) = ((CELL_W - t.width()) / 2, (PICTURE - t.height()) / 2);
        image::imageops::overlay(&mut grid, t, (x + dx) as i64, (y + dy) as i64);
    }
    let font = fonts::family_for(cells.iter().flat_map(|(_, lines)| lines.iter().map(|(l, _)| l.as_str())));
    {
        let root = BitMapBackend::with_buffer(&mut grid, (w, h)).into_drawing_area();
        for (k, (_, lines)) in cells.iter().enumerate() {
            // The caption's own area: a long line is cut at the cell's edge, not drawn over the next.
            let (x, y) = corner(k);
            let cell = root.clone().shrink((x, y + PICTURE), (CELL_W, CAPTION));
            let style = TextStyle::from((font, 12).into_font()).pos(Pos::new(HPos::Left, VPos::Top));
            for (i, (line, color)) in lines.iter().take(2).enumerate() {
                cell.draw(&Text::new(line.clone(), (3, 2 + 15 * i as i32), style.color(color))).map_err(err)?;
            }
        }
        root.present().map_err(err)?;
    }
    Ok(grid)
}
