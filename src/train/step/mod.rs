//! The step: what `Trainer` owns and does to take one optimizer step (forward and backward under
//! mixed precision and loss scaling, gradient all-reduce, clipping, the optimizer, the learning
//! rate's schedule, the weights' moving average, the divergence guard, a captured CUDA graph),
//! the epoch's running figures (`meter.rs`), validation (`eval.rs`), and the state that evolves
//! over the run besides the tensors (`state.rs`). Nothing here touches the run's files:
//! `lifecycle/` saves and restores what this room holds.
pub mod amp;
pub mod divergence;
pub mod ema;
pub mod eval;
pub mod meter;
pub mod optim;
pub mod schedule;
pub mod state;
pub mod step_graph;
pub mod trainer;
