//! Normalisation: uint8 batches become float on the device, (x/255 - mean) / std in one pass;
//! on the CPU the data workers do it themselves (`HostNormalize`).
use tch::{Device, Kind, Tensor};

/// u8 [B,H,W,3] on the host → normalised f32 [B,3,H,W] on the device: (x/255 - mean) / std, as
/// torchvision's ToTensor + Normalize, computed in one pass as x·scale + shift (scale =
/// 1/(255·std), shift = -mean/std; equal to float rounding). The output is contiguous NCHW, or
/// channels_last (NHWC in memory, the batch's own layout, so no transpose at all) when asked.
/// The constants are put on the device once, not at every batch.
pub struct Normalizer {
    device: Device,
    scale: Tensor,
    shift: Tensor,
    host: HostNormalize,
}

/// The same normalisation done by the data workers themselves, per image, when the device is
/// the CPU: there a separate pass over the batch would compete with the workers for the same
/// cores (it halved the loader's throughput on 2 cores). Batches then arrive as f32.
#[derive(Debug, Clone, Copy)]
pub struct HostNormalize {
    pub scale: [f32; 3],
    pub shift: [f32; 3],
    /// Lay the f32 batch out NHWC in memory (a channels_last [B,3,H,W] tensor).
    pub channels_last: bool,
}

impl HostNormalize {
    /// One image: u8 HWC `src` → f32 `dst`, CHW (or HWC when channels_last).
    pub fn apply(&self, src: &[u8], dst: &mut [f32]) {
        host_normalize(self, src, dst)
    }
}

crate::multiversion! {
    /// `HostNormalize::apply`, built for AVX2 too: x·scale + shift, unfused, eight at a time.
    fn host_normalize / host_normalize_baseline(n: &HostNormalize, src: &[u8], dst: &mut [f32]) {
        let (s, t) = (n.scale, n.shift);
        if n.channels_last {
            for (d, px) in dst.chunks_exact_mut(3).zip(src.chunks_exact(3)) {
                for c in 0..3 {
                    d[c] = px[c] as f32 * s[c] + t[c];
                }
            }
        } else {
            let plane = src.len() / 3;
            let (r, rest) = dst.split_at_mut(plane);
            let (g, b) = rest.split_at_mut(plane);
            for (((px, r), g), b) in src.chunks_exact(3).zip(r).zip(g).zip(b) {
                *r = px[0] as f32 * s[0] + t[0];
                *g = px[1] as f32 * s[1] + t[1];
                *b = px[2] as f32 * s[2] + t[2];
            }
        }
    }
}

impl Normalizer {
    pub fn new(mean: [f64; 3], std: [f64; 3], device: Device) -> Self {
        let on_device = |v: [f64; 3]| {
            Tensor::from_slice(&v)
                .to_kind(Kind::Float)
                .to_device(device)
                .view([1, 3, 1, 1])
        };
        let scale = std.map(|s| 1.0 / (255.0 * s));
        let shift = [0, 1, 2].map(|c| -mean[c] / std[c]);
        Normalizer {
            device,
            scale: on_device(scale),
            shift: on_device(shift),
            host: HostNormalize {
                scale: scale.map(|v| v as f32),
                shift: shift.map(|v| v as f32),
                channels_last: false,
            },
        }
    }

    pub fn device(&self) -> Device {
        self.device
    }

    /// x·scale + shift's constants, [1, 3, 1, 1] f32 on the device each (for a graph that
    /// normalises as the loader does: `export --with-preprocess`).
    pub fn constants(&self) -> (&Tensor, &Tensor) {
        (&self.scale, &self.shift)
    }

    /// The same normaliser (its constants shared).
    pub fn shallow_clone(&self) -> Self {
        Normalizer {
            device: self.device,
            scale: self.scale.shallow_clone(),
            shift: self.shift.shallow_clone(),
            host: self.host,
        }
    }

    /// Float pixels in 0..255, [B,3,H,W] on the device (the device-side augmentation's output)
    /// → normalised, in the memory format asked for.
    pub fn apply_pixels(&self, x: &Tensor) -> Tensor {
        let x = match self.host.channels_last {
            true => x.permute([0, 2, 3, 1]).contiguous().permute([0, 3, 1, 2]),
            false => x.contiguous(),
        };
        self.shift.addcmul(&x, &self.scale)
    }

