//! SIGTERM/SIGINT (Slurm preemption, Ctrl-C) and SIGUSR1 (Slurm's `--signal=USR1@90`, before
//! the time limit) ask the run to stop, and so does a closed standard output (as SIGPIPE): the
//! loop sees the request at the next optimizer step, saves `last` with its position in the epoch
//! and exits, so `--resume auto` continues exactly there; with `--requeue` it then asks Slurm to requeue the job and exits 0. A second signal at
//! least a second after the first exits at once (an impatient Ctrl-C); one sooner is taken as
//! the same request delivered twice (a terminal's Ctrl-C reaches a worker directly and through
//! the launcher, Slurm signals every process of a step), which must not cost the checkpoint.
//!
//! The ranks agree on what to do at the same step (a collective every 10th step, free alone):
//! whether any rank was signalled, and whether any rank's clock says `--save-every-minutes`
//! have passed since the last save.
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::Arc;

use anyhow::{Context, Result};

use crate::dist::process_group::{ProcessGroup, ReduceOp};
use signal_hook::consts::{SIGINT, SIGTERM, SIGUSR1};

use crate::say;

/// Repeats closer than this to the first signal are duplicates.
const DUPLICATE_WINDOW_MS: i64 = 1000;

#[derive(Clone)]
pub struct StopRequest {
    signal: Arc<AtomicUsize>,
    /// `--requeue`: after the checkpoint, requeue the Slurm job and end with 0.
    requeue: bool,
}

/// What the ranks agreed at a step.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Agreed {
    /// The signal a stop was requested with, on any rank.
    pub signal: Option<i32>,
    /// Some rank's `--save-every-minutes` clock is due: every rank saves now.
    pub save: bool,
}

/// Milliseconds on the monotonic clock; clock_gettime is async-signal-safe.
fn now_ms() -> i64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid out-pointer; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec * 1000 + ts.tv_nsec / 1_000_000
}

impl StopRequest {
    pub fn install(requeue: bool) -> Result<Self> {
        let signal = Arc::new(AtomicUsize::new(0));
        let first_at = Arc::new(AtomicI64::new(0));
        for sig in [SIGTERM, SIGINT, SIGUSR1] {
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
        crate::report::stdout::stop_runs_instead();
        Ok(StopRequest { signal, requeue })
    }

    /// The signal received, if any; a closed standard output counts as SIGPIPE.
    pub fn signal(&self) -> Option<i32> {
        match self.signal.load(Ordering::Relaxed) {
            0 if crate::report::stdout::is_closed() => Some(libc::SIGPIPE),
            0 => None,
            s => Some(s as i32),
        }
    }

    /// The signal a stop was requested with and whether to save now (`save_due`: this rank's
    /// clock says so), agreed by all ranks: any rank's request stops all, at the same step.
    /// Distributed, the agreement costs a collective, so callers ask only when `due` (every
    /// 10th step, and at epoch ends); alone it is free and always checked.
    pub fn agreed(&self, pg: &ProcessGroup, due: bool, save_due: bool) -> Result<Agreed> {
        if pg.world_size == 1 {
            return Ok(Agreed {
                signal: self.signal(),
                save: save_due,
            });
        }
        if !due {
            return Ok(Agreed::default());
        }
        let mine = [self.signal().unwrap_or(0) as f64, save_due as u8 as f64];
        let all = pg.all_reduce_values(&mine, ReduceOp::Max)?;
        Ok(Agreed {
            signal: Some(all[0] as i32).filter(|&s| s != 0),
            save: all[1] > 0.0,
        })
    }

    /// After the stop's checkpoint is saved: with `--requeue`, rank 0 asks Slurm to requeue the
    /// job; true when the run then ends with 0 (a requeued job is not a failure).
    pub fn requeue(&self, is_main: bool) -> bool {
        if self.requeue && is_main {
            requeue_slurm_job(&|name| std::env::var(name).ok());
        }
        self.requeue
    }
}

/// `scontrol requeue $SLURM_JOB_ID`, said in one line whatever happens.
fn requeue_slurm_job(get: &dyn Fn(&str) -> Option<String>) {
    let Some(id) = get("SLURM_JOB_ID") else {
        say!("--requeue: not a Slurm job (no SLURM_JOB_ID), nothing to requeue; continue with --resume auto");
        return;
    };
    match std::process::Command::new("scontrol").args(["requeue", &id]).status() {
        Ok(s) if s.success() => {
            say!("--requeue: Slurm job {id} requeued (scontrol requeue {id}); it continues from last/ with --resume auto")
        }
        Ok(s) => eprintln!("warning: --requeue: scontrol requeue {id} failed ({s}); requeue the job by hand"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            say!("--requeue: scontrol is not on PATH, so Slurm job {id} was not requeued; continue with --resume auto")
        }
        Err(e) => eprintln!("warning: --requeue: cannot run scontrol ({e}); requeue job {id} by hand"),
    }
}
