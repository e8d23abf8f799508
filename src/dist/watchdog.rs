//! Heartbeats, so that a hung peer is named instead of stalling the job in silence. A stopped
//! process (SIGSTOP, a frozen driver, a node gone from the network) does not close its sockets:
//! its peers wait in their next collective until `--dist-timeout`, and c10d says nothing until
//! then. Each rank's watchdog thread therefore adds to its counter in the job's store every
//! `BEAT` (through a store connection of its own), and watches one peer, the next rank on the
//! ring: O(world) store calls in all, not O(world²). A peer whose counter stops for
//! `warn_after` (30 s, or half the timeout when that is shorter) is named in a warning, with the
//! step it last reached; the collective still ends the job at `--dist-timeout`, and the error
//! line then names the silent peer (`explain`). When the store itself stops answering, the
//! master (rank 0, which serves it) is the one that hangs.
use std::ffi::CString;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};

use super::process_group::ProcessGroup;

/// How often each rank says it is alive.
pub const BEAT: Duration = Duration::from_secs(2);
/// Silence after which a peer is named (shorter when the timeout is).
pub const WARN_AFTER: Duration = Duration::from_secs(30);

#[repr(C)]
struct RtStore {
    _private: [u8; 0],
}

extern "C" {
    fn rt_store_clone(pg: *mut std::ffi::c_void, timeout_ms: i64) -> *mut RtStore;
    fn rt_store_add(s: *mut RtStore, key: *const std::ffi::c_char, delta: i64) -> i64;
    fn rt_store_free(s: *mut RtStore);
}

/// The optimizer steps this process has taken, published with its heartbeat.
static STEP: AtomicU64 = AtomicU64::new(0);
/// What the watchdog knows of a silent peer, for the error line of a failed collective.
static SILENT: Mutex<Option<String>> = Mutex::new(None);

/// After each optimizer step (the watchdog publishes it).
pub fn record_step(step: u64) {
    STEP.store(step, Ordering::Relaxed);
}

/// The silent peer, if the watchdog saw one: a failed collective's error line starts with it.
pub fn explain(error: &str) -> String {
    match SILENT.lock().ok().and_then(|s| s.clone()) {
        Some(why) => format!("{why}; {error}"),
        None => error.to_string(),
    }
}

/// A store connection of the watchdog's own.
struct Store(*mut RtStore);

// Used by the watchdog thread alone after it is made.
unsafe impl Send for Store {}

impl Store {
    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        let k = CString::new(key)?;
        let v = unsafe { rt_store_add(self.0, k.as_ptr(), delta) };
        if v < 0 {
            bail!("{}", crate::shim::last_error_message());
        }
        Ok(v)
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        unsafe { rt_store_free(self.0) };
    }
}

/// The watchdog thread of this rank; stopped when dropped.
pub struct Watchdog {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Watchdog {
    /// Starts watching the next rank of `pg` (None at world size 1: nobody to wait for).
    pub fn start(pg: &ProcessGroup, timeout: Duration) -> Result<Option<Watchdog>> {
        if !pg.is_distributed() || pg.world_size < 2 {
            return Ok(None);
        }
        let warn_after = WARN_AFTER.min(timeout / 2).max(3 * BEAT);
        let store = unsafe { rt_store_clone(pg.raw(), warn_after.as_millis() as i64) };
        if store.is_null() {
            bail!("watchdog: {}", crate::shim::last_error_message());
        }
        let store = Store(store);
        let (rank, world) = (pg.rank, pg.world_size);
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::Builder::new()
            .name("ringtrain-watchdog".into())
            .spawn(move || watch(store, rank, world, warn_after, timeout, &stopping))?;
        Ok(Some(Watchdog {
            stop,
            thread: Some(thread),
        }))
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One peer as this rank last saw it.
struct Peer {
    rank: usize,
    beats: i64,
    step: i64,
    changed: Instant,
    named: bool,
}

fn watch(store: Store, rank: usize, world: usize, warn_after: Duration, timeout: Duration, stop: &AtomicBool) {
    let mut peer = Peer {
        rank: (rank + 1) % world,
        beats: -1,
        step: 0,
        changed: Instant::now(),
        named: false,
    };
    let mut published = 0u64;
    while !stop.load(Ordering::SeqCst) {
        let started = Instant::now();
        match beat(&store, rank, &mut published, peer.rank) {
            Ok(seen) if seen.done => break, // the peer finished its run: nothing more to wait for
            Ok(seen) if seen.beats != peer.beats => {
                if peer.named {
                    eprintln!("warning: rank {} answers again (step {})", peer.rank, seen.step);
                    *SILENT.lock().unwrap() = None;
                }
                (peer.beats, peer.step, peer.changed, peer.named) = (seen.beats, seen.step, Instant::now(), false);
            }
            Ok(_) if !peer.named && peer.changed.elapsed() >= warn_after => {
                peer.named = true;
                name_silent(
                    format!(
                        "rank {} stopped answering: no heartbeat for {} s (last at step {})",
                        peer.rank,
                        peer.changed.elapsed().as_secs(),
                        peer.step
                    ),
                    timeout,
                );
            }
            Ok(_) => {}
            // A call that outlasted its timeout: rank 0, which serves the store, does not answer.
            // (One refused at once means the store is gone with a rank 0 that ended: the
            // collectives say so themselves.)
            Err(_) if started.elapsed() >= warn_after / 2 => {
                if rank != 0 && !peer.named {
                    peer.named = true;
                    name_silent(
                        format!(
                            "rank 0 (the master, which serves the job's store) stopped answering: no reply for {} s",
                            started.elapsed().as_secs()
                        ),
                        timeout,
                    );
                }
            }
            Err(_) => break,
        }
        sleep_unless_stopped(BEAT, stop);
    }
    // Finished (or stopped): the rank watching this one must not take the end for a hang.
    let _ = store.add(&format!("hb/done/{rank}"), 1);
}

/// A peer's counters as read in one beat.
struct Seen {
    beats: i64,
    step: i64,
    done: bool,
}

/// This rank's heartbeat and step, then the watched peer's.
fn beat(store: &Store, rank: usize, published: &mut u64, peer: usize) -> Result<Seen> {
    let step = STEP.load(Ordering::Relaxed);
    store.add(&format!("hb/beat/{rank}"), 1)?;
    store.add(&format!("hb/step/{rank}"), (step - *published) as i64)?;
    *published = step;
    Ok(Seen {
        beats: store.add(&format!("hb/beat/{peer}"), 0)?,
        step: store.add(&format!("hb/step/{peer}"), 0)?,
        done: store.add(&format!("hb/done/{peer}"), 0)? > 0,
    })
}

fn name_silent(why: String, timeout: Duration) {
    eprintln!(
        "warning: {why}; it hangs, or its node or network is down. The job ends at --dist-timeout ({} s) unless it answers",
        timeout.as_secs()
    );
    *SILENT.lock().unwrap() = Some(why);
}

fn sleep_unless_stopped(d: Duration, stop: &AtomicBool) {
    let until = Instant::now() + d;
    while Instant::now() < until && !stop.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(50));
    }
}
