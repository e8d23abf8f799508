//! The run's life on disk: its directory and lock, checkpoints (written atomically) and the
//! resumption from one, the record of its data (and, asked for, of the samples each step took),
//! and the signals that stop it cleanly. It saves and restores what `step/` holds; `step/`
//! knows nothing of it.
pub mod checkpoint;
pub mod data_record;
pub mod resume;
pub mod run_dir;
pub mod run_lock;
pub mod sample_log;
pub mod signals;
