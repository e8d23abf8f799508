//! Geometric transforms with torchvision's semantics (on PIL images), each done as ONE resize of
//! a source box straight to the output size, with the run's filter (`--interpolation`: PIL's
//! antialiased bilinear or bicubic, or its nearest neighbour):
//! - train: RandomResizedCrop(size, scale, ratio) + RandomHorizontalFlip(0.5)
//! - train, CIFAR style (`pad`): Resize(size) + RandomCrop(size, padding=pad) + flip
//! - eval:  Resize(resize_size) (shorter side) + CenterCrop(size)
//! - train, optionally: an augmentation policy (`policy.rs`), then RandomErasing (`erasing.rs`)
//!
//! Output is size×size RGB8 (HWC); float conversion and Normalize happen on the device.
use anyhow::{Context, Result};
use fast_image_resize as fr;
use image::RgbImage;
use rand::Rng;

use super::erasing::RandomErasing;
use super::jitter::ColorJitter;
use super::policy::AutoPolicy;
use crate::data::pixels::{CropBox, RgbView};

crate::flag_enum! {
    /// `--interpolation`: the filter of every resize of the input pipeline, training crop and
    /// evaluation resize alike, each PIL's (torchvision's `InterpolationMode` on PIL images, with
    /// antialiasing): `bilinear` and `bicubic` (Catmull-Rom, a = -0.5) are convolutions whose
    /// support widens with the shrink factor, `nearest` takes one source pixel per output pixel.
    pub enum Interpolation("invalid --interpolation") {
        Bilinear = "bilinear",
        Bicubic = "bicubic",
        Nearest = "nearest",
    }
}

/// What runs and checkpoints from before `--interpolation` resized with.
impl Default for Interpolation {
    fn default() -> Self {
        Interpolation::Bilinear
    }
}

#[derive(Debug, Clone)]
pub enum Transform {
    Train {
        size: u32,
        scale: (f64, f64),
        ratio: (f64, f64),
        hflip: bool,
        erase: Option<RandomErasing>,
        /// RandomCrop(size, padding=pad, fill 0) of the whole image resized to size×size,
        /// instead of RandomResizedCrop (scale and ratio then unused).
        pad: Option<u32>,
        interpolation: Interpolation,
        /// `--color-jitter` after the flip, then `--auto-augment`'s policy, before erasing.
        color_jitter: Option<ColorJitter>,
        policy: Option<AutoPolicy>,
    },
    Eval {
        size: u32,
        resize: u32,
        interpolation: Interpolation,
    },
}

/// `Transform::moves`: what a training image does after its box is resized.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Moves {
    pub shift: Option<(i64, i64)>,
    pub flip: bool,
}

/// torchvision's `RandomResizedCrop.get_params`: ten tries at a random area and aspect ratio,
/// then a centre crop with the ratio clamped into range. Sizes are rounded as Python's `round`
/// does (half to even).
pub fn random_resized_crop_box(w: u32, h: u32, scale: (f64, f64), ratio: (f64, f64), rng: &mut impl Rng) -> CropBox {
    let (wf, hf) = (w as f64, h as f64);
    let area = wf * hf;
    let (lr0, lr1) = (ratio.0.ln(), ratio.1.ln());
    for _ in 0..10 {
        let target = area * rng.gen_range(scale.0..=scale.1);
        let aspect = rng.gen_range(lr0..=lr1).exp();
        let cw = (target * aspect).sqrt().round_ties_even();
        let ch = (target / aspect).sqrt().round_ties_even();
        if cw > 0.0 && cw <= wf && ch > 0.0 && ch <= hf {
            let top = rng.gen_range(0..=(h - ch as u32)) as f64;
            let left = rng.gen_range(0..=(w - cw as u32)) as f64;
            return CropBox {
                left,
                top,
                width: cw,
                height: ch,
            };
        }
    }
    let in_ratio = wf / hf;
    let (cw, ch) = if in_ratio < ratio.0 {
        (wf, (wf / ratio.0).round_ties_even())
    } else if in_ratio > ratio.1 {
        ((hf * ratio.1).round_ties_even(), hf)
    } else {
        (wf, hf)
    };
    CropBox {
        left: ((wf - cw) / 2.0).trunc(),
        top: ((hf - ch) / 2.0).trunc(),
        width: cw,
        height: ch,
    }
}

