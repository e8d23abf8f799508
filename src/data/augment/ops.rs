//! The operations of the augmentation policies (`policy.rs`) on one uint8 RGB image (HWC, w×h),
//! each computed as `torchvision.transforms.v2.functional` computes it on a uint8 tensor: the
//! same float32 arithmetic in the same order, the same rounding (geometric ops round to nearest;
//! colour ops truncate, as `.to(torch.uint8)` does) and zero fill outside the image (the policies'
//! default `fill=None`). Integer ops (posterize, solarize, invert, equalize) are exact;
//! `tests/augment_policies.rs` states the bounds of the float ones.
use super::rounding::{floor_f32, int_f32, round_even_f32};

/// An operation of torchvision's augmentation spaces (its `transform_id`s).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Op {
    Identity,
    ShearX,
    ShearY,
    TranslateX,
    TranslateY,
    Rotate,
    Brightness,
    Color,
    Contrast,
    Sharpness,
    Posterize,
    Solarize,
    AutoContrast,
    Equalize,
    Invert,
}

impl Op {
    pub const ALL: [Op; 15] = [
        Op::Identity,
        Op::ShearX,
        Op::ShearY,
        Op::TranslateX,
        Op::TranslateY,
        Op::Rotate,
        Op::Brightness,
        Op::Color,
        Op::Contrast,
        Op::Sharpness,
        Op::Posterize,
        Op::Solarize,
        Op::AutoContrast,
        Op::Equalize,
        Op::Invert,
    ];

    /// torchvision's name of the operation.
    pub fn name(self) -> &'static str {
        match self {
            Op::Identity => "Identity",
            Op::ShearX => "ShearX",
            Op::ShearY => "ShearY",
            Op::TranslateX => "TranslateX",
            Op::TranslateY => "TranslateY",
            Op::Rotate => "Rotate",
            Op::Brightness => "Brightness",
            Op::Color => "Color",
            Op::Contrast => "Contrast",
            Op::Sharpness => "Sharpness",
            Op::Posterize => "Posterize",
            Op::Solarize => "Solarize",
            Op::AutoContrast => "AutoContrast",
            Op::Equalize => "Equalize",
            Op::Invert => "Invert",
        }
    }

    pub fn from_name(name: &str) -> Option<Op> {
        Op::ALL.into_iter().find(|o| o.name() == name)
    }
}

/// How the geometric operations sample: torchvision's tensor kernels take nearest or bilinear
/// only (its `grid_sample`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sampling {
    Nearest,
    Bilinear,
}

/// One image, row-major HWC RGB8, changed in place.
pub struct Image<'a> {
    pub w: usize,
    pub h: usize,
    pub px: &'a mut [u8],
}

/// `_AutoAugmentBase._apply_image_or_video_transform`: `op` with its signed `magnitude` (the
/// float value torchvision takes from its magnitude bins).
pub fn apply(op: Op, magnitude: f64, img: &mut Image, sampling: Sampling) {
    let degrees = |m: f64| m.atan().to_degrees();
    match op {
        Op::Identity => {}
        // The shears pivot on the top-left corner (torchvision's `center=[0, 0]`).
        Op::ShearX => affine(img, 0.0, [0.0, 0.0], [degrees(magnitude), 0.0], Some([0.0, 0.0]), sampling),
        Op::ShearY => affine(img, 0.0, [0.0, 0.0], [0.0, degrees(magnitude)], Some([0.0, 0.0]), sampling),
        // Python's `int()`: toward zero.
        Op::TranslateX => affine(img, 0.0, [magnitude.trunc(), 0.0], [0.0, 0.0], None, sampling),
        Op::TranslateY => affine(img, 0.0, [0.0, magnitude.trunc()], [0.0, 0.0], None, sampling),
        Op::Rotate => rotate(img, magnitude, sampling),
        Op::Brightness => brightness(img, 1.0 + magnitude),
        Op::Color => saturation(img, 1.0 + magnitude),
        Op::Contrast => contrast(img, 1.0 + magnitude),
        Op::Sharpness => sharpness(img, 1.0 + magnitude),
        Op::Posterize => posterize(img, magnitude as u32),
        Op::Solarize => solarize(img, 255.0 * magnitude),
        Op::AutoContrast => autocontrast(img),
        Op::Equalize => equalize(img),
        Op::Invert => img.px.iter_mut().for_each(|v| *v = !*v),
    }
}

