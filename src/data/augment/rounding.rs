//! Rounding and float-to-integer conversion through the float adder, for the operations' loops:
//! adding 1.5 · 2^23 (f32) or 1.5 · 2^52 (f64) leaves a small number's units in the last bits of
//! the mantissa. Exact for |v| < 2^22 (f32) and 2^51 (f64), and a loop of them vectorises on
//! any x86-64, where `round_ties_even` and `floor` need SSE4.1 (else a libm call per value) and
//! `as i32` saturates and tests for NaN (scalar code).
const M32: f32 = 12_582_912.0; // 1.5 · 2^23
const M64: f64 = 6_755_399_441_055_744.0; // 1.5 · 2^52

/// Round half to even, for |v| < 2^22.
#[inline(always)]
pub fn round_even_f32(v: f32) -> f32 {
    (v + M32) - M32
}

/// `floor`, for |v| < 2^22.
#[inline(always)]
pub fn floor_f32(v: f32) -> f32 {
    let r = round_even_f32(v);
    if r > v { r - 1.0 } else { r }
}

/// A whole-valued f32 with |v| < 2^22 as an i32.
#[inline(always)]
pub fn int_f32(v: f32) -> i32 {
    (v + M32).to_bits() as i32 - M32.to_bits() as i32
}

/// `floor`, for |v| < 2^51.
#[inline(always)]
pub fn floor_f64(v: f64) -> f64 {
    let r = (v + M64) - M64;
    if r > v { r - 1.0 } else { r }
}

/// A whole-valued f64 with |v| < 2^31 as an i32.
#[inline(always)]
pub fn int_f64(v: f64) -> i32 {
    ((v + M64).to_bits() as i64 - M64.to_bits() as i64) as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn they_agree_with_the_library_functions_over_their_range() {
        let mut state = 5u64;
        for k in 0..200_000 {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let u = (state >> 11) as f64 / (1u64 << 53) as f64;
            // Halves and whole numbers, then arbitrary values, out to the bounds.
            let scale = [300.0, 70_000.0, 4_000_000.0][k % 3];
            let v = match k % 4 {
                0 => ((u - 0.5) * scale * 2.0).round() / 2.0,
                _ => (u - 0.5) * scale,
            };
            let f = v as f32;
            assert_eq!(round_even_f32(f), f.round_ties_even(), "{f}");
            assert_eq!(floor_f32(f), f.floor(), "{f}");
            assert_eq!(int_f32(f.floor()), f.floor() as i32, "{f}");
            assert_eq!(floor_f64(v), v.floor(), "{v}");
            assert_eq!(int_f64(v.floor()), v.floor() as i32, "{v}");
        }
        assert_eq!(floor_f64(-0.5), -1.0);
        assert_eq!(int_f64(-1.0), -1);
        assert_eq!(int_f32(-2.0), -2);
    }
}