/// Resize(resize) then CenterCrop(size) of a w×h image, in the resized image's pixels: its
/// size (nw, nh) and the crop's offset (left, top).
fn resize_center_crop(w: u32, h: u32, resize: u32, size: u32) -> (f64, f64, f64, f64) {
    // torchvision: the shorter side becomes `resize`, the longer int(resize * long / short).
    let (nw, nh) = if w <= h {
        (resize as f64, (resize as f64 * h as f64 / w as f64).trunc())
    } else {
        ((resize as f64 * w as f64 / h as f64).trunc(), resize as f64)
    };
    let s = size as f64;
    // CenterCrop: int(round((H - crop) / 2)), Python's round (73 px to 64: offset 4, not 5); a
    // crop larger than the image pads in torchvision, here it clamps to the image (only
    // reachable with resize < size).
    let top = ((nh - s) / 2.0).round_ties_even().max(0.0);
    let left = ((nw - s) / 2.0).round_ties_even().max(0.0);
    (nw, nh, left, top)
}

/// Resize(resize) then CenterCrop(size), expressed as a box in source pixels.
pub fn resize_center_crop_box(w: u32, h: u32, resize: u32, size: u32) -> CropBox {
    let (nw, nh, left, top) = resize_center_crop(w, h, resize, size);
    let s = size as f64;
    let (sx, sy) = (w as f64 / nw, h as f64 / nh);
    CropBox {
        left: left * sx,
        top: top * sy,
        width: s.min(nw) * sx,
        height: s.min(nh) * sy,
    }
}

/// Antialiased resize of `bx` in `img` to size×size with `filter`'s convolution (bilinear or
/// bicubic), written into `out` (HWC RGB8). Near the box's edges the filter reads the pixels
/// around it, as a resize of the whole image followed by a crop does (torchvision's Resize +
/// CenterCrop). fast_image_resize computes PIL's coefficients (its `CatmullRom` is PIL's
/// BICUBIC, a = -0.5, support 2, widened by the shrink factor as PIL's): within 1 level of PIL
/// (`tests/pipeline_parity.rs`). `Nearest` is not a convolution (`Transform::nearest_indices`
/// takes PIL's pixels); asked here, it is fast_image_resize's nearest neighbour of the box.
pub fn resize_box_into(img: RgbView<'_>, bx: CropBox, size: u32, filter: Interpolation, out: &mut [u8]) -> Result<()> {
    let alg = match filter {
        Interpolation::Bilinear => fr::ResizeAlg::Convolution(fr::FilterType::Bilinear),
        Interpolation::Nearest => fr::ResizeAlg::Nearest,
        Interpolation::Bicubic => return bicubic_box_into(img, bx, size, out),
    };
    let src = fr::images::ImageRef::new(img.width, img.height, img.px, fr::PixelType::U8x3).context("source image")?;
    let mut dst = fr::images::Image::from_slice_u8(size, size, out, fr::PixelType::U8x3).context("destination")?;
    let opts = fr::ResizeOptions::new()
        .resize_alg(alg)
        .crop(bx.left, bx.top, bx.width, bx.height);
    fr::Resizer::new().resize(&src, &mut dst, &opts).context("resize")?;
    Ok(())
}

/// PIL's bicubic resize of `bx`. PIL resizes across, then down, rounding and clamping to uint8
/// after each pass, with 22-bit coefficients; fast_image_resize resizes uint8 images down
/// first, with 16-bit ones. Bicubic overshoots at edges, so the clamp between the passes makes
/// the order count (one call was 6 levels from PIL at worst on plant seedlings), and its
/// negative lobes carry the coarser coefficients' rounding into a second level (2 levels, two
/// uint8 passes in PIL's order). Here: two one-way passes in PIL's order on 16-bit pixels
/// (fast_image_resize's 46-bit coefficients), each clamped to 0..255 as PIL's are, within 1
/// level of PIL and mostly equal. The price: a 400×300 box to 224 px took 0.9 ms on one core,
/// against 0.37 ms for two uint8 passes and 0.25 ms for bilinear.
fn bicubic_box_into(img: RgbView<'_>, bx: CropBox, size: u32, out: &mut [u8]) -> Result<()> {
    use fr::pixels::U16x3;
    let cubic = fr::ResizeOptions::new().resize_alg(fr::ResizeAlg::Convolution(fr::FilterType::CatmullRom));
    let wide: Vec<U16x3> = img
        .px
        .chunks_exact(3)
        .map(|p| U16x3::new([p[0] as u16, p[1] as u16, p[2] as u16]))
        .collect();
    let src = fr::images::TypedImageRef::new(img.width, img.height, &wide).context("source image")?;
    let mut across = fr::images::TypedImage::<U16x3>::new(size, img.height);
    let mut resizer = fr::Resizer::new();
    resizer
        .resize_typed(&src, &mut across, &cubic.crop(bx.left, 0.0, bx.width, img.height as f64))
        .context("resize")?;
    for p in across.pixels_mut() {
        p.0 = p.0.map(|v| v.min(255));
    }
    let mut down = fr::images::TypedImage::<U16x3>::new(size, size);
    resizer
        .resize_typed(&across, &mut down, &cubic.crop(0.0, bx.top, size as f64, bx.height))
        .context("resize")?;
    for (o, p) in out.chunks_exact_mut(3).zip(down.pixels()) {
        for (o, v) in o.iter_mut().zip(p.0) {
            *o = v.min(255) as u8;
        }
    }
    Ok(())
}