/// `_get_inverse_affine_matrix`: output pixel to input pixel, both centred, as torchvision
/// computes it in doubles (scale 1).
fn inverse_affine_matrix(center: [f64; 2], angle: f64, translate: [f64; 2], shear: [f64; 2]) -> [f64; 6] {
    let rot = angle.to_radians();
    let (sx, sy) = (shear[0].to_radians(), shear[1].to_radians());
    let [cx, cy] = center;
    let [tx, ty] = translate;
    let cos_sy = sy.cos();
    let tan_sx = sx.tan();
    let rot_minus_sy = rot - sy;
    let (cx_plus_tx, cy_plus_ty) = (cx + tx, cy + ty);
    let a = rot_minus_sy.cos() / cos_sy;
    let b = -(a * tan_sx + rot.sin());
    let c = rot_minus_sy.sin() / cos_sy;
    let d = rot.cos() - c * tan_sx;
    let mut m = [d, -b, 0.0, -c, a, 0.0];
    m[2] += cx - m[0] * cx_plus_tx - m[1] * cy_plus_ty;
    m[5] += cy - m[3] * cx_plus_tx - m[4] * cy_plus_ty;
    m
}

/// `affine_image` with scale 1: `center` in pixels (None: the image's centre).
fn affine(img: &mut Image, angle: f64, translate: [f64; 2], shear: [f64; 2], center: Option<[f64; 2]>, sampling: Sampling) {
    let (w, h) = (img.w as f64, img.h as f64);
    let center = center.map_or([0.0, 0.0], |c| [c[0] - w * 0.5, c[1] - h * 0.5]);
    grid_transform(img, inverse_affine_matrix(center, angle, translate, shear), sampling);
}

/// `rotate_image` (no expand, the image's centre): its fast paths for 0 and 180 degrees, and 90
/// and 270 on a square image, move pixels exactly; other angles sample.
fn rotate(img: &mut Image, angle: f64, sampling: Sampling) {
    let angle = angle.rem_euclid(360.0);
    let square = img.w == img.h;
    let turns = match angle {
        a if a == 0.0 => return,
        a if a == 180.0 => 2,
        a if a == 90.0 && square => 1,
        a if a == 270.0 && square => 3,
        _ => return grid_transform(img, inverse_affine_matrix([0.0, 0.0], -angle, [0.0, 0.0], [0.0, 0.0]), sampling),
    };
    let src = img.px.to_vec();
    let (w, h) = (img.w, img.h);
    for y in 0..h {
        for x in 0..w {
            // torch.rot90 over (H, W): k=1 takes (x, W-1-y), k=2 (H-1-y, W-1-x), k=3 (H-1-x, y)
            // as (row, column) of the source.
            let (sy, sx) = match turns {
                1 => (x, w - 1 - y),
                2 => (h - 1 - y, w - 1 - x),
                _ => (h - 1 - x, y),
            };
            let (o, i) = ((y * w + x) * 3, (sy * w + sx) * 3);
            img.px[o..o + 3].copy_from_slice(&src[i..i + 3]);
        }
    }
}

/// torch.linspace(start, end, n) in float32, as a sequence of exact steps (its CPU kernel counts
/// from both ends; the values differ from these in the last bit at most).
fn linspace_f32(start: f32, end: f32, n: usize) -> impl Iterator<Item = f32> {
    let step = if n > 1 { (end - start) / (n - 1) as f32 } else { 0.0 };
    let half = n / 2;
    (0..n).map(move |i| match i < half {
        true => start + step * i as f32,
        false => end - step * (n - 1 - i) as f32,
    })
}

