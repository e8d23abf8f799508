//! Loading: samples into batches. The epoch's order (`order.rs` for sharded sources, `loader.rs`
//! otherwise), one sample read, decoded and transformed (`sample.rs`), batches built by a worker
//! pool (`loader.rs`) or on the device from the whole set there (`on_device.rs`), the RAM cache
//! (`cache.rs`), normalisation (`normalize.rs`) and the reuse of host batch tensors
//! (`buffers.rs`). Uses `source`, `decode` and `augment`.
pub mod buffers;
pub mod cache;
pub mod loader;
pub mod normalize;
pub mod on_device;
pub mod order;
pub mod sample;