/// RandomResizedCrop's resize: torchvision cuts the box out first (PIL's `crop`, then `resize`),
/// so near the box's edges the filter reads only pixels inside it. Reading the pixels around it
/// instead changed up to 36 levels at the edges of CIFAR-sized crops. A box that does not lie on
/// whole pixels (from a JPEG decoded at 1/8 size) cannot be cut and is resized in place.
pub fn resize_cut_box_into(img: RgbView<'_>, bx: CropBox, size: u32, filter: Interpolation, out: &mut [u8]) -> Result<()> {
    let whole = [bx.left, bx.top, bx.width, bx.height].iter().all(|v| v.fract() == 0.0);
    if !whole {
        return resize_box_into(img, bx, size, filter, out);
    }
    let (w, h) = (bx.width as usize, bx.height as usize);
    let (left, top, stride) = (bx.left as usize, bx.top as usize, img.width as usize * 3);
    let mut cut = Vec::with_capacity(w * h * 3);
    for row in img.px.chunks_exact(stride).skip(top).take(h) {
        cut.extend_from_slice(&row[left * 3..(left + w) * 3]);
    }
    let all = CropBox::whole(w as u32, h as u32);
    let cut = RgbView {
        width: w as u32,
        height: h as u32,
        px: &cut,
    };
    resize_box_into(cut, all, size, filter, out)
}

/// PIL's nearest neighbour along one axis (`Image.resize(..., NEAREST)`, its
/// `ImagingScaleAffine`): an extent of `src` pixels resized to `dst` reads, for output pixel
/// k, source pixel trunc(a/2 + k·a) with a = src/dst, the sum accumulated pixel by pixel in
/// doubles as PIL accumulates it, so that where the exact value is a whole number the pixel is
/// PIL's. The `skip` first outputs are passed over (the centre crop of a resized image), `n`
/// follow, each clamped to the extent. No fast_image_resize algorithm equals PIL's here: its
/// `Nearest` computes each position afresh from the crop box (trunc(left + a/2 + a·k)), which
/// lands on the other side of a whole number where PIL's sum does not. On cut-out boxes it
/// took PIL's pixels (48 RandomResizedCrops of `tests/pipeline_parity.rs`), but on centre crops
/// a neighbouring column or row in 12 of its 24 images (up to 141 levels off); this takes
/// PIL's pixels in all.
fn pil_nearest_axis(src: f64, dst: f64, skip: u32, n: u32) -> Vec<usize> {
    let a = src / dst;
    let mut at = a * 0.5;
    for _ in 0..skip {
        at += a;
    }
    let last = (src.ceil() as usize).max(1) - 1;
    (0..n)
        .map(|_| {
            let i = (at as usize).min(last);
            at += a;
            i
        })
        .collect()
}

/// The source pixels that nearest-neighbour resizing takes: for each output column its source
/// column, for each output row its source row.
pub struct NearestIndices {
    pub cols: Vec<usize>,
    pub rows: Vec<usize>,
}

fn flip_horizontal(buf: &mut [u8], size: usize) {
    let mut copy = vec![0u8; size * 3];
    for row in buf.chunks_exact_mut(size * 3) {
        copy.copy_from_slice(row);
        for (out, px) in row.chunks_exact_mut(3).zip(copy.chunks_exact(3).rev()) {
            out.copy_from_slice(px);
        }
    }
}

