//! `ringtrain stats`: the exact per-channel mean and standard deviation over all pixels of a
//! folder (the population std of every pixel value, not the mean of per-image stds), computed in
//! parallel from integer sums, in [0, 1] units: the arguments for Normalize.
use anyhow::Result;
use rayon::prelude::*;

use crate::data::decode::decode_bytes;
use crate::data::source::{Dataset, Stored};

#[derive(Debug, Clone, Default)]
pub struct PixelStats {
    pub images: usize,
    pub pixels: u64,
    pub mean: [f64; 3],
    pub std: [f64; 3],
    /// Files that could not be read (path, reason); not counted.
    pub unreadable: Vec<(std::path::PathBuf, String)>,
}

#[derive(Default, Clone, Copy)]
struct Sums {
    n: u64,
    sum: [u64; 3],
    sq: [u64; 3],
}

impl Sums {
    fn add(mut self, o: Sums) -> Sums {
        self.n += o.n;
        for c in 0..3 {
            self.sum[c] += o.sum[c];
            self.sq[c] += o.sq[c];
        }
        self
    }
}

/// The statistics of every image of `data` (a folder, or a pack: a raw pack's pixels are the
/// ones it stores, resized when it was packed with --max-side).
pub fn pixel_stats(data: &Dataset) -> Result<PixelStats> {
    let samples = &data.samples;
    let per_image: Vec<Result<Sums, (std::path::PathBuf, String)>> = (0..samples.len())
        .into_par_iter()
        .map(|i| {
            let unreadable = |e: anyhow::Error| (samples.path(i), e.root_cause().to_string());
            let decoded;
            let px: &[u8] = match samples.read(i).map_err(unreadable)? {
                Stored::Raw(v) => v.px,
                Stored::Encoded(bytes) => {
                    decoded = decode_bytes(&bytes, &samples.path(i)).map_err(unreadable)?;
                    decoded.as_raw()
                }
            };
            let mut s = Sums {
                n: (px.len() / 3) as u64,
                ..Default::default()
            };
            for p in px.chunks_exact(3) {
                for c in 0..3 {
                    let v = p[c] as u64;
                    s.sum[c] += v;
                    s.sq[c] += v * v;
                }
            }
            Ok(s)
        })
        .collect();
    let mut total = Sums::default();
    let mut out = PixelStats::default();
    for r in per_image {
        match r {
            Ok(s) => {
                total = total.add(s);
                out.images += 1;
            }
            Err(e) => out.unreadable.push(e),
        }
    }
    if total.n == 0 {
        crate::bail_user!("no image under {} could be read", data.root.display());
    }
    out.pixels = total.n;
    let n = total.n as f64;
    for c in 0..3 {
        let mean = total.sum[c] as f64 / n;
        let var = total.sq[c] as f64 / n - mean * mean;
        out.mean[c] = mean / 255.0;
        out.std[c] = var.max(0.0).sqrt() / 255.0;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_images_pooled_not_averaged() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("c")).unwrap();
        // 1 pixel of 0 and 3 pixels of 255: mean 0.75, std sqrt(0.75 * 0.25).
        image::RgbImage::from_pixel(1, 1, image::Rgb([0, 0, 0]))
            .save(d.path().join("c/a.png"))
            .unwrap();
        image::RgbImage::from_pixel(3, 1, image::Rgb([255, 255, 255]))
            .save(d.path().join("c/b.png"))
            .unwrap();
        let s = pixel_stats(&Dataset::open(d.path(), "--data").unwrap()).unwrap();
        assert_eq!((s.images, s.pixels), (2, 4));
        assert!((s.mean[0] - 0.75).abs() < 1e-12);
        assert!((s.std[1] - (0.75f64 * 0.25).sqrt()).abs() < 1e-12);
    }
}
