//! Heartbeats, so that a hung peer is named instead of stalling the job in silence. A stopped
//! process (SIGSTOP, a frozen driver, a node gone from the network) does not close its sockets:
//! its peers wait in their next collective until `--dist-timeout`, and c10d says nothing until
//! then. Each rank therefore runs two threads:
//! - the beat thread adds to this rank's counter in the job's store every `BEAT` (through a store
//!   connection of its own) and reads one peer's, the next rank on the ring: O(world) store calls
//!   in all, not O(world²). A store call has no deadline of its own (a cut link leaves it
//!   waiting for ever), so this thread only records what it saw and when;
//! - the monitor thread reads that record each second: a peer whose counter stops for
//!   `warn_after` (30 s, or half the timeout when that is shorter) is named in a warning, with
//!   the step it last reached; a store that does not answer for as long means the master
//!   (rank 0, which serves it) is the one that hangs.
//!
//! The collective still ends the job at `--dist-timeout`; the error line then names the silent
//! peer first (`explain`). A peer that has finished its run says so in the store and is not
//! waited for.
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

/// This rank's watchdog threads; stopped when dropped.
pub struct Watchdog {
    stop: Arc<AtomicBool>,
    monitor: Option<JoinHandle<()>>,
    /// Tells when the beat thread has ended (it may be stuck in a store call for ever).
    beat_done: std::sync::mpsc::Receiver<()>,
}

/// What the beat thread saw last, for the monitor.
struct Seen {
    /// When a beat last went through the store and back.
    store_ok: Instant,
    /// The watched peer's counters, when they last changed, and whether it has finished.
    beats: i64,
    step: i64,
    changed: Instant,
    done: bool,
}

impl Watchdog {
    /// Starts watching the next rank of `pg` (None at world size 1: nobody to wait for).
    pub fn start(pg: &ProcessGroup, timeout: Duration) -> Result<Option<Watchdog>> {
        if !pg.is_distributed() || pg.world_size < 2 {
            return Ok(None);
        }
        let warn_after = WARN_AFTER.min(timeout / 2).max(3 * BEAT);
        let store = unsafe { rt_store_clone(pg.raw(), timeout.as_millis() as i64) };
        if store.is_null() {
            bail!("watchdog: {}", crate::shim::last_error_message());
        }
        let store = Store(store);
        let (rank, peer) = (pg.rank, (pg.rank + 1) % pg.world_size);
        let stop = Arc::new(AtomicBool::new(false));
        let now = Instant::now();
        let seen = Arc::new(Mutex::new(Seen {
            store_ok: now,
            beats: -1,
            step: 0,
            changed: now,
            done: false,
        }));
        let (done_tx, beat_done) = std::sync::mpsc::channel();
        let (stopping, record) = (stop.clone(), seen.clone());
        std::thread::Builder::new().name("ringtrain-beat".into()).spawn(move || {
            beat(&store, rank, peer, &record, &stopping);
            let _ = done_tx.send(());
        })?;
        let stopping = stop.clone();
        let monitor = std::thread::Builder::new()
            .name("ringtrain-watchdog".into())
            .spawn(move || monitor(&seen, rank, peer, warn_after, timeout, &stopping))?;
        Ok(Some(Watchdog {
            stop,
            monitor: Some(monitor),
            beat_done,
        }))
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.monitor.take() {
            let _ = t.join();
        }
        // The beat thread says it is done in the store; a store that no longer answers (the
        // master gone, the link cut) must not keep this process from ending.
        let _ = self.beat_done.recv_timeout(2 * BEAT);
    }
}

/// The beat thread: this rank's heartbeat and step, then the watched peer's counters.
fn beat(store: &Store, rank: usize, peer: usize, seen: &Mutex<Seen>, stop: &AtomicBool) {
    let mut published = 0u64;
    while !stop.load(Ordering::SeqCst) {
        let step = STEP.load(Ordering::Relaxed);
        let read = (|| -> Result<(i64, i64, bool)> {
            store.add(&format!("hb/beat/{rank}"), 1)?;
            store.add(&format!("hb/step/{rank}"), (step - published) as i64)?;
            published = step;
            Ok((
                store.add(&format!("hb/beat/{peer}"), 0)?,
                store.add(&format!("hb/step/{peer}"), 0)?,
                store.add(&format!("hb/done/{peer}"), 0)? > 0,
            ))
        })();
        // A failed call (the store gone with a rank 0 that ended, or its timeout): the
        // collectives say what happened; the monitor sees the store's silence.
        let Ok((beats, step, done)) = read else { break };
        let mut s = seen.lock().unwrap();
        s.store_ok = Instant::now();
        if beats != s.beats {
            (s.beats, s.step, s.changed) = (beats, step, Instant::now());
        }
        s.done = done;
        drop(s);
        sleep_unless_stopped(BEAT, stop);
    }
    // Finished (or stopped): the rank watching this one must not take the end for a hang.
    let _ = store.add(&format!("hb/done/{rank}"), 1);
}

/// The monitor thread: names the peer, or the master, once silent for `warn_after`; says when
/// a named peer answers again.
fn monitor(seen: &Mutex<Seen>, rank: usize, peer: usize, warn_after: Duration, timeout: Duration, stop: &AtomicBool) {
    let mut named = false;
    while !stop.load(Ordering::SeqCst) {
        sleep_unless_stopped(Duration::from_secs(1), stop);
        let s = seen.lock().unwrap();
        if s.done {
            continue;
        }
        let (store_silent, peer_silent) = (s.store_ok.elapsed(), s.changed.elapsed());
        if named && peer_silent < warn_after && store_silent < warn_after {
            named = false;
            eprintln!("warning: rank {peer} answers again (step {})", s.step);
            *SILENT.lock().unwrap() = None;
        } else if !named && rank != 0 && store_silent >= warn_after {
            named = true;
            name_silent(
                format!(
                    "rank 0 (the master, which serves the job's store) stopped answering: no reply for {} s",
                    store_silent.as_secs()
                ),
                timeout,
            );
        } else if !named && peer_silent >= warn_after && store_silent < BEAT * 2 {
            named = true;
            name_silent(
                format!(
                    "rank {peer} stopped answering: no heartbeat for {} s (last at step {})",
                    peer_silent.as_secs(),
                    s.step
                ),
                timeout,
            );
        }
    }
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
