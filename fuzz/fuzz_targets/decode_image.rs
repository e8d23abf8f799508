//! Any bytes as an image file: decoding (PNG, JPEG incl. the 1/8 DCT-scaled path, BMP, WebP)
//! and the transform into a batch slot must return an error or pixels, never panic, and never
//! allocate past the pixel limit.
#![no_main]
use libfuzzer_sys::fuzz_target;
use rand_chacha::rand_core::SeedableRng;
use ringtrain::data::augment::transform::{resize_center_crop_box, Interpolation, Transform};
use ringtrain::data::decode::decode_bytes_for;

fuzz_target!(|data: &[u8]| {
    // The output size varies with the input, so small sizes reach the scaled JPEG path.
    let size = 4 + data.len() as u32 % 61;
    let t = Transform::eval(size, size + size / 8, Interpolation::Bilinear);
    let path = std::path::Path::new("fuzz-input");
    if let Ok((img, bx)) = decode_bytes_for(data, path, Some(size), |w, h| resize_center_crop_box(w, h, size + size / 8, size)) {
        let mut out = vec![0u8; (size * size * 3) as usize];
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
        let _ = t.finish((&img).into(), bx, &mut rng, &mut out);
    }
});
