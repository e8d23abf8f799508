//! Data: folder scanning → decode → augment → batches (uint8 NHWC on the host).
//! Normalisation to float happens on the device (`Normalizer`).
pub mod decode;
pub mod demo;
pub mod erasing;
pub mod folder;
pub mod loader;
pub mod mixup;
pub mod split;
pub mod stats;
pub mod transform;

use tch::{Device, Kind, Tensor};

pub const IMAGENET_MEAN: [f64; 3] = [0.485, 0.456, 0.406];
pub const IMAGENET_STD: [f64; 3] = [0.229, 0.224, 0.225];

/// u8 [B,H,W,3] on the host → normalised f32 [B,3,H,W] on the device:
/// (x/255 - mean) / std, as torchvision's ToTensor + Normalize. The constants are put on the
/// device once, not at every batch.
pub struct Normalizer {
    device: Device,
    mean: Tensor,
    std: Tensor,
}

impl Normalizer {
    pub fn new(mean: [f64; 3], std: [f64; 3], device: Device) -> Self {
        let on_device = |v: [f64; 3]| {
            Tensor::from_slice(&v)
                .to_kind(Kind::Float)
                .to_device(device)
                .view([1, 3, 1, 1])
        };
        Normalizer {
            device,
            mean: on_device(mean),
            std: on_device(std),
        }
    }

    pub fn apply(&self, images: &Tensor) -> Tensor {
        let x = images.to_device(self.device).permute([0, 3, 1, 2]).to_kind(Kind::Float) / 255.0;
        ((x - &self.mean) / &self.std).contiguous()
    }
}