/// RandomCrop with zero padding, in place: output pixel (x, y) takes input (x + dx, y + dy), or 0
/// where that falls outside the image.
fn shift_with_zero_fill(buf: &mut [u8], size: usize, dx: i64, dy: i64) {
    let src = buf.to_vec();
    let n = size as i64;
    for y in 0..n {
        for x in 0..n {
            let (sx, sy) = (x + dx, y + dy);
            let o = ((y * n + x) * 3) as usize;
            if (0..n).contains(&sx) && (0..n).contains(&sy) {
                let i = ((sy * n + sx) * 3) as usize;
                buf[o..o + 3].copy_from_slice(&src[i..i + 3]);
            } else {
                buf[o..o + 3].fill(0);
            }
        }
    }
}

/// `idx`'s rows and columns of `img` into `out` (HWC RGB8, size×size).
fn nearest_into(img: RgbView<'_>, idx: &NearestIndices, out: &mut [u8]) {
    let (stride, line) = (img.width as usize * 3, idx.cols.len() * 3);
    for (&y, dst) in idx.rows.iter().zip(out.chunks_exact_mut(line)) {
        let row = &img.px[y * stride..(y + 1) * stride];
        for (&x, px) in idx.cols.iter().zip(dst.chunks_exact_mut(3)) {
            px.copy_from_slice(&row[x * 3..x * 3 + 3]);
        }
    }
}

impl Transform {
    /// torchvision's RandomResizedCrop(size) (scale 0.08–1, ratio 3/4–4/3) and
    /// RandomHorizontalFlip, no erasing, resized with `interpolation`.
    pub fn random_resized_crop(size: u32, interpolation: Interpolation) -> Self {
        Transform::Train {
            size,
            scale: (0.08, 1.0),
            ratio: (3.0 / 4.0, 4.0 / 3.0),
            hflip: true,
            erase: None,
            pad: None,
            interpolation,
            color_jitter: None,
            policy: None,
        }
    }

    /// The training transform with `p` after its flip.
    pub fn with_policy(mut self, p: AutoPolicy) -> Self {
        if let Transform::Train { policy, .. } = &mut self {
            *policy = Some(p);
        }
        self
    }

    /// Resize(resize) (the shorter side) + CenterCrop(size), resized with `interpolation`.
    pub fn eval(size: u32, resize: u32, interpolation: Interpolation) -> Self {
        Transform::Eval { size, resize, interpolation }
    }

    pub fn size(&self) -> u32 {
        match self {
            Transform::Train { size, .. } | Transform::Eval { size, .. } => *size,
        }
    }

    /// The resize filter (`--interpolation`).
    pub fn interpolation(&self) -> Interpolation {
        match self {
            Transform::Train { interpolation, .. } | Transform::Eval { interpolation, .. } => *interpolation,
        }
    }

    /// The size a JPEG may be shrunk toward while decoding (`decode_bytes_for`'s `shrink_to`):
    /// the output size, or none for nearest neighbour, which takes single source pixels where a
    /// 1/8-size decode would hold the means of 8×8 blocks.
    pub fn jpeg_shrink_to(&self) -> Option<u32> {
        (self.interpolation() != Interpolation::Nearest).then_some(self.size())
    }

    /// The source pixels nearest-neighbour resizing takes for box `bx` (from `source_box`) of a
    /// w×h image, as torchvision's transforms on a PIL image take them: the evaluation box as
    /// the centre crop of the whole image resized, the padded crop's as the whole image
    /// resized, RandomResizedCrop's as its box cut out, then resized. The image is the whole
    /// decoded one (`jpeg_shrink_to` shrinks none for nearest neighbour).
    pub fn nearest_indices(&self, w: u32, h: u32, bx: CropBox) -> NearestIndices {
        let n = self.size();
        match *self {
            Transform::Eval { size, resize, .. } => {
                let (nw, nh, left, top) = resize_center_crop(w, h, resize, size);
                NearestIndices {
                    cols: pil_nearest_axis(w as f64, nw, left as u32, n),
                    rows: pil_nearest_axis(h as f64, nh, top as u32, n),
                }
            }
            Transform::Train { .. } => {
                let axis = |start: f64, len: f64, limit: u32| -> Vec<usize> {
                    let last = limit.max(1) as usize - 1;
                    let start = start.max(0.0) as usize;
                    pil_nearest_axis(len, n as f64, 0, n).into_iter().map(|i| (start + i).min(last)).collect()
                };
                NearestIndices {
                    cols: axis(bx.left, bx.width, w),
                    rows: axis(bx.top, bx.height, h),
                }
            }
        }
    }

