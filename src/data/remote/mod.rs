//! Data in object stores and on web servers: `s3://` (and S3-compatible stores through
//! `AWS_ENDPOINT_URL`), `gs://`, `az://` and `http(s)://` locations of tar shards, parquet files
//! and packs. Apache Arrow's `object_store` speaks each provider's protocol, finds credentials as
//! the providers' SDKs do (environment, web identity, instance metadata) and retries 5xx answers,
//! throttling and dropped connections (a body cut mid-object goes on with a Range request for
//! the rest, if the object's ETag is unchanged).
//!
//! Sources read an object as a local file: `cache.rs` fetches it whole onto local disk, streamed
//! (memory stays flat whatever the object's size), within a byte budget, least recently used
//! evicted first; `--cache-dir` keeps what was fetched for the next epoch and the next run.
//! `source/files.rs` is what a source holds: local paths, or objects behind the cache.
pub mod cache;
pub mod store;

pub use cache::{CacheOptions, ObjectCache};
pub use store::{is_remote, list, Object};