/// Zero pixels around the image in `grid_transform`'s copy: a sample point is clamped to within
/// this border, where every neighbour it reads outside the image is 0 (`padding_mode="zeros"`).
const BORDER: usize = 2;

multiversion! {
    /// `_affine_grid` then `_apply_grid_transform`: for each output pixel the input point the
    /// float32 matrix `theta` sends it to, sampled as `grid_sample(align_corners=False,
    /// padding_mode="zeros")` samples, rounded half to even.
    ///
    /// A row at a time, in passes that vectorise: the points, their floors and weights; the
    /// neighbours from a copy with a zero border (no bounds tests), two 8-byte loads a pixel;
    /// then each channel's weighted sums, rounding and conversion. The float operations are the
    /// scalar ones, in the same order.
    fn grid_transform / grid_transform_baseline(img: &mut Image, m: [f64; 6], sampling: Sampling) {
        let (w, h) = (img.w, img.h);
        let theta = m.map(|v| v as f32);
        let (hw, hh) = (0.5 * w as f32, 0.5 * h as f32);
        // theta transposed, divided by half the size: the grid in -1..1.
        let rt = [
            [theta[0] / hw, theta[3] / hh],
            [theta[1] / hw, theta[4] / hh],
            [theta[2] / hw, theta[5] / hh],
        ];
        let xs: Vec<f32> = linspace_f32((1.0 - w as f32) * 0.5, (w as f32 - 1.0) * 0.5, w).collect();
        let ys: Vec<f32> = linspace_f32((1.0 - h as f32) * 0.5, (h as f32 - 1.0) * 0.5, h).collect();
        let stride = (w + 2 * BORDER) * 3;
        // Eight bytes of slack at the end: a pixel and its east neighbour are read as one word.
        let mut src = vec![0u8; stride * (h + 2 * BORDER) + 8];
        for (y, row) in img.px.chunks_exact(w * 3).enumerate() {
            let o = (y + BORDER) * stride + BORDER * 3;
            src[o..o + w * 3].copy_from_slice(row);
        }
        let (wf, hf) = (w as f32, h as f32);
        // A point further out than the border reads only zeros; clamped there, its floor stays
        // exact and its offset inside the copy.
        let (lo, x_hi, y_hi) = (-(BORDER as f32) - 1.0, wf + 1.0, hf + 1.0);
        let (b, xmax, ymax) = (BORDER as f32, wf, hf);
        let (mut ix, mut iy) = (vec![0f32; w], vec![0f32; w]);
        // Per pixel of a row: the offset of its north-west neighbour in `src`, the four
        // neighbours' weights (north-west, north-east, south-west, south-east), their RGB as
        // the low three bytes of a word, and per channel the result.
        let mut at = vec![0u32; w];
        let mut weight: [Vec<f32>; 4] = std::array::from_fn(|_| vec![0.0; w]);
        let mut near: [Vec<u32>; 4] = std::array::from_fn(|_| vec![0; w]);
        let mut value: [Vec<u8>; 3] = std::array::from_fn(|_| vec![0; w]);
        for (j, &y) in ys.iter().enumerate() {
            for (i, &x) in xs.iter().enumerate() {
                let gx = x * rt[0][0] + y * rt[1][0] + rt[2][0];
                let gy = x * rt[0][1] + y * rt[1][1] + rt[2][1];
                // Unnormalised, corners not aligned: ((g + 1) * size - 1) / 2.
                ix[i] = ((gx + 1.0) * (wf / 2.0) - 0.5).clamp(lo, x_hi);
                iy[i] = ((gy + 1.0) * (hf / 2.0) - 0.5).clamp(lo, y_hi);
            }
            let out = &mut img.px[j * w * 3..(j + 1) * w * 3];
            // In u32 arithmetic, which vectorises (usize products do not, on AVX2).
            let offset = |x: f32, y: f32| {
                let (x, y) = (int_f32(x.clamp(-b, xmax)) + BORDER as i32, int_f32(y.clamp(-b, ymax)) + BORDER as i32);
                y as u32 * stride as u32 + x as u32 * 3
            };
            if sampling == Sampling::Nearest {
                for i in 0..w {
                    at[i] = offset(round_even_f32(ix[i]), round_even_f32(iy[i]));
                }
                for (o, &a) in out.chunks_exact_mut(3).zip(&at) {
                    o.copy_from_slice(&src[a as usize..a as usize + 3]);
                }
                continue;
            }
            for i in 0..w {
                let (x0, y0) = (floor_f32(ix[i]), floor_f32(iy[i]));
                let (we, ns) = (ix[i] - x0, iy[i] - y0);
                let (ww, nn) = (1.0 - we, 1.0 - ns);
                [weight[0][i], weight[1][i], weight[2][i], weight[3][i]] = [nn * ww, nn * we, ns * ww, ns * we];
                at[i] = offset(x0, y0);
            }
            let word = |o: usize| u64::from_le_bytes(src[o..o + 8].try_into().unwrap());
            for (i, &a) in at.iter().enumerate() {
                let (top, bottom) = (word(a as usize), word(a as usize + stride));
                // Bytes 0-2 of each word are the west pixel, bytes 3-5 the east one.
                [near[0][i], near[1][i]] = [top as u32, (top >> 24) as u32];
                [near[2][i], near[3][i]] = [bottom as u32, (bottom >> 24) as u32];
            }
            // Every slice cut to the row's length, so the loop has no bounds tests.
            let [nw, ne, sw, se] = [&near[0][..w], &near[1][..w], &near[2][..w], &near[3][..w]];
            let [wa, wb, wc, wd] = [&weight[0][..w], &weight[1][..w], &weight[2][..w], &weight[3][..w]];
            for (c, value) in value.iter_mut().enumerate() {
                let (shift, value) = (8 * c, &mut value[..w]);
                let byte = |v: &[u32], i: usize| ((v[i] >> shift) & 0xff) as f32;
                for i in 0..w {
                    // torch's order of the sum: north-west, north-east, south-west, south-east.
                    let v = byte(nw, i) * wa[i] + byte(ne, i) * wb[i] + byte(sw, i) * wc[i] + byte(se, i) * wd[i];
                    // Clamped first, as torch does.
                    value[i] = int_f32(round_even_f32(v).clamp(0.0, 255.0)) as u8;
                }
            }
            for (i, o) in out.chunks_exact_mut(3).enumerate() {
                o.copy_from_slice(&[value[0][i], value[1][i], value[2][i]]);
            }
        }
    }
}

