//! SIGTERM/SIGINT (Slurm preemption, Ctrl-C) ask the run to stop: the loop sees the request at
//! the next optimizer step, saves `last` with its position in the epoch and exits, so
//! `--resume auto` continues exactly there. A second signal exits at once.
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use anyhow::{Context, Result};
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::flag;

#[derive(Clone)]
pub struct StopRequest {
    signal: Arc<AtomicUsize>,
}

impl StopRequest {
    pub fn install() -> Result<Self> {
        let requested = Arc::new(AtomicBool::new(false));
        let signal = Arc::new(AtomicUsize::new(0));
        for sig in [SIGTERM, SIGINT] {
            // Registered first, so it runs only when an earlier signal already set `requested`.
            flag::register_conditional_shutdown(sig, 128 + sig, requested.clone())
                .context("installing signal handlers")?;
            flag::register(sig, requested.clone()).context("installing signal handlers")?;
            flag::register_usize(sig, signal.clone(), sig as usize).context("installing signal handlers")?;
        }
        Ok(StopRequest { signal })
    }

    /// The signal received, if any.
    pub fn signal(&self) -> Option<i32> {
        match self.signal.load(Ordering::Relaxed) {
            0 => None,
            s => Some(s as i32),
        }
    }
}
