//! The operations of the augmentation policies (`policy.rs`) on one uint8 RGB image (HWC, w×h),
//! each computed as `torchvision.transforms.v2.functional` computes it on a uint8 tensor: the
//! same float32 arithmetic in the same order, the same rounding (geometric ops round to nearest;
//! colour ops truncate, as `.to(torch.uint8)` does) and zero fill outside the image (the policies'
//! default `fill=None`). Integer ops (posterize, solarize, invert, equalize) are exact;
//! `tests/augment_policies.rs` states the bounds of the float ones.
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

/// `_affine_grid` then `_apply_grid_transform`: for each output pixel the input point the
/// float32 matrix `theta` sends it to, sampled as `grid_sample(align_corners=False,
/// padding_mode="zeros")` samples, rounded half to even.
fn grid_transform(img: &mut Image, m: [f64; 6], sampling: Sampling) {
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
    let src = img.px.to_vec();
    let (wf, hf) = (w as f32, h as f32);
    // The offset of pixel (x, y) in `src`, or None outside the image (zero fill).
    let offset = |x: i64, y: i64| -> Option<usize> {
        (x >= 0 && y >= 0 && (x as usize) < w && (y as usize) < h).then(|| (y as usize * w + x as usize) * 3)
    };
    for (j, &y) in ys.iter().enumerate() {
        for (i, &x) in xs.iter().enumerate() {
            let gx = x * rt[0][0] + y * rt[1][0] + rt[2][0];
            let gy = x * rt[0][1] + y * rt[1][1] + rt[2][1];
            // Unnormalised, corners not aligned: ((g + 1) * size - 1) / 2.
            let ix = (gx + 1.0) * (wf / 2.0) - 0.5;
            let iy = (gy + 1.0) * (hf / 2.0) - 0.5;
            let out = &mut img.px[(j * w + i) * 3..(j * w + i) * 3 + 3];
            match sampling {
                Sampling::Nearest => match offset(ix.round_ties_even() as i64, iy.round_ties_even() as i64) {
                    Some(o) => out.copy_from_slice(&src[o..o + 3]),
                    None => out.fill(0),
                },
                Sampling::Bilinear => {
                    let (x0, y0) = (ix.floor(), iy.floor());
                    let (we, ns) = (ix - x0, iy - y0);
                    let (ww, nn) = (1.0 - we, 1.0 - ns);
                    let (x0, y0) = (x0 as i64, y0 as i64);
                    let weights = [nn * ww, nn * we, ns * ww, ns * we];
                    // Inside the image (most points): the four neighbours by offset alone.
                    if x0 >= 0 && y0 >= 0 && (x0 as usize) + 1 < w && (y0 as usize) + 1 < h {
                        let o = (y0 as usize * w + x0 as usize) * 3;
                        let at = [o, o + 3, o + w * 3, o + w * 3 + 3];
                        for (c, out) in out.iter_mut().enumerate() {
                            // torch's order of the sum: north-west, north-east, south-west, south-east.
                            let v = src[at[0] + c] as f32 * weights[0]
                                + src[at[1] + c] as f32 * weights[1]
                                + src[at[2] + c] as f32 * weights[2]
                                + src[at[3] + c] as f32 * weights[3];
                            *out = v.round_ties_even().clamp(0.0, 255.0) as u8;
                        }
                        continue;
                    }
                    let corners = [
                        (offset(x0, y0), nn * ww),
                        (offset(x0 + 1, y0), nn * we),
                        (offset(x0, y0 + 1), ns * ww),
                        (offset(x0 + 1, y0 + 1), ns * we),
                    ];
                    for (c, o) in out.iter_mut().enumerate() {
                        let mut v = 0.0f32;
                        for &(at, weight) in &corners {
                            v += at.map_or(0.0, |k| src[k + c] as f32) * weight;
                        }
                        *o = v.round_ties_even().clamp(0.0, 255.0) as u8;
                    }
                }
            }
        }
    }
}