/// `.clamp_(0, 255).to(torch.uint8)`: truncation toward zero.
#[inline(always)]
fn to_u8(v: f32) -> u8 {
    v.clamp(0.0, 255.0) as u8
}

multiversion! {
    /// `adjust_brightness_image`: each value times the factor.
    pub fn brightness / brightness_baseline(img: &mut Image, factor: f64) {
        let f = factor as f32;
        img.px.iter_mut().for_each(|v| *v = to_u8(*v as f32 * f));
    }
}

/// `_blend`: x·ratio + other·(1 - ratio), the second term fused into the sum as torch's
/// vectorised `add_(other, alpha)` fuses it.
#[inline(always)]
fn blend(x: u8, other: f32, ratio: f32, alpha: f32) -> u8 {
    to_u8(other.mul_add(alpha, x as f32 * ratio))
}

/// `_rgb_to_grayscale_image` of a pixel in float32, floored as the uint8 path floors it.
#[inline(always)]
fn gray(p: &[u8]) -> f32 {
    let l = p[0] as f32 * 0.2989f32;
    let l = (p[1] as f32).mul_add(0.587, l);
    (p[2] as f32).mul_add(0.114, l).floor()
}

multiversion! {
    /// `adjust_saturation_image`: each pixel blended with its own grey.
    pub fn saturation / saturation_baseline(img: &mut Image, factor: f64) {
        let (r, a) = (factor as f32, (1.0 - factor) as f32);
        for p in img.px.chunks_exact_mut(3) {
            let g = gray(p);
            p.iter_mut().for_each(|v| *v = blend(*v, g, r, a));
        }
    }
}

