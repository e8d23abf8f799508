//! The operations of timm's RandAugment (`timm_rand.rs`) as PIL computes them on an RGB image,
//! where PIL's arithmetic is not torchvision's (`ops.rs`): its affine transform (bilinear or
//! bicubic in doubles, edges clamped, a fill colour outside the image, truncated), its
//! ImageEnhance blends (float32, truncated), ImageOps.autocontrast's table and timm's
//! solarize-add table. `tests/augment_policies.rs` checks them against timm's calls of PIL.
use super::ops::Image;
use super::rounding::{floor_f32, floor_f64, int_f32, int_f64};

/// PIL's resampling filters for `Image.transform`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Filter {
    Nearest,
    Bilinear,
    Bicubic,
}

/// `Image.transform(size, AFFINE, a, filter, fillcolor=fill)`: output pixel (x, y) samples the
/// input at (a0·x' + a1·y' + a2, a3·x' + a4·y' + a5), x' = x + 0.5, y' = y + 0.5 (PIL's
/// generic transform with its bilinear or bicubic filter; nearest as that path's filter).
pub fn affine(img: &mut Image, a: [f64; 6], filter: Filter, fill: [u8; 3]) {
    if filter == Filter::Bilinear {
        return affine_bilinear(img, a, fill);
    }
    let (w, h) = (img.w, img.h);
    let src = img.px.to_vec();
    for y in 0..h {
        for x in 0..w {
            let (xo, yo) = (x as f64 + 0.5, y as f64 + 0.5);
            let xin = a[0] * xo + a[1] * yo + a[2];
            let yin = a[3] * xo + a[4] * yo + a[5];
            let out = &mut img.px[(y * w + x) * 3..(y * w + x) * 3 + 3];
            if xin < 0.0 || xin >= w as f64 || yin < 0.0 || yin >= h as f64 {
                out.copy_from_slice(&fill);
                continue;
            }
            match filter == Filter::Nearest {
                true => {
                    let o = (yin as usize * w + xin as usize) * 3;
                    out.copy_from_slice(&src[o..o + 3]);
                }
                false => bicubic(&src, w, h, xin, yin, out),
            }
        }
    }
}

crate::multiversion! {
    /// `affine` with PIL's bilinear filter (`bilinear_filter32RGB`: the four neighbours clamped
    /// to the image, two lerps along x and one along y in doubles, truncated), a row at a time in
    /// passes that vectorise: the points and weights; the neighbours from a copy whose edge rows
    /// and columns are repeated once outside (so the clamped neighbours are always adjacent
    /// there), two 8-byte loads a pixel; then each channel's lerps. The same double operations
    /// in the same order as pixel by pixel.
    fn affine_bilinear / affine_bilinear_baseline(img: &mut Image, a: [f64; 6], fill: [u8; 3]) {
        let (w, h) = (img.w, img.h);
        let (wf, hf) = (w as f64, h as f64);
        let stride = (w + 2) * 3;
        // Eight bytes of slack at the end: a pixel and its east neighbour are read as one word.
        let mut src = vec![0u8; stride * (h + 2) + 8];
        for (py, padded) in src.chunks_exact_mut(stride).enumerate() {
            let y = py.saturating_sub(1).min(h - 1);
            let row = &img.px[y * w * 3..(y + 1) * w * 3];
            padded[..3].copy_from_slice(&row[..3]);
            padded[3..3 + w * 3].copy_from_slice(row);
            padded[3 + w * 3..].copy_from_slice(&row[(w - 1) * 3..]);
        }
        let (mut inside, mut at) = (vec![false; w], vec![0u32; w]);
        let (mut dx, mut dy) = (vec![0f64; w], vec![0f64; w]);
        // Per pixel of a row: its four neighbours' RGB (north-west, north-east, south-west,
        // south-east) as the low three bytes of a word, and per channel the result.
        let mut near: [Vec<u32>; 4] = std::array::from_fn(|_| vec![0; w]);
        let mut value: [Vec<u8>; 3] = std::array::from_fn(|_| vec![0; w]);
        for y in 0..h {
            let yo = y as f64 + 0.5;
            for x in 0..w {
                let xo = x as f64 + 0.5;
                let (xin, yin) = (a[0] * xo + a[1] * yo + a[2], a[3] * xo + a[4] * yo + a[5]);
                inside[x] = xin >= 0.0 && xin < wf && yin >= 0.0 && yin < hf;
                // A point outside is filled below; (0, 0) keeps its reads inside the copy.
                let (xs, ys) = match inside[x] {
                    true => (xin - 0.5, yin - 0.5),
                    false => (0.0, 0.0),
                };
                let (fx, fy) = (floor_f64(xs), floor_f64(ys));
                [dx[x], dy[x]] = [xs - fx, ys - fy];
                // floor(xs) ≥ -1: column -1 of the image is column 0 of the copy.
                at[x] = (int_f64(fy) + 1) as u32 * stride as u32 + (int_f64(fx) + 1) as u32 * 3;
            }
            let word = |o: usize| u64::from_le_bytes(src[o..o + 8].try_into().unwrap());
            for (x, &o) in at.iter().enumerate() {
                let (top, bottom) = (word(o as usize), word(o as usize + stride));
                // Bytes 0-2 of each word are the west pixel, bytes 3-5 the east one.
                [near[0][x], near[1][x]] = [top as u32, (top >> 24) as u32];
                [near[2][x], near[3][x]] = [bottom as u32, (bottom >> 24) as u32];
            }
            let lerp = |a: f64, b: f64, d: f64| a + (b - a) * d;
            // Every slice cut to the row's length, so the loop has no bounds tests.
            let [nw, ne, sw, se] = [&near[0][..w], &near[1][..w], &near[2][..w], &near[3][..w]];
            let (dx, dy) = (&dx[..w], &dy[..w]);
            for (c, value) in value.iter_mut().enumerate() {
                let (shift, value) = (8 * c, &mut value[..w]);
                let byte = |v: &[u32], i: usize| ((v[i] >> shift) & 0xff) as f64;
                for i in 0..w {
                    let v1 = lerp(byte(nw, i), byte(ne, i), dx[i]);
                    let v2 = lerp(byte(sw, i), byte(se, i), dx[i]);
                    // Within 0..255, so truncation is the floor, as PIL truncates.
                    value[i] = int_f64(floor_f64(lerp(v1, v2, dy[i]))) as u8;
                }
            }
            for (x, out) in img.px[y * w * 3..(y + 1) * w * 3].chunks_exact_mut(3).enumerate() {
                out.copy_from_slice(&match inside[x] {
                    true => [value[0][x], value[1][x], value[2][x]],
                    false => fill,
                });
            }
        }
    }
}

