//! Remote objects on local disk: each fetched whole, streamed into a temporary file, fsynced and
//! renamed into place under a name that changes with the object's version, so a file in the
//! cache is always a whole, current object. The cache holds at most its budget of bytes,
//! evicting the least recently used objects (a file evicted while a reader holds it open stays
//! readable to that reader). Processes sharing `--cache-dir` (the ranks of a node) fetch an
//! object once: the fetch holds a lock file the others wait on.
//!
//! Read-ahead: a source tells the cache which objects its next reads need (`read_ahead`); a
//! background thread fetches them in that order, at most `AHEAD` objects past the one being
//! read.
use std::collections::HashMap;
use std::fs::File;
use std::io::BufWriter;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Instant;

use anyhow::Result;

use super::store::Object;
use crate::bail_user;
use crate::error::{unfetchable, user_error};

/// Objects fetched ahead of the one being read.
const AHEAD: usize = 2;

/// A temporary cache (no `--cache-dir`) holds at most this, or half its file system's free
/// space if less: enough for the objects being read and those fetched ahead.
const TEMPORARY_BYTES: u64 = 16 << 30;

/// Where the cache lies and how much it may hold.
#[derive(Debug, Clone, Default)]
pub struct CacheOptions {
    /// `--cache-dir`: kept after the run. `None`: a temporary folder, removed at exit.
    pub dir: Option<PathBuf>,
    /// `--cache-max` in bytes; `None`: 80 % of the free space of the cache's file system when
    /// the cache is opened (plus what it holds), or `TEMPORARY_BYTES` for a temporary one.
    pub max_bytes: Option<u64>,
}

static OPTIONS: OnceLock<CacheOptions> = OnceLock::new();
static SHARED: OnceLock<Arc<ObjectCache>> = OnceLock::new();
static TEMPORARY: Mutex<Option<PathBuf>> = Mutex::new(None);

/// Sets the process's cache options (the command line's), before any remote data is opened.
pub fn configure(options: CacheOptions) {
    let _ = OPTIONS.set(options);
}

/// The process's cache, opened on first use.
pub fn shared() -> Result<Arc<ObjectCache>> {
    if let Some(c) = SHARED.get() {
        return Ok(c.clone());
    }
    let cache = Arc::new(ObjectCache::new(OPTIONS.get().cloned().unwrap_or_default())?);
    Ok(SHARED.get_or_init(|| cache).clone())
}

/// What the process's cache fetched, for the run's banner: "fetched N object(s) (X MB at Y MB/s)
/// into the cache DIR (at most Z GB), R read(s) from it"; `None` when no remote data was read.
pub fn describe() -> Option<String> {
    let cache = SHARED.get()?;
    let s = cache.stats();
    // Seconds summed over fetches, some of them side by side: the rate of one stream.
    let rate = match s.fetch_seconds > 0.0 {
        true => format!(" at {:.1} MB/s", s.fetched_bytes as f64 / 1e6 / s.fetch_seconds),
        false => String::new(),
    };
    let kept = match cache.temporary {
        true => "a temporary cache",
        false => "the cache",
    };
    Some(format!(
        "fetched {} object(s) ({:.1} MB{rate}) into {kept} {} (at most {:.1} GB), {} read(s) from it",
        s.fetched,
        s.fetched_bytes as f64 / 1e6,
        cache.dir.display(),
        cache.max_bytes as f64 / 1e9,
        s.hits
    ))
}