multiversion! {
    /// `adjust_contrast_image`: each value blended with the mean grey of the whole image (one
    /// table of the 256 values' results).
    pub fn contrast / contrast_baseline(img: &mut Image, factor: f64) {
        let n = img.px.len() / 3;
        let sum: f64 = img.px.chunks_exact(3).map(|p| gray(p) as f64).sum();
        let mean = sum as f32 / n as f32;
        let (r, a) = (factor as f32, (1.0 - factor) as f32);
        let lut: Vec<u8> = (0..=255u8).map(|v| blend(v, mean, r, a)).collect();
        img.px.iter_mut().for_each(|v| *v = lut[*v as usize]);
    }
}

multiversion! {
    /// `adjust_sharpness_image`: the inner pixels blended with a 3×3 smoothing (1s around a 5,
    /// over 13, rounded); the border rows and columns stay. torch convolves in float32 and rounds;
    /// here the sum is whole numbers, (8 neighbours + 5·centre) / 13 rounded: the same value,
    /// since a 13th is never within float32's error of a half (the nearest is 1/26 away).
    fn sharpness / sharpness_baseline(img: &mut Image, factor: f64) {
        let alpha = (1.0 - factor) as f32;
        smooth_and_blend(img, |blur, v| {
            let v = v as f32;
            to_u8((blur as f32 - v).mul_add(alpha, v))
        });
    }
}

/// The inner values of `img` (not its border rows and columns), each replaced by
/// `blend(its 3×3 smoothing, itself)`: the smoothing is (1s around a 5) / 13 rounded, in whole
/// numbers. A row at a time, each value's neighbours at ±3 in the rows above, at and below it
/// (sharpness, torchvision's and PIL's). Inlined, so it is built for AVX2 inside its callers.
#[inline(always)]
pub(super) fn smooth_and_blend(img: &mut Image, blend: impl Fn(u32, u8) -> u8) {
    let (w, h) = (img.w, img.h);
    if w <= 2 || h <= 2 {
        return;
    }
    let src = img.px.to_vec();
    let row = w * 3;
    for (y, out) in img.px.chunks_exact_mut(row).enumerate().take(h - 1).skip(1) {
        let (up, cur, down) = (&src[(y - 1) * row..y * row], &src[y * row..(y + 1) * row], &src[(y + 1) * row..(y + 2) * row]);
        for k in 3..row - 3 {
            let ring = up[k - 3] as u32 + up[k] as u32 + up[k + 3] as u32 + cur[k - 3] as u32 + cur[k + 3] as u32
                + down[k - 3] as u32
                + down[k] as u32
                + down[k + 3] as u32;
            out[k] = blend((2 * (ring + 5 * cur[k] as u32) + 13) / 26, cur[k]);
        }
    }
}