/// PIL's `FLOOR`: toward minus infinity.
fn floor(v: f64) -> i64 {
    v.floor() as i64
}

fn clip(v: i64, size: usize) -> usize {
    v.clamp(0, size as i64 - 1) as usize
}

/// `bicubic_filter32RGB`: PIL's cubic (a = -1) over 4×4 clamped neighbours, rows past the
/// edges repeating the last one computed, clipped to 0..255 and truncated.
fn bicubic(src: &[u8], w: usize, h: usize, xin: f64, yin: f64, out: &mut [u8]) {
    let (xin, yin) = (xin - 0.5, yin - 0.5);
    let (x, y) = (floor(xin), floor(yin));
    let (dx, dy) = (xin - x as f64, yin - y as f64);
    let (x, y) = (x - 1, y - 1);
    let cols = [clip(x, w), clip(x + 1, w), clip(x + 2, w), clip(x + 3, w)];
    let cubic = |v1: f64, v2: f64, v3: f64, v4: f64, d: f64| {
        let (p1, p2, p3, p4) = (v2, -v1 + v3, 2.0 * (v1 - v2) + v3 - v4, -v1 + v2 - v3 + v4);
        p1 + d * (p2 + d * (p3 + d * p4))
    };
    for (c, o) in out.iter_mut().enumerate() {
        let row = |r: usize| {
            let at = |col: usize| src[(r * w + col) * 3 + c] as f64;
            cubic(at(cols[0]), at(cols[1]), at(cols[2]), at(cols[3]), dx)
        };
        let inside = |k: i64| y + k >= 0 && y + k < h as i64;
        let v1 = row(clip(y, h));
        let v2 = if inside(1) { row((y + 1) as usize) } else { v1 };
        let v3 = if inside(2) { row((y + 2) as usize) } else { v2 };
        let v4 = if inside(3) { row((y + 3) as usize) } else { v3 };
        let v = cubic(v1, v2, v3, v4, dy);
        *o = if v <= 0.0 {
            0
        } else if v >= 255.0 {
            255
        } else {
            v as u8
        };
    }
}

/// `Image.rotate(degrees, filter, fillcolor=fill)` without expand: about the centre,
/// counter-clockwise, through its affine matrix (rounded to 15 decimals as PIL rounds it); 0
/// degrees is a copy (PIL's quarter and half turns, exact transposes there, are exact here too:
/// their matrices are whole numbers).
pub fn rotate(img: &mut Image, degrees: f64, filter: Filter, fill: [u8; 3]) {
    // Python's angle % 360 (in 0..360), as PIL takes it before the matrix.
    let degrees = degrees.rem_euclid(360.0);
    if degrees == 0.0 {
        return;
    }
    // Python's round(v, 15): the nearest double to v correctly rounded to 15 decimals.
    let round15 = |v: f64| format!("{v:.15}").parse::<f64>().expect("a formatted number");
    let angle = -degrees.to_radians();
    let (cos, sin) = (round15(angle.cos()), round15(angle.sin()));
    let (cx, cy) = (img.w as f64 / 2.0, img.h as f64 / 2.0);
    let mut m = [cos, sin, 0.0, -sin, cos, 0.0];
    m[2] = m[0] * -cx + m[1] * -cy + m[2] + cx;
    m[5] = m[3] * -cx + m[4] * -cy + m[5] + cy;
    affine(img, m, filter, fill);
}