    /// The inverse of `apply`: normalised f32 [B,3,H,W] back to uint8 pixels [B,H,W,3] on the
    /// CPU, rounded (what the step's input looks like, for a picture of it).
    pub fn to_pixels(&self, x: &Tensor) -> Tensor {
        ((x - &self.shift) / &self.scale)
            .round()
            .clamp(0.0, 255.0)
            .to_kind(Kind::Uint8)
            .permute([0, 2, 3, 1])
            .to_device(Device::Cpu)
            .contiguous()
    }

    /// Produce channels_last batches (for a model in that memory format).
    pub fn channels_last(mut self, on: bool) -> Self {
        self.host.channels_last = on;
        self
    }

    /// What the data workers should apply themselves: the normalisation when the device is the
    /// CPU, nothing (uint8 batches) otherwise.
    pub fn for_workers(&self) -> Option<HostNormalize> {
        (self.device == Device::Cpu).then_some(self.host)
    }

    /// Whether the loader should build batches in pinned memory: for a CUDA device.
    pub fn pin_memory(&self) -> bool {
        self.device.is_cuda()
    }

    /// A batch's labels on the device. From the loader's pinned memory the copy is asynchronous,
    /// like the images': a blocking copy would stall the host until the GPU is idle, every step.
    pub fn labels(&self, labels: &Tensor) -> Tensor {
        labels.to_device_(self.device, labels.kind(), self.device.is_cuda(), false)
    }

    /// A batch from the loader → normalised f32 [B,3,H,W] on the device. A f32 batch was
    /// normalised by the workers already (`for_workers`).
    pub fn apply(&self, images: &Tensor) -> Tensor {
        // Asynchronous from pinned memory (the allocator keeps the block until the copy is
        // done); the kernels below are queued after it on the same stream.
        let on_device = |t: &Tensor| t.to_device_(self.device, t.kind(), self.device.is_cuda(), false);
        if images.kind() == Kind::Float {
            return on_device(images);
        }
        let x = on_device(images).permute([0, 3, 1, 2]);
        // NCHW: transpose while still uint8 (a quarter of the bytes of the float result).
        let x = if self.host.channels_last { x } else { x.contiguous() };
        // One kernel: uint8 in, float out; the output follows the input's memory layout.
        self.shift.addcmul(&x, &self.scale)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalizer_is_to_tensor_and_normalize_in_either_layout() {
        let images = Tensor::randint(256, [2, 5, 4, 3], (Kind::Uint8, Device::Cpu));
        let (mean, std) = ([0.5, 0.4, 0.3], [0.2, 0.25, 0.3]);
        let want = {
            let x = images.permute([0, 3, 1, 2]).to_kind(Kind::Float) / 255.0;
            let m = Tensor::from_slice(&mean).to_kind(Kind::Float).view([1, 3, 1, 1]);
            let s = Tensor::from_slice(&std).to_kind(Kind::Float).view([1, 3, 1, 1]);
            (x - m) / s
        };
        let nchw = Normalizer::new(mean, std, Device::Cpu).apply(&images);
        assert!(nchw.is_contiguous());
        assert_eq!(nchw.size(), [2, 3, 5, 4]);
        assert!((&nchw - &want).abs().max().double_value(&[]) < 1e-5);
        let cl = Normalizer::new(mean, std, Device::Cpu)
            .channels_last(true)
            .apply(&images);
        assert_eq!(cl.stride(), [60, 1, 12, 3], "NHWC in memory");
        assert!(cl.equal(&nchw), "same values in either layout");

        // The workers' own normalisation gives the same numbers, in either layout.
        for channels_last in [false, true] {
            let n = Normalizer::new(mean, std, Device::Cpu).channels_last(channels_last);
            let host = n.for_workers().expect("a CPU device");
            let per = 5 * 4 * 3;
            let src = Vec::<u8>::try_from(images.flatten(0, -1)).unwrap();
            let mut dst = vec![0f32; 2 * per];
            for (s, d) in src.chunks(per).zip(dst.chunks_mut(per)) {
                host.apply(s, d);
            }
            let t = Tensor::from_slice(&dst);
            let t = match channels_last {
                false => t.view([2, 3, 5, 4]),
                true => t.view([2, 5, 4, 3]).permute([0, 3, 1, 2]),
            };
            assert!((&t - &want).abs().max().double_value(&[]) < 1e-5);
            assert!(n.apply(&t).equal(&t), "a normalised batch passes through");
        }
    }
}
