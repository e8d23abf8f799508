//! Augmentation: operations on pixels. On the host, on each decoded image: crop and resize,
//! flip, padding (`transform.rs`) and erasing (`erasing.rs`); on the device, on each batch:
//! Mixup and CutMix (`mixup.rs`). Augmentation policies belong here too. Uses `pixels` only.
pub mod erasing;
pub mod mixup;
pub mod transform;