    /// Applies the transform into `out` (size*size*3 bytes), drawing randomness from `rng`.
    pub fn apply(&self, img: &RgbImage, rng: &mut impl Rng, out: &mut [u8]) -> Result<()> {
        let bx = self.source_box(img.width(), img.height(), rng);
        self.finish(img.into(), bx, rng, out)
    }

    /// Step one: the box of a w×h source image that becomes the output (the first draws from
    /// `rng`). Known before decoding, so a decoder can shrink the image while decoding.
    pub fn source_box(&self, w: u32, h: u32, rng: &mut impl Rng) -> CropBox {
        match *self {
            Transform::Train { pad: Some(_), .. } => CropBox::whole(w, h),
            Transform::Train { scale, ratio, .. } => random_resized_crop_box(w, h, scale, ratio, rng),
            Transform::Eval { size, resize, .. } => resize_center_crop_box(w, h, resize, size),
        }
    }

    /// The resize of step two alone: `bx` of `img` to size×size into `out`, with the filter,
    /// the box cut out first for RandomResizedCrop.
    pub fn resize_into(&self, img: RgbView<'_>, bx: CropBox, out: &mut [u8]) -> Result<()> {
        match (self, self.interpolation()) {
            (_, Interpolation::Nearest) => nearest_into(img, &self.nearest_indices(img.width, img.height, bx), out),
            (Transform::Train { pad: None, .. }, f) => resize_cut_box_into(img, bx, self.size(), f, out)?,
            (_, f) => resize_box_into(img, bx, self.size(), f, out)?,
        }
        Ok(())
    }

    /// Step two: resize `bx` of `img` into `out`, then flip and erase (the remaining draws).
    pub fn finish(&self, img: RgbView<'_>, bx: CropBox, rng: &mut impl Rng, out: &mut [u8]) -> Result<()> {
        self.resize_into(img, bx, out)?;
        if let Transform::Train {
            size,
            ref erase,
            ref color_jitter,
            ref policy,
            ..
        } = *self
        {
            let moves = self.moves(rng);
            if let Some((dx, dy)) = moves.shift {
                shift_with_zero_fill(out, size as usize, dx, dy);
            }
            if moves.flip {
                flip_horizontal(out, size as usize);
            }
            if let Some(j) = color_jitter {
                j.apply(out, size as usize, rng);
            }
            if let Some(p) = policy {
                p.apply(out, size as usize, rng);
            }
            if let Some(e) = erase {
                e.apply(out, size as usize, rng);
            }
        }
        Ok(())
    }