/// Removes the temporary cache folder, if one was made (at the process's end).
pub fn remove_temporary() {
    if let Some(dir) = TEMPORARY.lock().expect("the temporary folder's lock").take() {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// What a cache has done since it was opened.
#[derive(Debug, Clone, Copy, Default)]
pub struct CacheStats {
    /// Objects fetched, their bytes, and the seconds spent fetching (summed over fetches).
    pub fetched: u64,
    pub fetched_bytes: u64,
    pub fetch_seconds: f64,
    /// Opens that found the object on disk.
    pub hits: u64,
}

pub struct ObjectCache {
    dir: PathBuf,
    /// Made for this process (no `--cache-dir`), removed at its end.
    temporary: bool,
    max_bytes: u64,
    state: Mutex<State>,
    /// Signalled when a fetch ends.
    fetched: Condvar,
    ahead: Arc<(Mutex<Ahead>, Condvar)>,
    tmp_counter: AtomicU64,
}

#[derive(Default)]
struct State {
    /// Cached objects by file name: size and last use.
    entries: HashMap<String, (u64, u64)>,
    held: u64,
    clock: u64,
    /// Names being fetched by this process.
    fetching: Vec<String>,
    stats: CacheStats,
}

/// The read-ahead plan: objects in the order they will be read, and how far reading got.
#[derive(Default)]
struct Ahead {
    order: Vec<Arc<Object>>,
    position: HashMap<String, usize>,
    reading: usize,
    next: usize,
    thread: bool,
}

impl ObjectCache {
    pub fn new(options: CacheOptions) -> Result<ObjectCache> {
        let (dir, temporary) = match &options.dir {
            Some(d) => (d.clone(), false),
            None => {
                let d = std::env::temp_dir().join(format!("ringtrain-fetch-{}", std::process::id()));
                *TEMPORARY.lock().expect("the temporary folder's lock") = Some(d.clone());
                (d, true)
            }
        };
        if let Err(e) = std::fs::create_dir_all(&dir) {
            bail_user!("--cache-dir {}: cannot create it: {e}", dir.display());
        }
        // What an earlier run left: whole objects. Parts of fetches cut short are removed, unless
        // their process still runs (another rank fetching into the same folder).
        let mut state = State::default();
        let listing = std::fs::read_dir(&dir)
            .map_err(|e| user_error(format!("--cache-dir {}: cannot read it: {e}", dir.display())))?;
        let mut found: Vec<(String, u64, std::time::SystemTime)> = Vec::new();
        for e in listing.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Ok(meta) = e.metadata() else { continue };
            if name.ends_with(".part") {
                if !fetcher_alive(&name) {
                    let _ = std::fs::remove_file(e.path());
                }
            } else if meta.is_file() && !name.starts_with('.') {
                found.push((name, meta.len(), meta.modified().unwrap_or(std::time::UNIX_EPOCH)));
            }
        }
        // Oldest first, so that the clock orders them as their files' times do.
        found.sort_by_key(|f| f.2);
        for (name, size, _) in found {
            state.clock += 1;
            state.held += size;
            state.entries.insert(name, (size, state.clock));
        }
        let free = crate::doctor::system::space(&dir).map_or(0, |s| s.free);
        let max_bytes = match (options.max_bytes, temporary) {
            (Some(m), _) => m,
            (None, true) => TEMPORARY_BYTES.min(free / 2),
            (None, false) => state.held + free / 10 * 8,
        };
        Ok(ObjectCache {
            dir,
            temporary,
            max_bytes,
            state: Mutex::new(state),
            fetched: Condvar::new(),
            ahead: Arc::default(),
            tmp_counter: AtomicU64::new(0),
        })
    }

    pub fn stats(&self) -> CacheStats {
        self.state.lock().expect("the cache's lock").stats
    }

    /// `object`, open for reading from the cache: fetched first when it is not there (or waited
    /// for, when this process or another is fetching it).
    pub fn open(&self, object: &Arc<Object>) -> Result<File> {
        self.note_reading(object.cache_name());
        self.get(object)
    }

    /// `open` without moving the read-ahead on (the read-ahead's own fetches).
    fn get(&self, object: &Arc<Object>) -> Result<File> {
        let name = object.cache_name().to_owned();
        let path = self.dir.join(&name);
        loop {
            {
                let mut state = self.state.lock().expect("the cache's lock");
                if state.fetching.contains(&name) {
                    drop(self.fetched.wait(state).expect("the cache's lock"));
                    continue;
                }
                if state.entries.contains_key(&name) {
                    match File::open(&path) {
                        Ok(f) => {
                            state.clock += 1;
                            let clock = state.clock;
                            state.entries.get_mut(&name).expect("present").1 = clock;
                            state.stats.hits += 1;
                            return Ok(f);
                        }
                        // Evicted by another process sharing the folder: fetch it again.
                        Err(_) => {
                            let (size, _) = state.entries.remove(&name).expect("present");
                            state.held -= size;
                        }
                    }
                }
                state.fetching.push(name.clone());
            }
            let fetched = self.fetch(object, &name, &path);
            let mut state = self.state.lock().expect("the cache's lock");
            state.fetching.retain(|n| n != &name);
            self.fetched.notify_all();
            match fetched {
                Ok((file, seconds, by_us)) => {
                    if by_us {
                        state.stats.fetched += 1;
                        state.stats.fetched_bytes += object.size;
                        state.stats.fetch_seconds += seconds;
                    } else {
                        state.stats.hits += 1;
                    }
                    state.clock += 1;
                    let clock = state.clock;
                    if state.entries.insert(name.clone(), (object.size, clock)).is_none() {
                        state.held += object.size;
                    }
                    self.evict(&mut state, &name);
                    return Ok(file);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Fetches `object` into `path` unless another process did while this one waited for the
    /// lock. Returns the file, the seconds the fetch took and whether this process fetched it.
    fn fetch(&self, object: &Object, name: &str, path: &Path) -> Result<(File, f64, bool)> {
        let lock_path = self.dir.join(format!(".{name}.lock"));
        let dir = self.dir.display();
        let unwritable = |e: std::io::Error| unfetchable(format!("cannot write to the cache {dir}: {e}"));
        let lock = File::create(&lock_path).map_err(unwritable)?;
        // SAFETY: flock on a descriptor this function owns; released when `lock` is closed.
        unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) };
        if let Ok(f) = File::open(path) {
            return Ok((f, 0.0, false));
        }
        let part = self.dir.join(format!(
            ".{name}.{}.{}.part",
            std::process::id(),
            self.tmp_counter.fetch_add(1, Ordering::Relaxed)
        ));
        let start = Instant::now();
        let written = (|| -> Result<()> {
            let url = &object.url;
            let failed = |e: &dyn std::fmt::Display| unfetchable(format!("cannot write {url} to the cache: {e}"));
            let mut out = BufWriter::with_capacity(1 << 20, File::create(&part).map_err(unwritable)?);
            object.fetch_into(&mut out)?;
            let file = out.into_inner().map_err(|e| failed(&e))?;
            file.sync_all().map_err(|e| failed(&e))?;
            std::fs::rename(&part, path).map_err(|e| failed(&e))?;
            Ok(())
        })();
        if let Err(e) = written {
            let _ = std::fs::remove_file(&part);
            return Err(e);
        }
        let file = File::open(path)
            .map_err(|e| unfetchable(format!("cannot read {} from the cache: {e}", path.display())))?;
        Ok((file, start.elapsed().as_secs_f64(), true))
    }

    /// Removes the least recently used objects (never `keep`, nor one being fetched) while the
    /// cache holds more than its budget.
    fn evict(&self, state: &mut State, keep: &str) {
        while state.held > self.max_bytes {
            let oldest = state
                .entries
                .iter()
                .filter(|(n, _)| n.as_str() != keep && !state.fetching.contains(n))
                .min_by_key(|(_, e)| e.1)
                .map(|(n, _)| n.clone());
            let Some(name) = oldest else { break };
            let (size, _) = state.entries.remove(&name).expect("present");
            state.held -= size;
            let _ = std::fs::remove_file(self.dir.join(&name));
            let _ = std::fs::remove_file(self.dir.join(format!(".{name}.lock")));
        }
    }

    /// The objects the next reads need, in order: fetched ahead by a background thread.
    pub fn read_ahead(self: &Arc<Self>, order: Vec<Arc<Object>>) {
        let (lock, wake) = &*self.ahead;
        let mut ahead = lock.lock().expect("the read-ahead's lock");
        ahead.position = order.iter().enumerate().map(|(i, o)| (o.cache_name().to_owned(), i)).collect();
        ahead.order = order;
        ahead.reading = 0;
        ahead.next = 0;
        if !ahead.thread {
            ahead.thread = true;
            let cache = Arc::downgrade(self);
            let plan = self.ahead.clone();
            std::thread::Builder::new()
                .name("ringtrain-read-ahead".into())
                .spawn(move || read_ahead_loop(cache, plan))
                .expect("a read-ahead thread");
        }
        wake.notify_all();
    }

    /// Moves the read-ahead on when `name` is the furthest object of its plan read yet.
    fn note_reading(&self, name: &str) {
        let (lock, wake) = &*self.ahead;
        let mut ahead = lock.lock().expect("the read-ahead's lock");
        if let Some(&p) = ahead.position.get(name) {
            if p > ahead.reading {
                ahead.reading = p;
                wake.notify_all();
            }
        }
    }
}

/// Fetches the plan's objects in order, at most `AHEAD` past the one being read; ends with the
/// cache. A failed fetch is left for the read that needs it to report.
fn read_ahead_loop(cache: std::sync::Weak<ObjectCache>, plan: Arc<(Mutex<Ahead>, Condvar)>) {
    let (lock, wake) = &*plan;
    loop {
        let object = {
            let mut ahead = lock.lock().expect("the read-ahead's lock");
            while ahead.next >= ahead.order.len() || ahead.next > ahead.reading + AHEAD {
                ahead = wake.wait(ahead).expect("the read-ahead's lock");
            }
            ahead.next += 1;
            ahead.order[ahead.next - 1].clone()
        };
        let Some(cache) = cache.upgrade() else { return };
        let _ = cache.get(&object);
    }
}

/// Whether the process that is writing the part `.NAME.PID.N.part` still runs.
fn fetcher_alive(part: &str) -> bool {
    let mut fields = part.rsplit('.');
    let pid = fields.nth(2).and_then(|p| p.parse::<i32>().ok());
    // SAFETY: signal 0 only asks whether the process exists.
    pid.is_some_and(|p| p > 0 && unsafe { libc::kill(p, 0) } == 0)
}