multiversion! {
    /// `adjust_hue_image`: each pixel to float32 HSV (torchvision's `_rgb_to_hsv`), its hue turned
    /// by `factor` (a fraction of the circle, -0.5..0.5), back to RGB (`_hsv_to_rgb`) and to uint8
    /// by torchvision's scaling (× 255.999, truncated).
    pub fn hue / hue_baseline(img: &mut Image, factor: f64) {
        let (to_float, to_u8) = ((1.0f64 / 255.0) as f32, (255.0f64 + 1.0 - 1e-3) as f32);
        let factor = factor as f32;
        for p in img.px.chunks_exact_mut(3) {
            let [r, g, b] = [p[0], p[1], p[2]].map(|v| v as f32 * to_float);
            let (maxc, minc) = (r.max(g).max(b), r.min(g).min(b));
            let eqc = maxc == minc;
            let range = maxc - minc;
            let s = range / if eqc { 1.0 } else { maxc };
            let divisor = if eqc { 1.0 } else { range };
            let (rc, gc, bc) = ((maxc - r) / divisor, (maxc - g) / divisor, (maxc - b) / divisor);
            let (max_is_r, max_is_g) = (maxc == r, maxc == g);
            let hr = if max_is_r { bc - gc } else { 0.0 };
            let hg = if max_is_g && !max_is_r { (rc + 2.0) - bc } else { 0.0 };
            let hb = if !max_is_g && !max_is_r { (gc + 4.0) - rc } else { 0.0 };
            let h = ((hr + hg + hb) * (1.0f64 / 6.0) as f32 + 1.0) % 1.0;
            // torch.remainder: the result takes the divisor's sign.
            let h = h + factor;
            let h = h - h.floor();
            let h6 = h * 6.0;
            let i = h6.floor();
            let f = h6 - i;
            let sxf = s * f;
            let one_minus_s = 1.0 - s;
            let v = maxc;
            let q = ((1.0 - sxf) * v).clamp(0.0, 1.0);
            let t = ((sxf + one_minus_s) * v).clamp(0.0, 1.0);
            let pp = (one_minus_s * v).clamp(0.0, 1.0);
            let rgb = match (i as i32).rem_euclid(6) {
                0 => [v, t, pp],
                1 => [q, v, pp],
                2 => [pp, v, t],
                3 => [pp, q, v],
                4 => [t, pp, v],
                _ => [v, pp, q],
            };
            for (o, c) in p.iter_mut().zip(rgb) {
                *o = (c * to_u8) as u8;
            }
        }
    }
}

/// `posterize_image`: the top `bits` bits of each value.
pub fn posterize(img: &mut Image, bits: u32) {
    if bits >= 8 {
        return;
    }
    let mask = (((1u32 << bits) - 1) << (8 - bits)) as u8;
    img.px.iter_mut().for_each(|v| *v &= mask);
}

/// `solarize_image`: values at or above the threshold inverted (compared in float32).
pub fn solarize(img: &mut Image, threshold: f64) {
    let t = threshold as f32;
    img.px.iter_mut().filter(|v| **v as f32 >= t).for_each(|v| *v = !*v);
}

/// `autocontrast_image`: each channel stretched from its own minimum and maximum to 0..255.
fn autocontrast(img: &mut Image) {
    for c in 0..3 {
        let values = img.px.iter().skip(c).step_by(3);
        let (lo, hi) = values.fold((255u8, 0u8), |(lo, hi), &v| (lo.min(v), hi.max(v)));
        let (lo, scale) = match lo == hi {
            true => (0.0, 1.0),
            false => (lo as f32, (hi as f32 - lo as f32) * (1.0f32 / 255.0)),
        };
        let lut: Vec<u8> = (0..=255u8).map(|v| to_u8((v as f32 - lo) / scale)).collect();
        img.px.iter_mut().skip(c).step_by(3).for_each(|v| *v = lut[*v as usize]);
    }
}