    /// The training draws after the box, in `finish`'s order: the padded crop's shift (output
    /// pixel (x, y) takes input (x + dx, y + dy)), then the flip. The device-side augmentation
    /// (`load/on_device.rs`) draws them here too, so both paths make the same choices.
    pub fn moves(&self, rng: &mut impl Rng) -> Moves {
        let Transform::Train { hflip, pad, .. } = *self else {
            return Moves::default();
        };
        let shift = pad.map(|pad| {
            let (dx, dy) = (rng.gen_range(0..=2 * pad), rng.gen_range(0..=2 * pad));
            (dx as i64 - pad as i64, dy as i64 - pad as i64)
        });
        Moves {
            shift,
            flip: hflip && rng.gen_bool(0.5),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn random_crop_boxes_stay_inside_and_respect_scale() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        for _ in 0..2000 {
            let b = random_resized_crop_box(150, 100, (0.08, 1.0), (0.75, 4.0 / 3.0), &mut rng);
            assert!(b.left >= 0.0 && b.top >= 0.0);
            assert!(b.left + b.width <= 150.0 && b.top + b.height <= 100.0);
            assert!(b.width * b.height >= 0.05 * 15000.0);
        }
    }

    #[test]
    fn center_crop_box_matches_torchvision_arithmetic() {
        // 150x100 -> Resize(146) -> 219x146 -> CenterCrop(128): top 9, left 46 (in resized px).
        let b = resize_center_crop_box(150, 100, 146, 128);
        let s = 100.0 / 146.0;
        assert!((b.top - 9.0 * s).abs() < 1e-9 && (b.height - 128.0 * s).abs() < 1e-9);
        assert!((b.left - 46.0 * 150.0 / 219.0).abs() < 1e-9);
    }

    #[test]
    fn padded_crop_shifts_and_fills_with_zero() {
        // 3x3 image, pixel value = 10*y + x in every channel; shift by (1, -1).
        let mut buf: Vec<u8> = (0..9).flat_map(|i| [(10 * (i / 3) + i % 3) as u8; 3]).collect();
        shift_with_zero_fill(&mut buf, 3, 1, -1);
        let got: Vec<u8> = buf.chunks(3).map(|p| p[0]).collect();
        assert_eq!(got, vec![0, 0, 0, 1, 2, 0, 11, 12, 0]);
    }

    #[test]
    fn nearest_neighbour_takes_pils_pixels() {
        // PIL's `Image.resize((22, 1), NEAREST)` of a row 0..19: output 16 lies at exactly 15.0,
        // where PIL's accumulated sum falls just below and takes 14.
        let pil: Vec<usize> = vec![0, 1, 2, 3, 4, 5, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 14, 15, 16, 17, 18, 19];
        assert_eq!(pil_nearest_axis(20.0, 22.0, 0, 22), pil);
        assert_eq!(pil_nearest_axis(20.0, 22.0, 1, 20), pil[1..21]);
        assert_eq!(pil_nearest_axis(7.0, 7.0, 0, 7), (0..7).collect::<Vec<_>>());
        // A centre crop of 73 px resized from 150 takes columns 9..73 of the resized image.
        let t = Transform::eval(64, 73, Interpolation::Nearest);
        let idx = t.nearest_indices(150, 150, resize_center_crop_box(150, 150, 73, 64));
        assert_eq!(idx.cols, pil_nearest_axis(150.0, 73.0, 0, 73)[4..68]);
        assert_eq!(idx.rows, idx.cols);
    }

    #[test]
    fn flip_mirrors_rows() {
        let mut buf: Vec<u8> = (0..2 * 2 * 3).map(|x| x as u8).collect();
        flip_horizontal(&mut buf, 2);
        assert_eq!(buf, vec![3, 4, 5, 0, 1, 2, 9, 10, 11, 6, 7, 8]);
    }

    #[test]
    fn erasing_is_deterministic_per_rng_and_p_zero_is_no_erasing() {
        use super::super::erasing::{EraseMode, RandomErasing};
        let img = RgbImage::from_fn(40, 30, |x, y| image::Rgb([x as u8 * 5, y as u8 * 7, 200]));
        let train = |erase| Transform::Train {
            size: 24,
            scale: (0.5, 1.0),
            ratio: (0.75, 4.0 / 3.0),
            hflip: true,
            erase,
            pad: None,
            interpolation: Interpolation::Bilinear,
            color_jitter: None,
            policy: None,
        };
        let erase = |p| {
            Some(RandomErasing {
                p,
                mode: EraseMode::Pixel,
                mean: crate::data::IMAGENET_MEAN,
                std: crate::data::IMAGENET_STD,
            })
        };
        let run = |t: &Transform, seed| {
            let mut out = vec![0u8; 24 * 24 * 3];
            t.apply(&img, &mut rand_chacha::ChaCha8Rng::seed_from_u64(seed), &mut out)
                .unwrap();
            out
        };
        let (plain, off, on) = (train(None), train(erase(0.0)), train(erase(1.0)));
        for seed in 0..20 {
            assert_eq!(run(&plain, seed), run(&off, seed));
            assert_eq!(run(&on, seed), run(&on, seed));
            assert_ne!(run(&on, seed), run(&plain, seed));
        }
    }

    #[test]
    fn eval_transform_of_constant_image_is_constant() {
        let img = RgbImage::from_pixel(90, 60, image::Rgb([9, 200, 31]));
        for interpolation in Interpolation::ALL.iter().copied() {
            let mut out = vec![0u8; 32 * 32 * 3];
            let t = Transform::eval(32, 36, interpolation);
            t.apply(&img, &mut rand_chacha::ChaCha8Rng::seed_from_u64(0), &mut out)
                .unwrap();
            assert!(out.chunks(3).all(|p| p == [9, 200, 31]), "{interpolation}");
        }
    }
}
