//! One sample from its source to the transform's pixels, and the batch that both loaders (the
//! worker pool's and the device's) hand to the training loop.
use std::path::PathBuf;

use anyhow::{Context, Result};
use image::RgbImage;
use tch::Tensor;

use super::cache::Cache;
use crate::data::augment::transform::Transform;
use crate::data::decode::decode_bytes_for;
use crate::data::pixels::{CropBox, RgbView};
use crate::data::source::{Samples, Stored};
use crate::seeds;

/// One batch on the host: images u8 [B, H, W, 3] (or, normalised by the workers for a CPU device,
/// f32 [B, 3, H, W]), labels i64 [B], and which samples they are.
pub struct Batch {
    pub images: Tensor,
    pub labels: Tensor,
    /// Sample indices of the images, in batch order.
    pub indices: Vec<usize>,
    /// Samples of this batch that could not be read (only with `skip_unreadable`): path, reason.
    pub unreadable: Vec<(PathBuf, String)>,
}

/// Sample `i` transformed into `out` (size×size RGB8) with the randomness of (seed, epoch, key)
/// (`key` is i, or with repeated augmentation i + n·copy):
/// from the RAM cache when it holds it, else read and decoded (a JPEG shrunk while decoding where
/// the transform allows, unless `whole_jpeg` or caching), then kept in the cache if one is given.
pub fn load_sample(
    samples: &Samples,
    (i, key): (usize, usize),
    t: &Transform,
    (seed, epoch): (u64, u64),
    whole_jpeg: bool,
    cache: Option<&Cache>,
    out: &mut [u8],
) -> Result<()> {
    let rng = &mut seeds::sample(seed, epoch, key as u64);
    let stored = match cache.and_then(|c| c.get(i)) {
        Some(img) => Stored::Raw(img),
        None => samples.read(i)?,
    };
    let mut decoded = None; // the image decoded here, for the cache
    let (img, bx) = match stored {
        Stored::Raw(img) => (img, t.source_box(img.width, img.height, rng)),
        Stored::Encoded(bytes) => {
            let shrink_to = t.jpeg_shrink_to().filter(|_| !whole_jpeg && cache.is_none());
            let (img, bx) = decode_bytes_for(&bytes, &samples.path(i), shrink_to, |w, h| t.source_box(w, h, rng))?;
            (RgbView::from(&*decoded.insert(img)), bx)
        }
    };
    t.finish(img, bx, rng, out)
        .with_context(|| format!("transforming {}", samples.path(i).display()))?;
    if let (Some(c), Some(img)) = (cache, decoded) {
        c.put(i, img.width(), img.height(), img.into_raw());
    }
    Ok(())
}

/// Sample `i` decoded, with the whole image's box in its pixels: whole, or (`shrink_to`) as
/// `decode_bytes_for` shrinks a JPEG whose whole image becomes `shrink_to` pixels wide.
pub fn decode_sample(samples: &Samples, i: usize, shrink_to: Option<u32>) -> Result<(RgbImage, CropBox)> {
    match samples.read(i)? {
        Stored::Raw(v) => {
            let img = RgbImage::from_raw(v.width, v.height, v.px.to_vec()).expect("a pack's sizes are checked");
            Ok((img, CropBox::whole(v.width, v.height)))
        }
        Stored::Encoded(bytes) => {
            let path = samples.path(i);
            crate::data::decode::decode_bytes_for(&bytes, &path, shrink_to, CropBox::whole)
                .with_context(|| format!("loading {}", path.display()))
        }
    }
}