/// `.clamp_(0, 255).to(torch.uint8)`: truncation toward zero.
fn to_u8(v: f32) -> u8 {
    v.clamp(0.0, 255.0) as u8
}

/// `adjust_brightness_image`: each value times the factor.
pub fn brightness(img: &mut Image, factor: f64) {
    let f = factor as f32;
    img.px.iter_mut().for_each(|v| *v = to_u8(*v as f32 * f));
}

/// `_blend`: x·ratio + other·(1 - ratio), the second term fused into the sum as torch's
/// vectorised `add_(other, alpha)` fuses it.
fn blend(x: u8, other: f32, ratio: f32, alpha: f32) -> u8 {
    to_u8(other.mul_add(alpha, x as f32 * ratio))
}

/// `_rgb_to_grayscale_image` of a pixel in float32, floored as the uint8 path floors it.
fn gray(p: &[u8]) -> f32 {
    let l = p[0] as f32 * 0.2989f32;
    let l = (p[1] as f32).mul_add(0.587, l);
    (p[2] as f32).mul_add(0.114, l).floor()
}

/// `adjust_saturation_image`: each pixel blended with its own grey.
pub fn saturation(img: &mut Image, factor: f64) {
    let (r, a) = (factor as f32, (1.0 - factor) as f32);
    for p in img.px.chunks_exact_mut(3) {
        let g = gray(p);
        p.iter_mut().for_each(|v| *v = blend(*v, g, r, a));
    }
}

/// `adjust_contrast_image`: each value blended with the mean grey of the whole image (one
/// table of the 256 values' results).
pub fn contrast(img: &mut Image, factor: f64) {
    let n = img.px.len() / 3;
    let sum: f64 = img.px.chunks_exact(3).map(|p| gray(p) as f64).sum();
    let mean = sum as f32 / n as f32;
    let (r, a) = (factor as f32, (1.0 - factor) as f32);
    let lut: Vec<u8> = (0..=255u8).map(|v| blend(v, mean, r, a)).collect();
    img.px.iter_mut().for_each(|v| *v = lut[*v as usize]);
}

/// `adjust_sharpness_image`: the inner pixels blended with a 3×3 smoothing (1s around a 5,
/// over 13, rounded); the border rows and columns stay. torch convolves in float32 and rounds;
/// here the sum is whole numbers, (8 neighbours + 5·centre) / 13 rounded: the same value,
/// since a 13th is never within float32's error of a half (the nearest is 1/26 away).
fn sharpness(img: &mut Image, factor: f64) {
    let (w, h) = (img.w, img.h);
    if w <= 2 || h <= 2 {
        return;
    }
    let alpha = (1.0 - factor) as f32;
    let src = img.px.to_vec();
    let row = w * 3;
    for y in 1..h - 1 {
        for x in 1..w - 1 {
            let o = y * row + x * 3;
            for c in o..o + 3 {
                let ring: u32 = [c - row - 3, c - row, c - row + 3, c - 3, c + 3, c + row - 3, c + row, c + row + 3]
                    .iter()
                    .map(|&k| src[k] as u32)
                    .sum();
                let blur = ((2 * (ring + 5 * src[c] as u32) + 13) / 26) as f32;
                let v = src[c] as f32;
                img.px[c] = to_u8((blur - v).mul_add(alpha, v));
            }
        }
    }
}

/// `adjust_hue_image`: each pixel to float32 HSV (torchvision's `_rgb_to_hsv`), its hue turned
/// by `factor` (a fraction of the circle, -0.5..0.5), back to RGB (`_hsv_to_rgb`) and to uint8
/// by torchvision's scaling (× 255.999, truncated).
pub fn hue(img: &mut Image, factor: f64) {
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
mod tests {
    use super::*;

    fn image(w: usize, h: usize) -> Vec<u8> {
        (0..w * h * 3).map(|i| (i * 37 % 251) as u8).collect()
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
