//! Data: folder scanning → decode → augment → batches (uint8 NHWC on the host).
//! Normalisation to float happens on the device (`normalize_on_device`).
pub mod decode;
pub mod demo;
pub mod folder;
pub mod loader;
pub mod split;
pub mod stats;
pub mod transform;

use tch::{Device, Kind, Tensor};

pub const IMAGENET_MEAN: [f64; 3] = [0.485, 0.456, 0.406];
pub const IMAGENET_STD: [f64; 3] = [0.229, 0.224, 0.225];

/// u8 [B,H,W,3] on the host → normalised f32 [B,3,H,W] on `device`:
/// (x/255 - mean) / std, as torchvision's ToTensor + Normalize.
pub fn normalize_on_device(images: &Tensor, device: Device, mean: [f64; 3], std: [f64; 3]) -> Tensor {
    let x = images.to_device(device).permute([0, 3, 1, 2]).to_kind(Kind::Float) / 255.0;
    let m = Tensor::from_slice(&mean).to_kind(Kind::Float).to_device(device).view([1, 3, 1, 1]);
    let s = Tensor::from_slice(&std).to_kind(Kind::Float).to_device(device).view([1, 3, 1, 1]);
    ((x - m) / s).contiguous()
}
