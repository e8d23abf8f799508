//! Data, in the order a sample travels: where images come from (`remote/`: objects of object
//! stores and web servers, fetched onto local disk; `source/`: folders, label files, packs, tar
//! shards, parquet files) → decoding (`decode.rs`) → augmentation on pixels
//! (`augment/`: crop and resize, flip, erasing; Mixup/CutMix on the device) → loading (`load/`:
//! the sample order, the worker pool, the RAM cache, the set on the device, normalisation) →
//! uint8 NHWC batches, normalised to float on the device. `pixels.rs` holds the pixel views
//! they pass each other; `tools/` the data commands (demo, pack, split, stats). A room uses the
//! rooms before it, never one after.
pub mod augment;
pub mod decode;
pub mod load;
pub mod pixels;
pub mod remote;
pub mod source;
pub mod tools;

pub const IMAGENET_MEAN: [f64; 3] = [0.485, 0.456, 0.406];
pub const IMAGENET_STD: [f64; 3] = [0.229, 0.224, 0.225];
