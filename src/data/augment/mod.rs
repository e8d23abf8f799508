//! Augmentation: operations on pixels. On the host, on each decoded image: crop and resize,
//! flip, padding (`transform.rs`) and erasing (`erasing.rs`); on the device, on each batch:
//! Mixup and CutMix (`mixup.rs`). On the host too, after the flip: the augmentation policies
//! (`policy.rs`: TrivialAugmentWide, RandAugment, AutoAugment, AugMix) and their operations
//! (`ops.rs`), timm's RandAugment (`timm_rand.rs`) on PIL's arithmetic (`pil.rs`), and
//! ColorJitter (`jitter.rs`); the operations' loops built for AVX2 too (`multiversion.rs`), their rounding by the float
//! adder (`rounding.rs`).
//! Uses `pixels` only.
pub mod erasing;
pub mod jitter;
pub mod mixup;
#[macro_use]
pub mod multiversion;
pub mod ops;
pub mod pil;
pub mod policy;
pub mod rounding;
pub mod timm_rand;
pub mod transform;
