//! Image file → RGB8 pixels. Any mode (grayscale, RGBA, 16-bit, palette) becomes RGB, as PIL's
//! `convert("RGB")` does (alpha is dropped, not composited).
use std::path::Path;

use anyhow::{Context, Result};
use image::RgbImage;

pub fn decode_rgb(path: &Path) -> Result<RgbImage> {
    let img = image::ImageReader::open(path)
        .with_context(|| format!("cannot open image {}", path.display()))?
        .with_guessed_format()
        .with_context(|| format!("cannot read image {}", path.display()))?
        .decode()
        .with_context(|| format!("cannot decode image {}", path.display()))?;
    Ok(img.into_rgb8())
}

#[cfg(test)]
mod tests {
    use super::*;
    use image::{GrayImage, Luma, Rgba, RgbaImage};

    #[test]
    fn grayscale_and_rgba_become_rgb() {
        let d = tempfile::tempdir().unwrap();
        let g = d.path().join("g.png");
        GrayImage::from_pixel(3, 2, Luma([77])).save(&g).unwrap();
        let img = decode_rgb(&g).unwrap();
        assert_eq!(img.dimensions(), (3, 2));
        assert_eq!(img.get_pixel(1, 1).0, [77, 77, 77]);

        let a = d.path().join("a.png");
        RgbaImage::from_pixel(2, 2, Rgba([10, 20, 30, 0])).save(&a).unwrap();
        assert_eq!(decode_rgb(&a).unwrap().get_pixel(0, 0).0, [10, 20, 30]);
    }

    #[test]
    fn corrupt_file_error_names_the_path() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("broken.jpg");
        std::fs::write(&p, b"not an image").unwrap();
        let e = format!("{:#}", decode_rgb(&p).unwrap_err());
        assert!(e.contains("broken.jpg"), "{e}");
    }
}
