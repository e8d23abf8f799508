//! SIGTERM/SIGINT (Slurm preemption, Ctrl-C) ask the run to stop: the loop sees the request at
//! the next optimizer step, saves `last` with its position in the epoch and exits, so
//! `--resume auto` continues exactly there. A second signal at least a second after the first
//! exits at once (an impatient Ctrl-C); one sooner is taken as the same request delivered twice
//! (a terminal's Ctrl-C reaches a worker directly and through the launcher, Slurm signals every
//! process of a step), which must not cost the checkpoint.
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::Arc;

use anyhow::{Context, Result};

use crate::dist::process_group::{ProcessGroup, ReduceOp};
use signal_hook::consts::{SIGINT, SIGTERM};

/// Repeats closer than this to the first signal are duplicates.
const DUPLICATE_WINDOW_MS: i64 = 1000;

#[derive(Clone)]
pub struct StopRequest {
    signal: Arc<AtomicUsize>,
}

/// Milliseconds on the monotonic clock; clock_gettime is async-signal-safe.
fn now_ms() -> i64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid out-pointer; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec * 1000 + ts.tv_nsec / 1_000_000
}

impl StopRequest {
    pub fn install() -> Result<Self> {
        let signal = Arc::new(AtomicUsize::new(0));
        let first_at = Arc::new(AtomicI64::new(0));
        for sig in [SIGTERM, SIGINT] {
            let (signal, first_at) = (signal.clone(), first_at.clone());
            let handler = move || {
                // Only atomics, clock_gettime and _exit here: all async-signal-safe.
                let now = now_ms();
                match first_at.compare_exchange(0, now, Ordering::SeqCst, Ordering::SeqCst) {
                    Ok(_) => signal.store(sig as usize, Ordering::SeqCst),
                    Err(first) if now - first >= DUPLICATE_WINDOW_MS => unsafe { libc::_exit(128 + sig) },
                    Err(_) => {}
                }
            };
            // SAFETY: the handler does only async-signal-safe work (see above).
            unsafe { signal_hook::low_level::register(sig, handler) }.context("installing signal handlers")?;
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

    /// The signal a stop was requested with, agreed by all ranks (any rank's request stops all,
    /// at the same step). Distributed, the agreement costs a collective, so callers ask only
    /// when `due` (every 10th step, and at epoch ends); alone it is free and always checked.
    pub fn agreed(&self, pg: &ProcessGroup, due: bool) -> Result<Option<i32>> {
        if pg.world_size == 1 {
            return Ok(self.signal());
        }
        if !due {
            return Ok(None);
        }
        let agreed = pg.all_reduce_values(&[self.signal().unwrap_or(0) as f64], ReduceOp::Max)?;
        Ok(match agreed[0] as i32 {
            0 => None,
            s => Some(s),
        })
    }
}