/// `equalize_image`: PIL's histogram equalisation, per channel, in integers.
pub fn equalize(img: &mut Image) {
    let n = img.px.len() / 3;
    for c in 0..3 {
        let mut hist = [0usize; 256];
        img.px.iter().skip(c).step_by(3).for_each(|&v| hist[v as usize] += 1);
        // The last value the channel holds: its count is left out of the step.
        let top = (0..256).rev().find(|&v| hist[v] > 0).unwrap_or(0);
        let step = (n - hist[top]) / 255;
        if step == 0 {
            continue;
        }
        let mut lut = [0u8; 256];
        let mut cum = 0;
        for k in 1..256 {
            cum += hist[k - 1];
            lut[k] = ((cum + step / 2) / step).min(255) as u8;
        }
        img.px.iter_mut().skip(c).step_by(3).for_each(|v| *v = lut[*v as usize]);
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    fn image(w: usize, h: usize) -> Vec<u8> {
        (0..w * h * 3).map(|i| (i * 37 % 251) as u8).collect()
    }

    /// `grid_sample`'s definition, one pixel at a time, as `grid_transform` computed it before it
    /// ran in vectorised passes: each neighbour outside the image reads 0.
    fn grid_transform_direct(img: &mut Image, m: [f64; 6], sampling: Sampling) {
        let (w, h) = (img.w, img.h);
        let t = m.map(|v| v as f32);
        let (hw, hh) = (0.5 * w as f32, 0.5 * h as f32);
        let rt = [[t[0] / hw, t[3] / hh], [t[1] / hw, t[4] / hh], [t[2] / hw, t[5] / hh]];
        let xs: Vec<f32> = linspace_f32((1.0 - w as f32) * 0.5, (w as f32 - 1.0) * 0.5, w).collect();
        let ys: Vec<f32> = linspace_f32((1.0 - h as f32) * 0.5, (h as f32 - 1.0) * 0.5, h).collect();
        let src = img.px.to_vec();
        let read = |x: f32, y: f32, c: usize| match x >= 0.0 && y >= 0.0 && x < w as f32 && y < h as f32 {
            true => src[(y as usize * w + x as usize) * 3 + c] as f32,
            false => 0.0,
        };
        for (j, &y) in ys.iter().enumerate() {
            for (i, &x) in xs.iter().enumerate() {
                let gx = x * rt[0][0] + y * rt[1][0] + rt[2][0];
                let gy = x * rt[0][1] + y * rt[1][1] + rt[2][1];
                let ix = (gx + 1.0) * (w as f32 / 2.0) - 0.5;
                let iy = (gy + 1.0) * (h as f32 / 2.0) - 0.5;
                for c in 0..3 {
                    let v = match sampling {
                        Sampling::Nearest => read(ix.round_ties_even(), iy.round_ties_even(), c),
                        Sampling::Bilinear => {
                            let (x0, y0) = (ix.floor(), iy.floor());
                            let (we, ns) = (ix - x0, iy - y0);
                            let (ww, nn) = (1.0 - we, 1.0 - ns);
                            let v = read(x0, y0, c) * (nn * ww) + read(x0 + 1.0, y0, c) * (nn * we);
                            let v = v + read(x0, y0 + 1.0, c) * (ns * ww) + read(x0 + 1.0, y0 + 1.0, c) * (ns * we);
                            v.round_ties_even().clamp(0.0, 255.0)
                        }
                    };
                    img.px[(j * w + i) * 3 + c] = v as u8;
                }
            }
        }
    }

    /// `grid_transform` and `other` give the same bytes for `m`, nearest and bilinear.
    fn same_samples(orig: &[u8], (w, h): (usize, usize), m: [f64; 6], other: fn(&mut Image, [f64; 6], Sampling)) {
        for sampling in [Sampling::Nearest, Sampling::Bilinear] {
            let (mut a, mut b) = (orig.to_vec(), orig.to_vec());
            grid_transform(&mut Image { w, h, px: &mut a }, m, sampling);
            other(&mut Image { w, h, px: &mut b }, m, sampling);
            assert_eq!(a, b, "{w}x{h} {m:?} {sampling:?}");
        }
    }

    /// Sizes and matrices for the samplings' tests (here and PIL's in `pil.rs`): images from
    /// 1×1 up, their pixels, and matrices that send points far outside the image; every fifth a
    /// whole-pixel shift, which puts points exactly on pixels and edges.
    pub(in crate::data::augment) fn sampling_cases(seed: u64) -> Vec<(usize, usize, Vec<u8>, [f64; 6])> {
        let mut state = seed;
        let mut uniform = || {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (state >> 11) as f64 / (1u64 << 53) as f64
        };
        let shift = |size: usize, u: f64| (u - 0.5) * 3.0 * size as f64;
        (0..400)
            .map(|case| {
                let (w, h) = [(1, 1), (2, 3), (17, 9), (40, 33)][case % 4];
                let m = match case % 5 {
                    0 => [1.0, 0.0, (shift(w, uniform()) / 4.0).round(), 0.0, 1.0, (shift(h, uniform()) / 4.0).round()],
                    _ => [4.0 * uniform() - 2.0, 4.0 * uniform() - 2.0, shift(w, uniform()), 4.0 * uniform() - 2.0, 4.0 * uniform() - 2.0, shift(h, uniform())],
                };
                (w, h, image(w, h), m)
            })
            .collect()
    }

    /// The vectorised passes give the definition's bits.
    #[test]
    fn grid_transform_is_grid_samples_definition() {
        for (w, h, orig, m) in sampling_cases(7) {
            same_samples(&orig, (w, h), m, grid_transform_direct);
        }
    }

    /// Where the CPU has AVX2 and FMA, the operations run their AVX2 builds: the same bits as
    /// the baseline's (elsewhere both calls run the baseline).
    #[test]
    fn the_avx2_builds_give_the_baselines_bits() {
        let (w, h) = (41, 23);
        let orig = image(w, h);
        let run = |f: fn(&mut Image, f64), factor: f64| {
            let mut px = orig.clone();
            f(&mut Image { w, h, px: &mut px }, factor);
            px
        };
        type Op1 = fn(&mut Image, f64);
        let pairs: [(&str, Op1, Op1); 5] = [
            ("brightness", brightness, brightness_baseline),
            ("saturation", saturation, saturation_baseline),
            ("contrast", contrast, contrast_baseline),
            ("sharpness", sharpness, sharpness_baseline),
            ("hue", hue, hue_baseline),
        ];
        for (name, fast, baseline) in pairs {
            for factor in [-0.45, 0.05, 0.3, 0.99, 1.7] {
                assert_eq!(run(fast, factor), run(baseline, factor), "{name} {factor}");
            }
        }
        for m in [[0.9, -0.3, 2.5, 0.4, 1.1, -7.0], [1.0, 0.0, -3.0, 0.0, 1.0, 0.0], [0.0, 1.0, 0.5, -1.0, 0.0, 40.0]] {
            same_samples(&orig, (w, h), m, grid_transform_baseline);
        }
    }

    #[test]
    fn whole_turns_and_zero_shifts_keep_every_pixel() {
        let (w, h) = (7, 7);
        let orig = image(w, h);
        for (op, m) in [(Op::Rotate, 0.0), (Op::Rotate, 360.0), (Op::TranslateX, 0.7), (Op::ShearX, 0.0)] {
            let mut px = orig.clone();
            apply(op, m, &mut Image { w, h, px: &mut px }, Sampling::Bilinear);
            assert_eq!(px, orig, "{op:?} {m}");
        }
        // Four quarter turns either way are the identity; two are a half turn.
        let turn = |px: &mut Vec<u8>, a: f64| apply(Op::Rotate, a, &mut Image { w, h, px }, Sampling::Nearest);
        let (mut a, mut b) = (orig.clone(), orig.clone());
        for _ in 0..4 {
            turn(&mut a, 90.0);
            turn(&mut b, -90.0);
        }
        assert_eq!((&a, &b), (&orig, &orig));
        turn(&mut a, 90.0);
        turn(&mut a, 90.0);
        turn(&mut b, 180.0);
        assert_eq!(a, b);
    }

    #[test]
    fn translation_moves_pixels_and_fills_zero() {
        let (w, h) = (5, 4);
        let orig = image(w, h);
        let mut px = orig.clone();
        apply(Op::TranslateX, 2.0, &mut Image { w, h, px: &mut px }, Sampling::Bilinear);
        for y in 0..h {
            for x in 0..w {
                let o = (y * w + x) * 3;
                let want = if x < 2 { [0; 3] } else { [orig[o - 6], orig[o - 5], orig[o - 4]] };
                assert_eq!(px[o..o + 3], want, "({x}, {y})");
            }
        }
    }

    #[test]
    fn equalize_of_a_flat_channel_and_posterize_zero_bits() {
        let mut px = vec![9u8; 4 * 4 * 3];
        equalize(&mut Image { w: 4, h: 4, px: &mut px });
        assert!(px.iter().all(|&v| v == 9));
        let mut px = image(4, 4);
        posterize(&mut Image { w: 4, h: 4, px: &mut px }, 0);
        assert!(px.iter().all(|&v| v == 0));
    }
}