/// `ImagingBlend(degenerate, image, alpha)`: degenerate + alpha·(image - degenerate) in
/// float32, truncated (clipped to 0..255 when alpha extrapolates).
#[inline(always)]
fn blend(degenerate: u8, v: u8, alpha: f32) -> u8 {
    let t = degenerate as i32 as f32 + alpha * (v as i32 - degenerate as i32) as f32;
    // Non-negative once clipped: truncation is the floor.
    int_f32(floor_f32(t.clamp(0.0, 255.0))) as u8
}

/// PIL's "L" of an RGB pixel: ITU-R 601-2 luma in 16-bit fixed point, rounded.
#[inline(always)]
fn luma(p: &[u8]) -> u8 {
    ((p[0] as u32 * 19595 + p[1] as u32 * 38470 + p[2] as u32 * 7471 + 0x8000) >> 16) as u8
}

/// Every value blended with one `degenerate` value: a table of the 256 results.
fn blend_all(img: &mut Image, degenerate: u8, alpha: f32) {
    let lut: Vec<u8> = (0..=255u8).map(|v| blend(degenerate, v, alpha)).collect();
    img.px.iter_mut().for_each(|v| *v = lut[*v as usize]);
}

/// `ImageEnhance.Brightness(img).enhance(f)`: blended with black.
pub fn brightness(img: &mut Image, f: f64) {
    blend_all(img, 0, f as f32);
}

crate::multiversion! {
    /// `ImageEnhance.Color(img).enhance(f)`: blended with its own "L" image.
    pub fn color / color_baseline(img: &mut Image, f: f64) {
        let alpha = f as f32;
        for p in img.px.chunks_exact_mut(3) {
            let l = luma(p);
            p.iter_mut().for_each(|v| *v = blend(l, *v, alpha));
        }
    }
}

/// `ImageEnhance.Contrast(img).enhance(f)`: blended with the mean of the "L" image, rounded.
pub fn contrast(img: &mut Image, f: f64) {
    let n = img.px.len() / 3;
    let sum: u64 = img.px.chunks_exact(3).map(|p| luma(p) as u64).sum();
    let mean = (sum as f64 / n as f64 + 0.5) as u8;
    blend_all(img, mean, f as f32);
}

crate::multiversion! {
    /// `ImageEnhance.Sharpness(img).enhance(f)`: blended with `ImageFilter.SMOOTH` (1s around a
    /// 5, over 13, rounded; the border rows and columns are the image's own, so stay).
    pub fn sharpness / sharpness_baseline(img: &mut Image, f: f64) {
        let alpha = f as f32;
        super::ops::smooth_and_blend(img, |smooth, v| blend(smooth as u8, v, alpha));
    }
}

/// `ImageOps.autocontrast(img)`: each channel's lowest and highest value stretched to 0..255 by
/// a table in doubles, truncated; a channel of one value is left as it is.
pub fn autocontrast(img: &mut Image) {
    for c in 0..3 {
        let (lo, hi) = img.px.iter().skip(c).step_by(3).fold((255u8, 0u8), |(lo, hi), &v| (lo.min(v), hi.max(v)));
        if hi <= lo {
            continue;
        }
        let scale = 255.0 / (hi - lo) as f64;
        let offset = -(lo as f64) * scale;
        let lut: Vec<u8> = (0..256).map(|i| (i as f64 * scale + offset).clamp(0.0, 255.0) as i64 as u8).collect();
        img.px.iter_mut().skip(c).step_by(3).for_each(|v| *v = lut[*v as usize]);
    }
}

