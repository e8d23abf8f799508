//! Pixels in memory, as sources, decoding, augmentation and loading hand them to each other:
//! a borrowed RGB8 image (`RgbView`) and a box in one (`CropBox`).
use image::RgbImage;

/// Decoded RGB8 pixels, row-major HWC, borrowed: from a decoder's `RgbImage`, a RAM cache or a
/// pack's memory map alike.
#[derive(Debug, Clone, Copy)]
pub struct RgbView<'a> {
    pub width: u32,
    pub height: u32,
    pub px: &'a [u8],
}

impl<'a> From<&'a RgbImage> for RgbView<'a> {
    fn from(img: &'a RgbImage) -> Self {
        RgbView {
            width: img.width(),
            height: img.height(),
            px: img.as_raw(),
        }
    }
}

/// A source box in pixel coordinates of the decoded image (may be fractional).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CropBox {
    pub left: f64,
    pub top: f64,
    pub width: f64,
    pub height: f64,
}

impl CropBox {
    /// All of a w×h image.
    pub fn whole(w: u32, h: u32) -> CropBox {
        CropBox {
            left: 0.0,
            top: 0.0,
            width: w as f64,
            height: h as f64,
        }
    }
}
