//! ringtrain: image-classification training on libtorch, from one command.
//!
//! The path of a batch: `data` (folders → decode → augment → uint8 batches) → `model` →
//! `train` (loop, optimizer, schedule, checkpoints) → `report` (metrics, classification report);
//! `infer` runs a saved checkpoint (eval, predict), `export` writes it for servers; `doctor`
//! checks the machine; `cli` ties them to the command line. `shim` is the safe face of the C++ shim in `csrc/`.
pub mod atomic;
pub mod bench;
pub mod cli;
pub mod config;
pub mod data;
pub mod device;
pub mod dist;
pub mod doctor;
pub mod error;
pub mod export;
mod flag_enum;
pub mod infer;
pub mod model;
pub mod report;
pub mod seeds;
pub mod serde_nan;
pub mod shim;
pub mod train;