/// timm's `solarize_add`: `add` added to the values below `threshold`, capped at 255.
pub fn solarize_add(img: &mut Image, add: u32, threshold: u32) {
    img.px.iter_mut().filter(|v| (**v as u32) < threshold).for_each(|v| *v = (*v as u32 + add).min(255) as u8);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `bilinear_filter32RGB`, pixel by pixel, as `affine` computed it before its passes: rows
    /// and columns clamped to the image, the lower row replaced by the upper one past the bottom
    /// edge, truncated to u8.
    fn bilinear(src: &[u8], w: usize, h: usize, xin: f64, yin: f64, out: &mut [u8]) {
        let (xin, yin) = (xin - 0.5, yin - 0.5);
        let (x, y) = (floor(xin), floor(yin));
        let (dx, dy) = (xin - x as f64, yin - y as f64);
        let (x0, x1) = (clip(x, w), clip(x + 1, w));
        let lerp = |a: f64, b: f64, d: f64| a + (b - a) * d;
        for (c, o) in out.iter_mut().enumerate() {
            let at = |row: usize, col: usize| src[(row * w + col) * 3 + c] as f64;
            let r0 = clip(y, h);
            let v1 = lerp(at(r0, x0), at(r0, x1), dx);
            let v2 = match y + 1 >= 0 && y + 1 < h as i64 {
                true => lerp(at((y + 1) as usize, x0), at((y + 1) as usize, x1), dx),
                false => v1,
            };
            *o = lerp(v1, v2, dy) as u8;
        }
    }

    /// `affine`'s bilinear case pixel by pixel.
    fn affine_bilinear_direct(img: &mut Image, a: [f64; 6], fill: [u8; 3]) {
        let (w, h) = (img.w, img.h);
        let src = img.px.to_vec();
        for y in 0..h {
            for x in 0..w {
                let (xo, yo) = (x as f64 + 0.5, y as f64 + 0.5);
                let (xin, yin) = (a[0] * xo + a[1] * yo + a[2], a[3] * xo + a[4] * yo + a[5]);
                let out = &mut img.px[(y * w + x) * 3..(y * w + x) * 3 + 3];
                match xin < 0.0 || xin >= w as f64 || yin < 0.0 || yin >= h as f64 {
                    true => out.copy_from_slice(&fill),
                    false => bilinear(&src, w, h, xin, yin, out),
                }
            }
        }
    }

    /// The passes (and their baseline build) give the pixel-by-pixel bytes, on the sizes and
    /// matrices torchvision's sampling is tested on.
    #[test]
    fn bilinear_passes_are_the_pixel_by_pixel_filter() {
        for (w, h, orig, a) in crate::data::augment::ops::tests::sampling_cases(11) {
            let want = {
                let mut px = orig.clone();
                affine_bilinear_direct(&mut Image { w, h, px: &mut px }, a, [1, 2, 3]);
                px
            };
            for f in [affine_bilinear, affine_bilinear_baseline] {
                let mut px = orig.clone();
                f(&mut Image { w, h, px: &mut px }, a, [1, 2, 3]);
                assert_eq!(px, want, "{w}x{h} {a:?}");
            }
        }
    }

    /// The blends' AVX2 builds give the baseline builds' bytes (timm's own test, against PIL,
    /// runs only the build this CPU picks).
    #[test]
    fn the_avx2_builds_give_the_baselines_bits() {
        let (w, h) = (23, 11);
        let orig: Vec<u8> = (0..w * h * 3).map(|i| (i * 97 % 256) as u8).collect();
        type Op = fn(&mut Image, f64);
        let ops: [(Op, Op); 2] = [(color, color_baseline), (sharpness, sharpness_baseline)];
        for (fast, baseline) in ops {
            for f in [0.0, 0.1, 0.9, 1.0, 1.37, 1.9] {
                let (mut a, mut b) = (orig.clone(), orig.clone());
                fast(&mut Image { w, h, px: &mut a }, f);
                baseline(&mut Image { w, h, px: &mut b }, f);
                assert_eq!(a, b, "{f}");
            }
        }
    }

    #[test]
    fn identity_matrices_and_whole_turns_keep_every_pixel() {
        let (w, h) = (6, 5);
        let orig: Vec<u8> = (0..w * h * 3).map(|i| (i * 37 % 251) as u8).collect();
        for filter in [Filter::Nearest, Filter::Bilinear, Filter::Bicubic] {
            let mut px = orig.clone();
            affine(&mut Image { w, h, px: &mut px }, [1.0, 0.0, 0.0, 0.0, 1.0, 0.0], filter, [1, 2, 3]);
            assert_eq!(px, orig, "{filter:?}");
            rotate(&mut Image { w, h, px: &mut px }, 0.0, filter, [1, 2, 3]);
            assert_eq!(px, orig, "{filter:?}");
        }
        // A half turn is PIL's transpose: every pixel at the opposite end.
        let mut px = orig.clone();
        rotate(&mut Image { w, h, px: &mut px }, -180.0, Filter::Bilinear, [1, 2, 3]);
        let reversed: Vec<u8> = orig.chunks_exact(3).rev().flatten().copied().collect();
        assert_eq!(px, reversed);
        // A shift by whole pixels moves them and fills the rest.
        let mut px = orig.clone();
        affine(&mut Image { w, h, px: &mut px }, [1.0, 0.0, 2.0, 0.0, 1.0, 0.0], Filter::Bilinear, [1, 2, 3]);
        assert_eq!(px[..3], orig[6..9]);
        assert_eq!(px[(w - 1) * 3..w * 3], [1, 2, 3]);
    }
}
